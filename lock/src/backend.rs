//! [`Backend`]: where a lock lives. Everything above it (waiting, the watchdog, the lost
//! signal, reentrancy, the drop fallback) is written once in [`Locker`](crate::Locker) and
//! [`LockGuard`](crate::LockGuard); a backend only runs single atomic steps.
//!
//! | backend | type | one atomic step is | waited on by |
//! |---|---|---|---|
//! | one Redis (or a Redis Cluster) | any [`redis::aio::ConnectionLike`] | a Lua script | [`Protocol::Retry`] |
//! | one Redis behind Sentinel (feature `sentinel`) | [`SentinelConnection`](crate::SentinelConnection) | a Lua script on the primary | [`Protocol::Retry`] |
//! | a majority of independent Redis masters | [`Redlock`](crate::Redlock) | the script on every node, counted | [`Protocol::Retry`] |
//! | a PostgreSQL lock table (feature `postgres`) | [`PgLockTable`](crate::PgLockTable) | one SQL statement | [`Protocol::Retry`] |
//! | ZooKeeper (feature `zookeeper`) | [`ZkLock`](crate::ZkLock) | one request to the ensemble | [`Protocol::Queue`] |
//! | etcd (feature `etcd`) | [`EtcdLock`](crate::EtcdLock) | one request to the cluster | [`Protocol::Queue`] |
//!
//! # Writing a backend
//! The trait is public so that the crate's own backends are written once against it, and so
//! that another store can be added outside the crate. A new backend must keep the rules
//! each method states (every step checked by token, every step safe to re-send), and it
//! should pass the property suite the crate's own backends pass (`lock/tests/properties.rs`
//! in the repository: one `Harness` for the new store, and the `suite!` macro). Methods may
//! be added to the trait, always with a default.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::fence::Fence;
use crate::options::LockOptions;
pub use crate::token::Token;

/// The two ways a backend can be waited on ([`Backend::protocol`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// The locker retries [`Backend::try_lock`] until the deadline, pausing between attempts
    /// (Redis, Redlock, PostgreSQL).
    Retry,
    /// The backend keeps its own line of waiters: the locker calls [`Backend::lock_in_line`]
    /// once, bounded by the deadline (ZooKeeper, etcd).
    Queue,
}

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attempt {
    /// The lock is ours, with this fence.
    Acquired(Fence),
    /// Another token holds it; `expires_in` is what is left of its lease, when known (a
    /// waiter never sleeps longer than that).
    Held {
        /// The holder's remaining lease.
        expires_in: Option<Duration>,
    },
}

/// A place in a backend's own line that has become the holder
/// ([`Backend::lock_in_line`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Turn {
    /// The holder's fence.
    pub fence: Fence,
    /// When the request that proved the lease alive was sent (the read that found us at
    /// the head of the line, or the last keep-alive of the lease, whichever came later):
    /// the holder's lease is counted from here, not from when it joined the line, which
    /// may be longer ago than a whole ttl.
    pub proven_at: Instant,
    /// Whether another holder was ahead in line when we joined it
    /// ([`LockGuard::was_contended`](crate::LockGuard::was_contended)).
    pub waited: bool,
}

impl Turn {
    /// A turn with this fence, its lease proven by a request sent at `proven_at`, that did
    /// or did not wait behind another holder (for backends outside the crate; the struct is
    /// `#[non_exhaustive]`).
    pub fn new(fence: Fence, proven_at: Instant, waited: bool) -> Self {
        Self {
            fence,
            proven_at,
            waited,
        }
    }
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// Our token was there; its lease starts again.
    Renewed,
    /// Nothing was there: the lease ran out, or somebody deleted it.
    Gone,
    /// Another token was there.
    Taken,
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unlock {
    /// Our token was there and is now gone.
    Released,
    /// Nothing was there. Either the lease ran out, or this is a retried request whose
    /// first try already deleted it; the holder's own lease tells which.
    Gone,
    /// Another token was there, and was left alone.
    Taken,
}

/// What a backend knows about a key right now, for operators ([`Locker::inspect`](crate::Locker::inspect)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockState {
    /// Whether some owner holds the lock now.
    pub held: bool,
    /// What is left of the holder's lease, when the backend keeps one it can tell.
    pub expires_in: Option<Duration>,
    /// The largest fence handed out for this key so far (the holder's, while it is held),
    /// if the backend has handed out any.
    pub fence: Option<Fence>,
    /// How many owners wait in the backend's own line for the key (backends that keep one).
    pub waiting: Option<usize>,
}

impl LockState {
    /// A state with these values (for backends outside the crate; the struct is
    /// `#[non_exhaustive]`).
    pub fn new(
        held: bool,
        expires_in: Option<Duration>,
        fence: Option<Fence>,
        waiting: Option<usize>,
    ) -> Self {
        Self {
            held,
            expires_in,
            fence,
            waiting,
        }
    }
}

