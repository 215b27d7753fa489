//! The deadline-bounded wait for one key, as named steps: re-enter a key the owner already
//! holds, take this process's turn for the key (with release signals), poll until the key
//! is free (one attempt, then a pause that a release cuts short), or wait in the backend's
//! own line ([`Protocol::Queue`]).
//!
//! Every step registers for the wake-ups that may end it (the owner gaining the key, a
//! release announced here or by Redis) *before* it checks or attempts, so a wake-up between
//! the check and the wait is never missed. A step that has nothing to wait for (no owner, no
//! release signals) waits on a future that never resolves instead.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::SemaphorePermit;
use tokio::sync::futures::Notified;
use tokio::time::{Instant, sleep, timeout};

use crate::backend::{Backend, Protocol};
use crate::error::{Error, Result};
use crate::guard::{Hold, LockGuard, OwnerTable};
use crate::locker::Locker;
use crate::locker::attempt::Attempted;
use crate::options::LockOptions;
use crate::redis::release_channel;
use crate::retry::{Backoff, deadline_after};
use crate::signals::Watch;
use crate::waiting::{LocalKey, Waiting};

/// One caller's wait for one key: when it started, and its deadline.
struct Wait<'k> {
    key: &'k str,
    started: Instant,
    /// `None`: a wait too long to represent, which never ends.
    deadline: Option<Instant>,
}

impl<'k> Wait<'k> {
    fn new(key: &'k str, wait: Duration) -> Self {
        let started = Instant::now();
        Self {
            key,
            started,
            deadline: deadline_after(started, wait),
        }
    }

    /// What is left of the wait; `None` while it is endless.
    fn left(&self) -> Option<Duration> {
        self.deadline
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    fn is_over(&self) -> bool {
        self.left().is_some_and(|left| left.is_zero())
    }

    fn timed_out(&self) -> Error {
        Error::Timeout {
            key: self.key.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    /// `future`, or [`Error::Timeout`] if what is left of the wait now runs out first.
    fn bound<F: Future>(&self, future: F) -> impl Future<Output = Result<F::Output>> {
        let left = self.left();
        async move { until_or(left, future).await.ok_or_else(|| self.timed_out()) }
    }
}

/// A reentrant owner's part in the wait (none for a plain `acquire`): a key it holds already
/// is re-entered, also while this call waits, and a new acquisition goes in its table.
struct Reentry<'a, B: Backend> {
    owner: Option<&'a Arc<OwnerTable<B>>>,
    key: &'a str,
}

impl<'a, B: Backend> Reentry<'a, B> {
    /// A guard of the owner's acquisition of the key, if it holds one.
    fn reenter(&self) -> Option<LockGuard<B>> {
        self.owner.and_then(|table| table.reenter(self.key))
    }

    /// The guard of a new acquisition, recorded in the owner's table.
    fn enter(&self, hold: Hold<B>) -> LockGuard<B> {
        match self.owner {
            Some(table) => table.enter(hold),
            None => LockGuard::new(Arc::new(hold), None),
        }
    }

    /// Resolves when the owner gains an acquisition (of any key: the caller then checks).
    fn gained(&self) -> Option<Notified<'a>> {
        self.owner.map(|table| table.entered.notified())
    }

    /// Register `gained` for the owner's next acquisition, then re-enter if it holds the key.
    fn check(&self, gained: Pin<&mut Option<Notified<'_>>>) -> Option<LockGuard<B>> {
        enable(gained);
        self.reenter()
    }
}

/// How waiting for this process's turn at a key ended.
enum LocalTurn<'a, B: Backend> {
    /// Ours: this task alone contends for the key until the permit is dropped.
    Ours(SemaphorePermit<'a>),
    /// The owner gained the key meanwhile: its re-entered guard.
    Reentered(LockGuard<B>),
}

impl<B: Backend> Locker<B> {
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
        let reentry = Reentry { owner, key };
        if let Some(guard) = reentry.reenter() {
            return Ok(guard);
        }
        let wait = Wait::new(key, options.wait_timeout());
        let local = self.waiting.as_deref().map(|w| (w, w.local_key(key)));
        // `wait_timeout(0)` means "try once": one attempt, with no turn to wait for and no
        // subscription to make first.
        if options.wait_timeout().is_zero() {
            let local = local.map(|(_, local)| local);
            return match self.attempt(key, options, local).await? {
                Attempted::Took(hold) => Ok(reentry.enter(hold)),
                Attempted::Held { .. } => Err(wait.timed_out()),
            };
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Unsupported(
                "waiting for a lock outside a tokio runtime",
            ));
        }
        match self.backend.protocol() {
            Protocol::Queue => self.wait_in_line(options, &reentry, &wait).await,
            Protocol::Retry => {
                let _turn = match &local {
                    Some((_, local)) => match take_local_turn(local, &reentry, &wait).await? {
                        LocalTurn::Ours(permit) => Some(permit),
                        LocalTurn::Reentered(guard) => return Ok(guard),
                    },
                    None => None,
                };
                // The turn is held until the guard is made, so no other local task contends.
                self.poll_until_free(options, &reentry, &wait, local.as_ref())
                    .await
            }
        }
    }

    /// Wait in the backend's own line until the deadline. An owner that gains the key
    /// meanwhile re-enters it, and our place in the line is given up.
    async fn wait_in_line(
        &self,
        options: &LockOptions,
        reentry: &Reentry<'_, B>,
        wait: &Wait<'_>,
    ) -> Result<LockGuard<B>> {
        let mut in_line = pin!(wait.bound(self.queue(wait.key, options)));
        loop {
            let mut gained = pin!(reentry.gained());
            if let Some(guard) = reentry.check(gained.as_mut()) {
                return Ok(guard);
            }
            tokio::select! {
                hold = &mut in_line => return Ok(reentry.enter(hold??)),
                () = notified_or_never(gained) => {}
            }
        }
    }

    /// Attempt, and between attempts pause until a release is announced (here or on Redis),
    /// the owner gains the key, or the backoff (without signals) or backstop (with them)
    /// runs out; until the key is taken or the deadline passes.
    async fn poll_until_free(
        &self,
        options: &LockOptions,
        reentry: &Reentry<'_, B>,
        wait: &Wait<'_>,
        local: Option<&(&Waiting, Arc<LocalKey>)>,
    ) -> Result<LockGuard<B>> {
        let (min, max) = options.retry_delay();
        let mut backoff = Backoff::new(min, max);
        let channel = release_channel(wait.key).ok();
        // Whether an attempt found the key held by another owner.
        let mut contended = false;
        loop {
            let mut gained = pin!(reentry.gained());
            if let Some(guard) = reentry.check(gained.as_mut()) {
                return Ok(guard);
            }
            let watch = match (local, &channel) {
                (Some((waiting, _)), Some(channel)) => {
                    watch_release(waiting, channel, wait).await?
                }
                _ => None,
            };
            // Registered before the attempt, so a release right after it still wakes us.
            let mut remote = pin!(watch.as_ref().map(Watch::notified));
            enable(remote.as_mut());
            let mut nearby = pin!(local.map(|(_, local)| local.released()));
            enable(nearby.as_mut());
            // No attempt starts at or after the deadline.
            if wait.is_over() {
                return Err(wait.timed_out());
            }
            let local_key = local.map(|(_, local)| Arc::clone(local));
            let expires_in = match wait
                .bound(self.attempt(wait.key, options, local_key))
                .await??
            {
                Attempted::Took(mut hold) => {
                    hold.contended = contended;
                    return Ok(reentry.enter(hold));
                }
                Attempted::Held { expires_in } => expires_in,
            };
            contended = true;
            if wait.is_over() {
                return Err(wait.timed_out());
            }
            // TIMING: with signals the pause is only a backstop for a lost message, and a
            // lock whose holder vanished frees itself when its lease runs out, so the pause
            // never outlasts that lease.
            let pause = if local.is_some() {
                expires_in.map_or(max, |e| e.min(max))
            } else {
                backoff.next_pause()
            };
            let pause = wait.left().map_or(pause, |left| pause.min(left));
            tokio::select! {
                () = sleep(pause) => {}
                () = notified_or_never(remote) => {}
                () = notified_or_never(nearby) => {}
                () = notified_or_never(gained) => {}
            }
        }
    }
}

