//! Taking locks: [`Locker`] and its public calls here; `attempt`, one atomic attempt (or one
//! place in a backend's line) made in a task of its own and turned into a hold; `wait`, the
//! deadline-bounded wait built on them.

mod attempt;
mod wait;

use std::sync::Arc;

use crate::backend::{Backend, LockState};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::guard::{Hold, LockGuard, ReleaseOutcome};
use crate::lease::LockLost;
use crate::options::LockOptions;
use crate::signals::ReleaseSignals;
use crate::waiting::Waiting;
use crate::watchdog::Watchdogs;
use attempt::Attempted;

/// Takes locks on one [`Backend`]: a Redis connection (also behind Sentinel, or a Redis
/// Cluster), a [`Redlock`](crate::Redlock) set of masters, a
/// [`PgLockTable`](crate::PgLockTable), a [`ZkLock`](crate::ZkLock) or an
/// [`EtcdLock`](crate::EtcdLock).
///
/// Cheap to clone (the backend and options are shared). On Redis, use a multiplexed
/// connection such as [`redis::aio::ConnectionManager`]: concurrent lock calls are then
/// pipelined on one socket, and the manager reconnects after Redis restarts.
pub struct Locker<B: Backend> {
    pub(crate) backend: Arc<B>,
    options: Arc<LockOptions>,
    /// With [`ReleaseSignals`]: wake-ups on release, and a fair turn per key in this process.
    waiting: Option<Arc<Waiting>>,
    /// The watchdogs of its holds, spawned only for a hold that lasts until shortly before
    /// its first renewal.
    watchdogs: Arc<Watchdogs<B>>,
}

impl<B: Backend> Clone for Locker<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
            options: Arc::clone(&self.options),
            waiting: self.waiting.clone(),
            watchdogs: Arc::clone(&self.watchdogs),
        }
    }
}

/// What [`Locker::run_locked`] did with the work it was given: one of two ends, and no
/// other (not `#[non_exhaustive]`: a `match` on it needs no catch-all arm).
#[derive(Debug)]
pub enum Ran<T> {
    /// The work finished while the lock was held; then the lock was given back, with this
    /// outcome (an error when the backend could not be reached for the release: the lease
    /// then frees the lock within one ttl).
    Finished {
        /// What the work returned.
        output: T,
        /// How the lock ended.
        release: Result<ReleaseOutcome>,
    },
    /// The lock was lost while the work ran, for this reason, and the work was dropped at
    /// its next `.await`: whatever it had written without a fence may overlap another
    /// holder's work.
    Lost(LockLost),
}

impl<B: Backend> Locker<B> {
    /// A locker on `backend` with `options`. Nothing is sent to the backend; see
    /// [`connect`](Self::connect) to check the server first.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the backend cannot work with the options (Redlock
    /// needs the ttl to leave room for clock drift and two rounds of node timeouts).
    pub fn new(backend: B, options: LockOptions) -> Result<Self> {
        backend.check_options(&options)?;
        Ok(Self {
            backend: Arc::new(backend),
            options: Arc::new(options),
            waiting: None,
            watchdogs: Arc::new(Watchdogs::new()),
        })
    }

