//! The guard a holder keeps while it works, and the lock state behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::aio::ConnectionLike;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::keys::fence_key;
use crate::lease::{self, Lease, LockLost};
use crate::owner::OwnerShared;
use crate::scripts::{ADVANCE_FENCE, RELEASE};

/// A fencing token: a number that grows with every successful acquisition of one key.
///
/// A lease can run out while its holder still believes it holds the lock (a long pause, a
/// slow network). The lock cannot stop that holder from writing afterwards; the store it writes
/// to can. Send the fence with every write made under the lock, and have the store refuse any
/// write whose fence is lower than the highest one it has already accepted for that resource,
/// for example in SQL:
///
/// ```sql
/// UPDATE products SET stock = $1, fence = $2 WHERE id = $3 AND fence < $2
/// ```
///
/// Zero rows updated means a newer holder has written: the stale holder must stop.
///
/// For a read-modify-write, claim before reading: set the fence and read the row in one
/// statement inside the transaction (`UPDATE ... SET fence = $f WHERE id = $id AND fence < $f
/// RETURNING stock`), so that the value read is the one after every write with a lower fence,
/// and the row stays locked until commit.
///
/// The counter is a Redis key without a TTL (`{key}:fence`, see [`fence_key`](crate::fence_key)).
/// A Redis that loses its data (no persistence, a failover to a replica that had not yet
/// received the last INCR) restarts the counter from 1, below fences that stores have already
/// seen. A store that refuses a holder's fence cannot tell that case from a stale holder by
/// itself; the holder can, with [`LockGuard::advance_fence`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl Fence {
    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One acquisition of one key: shared by every guard of a reentrant owner.
pub(crate) struct Hold<C: ConnectionLike + Clone + Send + Sync + 'static> {
    /// A clone of the locker's connection, for the release script.
    pub(crate) conn: C,
    pub(crate) key: String,
    /// The random value stored in the key; only its holder can renew or delete the key.
    pub(crate) token: String,
    /// The current fence; raised by `advance_fence`.
    pub(crate) fence: AtomicU64,
    /// Written by the watchdog; read by `is_held` and `lost`.
    pub(crate) lease: Arc<Lease>,
    /// Aborted before release: no renewal after unlock.
    pub(crate) watchdog: Option<JoinHandle<()>>,
    /// Set once Redis has answered the release script, so `Drop` need not release again.
    pub(crate) released: AtomicBool,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Hold<C> {
    fn stop_watchdog(&self) {
        if let Some(watchdog) = &self.watchdog {
            watchdog.abort();
        }
    }

    /// Stop renewing, then delete the key if it still holds our token.
    pub(crate) async fn release(&self) -> Result<bool> {
        self.stop_watchdog();
        let deleted: i64 = RELEASE
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        self.released.store(true, Ordering::Release);
        Ok(deleted == 1)
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lease.is_held()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for Hold<C> {
    /// The fallback for a guard dropped without `release` (an early return, a `?`, a panic,
    /// a cancelled future): stop the watchdog and release in a spawned task. Outside a tokio
    /// runtime nothing can be spawned; the lease then frees the key within one ttl.
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released.load(Ordering::Acquire) {
            return;
        }
        let key = std::mem::take(&mut self.key);
        let token = std::mem::take(&mut self.token);
        release_in_background(&self.conn, key, token);
    }
}

/// Delete `key` if it still holds `token`, in a task spawned on the current tokio runtime:
/// the release of every `Drop` that cannot await. Outside a runtime nothing can be spawned,
/// and the lease frees the key within one ttl.
pub(crate) fn release_in_background<C>(conn: &C, key: String, token: String)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%key, "lock dropped outside a tokio runtime; the lease will free it");
        return;
    };
    let mut conn = conn.clone();
    runtime.spawn(async move {
        let released: redis::RedisResult<i64> =
            RELEASE.key(&key).arg(&token).invoke_async(&mut conn).await;
        match released {
            Ok(_) => tracing::debug!(%key, "released a dropped lock"),
            Err(error) => {
                tracing::warn!(%key, %error, "could not release a dropped lock; the lease will free it")
            }
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
pub struct LockGuard<C: ConnectionLike + Clone + Send + Sync + 'static> {
    pub(crate) hold: Arc<Hold<C>>,
    /// The reentrant owner whose hold count this guard is part of, until it leaves.
    pub(crate) owner: Option<Arc<OwnerShared<C>>>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> LockGuard<C> {
    /// The locked key.
    pub fn key(&self) -> &str {
        &self.hold.key
    }

    /// The fence of this acquisition (shared by all reentrant guards of it).
    pub fn fence(&self) -> Fence {
        Fence(self.hold.fence.load(Ordering::Acquire))
    }

    /// Take a new fence above `seen`, the highest fence a store reports having accepted,
    /// if and only if this guard still holds the lock.
    ///
    /// A store that refuses our fence means one of two things. Either a newer holder has
    /// written (our lease ran out: we are stale and must stop), or Redis lost the counter
    /// (a restart without persistence) and now hands out fences below what the store has
    /// seen. The script tells them apart atomically: only the key's current token holder
    /// gets a new fence, which is above `seen` and above every fence issued before. A stale
    /// holder gets [`Error::NotHeld`].
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the key no longer holds this guard's token;
    /// [`Error::Redis`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the counter may have been raised, which only ever
    /// invalidates older fences.
    pub async fn advance_fence(&self, seen: Fence) -> Result<Fence> {
        let fence: u64 = ADVANCE_FENCE
            .key(&self.hold.key)
            .key(fence_key(&self.hold.key)?)
            .arg(&self.hold.token)
            .arg(seen.get())
            .invoke_async(&mut self.hold.conn.clone())
            .await?;
        if fence == 0 {
            return Err(Error::NotHeld {
                key: self.hold.key.clone(),
            });
        }
        self.hold.fence.fetch_max(fence, Ordering::AcqRel);
        Ok(Fence(fence))
    }

    /// The random token stored in the key.
    pub fn token(&self) -> &str {
        &self.hold.token
    }

    /// `true` while the lease is known to be ours: renewed in time and not seen lost.
    ///
    /// A `true` is a belief, not a promise: the lease can run out a moment later (see the
    /// crate docs on timing). Fence the writes that matter.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves when the lock is lost: the watchdog found the key gone or taken, or the
    /// lease ran out without a successful renewal. Never resolves while the lease is renewed.
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
    /// For a reentrant owner, only the release of its last guard deletes the key; earlier
    /// ones just count down. Returns `true` when the lock was still ours: the key held our
    /// token and was deleted (or, for a non-last reentrant guard, the lease is still held).
    /// `false` means the lease had run out and the work under this guard may have overlapped
    /// with another holder's.
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) when Redis cannot be reached; the lease then frees
    /// the key within one ttl (the watchdog has already stopped).
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the guard's drop fallback releases the
    /// lock in a spawned task.
    pub async fn release(mut self) -> Result<bool> {
        if let Some(owner) = self.owner.take()
            && !owner.leave(&self.hold)
        {
            return Ok(self.hold.is_held());
        }
        self.hold.release().await
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Drop for LockGuard<C> {
    fn drop(&mut self) {
        // The key itself is released by `Hold::drop` once the last guard is gone.
        if let Some(owner) = self.owner.take() {
            owner.leave(&self.hold);
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> std::fmt::Debug for LockGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("fence", &self.fence())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> crate::fenced::FencedGuard
    for LockGuard<C>
{
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
