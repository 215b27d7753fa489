//! The classic ZooKeeper lock recipe (feature `zookeeper`).
//!
//! The standard recipe (Apache Curator's `InterProcessMutex` follows it too):
//! - each contender creates an **ephemeral sequential** node under the lock's node,
//!   `/distlock/<key>/<token>-<sequence>`; the lowest sequence holds the lock;
//! - every other contender watches only the node just before its own, so a release wakes
//!   exactly one waiter (no herd) and the lock is granted in the order the nodes were
//!   created, whichever process created them;
//! - the node is ephemeral: it lives no longer than the ZooKeeper **session** that created
//!   it. The client library keeps the session alive with heartbeats; a session that expires
//!   (a holder paused or cut off for longer than the session timeout) takes its nodes with
//!   it, and the next waiter's watch fires.
//!
//! How it maps onto [`Backend`]:
//! - the token is the first part of the node's name, so a `create` whose reply was lost
//!   is found again by listing the children (after a `sync`, so that the listing is not
//!   older than the create), and a retried step finds its own node;
//! - the **fence** is the holder node's creation zxid (`czxid`). ZooKeeper's zxids grow
//!   with every write to the ensemble, across leader elections (the epoch is in the high
//!   32 bits) and across a lock node deleted and created again (the sequence suffix starts
//!   over then; the zxid does not). Nodes are granted in creation order, so each holder's
//!   fence is above every earlier holder's;
//! - **a turn and a renewal are proved by a write**: a one-operation transaction that checks
//!   our node exists, sent on the node's own session. Writes go through the ensemble's
//!   leader, which refuses a request of a session it has expired, so an answer proves the
//!   session alive there, and the ensemble keeps it at least one session timeout longer;
//!   the node's stat, read after it on the same session, must name that session as its
//!   owner. (A plain read would not do: a follower that lags may answer it for a session
//!   the leader has already expired.) The options' ttl must not be longer than half the
//!   session timeout (checked; [`ZkLock::max_ttl`] says why);
//! - **the lease of each lock is kept here too.** The session outlives any one lock: the
//!   client keeps it alive while the process runs, whether or not a guard still renews. So
//!   this handle keeps, for every node it made, the instant until which its holder may
//!   count on it (one ttl after the last turn or renewal was answered), and a background
//!   task (the reaper) deletes the node once that has passed without a renewal or a
//!   release: a lock taken without a watchdog runs out after its ttl as on Redis, and a
//!   guard told its lock is lost (the ensemble unreachable until its lease ran out) cannot
//!   go on blocking everyone if the ensemble comes back with its session. The reaper retries
//!   until the ensemble answers; a release that failed is retried by it too;
//! - **lost**: the node is gone (its session expired, the reaper or an operator deleted it):
//!   a renewal says `Gone`, or `Taken` once another node heads the line; the guard's lease
//!   then runs out as for Redis;
//! - every request is bounded by the builder's
//!   [`request_timeout`](ZkLockBuilder::request_timeout): the client holds requests while it
//!   looks for a server, for as long as the session may live;
//! - the lock's node is a **container** node: ZooKeeper deletes it by itself once it has
//!   no children, so keys that are no longer used leave nothing behind.
//!
//! When a session ends the client cannot be used again; the next step opens a new session
//! (a new ZooKeeper client) and goes on with it. Nodes of the old session are gone with it,
//! so every guard taken under it reports its lock lost.
//!
//! Limits: the sequence suffix is a 32-bit counter per lock node, which wraps; the line is
//! read on a circle (it starts after the widest gap between two contenders), which is right
//! as long as the contenders of one lock span less than half the circle: fewer than 2^31
//! creates and deletes between the oldest waiter's and the newest's. And the line is fair
//! to the dead: a contender whose process dies without closing its session (SIGKILL, a
//! machine lost) keeps its place until the ensemble expires that session, so whoever
//! queues behind it waits up to a session timeout, even if the dead one never held the
//! lock. Nothing can tell a dead session from a slow one sooner (that is what the timeout
//! is); a shorter session timeout shortens the wait.
//!
//! ## Where things are
//!
//! For one acquire and one release, read in this order:
//! - `mod.rs` (here): [`ZkLock`], its builder, and the [`Backend`] it implements, each step
//!   handed to the modules below;
//! - `line.rs`: join the line, wait for a turn, prove it, leave it (what Curator's
//!   `attemptLock` and `internalLockLoop` do);
//! - `contenders.rs`: a lock node's children put in line (the sequence read on a circle);
//! - `session.rs`: open a session (its connection timeout a tenth of the session granted),
//!   replace it when it ends, bound every request; the longest ttl the session allows;
//! - `claims.rs`: the nodes this handle made, or may have made, and until when each holder
//!   counts on its node (at most `MAX_CLAIMS`, 1,024, of them);
//! - `reaper.rs`: the task that deletes the nodes whose lease ran out, holders first, one
//!   listing per key, and costs one request timeout per pass while the ensemble is away;
//! - `names.rs`: the node names and roots ZooKeeper accepts.
//!
//! `line` and `reaper` use `session`, `claims` and `contenders`, which use none of the
//! others; `reaper` also lists and deletes with `line`'s steps; nothing below `mod.rs` uses
//! `reaper` (the handle starts it).