    /// As [`new`](Self::new), after checking that the server can hold these locks (the
    /// single-Redis backend needs Redis 7.0 or later; a Redlock checks every master that
    /// answers).
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::UnsupportedServer`] for a server too old, naming its
    /// version; [`Error::Backend`] when it cannot be reached.
    pub async fn connect(backend: B, options: LockOptions) -> Result<Self> {
        let locker = Self::new(backend, options)?;
        locker.backend.check_server().await?;
        Ok(locker)
    }

    /// Wait for releases instead of polling: [`acquire`](Self::acquire) then sleeps until the
    /// holder's release is announced (or a backstop of at most the options' largest retry
    /// delay), and waiters in this process contend one at a time, first come, first served.
    ///
    /// Only a backend that publishes releases can wake waiters of other processes: the
    /// single-Redis backend on a standalone Redis. With others, waiting still works, paced by
    /// the backstop, and local handoffs still wake at once.
    #[must_use]
    pub fn with_release_signals(mut self, signals: ReleaseSignals) -> Self {
        self.waiting = Some(Arc::new(Waiting::new(signals)));
        self
    }

    /// The options this locker uses.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend the locks live in.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Take the lock if it is free; never wait.
    ///
    /// One attempt: on Redis, one round trip (`SET key token NX PX ttl` and the fence, in one
    /// script); on Redlock, one round to every master and a second to spread the fence; on
    /// PostgreSQL, one statement. Every call is a new owner, so a second `try_acquire` of a
    /// key held by the first fails.
    ///
    /// Works outside a tokio runtime too (where the backend's connection does): the guard
    /// then has no watchdog, and its lease frees the lock within one ttl.
    ///
    /// # Errors
    /// [`Error::Held`] when another owner holds the lock; [`Error::InvalidKey`] for an empty
    /// key; [`Error::Backend`] when it cannot be reached, or refuses (a fence counter that no
    /// fence can follow; on Redlock, the first master's refusal, when the masters that refused
    /// would have made a majority with those that granted); [`Error::NoQuorum`] from Redlock
    /// when too few masters answer; [`Error::Aborted`] when the attempt's task ended
    /// without an answer (a panic in the backend).
    ///
    /// # Cancel safety
    /// The attempt runs in a task of its own. If this future is dropped, the task finishes
    /// the attempt and gives back what it took, also when it had already handed it over
    /// and nobody claimed it (outside a tokio runtime nothing can be spawned, and the
    /// attempt is simply made here).
    pub async fn try_acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.try_acquire_with(key, &self.options).await
    }

    /// [`try_acquire`](Self::try_acquire) with other options for this one call (another
    /// ttl, say), sharing this locker's backend.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire); [`Error::InvalidOptions`] when the backend
    /// cannot work with these options.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard<B>> {
        self.check_call(options)?;
        let hold = self.try_acquire_hold(key, options).await?;
        Ok(LockGuard::new(Arc::new(hold), None))
    }

    /// Take the lock, waiting for it until the options' `wait_timeout`.
    ///
    /// Without release signals, retries with jittered exponential backoff between
    /// `retry_delay`'s bounds; with them, waits for the release (see
    /// [`with_release_signals`](Self::with_release_signals)); on a backend that keeps a line
    /// of waiters (ZooKeeper, etcd), waits in it. No attempt starts after the deadline, and
    /// an attempt still in flight at the deadline is abandoned (what it took, if anything,
    /// is given back in the background). A zero `wait_timeout` makes exactly one attempt.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes; [`Error::InvalidKey`] for an empty key;
    /// [`Error::Backend`] at once when it cannot be reached or refuses, as for
    /// [`try_acquire`](Self::try_acquire) (waiting would not help); [`Error::NoQuorum`] from
    /// Redlock when too few masters answer; [`Error::Aborted`] as
    /// for [`try_acquire`](Self::try_acquire); [`Error::Unsupported`] for a wait outside a
    /// tokio runtime (it needs its timers).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.wait_for(key, &self.options, None).await
    }

    /// [`acquire`](Self::acquire) with other options for this one call (another ttl or
    /// wait, as Redisson's `tryLock(waitTime, leaseTime)`), sharing this locker's backend
    /// and release signals.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`Error::InvalidOptions`] when the backend cannot work
    /// with these options.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard<B>> {
        self.check_call(options)?;
        self.wait_for(key, options, None).await
    }

    /// Take the lock (as [`acquire`](Self::acquire)), run `work` under it with the fence,
    /// and give the lock back; the work is dropped at its next `.await` if the lock is lost
    /// first ([`LockGuard::lost`]).
    ///
    /// Dropping the work when the lock is lost stops it from going on as if it still held
    /// the lock; it cannot undo what the work already did. Send the fence with every write
    /// that matters, so that the store refuses a holder whose lease ran out.
    ///
    /// ```no_run
    /// # async fn run(locker: distlock::Locker<redis::aio::ConnectionManager>, pool: sqlx::PgPool) -> anyhow::Result<()> {
    /// use distlock::Ran;
    /// let ran = locker
    ///     .run_locked("lock_sale_1", |fence| async move {
    ///         // The row refuses a write under a fence below the one it stored.
    ///         sqlx::query("UPDATE products SET stock = stock - 1, fence = $1 WHERE id = 1 AND fence <= $1")
    ///             .bind(fence.as_i64())
    ///             .execute(&pool)
    ///             .await
    ///     })
    ///     .await?;
    /// match ran {
    ///     Ran::Finished { output, release } => {
    ///         let written = output?.rows_affected() == 1;
    ///         println!("written: {written}, lock still ours at the end: {}", release?.was_held());
    ///     }
    ///     Ran::Lost(why) => println!("lost before the work finished: {why}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), when the lock could not be taken (the work did not
    /// run). Once the work ran, what happened is in the [`Ran`].
    ///
    /// # Cancel safety
    /// If dropped, the work is dropped and the guard's drop fallback releases the lock.
    pub async fn run_locked<F, Fut, T>(&self, key: &str, work: F) -> Result<Ran<T>>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(key).await?;
        let work = work(guard.fence());
        tokio::select! {
            biased;
            why = guard.lost() => {
                if let Err(error) = guard.release().await {
                    tracing::debug!(%key, %error, "could not release a lost lock");
                }
                Ok(Ran::Lost(why))
            }
            output = work => Ok(Ran::Finished {
                output,
                release: guard.release().await,
            }),
        }
    }

    /// What the backend knows about `key` now, for operators and dashboards: whether it is
    /// held, the lease left, the last fence handed out (reads only; nothing is taken).
    ///
    /// # Errors
    /// [`Error::InvalidKey`]; [`Error::Backend`] when it cannot
    /// be reached; [`Error::Unsupported`] from a backend that cannot tell.
    pub async fn inspect(&self, key: &str) -> Result<LockState> {
        self.backend.check_key(key)?;
        self.backend.inspect(key).await
    }

    /// Delete the lock on `key` whoever holds it, and wake its waiters; `true` if there was
    /// one.
    ///
    /// **Dangerous**: the holder is not asked and may still be working, believing it holds
    /// the lock until its watchdog's next renewal finds it gone. Two holders may then work
    /// at once; only fenced writes stay safe. For an operator clearing a lock whose holder
    /// is known to be dead, when waiting out its lease is not an option.
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect).
    pub async fn force_unlock(&self, key: &str) -> Result<bool> {
        self.backend.check_key(key)?;
        let unlocked = self.backend.force_unlock(key).await?;
        if unlocked {
            tracing::warn!(%key, "lock forced open");
        }
        Ok(unlocked)
    }

    /// Options for one call, checked against the backend as the locker's own were.
    pub(crate) fn check_call(&self, options: &LockOptions) -> Result<()> {
        if options != &*self.options {
            self.backend.check_options(options)?;
        }
        Ok(())
    }

    pub(crate) async fn try_acquire_hold(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<Hold<B>> {
        self.backend.check_key(key)?;
        let local = self.waiting.as_ref().map(|w| w.local_key(key));
        match self.attempt(key, options, local).await? {
            Attempted::Took(hold) => Ok(hold),
            Attempted::Held { .. } => Err(Error::Held {
                key: key.to_owned(),
            }),
        }
    }
}
