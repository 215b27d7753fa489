//! The guard a holder keeps while it works, the state of one acquisition behind it, and the
//! table of a reentrant owner's acquisitions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::backend::{Backend, Renewal, Unlock};
use crate::error::{Error, Result};
use crate::fenced::{Fence, FencedGuard};
use crate::lease::{self, Lease, LockLost};
use crate::options::LockOptions;
use crate::token::Token;
use crate::waiting::LocalKey;

/// How a lock ended when its guard gave it back ([`LockGuard::release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "`Lost` means the work under the guard may have overlapped another holder's"]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// Our token was there and is gone now, while our lease still ran: under the crate's
    /// timing assumptions, nobody else held the lock while we did. Or nothing was there
    /// while our lease still ran: a re-sent release whose first try had deleted it (the
    /// common case), or a key lost behind our back since the last renewal (a `DEL`, an
    /// eviction, a failover) that the watchdog had not yet noticed; then another owner may
    /// have taken the lock and given it back meanwhile, which no release can see: only a
    /// fenced write tells. For a reentrant guard that is not the owner's last, the lease is
    /// still ours.
    Released,
    /// The lock was no longer ours when it was given back, for this reason: the lease ran
    /// out (or its backend could not be reached to renew it), the watchdog had found the
    /// key deleted, or another owner's token is in it now. The work done under the guard may have
    /// overlapped another holder's; only fenced writes are safe.
    Lost(LockLost),
}

impl ReleaseOutcome {
    /// `true` when the lock was ours until the release ([`Released`](Self::Released)).
    pub fn was_held(self) -> bool {
        matches!(self, ReleaseOutcome::Released)
    }
}

impl std::fmt::Display for ReleaseOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseOutcome::Released => f.write_str("released"),
            ReleaseOutcome::Lost(why) => write!(f, "lost before the release: {why}"),
        }
    }
}

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
    /// How many replicas each renewal (and `extend`) waits for, and how long.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// The watchdog's period (`None`: no watchdog), which an `extend`'s ttl must leave room for.
    pub(crate) renew_interval: Option<Duration>,
}

impl<B: Backend> Hold<B> {
    fn stop_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.abort();
        }
    }

    /// Stop renewing, then delete the lock if it still holds our token, and say how the
    /// lock ended (see [`ReleaseOutcome`]).
    ///
    /// A lock found gone while our own lease still ran reads as released: under the
    /// crate's timing assumptions nobody else can have had it while our lease ran, so that
    /// is a re-sent release whose first try deleted it. A lock deleted behind our back (an
    /// operator, a failover) and not yet noticed by the watchdog reads the same way. A lock
    /// found holding another token is always reported taken.
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
    fn still(&self) -> ReleaseOutcome {
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

    /// The random token stored with the lock. Whoever has it can release this lock, so its
    /// `Debug` shows only a prefix; [`Token::expose`] gives the whole value, to compare with
    /// what the backend holds (never to log).
    pub fn token(&self) -> &Token {
        &self.hold.token
    }

    /// Replicas that acknowledged the last acquire or renewal, when the options ask to
    /// wait for them ([`LockOptionsBuilder::wait_for_replicas`](crate::LockOptionsBuilder::wait_for_replicas));
    /// `None` otherwise. Fewer than asked means a failover to a replica may lose this lock;
    /// the lock is still held on the primary. `WAIT` counts what replicas acknowledged of
    /// the writes sent on its own connection: if the connection was replaced between the
    /// acquire and the `WAIT` (a reconnect; a Sentinel connection moving to another
    /// primary), the count says nothing of this lock and may be too high.
    pub fn replicas(&self) -> Option<u32> {
        self.hold.lease.replicas()
    }

    /// Renew the lease now, for `ttl` from now, and keep renewing with that ttl (if the
    /// watchdog is on): redsync's `Extend` and Redisson's lease time, by hand. A shorter ttl
    /// than before shortens the lease.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock is no longer ours (the lease had run out, or the
    /// backend found it gone or taken: then [`lost`](Self::lost) resolves too);
    /// [`Error::InvalidOptions`] for a ttl the options would refuse (under 1 ms, over
    /// [`LockOptions::MAX_TTL`], or too short for the watchdog's renewal interval);
    /// [`Error::Redis`] (or the backend's own error) when it cannot be reached (the lease
    /// is unchanged).
    ///
    /// # Cancel safety
    /// If dropped, the renewal may or may not have landed; the lease the holder counts on is
    /// unchanged until an answer comes, and the next renewal sets it again.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let hold = &self.hold;
        let mut options = LockOptions::builder().ttl(ttl);
        if let Some(every) = hold.renew_interval {
            options = options.renew_interval(every);
        } else {
            options = options.without_watchdog();
        }
        let ttl = options.build()?.ttl();
        let not_held = || Error::NotHeld {
            key: hold.key.clone(),
        };
        if !hold.is_held() {
            return Err(not_held());
        }
        let _renewing = hold.lease.renewing.lock().await;
        let before = hold.lease.ttl();
        hold.lease.set_ttl(ttl);
        let sent = Instant::now();
        match lease::renew(
            &*hold.backend,
            &hold.key,
            &hold.token,
            &hold.lease,
            sent,
            hold.replicas,
        )
        .await
        {
            Ok(Renewal::Renewed) => Ok(()),
            Ok(_) => Err(not_held()),
            Err(error) => {
                hold.lease.set_ttl(before);
                Err(error)
            }
        }
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

    /// Give the lock back, and learn how it ended ([`ReleaseOutcome`]).
    ///
    /// For a reentrant owner, only the release of its last guard deletes the lock; earlier
    /// ones just count down. [`ReleaseOutcome::Released`] when the lock was still ours: it
    /// held our token and was deleted (or, for a non-last reentrant guard, the lease is
    /// still held). [`ReleaseOutcome::Lost`] says why it was not: the lease had run out, or
    /// another holder has the key, and the work under this guard may have overlapped
    /// another holder's.
    ///
    /// # Errors
    /// [`Error::Redis`] (or the backend's own error) when it cannot be reached; the lease
    /// then frees the lock within one ttl (the watchdog has already stopped).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the guard's drop fallback releases the
    /// lock in a spawned task.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        if let Some(owner) = self.owner.take()
            && !owner.leave(&self.hold)
        {
            return Ok(self.hold.still());
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

    async fn release(self) -> Result<ReleaseOutcome> {
        LockGuard::release(self).await
    }
}

/// The acquisitions a reentrant [`Owner`](crate::Owner) holds, which its guards count
/// themselves out of.
pub(crate) struct OwnerTable<B: Backend> {
    /// Held keys. A std mutex: it is never held across an `.await`, and guards' `Drop` needs it.
    held: Mutex<HashMap<String, Entry<B>>>,
    /// Woken whenever the owner gains an acquisition, so that its tasks still waiting for
    /// that key (for a turn, between attempts, in a backend's line) re-enter at once.
    pub(crate) entered: Notify,
}

struct Entry<B: Backend> {
    hold: Arc<Hold<B>>,
    count: usize,
}

impl<B: Backend> OwnerTable<B> {
    pub(crate) fn new() -> Self {
        Self {
            held: Mutex::new(HashMap::new()),
            entered: Notify::new(),
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
        self.entered.notify_waiters();
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
