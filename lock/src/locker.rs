//! Taking locks: one atomic attempt, and the bounded wait built on it.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

use crate::backend::{Attempt, Backend, LockState};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::guard::{Hold, LockGuard, OwnerTable, ReleaseOutcome, release_in_background};
use crate::lease::{Lease, LockLost, Watchdog};
use crate::options::LockOptions;
use crate::redis::release_channel;
use crate::retry::{Backoff, deadline_after};
use crate::signals::ReleaseSignals;
use crate::token::Token;
use crate::waiting::{LocalKey, Waiting};

/// Takes locks on one [`Backend`]: a Redis connection, a [`Redlock`](crate::Redlock) set of
/// masters, or a [`PgLockTable`](crate::PgLockTable).
///
/// Cheap to clone (the backend and options are shared). On Redis, use a multiplexed
/// connection such as [`redis::aio::ConnectionManager`]: concurrent lock calls are then
/// pipelined on one socket, and the manager reconnects after Redis restarts.
pub struct Locker<B: Backend> {
    pub(crate) backend: Arc<B>,
    options: Arc<LockOptions>,
    /// With [`ReleaseSignals`]: wake-ups on release, and a fair turn per key in this process.
    waiting: Option<Arc<Waiting>>,
}

impl<B: Backend> Clone for Locker<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
            options: Arc::clone(&self.options),
            waiting: self.waiting.clone(),
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
    /// key; [`Error::Backend`] when it cannot be reached;
    /// [`Error::NoQuorum`] from Redlock; [`Error::Aborted`] when the attempt's task ended
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
    /// [`Error::Backend`] at once when it cannot be reached
    /// (waiting would not help); [`Error::NoQuorum`] from Redlock; [`Error::Aborted`] as
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
            Ok(hold) => Ok(hold),
            Err(_expires_in) => Err(Error::Held {
                key: key.to_owned(),
            }),
        }
    }

    /// Wait for `key` until the deadline of `options`. With an `owner`, a key it holds
    /// already is re-entered instead, also while this call waits (for a turn, between
    /// attempts, in the backend's line), and a new acquisition is recorded in its table.
    pub(crate) async fn wait_for(
        &self,
        key: &str,
        options: &LockOptions,
        owner: Option<&Arc<OwnerTable<B>>>,
    ) -> Result<LockGuard<B>> {
        self.backend.check_key(key)?;
        let reenter = || owner.and_then(|table| table.reenter(key));
        let enter = |hold: Hold<B>| match owner {
            Some(table) => table.enter(hold),
            None => LockGuard::new(Arc::new(hold), None),
        };
        if let Some(guard) = reenter() {
            return Ok(guard);
        }
        let started = Instant::now();
        let wait = options.wait_timeout();
        let timed_out = || Error::Timeout {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        let local = self.waiting.as_ref().map(|w| (w, w.local_key(key)));
        // `wait_timeout(0)` means "try once": one attempt, with no turn to wait for and no
        // subscription to make first.
        if wait.is_zero() {
            let local = local.as_ref().map(|(_, l)| Arc::clone(l));
            return match self.attempt(key, options, local).await? {
                Ok(hold) => Ok(enter(hold)),
                Err(_expires_in) => Err(timed_out()),
            };
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Unsupported(
                "waiting for a lock outside a tokio runtime",
            ));
        }
        // `None`: a wait too long to represent, which never ends.
        let deadline = deadline_after(started, wait);
        // What is left of the wait; `None` while it is endless.
        let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // Resolves when the owner gains an acquisition (of any key: the loop then checks).
        let entered = || owner.map(|table| table.entered.notified());

        if self.backend.waits_in_line() {
            return self
                .wait_in_line(key, options, &reenter, &enter, entered, left())
                .await
                .ok_or_else(timed_out)?;
        }

        let (min, max) = options.retry_delay();
        let mut backoff = Backoff::new(min, max);
        // Our turn to contend among this process's waiters for the key (release signals).
        // One place in the queue for the turn, kept while an owner's wake-up is checked.
        let mut turn = pin!(
            local
                .as_ref()
                .map(|(_, local)| until_or(left(), local.turn()))
        );
        let _turn = match turn.as_mut().as_pin_mut() {
            Some(mut turn) => loop {
                let mut gained = pin!(entered());
                enable(gained.as_mut());
                if let Some(guard) = reenter() {
                    return Ok(guard);
                }
                tokio::select! {
                    turn = &mut turn => break Some(turn.ok_or_else(timed_out)?),
                    () = wake(gained), if owner.is_some() => {}
                }
            },
            None => None,
        };
        let channel = release_channel(key).ok();
        // Whether an attempt found the key held by another owner.
        let mut contended = false;
        loop {
            let mut gained = pin!(entered());
            enable(gained.as_mut());
            if let Some(guard) = reenter() {
                return Ok(guard);
            }
            let watch = match (&local, &channel) {
                (Some((waiting, _)), Some(channel)) => {
                    match until_or(left(), waiting.signals().watch(channel)).await {
                        Some(Ok(watch)) => Some(watch),
                        Some(Err(error)) => {
                            tracing::debug!(%error, "release signals unavailable; polling");
                            None
                        }
                        None => return Err(timed_out()),
                    }
                }
                _ => None,
            };
            // Registered before the attempt, so a release right after it still wakes us.
            let mut remote = pin!(watch.as_ref().map(|watch| watch.notified()));
            if let Some(remote) = remote.as_mut().as_pin_mut() {
                remote.enable();
            }
            let mut nearby = pin!(local.as_ref().map(|(_, local)| local.released()));
            if let Some(nearby) = nearby.as_mut().as_pin_mut() {
                nearby.enable();
            }
            // No attempt starts at or after the deadline.
            if left().is_some_and(|left| left.is_zero()) {
                return Err(timed_out());
            }
            let attempt = self.attempt(key, options, local.as_ref().map(|(_, l)| Arc::clone(l)));
            let outcome = until_or(left(), attempt).await.ok_or_else(timed_out)??;
            let expires_in = match outcome {
                Ok(mut hold) => {
                    hold.contended = contended;
                    return Ok(enter(hold));
                }
                Err(expires_in) => expires_in,
            };
            contended = true;
            if left().is_some_and(|left| left.is_zero()) {
                return Err(timed_out());
            }
            // TIMING: with signals the pause is only a backstop for a lost message, and a
            // lock whose holder vanished frees itself when its lease runs out, so the pause
            // never outlasts that lease.
            let pause = if local.is_some() {
                expires_in.map_or(max, |e| e.min(max))
            } else {
                backoff.next_pause()
            };
            let pause = left().map_or(pause, |left| pause.min(left));
            tokio::select! {
                () = sleep(pause) => {}
                () = async { remote.as_mut().as_pin_mut().unwrap().await }, if remote.is_some() => {}
                () = async { nearby.as_mut().as_pin_mut().unwrap().await }, if nearby.is_some() => {}
                () = wake(gained), if owner.is_some() => {}
            }
        }
    }

    /// Wait in the backend's own line (ZooKeeper, etcd) until the deadline; `None` at the
    /// deadline. An owner that gains the key meanwhile re-enters it, and our place in the
    /// line is given up.
    async fn wait_in_line<'t>(
        &self,
        key: &str,
        options: &LockOptions,
        reenter: &impl Fn() -> Option<LockGuard<B>>,
        enter: &impl Fn(Hold<B>) -> LockGuard<B>,
        entered: impl Fn() -> Option<Notified<'t>>,
        left: Option<Duration>,
    ) -> Option<Result<LockGuard<B>>> {
        let mut in_line = pin!(until_or(left, self.queue(key, options)));
        loop {
            let mut gained = pin!(entered());
            enable(gained.as_mut());
            let watched = gained.is_some();
            if let Some(guard) = reenter() {
                return Some(Ok(guard));
            }
            tokio::select! {
                outcome = &mut in_line => {
                    return outcome.map(|outcome| outcome.map(enter));
                }
                () = wake(gained), if watched => {}
            }
        }
    }

    /// One acquire attempt: the hold, or (`Err`) what is left of the holder's lease. `local`
    /// is the key's local state, for the hold (when this process's waiters take turns).
    ///
    /// The attempt runs in a task of its own, which finishes it even if the caller goes
    /// away (a deadline, a cancelled request): a release sent right away could overtake the
    /// acquire on another connection (a pool). What it took goes back to the caller as an
    /// [`Unclaimed`], which gives the lock back if nobody claims it.
    async fn attempt(
        &self,
        key: &str,
        options: &LockOptions,
        local: Option<Arc<LocalKey>>,
    ) -> Result<Result<Hold<B>, Option<Duration>>> {
        let token = Token::new();
        let ttl = options.ttl();
        // TIMING: the lease is counted from before the command is sent (see `Lease`).
        let sent = Instant::now();
        let backend = Arc::clone(&self.backend);
        let taken = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (answer, answered) = oneshot::channel();
                let owned_key = key.to_owned();
                runtime.spawn(async move {
                    let attempt = backend.try_lock(&owned_key, &token, ttl).await;
                    // Unheard answers are dropped, and an `Unclaimed` gives its lock back.
                    let unclaimed = Unclaimed::from_attempt(backend, owned_key, token, attempt);
                    let _ = answer.send(unclaimed);
                });
                answered.await.map_err(|_| self.aborted(key))??
            }
            Err(_) => {
                let attempt = backend.try_lock(key, &token, ttl).await;
                Unclaimed::from_attempt(backend, key.to_owned(), token, attempt)?
            }
        };
        match taken {
            Ok(unclaimed) => self.hold(unclaimed, options, sent, local).await.map(Ok),
            Err(expires_in) => Ok(Err(expires_in)),
        }
    }

    /// Join the backend's line for `key` and wait for our turn; in a task of its own, which
    /// gives up its place (`unlock` by token) when this future is dropped.
    async fn queue(&self, key: &str, options: &LockOptions) -> Result<Hold<B>> {
        let token = Token::new();
        let ttl = options.ttl();
        let (answer, mut answered) = oneshot::channel();
        let backend = Arc::clone(&self.backend);
        let owned_key = key.to_owned();
        tokio::spawn(async move {
            let mut answer = answer;
            let in_line = backend.lock_in_line(&owned_key, &token, ttl);
            let turn = tokio::select! {
                turn = in_line => turn,
                () = answer.closed() => {
                    // Nobody waits any more: leave the line (or give back what it took).
                    release_in_background(backend, owned_key, token, None);
                    return;
                }
            };
            let claimed = match turn {
                Ok(turn) => Ok((
                    Unclaimed::acquired(backend, owned_key, token, turn.fence),
                    turn,
                )),
                Err(error) => {
                    // Our place may be left in the line (a node, a key): give it up.
                    release_in_background(backend, owned_key, token, None);
                    Err(error)
                }
            };
            // Unheard answers are dropped, and an `Unclaimed` gives its lock back.
            let _ = answer.send(claimed);
        });
        let (unclaimed, turn) = (&mut answered).await.map_err(|_| self.aborted(key))??;
        // TIMING: the wait in line may have lasted longer than a ttl; the backend kept its
        // own lease (a session, a lease kept alive) meanwhile, and says when a request last
        // proved it alive. The holder's lease is counted from there.
        let mut hold = self.hold(unclaimed, options, turn.proven_at, None).await?;
        hold.contended = turn.waited;
        Ok(hold)
    }

    /// The hold of a lock an attempt took: its lease, its watchdog (inside a tokio runtime)
    /// and, when asked, the first wait for replicas.
    async fn hold(
        &self,
        unclaimed: Unclaimed<B>,
        options: &LockOptions,
        sent: Instant,
        local: Option<Arc<LocalKey>>,
    ) -> Result<Hold<B>> {
        let (key, token, fence) = unclaimed.claim();
        let ttl = options.ttl();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let renew_interval = options.renew_interval().filter(|_| runtime.is_some());
        if runtime.is_none() && options.renew_interval().is_some() {
            tracing::warn!(%key, "lock taken outside a tokio runtime: no watchdog; the lease frees it within one ttl");
        }
        let lease = Arc::new(Lease::with_ttl(
            sent,
            self.backend.lease(ttl),
            ttl,
            renew_interval.is_some(),
        ));
        let mut hold = Hold {
            backend: Arc::clone(&self.backend),
            key,
            token,
            fence: fence.get().into(),
            lease,
            watchdog: None,
            local,
            released: false.into(),
            contended: false,
            replicas: options.wait_for_replicas(),
            renew_interval,
        };
        if let Some((wanted, within)) = hold.replicas {
            // Dropping `hold` on an error gives the lock back (its drop fallback).
            hold.lease
                .set_replicas(self.backend.wait_for_replicas(wanted, within).await?);
        }
        hold.watchdog = renew_interval.map(|every| {
            Watchdog {
                backend: Arc::clone(&self.backend),
                key: hold.key.clone(),
                token: hold.token.clone(),
                every,
                replicas: hold.replicas,
                first_sent: sent,
                lease: Arc::clone(&hold.lease),
            }
            .spawn()
        });
        Ok(hold)
    }

    fn aborted(&self, key: &str) -> Error {
        Error::Aborted {
            key: key.to_owned(),
        }
    }
}

