//! etcd (feature `etcd`): keys on a lease, in create-revision order.
//!
//! The recipe of etcd's own `clientv3/concurrency` mutex:
//! - each contender puts a key under the lock's prefix, `distlock/<key>/<token>`,
//!   attached to a **lease** of its own; the key with the lowest create revision holds the
//!   lock;
//! - every other contender watches only the key created just before its own (no herd),
//!   so the lock is granted in arrival order, whichever process asked;
//! - the lease is the holder's session: kept alive by the client (while it waits in line,
//!   by this backend; once it holds, by the guard's watchdog), and when it runs out etcd
//!   deletes the key, which is the next waiter's wake-up and the holder's lost signal.
//!
//! How it maps onto [`Backend`]:
//! - the key's name carries the token, and it is created in a transaction only if
//!   missing, so a retried step finds its own key;
//! - the **fence** is the holder key's create revision: etcd's revision is cluster-wide
//!   and only grows (it survives leader changes and restarts), and keys are granted in
//!   creation order, so each holder's fence is above every earlier holder's;
//! - **renewal** is one keep-alive of the key's lease, and only then a read that finds the
//!   key still at the head of the line; etcd rounds leases up to whole seconds and to its
//!   minimum TTL, so the lease it grants is never shorter than the ttl asked for, and the
//!   holder's lease (counted from when the keep-alive was sent) ends first;
//! - **lease ids are chosen here**, not by etcd, and remembered for their token before
//!   the grant is sent, so that [`unlock`](Backend::unlock) revokes every lease an
//!   acquisition may have put a key on: one whose grant or put answer was lost, one whose
//!   put was still on its way when the wait was given up;
//! - a **waiter keeps its place** through what a cluster does while it waits (a member
//!   that dies or restarts, an election, a watch stream that breaks): it reads, watches and
//!   keeps its lease alive again until the caller's deadline ends the wait. Only a lease
//!   etcd no longer has, or our key gone, loses the place ([`Error::LostPlace`]);
//! - **one member at a time**, each request bounded by the request timeout (1 s by
//!   default): a member that does not answer in time (hung: stopped, or black-holed with its
//!   TCP connection up) or cannot answer is passed over at once, for this step and the ones
//!   after it, so a hung member costs one request timeout, not every step. The ttl must
//!   leave a renewal room for that ([`check_options`](Backend::check_options)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, LeaseGrantOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, WatchOptions,
};
use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::{Attempt, Backend, LockState, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fenced::Fence;
use crate::options::LockOptions;
use crate::token::Token;

/// Where lock keys live unless [`EtcdLock::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "distlock/";

/// The longest key, in bytes.
const MAX_KEY_BYTES: usize = 1024;

/// How often a connection with a stream open on it (a watch) is pinged (HTTP/2
/// keep-alive), so that a watch through a member that stopped answering breaks, and is
/// made again through a member that answers, instead of waiting for ever.
///
/// TIMING: etcd sends a GOAWAY ("too many pings") to a client that pings more often than
/// its `--grpc-keepalive-min-time` (5 s by default); 10 s stays above it.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// Locks in etcd: a [`Backend`] that keeps its own line of waiters. Cheap to clone; clones
/// share their clients and what they remember of the leases they granted.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::{EtcdLock, LockOptions, Locker};
///
/// # async fn run() -> anyhow::Result<()> {
/// let etcd = EtcdLock::connect(["http://127.0.0.1:2379"]).await?;
/// let options = LockOptions::builder().ttl(Duration::from_secs(5)).build()?;
/// let locker = Locker::new(etcd, options)?;
/// let guard = locker.acquire("lock_sale_1").await?;
/// // ... write with guard.fence() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLock {
    /// One client per member ([`connect`](Self::connect)): requests go to one member at a
    /// time, and to the next when it cannot be reached. etcd-client's own balanced channel
    /// (one client for all endpoints) keeps sending a share of the requests to a member
    /// that is down, and those fail (etcdv3/etcd-client#39): with one member of three down,
    /// steps would fail that the two others could answer.
    clients: Arc<[etcd::Client]>,
    /// The member requests go to first: an index into `clients`, moved on to the next member
    /// as soon as a request to this one times out or fails (see [`ask`](Self::ask)).
    current: Arc<AtomicUsize>,
    /// How long one request may take at one member before it is given up there and sent
    /// to the next ([`EtcdLockBuilder::request_timeout`]).
    request_timeout: Duration,
    /// Put before every lock key: empty, or ending with `/`.
    prefix: String,
    /// Deletes of a watched key that woke a waiter here: how the no-herd property is
    /// observed.
    wake_ups: Arc<AtomicU64>,
    /// Every lease granted (or being granted) for an acquisition, by key and token, until
    /// its [`unlock`](Backend::unlock) revokes them (or, failing, forgets them): a key whose put answer never came back,
    /// or whose put was still on its way when the locker gave up the wait, is on one of
    /// them, and goes with it.
    leases: Arc<Granted>,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("prefix", &self.prefix)
            .field("members", &self.clients.len())
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// Settings for [`EtcdLock`]: the cluster's endpoints and how long one request may take.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is called"]
pub struct EtcdLockBuilder {
    endpoints: Vec<String>,
    request_timeout: Duration,
}

impl EtcdLockBuilder {
    /// How long one request may take at one member (connecting included) before it is
    /// given up there and sent to the next member. Default
    /// [`EtcdLock::DEFAULT_REQUEST_TIMEOUT`], 1 s: etcd answers a durable write in
    /// milliseconds, so a member that has not answered in a second is taken as hung.
    ///
    /// With more than one member, [`Locker::new`](crate::Locker::new) refuses a ttl that
    /// leaves a renewal less than two of these (see [`EtcdLock::connect`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// A client for each endpoint, used one at a time (see [`EtcdLock::connect`]).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero request timeout; [`Error::Etcd`] for an
    /// endpoint that is not a URL, or none at all.
    pub async fn connect(self) -> Result<EtcdLock> {
        let timeout = self.request_timeout;
        if timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "the etcd request timeout is zero: no request could be answered".into(),
            ));
        }
        let options = etcd::ConnectOptions::new()
            .with_connect_timeout(timeout)
            // The member learns the deadline too (gRPC's `grpc-timeout`); `ask` bounds the
            // whole request on our side, a stream's first answer included.
            .with_timeout(timeout)
            // Pings only while a stream is open: etcd counts pings on an idle connection
            // against the client.
            .with_keep_alive(KEEP_ALIVE_EVERY, timeout)
            .with_keep_alive_while_idle(false)
            // A member cut off from the leader refuses (`UNAVAILABLE`, "no leader") instead
            // of waiting for one, and ends its watch streams: the step goes to another
            // member, the waiter watches through another.
            .with_require_leader(true);
        let mut clients = Vec::new();
        for endpoint in &self.endpoints {
            // Connects lazily: a member that is down now is tried when a step needs it.
            clients.push(etcd::Client::connect([endpoint], Some(options.clone())).await?);
        }
        if clients.is_empty() {
            return Err(etcd::Error::InvalidArgs("no etcd endpoint".into()).into());
        }
        Ok(EtcdLock::with_clients(clients, timeout))
    }
}

