//! Taking locks: one atomic attempt, and the bounded wait built on it.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};

use crate::backend::{Attempt, Backend};
use crate::error::{Error, Result};
use crate::guard::{Hold, LockGuard, release_in_background};
use crate::keys::release_channel;
use crate::lease::{Lease, Watchdog};
use crate::options::LockOptions;
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

impl<B: Backend> Locker<B> {
    /// A locker on `backend` with `options`.
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
    /// # Errors
    /// [`Error::Held`] when another owner holds the lock; [`Error::InvalidKey`] for an empty
    /// key; [`Error::Redis`] (or the backend's own error) when it cannot be reached;
    /// [`Error::NoQuorum`] from Redlock.
    ///
    /// # Cancel safety
    /// The attempt runs in a task of its own. If this future is dropped, the task finishes
    /// the attempt and gives back what it took (outside a tokio runtime nothing can be
    /// spawned, and the attempt is simply made here).
    pub async fn try_acquire(&self, key: &str) -> Result<LockGuard<B>> {
        let hold = self.try_acquire_hold(key).await?;
        Ok(LockGuard::new(Arc::new(hold), None))
    }

    /// Take the lock, waiting for it until the options' `wait_timeout`.
    ///
    /// Without release signals, retries with jittered exponential backoff between
    /// `retry_delay`'s bounds; with them, waits for the release (see
    /// [`with_release_signals`](Self::with_release_signals)). No attempt starts after the
    /// deadline, and an attempt still in flight at the deadline is abandoned (what it took,
    /// if anything, is given back in the background).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes; [`Error::InvalidKey`] for an empty key;
    /// [`Error::Redis`] (or the backend's own error) at once when it cannot be reached
    /// (waiting would not help); [`Error::NoQuorum`] from Redlock.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.wait_for(key, || None, |hold| LockGuard::new(Arc::new(hold), None))
            .await
    }

    pub(crate) async fn try_acquire_hold(&self, key: &str) -> Result<Hold<B>> {
        self.backend.check_key(key)?;
        let local = self.waiting.as_ref().map(|w| w.local_key(key));
        match self.attempt(key, local).await? {
            Ok(hold) => Ok(hold),
            Err(_expires_in) => Err(Error::Held {
                key: key.to_owned(),
            }),
        }
    }

    /// Wait for `key` until the deadline, and make what `enter` makes of the hold. Before
    /// each attempt, `reenter` may end the wait with a guard of its own (a reentrant owner
    /// that already holds the key).
    pub(crate) async fn wait_for<T>(
        &self,
        key: &str,
        mut reenter: impl FnMut() -> Option<T>,
        enter: impl FnOnce(Hold<B>) -> T,
    ) -> Result<T> {
        self.backend.check_key(key)?;
        if let Some(guard) = reenter() {
            return Ok(guard);
        }
        let started = Instant::now();
        let wait = self.options.wait_timeout();
        // `None`: a wait too long to represent, which never ends.
        let deadline = deadline_after(started, wait);
        let timed_out = || Error::Timeout {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        // What is left of the wait; `None` while it is endless.
        let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let (min, max) = self.options.retry_delay();
        let mut backoff = Backoff::new(min, max);
        let local = self.waiting.as_ref().map(|w| (w, w.local_key(key)));
        let _turn = match &local {
            Some((_, local)) => {
                let turn = local.turn();
                let turn = match left() {
                    Some(left) => timeout(left, turn).await.map_err(|_| timed_out())?,
                    None => turn.await,
                };
                Some(turn)
            }
            None => None,
        };
        let channel = release_channel(key).ok();
        // Whether an attempt found the key held by another owner.
        let mut contended = false;
        loop {
            if let Some(guard) = reenter() {
                return Ok(guard);
            }
            let watch = match (&local, &channel) {
                (Some((waiting, _)), Some(channel)) => {
                    let watch = waiting.signals().watch(channel);
                    let watch = match left() {
                        Some(left) => timeout(left, watch).await.ok(),
                        None => Some(watch.await),
                    };
                    match watch {
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
            // A zero wait makes one attempt, unbounded: `wait_timeout(0)` means "try once".
            // Otherwise no attempt starts at or after the deadline.
            let attempt = self.attempt(key, local.as_ref().map(|(_, l)| Arc::clone(l)));
            let outcome = match left() {
                _ if wait.is_zero() => attempt.await?,
                Some(left) if left.is_zero() => return Err(timed_out()),
                Some(left) => timeout(left, attempt).await.map_err(|_| timed_out())??,
                None => attempt.await?,
            };
            let expires_in = match outcome {
                Ok(mut hold) => {
                    hold.contended = contended;
                    return Ok(enter(hold));
                }
                Err(expires_in) => expires_in,
            };
            contended = true;
            if left().is_some_and(|left| left.is_zero()) || wait.is_zero() {
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
            }
        }
    }

    /// One acquire attempt: the hold, or (`Err`) what is left of the holder's lease. `local`
    /// is the key's local state, for the hold (when this process's waiters take turns).
    ///
    /// The attempt runs in a task of its own, which finishes it even if the caller goes
    /// away (a deadline, a cancelled request) and then gives back whatever it took: a
    /// release sent right away could overtake the acquire on another connection (a pool).
    async fn attempt(
        &self,
        key: &str,
        local: Option<Arc<LocalKey>>,
    ) -> Result<Result<Hold<B>, Option<Duration>>> {
        let token = Token::new();
        let ttl = self.options.ttl();
        // TIMING: the lease is counted from before the command is sent (see `Lease`).
        let sent = Instant::now();
        let attempt = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (answer, answered) = oneshot::channel();
                let (backend, key, token) =
                    (Arc::clone(&self.backend), key.to_owned(), token.clone());
                runtime.spawn(async move {
                    let attempt = backend.try_lock(&key, &token, ttl).await;
                    if let Err(unheard) = answer.send(attempt)
                        && !matches!(unheard, Ok(Attempt::Held { .. }))
                    {
                        // The caller is gone; an error may hide an acquire that ran anyway.
                        release_in_background(backend, key, token, None);
                    }
                });
                answered
                    .await
                    .expect("the attempt task answers unless the runtime shuts down")?
            }
            Err(_) => self.backend.try_lock(key, &token, ttl).await?,
        };
        let fence = match attempt {
            Attempt::Acquired(fence) => fence,
            Attempt::Held { expires_in } => return Ok(Err(expires_in)),
        };
        let watched = self.options.renew_interval().is_some();
        let lease = Arc::new(Lease::new(sent, self.backend.lease(ttl), watched));
        let watchdog = self.options.renew_interval().map(|every| {
            Watchdog {
                backend: Arc::clone(&self.backend),
                key: key.to_owned(),
                token: token.clone(),
                ttl,
                every,
                first_sent: sent,
                lease: Arc::clone(&lease),
            }
            .spawn()
        });
        Ok(Ok(Hold {
            backend: Arc::clone(&self.backend),
            key: key.to_owned(),
            token,
            fence: fence.get().into(),
            lease,
            watchdog,
            local,
            released: false.into(),
            contended: false,
        }))
    }
}
