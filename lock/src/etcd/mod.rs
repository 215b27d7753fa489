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
//!
//! # Layout
//! Read in this order, as one acquisition runs:
//! - this module: [`EtcdLock`], its builder, and the [`Backend`] steps, each a few
//!   requests; `lock_in_line` is the loop of the wait;
//! - `wait`: the wait for a turn, in named steps (keep alive if due, read the line, watch
//!   the key just before ours);
//! - `line`: the line's keys, the reads of it, and the step that joins it;
//! - `leases`: grant, keep alive, move and revoke leases, and the ids remembered for unlock;
//! - `members`: one client per member (made by [`EtcdLockBuilder`]), the failover from one
//!   to the next, and which errors mean "ask another member".
//!
//! Each module depends only on those after it (and on the handle here).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use crate::backend::{Attempt, Backend, LockState, Protocol, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::options::LockOptions;
use crate::token::Token;

use leases::Granted;
use line::{fence_of, first_kv};
pub use members::EtcdLockBuilder;
use wait::{Step, Waiter};

mod leases;
mod line;
mod members;
mod wait;

impl From<etcd::Error> for Error {
    fn from(error: etcd::Error) -> Self {
        Error::backend("etcd", error)
    }
}

/// Where lock keys live unless [`EtcdLock::with_prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "distlock/";

/// The longest key, in bytes.
const MAX_KEY_BYTES: usize = 1024;

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

impl EtcdLock {
    /// How long one request may take at one member unless
    /// [`EtcdLockBuilder::request_timeout`] says otherwise.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

    /// Settings for locks on the cluster at `endpoints` (`http://host:port`): set the
    /// request timeout, then [`connect`](EtcdLockBuilder::connect).
    pub fn builder<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> EtcdLockBuilder {
        EtcdLockBuilder::new(
            endpoints
                .as_ref()
                .iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
        )
    }

    /// Connect to the cluster at `endpoints` (`http://host:port`) with the default request
    /// timeout (1 s; [`builder`](Self::builder) sets another): a client for each member,
    /// used one at a time. A member that does not answer within the request timeout
    /// (hung), cannot be reached, or has no leader is passed over at once, for this step
    /// and the ones after it: a hung member costs one request timeout, once. With more than
    /// one member, [`Locker::new`](crate::Locker::new) refuses a ttl that leaves a renewal
    /// less than two request timeouts (one to give up on a hung member, one for another).
    ///
    /// # Errors
    /// [`Error::Backend`] for an endpoint that is not a URL, or none at all.
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

    fn protocol(&self) -> Protocol {
        Protocol::Queue
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

    /// Put our key, then until it heads the line: keep our lease alive when due, read the
    /// line, and watch the key created just before ours. What fails for want of a member
    /// (a member down or without a leader, a watch stream that breaks) is tried again,
    /// without giving up the place, until the locker drops this future at the caller's
    /// deadline; only a lease etcd no longer has, or our key deleted, loses it
    /// ([`Error::LostPlace`]). The steps are in `wait`.
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        let mut waiter = Waiter::join(self, key, token, ttl).await?;
        loop {
            let Step::Done(kept_alive) = waiter.keep_alive_if_due().await? else {
                continue;
            };
            let Step::Done(read_at) = waiter.read_line().await? else {
                continue;
            };
            if waiter.heads_the_line() {
                match waiter.turn(kept_alive) {
                    Some(turn) => return Ok(turn),
                    None => continue,
                }
            }
            waiter.watch_the_one_before(read_at).await?;
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

    /// Revoke the lease of the head of the line, whoever put it
    /// (`revoke_head`). `true` if there was a head, and it is gone.
    async fn force_unlock(&self, key: &str) -> Result<bool> {
        Ok(self.revoke_head(key).await?)
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
}
