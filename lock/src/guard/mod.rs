//! The guard a holder keeps while it works ([`LockGuard`]), and what sits beside it:
//! `outcome` ([`ReleaseOutcome`], how a release ended), `hold` (the state of one acquisition,
//! its release and the drop fallback), `owner_table` (a reentrant owner's acquisitions) and
//! `fenced` ([`FencedGuard`], the guard as code that writes under a lock sees it).

mod fenced;
mod hold;
mod outcome;
mod owner_table;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Renewal};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::lease::{self, LockLost};
use crate::options::LockOptions;
use crate::token::Token;

pub use fenced::FencedGuard;
pub(crate) use hold::{Hold, release_in_background};
pub use outcome::ReleaseOutcome;
pub(crate) use owner_table::OwnerTable;

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
    /// it); [`Error::Backend`] when it cannot be reached, or refuses (a fence counter that
    /// holds no count; on Redlock, the first master's refusal, when the masters that refused
    /// would have made a majority with those that answered a fence);
    /// [`Error::NoQuorum`] (Redlock) when too few masters answer.
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
    /// [`Error::Backend`] when it cannot be reached (the lease
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
    /// [`Error::Backend`] when it cannot be reached; the lease
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
