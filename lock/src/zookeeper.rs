//! The seed articles' third lock: ZooKeeper (feature `zookeeper`).
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
//! creates and deletes between the oldest waiter's and the newest's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use zookeeper_client as zk;

use crate::backend::{Attempt, Backend, LockState, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fenced::Fence;
use crate::keys;
use crate::options::LockOptions;
use crate::token::Token;

/// Where lock nodes live unless [`ZkLockBuilder::root`] says otherwise.
pub const DEFAULT_ROOT: &str = "/distlock";

/// The longest key, in bytes (ZooKeeper limits a node's path, not a name; keep names short).
const MAX_KEY_BYTES: usize = 512;

/// Tries to create a node whose parent ZooKeeper may be deleting meanwhile (an empty
/// container is reaped by the server), before the error is passed on.
const CREATE_TRIES: usize = 5;

/// The most claims a handle keeps (its waiters', its holders', and those its reaper is still
/// to look for): past it, a new attempt is refused as timed out. They pile up only while the
/// ensemble does not answer.
const MAX_CLAIMS: usize = 1_024;

/// How long a waiter, or the reaper, waits before trying again after the ensemble could not
/// be reached.
const RETRY_AFTER: Duration = Duration::from_millis(200);

const CONTENDER: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
const LOCK_NODE: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());

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

/// A node this handle made (or may have made) for one token, until it is known deleted.
#[derive(Debug, Clone)]
struct Claim {
    /// The token the node is named after.
    token: Token,
    /// The lock's key.
    key: String,
    /// The node's name under the lock node, once known.
    node: Option<String>,
    /// When the reaper deletes the token's nodes. `None` while a step of this handle is
    /// answerable for them (a waiter in line; the locker gives its place up with `unlock`).
    // TIMING: one ttl after the last turn or renewal was *answered*, which is no earlier
    // than the holder's own deadline (one ttl after it was *sent*): the reaper never takes
    // a lock from a holder whose lease still runs.
    due: Option<Instant>,
    /// A `create` was sent whose reply has not been seen (in flight, or lost with its
    /// connection): it may still land after we looked for it, so the reaper looks once
    /// more, a session timeout later, before it forgets the token.
    uncertain: bool,
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
    /// timeout; [`Error::ZooKeeper`] when no session can be opened.
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

/// A session: its client, and the connection timeout it was opened with.
struct Session {
    client: zk::Client,
    connection_timeout: Duration,
}

impl Session {
    /// Open a session asking for `asked`. Unless `connection_timeout` is given, it is a
    /// tenth of the session the server *granted*.
    // TIMING: a server grants at most its `maxSessionTimeout`; a tenth of a larger ask would
    // be a larger share of the session granted (ask 10 s, be granted 4 s: a quarter), and
    // the client cannot change it once connected: the session is opened again, asking for
    // what was granted.
    async fn open(
        cluster: &str,
        asked: Duration,
        connection_timeout: Option<Duration>,
    ) -> std::result::Result<Self, zk::Error> {
        let first_try = connection_timeout.unwrap_or(asked / 10);
        let client = connect_client(cluster, asked, first_try).await?;
        let granted = client.session_timeout();
        if connection_timeout.is_some() || granted / 10 >= first_try {
            return Ok(Self {
                client,
                connection_timeout: first_try,
            });
        }
        drop(client);
        let client = connect_client(cluster, granted, granted / 10).await?;
        Ok(Self {
            connection_timeout: client.session_timeout().min(granted) / 10,
            client,
        })
    }
}

async fn connect_client(
    cluster: &str,
    session_timeout: Duration,
    connection_timeout: Duration,
) -> std::result::Result<zk::Client, zk::Error> {
    zk::Client::connector()
        .with_session_timeout(session_timeout)
        .with_connection_timeout(connection_timeout)
        .connect(cluster)
        .await
}

/// Why `root` cannot be the parent of lock nodes, if it cannot.
fn root_problem(root: &str) -> Option<&'static str> {
    let Some(path) = root.strip_prefix('/') else {
        return Some("it does not start with '/'");
    };
    if path.is_empty() {
        return Some("it is the root node itself");
    }
    if path.split('/').next() == Some("zookeeper") {
        return Some("/zookeeper is ZooKeeper's own");
    }
    path.split('/').find_map(|part| match part {
        "" => Some("it has an empty part ('//')"),
        part => node_name_problem(part),
    })
}