/// An acquisition on its way from the task that made it to its caller. If nobody claims it
/// (the caller went away just before or just after it was handed over), dropping it gives
/// the lock back in the background: no lock is left for a whole ttl with no watchdog.
struct Unclaimed<B: Backend> {
    backend: Arc<B>,
    key: String,
    /// `None` once claimed.
    token: Option<Token>,
    fence: Fence,
}

impl<B: Backend> Unclaimed<B> {
    /// What an attempt's answer hands over: the acquisition, or what is left of the
    /// holder's lease. An error may hide an acquire that ran anyway (a reply lost after the
    /// backend took the key), so the token is given back then too.
    fn from_attempt(
        backend: Arc<B>,
        key: String,
        token: Token,
        attempt: Result<Attempt>,
    ) -> Result<Result<Self, Option<Duration>>> {
        match attempt {
            Ok(Attempt::Acquired(fence)) => Ok(Ok(Self::acquired(backend, key, token, fence))),
            Ok(Attempt::Held { expires_in }) => Ok(Err(expires_in)),
            Err(error) => {
                release_in_background(backend, key, token, None);
                Err(error)
            }
        }
    }

    /// `token` took `key` with `fence`.
    fn acquired(backend: Arc<B>, key: String, token: Token, fence: Fence) -> Self {
        Self {
            backend,
            key,
            token: Some(token),
            fence,
        }
    }

    fn claim(mut self) -> (String, Token, Fence) {
        let token = self.token.take().expect("claimed once");
        (std::mem::take(&mut self.key), token, self.fence)
    }
}

impl<B: Backend> Drop for Unclaimed<B> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let key = std::mem::take(&mut self.key);
            release_in_background(Arc::clone(&self.backend), key, token, None);
        }
    }
}

/// `future`, unless `left` runs out first (`None`); an endless wait (`left` is `None`) only
/// ends with the future.
async fn until_or<T>(left: Option<Duration>, future: impl Future<Output = T>) -> Option<T> {
    match left {
        Some(left) => timeout(left, future).await.ok(),
        None => Some(future.await),
    }
}

fn enable(notified: std::pin::Pin<&mut Option<Notified<'_>>>) {
    if let Some(notified) = notified.as_pin_mut() {
        notified.enable();
    }
}

/// Resolves when the owner's notification does (never without one).
async fn wake(notified: std::pin::Pin<&mut Option<Notified<'_>>>) {
    match notified.as_pin_mut() {
        Some(notified) => notified.await,
        None => std::future::pending().await,
    }
}
