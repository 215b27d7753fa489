//! Reentrancy: an explicit owner identity that may take the same lock more than once.
//!
//! In async Rust a thread id says nothing about who holds a lock: a task moves between
//! threads at every `.await`, and one thread runs many unrelated tasks. So "the same owner"
//! here is a value, an [`Owner`], created with [`Locker::owner`] and passed (or cloned) to
//! the code that may re-enter. Its table of held keys lives in the process; Redis sees one
//! acquisition with one token and one fence, however many times the owner re-enters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionLike;

use crate::error::Result;
use crate::guard::{Hold, LockGuard};
use crate::locker::{Locker, wait_for};

/// A lock owner that may re-enter the locks it holds.
///
/// Clones are the same owner. Acquiring a key the owner already holds (and has not lost)
/// succeeds at once and counts; each guard is released on its own, and the key is deleted
/// when the count returns to zero. Do not share one owner between tasks that must exclude
/// each other: to the lock they are one holder.
///
/// A non-reentrant caller does not need an `Owner`: every [`Locker::try_acquire`] and
/// [`Locker::acquire`] is its own owner.
///
/// Once the count reaches zero the key is deleted in Redis; until that delete has landed, a
/// new `try_acquire` by the same owner sees the key still set and gets [`Error::Held`]
/// (`acquire` simply waits for it), exactly as another owner would.
///
/// [`Error::Held`]: crate::Error::Held
pub struct Owner<C: ConnectionLike + Clone + Send + Sync + 'static> {
    locker: Locker<C>,
    shared: Arc<OwnerShared<C>>,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Clone for Owner<C> {
    fn clone(&self) -> Self {
        Self {
            locker: self.locker.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Owner<C> {
    pub(crate) fn new(locker: Locker<C>) -> Self {
        Self {
            locker,
            shared: Arc::new(OwnerShared {
                held: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Like [`Locker::try_acquire`], but re-enters a lock this owner already holds.
    ///
    /// # Errors
    /// As [`Locker::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_acquire`].
    pub async fn try_acquire(&self, key: &str) -> Result<LockGuard<C>> {
        if let Some(guard) = self.reenter(key) {
            return Ok(guard);
        }
        let hold = self.locker.try_acquire_hold(key).await?;
        Ok(self.enter_new(hold))
    }

    /// Like [`Locker::acquire`], but re-enters a lock this owner already holds.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`].
    pub async fn acquire(&self, key: &str) -> Result<LockGuard<C>> {
        wait_for(self.locker.options(), key, || async {
            if let Some(guard) = self.reenter(key) {
                return Ok(Some(guard));
            }
            let hold = self.locker.attempt(key).await?;
            Ok(hold.map(|hold| self.enter_new(hold)))
        })
        .await
    }

    fn reenter(&self, key: &str) -> Option<LockGuard<C>> {
        let mut held = self.shared.held.lock().expect("owner table poisoned");
        let entry = held.get_mut(key)?;
        if !entry.hold.is_held() {
            return None;
        }
        entry.count += 1;
        Some(LockGuard {
            hold: Arc::clone(&entry.hold),
            owner: Some(Arc::clone(&self.shared)),
        })
    }

    fn enter_new(&self, hold: Hold<C>) -> LockGuard<C> {
        let hold = Arc::new(hold);
        let entry = Entry {
            hold: Arc::clone(&hold),
            count: 1,
        };
        // Replaces an entry whose lease was lost; its guards now count for nothing here.
        self.shared
            .held
            .lock()
            .expect("owner table poisoned")
            .insert(hold.key.clone(), entry);
        LockGuard {
            hold,
            owner: Some(Arc::clone(&self.shared)),
        }
    }
}

/// The part of an owner that its guards point back to.
pub(crate) struct OwnerShared<C: ConnectionLike + Clone + Send + Sync + 'static> {
    /// Held keys. A std mutex: it is never held across an `.await`, and guards' `Drop` needs it.
    held: Mutex<HashMap<String, Entry<C>>>,
}

struct Entry<C: ConnectionLike + Clone + Send + Sync + 'static> {
    hold: Arc<Hold<C>>,
    count: usize,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> OwnerShared<C> {
    /// Count one guard of `hold` out. Returns `true` when it was the last one, so the key
    /// must now be released.
    pub(crate) fn leave(&self, hold: &Arc<Hold<C>>) -> bool {
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

    pub(crate) fn count(&self, hold: &Arc<Hold<C>>) -> usize {
        let held = self.held.lock().expect("owner table poisoned");
        match held.get(&hold.key) {
            Some(entry) if Arc::ptr_eq(&entry.hold, hold) => entry.count,
            _ => 1,
        }
    }
}