impl EtcdLock {
    /// How long one request may take at one member unless
    /// [`EtcdLockBuilder::request_timeout`] says otherwise.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

    /// Settings for locks on the cluster at `endpoints` (`http://host:port`): set the
    /// request timeout, then [`connect`](EtcdLockBuilder::connect).
    pub fn builder<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> EtcdLockBuilder {
        EtcdLockBuilder {
            endpoints: endpoints
                .as_ref()
                .iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// Connect to the cluster at `endpoints` (`http://host:port`) with the default request
    /// timeout (1 s; [`builder`](Self::builder) sets another): a client for each member,
    /// used one at a time.
    ///
    /// Each request waits at most the request timeout for its member. A member that does
    /// not answer in time (hung: stopped, or black-holed with its connection up), cannot be
    /// reached, or has no leader is passed over at once: the step goes to the next member,
    /// and so do the steps after it, until every member was tried. A hung member thus costs
    /// one request timeout, once, and not one per step. With more than one member,
    /// [`Locker::new`](crate::Locker::new) refuses a ttl that leaves a renewal (or a waiter's
    /// keep-alive) less than two request timeouts: one to give up on a hung member, one for
    /// another to answer.
    ///
    /// # Errors
    /// [`Error::Etcd`] for an endpoint that is not a URL, or none at all.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self> {
        Self::builder(endpoints).connect().await
    }

    /// Locks through a client connected elsewhere (every step goes through it, so there is
    /// no other member to go to). Each request is bounded by
    /// [`DEFAULT_REQUEST_TIMEOUT`](Self::DEFAULT_REQUEST_TIMEOUT). Give the client
    /// `with_require_leader(true)`, as [`connect`](Self::connect) does: without it, a step
    /// sent to a member that lost its leader waits for one.
    pub fn new(client: etcd::Client) -> Self {
        Self::with_clients(vec![client], Self::DEFAULT_REQUEST_TIMEOUT)
    }

    /// How long one request may take at one member.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    fn with_clients(clients: Vec<etcd::Client>, request_timeout: Duration) -> Self {
        Self {
            clients: clients.into(),
            current: Arc::new(AtomicUsize::new(0)),
            request_timeout,
            prefix: DEFAULT_PREFIX.to_owned(),
            wake_ups: Arc::new(AtomicU64::new(0)),
            leases: Arc::default(),
        }
    }

    /// Put lock keys under `prefix` instead of [`DEFAULT_PREFIX`]: key `k` is the line
    /// `<prefix>k/`.
    ///
    /// The prefix must be empty or end with `/`: with `x` and key `ab`, and `xa` and key `b`,
    /// two locks would share the line `xab/`. Handles on one cluster that use different
    /// prefixes must also not nest them (`a/` and `a/b/`): the line of key `b` under `a/`
    /// would hold the keys of every lock under `a/b/`. Give each application a prefix of
    /// its own that does not start with another's (the default included).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a prefix that is not empty and does not end with `/`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if !(prefix.is_empty() || prefix.ends_with('/')) {
            return Err(Error::InvalidOptions(format!(
                "etcd key prefix {prefix:?} must be empty or end with '/' (or two locks could share a line)"
            )));
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// How many times a waiter of this handle was woken because the key it watched (the
    /// one just before its own) was deleted. With one watch per waiter, a release wakes one
    /// waiter in all. A watch stream that breaks or is cancelled is not a wake-up.
    pub fn wake_ups(&self) -> u64 {
        self.wake_ups.load(Ordering::Relaxed)
    }

    /// Send `request` to the member in use; if it cannot be reached ([`unreachable`]), to
    /// the next, until every member was tried. Every step of this backend may run twice
    /// (see [`Backend`]), so one whose answer was lost with its member may go to another,
    /// or again to the same: a grant sent again finds its lease there (ids are ours), a
    /// join finds its key, a delete or revoke finds nothing left to do, a read or
    /// keep-alive is harmless.
    ///
    /// A member that failed without timing out is asked once more before the next: its
    /// client hands a request the error of an earlier connection attempt whose own request
    /// was given up meanwhile (tonic's reconnect keeps that error for the next request), so
    /// after a member came back, its first answer can be the failure of a connection made
    /// while it was away. A member that timed out is not asked again: that would cost
    /// another timeout.
    async fn call<T, F, Fut>(&self, request: F) -> Result<T, etcd::Error>
    where
        F: Fn(etcd::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let members = self.clients.len();
        let first = self.current.load(Ordering::Relaxed) % members;
        let mut last_error = None;
        for at in (first..first + members).map(|i| i % members) {
            for last_try in [false, true] {
                match self
                    .ask(at, last_try, request(self.clients[at].clone()))
                    .await
                {
                    Err(error) if unreachable(&error) => {
                        tracing::debug!(%error, member = at, "etcd member could not answer");
                        let again = !last_try && !timed_out(&error);
                        last_error = Some(error);
                        if !again {
                            break;
                        }
                    }
                    answer => return answer,
                }
            }
        }
        Err(last_error.expect("at least one member"))
    }

