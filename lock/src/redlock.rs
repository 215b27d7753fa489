//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! # The algorithm
//! 1. With a new random token, run the acquire script (`SET NX PX` + fence `INCR`) on every
//!    node at once, each bounded by a short per-node timeout.
//! 2. The attempt wins if a majority (`N / 2 + 1`) said yes **and** time is left of the
//!    validity window, counted from the start of this attempt (not of the first one):
//!    `validity = ttl - elapsed - drift`, `drift = ttl * drift_factor + 2 ms`.
//! 3. Otherwise release wherever it was set, wait a jittered backoff, and try again until
//!    the wait deadline.
//! 4. Renewal (the watchdog) and release run on every node; renewal keeps the lock only
//!    while a majority renews. When a majority cannot be reached before the validity ends,
//!    or a majority reports the key gone or taken, the holder is told (`lost`).
//!
//! # Fencing across the set
//! Each node keeps its own counter. The fence of an acquisition is the **maximum** of the
//! counters its majority returned, `F`; then, in a second round, every node of the majority
//! has its counter raised to at least `F` (token-checked, so only while we hold the key
//! there). A later acquisition needs a majority too, and two majorities share at least one
//! node. On that node the later `INCR` runs after our key is gone, so after our raise to
//! `F`: it returns more than `F`, and so does the later maximum. Without the second round,
//! the later majority could miss the node that gave us `F` and hand out a smaller fence.
//!
//! # Defaults, compared
//! | | distlock Redlock | redsync (Go) | node-redlock v5 |
//! |---|---|---|---|
//! | drift factor | 0.01 (+2 ms) | 0.01 (+2 ms) | 0.01 |
//! | ttl | 10 s | 8 s | per call |
//! | retry delay | 50 ms doubling to 250 ms, each sleep drawn from the upper half | uniform 50-250 ms | 200 ms + up to 100 ms jitter |
//! | attempts | until `wait_timeout` (5 s) | 32 tries | 10 retries |
//! | renewal | watchdog every ttl / 3 | manual `Extend` | auto-extension 500 ms before expiry (`using`) |
//!
//! The retry delay starts higher than the single-node lock's: a failed attempt leaves partial
//! holds to clean up, and waiters that retry in lock step split the votes again.
//!
//! # Limits
//! Redlock's safety rests on bounded process pauses, bounded network delay and clocks that
//! drift by less than `drift_factor`. Martin Kleppmann's critique ("How to do distributed
//! locking", 2016) shows how a long pause or a clock jump breaks mutual exclusion; the fence
//! is what keeps a store safe then. A node that restarts without persistence forgets the
//! keys it held and may let a second majority form: restart nodes only after one ttl, or
//! run them with persistence.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::ConnectionLike;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::error::{Error, Result};
use crate::fenced::FencedGuard;
use crate::guard::Fence;
use crate::keys::fence_key;
use crate::lease::{self, Lease, LockLost, RETRY_AFTER_ERROR};
use crate::locker::{new_token, wait_for};
use crate::options::LockOptions;
use crate::scripts::{ACQUIRE, ADVANCE_FENCE, RAISE_FENCE, RELEASE, RENEW};

/// Options for [`Redlock`]: the lock's options plus the clock drift allowance.
#[derive(Debug, Clone, PartialEq)]
pub struct RedlockOptions {
    lock: LockOptions,
    drift_factor: f64,
}

impl RedlockOptions {
    /// The fraction of the ttl allowed for clock drift between the nodes and us.
    pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
    /// Redis expires keys with millisecond precision; one more for rounding.
    const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

    /// Redlock options from lock options, with the default drift factor.
    pub fn new(lock: LockOptions) -> Self {
        Self {
            lock,
            drift_factor: Self::DEFAULT_DRIFT_FACTOR,
        }
    }

    /// Set the drift factor.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] unless `0 <= factor < 0.5`, or when the drift it gives
    /// leaves no validity.
    pub fn with_drift_factor(mut self, factor: f64) -> Result<Self> {
        if !(0.0..0.5).contains(&factor) {
            return Err(Error::InvalidOptions(format!(
                "drift factor must be in [0, 0.5), got {factor}"
            )));
        }
        self.drift_factor = factor;
        self.validate()?;
        Ok(self)
    }

    pub fn lock_options(&self) -> &LockOptions {
        &self.lock
    }

    /// `ttl * drift_factor + 2 ms`.
    pub fn drift(&self) -> Duration {
        self.lock.ttl().mul_f64(self.drift_factor) + Self::EXPIRY_PRECISION
    }

