//! Taking locks: one atomic attempt, and the bounded wait built on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, sleep, timeout};

use crate::backend::{Attempt, Backend};
use crate::error::{Error, Result};
use crate::guard::{Hold, LockGuard, OwnerTable, release_in_background};
use crate::keys::release_channel;
use crate::lease::{Lease, Watchdog};
use crate::options::LockOptions;
use crate::owner::Owner;
use crate::retry::{Backoff, deadline_after, left_until};
use crate::signals::ReleaseSignals;
use crate::token::Token;

/// Takes locks on one [`Backend`]: a Redis connection, a [`Redlock`](crate::Redlock) set of
/// masters, or a [`PgLockTable`](crate::PgLockTable).
///
/// Cheap to clone (the backend and options are shared). On Redis, use a multiplexed
/// connection such as [`redis::aio::ConnectionManager`]: concurrent lock calls are then
/// pipelined on one socket, and the manager reconnects after Redis restarts.
pub struct Locker<B: Backend> {
    backend: Arc<B>,
    options: Arc<LockOptions>,
    /// With [`ReleaseSignals`]: wake-ups on release, and a fair turn per key in this process.
    waiting: Option<Arc<Waiting>>,
}

/// Wake-on-release waiting: the subscription, and a first-come, first-served queue per key,
/// so only one task of this process contends for a key at a time and local waiters take
/// turns instead of racing each other through Redis.
struct Waiting {
    signals: ReleaseSignals,
    turns: Mutex<HashMap<String, Arc<Semaphore>>>,
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
    /// delay), and waiters in this process queue for their turn first-come, first-served.
    ///
    /// Only a backend that publishes releases can wake waiters: the single-Redis backend on
    /// a standalone Redis. With others, waiting still works, paced by the backstop.
    #[must_use]
    pub fn with_release_signals(mut self, signals: ReleaseSignals) -> Self {
        self.waiting = Some(Arc::new(Waiting {
            signals,
            turns: Mutex::new(HashMap::new()),
        }));
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

    /// A new owner identity, for locks that must be reentrant (see [`Owner`]).
    pub fn owner(&self) -> Owner<B> {
        Owner::new(self.clone(), Arc::new(OwnerTable::new()))
    }

    /// Take the lock if it is free; never wait.
    ///
    /// One round trip (on Redis: `SET key token NX PX ttl` and the fence `INCR`, in one
    /// script). Every call is a new owner, so a second `try_acquire` of a key held by the
    /// first fails.
    ///
    /// # Errors
    /// [`Error::Held`] when another owner holds the lock; [`Error::InvalidKey`] for an empty
    /// key; [`Error::Redis`] (or the backend's own error) when it cannot be reached;
    /// [`Error::NoQuorum`] from Redlock.
    ///
    /// # Cancel safety
    /// If the future is dropped while the command is in flight, a release by token follows
    /// it in a spawned task, so a lock the backend takes anyway is given back (outside a
    /// tokio runtime it lives out its ttl: no watchdog was started for it).
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
    /// if anything, is released by token in the background).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes; [`Error::InvalidKey`] for an empty key;
    /// [`Error::Redis`] (or the backend's own error) at once when it cannot be reached
    /// (waiting would not help); [`Error::NoQuorum`] from Redlock.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): what an abandoned attempt took is released by
    /// token in the background.
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.wait_for(key, || None, |hold| LockGuard::new(Arc::new(hold), None))
            .await
    }

    pub(crate) async fn try_acquire_hold(&self, key: &str) -> Result<Hold<B>> {
        match self.attempt(key).await? {
            Ok(hold) => Ok(hold),
            Err(_expires_in) => Err(Error::Held {
                key: key.to_owned(),
            }),
        }
    }