    /// `request` to member `at`, bounded by the request timeout. If the member does not
    /// answer in time, or fails on our `last_try` of it, `current` moves on to the next
    /// member before anything else is tried, so that the steps after this one start there
    /// (unless a step has moved it already: its news is as new).
    ///
    /// The request runs in a task of its own, which moves `current` even when the caller
    /// has given up meanwhile: a renewal the watchdog cancels at the end of its lease, a
    /// wait dropped at its deadline, or a readiness probe under a timeout no longer than
    /// ours (the service's `/readyz` gives `inspect` 1 s, the default request timeout). A
    /// caller that gives up before the member has had its request timeout would otherwise
    /// leave `current` on the hung member, and every later step would start there again.
    /// The task ends within the request timeout; it sends nothing more.
    async fn ask<T, Fut>(&self, at: usize, last_try: bool, request: Fut) -> Result<T, etcd::Error>
    where
        Fut: Future<Output = Result<T, etcd::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let (current, members, timeout) = (
            Arc::clone(&self.current),
            self.clients.len(),
            self.request_timeout,
        );
        let asked = tokio::spawn(async move {
            let answer = match tokio::time::timeout(timeout, request).await {
                Ok(answer) => answer,
                Err(_) => Err(no_answer_within(timeout)),
            };
            if let Err(error) = &answer
                && (timed_out(error) || (last_try && unreachable(error)))
            {
                let _ = current.compare_exchange(
                    at,
                    (at + 1) % members,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            answer
        });
        match asked.await {
            Ok(answer) => answer,
            Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
            Err(ended) => Err(etcd::Error::Internal(format!(
                "the task of a request to etcd ended: {ended}"
            ))),
        }
    }

    /// One transaction, through [`call`](Self::call).
    async fn txn(&self, txn: Txn) -> Result<etcd::TxnResponse, etcd::Error> {
        self.call(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }

    /// The prefix of every contender key for `key`, `/` included.
    fn line_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    fn own_key(&self, key: &str, token: &Token) -> String {
        format!("{}{}", self.line_prefix(key), token.as_str())
    }

    // The reads of a line. Each is one operation of a transaction, so that the reads a step
    // needs are made at one revision.

    /// Our own key.
    fn read_own(&self, key: &str, token: &Token) -> TxnOp {
        TxnOp::get(self.own_key(key, token), None)
    }

    /// The first key of the line: the holder's.
    fn read_head(&self, key: &str) -> TxnOp {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        TxnOp::get(self.line_prefix(key), Some(first))
    }

    /// The key created just before `revision`: the one a waiter at `revision` watches.
    fn read_before(&self, key: &str, revision: i64) -> TxnOp {
        let last_before = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1);
        TxnOp::get(self.line_prefix(key), Some(last_before))
    }

    /// Run `reads` in one transaction: the revision they were made at, and what each found.
    async fn read<const N: usize>(
        &self,
        reads: [TxnOp; N],
    ) -> Result<(i64, [Option<etcd::KeyValue>; N]), etcd::Error> {
        let answer = self.txn(Txn::new().and_then(reads)).await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        let replies = answer.op_responses();
        Ok((revision, std::array::from_fn(|i| first_kv(replies.get(i)))))
    }

    /// Our key and the head of the line, read together.
    async fn look(&self, key: &str, token: &Token) -> Result<Look, etcd::Error> {
        let (_, [own, head]) = self
            .read([self.read_own(key, token), self.read_head(key)])
            .await?;
        Ok(Look {
            own: own.map(|kv| Own::of(&kv)),
            head: head.map(|kv| kv.create_revision()),
        })
    }

    /// A new lease id for `token`'s acquisition of `key`, remembered before any grant of
    /// it is sent. Chosen here rather than by etcd so that it is known even when the
    /// grant's answer is lost: [`unlock`](Backend::unlock) then revokes it too, instead of
    /// leaving it (and a key a later put may have hung on it) until it runs out. etcd takes
    /// any id not in use and refuses one in use (see [`grant`](Self::grant)); two random
    /// 63-bit ids meet about once in 2^63 grants.
    fn new_lease(&self, key: &str, token: &Token) -> i64 {
        let id = loop {
            let id = rand::random::<i64>() & i64::MAX;
            if id != 0 {
                break id;
            }
        };
        self.leases.remember(key, token, id);
        id
    }

    /// Grant lease `id` for at least `ttl` (etcd counts leases in whole seconds, and may
    /// grant more than asked): the TTL granted, in seconds.
    async fn grant(&self, id: i64, ttl: Duration) -> Result<i64, etcd::Error> {
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let granted = self
            .call(|mut client| async move {
                let options = LeaseGrantOptions::new().with_id(id);
                client.lease_grant(seconds, Some(options)).await
            })
            .await;
        match granted {
            Ok(granted) => Ok(granted.ttl()),
            // An earlier send of this grant was applied and its answer lost (`call` sent it
            // again to another member): the lease is ours, with at least what we asked for.
            Err(error) if has_status(&error, FAILED_PRECONDITION, "lease already exists") => {
                Ok(seconds)
            }
            Err(error) => Err(error),
        }
    }

    /// Revoke `lease`, which deletes the key on it; `false` if etcd no longer had it.
    async fn revoke(&self, lease: i64) -> Result<bool, etcd::Error> {
        match self
            .call(|mut client| async move { client.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if lease_not_found(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Revoke every lease remembered for `token`'s acquisition of `key`, and `also` (the
    /// lease its key was found on), then forget them. Answers the first error, after trying
    /// them all; a lease that could not be revoked is forgotten too: nothing keeps it alive
    /// any more, so it runs out (with any key on it) within its TTL.
    async fn revoke_all(
        &self,
        key: &str,
        token: &Token,
        also: Option<i64>,
    ) -> Result<(), etcd::Error> {
        self.revoke_each(key, self.leases.take(key, token), also)
            .await
    }

    /// Revoke `leases` (taken from what is remembered for an acquisition of `key`), and
    /// `also`. Answers the first error, after trying them all.
    async fn revoke_each(
        &self,
        key: &str,
        mut leases: Vec<i64>,
        also: Option<i64>,
    ) -> Result<(), etcd::Error> {
        leases.extend(also.filter(|lease| *lease != 0 && !leases.contains(lease)));
        let mut first_error = None;
        for lease in leases {
            if let Err(error) = self.revoke(lease).await {
                tracing::warn!(%key, %error, lease, "could not revoke a lease; it runs out by itself");
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One keep-alive of `lease`; `false` if etcd no longer has it (it answered TTL 0:
    /// revoked, or run out).
    async fn keep_alive(&self, lease: i64) -> Result<bool, etcd::Error> {
        match self
            .call(|mut client| async move { client.lease_keep_alive(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            // etcd-client's answer to TTL 0 ("lease not found"); its only other
            // `LeaseKeepAliveError`, a request that could not be queued on a channel it has
            // just made, cannot happen.
            Err(etcd::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Move our key (`own`) to a new lease of at least `ttl`: a keep-alive starts a lease
    /// again with the TTL it was granted, so a longer ttl
    /// ([`LockGuard::extend`](crate::LockGuard::extend)) needs a new lease. `false` if our
    /// key is gone.
    async fn re_lease(
        &self,
        key: &str,
        token: &Token,
        own: Own,
        ttl: Duration,
    ) -> Result<bool, etcd::Error> {
        let lease = self.new_lease(key, token);
        let granted = self.grant(lease, ttl).await?;
        let key_name = self.own_key(key, token);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key_name.clone(),
                CompareOp::Equal,
                own.revision,
            )])
            .and_then([TxnOp::put(
                key_name,
                granted.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let moved = self.txn(txn).await?.succeeded();
        // Whichever lease the key is not on now goes.
        let unused = if moved { own.lease } else { lease };
        match self.revoke(unused).await {
            Ok(_) => self.leases.forget(key, token, unused),
            Err(error) => {
                tracing::debug!(%key, %error, lease = unused, "could not revoke an unused lease; it runs out by itself");
            }
        }
        Ok(moved)
    }

    /// Put our key on `lease` (granted for `granted` seconds) unless it is there already (a
    /// retried step); answers our key's create revision, the lease it is on, and the first
    /// key of the line.
    async fn join(
        &self,
        key: &str,
        token: &Token,
        lease: i64,
        granted: i64,
    ) -> Result<Joined, etcd::Error> {
        let own = self.own_key(key, token);
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
                .and_then([
                    // The value is the lease's TTL: a renewal for a longer ttl needs a new
                    // lease.
                    TxnOp::put(
                        own.clone(),
                        granted.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    self.read_head(key),
                ])
                .or_else([self.read_own(key, token), self.read_head(key)]);
            let answer = self.txn(txn).await?;
            let replies = answer.op_responses();
            let head_revision = first_kv(replies.get(1)).map(|kv| kv.create_revision());
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                return Ok(Joined {
                    revision,
                    lease,
                    head_revision,
                });
            }
            // Our key was there already, from an earlier send of this step.
            let kv = first_kv(replies.first()).ok_or_else(|| {
                etcd::Error::Internal("the transaction found our key and then did not".into())
            })?;
            let joined = Joined {
                revision: kv.create_revision(),
                lease: kv.lease(),
                head_revision,
            };
            if kv.lease() == lease {
                // `call` sent this very transaction again after its answer was lost: the key
                // is on our lease, which must stay.
                return Ok(joined);
            }
            // A retried acquisition, with a lease of its own: the key stays where it is, on
            // the lease of the first try.
            // TIMING: that lease was last granted or kept alive before this step was sent;
            // kept alive now, it lasts the ttl from after the caller sent the step.
            if self.keep_alive(kv.lease()).await? {
                if self.revoke(lease).await.is_ok() {
                    self.leases.forget(key, token, lease);
                }
                return Ok(joined);
            }
            // That lease has just run out, and our key went with it: join again, on ours.
        }
    }
}

/// Whether `error` says that the member could not be reached or could not answer now, so
/// that another member may (and a waiter should try again rather than give up its place):
/// gRPC's `UNAVAILABLE` (not connected, no leader, leader changed, shutting down, a request
/// that timed out in raft), `CANCELLED` (the connection closed, the client's timeout),
/// `DEADLINE_EXCEEDED`, etcd's "not leader" (a lease request that reached a member which
/// had just lost the lead), any status the client made itself from a transport error (a
/// member sends none with a source: a broken connection comes as `UNKNOWN`), a
/// keep-alive stream that ended before its answer, and our own request timeout.
fn unreachable(error: &etcd::Error) -> bool {
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    const UNAVAILABLE: i32 = 14;
    match error {
        etcd::Error::TransportError(_) => true,
        etcd::Error::IoError(_) => timed_out(error),
        // etcd-client's `lease_keep_alive` when the stream ends without an answer.
        etcd::Error::WatchError(_) => true,
        etcd::Error::GRpcStatus(status) => {
            matches!(
                i32::from(status.code()),
                CANCELLED | DEADLINE_EXCEEDED | UNAVAILABLE
            ) || has_status(error, FAILED_PRECONDITION, "etcdserver: not leader")
                || std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

/// Whether `error` is a request timeout ([`EtcdLock::ask`]'s, or the client's), or a
/// deadline that ran out at the member.
fn timed_out(error: &etcd::Error) -> bool {
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    match error {
        etcd::Error::IoError(error) => error.kind() == std::io::ErrorKind::TimedOut,
        etcd::Error::GRpcStatus(status) => {
            matches!(i32::from(status.code()), CANCELLED | DEADLINE_EXCEEDED)
        }
        _ => false,
    }
}

/// The error of a request that a member did not answer within `timeout`.
fn no_answer_within(timeout: Duration) -> etcd::Error {
    etcd::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the etcd member did not answer within the request timeout ({timeout:?})"),
    ))
}

const FAILED_PRECONDITION: i32 = 9;
const NOT_FOUND: i32 = 5;

/// Whether `error` is a gRPC status `code` whose message contains `message`.
fn has_status(error: &etcd::Error, code: i32, message: &str) -> bool {
    matches!(error, etcd::Error::GRpcStatus(status)
        if i32::from(status.code()) == code && status.message().contains(message))
}

/// etcd's answer to a revoke, or a put, on a lease it does not have.
fn lease_not_found(error: &etcd::Error) -> bool {
    has_status(error, NOT_FOUND, "requested lease not found")
}

/// The leases granted for each acquisition, by key and token, that its unlock has not
/// revoked yet: the `leases` of an [`EtcdLock`].
#[derive(Default)]
struct Granted(Mutex<HashMap<(String, String), Vec<i64>>>);

impl Granted {
    fn remember(&self, key: &str, token: &Token, lease: i64) {
        self.lock()
            .entry((key.to_owned(), token.as_str().to_owned()))
            .or_default()
            .push(lease);
    }

    /// Stop remembering `lease` (it was revoked, or it is gone).
    fn forget(&self, key: &str, token: &Token, lease: i64) {
        let mut granted = self.lock();
        let acquisition = (key.to_owned(), token.as_str().to_owned());
        if let Some(leases) = granted.get_mut(&acquisition) {
            leases.retain(|&id| id != lease);
            if leases.is_empty() {
                granted.remove(&acquisition);
            }
        }
    }

    /// Every lease remembered for the acquisition, forgotten.
    fn take(&self, key: &str, token: &Token) -> Vec<i64> {
        self.lock()
            .remove(&(key.to_owned(), token.as_str().to_owned()))
            .unwrap_or_default()
    }

    /// How many acquisitions have leases remembered.
    #[cfg(test)]
    fn acquisitions(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Vec<i64>>> {
        // Never held across an await, and nothing in it panics: a poisoned map is still
        // a good one.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What [`EtcdLock::join`] found.
struct Joined {
    /// Our key's create revision: our place in line, and our fence once we hold.
    revision: i64,
    /// The lease our key is on.
    lease: i64,
    /// The create revision of the line's first key.
    head_revision: Option<i64>,
}

/// What [`EtcdLock::look`] found: our key, and the create revision of the line's head.
struct Look {
    own: Option<Own>,
    head: Option<i64>,
}

impl Look {
    fn we_hold(&self) -> bool {
        matches!((self.own, self.head), (Some(own), Some(head)) if own.revision == head)
    }

    /// What a renewal says when our key is not at the head: taken if another key is.
    fn renewal_lost(&self) -> Renewal {
        match (self.own, self.head) {
            (Some(_), _) | (None, Some(_)) => Renewal::Taken,
            (None, None) => Renewal::Gone,
        }
    }
}

/// Our key in the line.
#[derive(Clone, Copy)]
struct Own {
    /// Its create revision (our fence).
    revision: i64,
    /// The lease it is on.
    lease: i64,
    /// That lease's TTL, in seconds (0 if the key's value does not say).
    granted: i64,
}

impl Own {
    fn of(kv: &etcd::KeyValue) -> Self {
        Self {
            revision: kv.create_revision(),
            lease: kv.lease(),
            granted: kv
                .value_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }
}

fn first_kv(reply: Option<&etcd::TxnOpResponse>) -> Option<etcd::KeyValue> {
    match reply {
        Some(etcd::TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
}

fn fence_of(revision: i64) -> Fence {
    Fence::new(u64::try_from(revision).expect("revisions are positive"))
}

/// How long a waiter waits before it tries again after no member could answer: from
/// 100 ms, doubling, up to a second or half a renewal period, whichever is shorter.
///
/// TIMING: the cap leaves a waiter time to keep its lease alive between tries (a lease
/// lasts three renewal periods); the start is short because most faults (an election, a
/// member that died) are over within a few hundred milliseconds for the next try.
struct Pause {
    next: Duration,
    cap: Duration,
}

impl Pause {
    const FIRST: Duration = Duration::from_millis(100);

    fn new(renew_every: Duration) -> Self {
        Self {
            next: Self::FIRST,
            cap: (renew_every / 2).clamp(Self::FIRST, Duration::from_secs(1)),
        }
    }

    async fn wait(&mut self) {
        sleep(self.next).await;
        self.next = (self.next * 2).min(self.cap);
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

/// What ended a wait on the watch of the key before ours.
enum Woken {
    /// The key was deleted.
    Deleted,
    /// The stream ended, broke or was cancelled: watch again.
    Broken(String),
    /// A keep-alive is due.
    KeepAlive,
}

impl Backend for EtcdLock {
    fn check_key(&self, key: &str) -> Result<()> {
        crate::keys::check_name(
            key,
            MAX_KEY_BYTES,
            "the key is longer than 1024 bytes",
            |key| {
                // `a` and `a/b` would share a line: `distlock/a/` is a prefix of both.
                key.contains('/')
                    .then_some("the key contains '/' (its line would overlap another key's)")
            },
        )
    }

    /// No replicas to wait for; and with more than one member, a ttl whose renewals have
    /// room to fail over.
    ///
    /// TIMING: a renewal (the watchdog's, every renew interval; a waiter's keep-alive,
    /// every third of the ttl) must land before the lease it renews ends: within
    /// `ttl - period` of being sent. A renewal whose member hangs waits one request timeout
    /// there before it goes to another member; it needs a second for that member's
    /// answers (a few milliseconds when all is well), and the scheduler. So `period + 2 *
    /// request_timeout <= ttl`. One member has no other to go to: its renewals wait for it
    /// as for any slow server.
    fn check_options(&self, options: &LockOptions) -> Result<()> {
        if options.wait_for_replicas().is_some() {
            return Err(Error::InvalidOptions(
                "etcd commits every write to a quorum before it answers; there are no replicas to wait for (wait_for_replicas)".into(),
            ));
        }
        if self.clients.len() > 1 {
            let ttl = options.ttl();
            let period = options.renew_interval().unwrap_or(ttl / 3).max(ttl / 3);
            let room = ttl.saturating_sub(period);
            let timeout = self.request_timeout;
            if timeout * 2 > room {
                return Err(Error::InvalidOptions(format!(
                    "ttl {ttl:?} leaves a renewal {room:?} to land in (after a period of {period:?}), less than two etcd request timeouts ({timeout:?} each): one to give up on a member that does not answer, one for the next member to answer. Use a longer ttl, or a shorter request timeout (EtcdLock::builder)"
                )));
            }
        }
        Ok(())
    }

    fn waits_in_line(&self) -> bool {
        true
    }

    /// Put our key; hold if it heads the line, or else take it back at once.
    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let lease = self.new_lease(key, token);
        let granted = self.grant(lease, ttl).await?;
        let joined = self.join(key, token, lease, granted).await?;
        if joined.head_revision == Some(joined.revision) {
            return Ok(Attempt::Acquired(fence_of(joined.revision)));
        }
        // Revoking the lease deletes our key with it. If that fails, the error goes to the
        // locker, whose unlock deletes the key.
        self.revoke_all(key, token, Some(joined.lease)).await?;
        Ok(Attempt::Held { expires_in: None })
    }

    /// Put our key, then until it heads the line: watch the key created just before it,
    /// keeping our lease alive meanwhile. What fails for want of a member (a member down
    /// or without a leader, a watch stream that breaks) is tried again, without giving up
    /// the place, until the locker drops this future at the caller's deadline; only a
    /// lease etcd no longer has, or our key deleted, loses it ([`Error::LostPlace`]).
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        // TIMING: a lease runs from when etcd granted it (later, from each keep-alive), which
        // is after the request was sent, and etcd's lease is at least `ttl`; it is kept
        // alive every third of `ttl` while we wait.
        let every = (ttl / 3).max(Duration::from_millis(100));
        let mut pause = Pause::new(every);
        let lost = |why| Error::LostPlace {
            key: key.to_owned(),
            why,
        };

        // Join the line.
        let mut lease = self.new_lease(key, token);
        let mut asked_at = Instant::now();
        let joined = loop {
            let joined = match self.grant(lease, ttl).await {
                Ok(granted) => self.join(key, token, lease, granted).await,
                Err(error) => Err(error),
            };
            match joined {
                Ok(joined) => break joined,
                Err(error) if lease_not_found(&error) => {
                    // Our lease ran out before our key could be put on it (etcd was out of
                    // reach for longer than a ttl): a new one.
                    lease = self.new_lease(key, token);
                    asked_at = Instant::now();
                }
                Err(error) if unreachable(&error) => {
                    tracing::warn!(%key, %error, "etcd could not answer; joining the line again");
                    pause.wait().await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        pause.reset();
        let mine = joined.revision;
        // The lease was granted after `asked_at` (its first grant request); a key found on
        // another lease (a token used twice) is proven by a keep-alive first.
        let mut proven_at = asked_at;
        let mut keep_alive_at = if joined.lease == lease {
            asked_at + every
        } else {
            Instant::now()
        };
        let lease = joined.lease;

        let mut waited = false;
        // The key just before ours (its name and create revision), once read.
        let mut before: Option<(Vec<u8>, i64)> = None;
        // The watch of `before`, and the member it was made on.
        let mut watch: Option<(etcd::WatchStream, usize)> = None;
        loop {
            // Whether this round kept the lease alive before its read.
            let mut kept_alive = false;
            if Instant::now() >= keep_alive_at {
                let sent = Instant::now();
                match self.keep_alive(lease).await {
                    Ok(true) => {
                        proven_at = sent;
                        keep_alive_at = sent + every;
                        kept_alive = true;
                    }
                    Ok(false) => return Err(lost("our etcd lease ran out while we waited")),
                    Err(error) if unreachable(&error) => {
                        tracing::warn!(%key, %error, "could not keep our etcd lease alive; trying again");
                        pause.wait().await;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                }
            }

            // Our key, and the one just before it, at one revision.
            let read = self
                .read([self.read_own(key, token), self.read_before(key, mine)])
                .await;
            let (read_at, [own, last_before]) = match read {
                Ok(read) => read,
                Err(error) if unreachable(&error) => {
                    tracing::warn!(%key, %error, "could not read the line; trying again");
                    pause.wait().await;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            pause.reset();
            if own.is_none() {
                return Err(lost("our etcd key was deleted while we waited"));
            }
            let found = last_before.map(|kv| (kv.key().to_vec(), kv.create_revision()));
            if found != before {
                if before.is_some() {
                    // The key we watched is gone, and this read saw it before the watch did
                    // (or the watch was broken then): a wake-up all the same.
                    self.wake_ups.fetch_add(1, Ordering::Relaxed);
                }
                before = found;
                watch = None;
            }
            let Some((before_key, _)) = &before else {
                // Our key heads the line.
                // TIMING: the holder's lease is counted from the last keep-alive (or the
                // grant); one older than a renewal period (after a wait through faults) is
                // proven again first, so that the guard starts with two thirds of a lease.
                // A read sent after this round's keep-alive is proof enough, however long
                // the two took: asking for a fresher one would loop for ever on a member
                // slower than that.
                if !kept_alive && Instant::now() >= proven_at + every {
                    // Due now: the top of the loop keeps the lease alive, and only a read
                    // after that can hand us the lock. A keep-alive proves the lease, not
                    // the key: our key deleted between the read above and the keep-alive
                    // (its lease living on) would be a turn for a key that is gone, while
                    // the waiter behind us, woken by that delete, takes the lock too.
                    keep_alive_at = Instant::now();
                    continue;
                }
                // This read was made after the last keep-alive (`proven_at`), which the top
                // of the loop sends before it reads.
                return Ok(Turn::new(fence_of(mine), proven_at, waited));
            };
            waited = true;

            // A watch made through a member that has since failed a step may be silent
            // (a member stopped, not dead): watch again through the member in use.
            let in_use = self.current.load(Ordering::Relaxed);
            if watch.as_ref().is_some_and(|(_, member)| *member != in_use) {
                watch = None;
            }
            if watch.is_none() {
                // Events after the read, so that a delete between the read and the watch is
                // seen.
                let options = WatchOptions::new().with_start_revision(read_at + 1);
                let made = self
                    .call(|mut client| {
                        let (before_key, options) = (before_key.clone(), options.clone());
                        async move { client.watch(before_key, Some(options)).await }
                    })
                    .await;
                match made {
                    Ok(stream) => watch = Some((stream, self.current.load(Ordering::Relaxed))),
                    Err(error) if unreachable(&error) => {
                        tracing::warn!(%key, %error, "could not watch the line; trying again");
                        pause.wait().await;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            let (stream, _) = watch.as_mut().expect("watching");
            // TIMING: every keep-alive is followed by a read of the line, so a delete that
            // a watch missed is seen within a renewal period.
            let woken = loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(reply)) => {
                            if reply.events().iter().any(|event| {
                                event.event_type() == etcd::EventType::Delete
                                    && event.kv().is_some_and(|kv| kv.key() == before_key.as_slice())
                            }) {
                                break Woken::Deleted;
                            }
                            if reply.canceled() {
                                break Woken::Broken(format!(
                                    "cancelled ({}; compacted at {})",
                                    reply.cancel_reason(),
                                    reply.compact_revision()
                                ));
                            }
                            // Created, progress, a put of that key: watch on.
                        }
                        Ok(None) => break Woken::Broken("the stream ended".into()),
                        Err(error) => break Woken::Broken(error.to_string()),
                    },
                    () = sleep_until(keep_alive_at) => break Woken::KeepAlive,
                }
            };
            match woken {
                Woken::Deleted => {
                    self.wake_ups.fetch_add(1, Ordering::Relaxed);
                    before = None;
                    watch = None;
                }
                Woken::Broken(why) => {
                    tracing::debug!(%key, %why, "the watch of the key before ours ended; watching again");
                    watch = None;
                    pause.wait().await;
                }
                Woken::KeepAlive => {}
            }
        }
    }

    /// A keep-alive of our key's lease (or a new lease for a longer ttl), and only then a
    /// read that finds our key still at the head of the line: a key deleted before the
    /// keep-alive landed is seen, even if its lease lived on.
    ///
    /// TIMING: the lease etcd keeps is at least `ttl` from when this was sent (a keep-alive
    /// of a lease granted for at least `ttl`, or a new one for a longer ttl).
    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        let look = self.look(key, token).await?;
        let Some(own) = look.own.filter(|_| look.we_hold()) else {
            return Ok(look.renewal_lost());
        };
        let kept = if u128::from(own.granted.unsigned_abs()) * 1000 < ttl.as_millis() {
            self.re_lease(key, token, own, ttl).await?
        } else {
            self.keep_alive(own.lease).await?
        };
        let after = self.look(key, token).await?;
        Ok(if kept && after.we_hold() {
            Renewal::Renewed
        } else if after.own.is_some() || after.head.is_some() {
            Renewal::Taken
        } else {
            Renewal::Gone
        })
    }

    /// Delete our key (reading the head of the line with it), then revoke every lease this
    /// acquisition was granted: a put still on its way then finds its lease gone, and a key
    /// already on one goes with it. When the delete fails, the leases are forgotten all the
    /// same, unrevoked: they run out within their TTL.
    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        // Forgotten first, whatever happens next (an error, a caller that gives up): by now
        // nothing keeps these leases alive (the locker drops a wait in line and stops the
        // watchdog before it unlocks), so one this cannot revoke runs out within its TTL,
        // with any key on it. Kept after a failure, every unlock of an outage would leave
        // its entry here for good.
        let leases = self.leases.take(key, token);
        // The head is read first: if our key is not there, it is someone else's.
        let txn = Txn::new().and_then([
            self.read_head(key),
            TxnOp::delete(
                self.own_key(key, token),
                Some(DeleteOptions::new().with_prev_key()),
            ),
        ]);
        let answer = self.txn(txn).await?;
        let replies = answer.op_responses();
        let head = first_kv(replies.first());
        let deleted = match replies.get(1) {
            Some(etcd::TxnOpResponse::Delete(delete)) => delete.prev_kvs().first().cloned(),
            _ => None,
        };
        // Our key is gone already; a lease that cannot be revoked now only runs out.
        let _ = self
            .revoke_each(key, leases, deleted.as_ref().map(|kv| kv.lease()))
            .await;
        Ok(match (deleted, head) {
            (Some(_), _) => Unlock::Released,
            (None, Some(_)) => Unlock::Taken,
            (None, None) => Unlock::Gone,
        })
    }

    /// etcd's revision cannot be set back, so a holder's fence is already above every
    /// earlier one: this only checks that we still hold the lock, and refuses a `seen` at
    /// or above our fence ([`Error::FenceOutOfReach`]), which cannot have come from this
    /// cluster while it keeps its data (another backend's fence, or this cluster's before
    /// it was rebuilt from empty or restored from an older backup).
    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        let look = self.look(key, token).await?;
        let Some(own) = look.own.filter(|_| look.we_hold()) else {
            return Ok(None);
        };
        let ours = fence_of(own.revision);
        if ours > seen {
            Ok(Some(ours))
        } else {
            Err(Error::FenceOutOfReach {
                seen: seen.get(),
                next: ours.get(),
            })
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockState> {
        let prefix = self.line_prefix(key);
        let line = self
            .call(|mut client| {
                let prefix = prefix.clone();
                let in_order = GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_keys_only();
                async move { client.get(prefix, Some(in_order)).await }
            })
            .await?;
        let Some(head) = line.kvs().first() else {
            return Ok(LockState::new(false, None, None, Some(0)));
        };
        let lease = head.lease();
        let left = self
            .call(|mut client| async move { client.lease_time_to_live(lease, None).await })
            .await?
            .ttl();
        let expires_in = u64::try_from(left).ok().map(Duration::from_secs);
        Ok(LockState::new(
            true,
            expires_in,
            Some(fence_of(head.create_revision())),
            Some(line.kvs().len() - 1),
        ))
    }

    /// Revoke the lease of the head of the line, whoever put it: etcd deletes the key with
    /// it, the holder's next keep-alive finds its lease gone, and the next waiter's watch
    /// fires. `true` if there was a head, and it is gone.
    async fn force_unlock(&self, key: &str) -> Result<bool> {
        let (_, [head]) = self.read([self.read_head(key)]).await?;
        let Some(head) = head else {
            return Ok(false);
        };
        let (name, revision) = (head.key().to_vec(), head.create_revision());
        let mut lease = head.lease();
        loop {
            if lease == 0 {
                // A key on no lease was not put by this backend: deleted, if it is still
                // the one read.
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        name.clone(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::delete(name.clone(), None)]);
                self.txn(txn).await?;
                return Ok(true);
            }
            // Gone already (run out) is as good.
            self.revoke(lease).await?;
            // The holder may have moved its key to a new lease meanwhile (`extend`): then
            // the key is still there, on that one.
            let (_, [still]) = self.read([TxnOp::get(name.clone(), None)]).await?;
            match still {
                Some(kv) if kv.create_revision() == revision => lease = kv.lease(),
                _ => return Ok(true),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle whose member is never reached (the client connects lazily).
    async fn offline() -> EtcdLock {
        EtcdLock::connect(["http://127.0.0.1:1"]).await.unwrap()
    }

    /// A handle on `members` members that are never reached, with `request_timeout`.
    async fn offline_members(members: u16, request_timeout: Duration) -> EtcdLock {
        let endpoints: Vec<String> = (1..=members)
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect();
        EtcdLock::builder(endpoints)
            .request_timeout(request_timeout)
            .connect()
            .await
            .unwrap()
    }

    fn ttl_ms(ttl: u64) -> LockOptions {
        LockOptions::builder()
            .ttl(Duration::from_millis(ttl))
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn with_several_members_a_ttl_must_leave_a_renewal_two_request_timeouts() {
        let refused = |checked: Result<()>| matches!(checked, Err(Error::InvalidOptions(_)));
        let three = offline_members(3, Duration::from_secs(1)).await;

        // Renewed every third: a 3 s ttl leaves a renewal 2 s, two request timeouts.
        assert!(three.check_options(&ttl_ms(3_000)).is_ok());
        assert!(refused(three.check_options(&ttl_ms(2_900))));
        // Renewed every 4.5 s of 6 s: 1.5 s left.
        let late = |every| {
            LockOptions::builder()
                .ttl(Duration::from_secs(6))
                .renew_interval(Duration::from_millis(every))
                .build()
                .unwrap()
        };
        assert!(three.check_options(&late(4_000)).is_ok());
        assert!(refused(three.check_options(&late(4_500))));
        // Without a watchdog, a waiter still keeps its lease alive every third of it.
        let unwatched = LockOptions::builder()
            .ttl(Duration::from_millis(2_900))
            .without_watchdog()
            .build()
            .unwrap();
        assert!(refused(three.check_options(&unwatched)));
        // A shorter request timeout makes room for a shorter ttl.
        let quick = offline_members(3, Duration::from_millis(300)).await;
        assert!(quick.check_options(&ttl_ms(900)).is_ok());
        // One member has no other to go to.
        let one = offline_members(1, Duration::from_secs(1)).await;
        assert!(one.check_options(&ttl_ms(900)).is_ok());
    }

    #[tokio::test]
    async fn a_zero_request_timeout_is_refused() {
        let built = EtcdLock::builder(["http://127.0.0.1:1"])
            .request_timeout(Duration::ZERO)
            .connect()
            .await;
        assert!(matches!(built, Err(Error::InvalidOptions(_))), "{built:?}");
    }

    #[tokio::test]
    async fn unlocks_that_fail_leave_nothing_remembered_of_their_acquisitions() {
        // Arrange: a handle whose member is never reached, as in an outage.
        let lock = offline().await;

        // Act: acquisitions whose grant fails (a lease is remembered before it is sent),
        // each followed by the locker's unlock, which fails too.
        for _ in 0..10 {
            let token = Token::new();
            let tried = lock.try_lock("k", &token, Duration::from_secs(5)).await;
            assert!(tried.is_err(), "{tried:?}");
            let unlocked = lock.unlock("k", &token).await;
            assert!(unlocked.is_err(), "{unlocked:?}");
        }

        // Assert: the leases nobody keeps alive run out by themselves; none is kept here.
        assert_eq!(lock.leases.acquisitions(), 0);
    }

    #[tokio::test]
    async fn a_prefix_must_be_empty_or_end_with_a_slash() {
        for good in ["", "locks/", "app/locks/"] {
            let lock = offline().await.with_prefix(good).unwrap();
            assert_eq!(lock.line_prefix("k"), format!("{good}k/"));
        }
        for bad in ["x", "xa", "locks"] {
            let refused = offline().await.with_prefix(bad);
            assert!(
                matches!(refused, Err(Error::InvalidOptions(_))),
                "{bad:?}: {refused:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_pauses_longer_after_each_failure_up_to_its_cap_and_starts_over_after_a_success()
     {
        let mut pause = Pause::new(Duration::from_secs(10));
        let mut waited = Vec::new();
        for _ in 0..6 {
            let started = Instant::now();
            pause.wait().await;
            waited.push(started.elapsed());
        }
        assert_eq!(
            waited,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        pause.reset();
        let started = Instant::now();
        pause.wait().await;
        assert_eq!(started.elapsed(), Pause::FIRST);
        // A short ttl pauses at most half a renewal period, so the lease is kept alive.
        assert_eq!(
            Pause::new(Duration::from_millis(600)).cap,
            Duration::from_millis(300)
        );
    }
}
