//! Reentrancy: an explicit owner identity that may take the same lock more than once.
//!
//! In async Rust a thread id says nothing about who holds a lock: a task moves between
//! threads at every `.await`, and one thread runs many unrelated tasks. So "the same owner"
//! here is a value, an [`Owner`], created with [`Locker::owner`] and passed (or cloned) to
//! the code that may re-enter. Its table of held keys lives in the process; the backend sees
//! one acquisition with one token and one fence, however many times the owner re-enters.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::Result;
use crate::guard::{LockGuard, OwnerTable};
use crate::locker::Locker;
use crate::options::LockOptions;

/// A lock owner that may re-enter the locks it holds.
///
/// Clones are the same owner. Acquiring a key the owner already holds (and has not lost)
/// succeeds at once and counts, also for a task of the owner that was already waiting for
/// the key when another task of the owner got it; each guard is released on its own, and the lock is deleted
/// when the count returns to zero. Do not share one owner between tasks that must exclude
/// each other: to the lock they are one holder.
///
/// ```no_run
/// # async fn run(locker: distlock::Locker<redis::aio::ConnectionManager>) -> distlock::Result<()> {
/// let owner = locker.owner();
/// let outer = owner.acquire("lock_account_7").await?;
/// let inner = owner.acquire("lock_account_7").await?; // at once: the same owner
/// assert_eq!(outer.hold_count(), 2);
/// assert_eq!(inner.fence(), outer.fence()); // one acquisition, one fence
/// inner.release().await?; // the lock stays
/// assert!(outer.release().await?.was_held()); // the count is zero: deleted
/// # Ok(()) }
/// ```
///
/// A non-reentrant caller does not need an `Owner`: every [`Locker::try_acquire`] and
/// [`Locker::acquire`] is its own owner.
///
/// Once the count reaches zero the lock is deleted; until that delete has landed, a new
/// `try_acquire` by the same owner sees it still held and gets [`Error::Held`]
/// (`acquire` simply waits for it), exactly as another owner would.
///
/// [`Error::Held`]: crate::Error::Held
pub struct Owner<B: Backend> {
    locker: Locker<B>,
    table: Arc<OwnerTable<B>>,
}

impl<B: Backend> Clone for Owner<B> {
    fn clone(&self) -> Self {
        Self {
            locker: self.locker.clone(),
            table: Arc::clone(&self.table),
        }
    }
}

impl<B: Backend> Locker<B> {
    /// A new owner identity, for locks that must be reentrant (see [`Owner`]).
    pub fn owner(&self) -> Owner<B> {
        Owner {
            locker: self.clone(),
            table: Arc::new(OwnerTable::new()),
        }
    }
}

impl<B: Backend> Owner<B> {
    /// Like [`Locker::try_acquire`], but re-enters a lock this owner already holds.
    ///
    /// # Errors
    /// As [`Locker::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_acquire`].
    pub async fn try_acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.try_acquire_with(key, self.locker.options()).await
    }

    /// Like [`Locker::try_acquire_with`], but re-enters a lock this owner already holds (the
    /// acquisition it shares keeps the options it was taken with).
    ///
    /// # Errors
    /// As [`Locker::try_acquire_with`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_acquire`].
    pub async fn try_acquire_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard<B>> {
        if let Some(guard) = self.table.reenter(key) {
            return Ok(guard);
        }
        self.locker.check_call(options)?;
        let hold = self.locker.try_acquire_hold(key, options).await?;
        Ok(self.table.enter(hold))
    }

    /// Like [`Locker::acquire`], but re-enters a lock this owner already holds.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`].
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<B>> {
        self.locker
            .wait_for(key, self.locker.options(), Some(&self.table))
            .await
    }

    /// Like [`Locker::acquire_with`], but re-enters a lock this owner already holds, at once,
    /// also while it waits: a task of this owner that gets the key lets every other task of
    /// the owner waiting for it in.
    ///
    /// # Errors
    /// As [`Locker::acquire_with`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`].
    pub async fn acquire_with(&self, key: &str, options: &LockOptions) -> Result<LockGuard<B>> {
        self.locker.check_call(options)?;
        self.locker.wait_for(key, options, Some(&self.table)).await
    }
}