/// Wait for this process's turn to contend for the key (release signals: one local task at
/// a time, first come, first served), keeping one place in the queue while an owner's
/// wake-up is checked.
async fn take_local_turn<'l, B: Backend>(
    local: &'l LocalKey,
    reentry: &Reentry<'_, B>,
    wait: &Wait<'_>,
) -> Result<LocalTurn<'l, B>> {
    let mut turn = pin!(wait.bound(local.turn()));
    loop {
        let mut gained = pin!(reentry.gained());
        if let Some(guard) = reentry.check(gained.as_mut()) {
            return Ok(LocalTurn::Reentered(guard));
        }
        tokio::select! {
            permit = &mut turn => return Ok(LocalTurn::Ours(permit?)),
            () = notified_or_never(gained) => {}
        }
    }
}

/// The subscription to the key's release channel, or `None` (then the wait polls) when the
/// signals are unavailable.
async fn watch_release(waiting: &Waiting, channel: &str, wait: &Wait<'_>) -> Result<Option<Watch>> {
    match wait.bound(waiting.signals().watch(channel)).await? {
        Ok(watch) => Ok(Some(watch)),
        Err(error) => {
            tracing::debug!(%error, "release signals unavailable; polling");
            Ok(None)
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

/// Register a pinned notification, so that a wake-up from now on is not missed.
fn enable(notified: Pin<&mut Option<Notified<'_>>>) {
    if let Some(notified) = notified.as_pin_mut() {
        notified.enable();
    }
}

/// Resolves when the notification does; never without one.
async fn notified_or_never(notified: Pin<&mut Option<Notified<'_>>>) {
    match notified.as_pin_mut() {
        Some(notified) => notified.await,
        None => std::future::pending().await,
    }
}