/// A place that can hold locks: single atomic steps, each checked by token.
///
/// Every step must be safe to run twice with the same arguments, because clients re-send a
/// request whose answer was lost (redis-rs's cluster client does): an acquire that finds its
/// own token reports [`Attempt::Acquired`] with its fence, and a release that finds nothing
/// reports [`Unlock::Gone`].
pub trait Backend: Send + Sync + 'static {
    /// Check a key before anything is sent.
    ///
    /// # Errors
    /// [`Error::InvalidKey`](crate::Error::InvalidKey).
    fn check_key(&self, key: &str) -> Result<()>;

    /// Check options against what this backend needs (Redlock needs room for clock drift
    /// and for its node timeouts). Called once, by [`Locker::new`](crate::Locker::new).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions).
    ///
    /// The default accepts every option but [`wait_for_replicas`](crate::LockOptionsBuilder::wait_for_replicas),
    /// which only a backend with replicas can keep.
    fn check_options(&self, options: &LockOptions) -> Result<()> {
        match options.wait_for_replicas() {
            Some(_) => Err(crate::Error::InvalidOptions(
                "this backend has no replicas to wait for (wait_for_replicas)".into(),
            )),
            None => Ok(()),
        }
    }

    /// Check that the server (or every server that answers) can run this backend: the
    /// single-Redis backend needs Redis 7.0 or later. Called by
    /// [`Locker::connect`](crate::Locker::connect).
    ///
    /// # Errors
    /// [`Error::UnsupportedServer`](crate::Error::UnsupportedServer), or the backend's error
    /// when it cannot be reached.
    fn check_server(&self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// The part of `ttl` the holder may count on, from when it sent the acquire or renew
    /// command. Redlock gives up its drift allowance here.
    fn lease(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// How [`Locker::acquire`](crate::Locker::acquire) waits on this backend: by retrying
    /// [`try_lock`](Self::try_lock) (the default), or by joining the backend's own line once
    /// with [`lock_in_line`](Self::lock_in_line).
    fn protocol(&self) -> Protocol {
        Protocol::Retry
    }

    /// Join the line for `key` as `token`, and resolve once `token` holds the lock, with its
    /// fence and the instant its lease is counted from. Only called when
    /// [`protocol`](Self::protocol) is [`Protocol::Queue`]. The backend keeps its own lease
    /// (a session, a lease it keeps alive) while the caller waits in line.
    ///
    /// The locker runs it in a task of its own, bounded by the caller's deadline. When it
    /// gives up on the wait (the deadline, a caller that went away, an error) it drops the
    /// future and calls [`unlock`](Self::unlock) with the same token, so dropping the future
    /// at any point must leave nothing behind that `unlock` cannot remove.
    fn lock_in_line(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Turn>> + Send {
        let _ = (key, token, ttl);
        async { Err(crate::Error::Unsupported("a line of waiters")) }
    }

    /// After an acquire or a renewal on this connection, wait up to `timeout` until
    /// `replicas` replicas have acknowledged it (Redis's `WAIT`); answers how many did.
    /// Asked only when the options set [`wait_for_replicas`](crate::LockOptionsBuilder::wait_for_replicas);
    /// a backend without replicas refuses those options in
    /// [`check_options`](Self::check_options).
    fn wait_for_replicas(
        &self,
        replicas: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<u32>> + Send {
        let _ = (replicas, timeout);
        async { Err(crate::Error::Unsupported("waiting for replicas")) }
    }

    /// One attempt: take `key` for `token` for `ttl` unless another token holds it, and take
    /// a new fence.
    fn try_lock(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Attempt>> + Send;

    /// Start the lease again, if `token` still holds `key`.
    fn renew(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal>> + Send;

    /// Delete `key`, if `token` holds it.
    fn unlock(&self, key: &str, token: &Token) -> impl Future<Output = Result<Unlock>> + Send;

    /// A new fence above both `seen` and every fence handed out before, if `token` still
    /// holds `key`; `None` if it does not.
    fn advance_fence(
        &self,
        key: &str,
        token: &Token,
        seen: Fence,
    ) -> impl Future<Output = Result<Option<Fence>>> + Send;

    /// What the backend knows about `key` now: held or not, the lease left, the last fence.
    /// Reads only.
    fn inspect(&self, key: &str) -> impl Future<Output = Result<LockState>> + Send {
        let _ = key;
        async { Err(crate::Error::Unsupported("inspection")) }
    }

    /// Delete the lock on `key` whoever holds it; `true` if there was one. For operators
    /// only: see [`Locker::force_unlock`](crate::Locker::force_unlock).
    fn force_unlock(&self, key: &str) -> impl Future<Output = Result<bool>> + Send {
        let _ = key;
        async { Err(crate::Error::Unsupported("a forced unlock")) }
    }
}
