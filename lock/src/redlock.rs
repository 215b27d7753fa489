//! Redlock: one lock over N independent Redis masters, held while a majority holds it.
//!
//! [`Redlock`] is a [`Backend`]: `Locker::new(Redlock::new(nodes)?, options)?` gives the same
//! [`Locker`](crate::Locker) and [`LockGuard`](crate::LockGuard) as one Redis, with the same
//! watchdog, lost signal, drop fallback and reentrancy.
//!
//! # The algorithm
//! 1. With a new random token, run the acquire script (`SET NX PX` + fence) on every node
//!    at once, each bounded by a short per-node timeout.
//! 2. The attempt wins if a majority (`N / 2 + 1`) said yes **and** time is left of the
//!    validity window, counted from the start of this attempt (not of the first one):
//!    `validity = ttl - elapsed - drift`, `drift = ttl * drift_factor + 2 ms` (the 2 ms, for
//!    Redis's millisecond expiry, as in the algorithm's description and node-redlock).
//! 3. Otherwise release wherever it was set, and let the caller retry until its deadline.
//! 4. Renewal (the watchdog) and release run on every node; renewal keeps the lock only
//!    while a majority renews. When a majority cannot be reached before the validity ends,
//!    or a majority reports the key gone or taken, the holder is told (`lost`).
//!
//! # Fencing across the set
//! Each node keeps its own counter. The fence of an acquisition is the **maximum** of the
//! counters its majority returned, `F`; then, in a second round, every node of the majority
//! has its counter raised to at least `F` (token-checked, so only while we hold the key
//! there). A later acquisition needs a majority too, and two majorities share at least one
//! node. On that node the later increment runs after our key is gone, so after our raise to
//! `F`: it returns more than `F`, and so does the later maximum. Without the second round,
//! the later majority could miss the node that gave us `F` and hand out a smaller fence.
//!
//! # Defaults, compared
//! | | distlock Redlock | redsync (Go) | node-redlock v5 |
//! |---|---|---|---|
//! | drift factor | 0.01 (+2 ms) | 0.01 (`validity = expiry - elapsed - expiry * driftFactor`, no constant) | 0.01 (+2 ms) |
//! | ttl | 10 s ([`LockOptions`]) | 8 s | per call |
//! | retry delay | [`Redlock::RETRY_DELAY`]: 50 ms doubling to 250 ms, each sleep drawn from the upper half | uniform 50-250 ms | 200 ms + up to 100 ms jitter |
//! | attempts | until `wait_timeout` (5 s) | 32 tries | 10 retries |
//! | renewal | watchdog every ttl / 3 | manual `Extend` | auto-extension 500 ms before expiry (`using`) |
//!
//! The retry delay should start higher than the single-node lock's: a failed attempt leaves
//! partial holds to clean up, and waiters that retry in lock step split the votes again.
//!
//! # Limits
//! Redlock's safety rests on bounded pauses, bounded network delay and bounded clock drift,
//! and on nodes that keep their keys; the crate's README (Redlock's limits) says what breaks
//! it and what the fence still keeps. Run lock nodes with persistence and
//! `maxmemory-policy noeviction`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::ConnectionLike;
use tokio::time::{Instant, timeout};

use crate::backend::{Attempt, Backend, LockState, Renewal, Unlock};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::options::LockOptions;
use crate::redis::scripts::{
    ACQUIRE, ADVANCE_FENCE, FORCE_UNLOCK, INSPECT, RAISE_FENCE, RELEASE, RENEW, is_refusal,
};
use crate::redis::{check_versions, fence_key, parse_fence, release_channel};
use crate::token::Token;

