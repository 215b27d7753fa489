//! Wake-on-release waiting within one process: a first-come, first-served turn per key, so
//! only one local task contends for a key at a time, and a local wake-up when a holder of
//! this process releases it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::futures::Notified;
use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use crate::signals::ReleaseSignals;

/// The subscription, and the local state of every key in use.
pub(crate) struct Waiting {
    signals: ReleaseSignals,
    keys: Mutex<HashMap<String, Arc<LocalKey>>>,
}

/// One key, as seen by the tasks of this process.
pub(crate) struct LocalKey {
    /// Held by the one local task contending for the key; given back when it gets the lock
    /// (or gives up), so a holder never keeps local waiters out of their turn.
    turn: Semaphore,
    /// Rung when a local holder's release has been sent: the contending task then tries at
    /// once, and on one multiplexed connection its attempt lands right after the release.
    released: Notify,
}

impl Waiting {
    pub(crate) fn new(signals: ReleaseSignals) -> Self {
        Self {
            signals,
            keys: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn signals(&self) -> &ReleaseSignals {
        &self.signals
    }

    /// The local state of `key`, created on first use.
    pub(crate) fn local_key(&self, key: &str) -> Arc<LocalKey> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget keys nobody here waits for or holds, so the table does not grow with every
        // key ever locked. A key is in use while someone other than the table holds it.
        keys.retain(|_, local| Arc::strong_count(local) > 1);
        Arc::clone(keys.entry(key.to_owned()).or_insert_with(|| {
            Arc::new(LocalKey {
                turn: Semaphore::new(1),
                released: Notify::new(),
            })
        }))
    }
}

impl LocalKey {
    /// Wait for this task's turn to contend for the key.
    pub(crate) async fn turn(&self) -> SemaphorePermit<'_> {
        self.turn
            .acquire()
            .await
            .expect("turn semaphores are never closed")
    }

    /// Resolves when a local holder's release has been sent (enable it before the attempt).
    pub(crate) fn released(&self) -> Notified<'_> {
        self.released.notified()
    }

    /// A local holder's release has been sent: wake the contending task.
    pub(crate) fn ring(&self) {
        self.released.notify_waiters();
    }
}
