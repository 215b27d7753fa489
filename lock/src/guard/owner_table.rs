//! [`OwnerTable`]: the acquisitions a reentrant owner holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::backend::Backend;
use crate::guard::LockGuard;
use crate::guard::hold::Hold;

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
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
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
            .unwrap_or_else(PoisonError::into_inner)
            .insert(hold.key.clone(), entry);
        self.entered.notify_waiters();
        LockGuard::new(hold, Some(Arc::clone(self)))
    }

    /// Count one guard of `hold` out. Returns `true` when it was the last one, so the lock
    /// must now be released.
    pub(crate) fn leave(&self, hold: &Arc<Hold<B>>) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
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
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.get(&hold.key) {
            Some(entry) if Arc::ptr_eq(&entry.hold, hold) => entry.count,
            _ => 1,
        }
    }
}
