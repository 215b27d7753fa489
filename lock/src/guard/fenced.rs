//! [`FencedGuard`]: what code that writes under a lock needs, whichever backend holds it.

use crate::error::Result;
use crate::fence::Fence;
use crate::guard::ReleaseOutcome;

/// A held lock whose writes carry a fence: implemented by
/// [`LockGuard`](crate::LockGuard) for every backend, so code that writes under the lock can
/// be generic over how it was taken.
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
    /// Give the lock back, and say how it ended.
    fn release(self) -> impl Future<Output = Result<ReleaseOutcome>> + Send
    where
        Self: Sized;
}
