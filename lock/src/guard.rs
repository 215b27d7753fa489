//! The guard a holder keeps while it works, the state of one acquisition behind it, and the
//! table of a reentrant owner's acquisitions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use crate::backend::{Backend, Unlock};
use crate::error::{Error, Result};
use crate::fenced::{Fence, FencedGuard};
use crate::lease::{self, Lease, LockLost};
use crate::token::Token;
use crate::waiting::LocalKey;

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
    /// Aborted before release: no renewal after unlock.
    pub(crate) watchdog: Option<JoinHandle<()>>,
    /// With [`ReleaseSignals`](crate::ReleaseSignals): the key's local state, whose waiter
    /// is woken as soon as our release has been sent.
    pub(crate) local: Option<Arc<LocalKey>>,
    /// Set once the backend has answered the release, so `Drop` need not release again.
    pub(crate) released: AtomicBool,
    /// An attempt of this acquisition found the key held ([`LockGuard::was_contended`]).
    pub(crate) contended: bool,
}

impl<B: Backend> Hold<B> {
    fn stop_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.abort();
        }
    }

    /// Stop renewing, then delete the lock if it still holds our token.
    ///
    /// `true` when it was still ours as far as this process can tell: our token was there;
    /// or our own lease was still running when we sent the release and the lock was gone or
    /// held by someone else. Under the crate's timing assumptions nobody else can have had
    /// the lock while our lease ran, so that is a re-sent release whose first try deleted it
    /// (and, perhaps, the next holder that took it since). A lock deleted behind our back
    /// (an operator, a failover) and not yet noticed by the watchdog reads the same way.
    pub(crate) async fn release(&self) -> Result<bool> {
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
            Unlock::Released => true,
            Unlock::Gone | Unlock::Taken => held_when_sent,
        })
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

/// Proof of holding a lock. Release it with [`release`](Self::release).
///
/// While the guard lives, the watchdog (if on) renews the lease. Ask [`is_held`](Self::is_held)
/// before a step that must not run without the lock, or race the work against
/// [`lost`](Self::lost). Write with [`fence`](Self::fence) to stores that can check it.
///
/// Dropping the guard without releasing it stops the watchdog and releases the lock in a
/// spawned task (when a tokio runtime is running; otherwise the lease frees it within one ttl).
/// Drop never blocks.
#[must_use = "the lock is released as soon as the guard is dropped; bind it and call `release().await`"]
pub struct LockGuard<B: Backend> {
    pub(crate) hold: Arc<Hold<B>>,
    /// The reentrant owner whose hold count this guard is part of, until it leaves.
    pub(crate) owner: Option<Arc<OwnerTable<B>>>,
}

impl<B: Backend> LockGuard<B> {
    pub(crate) fn new(hold: Arc<Hold<B>>, owner: Option<Arc<OwnerTable<B>>>) -> Self {
        Self { hold, owner }
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.hold.key
    }

    /// Whether an attempt of this acquisition found the key held, so that it had to wait: a
    /// sign that others want the key, for a caller that gives it up sooner when they do.
    /// "Held" is what the backend answered: another owner's lock, a lease of our own that a
    /// failed release left behind, or (Redlock) an attempt that ran out of validity or
    /// could not spread its fence. A wait behind waiters of this process (release signals'
    /// turns) does not count. Always `false` from [`Locker::try_acquire`](crate::Locker::try_acquire);
    /// a reentrant guard reports the acquisition it shares.
    pub fn was_contended(&self) -> bool {
        self.hold.contended
    }

    /// The fence of this acquisition (shared by all reentrant guards of it).
    pub fn fence(&self) -> Fence {
        Fence(self.hold.fence.load(Ordering::Acquire))
    }

    /// Take a new fence above `seen`, the highest fence a store reports having accepted,
    /// if and only if this guard still holds the lock.
    ///
    /// A store that refuses our fence means one of two things. Either a newer holder has
    /// written (our lease ran out: we are stale and must stop), or the counter went back
    /// (someone reset it) and now hands out fences below what the store has seen. The
    /// backend tells them apart atomically: only the current holder gets a new fence, which
    /// is above `seen` and above every fence issued before. A stale holder gets
    /// [`Error::NotHeld`].
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock no longer holds this guard's token;
    /// [`Error::InvalidFence`] when `seen` is [`Fence::MAX`] or above (no fence can follow
    /// it); [`Error::Redis`] (or the backend's own error) when it cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the counter may have been raised, which only ever
    /// invalidates older fences.
    pub async fn advance_fence(&self, seen: Fence) -> Result<Fence> {
        if seen.get() >= Fence::MAX {
            return Err(Error::InvalidFence(seen.get()));
        }
        let hold = &self.hold;
        let Some(fence) = hold
            .backend
            .advance_fence(&hold.key, &hold.token, seen)
            .await?
        else {
            return Err(Error::NotHeld {
                key: hold.key.clone(),
            });
        };
        hold.fence.fetch_max(fence.get(), Ordering::AcqRel);
        Ok(fence)
    }

    /// The random token stored with the lock.
    pub fn token(&self) -> &str {
        self.hold.token.as_str()
    }

