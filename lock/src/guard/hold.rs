//! [`Hold`]: one acquisition of one key, shared by every guard of a reentrant owner; its
//! release, and the drop fallback that releases in the background.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::{Backend, Unlock};
use crate::error::Result;
use crate::guard::outcome::ReleaseOutcome;
use crate::lease::{Lease, LockLost};
use crate::token::Token;
use crate::waiting::LocalKey;
use crate::watchdog::Ticket;

/// One acquisition of one key: shared by every guard of a reentrant owner.
pub(crate) struct Hold<B: Backend> {
    /// Where the lock lives, for renewal, fence and release.
    pub(crate) backend: Arc<B>,
    pub(crate) key: String,
    /// The random value stored with the lock; only its holder can renew or delete it.
    pub(crate) token: Token,
    /// The current fence; raised by `advance_fence`.
    pub(crate) fence: AtomicU64,
    /// Written by the watchdog; read by `is_held` and `lost`.
    pub(crate) lease: Arc<Lease>,
    /// The watchdog's place in its timetable, cancelled before release: no renewal after
    /// unlock.
    pub(crate) watchdog: Option<Ticket<B>>,
    /// With [`ReleaseSignals`](crate::ReleaseSignals): the key's local state, whose waiter
    /// is woken as soon as our release has been sent.
    pub(crate) local: Option<Arc<LocalKey>>,
    /// Set once the backend has answered the release, so `Drop` need not release again.
    pub(crate) released: AtomicBool,
    /// An attempt of this acquisition found the key held ([`LockGuard::was_contended`]).
    pub(crate) contended: bool,
    /// How many replicas each renewal (and `extend`) waits for, and how long.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// The watchdog's period (`None`: no watchdog), which an `extend`'s ttl must leave room for.
    pub(crate) renew_interval: Option<Duration>,
}

impl<B: Backend> Hold<B> {
    fn stop_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.cancel();
        }
    }

    /// Stop renewing, then delete the lock if it still holds our token, and say how the
    /// lock ended: found gone while our lease ran reads as released, found holding another
    /// token as taken (the reasoning is in `guard/outcome.rs`).
    pub(crate) async fn release(&self) -> Result<ReleaseOutcome> {
        self.stop_watchdog();
        let held_when_sent = self.lease.is_held();
        let mut unlock = std::pin::pin!(self.backend.unlock(&self.key, &self.token));
        // Polling once sends the release; only then is the waiting task of this process
        // woken. On one multiplexed connection its attempt then runs right after our
        // release: one round trip later instead of two. (Had the first poll not sent it
        // yet, the attempt finds the lock still held and waits for the release message.)
        // (`futures_util::poll!` would need that crate's `async-await-macro` feature.)
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(unlock.as_mut().poll(cx))).await;
        if let Some(local) = &self.local {
            local.ring();
        }
        let unlocked = match first {
            std::task::Poll::Ready(unlocked) => unlocked,
            std::task::Poll::Pending => unlock.await,
        }?;
        self.released.store(true, Ordering::Release);
        Ok(match unlocked {
            Unlock::Released => ReleaseOutcome::Released,
            Unlock::Taken => {
                self.lease.lose(LockLost::Taken);
                ReleaseOutcome::Lost(LockLost::Taken)
            }
            _gone if held_when_sent => ReleaseOutcome::Released,
            _gone => ReleaseOutcome::Lost(self.lease.lost().unwrap_or(LockLost::Expired)),
        })
    }

    /// What a release that does not reach the backend (a reentrant guard that is not the
    /// owner's last) says: released while the lease is still ours.
    pub(crate) fn still(&self) -> ReleaseOutcome {
        match self.lease.is_held() {
            true => ReleaseOutcome::Released,
            false => ReleaseOutcome::Lost(self.lease.lost().unwrap_or(LockLost::Expired)),
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lease.is_held()
    }
}

impl<B: Backend> Drop for Hold<B> {
    /// The fallback for a guard dropped without `release` (an early return, a `?`, a panic,
    /// a cancelled future): stop the watchdog and release in a spawned task. Outside a tokio
    /// runtime nothing can be spawned; the lease then frees the lock within one ttl.
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let key = std::mem::take(&mut self.key);
        let token = self.token.take();
        release_in_background(Arc::clone(&self.backend), key, token, self.local.take());
    }
}

/// Delete `key` if it still holds `token`, in a task spawned on the current tokio runtime
/// (then wake the local waiter, if any): the release of whatever cannot await, a dropped
/// guard or an abandoned attempt. Outside a runtime nothing can be spawned, and the lease
/// frees the lock within one ttl.
pub(crate) fn release_in_background<B: Backend>(
    backend: Arc<B>,
    key: String,
    token: Token,
    local: Option<Arc<LocalKey>>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%key, "lock dropped outside a tokio runtime; the lease will free it");
        return;
    };
    runtime.spawn(async move {
        match backend.unlock(&key, &token).await {
            Ok(_) => tracing::debug!(%key, "released a dropped lock"),
            Err(error) => {
                tracing::warn!(%key, %error, "could not release a dropped lock; the lease will free it")
            }
        }
        if let Some(local) = local {
            local.ring();
        }
    });
}