mod claims;
mod contenders;
mod line;
mod names;
mod reaper;
mod session;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use zookeeper_client as zk;

use self::claims::Claim;
use self::contenders::{fence_of, is_own};
use self::names::{node_name_problem, root_problem};
use self::reaper::reap;
use self::session::RETRY_AFTER;
use self::session::Session;
use crate::backend::{Attempt, Backend, LockState, Protocol, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::keys;
use crate::options::LockOptions;
use crate::token::Token;

/// Where lock nodes live unless [`ZkLockBuilder::root`] says otherwise.
pub const DEFAULT_ROOT: &str = "/distlock";

/// The longest key, in bytes (ZooKeeper limits a node's path, not a name; keep names short).
const MAX_KEY_BYTES: usize = 512;

/// Locks in ZooKeeper: a [`Backend`] that keeps its own line of waiters. Cheap to clone
/// (clones share the session and the leases of the locks taken through it).
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::{LockOptions, Locker, ZkLock};
///
/// # async fn run() -> anyhow::Result<()> {
/// let zk = ZkLock::builder("127.0.0.1:2181")
///     .session_timeout(Duration::from_secs(10))
///     .connect()
///     .await?;
/// let options = LockOptions::builder().ttl(Duration::from_secs(5)).build()?;
/// let locker = Locker::new(zk, options)?; // ttl at most half the session timeout
/// let guard = locker.acquire("lock_sale_1").await?;
/// // ... write with guard.fence() ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLock {
    inner: Arc<Inner>,
}

struct Inner {
    /// The connect string, kept to open a new session when the old one expires.
    cluster: String,
    /// The session timeout asked for (the server may grant another).
    asked_timeout: Duration,
    /// The builder's connection timeout; `None`: a tenth of the session granted.
    connection_timeout: Option<Duration>,
    /// The longest any one request may take (the client holds requests while disconnected).
    request_timeout: Duration,
    /// The parent of every lock node.
    root: String,
    /// The current session. Replaced, never mended, when it ends.
    session: Mutex<Session>,
    /// One new session at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// Watches that fired for waiters here because the node before them went away: how the
    /// no-herd property is observed.
    wake_ups: AtomicU64,
    /// Every contender node this handle made, or may have made, and has not yet seen
    /// deleted, by token.
    claims: Mutex<HashMap<String, Claim>>,
    /// Wakes the reaper: a claim fell due sooner than it planned, or the handle is gone.
    reap_now: Arc<Notify>,
    /// Whether the reaper task has been started.
    reaper_started: AtomicBool,
    /// The runtime the handle was made on: new sessions (whose client runs its connection
    /// on the runtime that opens it) and the reaper run there, not on whichever runtime a
    /// caller happens to be on (an HTTP worker's, a short-lived one).
    runtime: tokio::runtime::Handle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The reaper holds only a weak reference; woken, it finds the handle gone and ends.
        self.reap_now.notify_one();
    }
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLock")
            .field("cluster", &self.inner.cluster)
            .field("root", &self.inner.root)
            .field("session_timeout", &self.session_timeout())
            .finish_non_exhaustive()
    }
}

/// Settings for [`ZkLock`]: the ensemble, the session timeout, the request timeout and the
/// root node.
#[derive(Debug, Clone)]
pub struct ZkLockBuilder {
    cluster: String,
    session_timeout: Duration,
    request_timeout: Duration,
    /// `None`: a tenth of the session timeout the server grants.
    connection_timeout: Option<Duration>,
    root: String,
}