    /// `true` while the lease is known to be ours: renewed in time and not seen lost. Once
    /// `false`, always `false`, even if a renewal that was in flight succeeds later.
    ///
    /// A `true` is a belief, not a promise: the lease can run out a moment later (see the
    /// crate docs on timing). Fence the writes that matter.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves when the lock is lost: the watchdog found it gone or taken, or the lease ran
    /// out without a successful renewal. Never resolves while the lease is renewed, and once
    /// it resolves, [`is_held`](Self::is_held) is `false` for good.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        lease::wait_lost(Arc::clone(&self.hold.lease))
    }

    /// How many times the watchdog has renewed this lease.
    pub fn renewals(&self) -> u64 {
        self.hold.lease.renewals()
    }

    /// How many guards of this acquisition the owner holds (1 unless reentrant).
    pub fn hold_count(&self) -> usize {
        self.owner
            .as_ref()
            .map_or(1, |owner| owner.count(&self.hold))
    }

    /// Give the lock back.
    ///
    /// For a reentrant owner, only the release of its last guard deletes the lock; earlier
    /// ones just count down. Returns `true` when the lock was still ours: it held our token
    /// and was deleted (or, for a non-last reentrant guard, the lease is still held).
    /// `false` means the lease had run out and the work under this guard may have overlapped
    /// with another holder's.
    ///
    /// # Errors
    /// [`Error::Redis`] (or the backend's own error) when it cannot be reached; the lease
    /// then frees the lock within one ttl (the watchdog has already stopped).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the guard's drop fallback releases the
    /// lock in a spawned task.
    #[must_use = "`false` means the lease ran out and the work may have overlapped another holder's"]
    pub async fn release(mut self) -> Result<bool> {
        if let Some(owner) = self.owner.take()
            && !owner.leave(&self.hold)
        {
            return Ok(self.hold.is_held());
        }
        self.hold.release().await
    }
}

impl<B: Backend> Drop for LockGuard<B> {
    fn drop(&mut self) {
        // The lock itself is released by `Hold::drop` once the last guard is gone.
        if let Some(owner) = self.owner.take() {
            owner.leave(&self.hold);
        }
    }
}

impl<B: Backend> std::fmt::Debug for LockGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("fence", &self.fence())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> FencedGuard for LockGuard<B> {
    fn key(&self) -> &str {
        LockGuard::key(self)
    }

    fn fence(&self) -> Fence {
        LockGuard::fence(self)
    }

    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }

    fn renewals(&self) -> u64 {
        LockGuard::renewals(self)
    }

    async fn advance_fence(&self, seen: Fence) -> Result<Fence> {
        LockGuard::advance_fence(self, seen).await
    }

    async fn release(self) -> Result<bool> {
        LockGuard::release(self).await
    }
}

/// The acquisitions a reentrant [`Owner`](crate::Owner) holds, which its guards count
/// themselves out of.
pub(crate) struct OwnerTable<B: Backend> {
    /// Held keys. A std mutex: it is never held across an `.await`, and guards' `Drop` needs it.
    held: Mutex<HashMap<String, Entry<B>>>,
}

struct Entry<B: Backend> {
    hold: Arc<Hold<B>>,
    count: usize,
}

impl<B: Backend> OwnerTable<B> {
    pub(crate) fn new() -> Self {
        Self {
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Count one more guard into a held, not lost, acquisition of `key`.
    pub(crate) fn reenter(self: &Arc<Self>, key: &str) -> Option<LockGuard<B>> {
        let mut held = self.held.lock().expect("owner table poisoned");
        let entry = held.get_mut(key)?;
        if !entry.hold.is_held() {
            return None;
        }
        entry.count += 1;
        Some(LockGuard::new(
            Arc::clone(&entry.hold),
            Some(Arc::clone(self)),
        ))
    }

    /// Record a new acquisition, with one guard.
    pub(crate) fn enter(self: &Arc<Self>, hold: Hold<B>) -> LockGuard<B> {
        let hold = Arc::new(hold);
        let entry = Entry {
            hold: Arc::clone(&hold),
            count: 1,
        };
        // Replaces an entry whose lease was lost; its guards now count for nothing here.
        self.held
            .lock()
            .expect("owner table poisoned")
            .insert(hold.key.clone(), entry);
        LockGuard::new(hold, Some(Arc::clone(self)))
    }

    /// Count one guard of `hold` out. Returns `true` when it was the last one, so the lock
    /// must now be released.
    pub(crate) fn leave(&self, hold: &Arc<Hold<B>>) -> bool {
        let mut held = self.held.lock().expect("owner table poisoned");
        match held.get_mut(&hold.key) {
            Some(entry) if Arc::ptr_eq(&entry.hold, hold) => {
                entry.count -= 1;
                if entry.count == 0 {
                    held.remove(&hold.key);
                    true
                } else {
                    false
                }
            }
            // A lost acquisition that a newer one replaced: nothing counts it any more.
            _ => true,
        }
    }

    pub(crate) fn count(&self, hold: &Arc<Hold<B>>) -> usize {
        let held = self.held.lock().expect("owner table poisoned");
        match held.get(&hold.key) {
            Some(entry) if Arc::ptr_eq(&entry.hold, hold) => entry.count,
            _ => 1,
        }
    }
}
