//! Taking locks: one atomic attempt, and the bounded wait built on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use rand::Rng;
use redis::aio::ConnectionLike;
use tokio::time::{Instant, sleep, timeout};

use crate::error::{Error, Result};
use crate::guard::{Hold, LockGuard, release_in_background};
use crate::keys::fence_key;
use crate::lease::{Lease, Watchdog};
use crate::options::LockOptions;
use crate::owner::Owner;
use crate::scripts::ACQUIRE;

/// Takes locks on one Redis through one connection.
///
/// Cheap to clone (the connection is cloned, the options shared). Use a multiplexed
/// connection such as [`redis::aio::ConnectionManager`]: concurrent lock calls are then
/// pipelined on one socket, and the manager reconnects after Redis restarts.
pub struct Locker<C: ConnectionLike + Clone + Send + Sync + 'static> {
    conn: C,
    options: Arc<LockOptions>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Clone for Locker<C> {
    fn clone(&self) -> Self {
        Self {
            conn: self.conn.clone(),
            options: Arc::clone(&self.options),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Locker<C> {
    /// A locker on `conn`. The options were checked when they were built.
    pub fn new(conn: C, options: LockOptions) -> Self {
        Self {
            conn,
            options: Arc::new(options),
        }
    }

    /// The options this locker uses.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// A new owner identity, for locks that must be reentrant (see [`Owner`]).
    pub fn owner(&self) -> Owner<C> {
        Owner::new(self.clone())
    }

    /// Take the lock if it is free; never wait.
    ///
    /// One round trip: `SET key token NX PX ttl` and the fence `INCR`, in one script. Every
    /// call is a new owner, so a second `try_acquire` of a key held by the first fails.
    ///
    /// # Errors
    /// [`Error::Held`] when another owner holds the lock; [`Error::InvalidKey`] for an empty
    /// key; [`Error::Redis`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    /// If the future is dropped while the command is in flight, a release by token follows
    /// it on the same connection in a spawned task, so a key Redis sets anyway is deleted
    /// (outside a tokio runtime it lives out its ttl: no watchdog was started for it).
    pub async fn try_acquire(&self, key: &str) -> Result<LockGuard<C>> {
        let hold = self.try_acquire_hold(key).await?;
        Ok(LockGuard {
            hold: Arc::new(hold),
            owner: None,
        })
    }

    /// Take the lock, waiting for it until the options' `wait_timeout`.
    ///
    /// Retries with jittered exponential backoff between `retry_delay`'s bounds. No attempt
    /// starts after the deadline, and an attempt still in flight at the deadline is abandoned
    /// (its key, if Redis set it, is deleted by token in the background).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes; [`Error::InvalidKey`] for an empty key;
    /// [`Error::Redis`] at once when Redis cannot be reached (waiting would not help).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): a key set by an abandoned attempt is deleted
    /// by token in the background.
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<C>> {
        wait_for(&self.options, key, || async {
            Ok(self.attempt(key).await?.map(|hold| LockGuard {
                hold: Arc::new(hold),
                owner: None,
            }))
        })
        .await
    }

    pub(crate) async fn try_acquire_hold(&self, key: &str) -> Result<Hold<C>> {
        self.attempt(key).await?.ok_or_else(|| Error::Held {
            key: key.to_owned(),
        })
    }

    /// One acquire attempt: `Ok(None)` when the lock is held by someone else.
    pub(crate) async fn attempt(&self, key: &str) -> Result<Option<Hold<C>>> {
        let fence_key = fence_key(key)?;
        let token = new_token();
        let sent = Instant::now();
        let abandoned = ReleaseIfAbandoned {
            conn: &self.conn,
            key,
            token: &token,
        };
        let fence: u64 = ACQUIRE
            .key(key)
            .key(fence_key)
            .arg(&token)
            .arg(self.options.ttl_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        std::mem::forget(abandoned);
        if fence == 0 {
            return Ok(None);
        }
        let watched = self.options.renew_interval().is_some();
        let lease = Arc::new(Lease::new(sent, self.options.ttl(), watched));
        let watchdog = self.options.renew_interval().map(|every| {
            Watchdog {
                conn: self.conn.clone(),
                key: key.to_owned(),
                token: token.clone(),
                ttl: self.options.ttl(),
                every,
                lease: Arc::clone(&lease),
            }
            .spawn()
        });
        Ok(Some(Hold {
            conn: self.conn.clone(),
            key: key.to_owned(),
            token,
            fence: AtomicU64::new(fence),
            lease,
            watchdog,
            released: AtomicBool::new(false),
        }))
    }
}

/// Run `attempt` until it yields a guard or `options.wait_timeout()` passes, sleeping a
/// jittered, doubling backoff between attempts. Shared by the single-node lock and Redlock.
pub(crate) async fn wait_for<T, F, Fut>(
    options: &LockOptions,
    key: &str,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    let deadline = started + options.wait_timeout();
    let (min, max) = options.retry_delay();
    let mut step = min;
    let timed_out = || Error::Timeout {
        key: key.to_owned(),
        waited: started.elapsed(),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // An attempt is bounded by what is left of the wait, except that a zero wait
        // still makes one (unbounded) attempt: `wait_timeout(0)` means "try once".
        let outcome = if left.is_zero() {
            attempt().await
        } else {
            timeout(left, attempt()).await.map_err(|_| timed_out())?
        };
        if let Some(guard) = outcome? {
            return Ok(guard);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        sleep(jittered(step).min(left)).await;
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        step = (step * 2).min(max);
    }
}

/// A sleep drawn from the upper half of `step`, so waiters spread out but never spin.
pub(crate) fn jittered(step: Duration) -> Duration {
    let half = step / 2;
    half + rand::rng().random_range(Duration::ZERO..=half)
}

/// 128 random bits from a CSPRNG, hex-encoded: new for every acquisition, so no two
/// acquisitions, even of the same owner, share a token.
pub(crate) fn new_token() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Armed while an acquire command is in flight. If the attempt is dropped there (a deadline,
/// a cancelled caller), Redis may still set the key; this deletes it by token in the
/// background. Commands on one multiplexed connection run in order, so the delete runs after
/// the set. An error reply leaves it armed too (the connection may have dropped after Redis
/// ran the command). Disarmed with `mem::forget` once a reply is in.
struct ReleaseIfAbandoned<'a, C: ConnectionLike + Clone + Send + Sync + 'static> {
    conn: &'a C,
    key: &'a str,
    token: &'a str,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for ReleaseIfAbandoned<'_, C> {
    fn drop(&mut self) {
        release_in_background(self.conn, self.key.to_owned(), self.token.to_owned());
    }
}