/// A lock over several independent Redis masters: a [`Backend`]. Cheap to clone.
pub struct Redlock<C: ConnectionLike + Clone + Send + Sync + 'static> {
    nodes: Arc<[C]>,
    drift_factor: f64,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Clone for Redlock<C> {
    fn clone(&self) -> Self {
        Self {
            nodes: Arc::clone(&self.nodes),
            drift_factor: self.drift_factor,
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Redlock<C> {
    /// The fraction of the ttl allowed for clock drift between the nodes and us.
    pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
    /// The backoff redsync uses, and a good `retry_delay` for Redlock's options.
    pub const RETRY_DELAY: (Duration, Duration) =
        (Duration::from_millis(50), Duration::from_millis(250));
    /// Redis expires keys with millisecond precision; one more for rounding.
    const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

    /// A Redlock over `nodes`, one connection per independent master (3 or 5 is usual).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] with no nodes.
    pub fn new(nodes: Vec<C>) -> Result<Self> {
        if nodes.is_empty() {
            return Err(Error::InvalidOptions(
                "Redlock needs at least one node".into(),
            ));
        }
        Ok(Self {
            nodes: nodes.into(),
            drift_factor: Self::DEFAULT_DRIFT_FACTOR,
        })
    }

    /// Set the drift factor.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] unless `0 <= factor < 0.5`.
    pub fn with_drift_factor(mut self, factor: f64) -> Result<Self> {
        if !(0.0..0.5).contains(&factor) {
            return Err(Error::InvalidOptions(format!(
                "drift factor must be in [0, 0.5), got {factor}"
            )));
        }
        self.drift_factor = factor;
        Ok(self)
    }

    /// How many nodes must agree: a strict majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// How many nodes there are (never zero: [`new`](Self::new) refuses an empty set).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `ttl * drift_factor + 2 ms`: what a holder gives up of each lease.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Self::EXPIRY_PRECISION
    }

    /// How long one node may take to answer before it counts as a failure: small next to
    /// the ttl, so a dead node costs little of the validity window.
    pub fn node_timeout(ttl: Duration) -> Duration {
        (ttl / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
    }

    /// How many nodes answer a `PING` within `within` (for readiness checks).
    pub async fn reachable_nodes(&self, within: Duration) -> usize {
        self.on_every_node(within, |mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await
        .iter()
        .filter(|a| matches!(a, Some(Ok(_))))
        .count()
    }

    /// Raise every node's counter to at least `fence` (see "Fencing across the set").
    /// Returns on how many nodes it was done.
    async fn raise_fence(&self, key: &str, token: &Token, fence: Fence, limit: Duration) -> usize {
        let Ok(fence_key) = fence_key(key) else {
            return 0;
        };
        self.on_every_node(limit, |mut conn| {
            let (key, fence_key, token) = (key.to_owned(), fence_key.clone(), token.clone());
            async move {
                RAISE_FENCE
                    .key(&key)
                    .key(&fence_key)
                    .arg(token.as_str())
                    .arg(fence.get())
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        })
        .await
        .iter()
        .filter(|a| matches!(a, Some(Ok(1))))
        .count()
    }

    /// Run `command` on every node at once, each bounded by `limit`.
    /// `None` for a node that did not answer in time.
    async fn on_every_node<F, Fut, T>(
        &self,
        limit: Duration,
        command: F,
    ) -> Vec<Option<redis::RedisResult<T>>>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        join_all(self.nodes.iter().map(|conn| {
            let call = command(conn.clone());
            async move { timeout(limit, call).await.ok() }
        }))
        .await
    }

    fn no_quorum(&self, key: &str, reachable: usize) -> Error {
        Error::NoQuorum {
            key: key.to_owned(),
            reachable,
            needed: self.quorum(),
        }
    }
}

/// The masters that answered a script's refusal (a fence counter that no fence can follow),
/// and the first of their answers.
#[derive(Default)]
struct Refusals {
    count: usize,
    first: Option<redis::RedisError>,
}

impl Refusals {
    fn add(&mut self, error: redis::RedisError) {
        self.count += 1;
        self.first.get_or_insert(error);
    }

    /// The refusal, when it decided the outcome: fewer than `quorum` masters `agreed` (granted
    /// the lock, or answered a fence), and had those that refused agreed, a majority would
    /// have.
    fn decided(self, agreed: usize, quorum: usize) -> Option<Error> {
        let first = self.first?;
        (agreed < quorum && agreed + self.count >= quorum).then(|| first.into())
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Backend for Redlock<C> {
    fn check_key(&self, key: &str) -> Result<()> {
        crate::redis::check_key(key)
    }

    /// The ttl must leave validity after the drift and two rounds (acquire, then the fence
    /// raise) of node timeouts, and renewals must land before the lease, net of drift, ends.
    fn check_options(&self, options: &LockOptions) -> Result<()> {
        if options.wait_for_replicas().is_some() {
            return Err(Error::InvalidOptions(
                "Redlock waits for a majority of masters, not for replicas (wait_for_replicas)"
                    .into(),
            ));
        }
        let ttl = options.ttl();
        let (drift, node_timeout) = (self.drift(ttl), Self::node_timeout(ttl));
        if drift + node_timeout * 2 >= ttl {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} leaves no validity after drift {drift:?} and two rounds of node timeout {node_timeout:?}"
            )));
        }
        if let Some(every) = options.renew_interval()
            && every + node_timeout >= ttl - drift
        {
            return Err(Error::InvalidOptions(format!(
                "renew interval {every:?} plus a node timeout of {node_timeout:?} must be below the lease net of drift, {:?}",
                ttl - drift
            )));
        }
        Ok(())
    }

    fn lease(&self, ttl: Duration) -> Duration {
        ttl - self.drift(ttl)
    }

    /// Every master that answers within a second runs Redis 7.0 or later (one that does
    /// not answer now is not checked).
    async fn check_server(&self) -> Result<()> {
        let answers = self
            .on_every_node(Duration::from_secs(1), |mut conn| async move {
                redis::cmd("INFO")
                    .arg("server")
                    .query_async::<redis::Value>(&mut conn)
                    .await
            })
            .await;
        for (i, answer) in answers.iter().enumerate() {
            if let Some(Ok(info)) = answer {
                check_versions(info, &format!("Redlock master {i}"))?;
            }
        }
        Ok(())
    }

    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let fence_key = fence_key(key)?;
        // TIMING: the validity window starts before the first command of *this* attempt is
        // sent and gives up `drift` for clock drift and expiry rounding.
        let started = Instant::now();
        let valid_until = started + self.lease(ttl);
        let answers = self
            .on_every_node(Self::node_timeout(ttl), |mut conn| {
                let (key, fence_key, token) = (key.to_owned(), fence_key.clone(), token.clone());
                async move {
                    ACQUIRE
                        .key(&key)
                        .key(&fence_key)
                        .arg(token.as_str())
                        .arg(ttl.as_millis() as u64)
                        .invoke_async::<(i64, String)>(&mut conn)
                        .await
                }
            })
            .await;
        let mut granted = Vec::new();
        let mut expires_in: Option<Duration> = None;
        let mut unreachable = 0;
        let mut refusals = Refusals::default();
        for answer in answers {
            match answer {
                Some(Ok((1, fence))) => granted.push(parse_fence(&fence)?),
                Some(Ok((_, pttl))) => {
                    if let Ok(ms) = pttl.parse::<u64>() {
                        let left = Duration::from_millis(ms);
                        expires_in = Some(expires_in.map_or(left, |e| e.min(left)));
                    }
                }
                Some(Err(error)) if is_refusal(&error) => refusals.add(error),
                _ => unreachable += 1,
            }
        }
        if granted.len() >= self.quorum() && Instant::now() < valid_until {
            let fence = *granted.iter().max().expect("a majority is not empty");
            let raised = self
                .raise_fence(key, token, fence, Self::node_timeout(ttl))
                .await;
            if raised >= self.quorum() && Instant::now() < valid_until {
                return Ok(Attempt::Acquired(fence));
            }
        }
        self.unlock(key, token).await.ok();
        if let Some(error) = refusals.decided(granted.len(), self.quorum()) {
            return Err(error);
        }
        // Otherwise too few answered (`NoQuorum`), or another owner holds it.
        let reachable = self.nodes.len() - unreachable;
        if reachable < self.quorum() {
            return Err(self.no_quorum(key, reachable));
        }
        Ok(Attempt::Held { expires_in })
    }

    /// Renewed while a majority renews; lost once a majority reports the key gone or taken.
    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        let answers = self
            .on_every_node(Self::node_timeout(ttl), |mut conn| {
                let (key, token) = (key.to_owned(), token.clone());
                async move {
                    RENEW
                        .key(&key)
                        .arg(token.as_str())
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
        let unreachable = self.nodes.len() - renewed - gone - taken;
        if renewed >= self.quorum() {
            Ok(Renewal::Renewed)
        } else if self.nodes.len() - gone - taken < self.quorum() {
            Ok(if taken > gone {
                Renewal::Taken
            } else {
                Renewal::Gone
            })
        } else {
            Err(self.no_quorum(key, self.nodes.len() - unreachable))
        }
    }

    /// Release on every node: `Released` when a majority still held our token.
    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        let channel = release_channel(key)?;
        // A generous limit: a release that gives up early leaves keys to expire.
        let answers = self
            .on_every_node(Duration::from_secs(1), |mut conn| {
                let (key, token, channel) = (key.to_owned(), token.clone(), channel.clone());
                async move {
                    RELEASE
                        .key(&key)
                        .arg(token.as_str())
                        .arg(&channel)
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
        let (released, gone, taken) = (count(1), count(0), count(-1));
        let reachable = released + gone + taken;
        if released >= self.quorum() {
            Ok(Unlock::Released)
        } else if taken >= self.quorum() {
            Ok(Unlock::Taken)
        } else if reachable < self.quorum() {
            Err(self.no_quorum(key, reachable))
        } else {
            Ok(Unlock::Gone)
        }
    }

    /// Advance the counter on every node where we hold the key, take the maximum, raise the
    /// others to it; needs a majority at each step.
    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        let fence_key = fence_key(key)?;
        let limit = Duration::from_secs(1);
        let answers = self
            .on_every_node(limit, |mut conn| {
                let (key, fence_key, token) = (key.to_owned(), fence_key.clone(), token.clone());
                async move {
                    ADVANCE_FENCE
                        .key(&key)
                        .key(&fence_key)
                        .arg(token.as_str())
                        .arg(seen.get())
                        .invoke_async::<Option<String>>(&mut conn)
                        .await
                }
            })
            .await;
        let (mut fences, mut reachable) = (Vec::new(), 0);
        let mut refusals = Refusals::default();
        for answer in answers {
            match answer {
                Some(Ok(fence)) => {
                    reachable += 1;
                    if let Some(fence) = fence {
                        fences.push(parse_fence(&fence)?);
                    }
                }
                // Reachable, but no fence.
                Some(Err(error)) if is_refusal(&error) => {
                    reachable += 1;
                    refusals.add(error);
                }
                _ => {}
            }
        }
        if let Some(error) = refusals.decided(fences.len(), self.quorum()) {
            return Err(error);
        }
        if reachable < self.quorum() {
            // Too few answered to know whether we still hold it: not the same as stale.
            return Err(self.no_quorum(key, reachable));
        }
        if fences.len() < self.quorum() {
            return Ok(None);
        }
        let fence = *fences.iter().max().expect("a majority is not empty");
        if self.raise_fence(key, token, fence, limit).await < self.quorum() {
            return Ok(None);
        }
        Ok(Some(fence))
    }

    /// Held when a majority of the masters hold a lock for the same token; the lease left
    /// is the shortest among them, the fence the largest counter any master has.
    async fn inspect(&self, key: &str) -> Result<LockState> {
        let fence_key = fence_key(key)?;
        let answers = self
            .on_every_node(Duration::from_secs(1), |mut conn| {
                let (key, fence_key) = (key.to_owned(), fence_key.clone());
                async move {
                    let (pttl, fence): (i64, String) = INSPECT
                        .key(&key)
                        .key(&fence_key)
                        .invoke_async(&mut conn)
                        .await?;
                    let holder: Option<String> =
                        redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                    Ok((pttl, fence, holder))
                }
            })
            .await;
        let answered: Vec<_> = answers.into_iter().flatten().flatten().collect();
        if answered.len() < self.quorum() {
            return Err(self.no_quorum(key, answered.len()));
        }
        let mut fence = None;
        for (_, counter, _) in &answered {
            if !counter.is_empty() {
                fence = fence.max(Some(parse_fence(counter)?));
            }
        }
        let majority_holder = answered
            .iter()
            .filter_map(|(_, _, h)| h.as_ref())
            .find(|h| {
                answered
                    .iter()
                    .filter(|(_, _, other)| other.as_ref() == Some(*h))
                    .count()
                    >= self.quorum()
            });
        let expires_in = majority_holder.and_then(|holder| {
            answered
                .iter()
                .filter(|(_, _, h)| h.as_ref() == Some(holder))
                .filter_map(|(pttl, _, _)| u64::try_from(*pttl).ok())
                .min()
                .map(Duration::from_millis)
        });
        Ok(LockState {
            held: majority_holder.is_some(),
            expires_in,
            fence,
            waiting: None,
        })
    }

    /// Deleted on every master that answers; `true` if any master had it.
    async fn force_unlock(&self, key: &str) -> Result<bool> {
        let channel = release_channel(key)?;
        let answers = self
            .on_every_node(Duration::from_secs(1), |mut conn| {
                let (key, channel) = (key.to_owned(), channel.clone());
                async move {
                    FORCE_UNLOCK
                        .key(&key)
                        .arg(&channel)
                        .invoke_async::<i64>(&mut conn)
                        .await
                }
            })
            .await;
        let reachable = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        if reachable < self.quorum() {
            return Err(self.no_quorum(key, reachable));
        }
        Ok(answers.iter().any(|a| matches!(a, Some(Ok(1)))))
    }
}