    /// How long one node may take to answer before it counts as a failure: small next to
    /// the ttl, so a dead node costs little of the validity window.
    pub fn node_timeout(&self) -> Duration {
        (self.lock.ttl() / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    fn validate(&self) -> Result<()> {
        if self.drift() + self.node_timeout() >= self.lock.ttl() {
            return Err(Error::InvalidOptions(format!(
                "ttl {:?} leaves no validity after drift {:?} and node timeout {:?}",
                self.lock.ttl(),
                self.drift(),
                self.node_timeout()
            )));
        }
        Ok(())
    }
}

impl Default for RedlockOptions {
    /// ttl 10 s, watchdog every ttl / 3, wait 5 s, backoff 50 ms to 250 ms, drift 0.01.
    fn default() -> Self {
        Self::new(
            LockOptions::builder()
                .retry_delay(Duration::from_millis(50), Duration::from_millis(250))
                .build()
                .expect("valid defaults"),
        )
    }
}

/// A lock over several independent Redis masters. Cheap to clone.
pub struct Redlock<C: ConnectionLike + Clone + Send + Sync + 'static> {
    nodes: Arc<[C]>,
    options: Arc<RedlockOptions>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Clone for Redlock<C> {
    fn clone(&self) -> Self {
        Self {
            nodes: Arc::clone(&self.nodes),
            options: Arc::clone(&self.options),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Redlock<C> {
    /// A Redlock over `nodes`, one connection per independent master (3 or 5 is usual).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] with no nodes, or options that leave no validity.
    pub fn new(nodes: Vec<C>, options: RedlockOptions) -> Result<Self> {
        if nodes.is_empty() {
            return Err(Error::InvalidOptions(
                "Redlock needs at least one node".into(),
            ));
        }
        options.validate()?;
        Ok(Self {
            nodes: nodes.into(),
            options: Arc::new(options),
        })
    }

    /// How many nodes must agree: a strict majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// How many nodes answer a `PING` within the node timeout (for readiness checks).
    pub async fn reachable_nodes(&self) -> usize {
        self.on_every_node(|mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await
        .iter()
        .filter(|a| matches!(a, Some(Ok(_))))
        .count()
    }

    /// Take the lock if a majority grants it now; never wait.
    ///
    /// # Errors
    /// [`Error::Held`] when the lock is held elsewhere; [`Error::NoQuorum`] when too many
    /// nodes are unreachable for a majority; [`Error::InvalidKey`].
    ///
    /// # Cancel safety
    /// A dropped attempt leaves keys that expire within one ttl.
    pub async fn try_acquire(&self, key: &str) -> Result<RedlockGuard<C>> {
        self.attempt(key).await?.ok_or_else(|| Error::Held {
            key: key.to_owned(),
        })
    }

    /// Take the lock, retrying until the options' `wait_timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::NoQuorum`] at once when a majority is unreachable;
    /// [`Error::InvalidKey`].
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str) -> Result<RedlockGuard<C>> {
        wait_for(&self.options.lock, key, || self.attempt(key)).await
    }

    async fn attempt(&self, key: &str) -> Result<Option<RedlockGuard<C>>> {
        let fence_key = fence_key(key)?;
        let options = &self.options;
        let ttl = options.lock.ttl();
        let token = new_token();
        // SAFETY(timing): the validity window starts before the first command of *this*
        // attempt is sent and gives up `drift` for clock drift and expiry rounding.
        let started = Instant::now();
        let valid_until = started + ttl - options.drift();
        let answers = self
            .on_every_node(|mut conn| {
                let (key, fence_key, token) = (key.to_owned(), fence_key.clone(), token.clone());
                async move {
                    ACQUIRE
                        .key(&key)
                        .key(&fence_key)
                        .arg(&token)
                        .arg(ttl.as_millis() as u64)
                        .invoke_async::<u64>(&mut conn)
                        .await
                }
            })
            .await;
        let granted: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(fence)) if *fence > 0 => Some(*fence),
                _ => None,
            })
            .collect();
        let failed = answers.iter().filter(|a| !matches!(a, Some(Ok(_)))).count();

        if granted.len() >= self.quorum() && Instant::now() < valid_until {
            let fence = *granted.iter().max().expect("a majority is not empty");
            let raised = self.raise_fence(key, &fence_key, &token, fence).await;
            if raised >= self.quorum() && Instant::now() < valid_until {
                return Ok(Some(self.guard(key, token, fence, started)));
            }
        }
        self.release_everywhere(key, &token).await;
        let reachable = self.nodes.len() - failed;
        if reachable < self.quorum() {
            return Err(Error::NoQuorum {
                key: key.to_owned(),
                reachable,
                needed: self.quorum(),
            });
        }
        Ok(None)
    }

    /// Raise every node's counter to at least `fence` (see "Fencing across the set").
    /// Returns on how many nodes it was done.
    async fn raise_fence(&self, key: &str, fence_key: &str, token: &str, fence: u64) -> usize {
        self.on_every_node(|mut conn| {
            let (key, fence_key, token) = (key.to_owned(), fence_key.to_owned(), token.to_owned());
            async move {
                RAISE_FENCE
                    .key(&key)
                    .key(&fence_key)
                    .arg(&token)
                    .arg(fence)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await
        .iter()
        .filter(|a| matches!(a, Some(Ok(1))))
        .count()
    }

    /// Delete the key on every node where it holds `token`; returns (deleted, unreachable).
    async fn release_everywhere(&self, key: &str, token: &str) -> (usize, usize) {
        let answers = self
            .on_every_node(|mut conn| {
                let (key, token) = (key.to_owned(), token.to_owned());
                async move {
                    RELEASE
                        .key(&key)
                        .arg(&token)
                        .invoke_async::<i64>(&mut conn)
                        .await
                }
            })
            .await;
        let deleted = answers.iter().filter(|a| matches!(a, Some(Ok(1)))).count();
        let unreachable = answers.iter().filter(|a| !matches!(a, Some(Ok(_)))).count();
        (deleted, unreachable)
    }

    /// Run `command` on every node at once, each bounded by the node timeout.
    /// `None` for a node that did not answer in time.
    async fn on_every_node<F, Fut, T>(&self, command: F) -> Vec<Option<redis::RedisResult<T>>>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let limit = self.options.node_timeout();
        join_all(self.nodes.iter().map(|conn| {
            let call = command(conn.clone());
            async move { timeout(limit, call).await.ok() }
        }))
        .await
    }

    fn guard(&self, key: &str, token: String, fence: u64, started: Instant) -> RedlockGuard<C> {
        let options = &self.options;
        let lease_ttl = options.lock.ttl() - options.drift();
        let watched = options.lock.renew_interval().is_some();
        let lease = Arc::new(Lease::new(started, lease_ttl, watched));
        let hold = Arc::new(RedHold {
            redlock: self.clone(),
            key: key.to_owned(),
            token,
            fence: AtomicU64::new(fence),
            lease,
            watchdog: std::sync::Mutex::new(None),
            released: AtomicBool::new(false),
        });
        if let Some(every) = options.lock.renew_interval() {
            let watchdog = tokio::spawn(renew_by_majority(Arc::downgrade(&hold), every));
            *hold.watchdog.lock().expect("not poisoned") = Some(watchdog);
        }
        RedlockGuard { hold }
    }
}

/// The shared state of one Redlock acquisition.
struct RedHold<C: ConnectionLike + Clone + Send + Sync + 'static> {
    /// The nodes and options it was taken with, for renewal, fence and release.
    redlock: Redlock<C>,
    key: String,
    token: String,
    fence: AtomicU64,
    lease: Arc<Lease>,
    /// Set right after the hold is made; aborted before release.
    watchdog: std::sync::Mutex<Option<JoinHandle<()>>>,
    released: AtomicBool,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedHold<C> {
    fn stop_watchdog(&self) {
        if let Some(watchdog) = self.watchdog.lock().expect("not poisoned").take() {
            watchdog.abort();
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for RedHold<C> {
    /// As for the single-node guard: stop renewing, release in a spawned task if a runtime
    /// is there, else let the lease run out.
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let redlock = self.redlock.clone();
        let (key, token) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        runtime.spawn(async move {
            redlock.release_everywhere(&key, &token).await;
        });
    }
}

/// The Redlock watchdog: renew on every node, keep the lock while a majority renews.
/// Holds a weak reference, so a dropped guard ends it at the next round.
async fn renew_by_majority<C: ConnectionLike + Clone + Send + Sync + 'static>(
    hold: std::sync::Weak<RedHold<C>>,
    every: Duration,
) {
    loop {
        // SAFETY(timing): as for the single-node watchdog, renewing every ttl / 3 leaves
        // two thirds of the validity for slow nodes and retries.
        sleep(every).await;
        loop {
            let Some(hold) = hold.upgrade() else { return };
            let until = hold.lease.until();
            let sent = Instant::now();
            if sent >= until {
                hold.lease.lose(LockLost::Unreachable);
                return;
            }
            let (redlock, quorum) = (&hold.redlock, hold.redlock.quorum());
            let ttl = redlock.options.lock.ttl();
            let answers = redlock
                .on_every_node(|mut conn| {
                    let (key, token) = (hold.key.clone(), hold.token.clone());
                    async move {
                        RENEW
                            .key(&key)
                            .arg(&token)
                            .arg(ttl.as_millis() as u64)
                            .invoke_async::<i64>(&mut conn)
                            .await
                    }
                })
                .await;
            let count = |want: i64| {
                answers
                    .iter()
                    .filter(|a| matches!(a, Some(Ok(v)) if *v == want))
                    .count()
            };
            let (renewed, gone, taken) = (count(1), count(0), count(-1));
            if renewed >= quorum {
                hold.lease.renewed(sent, ttl - redlock.options.drift());
                break;
            }
            if redlock.nodes.len() - gone - taken < quorum {
                hold.lease.lose(if taken > gone {
                    LockLost::Taken
                } else {
                    LockLost::Expired
                });
                return;
            }
            drop(hold);
            sleep(RETRY_AFTER_ERROR.min(until.saturating_duration_since(Instant::now()))).await;
        }
    }
}

/// Proof of holding a Redlock. Release it with [`release`](Self::release); dropping it
/// releases in a spawned task, as for [`LockGuard`](crate::LockGuard).
#[must_use = "the lock is released as soon as the guard is dropped; bind it and call `release().await`"]
pub struct RedlockGuard<C: ConnectionLike + Clone + Send + Sync + 'static> {
    hold: Arc<RedHold<C>>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedlockGuard<C> {
    /// The random token stored on the nodes.
    pub fn token(&self) -> &str {
        &self.hold.token
    }

    /// Resolves when a majority is lost (see [`LockGuard::lost`](crate::LockGuard::lost)).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        lease::wait_lost(Arc::clone(&self.hold.lease))
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> FencedGuard for RedlockGuard<C> {
    fn key(&self) -> &str {
        &self.hold.key
    }

    fn fence(&self) -> Fence {
        Fence(self.hold.fence.load(Ordering::Acquire))
    }

    fn is_held(&self) -> bool {
        self.hold.lease.is_held()
    }

    fn renewals(&self) -> u64 {
        self.hold.lease.renewals()
    }

    /// Advance the counter on every node where we hold the key, take the maximum, raise the
    /// others to it; needs a majority at each step.
    async fn advance_fence(&self, seen: Fence) -> Result<Fence> {
        let hold = &self.hold;
        let (redlock, quorum) = (&hold.redlock, hold.redlock.quorum());
        let fence_key = fence_key(&hold.key)?;
        let answers = redlock
            .on_every_node(|mut conn| {
                let (key, fence_key, token) =
                    (hold.key.clone(), fence_key.clone(), hold.token.clone());
                async move {
                    ADVANCE_FENCE
                        .key(&key)
                        .key(&fence_key)
                        .arg(&token)
                        .arg(seen.get())
                        .invoke_async::<u64>(&mut conn)
                        .await
                }
            })
            .await;
        let fences: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(f)) if *f > 0 => Some(*f),
                _ => None,
            })
            .collect();
        let not_held = || Error::NotHeld {
            key: hold.key.clone(),
        };
        if fences.len() < quorum {
            return Err(not_held());
        }
        let fence = *fences.iter().max().expect("a majority is not empty");
        if redlock
            .raise_fence(&hold.key, &fence_key, &hold.token, fence)
            .await
            < quorum
        {
            return Err(not_held());
        }
        hold.fence.fetch_max(fence, Ordering::AcqRel);
        Ok(Fence(fence))
    }

    /// Release on every node. `Ok(true)` when a majority still held our token.
    ///
    /// # Errors
    /// [`Error::NoQuorum`] when too many nodes were unreachable to know.
    async fn release(self) -> Result<bool> {
        let hold = &self.hold;
        let (redlock, quorum) = (&hold.redlock, hold.redlock.quorum());
        hold.stop_watchdog();
        let (deleted, unreachable) = redlock.release_everywhere(&hold.key, &hold.token).await;
        hold.released.store(true, Ordering::Release);
        if deleted >= quorum {
            return Ok(true);
        }
        let reachable = redlock.nodes.len() - unreachable;
        if reachable < quorum {
            return Err(Error::NoQuorum {
                key: hold.key.clone(),
                reachable,
                needed: quorum,
            });
        }
        Ok(false)
    }
}
