//! [`Backend`]: where a lock lives. Everything above it (waiting, the watchdog, the lost
//! signal, reentrancy, the drop fallback) is written once in [`Locker`](crate::Locker) and
//! [`LockGuard`](crate::LockGuard); a backend only runs single atomic steps.
//!
//! | backend | type | one atomic step is |
//! |---|---|---|
//! | one Redis (or a Redis Cluster) | any [`redis::aio::ConnectionLike`] | a Lua script |
//! | a majority of independent Redis masters | [`Redlock`](crate::Redlock) | the script on every node, counted |
//! | a PostgreSQL lock table (feature `postgres`) | [`PgLockTable`](crate::PgLockTable) | one SQL statement |

use std::time::Duration;

use crate::error::Result;
use crate::fenced::Fence;
use crate::options::LockOptions;
use crate::token::Token;

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
pub enum Unlock {
    /// Our token was there and is now gone.
    Released,
    /// Nothing was there. Either the lease ran out, or this is a retried request whose
    /// first try already deleted it; the holder's own lease tells which.
    Gone,
    /// Another token was there, and was left alone.
    Taken,
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
    fn check_options(&self, options: &LockOptions) -> Result<()> {
        let _ = options;
        Ok(())
    }

    /// The part of `ttl` the holder may count on, from when it sent the acquire or renew
    /// command. Redlock gives up its drift allowance here.
    fn lease(&self, ttl: Duration) -> Duration {
        ttl
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
}
