//! The crate's one error type.

use std::time::Duration;

/// `Result` with this crate's [`enum@Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking or giving back a lock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`try_acquire`](crate::Locker::try_acquire) found the lock held by another owner.
    #[error("lock {key:?} is held by another owner")]
    Held {
        /// The contended key.
        key: String,
    },

    /// [`acquire`](crate::Locker::acquire) did not get the lock before its deadline.
    #[error("gave up waiting for lock {key:?} after {waited:?}")]
    Timeout {
        /// The contended key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// Too few Redlock nodes answered to form a majority.
    #[error("lock {key:?}: only {reachable} Redis nodes reachable, a majority needs {needed}")]
    NoQuorum {
        /// The key.
        key: String,
        /// Nodes that answered.
        reachable: usize,
        /// The majority.
        needed: usize,
    },

    /// The caller no longer holds the lock it tried to act on (its lease ran out).
    #[error("lock {key:?} is no longer held by this guard")]
    NotHeld {
        /// The key.
        key: String,
    },

    /// Options that cannot work: refused by
    /// [`LockOptionsBuilder::build`](crate::LockOptionsBuilder::build), or by a backend
    /// that needs more room (see [`Locker::new`](crate::Locker::new)).
    #[error("invalid lock options: {0}")]
    InvalidOptions(String),

    /// The key cannot be used as a lock key: empty; on Redis, named like another lock's fence
    /// key or release channel, or unable to share its fence key's cluster slot; in the
    /// PostgreSQL table, too long or containing a NUL byte.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A fence at or above the largest one, 2^62 (`Fence::MAX`): nothing can follow it.
    #[error("fence {0} leaves no room for a larger one (the largest fence is 2^62)")]
    InvalidFence(u64),

    /// A fence this backend cannot go above: ZooKeeper's and etcd's fences are numbers the
    /// server assigns (a zxid, a revision), so `seen` came from elsewhere: another backend,
    /// or the same servers before they were rebuilt or restored (their numbering restarted).
    #[error("fence {seen} is above every fence this backend can hand out now ({next})")]
    FenceOutOfReach {
        /// The fence asked to go above.
        seen: u64,
        /// The largest fence the backend could give.
        next: u64,
    },

    /// A waiter's place in a backend's own line was lost before its turn came: its
    /// ZooKeeper session expired, or its etcd lease ran out, while it waited.
    #[error("lock {key:?}: the place in line was lost while waiting ({why})")]
    LostPlace {
        /// The key.
        key: String,
        /// What the backend said.
        why: &'static str,
    },

    /// The server cannot run this backend (the single-Redis lock needs Redis 7.0 or later:
    /// it takes the key with `SET ... NX PX ... GET`).
    #[error("{server} {version} cannot hold these locks: it needs {needed} or later")]
    UnsupportedServer {
        /// What was asked (`Redis at 127.0.0.1:6379`, say).
        server: String,
        /// The version it reported.
        version: String,
        /// The oldest version that works.
        needed: &'static str,
    },

    /// The backend does not do what was asked of it.
    #[error("this backend does not support {0}")]
    Unsupported(&'static str),

    /// An attempt's task ended without an answer: the backend panicked, or the runtime is
    /// shutting down. Whatever the attempt took is given back (or freed by its lease).
    #[error(
        "the attempt on lock {key:?} ended without an answer (a panic in the backend, or a runtime shutting down)"
    )]
    Aborted {
        /// The key.
        key: String,
    },

    /// The store could not be reached, or answered with an error: `backend` names it
    /// (`"redis"`, `"postgres"`, `"zookeeper"`, `"etcd"`, or a third-party backend's name)
    /// and `source` is its client's own error, which
    /// [`backend_source`](Error::backend_source) gives back typed.
    #[error("{backend}: {source}")]
    Backend {
        /// Which store.
        backend: &'static str,
        /// The store client's error.
        source: BoxError,
    },
}

/// A store client's error, as [`Error::Backend`] carries it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// An error of the store `backend` (for backends, the crate's own and third-party ones).
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// The store client's own error, when this is an [`Error::Backend`] holding an `E`
    /// (`redis::RedisError`, `sqlx::Error`, ...).
    pub fn backend_source<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::Backend { source, .. } => source.downcast_ref(),
            _ => None,
        }
    }

    /// As [`backend_source`](Self::backend_source), by value: the client's error, or this
    /// error back when it holds no `E`.
    ///
    /// # Errors
    /// `self`, unchanged, when it is not an [`Error::Backend`] holding an `E`.
    pub fn into_backend_source<E: std::error::Error + 'static>(self) -> Result<E, Self> {
        match self {
            Error::Backend { backend, source } => match source.downcast::<E>() {
                Ok(source) => Ok(*source),
                Err(source) => Err(Error::Backend { backend, source }),
            },
            other => Err(other),
        }
    }
}
