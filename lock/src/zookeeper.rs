//! The seed articles' third lock: ZooKeeper (feature `zookeeper`).
//!
//! The standard recipe (Apache Curator's `InterProcessMutex` follows it too):
//! - each contender creates an **ephemeral sequential** node under the lock's node,
//!   `/distlock/<key>/<token>-<sequence>`; the lowest sequence holds the lock;
//! - every other contender watches only the node just before its own, so a release wakes
//!   exactly one waiter (no herd) and the lock is granted in the order the nodes were
//!   created, whichever process created them;
//! - the node is ephemeral: it lives as long as the ZooKeeper **session** that created it.
//!   The client library keeps the session alive with heartbeats; a session that expires
//!   (a holder paused or cut off for longer than the session timeout) takes its nodes
//!   with it, and the next waiter's watch fires.
//!
//! How it maps onto [`Backend`]:
//! - the token is the first part of the node's name, so a `create` whose reply was lost
//!   is found again by listing the children, and a retried step finds its own node;
//! - the **fence** is the holder node's creation zxid (`czxid`). ZooKeeper's zxids grow
//!   with every write to the ensemble, across leader elections (the epoch is in the high
//!   32 bits) and across a lock node deleted and created again (the sequence suffix starts
//!   over then; the zxid does not). Nodes are granted in creation order, so each holder's
//!   fence is above every earlier holder's;
//! - **renewal** is a read that finds our node still at the head of the line: it proves
//!   the session alive at the server, whose own expiry is at least one session timeout
//!   after it. The options' ttl must not be longer than the session timeout (checked);
//! - **lost**: the session expired, so the node is gone (a renewal says `Gone`, or `Taken`
//!   once another node heads the line); the guard's lease then runs out as for Redis;
//! - the lock's node is a **container** node: ZooKeeper deletes it by itself once it has
//!   no children, so keys that are no longer used leave nothing behind.
//!
//! When a session expires the client cannot be used again; the next step opens a new
//! session (a new ZooKeeper client) and goes on with it. Nodes of the old session are gone
//! with it, so every guard taken under it reports its lock lost.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::backend::{Attempt, Backend, LockState, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::fenced::Fence;
use crate::options::LockOptions;
use crate::token::Token;

/// Where lock nodes live unless [`ZkLockBuilder::root`] says otherwise.
pub const DEFAULT_ROOT: &str = "/distlock";

/// The longest key, in bytes (ZooKeeper limits a node's path, not a name; keep names short).
const MAX_KEY_BYTES: usize = 512;

/// Tries to create a node whose parent ZooKeeper may be deleting meanwhile (an empty
/// container is reaped by the server), before the error is passed on.
const CREATE_TRIES: usize = 5;

const CONTENDER: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
const LOCK_NODE: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());

/// Locks in ZooKeeper: a [`Backend`] that keeps its own line of waiters. Cheap to clone
/// (clones share the session).
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
/// let options = LockOptions::builder().ttl(Duration::from_secs(10)).build()?;
/// let locker = Locker::new(zk, options)?; // ttl must not exceed the session timeout
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
    /// The parent of every lock node.
    root: String,
    /// The current session. Replaced, never mended, when it ends.
    session: Mutex<zk::Client>,
    /// One new session at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// Watches that fired for waiters here: how the no-herd property is observed.
    wake_ups: AtomicU64,
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

/// Settings for [`ZkLock`]: the ensemble, the session timeout and the root node.
#[derive(Debug, Clone)]
pub struct ZkLockBuilder {
    cluster: String,
    session_timeout: Duration,
    root: String,
}

impl ZkLockBuilder {
    /// How long the ensemble keeps the session (and with it every lock node it created)
    /// once it stops hearing from this client: the lease of every lock taken here. The
    /// server bounds it to its `minSessionTimeout`..`maxSessionTimeout` (by default 2 to 20
    /// ticks). Default 10 s.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The node under which lock nodes are created (default [`DEFAULT_ROOT`]). Created if
    /// missing.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Open the session.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a root that is not an absolute node path;
    /// [`Error::ZooKeeper`] when no session can be opened.
    pub async fn connect(self) -> Result<ZkLock> {
        let root = self.root.trim_end_matches('/').to_owned();
        if !root.starts_with('/') || root.len() < 2 || root.contains("//") {
            return Err(Error::InvalidOptions(format!(
                "the ZooKeeper root {:?} is not an absolute node path such as /distlock",
                self.root
            )));
        }
        let session = open_session(&self.cluster, self.session_timeout).await?;
        Ok(ZkLock {
            inner: Arc::new(Inner {
                cluster: self.cluster,
                asked_timeout: self.session_timeout,
                root,
                session: Mutex::new(session),
                reconnecting: tokio::sync::Mutex::new(()),
                wake_ups: AtomicU64::new(0),
            }),
        })
    }
}