impl ZkLockBuilder {
    /// How long the ensemble keeps the session (and with it every lock node it created)
    /// once it stops hearing from this client; a lock's ttl may be at most half of it
    /// ([`ZkLock::max_ttl`]). The server bounds it to its
    /// `minSessionTimeout`..`maxSessionTimeout` (by default 2 to 20 ticks). Default 10 s.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long a connection to a server may go without an answer before the client takes
    /// it as lost and moves the session to another server (which it may pick again: two
    /// tries may be needed). Default: a tenth of the session timeout the server grants.
    ///
    // TIMING: a server that hangs (stopped, not dead: its connections stay up) holds every
    // request of the sessions on it until the client gives up on the connection. A lock's
    // renewal then lands only after that and a reconnection, within what is left of its lease
    // (two thirds of a ttl of at most half the session, a third of the session): a tenth of
    // the session leaves room for a second try at a server that hangs too. zookeeper-client's
    // own default, 0.4 of the session, does not (a lock was lost in 9 runs of 20).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = Some(timeout);
        self
    }

    /// The longest one request to the ensemble may take before the step that sent it fails
    /// with a time-out (the client holds requests while it looks for a server that
    /// answers, which with no quorum could be as long as the session lives). Default 5 s.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The node under which lock nodes are created (default [`DEFAULT_ROOT`]): an absolute
    /// path such as `/locks/sale` that ZooKeeper accepts (no empty, `.` or `..` part, no
    /// character ZooKeeper refuses, not under `/zookeeper`). Created if missing.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Open the session.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a root ZooKeeper would refuse, or a zero request
    /// timeout; [`Error::Backend`] when no session can be opened.
    pub async fn connect(self) -> Result<ZkLock> {
        let root = self.root.trim_end_matches('/').to_owned();
        if let Some(why) = root_problem(&root) {
            return Err(Error::InvalidOptions(format!(
                "the ZooKeeper root {:?} is not a node path ZooKeeper accepts: {why}",
                self.root
            )));
        }
        if self.request_timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "the ZooKeeper request timeout is zero: no request could be answered".into(),
            ));
        }
        if self
            .connection_timeout
            .unwrap_or(self.session_timeout / 10)
            .is_zero()
        {
            return Err(Error::InvalidOptions(
                "the ZooKeeper connection timeout is zero: no server could ever answer in time"
                    .into(),
            ));
        }
        let session =
            Session::open(&self.cluster, self.session_timeout, self.connection_timeout).await?;
        Ok(ZkLock {
            inner: Arc::new(Inner {
                cluster: self.cluster,
                asked_timeout: self.session_timeout,
                connection_timeout: self.connection_timeout,
                request_timeout: self.request_timeout,
                root,
                session: Mutex::new(session),
                reconnecting: tokio::sync::Mutex::new(()),
                wake_ups: AtomicU64::new(0),
                claims: Mutex::new(HashMap::new()),
                reap_now: Arc::new(Notify::new()),
                reaper_started: AtomicBool::new(false),
                runtime: tokio::runtime::Handle::current(),
            }),
        })
    }
}

impl ZkLock {
    /// Settings for a lock on the ensemble `cluster` (`host:port,host:port,...`).
    pub fn builder(cluster: impl Into<String>) -> ZkLockBuilder {
        ZkLockBuilder {
            cluster: cluster.into(),
            session_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connection_timeout: None,
            root: DEFAULT_ROOT.to_owned(),
        }
    }

    /// Open a session on `cluster` with the default settings.
    ///
    /// # Errors
    /// [`Error::Backend`] when no session can be opened.
    pub async fn connect(cluster: impl Into<String>) -> Result<Self> {
        Self::builder(cluster).connect().await
    }

    /// The connect string sessions are opened with.
    pub fn connect_string(&self) -> &str {
        &self.inner.cluster
    }

    /// The session timeout the server granted for the current session.
    pub fn session_timeout(&self) -> Duration {
        self.current().session_timeout()
    }

    /// How long a connection of the current session may go without an answer before the
    /// client moves the session to another server: the builder's
    /// [`connection_timeout`](ZkLockBuilder::connection_timeout), or a tenth of the session
    /// (of the smaller of the one asked for and the one granted).
    pub fn connection_timeout(&self) -> Duration {
        self.session().connection_timeout
    }

    /// The ZooKeeper client of the current session, to use the session for other things
    /// (or, in a test, to end it as an expiry would).
    pub fn zookeeper(&self) -> zk::Client {
        self.current()
    }

    /// How many times a watch woke a waiter of this client because the node before it went
    /// away. With the recipe's one watch per waiter, a release wakes one waiter in all.
    pub fn wake_ups(&self) -> u64 {
        self.inner.wake_ups.load(Ordering::Relaxed)
    }

