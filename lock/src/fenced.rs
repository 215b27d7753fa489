//! [`FencedGuard`]: what code that writes under a lock needs, whichever lock it holds.

use crate::error::Result;
use crate::guard::Fence;

/// A held lock whose writes carry a fence: implemented by [`LockGuard`](crate::LockGuard)
/// (one Redis) and [`RedlockGuard`](crate::RedlockGuard) (a majority of several), so the
/// code that writes under the lock need not know which it holds.
pub trait FencedGuard: Send + Sync {
    /// The locked key.
    fn key(&self) -> &str;
    /// The fence to send with every write.
    fn fence(&self) -> Fence;
    /// Whether the lease is still known to be ours.
    fn is_held(&self) -> bool;
    /// Lease renewals done so far.
    fn renewals(&self) -> u64;
    /// Take a fence above `seen`, only while still holding the lock.
    fn advance_fence(&self, seen: Fence) -> impl Future<Output = Result<Fence>> + Send;
    /// Give the lock back; `true` when it was still ours.
    fn release(self) -> impl Future<Output = Result<bool>> + Send
    where
        Self: Sized;
}