/// Why ZooKeeper would refuse `name` as a node name, if it would (its documented rules: no
/// `/`, not `.` or `..`, no NUL, no control character, nothing in U+E000..U+F8FF or
/// U+FFF0..U+FFFF).
fn node_name_problem(name: &str) -> Option<&'static str> {
    let refused = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    if name.contains('/') {
        Some("it contains '/' (a ZooKeeper node name cannot)")
    } else if name == "." || name == ".." {
        Some("it is '.' or '..' (not a ZooKeeper node name)")
    } else if name.chars().any(refused) {
        Some(
            "it contains a character ZooKeeper refuses in a node name (a control character, U+E000..U+F8FF or U+FFF0..U+FFFF)",
        )
    } else {
        None
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
    /// [`Error::ZooKeeper`] when no session can be opened.
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
    /// [`connection_timeout`](ZkLockBuilder::connection_timeout), or a tenth of the session.
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

    fn current(&self) -> zk::Client {
        self.session().client.clone()
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.inner
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The session to use: the current one, or a new one if it has ended.
    async fn client(&self) -> Result<zk::Client> {
        let current = self.current();
        if current.state().is_terminated() {
            self.replace(&current).await?;
            return Ok(self.current());
        }
        Ok(current)
    }

    /// Run `step` on the current session; if the session turns out to have ended (the
    /// server expired or closed it), run it once more on a new one. Nodes of the old
    /// session are gone, so the second run sees the lock as it now is.
    async fn on_session<T, F, Fut>(&self, step: F) -> Result<T>
    where
        F: Fn(zk::Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let client = self.client().await?;
        match step(client.clone()).await {
            Err(Error::ZooKeeper(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                self.replace(&client).await?;
                step(self.client().await?).await
            }
            other => other,
        }
    }

    /// Replace the session `failed` is on with a new one (unless another caller did), in a
    /// task on the handle's own runtime: the new client runs its connection there, and a
    /// caller that stops waiting (a deadline, a readiness probe's time-out) does not stop
    /// the replacement half-way.
    async fn replace(&self, failed: &zk::Client) -> Result<()> {
        let lock = self.clone();
        let failed = failed.session_id();
        self.inner
            .runtime
            .spawn(async move { lock.replace_now(failed).await })
            .await
            .unwrap_or(Err(Error::ZooKeeper(zk::Error::ClientClosed)))
    }

    async fn replace_now(&self, failed: zk::SessionId) -> Result<()> {
        let _one = self.inner.reconnecting.lock().await;
        if self.current().session_id() != failed {
            return Ok(());
        }
        tracing::warn!("ZooKeeper session ended; opening a new one");
        let fresh = self
            .bounded(Session::open(
                &self.inner.cluster,
                self.inner.asked_timeout,
                self.inner.connection_timeout,
            ))
            .await?;
        *self.session() = fresh;
        Ok(())
    }

    /// `request`, or [`zk::Error::Timeout`] once the request timeout has passed.
    async fn bounded<T, E: Into<zk::Error>>(
        &self,
        request: impl Future<Output = std::result::Result<T, E>>,
    ) -> std::result::Result<T, zk::Error> {
        match timeout(self.inner.request_timeout, request).await {
            Ok(answer) => answer.map_err(Into::into),
            Err(_elapsed) => Err(zk::Error::Timeout),
        }
    }

    /// The longest ttl a lock on the current session may have: half the session timeout.
    ///
    // TIMING: a holder's lease runs one ttl from when its last proof (a write through the
    // leader) was sent, but the leader does not count that write as a sign of life: it
    // learns of the session's activity from the follower the client is connected to, which
    // reports it at most every half server tick, and the client is quiet for at most 0.15
    // of the session timeout T between messages (zookeeper-client pings after 3/20 of T).
    // So the leader may expire the session as early as T - 0.15 T - tick / 2 after the
    // proof was sent, and a server tick is at most T / 2 (ZooKeeper grants no session
    // shorter than two ticks): 0.6 T at worst. A ttl of at most T / 2 ends first.
    pub fn max_ttl(&self) -> Duration {
        self.session_timeout() / 2
    }

    /// A ttl longer than [`max_ttl`](Self::max_ttl) would let the holder count on a lock
    /// after the ensemble gave it away.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let session = self.session_timeout();
        if ttl > self.max_ttl() {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} is longer than half the ZooKeeper session timeout {session:?} the server granted: \
                 a lock lives only as long as its session, and the ensemble may expire a session \
                 0.6 of its timeout after the holder last proved it alive, so the holder could believe \
                 it held a lock the ensemble had already given away"
            )));
        }
        Ok(())
    }

    fn lock_node(&self, key: &str) -> String {
        format!("{}/{key}", self.inner.root)
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.inner
            .claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Change the claim of `token`, if this handle has one.
    fn with_claim(&self, token: &Token, change: impl FnOnce(&mut Claim)) {
        if let Some(claim) = self.claims().get_mut(token.as_str()) {
            change(claim);
        }
    }

    /// `token` holds its lock for `ttl` from now, unless renewed or released: then the
    /// reaper deletes its node.
    fn lease_until(&self, token: &Token, ttl: Duration) {
        self.reap_after(token, ttl);
    }

    /// The reaper takes over `token`'s nodes `after` from now.
    fn reap_after(&self, token: &Token, after: Duration) {
        self.with_claim(token, |claim| claim.due = Some(Instant::now() + after));
        self.inner.reap_now.notify_one();
    }

    /// The token's nodes were looked for (after a `sync`) and deleted: forget it, unless a
    /// `create` of it whose reply was lost could still land; then look once more, a session
    /// timeout later.
    fn swept(&self, token: &str) {
        let mut claims = self.claims();
        match claims.get_mut(token) {
            Some(claim) if claim.uncertain => {
                claim.uncertain = false;
                claim.due = Some(Instant::now() + self.inner.asked_timeout);
            }
            Some(_) => {
                claims.remove(token);
            }
            None => {}
        }
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

    /// Create our contender node under `lock_node`, the lock node first if it is missing.
    /// A reply lost with the connection is looked for by token before trying again. The
    /// token is claimed before anything is sent, so that whatever happens to the reply, the
    /// node is deleted in the end (by `unlock`, or by the reaper).
    async fn join(&self, client: &zk::Client, key: &str, token: &Token) -> Result<Node> {
        let lock_node = self.lock_node(key);
        self.claim(key, token)?;
        self.start_reaper();
        let prefix = format!("{lock_node}/{}-", token.as_str());
        let mut tries = 0;
        loop {
            tries += 1;
            self.with_claim(token, |claim| claim.uncertain = true);
            let error = match self.bounded(client.create(&prefix, b"", &CONTENDER)).await {
                Ok((stat, sequence)) => {
                    let node = Node {
                        sequence: sequence.into_i64() as u32,
                        name: format!("{}-{sequence}", token.as_str()),
                        czxid: stat.czxid,
                    };
                    self.with_claim(token, |claim| {
                        claim.node = Some(node.name.clone());
                        claim.uncertain = false;
                    });
                    return Ok(node);
                }
                Err(zk::Error::NoNode) => {
                    // Refused: nothing was made.
                    self.with_claim(token, |claim| claim.uncertain = false);
                    self.bounded(client.mkdir(&lock_node, &LOCK_NODE)).await?;
                    zk::Error::NoNode
                }
                Err(error @ (zk::Error::ConnectionLoss | zk::Error::Timeout)) => {
                    // The create may have been applied, or may be later: it stays
                    // uncertain unless our node is found now.
                    if let Some(own) = self.find_own(client, &lock_node, token).await? {
                        self.with_claim(token, |claim| {
                            claim.node = Some(own.name.clone());
                            claim.uncertain = false;
                        });
                        return Ok(own);
                    }
                    error
                }
                Err(error) => return Err(error.into()),
            };
            if tries >= CREATE_TRIES {
                return Err(error.into());
            }
        }
    }

    /// Our earliest node under `lock_node`, with its creation zxid, if it is there. Synced
    /// first: the server we read from has then seen every write the ensemble had committed
    /// when the sync was sent, a create of ours that was applied included.
    async fn find_own(
        &self,
        client: &zk::Client,
        lock_node: &str,
        token: &Token,
    ) -> Result<Option<Node>> {
        match self.bounded(client.sync(lock_node)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(error) => return Err(error.into()),
        }
        let line = self.line(client, lock_node).await?;
        let Some(own) = line.own(token).next().cloned() else {
            return Ok(None);
        };
        self.stat_of(client, lock_node, own).await
    }

    /// The children of `lock_node` in line order; an absent lock node is an empty line.
    async fn line(&self, client: &zk::Client, lock_node: &str) -> Result<Line> {
        let children = match self.bounded(client.list_children(lock_node)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        Ok(Line::of(children))
    }

    /// `node` with its creation zxid, if it still exists.
    async fn stat_of(
        &self,
        client: &zk::Client,
        lock_node: &str,
        node: Node,
    ) -> Result<Option<Node>> {
        let path = format!("{lock_node}/{}", node.name);
        Ok(self
            .bounded(client.check_stat(&path))
            .await?
            .map(|stat| Node {
                czxid: stat.czxid,
                ..node
            }))
    }

    /// Prove that `node` is ours and its session alive at the ensemble's leader: a
    /// transaction that only checks the node exists (a write: the leader refuses it for a
    /// session it has expired), then its stat, read on the same session (which sees at
    /// least that write). `None` if the node is gone or belongs to another session (one
    /// this handle has given up).
    async fn prove(
        &self,
        client: &zk::Client,
        lock_node: &str,
        node: &str,
    ) -> Result<Option<zk::Stat>> {
        let path = format!("{lock_node}/{node}");
        let mut check = client.new_multi_writer();
        check.add_check_version(&path, -1)?;
        match self.bounded(check.commit()).await {
            Ok(_) => {}
            Err(zk::Error::NoNode) => return Ok(None),
            Err(error) => return Err(error.into()),
        }
        let stat = self.bounded(client.check_stat(&path)).await?;
        Ok(stat.filter(|stat| stat.ephemeral_owner == client.session_id().0))
    }

    /// Delete every node of `token` under the key's lock node, after a `sync` (a create
    /// whose reply was lost may have been applied meanwhile): what a release, and the
    /// reaper, do. Says what the line held.
    async fn delete_own(&self, client: &zk::Client, key: &str, token: &Token) -> Result<Unlock> {
        let lock_node = self.lock_node(key);
        match self.bounded(client.sync(&lock_node)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(error) => return Err(error.into()),
        }
        let line = self.line(client, &lock_node).await?;
        let own: Vec<Node> = line.own(token).cloned().collect();
        if own.is_empty() {
            return Ok(if line.is_empty() {
                Unlock::Gone
            } else {
                Unlock::Taken
            });
        }
        for node in &own {
            self.delete(client, &lock_node, &node.name).await?;
        }
        Ok(Unlock::Released)
    }

    /// Delete `name` under `lock_node`; already gone is fine.
    async fn delete(&self, client: &zk::Client, lock_node: &str, name: &str) -> Result<()> {
        let path = format!("{lock_node}/{name}");
        match self.bounded(client.delete(&path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Claim `token`'s nodes under `key` before anything is sent, unless the map is full.
    fn claim(&self, key: &str, token: &Token) -> Result<()> {
        let mut claims = self.claims();
        if claims.contains_key(token.as_str()) {
            return Ok(());
        }
        if claims.len() >= MAX_CLAIMS {
            // The claims pile up only while the ensemble does not answer: an attempt now
            // would meet the same time-out, and leave one more claim behind.
            tracing::warn!(
                claims = claims.len(),
                "ZooKeeper: too many nodes left to look for; refusing a new attempt until the reaper has"
            );
            return Err(Error::ZooKeeper(zk::Error::Timeout));
        }
        claims.insert(
            token.as_str().to_owned(),
            Claim {
                token: token.clone(),
                key: key.to_owned(),
                node: None,
                due: None,
                uncertain: false,
            },
        );
        Ok(())
    }

    /// Delete the nodes of every claim whose time has come, holders first; answers when the
    /// next falls due.
    async fn reap_due(&self) -> Option<Instant> {
        let (forget, sweeps) = plan(&self.claims(), Instant::now());
        self.claims().retain(|token, _| !forget.contains(token));
        let mut sweeps = sweeps.into_iter();
        while let Some(sweep) = sweeps.next() {
            let swept = self
                .on_session(|client| {
                    let sweep = &sweep;
                    async move { self.sweep(&client, sweep).await }
                })
                .await;
            match swept {
                Ok(deleted) => {
                    if deleted > 0 {
                        tracing::info!(key = %sweep.key, deleted, "deleted ZooKeeper nodes whose lease ran out");
                    }
                    sweep
                        .tokens
                        .iter()
                        .for_each(|token| self.swept(token.as_str()));
                }
                Err(error) => {
                    tracing::debug!(key = %sweep.key, %error, "could not delete lapsed nodes yet; retrying");
                    let retry = Instant::now() + RETRY_AFTER;
                    // TIMING: the ensemble does not answer: every other sweep would cost
                    // a request timeout too. The next pass starts again with the holders.
                    let rest: Vec<Sweep> = if transient(&error) {
                        sweeps.by_ref().collect()
                    } else {
                        Vec::new()
                    };
                    for token in std::iter::once(&sweep).chain(&rest).flat_map(|s| &s.tokens) {
                        self.with_claim(token, |claim| claim.due = Some(retry));
                    }
                }
            }
        }
        self.claims().values().filter_map(|claim| claim.due).min()
    }

    /// Delete the nodes of `sweep`'s tokens, after a `sync` (a create whose reply was lost
    /// may have been applied meanwhile): one listing for all of them. Says how many went.
    async fn sweep(&self, client: &zk::Client, sweep: &Sweep) -> Result<usize> {
        let lock_node = self.lock_node(&sweep.key);
        match self.bounded(client.sync(&lock_node)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(error) => return Err(error.into()),
        }
        let line = self.line(client, &lock_node).await?;
        let ours = line
            .0
            .iter()
            .filter(|node| sweep.tokens.iter().any(|token| is_own(&node.name, token)));
        let mut deleted = 0;
        for node in ours {
            self.delete(client, &lock_node, &node.name).await?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

/// The claims of one key that fell due: their nodes are looked for with one listing.
#[derive(Debug)]
struct Sweep {
    key: String,
    tokens: Vec<Token>,
    /// One of them has a known node: a holder's (or a waiter's that gave up), which may be
    /// what blocks other processes.
    holder: bool,
    /// The earliest due time among them.
    due: Instant,
}

/// What the reaper does with the claims due at `now`: the tokens it forgets without a
/// request (no node known, and no create whose answer is missing: nothing can exist), and
/// the sweeps, one per key, those with a known node first, earliest due first.
fn plan(claims: &HashMap<String, Claim>, now: Instant) -> (Vec<String>, Vec<Sweep>) {
    let mut forget = Vec::new();
    let mut by_key: HashMap<&str, Sweep> = HashMap::new();
    for (name, claim) in claims {
        let Some(due) = claim.due.filter(|due| *due <= now) else {
            continue;
        };
        if claim.node.is_none() && !claim.uncertain {
            forget.push(name.clone());
            continue;
        }
        let sweep = by_key.entry(&claim.key).or_insert_with(|| Sweep {
            key: claim.key.clone(),
            tokens: Vec::new(),
            holder: false,
            due,
        });
        sweep.tokens.push(claim.token.clone());
        sweep.holder |= claim.node.is_some();
        sweep.due = sweep.due.min(due);
    }
    let mut sweeps: Vec<Sweep> = by_key.into_values().collect();
    sweeps.sort_by_key(|sweep| (!sweep.holder, sweep.due));
    (forget, sweeps)
}

/// The reaper: deletes the nodes of claims that fell due, until the handle is gone.
async fn reap(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            ZkLock { inner }.reap_due().await
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// A contender node: its name under the lock node, its sequence and creation zxid.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    /// ZooKeeper's 32-bit counter (printed signed: past 2^31 it is negative), on a circle.
    sequence: u32,
    czxid: i64,
}

/// The contenders for one lock, lowest sequence first (`czxid` unknown: 0).
struct Line(Vec<Node>);

impl Line {
    /// The line of these children of a lock node. Children not made by this recipe (no
    /// `<token>-<sequence>` name) are not contenders.
    fn of(children: Vec<String>) -> Self {
        let mut nodes: Vec<Node> = children
            .into_iter()
            .filter_map(|name| {
                let sequence = sequence_of(&name)? as u32;
                Some(Node {
                    name,
                    sequence,
                    czxid: 0,
                })
            })
            .collect();
        nodes.sort_by_key(|node| node.sequence);
        // The counter is 32 bits and wraps (it counts every create and delete of a child
        // while the lock node lives, and a busy lock node lives on: ZooKeeper deletes an
        // empty container only at its next check, a minute apart by default). The live
        // contenders always sit within a small arc of the circle, so the line starts after
        // the widest gap between two neighbours, the wrap included.
        if let (Some(first), Some(last)) = (nodes.first(), nodes.last()) {
            let around = first.sequence.wrapping_sub(last.sequence);
            let widest = nodes
                .windows(2)
                .enumerate()
                .map(|(i, pair)| (pair[1].sequence.wrapping_sub(pair[0].sequence), i + 1))
                .max_by_key(|&(gap, _)| gap);
            if let Some((gap, start)) = widest
                && gap > around
            {
                nodes.rotate_left(start);
            }
        }
        Line(nodes)
    }

    fn head(&self) -> Option<&Node> {
        self.0.first()
    }

    /// Our nodes, earliest first (more than one only if a retried create made a second).
    fn own<'a>(&'a self, token: &'a Token) -> impl Iterator<Item = &'a Node> + 'a {
        self.0.iter().filter(move |node| is_own(&node.name, token))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The sequence ZooKeeper appended to `<token>-`: ten digits, or a `-` and ten digits once
/// the counter has wrapped past 2^31 (`<token>--2147483648`).
fn sequence_of(name: &str) -> Option<i32> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (rest, number) = name.split_at(name.len() - digits);
    let number: i64 = number.parse().ok()?;
    let signed = match rest.strip_suffix("--") {
        Some(_token) => -number,
        None => rest.strip_suffix('-').map(|_token| number)?,
    };
    i32::try_from(signed).ok()
}

fn is_own(name: &str, token: &Token) -> bool {
    name.strip_prefix(token.as_str())
        .is_some_and(|rest| rest.starts_with('-'))
}

fn fence_of(czxid: i64) -> Fence {
    Fence::new(u64::try_from(czxid).expect("zxids are positive"))
}

/// Whether `error` may pass once a server answers again (the connection was lost, or the
/// request timed out), rather than saying the session is over.
fn transient(error: &Error) -> bool {
    matches!(
        error,
        Error::ZooKeeper(zk::Error::ConnectionLoss | zk::Error::Timeout)
    )
}

fn lost_place(key: &str, why: &'static str) -> Error {
    Error::LostPlace {
        key: key.to_owned(),
        why,
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

    fn waits_in_line(&self) -> bool {
        true
    }

    /// Create our node, then look at the line: the head holds; anyone else gives its node
    /// back at once.
    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        self.check_ttl(ttl)?;
        let attempt = self
            .on_session(|client| self.try_lock_on(client, key, token))
            .await?;
        match attempt {
            // TIMING: the create that made our node was a write, sent after the locker's
            // `sent`: the holder's deadline, one ttl from `sent`, falls before this one.
            Attempt::Acquired(_) => self.lease_until(token, ttl),
            // Our node is deleted; a create of ours whose reply was lost is the reaper's.
            _ => self.swept(token.as_str()),
        }
        Ok(attempt)
    }

    /// Create our node, then until it heads the line: watch the node just before it, and
    /// look again when that one goes. Not run again on a new session once our node is made:
    /// a new node would stand at the back of the line.
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        self.check_ttl(ttl)?;
        // A create that could not be sent or answered is tried again (our node, if it was
        // made, is found by token) until the locker's deadline drops this future.
        let client = loop {
            let joined = self
                .on_session(|client| async move {
                    self.join(&client, key, token).await?;
                    Ok(client)
                })
                .await;
            match joined {
                Ok(client) => break client,
                Err(error) if transient(&error) => {
                    tracing::debug!(%key, %error, "ZooKeeper unreachable while joining the line; trying again");
                    sleep(RETRY_AFTER).await;
                }
                Err(error) => return Err(error),
            }
        };
        let turn = self.wait_for_turn(&client, key, token).await?;
        self.lease_until(token, ttl);
        Ok(turn)
    }

    /// TIMING: see `prove`: an answer proves the session alive at the leader
    /// when it was sent, and the ensemble keeps it one session timeout (at least the ttl)
    /// after that.
    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        self.check_ttl(ttl)?;
        let known = self
            .claims()
            .get(token.as_str())
            .and_then(|claim| claim.node.clone());
        let renewal = self
            .on_session(|client| {
                let known = known.clone();
                async move {
                    let lock_node = self.lock_node(key);
                    let node = match known {
                        Some(node) => Some(node),
                        None => {
                            let line = self.line(&client, &lock_node).await?;
                            line.own(token).next().map(|node| node.name.clone())
                        }
                    };
                    if let Some(node) = node
                        && self.prove(&client, &lock_node, &node).await?.is_some()
                    {
                        return Ok(Renewal::Renewed);
                    }
                    // Once our node headed the line it stays at the head until it is
                    // deleted: gone, or (if it lives on) on a session given up.
                    let line = self.line(&client, &lock_node).await?;
                    Ok(match line.head() {
                        Some(head) if !is_own(&head.name, token) => Renewal::Taken,
                        _ => Renewal::Gone,
                    })
                }
            })
            .await?;
        match renewal {
            Renewal::Renewed => self.lease_until(token, ttl),
            // Whatever of ours is left (a node on a session given up) is the reaper's.
            _ => self.reap_after(token, Duration::ZERO),
        }
        Ok(renewal)
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

impl ZkLock {
    async fn try_lock_on(&self, client: zk::Client, key: &str, token: &Token) -> Result<Attempt> {
        let lock_node = self.lock_node(key);
        let created = self.join(&client, key, token).await?;
        let line = self.line(&client, &lock_node).await?;
        let own: Vec<Node> = line.own(token).cloned().collect();
        let head_is_ours = line.head().is_some_and(|head| is_own(&head.name, token));
        // Keep the first of our nodes if it heads the line (a retried attempt may have made
        // two); every other node of ours goes.
        let keep = own.first().filter(|_| head_is_ours).cloned();
        for node in &own {
            if keep.as_ref().is_none_or(|kept| kept.name != node.name) {
                self.delete(&client, &lock_node, &node.name).await?;
            }
        }
        let Some(kept) = keep else {
            return Ok(Attempt::Held { expires_in: None });
        };
        self.with_claim(token, |claim| claim.node = Some(kept.name.clone()));
        let czxid = if kept.name == created.name {
            created.czxid
        } else {
            match self.stat_of(&client, &lock_node, kept).await? {
                Some(node) => node.czxid,
                None => return Ok(Attempt::Held { expires_in: None }),
            }
        };
        Ok(Attempt::Acquired(fence_of(czxid)))
    }

    /// Until our earliest node heads the line: watch the node just before it, and look
    /// again when that one goes. A lost connection or a request that timed out is retried
    /// (the locker drops this future at its deadline); only a session that ended, or our
    /// node gone, loses the place.
    async fn wait_for_turn(&self, client: &zk::Client, key: &str, token: &Token) -> Result<Turn> {
        let lock_node = self.lock_node(key);
        let mut waited = false;
        loop {
            match self
                .look_for_turn(client, key, &lock_node, token, &mut waited)
                .await
            {
                Ok(Some(turn)) => return Ok(turn),
                Ok(None) => {}
                Err(error) if transient(&error) => {
                    tracing::debug!(%key, %error, "ZooKeeper unreachable while waiting in line; trying again");
                    sleep(RETRY_AFTER).await;
                }
                Err(Error::ZooKeeper(zk::Error::SessionExpired | zk::Error::ClientClosed)) => {
                    return Err(lost_place(
                        key,
                        "the ZooKeeper session ended, and our node with it",
                    ));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One look at the line: our turn, or (`None`) a wait until the node before ours went.
    async fn look_for_turn(
        &self,
        client: &zk::Client,
        key: &str,
        lock_node: &str,
        token: &Token,
        waited: &mut bool,
    ) -> Result<Option<Turn>> {
        let line = self.line(client, lock_node).await?;
        let mut own = line.own(token);
        let Some(earliest) = own.next().cloned() else {
            return Err(lost_place(
                key,
                "our node is gone (the ZooKeeper session expired, or it was deleted)",
            ));
        };
        // A create retried after its reply was lost may have made a second node: it would
        // wait behind the first for ever.
        for later in own {
            self.delete(client, lock_node, &later.name).await?;
        }
        self.with_claim(token, |claim| claim.node = Some(earliest.name.clone()));
        let place = line
            .0
            .iter()
            .position(|node| node.name == earliest.name)
            .expect("our node is in the line it was found in");
        if place == 0 {
            // TIMING: the holder's lease is counted from before this proof was sent.
            let proven_at = Instant::now();
            return match self.prove(client, lock_node, &earliest.name).await? {
                Some(stat) => Ok(Some(Turn::new(fence_of(stat.czxid), proven_at, *waited))),
                None => Err(lost_place(
                    key,
                    "our node is gone, or its ZooKeeper session was given up",
                )),
            };
        }
        *waited = true;
        let before = format!("{lock_node}/{}", line.0[place - 1].name);
        let (stat, watcher) = self.bounded(client.check_and_watch_stat(&before)).await?;
        if stat.is_none() {
            // Gone between the listing and the watch: look again.
            return Ok(None);
        }
        // The watch fires when the node before ours is deleted (or its data changes, which
        // this recipe never does), or when the session ends; a lost connection does not
        // fire it: the client sets the watch again on the next server.
        let event = watcher.changed().await;
        if event.session_state.is_terminated() {
            return Err(Error::ZooKeeper(zk::Error::SessionExpired));
        }
        if event.event_type == zk::EventType::NodeDeleted {
            self.inner.wake_ups.fetch_add(1, Ordering::Relaxed);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_keeps_creation_order_when_the_counter_wraps_past_2_pow_32() {
        // 4294967294 and 4294967295 are printed -2 and -1; then the counter wraps to 0.
        let names = vec![
            "c-0000000001".to_owned(),
            "a--0000000002".to_owned(),
            "d-0000000003".to_owned(),
            "b--0000000001".to_owned(),
        ];

        let line = Line::of(names);

        let order: Vec<&str> = line.0.iter().map(|node| node.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "a--0000000002",
                "b--0000000001",
                "c-0000000001",
                "d-0000000003"
            ]
        );
    }

    #[test]
    fn the_line_keeps_creation_order_across_the_sequence_counters_wrap_past_2_pow_31() {
        let names = vec![
            "c--2147483648".to_owned(),
            "b-2147483647".to_owned(),
            "d--2147483647".to_owned(),
            "a-token-with-dashes-2147483646".to_owned(),
            "not-a-contender".to_owned(),
        ];

        let line = Line::of(names);

        let order: Vec<&str> = line.0.iter().map(|node| node.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "a-token-with-dashes-2147483646",
                "b-2147483647",
                "c--2147483648",
                "d--2147483647"
            ]
        );
    }

    fn claim(key: &str, node: Option<&str>, due: Option<Instant>, uncertain: bool) -> Claim {
        Claim {
            token: Token::new(),
            key: key.to_owned(),
            node: node.map(str::to_owned),
            due,
            uncertain,
        }
    }

    #[test]
    fn the_reaper_sweeps_holders_first_and_forgets_what_cannot_exist() {
        let now = Instant::now();
        let ago = |secs: u64| Some(now - Duration::from_secs(secs));
        let claims: HashMap<String, Claim> = [
            claim("uncertain", None, ago(6), true),
            claim("uncertain", None, ago(5), true),
            claim("nothing_sent", None, ago(7), false),
            claim("lapsed_late", Some("n-0000000001"), ago(1), false),
            claim("lapsed_early", Some("n-0000000002"), ago(2), false),
            claim("waiting", Some("n-0000000003"), None, false),
            claim(
                "leased",
                Some("n-0000000004"),
                Some(now + Duration::from_secs(1)),
                false,
            ),
        ]
        .into_iter()
        .map(|claim| (claim.token.as_str().to_owned(), claim))
        .collect();

        let (forget, sweeps) = plan(&claims, now);

        let forgotten: Vec<&str> = forget
            .iter()
            .map(|token| claims[token].key.as_str())
            .collect();
        assert_eq!(forgotten, ["nothing_sent"]);
        let order: Vec<(&str, usize)> = sweeps
            .iter()
            .map(|sweep| (sweep.key.as_str(), sweep.tokens.len()))
            .collect();
        assert_eq!(
            order,
            [("lapsed_early", 1), ("lapsed_late", 1), ("uncertain", 2)]
        );
    }

    #[test]
    fn names_and_roots_zookeeper_refuses_are_refused() {
        for name in [
            "a/b",
            ".",
            "..",
            "a\u{0}",
            "a\u{7f}",
            "a\u{e000}",
            "a\u{fff0}",
        ] {
            assert!(node_name_problem(name).is_some(), "{name:?} passed");
        }
        for name in ["lock_sale_1", "a.b", "…", "ключ"] {
            assert_eq!(node_name_problem(name), None, "{name:?} refused");
        }
        for root in [
            "distlock",
            "/",
            "/zookeeper",
            "/zookeeper/x",
            "/a//b",
            "/a/./b",
            "/a/\u{1}",
        ] {
            assert!(root_problem(root).is_some(), "{root:?} passed");
        }
        for root in ["/distlock", "/locks/sale", "/zookeeperish"] {
            assert_eq!(root_problem(root), None, "{root:?} refused");
        }
    }
}