async fn open_session(cluster: &str, timeout: Duration) -> Result<zk::Client> {
    Ok(zk::Client::connector()
        .with_session_timeout(timeout)
        .connect(cluster)
        .await?)
}

impl ZkLock {
    /// Settings for a lock on the ensemble `cluster` (`host:port,host:port,...`).
    pub fn builder(cluster: impl Into<String>) -> ZkLockBuilder {
        ZkLockBuilder {
            cluster: cluster.into(),
            session_timeout: Duration::from_secs(10),
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

    /// The ZooKeeper client of the current session, to use the session for other things
    /// (or, in a test, to end it as an expiry would).
    pub fn zookeeper(&self) -> zk::Client {
        self.current()
    }

    /// How many times a watch woke a waiter of this client (a node before it went away).
    /// With the recipe's one watch per waiter, a release wakes one waiter in all.
    pub fn wake_ups(&self) -> u64 {
        self.inner.wake_ups.load(Ordering::Relaxed)
    }

    fn current(&self) -> zk::Client {
        self.inner
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
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

    /// Replace the session `failed` is on with a new one (unless another caller did).
    async fn replace(&self, failed: &zk::Client) -> Result<()> {
        let _one = self.inner.reconnecting.lock().await;
        if self.current().session_id() != failed.session_id() {
            return Ok(());
        }
        tracing::warn!("ZooKeeper session ended; opening a new one");
        let fresh = open_session(&self.inner.cluster, self.inner.asked_timeout).await?;
        *self
            .inner
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
        Ok(())
    }

    /// A ttl longer than the session timeout would let the holder count on a lock after
    /// the ensemble gave it away.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let session = self.session_timeout();
        if ttl > session {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} is longer than the ZooKeeper session timeout {session:?} the server granted: \
                 a lock lives only as long as its session, so the holder could believe it held a lock \
                 the ensemble had already given away"
            )));
        }
        Ok(())
    }

    fn lock_node(&self, key: &str) -> String {
        format!("{}/{key}", self.inner.root)
    }

    /// Create our contender node under `lock_node`, the lock node first if it is missing.
    /// A reply lost with the connection is looked for by token before trying again.
    async fn join(&self, client: &zk::Client, lock_node: &str, token: &Token) -> Result<Node> {
        let prefix = format!("{lock_node}/{}-", token.as_str());
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match client.create(&prefix, b"", &CONTENDER).await {
                Ok((stat, sequence)) => {
                    return Ok(Node {
                        sequence: sequence.into_i64(),
                        name: format!("{}-{sequence}", token.as_str()),
                        czxid: stat.czxid,
                    });
                }
                Err(zk::Error::NoNode) => {
                    client.mkdir(lock_node, &LOCK_NODE).await?;
                    zk::Error::NoNode
                }
                Err(zk::Error::ConnectionLoss) => {
                    if let Some(own) = self.find_own(client, lock_node, token).await? {
                        return Ok(own);
                    }
                    zk::Error::ConnectionLoss
                }
                Err(error) => return Err(error.into()),
            };
            if tries >= CREATE_TRIES {
                return Err(error.into());
            }
        }
    }

    /// Our node under `lock_node`, with its creation zxid, if it is there.
    async fn find_own(
        &self,
        client: &zk::Client,
        lock_node: &str,
        token: &Token,
    ) -> Result<Option<Node>> {
        let line = line(client, lock_node).await?;
        let Some(own) = line.own(token).next().cloned() else {
            return Ok(None);
        };
        stat_of(client, lock_node, own).await
    }
}

/// A contender node: its name under the lock node, its sequence and creation zxid.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    sequence: i64,
    czxid: i64,
}

