//! The line: join it (create our ephemeral sequential node), wait for a turn (watch only
//! the node just before ours), prove it (a write on our session, then our node's stat), and
//! leave it. The steps behind [`Backend`](crate::backend::Backend)'s `try_lock`,
//! `lock_in_line` and `renew` for ZooKeeper.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use zookeeper_client as zk;

use super::ZkLock;
use super::contenders::{Line, Node, fence_of, is_own};
use super::session::{RETRY_AFTER, session_ended, transient};
use crate::backend::{Attempt, Renewal, Turn, Unlock};
use crate::error::{Error, Result};
use crate::token::Token;

/// Tries to create a node whose parent ZooKeeper may be deleting meanwhile (an empty
/// container is reaped by the server), before the error is passed on.
const CREATE_TRIES: usize = 5;

const CONTENDER: zk::CreateOptions<'static> =
    zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
const LOCK_NODE: zk::CreateOptions<'static> =
    zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());

impl ZkLock {
    /// [`Backend::try_lock`](crate::backend::Backend::try_lock) on ZooKeeper.
    pub(super) async fn attempt(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
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

    /// [`Backend::lock_in_line`](crate::backend::Backend::lock_in_line) on ZooKeeper.
    pub(super) async fn wait_in_line(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<Turn> {
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

    /// [`Backend::renew`](crate::backend::Backend::renew) on ZooKeeper.
    pub(super) async fn renew_turn(
        &self,
        key: &str,
        token: &Token,
        ttl: Duration,
    ) -> Result<Renewal> {
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

    /// Create our contender node under `lock_node`, the lock node first if it is missing.
    /// A reply lost with the connection is looked for by token before trying again. The
    /// token is claimed before anything is sent, so that whatever happens to the reply, the
    /// node is deleted in the end (by `unlock`, or by the reaper).
    pub(super) async fn join(&self, client: &zk::Client, key: &str, token: &Token) -> Result<Node> {
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
                        claim.uncertain = claim.lost_reply;
                    });
                    return Ok(node);
                }
                Err(zk::Error::NoNode) => {
                    // Refused: nothing was made by this try (an earlier one whose reply was
                    // lost may still land).
                    self.with_claim(token, |claim| claim.uncertain = claim.lost_reply);
                    self.bounded(client.mkdir(&lock_node, &LOCK_NODE)).await?;
                    zk::Error::NoNode
                }
                Err(error @ (zk::Error::ConnectionLoss | zk::Error::Timeout)) => {
                    // The create may have been applied, or may be later: the claim stays
                    // uncertain (a node found now may be another try's).
                    self.with_claim(token, |claim| claim.lost_reply = true);
                    if let Some(own) = self.find_own(client, &lock_node, token).await? {
                        self.with_claim(token, |claim| claim.node = Some(own.name.clone()));
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
    pub(super) async fn find_own(
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
    pub(super) async fn line(&self, client: &zk::Client, lock_node: &str) -> Result<Line> {
        let children = match self.bounded(client.list_children(lock_node)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        Ok(Line::of(children))
    }

    /// `node` with its creation zxid, if it still exists.
    pub(super) async fn stat_of(
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
    pub(super) async fn prove(
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
    pub(super) async fn delete_own(
        &self,
        client: &zk::Client,
        key: &str,
        token: &Token,
    ) -> Result<Unlock> {
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
    pub(super) async fn delete(
        &self,
        client: &zk::Client,
        lock_node: &str,
        name: &str,
    ) -> Result<()> {
        let path = format!("{lock_node}/{name}");
        match self.bounded(client.delete(&path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    pub(super) async fn try_lock_on(
        &self,
        client: zk::Client,
        key: &str,
        token: &Token,
    ) -> Result<Attempt> {
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
    pub(super) async fn wait_for_turn(
        &self,
        client: &zk::Client,
        key: &str,
        token: &Token,
    ) -> Result<Turn> {
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
                Err(error) if session_ended(&error) => {
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
    pub(super) async fn look_for_turn(
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
            return Err(zk::Error::SessionExpired.into());
        }
        if event.event_type == zk::EventType::NodeDeleted {
            self.inner.wake_ups.fetch_add(1, Ordering::Relaxed);
        }
        Ok(None)
    }
}

fn lost_place(key: &str, why: &'static str) -> Error {
    Error::LostPlace {
        key: key.to_owned(),
        why,
    }
}
