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
//! - **renewal** is one keep-alive of the key's lease; etcd rounds leases up to whole
//!   seconds and to its minimum TTL, so the lease it grants is never shorter than the ttl
//!   asked for, and the holder's lease (counted from when the keep-alive was sent) ends
//!   first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use tokio::time::Instant;

use crate::backend::{Attempt, Backend, LockState, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fenced::Fence;
use crate::options::LockOptions;
use crate::token::Token;

/// Where lock keys live unless [`EtcdLock::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "distlock/";

/// The longest key, in bytes.
const MAX_KEY_BYTES: usize = 1024;

/// Locks in etcd: a [`Backend`] that keeps its own line of waiters. Cheap to clone.
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
    /// The member requests go to now: an index into `clients`.
    current: Arc<AtomicUsize>,
    /// Put before every lock key.
    prefix: String,
    /// Watch events that woke a waiter here: how the no-herd property is observed.
    wake_ups: Arc<AtomicU64>,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdLock {
    /// Connect to the cluster at `endpoints` (`http://host:port`): a client for each, used
    /// one at a time; a step that cannot reach its member (or finds it without a leader)
    /// goes to the next, until every member was tried once.
    ///
    /// # Errors
    /// [`Error::Etcd`] for an endpoint that is not a URL, or none at all.
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self> {
        let options = etcd::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(5))
            // A member cut off from the leader refuses instead of answering from its own
            // (possibly stale) state.
            .with_require_leader(true);
        let mut clients = Vec::new();
        for endpoint in endpoints.as_ref() {
            // Connects lazily: a member that is down now is tried when a step needs it.
            clients.push(etcd::Client::connect([endpoint], Some(options.clone())).await?);
        }
        if clients.is_empty() {
            return Err(etcd::Error::InvalidArgs("no etcd endpoint".into()).into());
        }
        Ok(Self::with_clients(clients))
    }

    /// Locks through a client connected elsewhere (every step goes through it).
    pub fn new(client: etcd::Client) -> Self {
        Self::with_clients(vec![client])
    }

    fn with_clients(clients: Vec<etcd::Client>) -> Self {
        Self {
            clients: clients.into(),
            current: Arc::new(AtomicUsize::new(0)),
            prefix: DEFAULT_PREFIX.to_owned(),
            wake_ups: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Put lock keys under `prefix` instead of [`DEFAULT_PREFIX`].
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many times a watch woke a waiter of this client (the key before it went away).
    /// With one watch per waiter, a release wakes one waiter in all.
    pub fn wake_ups(&self) -> u64 {
        self.wake_ups.load(Ordering::Relaxed)
    }

    /// Send `request` to the member in use; if it cannot be reached, to the next, until
    /// every member was tried once. Every step of this backend may be sent twice (see
    /// [`Backend`]), so one whose answer was lost with its member may go to another.
    async fn call<T, F, Fut>(&self, request: F) -> Result<T, etcd::Error>
    where
        F: Fn(etcd::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd::Error>>,
    {
        let mut tries = self.clients.len();
        loop {
            let at = self.current.load(Ordering::Acquire);
            let error = match request(self.clients[at].clone()).await {
                Err(error) if unreachable(&error) => error,
                answer => return answer,
            };
            tries -= 1;
            if tries == 0 {
                return Err(error);
            }
            // On to the next member, unless another step has moved on already.
            let next = (at + 1) % self.clients.len();
            let _ = self
                .current
                .compare_exchange(at, next, Ordering::AcqRel, Ordering::Acquire);
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

    /// A lease that outlives `ttl` (etcd counts leases in whole seconds, and may grant
    /// more than asked): its id and the TTL granted, in seconds.
    async fn grant(&self, ttl: Duration) -> Result<(i64, i64)> {
        let seconds = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        let granted = self
            .call(|mut client| async move { client.lease_grant(seconds, None).await })
            .await?;
        Ok((granted.id(), granted.ttl()))
    }

    /// Revoke `lease`; one that is already gone is fine.
    async fn revoke(&self, lease: i64) {
        let revoked = self
            .call(|mut client| async move { client.lease_revoke(lease).await })
            .await;
        if let Err(error) = revoked {
            tracing::debug!(%error, lease, "lease revoke failed; it runs out by itself");
        }
    }

    /// One keep-alive of `lease`; `false` if etcd no longer has it.
    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        match self
            .call(|mut client| async move { client.lease_keep_alive(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(etcd::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// Move our key (created at `revision`) to a new lease of at least `ttl`: a keep-alive
    /// starts a lease again with the TTL it was granted, so a longer ttl
    /// ([`LockGuard::extend`](crate::LockGuard::extend)) needs a new lease. `false` if our
    /// key is gone.
    async fn re_lease(
        &self,
        key: &str,
        token: &Token,
        revision: i64,
        old: i64,
        ttl: Duration,
    ) -> Result<bool> {
        let (lease, granted) = self.grant(ttl).await?;
        let own = self.own_key(key, token);
        let txn = Txn::new()
            .when([Compare::create_revision(
                own.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(
                own,
                granted.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let moved = self.txn(txn).await?.succeeded();
        // Whichever lease the key is not on now goes.
        self.revoke(if moved { old } else { lease }).await;
        Ok(moved)
    }

    /// Put our key on `lease` unless it is there already (a retried step); answers our
    /// key's create revision, the lease it is on, and the first key of the line.
    async fn join(&self, key: &str, token: &Token, (lease, granted): (i64, i64)) -> Result<Joined> {
        let own = self.own_key(key, token);
        let head = || TxnOp::get(self.line_prefix(key), Some(first_created().with_limit(1)));
        let txn = Txn::new()
            .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
            .and_then([
                // The value is the lease's TTL: a renewal for a longer ttl needs a new lease.
                TxnOp::put(
                    own.clone(),
                    granted.to_string(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                head(),
            ])
            .or_else([TxnOp::get(own.clone(), None), head()]);
        let answer = self.txn(txn).await?;
        let replies = answer.op_responses();
        let head = first_kv(replies.get(1));
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |h| h.revision());
            return Ok(Joined {
                revision,
                lease,
                head_revision: head.map(|kv| kv.create_revision()),
            });
        }
        // Our key was there from an earlier try: keep it, with its own lease.
        self.revoke(lease).await;
        let kv = first_kv(replies.first()).ok_or_else(|| {
            etcd::Error::Internal("the transaction found our key and then did not".into())
        })?;
        Ok(Joined {
            revision: kv.create_revision(),
            lease: kv.lease(),
            head_revision: head.map(|kv| kv.create_revision()),
        })
    }

    /// Our key (create revision and lease) and the first key of the line, read together.
    async fn look(&self, key: &str, token: &Token) -> Result<Look> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.own_key(key, token), None),
            TxnOp::get(self.line_prefix(key), Some(first_created().with_limit(1))),
        ]);
        let answer = self.txn(txn).await?;
        let replies = answer.op_responses();
        Ok(Look {
            own: first_kv(replies.first()).map(|kv| Own {
                revision: kv.create_revision(),
                lease: kv.lease(),
                granted: kv
                    .value_str()
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            }),
            head: first_kv(replies.get(1)).map(|kv| kv.create_revision()),
        })
    }
}

/// Whether `error` says that the member could not be reached or could not answer, so that
/// another member may: gRPC's `UNAVAILABLE` (not connected, no leader, shutting down),
/// `CANCELLED` (the connection closed, the client's timeout), `DEADLINE_EXCEEDED`, or any
/// status the client made itself from a transport error (a member sends none with a
/// source: a broken pipe comes as `UNKNOWN`).
fn unreachable(error: &etcd::Error) -> bool {
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    const UNAVAILABLE: i32 = 14;
    match error {
        etcd::Error::TransportError(_) => true,
        etcd::Error::GRpcStatus(status) => {
            matches!(
                i32::from(status.code()),
                CANCELLED | DEADLINE_EXCEEDED | UNAVAILABLE
            ) || std::error::Error::source(status).is_some()
        }
        _ => false,
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

/// Our key in the line.
#[derive(Clone, Copy)]
struct Own {
    /// Its create revision (our fence).
    revision: i64,
    /// The lease it is on.
    lease: i64,
    /// That lease's TTL, in seconds.
    granted: i64,
}

impl Look {
    fn we_hold(&self) -> bool {
        matches!((self.own, self.head), (Some(own), Some(head)) if own.revision == head)
    }
}

/// A range read over a line in creation order.
fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
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

impl Backend for EtcdLock {
    fn check_key(&self, key: &str) -> Result<()> {
        let reason = if key.is_empty() {
            "the key is empty"
        } else if key.len() > MAX_KEY_BYTES {
            "the key is longer than 1024 bytes"
        } else if key.contains('/') {
            // `a` and `a/b` would share a line: `distlock/a/` is a prefix of both.
            "the key contains '/' (its line would overlap another key's)"
        } else {
            return Ok(());
        };
        Err(Error::InvalidKey {
            key: key.chars().take(64).collect(),
            reason,
        })
    }

    fn check_options(&self, options: &LockOptions) -> Result<()> {
        match options.wait_for_replicas() {
            Some(_) => Err(Error::InvalidOptions(
                "etcd commits every write to a quorum before it answers; there are no replicas to wait for (wait_for_replicas)".into(),
            )),
            None => Ok(()),
        }
    }

    fn waits_in_line(&self) -> bool {
        true
    }

    /// Put our key; hold if it heads the line, or else take it back at once.
    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let joined = self.join(key, token, self.grant(ttl).await?).await?;
        if joined.head_revision == Some(joined.revision) {
            return Ok(Attempt::Acquired(fence_of(joined.revision)));
        }
        let own = self.own_key(key, token);
        let _ = self
            .call(|mut client| {
                let own = own.clone();
                async move { client.delete(own, None).await }
            })
            .await?;
        self.revoke(joined.lease).await;
        Ok(Attempt::Held { expires_in: None })
    }

    /// Put our key, then until it heads the line: watch the key created just before it,
    /// keeping our lease alive meanwhile.
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        // TIMING: the lease runs from when the grant (later, each keep-alive) was sent, and
        // etcd's lease is at least `ttl`; it is renewed every third of `ttl` while we wait.
        let mut proven_at = Instant::now();
        let joined = self.join(key, token, self.grant(ttl).await?).await?;
        let lease = joined.lease;
        let mine = joined.revision;
        let every = (ttl / 3).max(Duration::from_millis(100));
        let mut waited = false;
        let lost = || Error::LostPlace {
            key: key.to_owned(),
            why: "our etcd lease ran out while we waited",
        };
        loop {
            // The key just before ours, and our own, at one revision.
            let txn = Txn::new().and_then([
                TxnOp::get(self.own_key(key, token), None),
                TxnOp::get(
                    self.line_prefix(key),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(mine - 1)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1),
                    ),
                ),
            ]);
            let answer = self.txn(txn).await?;
            let read_at = answer.header().map_or(0, |h| h.revision());
            let replies = answer.op_responses();
            if first_kv(replies.first()).is_none() {
                return Err(lost());
            }
            let Some(before) = first_kv(replies.get(1)) else {
                return Ok(Turn::new(fence_of(mine), proven_at, waited));
            };
            waited = true;
            // Events after the read, so a delete between the read and the watch is seen.
            let options = etcd::WatchOptions::new().with_start_revision(read_at + 1);
            let mut watch = self
                .call(|mut client| {
                    let (before, options) = (before.key().to_vec(), options.clone());
                    async move { client.watch(before, Some(options)).await }
                })
                .await?;
            let mut renew = tokio::time::interval_at(proven_at + every, every);
            loop {
                tokio::select! {
                    message = watch.message() => {
                        let gone = match message? {
                            Some(reply) => {
                                reply.canceled()
                                    || reply
                                        .events()
                                        .iter()
                                        .any(|event| event.event_type() == etcd::EventType::Delete)
                            }
                            None => true,
                        };
                        if gone {
                            self.wake_ups.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                    _ = renew.tick() => {
                        let sent = Instant::now();
                        if !self.keep_alive(lease).await? {
                            return Err(lost());
                        }
                        proven_at = sent;
                    }
                }
            }
        }
    }

    /// TIMING: the lease etcd keeps is at least `ttl` from when this was sent (a keep-alive
    /// of a lease granted for at least `ttl`, or a new one for a longer ttl).
    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        let look = self.look(key, token).await?;
        let Some(own) = look.own else {
            return Ok(match look.head {
                Some(_) => Renewal::Taken,
                None => Renewal::Gone,
            });
        };
        if !look.we_hold() {
            return Ok(Renewal::Taken);
        }
        let kept = if u128::from(own.granted.unsigned_abs()) * 1000 < ttl.as_millis() {
            self.re_lease(key, token, own.revision, own.lease, ttl)
                .await?
        } else {
            self.keep_alive(own.lease).await?
        };
        Ok(if kept {
            Renewal::Renewed
        } else {
            Renewal::Gone
        })
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        let look = self.look(key, token).await?;
        let Some(Own { lease, .. }) = look.own else {
            return Ok(match look.head {
                Some(_) => Unlock::Taken,
                None => Unlock::Gone,
            });
        };
        let own = self.own_key(key, token);
        let deleted = self
            .call(|mut client| {
                let own = own.clone();
                async move { client.delete(own, None).await }
            })
            .await?;
        self.revoke(lease).await;
        Ok(if deleted.deleted() > 0 {
            Unlock::Released
        } else {
            Unlock::Gone
        })
    }

    /// etcd's revision cannot be set back, so a holder's fence is already above every
    /// earlier one: this only checks that we still hold the lock, and refuses a `seen` at
    /// or above our fence, which cannot have come from this cluster while we hold it.
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
                async move {
                    client
                        .get(prefix, Some(first_created().with_keys_only()))
                        .await
                }
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

    /// Delete the head of the line, whoever put it; the next waiter's watch fires.
    async fn force_unlock(&self, key: &str) -> Result<bool> {
        let prefix = self.line_prefix(key);
        let line = self
            .call(|mut client| {
                let prefix = prefix.clone();
                async move {
                    client
                        .get(prefix, Some(first_created().with_limit(1)))
                        .await
                }
            })
            .await?;
        let Some(head) = line.kvs().first() else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                head.key().to_vec(),
                CompareOp::Equal,
                head.create_revision(),
            )])
            .and_then([TxnOp::delete(head.key().to_vec(), None)]);
        let deleted = self.txn(txn).await?.succeeded();
        if deleted {
            self.revoke(head.lease()).await;
        }
        Ok(deleted)
    }
}