    /// Wait for `key` until the deadline, and make what `enter` makes of the hold. Before
    /// each attempt, `reenter` may end the wait with a guard of its own (a reentrant owner
    /// that already holds the key: it must not queue behind itself).
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
        let deadline = deadline_after(started, self.options.wait_timeout());
        let timed_out = || Error::Timeout {
            key: key.to_owned(),
            waited: started.elapsed(),
        };
        let (min, max) = self.options.retry_delay();
        let mut backoff = Backoff::new(min, max);
        let turn = match &self.waiting {
            Some(waiting) => Some(
                timeout(left_until(deadline), waiting.take_turn(key))
                    .await
                    .map_err(|_| timed_out())?,
            ),
            None => None,
        };
        let channel = release_channel(key).ok();
        loop {
            if let Some(guard) = reenter() {
                return Ok(guard);
            }
            let watch = match (&self.waiting, &channel) {
                (Some(waiting), Some(channel)) => match waiting.signals.watch(channel).await {
                    Ok(watch) => Some(watch),
                    Err(error) => {
                        tracing::debug!(%error, "release signals unavailable; polling");
                        None
                    }
                },
                _ => None,
            };
            let released = watch.as_ref().map(|watch| watch.notified());
            let mut released = std::pin::pin!(released);
            if let Some(released) = released.as_mut().as_pin_mut() {
                // Registered before the attempt: a release right after it still wakes us.
                released.enable();
            }
            // An attempt is bounded by what is left of the wait, except that a zero wait
            // still makes one (unbounded) attempt: `wait_timeout(0)` means "try once".
            let left = left_until(deadline);
            let outcome = if left.is_zero() {
                self.attempt(key).await?
            } else {
                timeout(left, self.attempt(key))
                    .await
                    .map_err(|_| timed_out())??
            };
            let expires_in = match outcome {
                Ok(mut hold) => {
                    hold.turn = Mutex::new(turn);
                    return Ok(enter(hold));
                }
                Err(expires_in) => expires_in,
            };
            let left = left_until(deadline);
            if left.is_zero() {
                return Err(timed_out());
            }
            // TIMING: with signals the pause is only a backstop for a lost message, and a
            // lock whose holder vanished frees itself when its lease runs out, so the pause
            // never outlasts that lease.
            let pause = match released.as_mut().as_pin_mut() {
                Some(released) => {
                    let backstop = expires_in.map_or(max, |e| e.min(max)).min(left);
                    tokio::select! {
                        () = released => {}
                        () = sleep(backstop) => {}
                    }
                    Duration::ZERO
                }
                None => backoff.next_pause(),
            };
            sleep(pause.min(left)).await;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out());
            }
        }
    }

    /// One acquire attempt: the hold, or (`Err`) what is left of the holder's lease.
    async fn attempt(&self, key: &str) -> Result<Result<Hold<B>, Option<Duration>>> {
        self.backend.check_key(key)?;
        let token = Token::new();
        let ttl = self.options.ttl();
        // TIMING: the lease is counted from before the command is sent (see `Lease`).
        let sent = Instant::now();
        let abandoned = ReleaseIfAbandoned {
            backend: &self.backend,
            key,
            token: &token,
        };
        let attempt = self.backend.try_lock(key, &token, ttl).await;
        // An error leaves the guard armed: the backend may have run the command before the
        // connection dropped.
        let attempt = attempt?;
        std::mem::forget(abandoned);
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
            turn: Mutex::new(None),
            released: false.into(),
        }))
    }
}

impl Waiting {
    /// Wait for this process's turn at `key`.
    async fn take_turn(&self, key: &str) -> OwnedSemaphorePermit {
        let turn = {
            let mut turns = self.turns.lock().expect("turns poisoned");
            // Forget queues nobody is in, so the table does not grow with every key ever
            // locked. A queue is in use while someone other than the table holds it.
            turns.retain(|_, queue| Arc::strong_count(queue) > 1);
            Arc::clone(
                turns
                    .entry(key.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(1))),
            )
        };
        turn.acquire_owned()
            .await
            .expect("turn semaphores are never closed")
    }
}

/// Armed while an acquire command is in flight. If the attempt is dropped there (a deadline,
/// a cancelled caller), the backend may still take the lock; this releases it by token in
/// the background. On one multiplexed Redis connection commands run in order, so the release
/// runs after the acquire. Disarmed with `mem::forget` once an answer is in.
struct ReleaseIfAbandoned<'a, B: Backend> {
    backend: &'a Arc<B>,
    key: &'a str,
    token: &'a Token,
}

impl<B: Backend> Drop for ReleaseIfAbandoned<'_, B> {
    fn drop(&mut self) {
        release_in_background(
            Arc::clone(self.backend),
            self.key.to_owned(),
            self.token.clone(),
        );
    }
}