    /// How many contender nodes this handle made, or may have made, and has not yet seen
    /// deleted: its waiters' and holders' nodes, and those its reaper is still to delete or
    /// look for.
    pub fn unreaped(&self) -> usize {
        self.claims().len()
    }

    fn lock_node(&self, key: &str) -> String {
        format!("{}/{key}", self.inner.root)
    }

    /// Start the reaper, once, on the handle's own runtime.
    fn start_reaper(&self) {
        if self
            .inner
            .reaper_started
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.inner.runtime.spawn(reap(
                Arc::downgrade(&self.inner),
                Arc::clone(&self.inner.reap_now),
            ));
        }
    }
}

impl Backend for ZkLock {
    fn check_key(&self, key: &str) -> Result<()> {
        keys::check_name(
            key,
            MAX_KEY_BYTES,
            "the key is longer than 512 bytes",
            node_name_problem,
        )
    }

    fn check_options(&self, options: &LockOptions) -> Result<()> {
        if options.wait_for_replicas().is_some() {
            return Err(Error::InvalidOptions(
                "ZooKeeper replicates every write to a quorum before it answers; there are no replicas to wait for (wait_for_replicas)".into(),
            ));
        }
        self.check_ttl(options.ttl())
    }

    fn protocol(&self) -> Protocol {
        Protocol::Queue
    }

    /// Create our node, then look at the line: the head holds; anyone else gives its node
    /// back at once.
    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        self.attempt(key, token, ttl).await
    }

    /// Create our node, then until it heads the line: watch the node just before it, and
    /// look again when that one goes. Not run again on a new session once our node is made:
    /// a new node would stand at the back of the line.
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        self.wait_in_line(key, token, ttl).await
    }

    /// TIMING: see `prove`: an answer proves the session alive at the leader
    /// when it was sent, and the ensemble keeps it one session timeout (at least the ttl)
    /// after that.
    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        self.renew_turn(key, token, ttl).await
    }
    /// Delete our nodes. If the ensemble cannot be reached, the reaper goes on trying.
    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        let unlocked = self
            .on_session(|client| async move { self.delete_own(&client, key, token).await })
            .await;
        match &unlocked {
            Ok(_) => self.swept(token.as_str()),
            Err(_) => self.reap_after(token, RETRY_AFTER),
        }
        unlocked
    }

    /// ZooKeeper's fences cannot be set back (a zxid only grows), so a holder's fence is
    /// already above every earlier one: this proves that we still hold the lock (as
    /// [`renew`](Backend::renew) does) and answers our own fence, or refuses a `seen` at or
    /// above it, which cannot have come from this ensemble while it keeps its data
    /// ([`Error::FenceOutOfReach`]: another backend's fence, or this ensemble's before it
    /// was rebuilt from empty or restored from an older backup).
    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        let ours = self
            .on_session(|client| async move {
                let lock_node = self.lock_node(key);
                let line = self.line(&client, &lock_node).await?;
                let Some(head) = line.head().filter(|head| is_own(&head.name, token)) else {
                    return Ok(None);
                };
                Ok(self
                    .prove(&client, &lock_node, &head.name)
                    .await?
                    .map(|stat| fence_of(stat.czxid)))
            })
            .await?;
        match ours {
            Some(ours) if ours > seen => Ok(Some(ours)),
            Some(ours) => Err(Error::FenceOutOfReach {
                seen: seen.get(),
                next: ours.get(),
            }),
            None => Ok(None),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockState> {
        self.on_session(|client| async move {
            let lock_node = self.lock_node(key);
            let line = self.line(&client, &lock_node).await?;
            let Some(head) = line.head().cloned() else {
                return Ok(LockState::new(false, None, None, Some(0)));
            };
            let waiting = line.0.len() - 1;
            let fence = self
                .stat_of(&client, &lock_node, head)
                .await?
                .map(|node| fence_of(node.czxid));
            Ok(LockState::new(fence.is_some(), None, fence, Some(waiting)))
        })
        .await
    }

    /// Delete the head of the line, whoever made it; the next waiter's watch fires.
    async fn force_unlock(&self, key: &str) -> Result<bool> {
        self.on_session(|client| async move {
            let lock_node = self.lock_node(key);
            let line = self.line(&client, &lock_node).await?;
            let Some(head) = line.head() else {
                return Ok(false);
            };
            let path = format!("{lock_node}/{}", head.name);
            match self.bounded(client.delete(&path, None)).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(error) => Err(error.into()),
            }
        })
        .await
    }
}