/// The contenders for one lock, lowest sequence first (`czxid` unknown: 0).
struct Line(Vec<Node>);

impl Line {
    fn head(&self) -> Option<&Node> {
        self.0.first()
    }

    /// Our nodes (more than one only if a retried create made a second).
    fn own<'a>(&'a self, token: &'a Token) -> impl Iterator<Item = &'a Node> + 'a {
        self.0.iter().filter(move |node| is_own(&node.name, token))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn is_own(name: &str, token: &Token) -> bool {
    name.strip_prefix(token.as_str())
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The children of `lock_node` in line order; an absent lock node is an empty line.
async fn line(client: &zk::Client, lock_node: &str) -> Result<Line> {
    let children = match client.list_children(lock_node).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    let mut nodes: Vec<Node> = children
        .into_iter()
        .filter_map(|name| {
            // Children not made by this recipe (no `-<sequence>` suffix) are not contenders.
            let sequence = name.rsplit_once('-')?.1.parse().ok()?;
            Some(Node {
                name,
                sequence,
                czxid: 0,
            })
        })
        .collect();
    nodes.sort_by_key(|node| node.sequence);
    Ok(Line(nodes))
}

/// `node` with its creation zxid, if it still exists.
async fn stat_of(client: &zk::Client, lock_node: &str, node: Node) -> Result<Option<Node>> {
    let path = format!("{lock_node}/{}", node.name);
    Ok(client.check_stat(&path).await?.map(|stat| Node {
        czxid: stat.czxid,
        ..node
    }))
}

fn fence_of(czxid: i64) -> Fence {
    Fence::new(u64::try_from(czxid).expect("zxids are positive"))
}

/// Delete `name` under `lock_node`; already gone is fine.
async fn delete(client: &zk::Client, lock_node: &str, name: &str) -> Result<()> {
    match client.delete(&format!("{lock_node}/{name}"), None).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn lost_place(key: &str, error: zk::Error) -> Error {
    match error {
        zk::Error::SessionExpired => Error::LostPlace {
            key: key.to_owned(),
            why: "the ZooKeeper session expired, and its node with it",
        },
        error => error.into(),
    }
}

impl Backend for ZkLock {
    fn check_key(&self, key: &str) -> Result<()> {
        let reason = if key.is_empty() {
            "the key is empty"
        } else if key.len() > MAX_KEY_BYTES {
            "the key is longer than 512 bytes"
        } else if key.contains('/') {
            "the key contains '/' (a ZooKeeper node name cannot)"
        } else if key == "." || key == ".." {
            "the key is '.' or '..' (not a ZooKeeper node name)"
        } else if key.chars().any(|c| c.is_control()) {
            "the key contains a control character"
        } else {
            return Ok(());
        };
        Err(Error::InvalidKey {
            key: key.chars().take(64).collect(),
            reason,
        })
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
        self.on_session(|client| self.try_lock_on(client, key, token))
            .await
    }

    /// Create our node, then until it heads the line: watch the node just before it, and
    /// look again when that one goes. Not run again on a new session once our node is made:
    /// a new node would stand at the back of the line.
    async fn lock_in_line(&self, key: &str, token: &Token, ttl: Duration) -> Result<Turn> {
        self.check_ttl(ttl)?;
        let lock_node = self.lock_node(key);
        let (client, own) = self
            .on_session(|client| {
                let lock_node = &lock_node;
                async move {
                    let own = self.join(&client, lock_node, token).await?;
                    Ok((client, own))
                }
            })
            .await?;
        self.wait_for_turn(&client, key, &lock_node, own).await
    }

    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        self.check_ttl(ttl)?;
        // TIMING: see `wait_for_turn`: a read answered on the session proves it alive.
        self.on_session(|client| async move {
            let line = line(&client, &self.lock_node(key)).await?;
            Ok(match line.head() {
                Some(head) if is_own(&head.name, token) => Renewal::Renewed,
                Some(_) => Renewal::Taken,
                None => Renewal::Gone,
            })
        })
        .await
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        self.on_session(|client| self.unlock_on(client, key, token))
            .await
    }

    /// ZooKeeper's fences cannot be set back (a zxid only grows), so a holder's fence is
    /// already above every earlier one: this only checks that we still hold the lock, and
    /// refuses a `seen` at or above our fence, which cannot have come from this ensemble
    /// while we hold it.
    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        let ours = self
            .on_session(|client| async move {
                let lock_node = self.lock_node(key);
                let line = line(&client, &lock_node).await?;
                let Some(head) = line
                    .head()
                    .filter(|head| is_own(&head.name, token))
                    .cloned()
                else {
                    return Ok(None);
                };
                Ok(stat_of(&client, &lock_node, head)
                    .await?
                    .map(|head| fence_of(head.czxid)))
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
            let line = line(&client, &lock_node).await?;
            let Some(head) = line.head().cloned() else {
                return Ok(LockState::new(false, None, None, Some(0)));
            };
            let waiting = line.0.len() - 1;
            let fence = stat_of(&client, &lock_node, head)
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
            let line = line(&client, &lock_node).await?;
            let Some(head) = line.head() else {
                return Ok(false);
            };
            match client
                .delete(&format!("{lock_node}/{}", head.name), None)
                .await
            {
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
        let created = self.join(&client, &lock_node, token).await?;
        let line = line(&client, &lock_node).await?;
        let own: Vec<Node> = line.own(token).cloned().collect();
        let head_is_ours = line.head().is_some_and(|head| is_own(&head.name, token));
        // Keep the first of our nodes if it heads the line (a retried attempt may have made
        // two); every other node of ours goes.
        let keep = own.first().filter(|_| head_is_ours).cloned();
        for node in &own {
            if keep.as_ref().is_none_or(|kept| kept.name != node.name) {
                delete(&client, &lock_node, &node.name).await?;
            }
        }
        let Some(kept) = keep else {
            return Ok(Attempt::Held { expires_in: None });
        };
        let czxid = if kept.name == created.name {
            created.czxid
        } else {
            match stat_of(&client, &lock_node, kept).await? {
                Some(node) => node.czxid,
                None => return Ok(Attempt::Held { expires_in: None }),
            }
        };
        Ok(Attempt::Acquired(fence_of(czxid)))
    }

    /// Until `own` heads the line: watch the node just before it, and look again when that
    /// one goes.
    async fn wait_for_turn(
        &self,
        client: &zk::Client,
        key: &str,
        lock_node: &str,
        own: Node,
    ) -> Result<Turn> {
        let lock_node = lock_node.to_owned();
        let mut waited = false;
        loop {
            // TIMING: the lease is counted from before this read: a session that answers it
            // is alive at the server, which keeps it at least one session timeout longer.
            let proven_at = Instant::now();
            let line = line(client, &lock_node)
                .await
                .map_err(|error| match error {
                    Error::ZooKeeper(error) => lost_place(key, error),
                    error => error,
                })?;
            let Some(place) = line.0.iter().position(|node| node.name == own.name) else {
                return Err(Error::LostPlace {
                    key: key.to_owned(),
                    why: "our node is gone (the ZooKeeper session expired)",
                });
            };
            if place == 0 {
                return Ok(Turn::new(fence_of(own.czxid), proven_at, waited));
            }
            waited = true;
            let before = format!("{lock_node}/{}", line.0[place - 1].name);
            let (stat, watcher) = client
                .check_and_watch_stat(&before)
                .await
                .map_err(|error| lost_place(key, error))?;
            if stat.is_none() {
                // Gone between the listing and the watch: look again.
                continue;
            }
            let event = watcher.changed().await;
            self.inner.wake_ups.fetch_add(1, Ordering::Relaxed);
            if event.session_state.is_terminated() {
                return Err(Error::LostPlace {
                    key: key.to_owned(),
                    why: "the ZooKeeper session ended while waiting",
                });
            }
        }
    }

    async fn unlock_on(&self, client: zk::Client, key: &str, token: &Token) -> Result<Unlock> {
        let lock_node = self.lock_node(key);
        let line = line(&client, &lock_node).await?;
        let own: Vec<Node> = line.own(token).cloned().collect();
        if own.is_empty() {
            return Ok(if line.is_empty() {
                Unlock::Gone
            } else {
                Unlock::Taken
            });
        }
        for node in &own {
            delete(&client, &lock_node, &node.name).await?;
        }
        Ok(Unlock::Released)
    }
}
