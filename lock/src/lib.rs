//! `distlock`: an async distributed lock that is clear about what it guarantees.
//!
//! # Reading the source: one acquire and one release
//! Read in this order, following `Locker::acquire` on one Redis and `LockGuard::release`:
//! 1. `locker/mod.rs`: [`Locker`], its public calls; `acquire` goes to `wait_for`.
//! 2. `locker/wait.rs`: the wait as steps. `wait_for` re-enters a key the owner holds, takes
//!    this process's turn for the key (`waiting.rs`, with release signals), then asks the
//!    backend's [`Protocol`](backend::Protocol): `poll_until_free` (one attempt, then a pause
//!    a release announcement cuts short, `signals.rs`) or `wait_in_line` (ZooKeeper, etcd).
//! 3. `locker/attempt.rs`: one attempt in a task of its own, and the hold it becomes: the
//!    lease (`lease.rs`) and the watchdog, put in the locker's timetable to start if the
//!    hold lasts until shortly before its first renewal (`watchdog.rs`).
//! 4. `backend.rs`: the [`Backend`] trait, the steps a store runs; then one store:
//!    `redis/mod.rs` with its Lua in `redis/scripts.rs` and its key names in `redis/keys.rs`.
//! 5. `guard/mod.rs`: [`LockGuard`]; its `release` goes to `guard/hold.rs`, which takes the
//!    watchdog out of the timetable (or stops it, if it started), runs the backend's
//!    `unlock` and says how the lock ended (`guard/outcome.rs`); dropped unreleased,
//!    `hold.rs` releases in the background.
//!
//! Then, as needed: `fence.rs` ([`Fence`]), `owner.rs` and `guard/owner_table.rs`
//! (reentrancy), `options.rs`, `error.rs`, and the other stores: `redlock.rs`,
//! `sentinel.rs`, `postgres.rs`, and the `zookeeper` and `etcd` modules (each a folder:
//! the handle and its builder, the session or the members, the line, the reaper or the
//! leases).
//!
//! # Why a distributed lock
//! A mutex protects memory inside one process. When several processes on several machines
//! sell the same stock, they need a lock that lives outside all of them: a Redis key, or a
//! row in a database table. A good lock has six properties: mutual exclusion, availability,
//! speed, reentrancy, expiry (a crashed holder cannot block everyone forever) and a
//! non-blocking try.
//!
//! # The three classic mistakes, and what this crate does instead
//! 1. **`SETNX` then `EXPIRE` is not atomic.** A holder that dies between the two commands
//!    leaves a key without a TTL: a lock nobody can ever take again. Here the key is set
//!    with one `SET key token NX PX ttl`, so it never exists without a TTL.
//! 2. **`DEL` removes someone else's lock.** A holder whose lease ran out, then deletes "its"
//!    key, deletes the next holder's lock. Here the key holds a random 128-bit token, new for
//!    every acquisition, and release is a Lua compare-and-delete: only the token's holder
//!    can delete the key ([`LockGuard::release`] says whether it was still ours:
//!    [`ReleaseOutcome`]).
//! 3. **The work outlives the lease.** Here a watchdog renews the lease (a Lua
//!    compare-and-pexpire) every `ttl / 3` while the guard lives, and tells the holder when
//!    renewal fails ([`LockGuard::is_held`], [`LockGuard::lost`]). Renewal cannot help a
//!    process that is paused longer than the lease; for that, every acquisition carries a
//!    [`Fence`], a number that only grows, which the store checks to refuse stale writes.
//!
//! # Backends
//! A [`Backend`] runs single atomic steps (take, renew, release, advance the fence), each
//! checked by token; everything else is written once, above it. Each store is a module:
//! - [`redis`]: **one Redis** (7.0 or later), any [`ConnectionLike`](::redis::aio::ConnectionLike),
//!   such as a [`ConnectionManager`](::redis::aio::ConnectionManager) or a Redis Cluster
//!   connection.
//! - `sentinel` (feature `sentinel`): a `SentinelConnection` that follows the primary
//!   through failovers, for the single-Redis lock.
//! - [`redlock`]: a majority of independent Redis masters ([`Redlock`]).
//! - `postgres` (feature `postgres`): the classic database design, a lock table with a
//!   unique name per lock (`PgLockTable`).
//! - `zookeeper` (feature `zookeeper`): the classic ZooKeeper design, ephemeral sequential
//!   nodes, each waiter watching the one before it; the session is the lease and the fence
//!   is a zxid (`ZkLock`).
//! - `etcd` (feature `etcd`): keys on a lease in create-revision order, each waiter watching
//!   the one before it; the fence is the create revision (`EtcdLock`). Feature `etcd-tls`
//!   adds `https://` endpoints.
//!
//! A store of your own implements [`backend::Backend`] (see that module).
//!
//! # Layout
//! - `locker/`: [`Locker`]; `attempt` (one attempt, the hold) and `wait` (the bounded wait).
//!   `waiting`: the local turns; `signals`: the pub/sub subscription [`ReleaseSignals`].
//! - `guard/`: [`LockGuard`]; `hold` (one acquisition, its release, the drop fallback),
//!   `outcome` ([`ReleaseOutcome`]), `owner_table`, `fenced` ([`FencedGuard`]).
//! - `lease`: what the holder knows of its lease, one renewal, and the lost signal
//!   ([`LockLost`]); `watchdog`: the task that renews a hold that lasts, started from a
//!   timetable shortly before the first renewal is due (a short hold starts none).
//! - `owner`: [`Owner`], the explicit identity behind reentrancy.
//! - `backend`: the [`Backend`] trait and what its steps answer. The stores: `redis/`,
//!   `sentinel`, `redlock`, `postgres`, `zookeeper`, `etcd`; `keys`: the key checks of the
//!   stores that name a lock after its key.
//! - Leaves: `fence` ([`Fence`]), `options` ([`LockOptions`]), `token`, `retry` (backoff and
//!   deadlines), `error` ([`enum@Error`]).
//!
//! Dependencies point one way, with no cycle: `owner` → `locker` → `guard` → `watchdog` →
//! `lease` → `backend` → `fence`; the stores know nothing of lockers and guards, and the
//! guard nothing of the locker. The wait names one store module, `redis`, for a key's
//! release channel (release signals are Redis pub/sub).
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use distlock::{LockOptions, Locker};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let conn = redis::aio::ConnectionManager::new(client).await?;
//! let options = LockOptions::builder()
//!     .ttl(Duration::from_secs(5))
//!     .wait_timeout(Duration::from_millis(500))
//!     .build()?;
//! let locker = Locker::connect(conn, options).await?; // checks the server is Redis 7+
//!
//! let guard = locker.acquire("lock_sale_1").await?;
//! // ... read, check and write, sending guard.fence() with each write ...
//! assert!(guard.is_held());
//! let outcome = guard.release().await?;
//! assert!(outcome.was_held(), "the lease ran out: {outcome}");
//! # Ok(()) }
//! ```
//!
//! # Waiting
//! [`Locker::acquire`] retries with jittered backoff. With
//! [`Locker::with_release_signals`], waiters instead sleep until the holder's release is
//! announced on a Redis channel (one subscription per process, [`ReleaseSignals`]), with a
//! short backstop in case a message is lost, and waiters in one process take turns.
//!
//! # Redis Cluster
//! [`Locker`] is generic over the connection, so a `redis::cluster_async::ClusterConnection`
//! works as is. Every script touches only the lock key and its fence key, and
//! [`redis::fence_key`] names the fence so that it hashes to the lock key's slot: each lock lives on
//! one node. (Tested against a real three-master cluster in `tests/cluster.rs`.) Waiters
//! through a cluster connection poll.
//!
//! # Releasing
//! Release explicitly with `guard.release().await`: it is the only way to learn whether the
//! lock was still yours. A guard dropped unreleased (an early return, a panic, a cancelled
//! request) stops its watchdog at once and releases the lock in a spawned task, when a tokio
//! runtime is running. Drop never blocks; outside a runtime the lease frees it within one ttl.
//!
//! # Timing assumptions
//! The lock is safe while these hold; each place in the code that depends on them says so
//! in a `TIMING:` comment.
//! - The holder's local deadline is counted from when it *sent* the acquire or renew command,
//!   so it expires before the backend's own expiry, provided clocks advance at the same rate.
//! - A holder paused (stop-the-world, SIGSTOP, swapped out) for longer than what is left of
//!   its lease may wake up believing it still holds the lock. No lock can prevent that; the
//!   [`Fence`] lets the store refuse its writes.
//! - A Redis that loses data (restart without persistence, eviction, failover to a lagging
//!   replica) can hand the lock to two holders. It does not break fencing: every
//!   acquisition's fence is `max(counter + 1, the Redis host's clock in microseconds)`, so a
//!   counter that was lost or came back behind still hands out fences above every one issued
//!   before, **as long as that clock does not step back** (and one key is taken less than
//!   once per microsecond). [`Redlock`] across several masters reduces the first risk; see
//!   Martin Kleppmann's critique of its timing assumptions before relying on it for
//!   correctness rather than efficiency.
//! - Expiry is wall-clock time on the server: Redis keeps a key's expiry as an absolute Unix
//!   time, and the lock table compares `clock_timestamp()`. A server clock that steps
//!   *forward* (an NTP correction, a VM resumed) expires leases early, while their holders,
//!   counting on their own monotonic clocks, still see [`LockGuard::is_held`] as `true`. Run
//!   the servers with a clock that slews rather than steps; the fence still refuses a holder
//!   whose lock was taken over.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod fence;
mod guard;
#[cfg(any(feature = "postgres", feature = "zookeeper", feature = "etcd"))]
mod keys;
mod lease;
mod locker;
mod options;
mod owner;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod redis;
pub mod redlock;
mod retry;
#[cfg(feature = "sentinel")]
pub mod sentinel;
mod signals;
mod token;
mod waiting;
mod watchdog;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use backend::{Backend, LockState};
pub use error::{BoxError, Error, Result};
#[cfg(feature = "etcd")]
pub use etcd::EtcdLock;
pub use fence::Fence;
pub use guard::{FencedGuard, LockGuard, ReleaseOutcome};
pub use lease::LockLost;
pub use locker::{Locker, Ran};
pub use options::{LockOptions, LockOptionsBuilder};
pub use owner::Owner;
#[cfg(feature = "postgres")]
pub use postgres::PgLockTable;
pub use redlock::Redlock;
#[cfg(feature = "sentinel")]
pub use sentinel::SentinelConnection;
pub use signals::ReleaseSignals;
#[cfg(feature = "zookeeper")]
pub use zookeeper::ZkLock;
