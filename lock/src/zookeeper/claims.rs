//! The claims: every contender node this handle made, or may have made, by token, with the
//! instant until which its holder may count on it. A claim is made before a `create` is
//! sent, so that whatever happens to the reply, the node is deleted in the end (by
//! `unlock`, or by the reaper).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::ZkLock;
use crate::error::Result;
use crate::token::Token;

/// The most claims without a node (creates whose reply never came, left for the reaper to
/// look for) a handle keeps: past it, a new attempt is refused as timed out. They pile up
/// only while the ensemble does not answer; waiters' and holders' claims, which have their
/// node, do not count.
const MAX_CLAIMS: usize = 1_024;

/// A node this handle made (or may have made) for one token, until it is known deleted.
#[derive(Debug, Clone)]
pub(super) struct Claim {
    /// The token the node is named after.
    pub(super) token: Token,
    /// The lock's key.
    pub(super) key: String,
    /// The node's name under the lock node, once known.
    pub(super) node: Option<String>,
    /// When the reaper deletes the token's nodes. `None` while a step of this handle is
    /// answerable for them (a waiter in line; the locker gives its place up with `unlock`).
    // TIMING: one ttl after the last turn or renewal was *answered*, which is no earlier
    // than the holder's own deadline (one ttl after it was *sent*): the reaper never takes
    // a lock from a holder whose lease still runs.
    pub(super) due: Option<Instant>,
    /// A `create` was sent whose reply has not been seen (in flight, or lost with its
    /// connection): it may still land after we looked for it, so the reaper looks once
    /// more, a session timeout later, before it forgets the token.
    pub(super) uncertain: bool,
    /// A `create`'s reply was lost with its connection: that create may land unseen
    /// whatever the replies to later ones, so the claim stays `uncertain` until swept.
    pub(super) lost_reply: bool,
}

impl ZkLock {
    pub(super) fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Claim>> {
        self.inner
            .claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Change the claim of `token`, if this handle has one.
    pub(super) fn with_claim(&self, token: &Token, change: impl FnOnce(&mut Claim)) {
        if let Some(claim) = self.claims().get_mut(token.as_str()) {
            change(claim);
        }
    }

    /// `token` holds its lock for `ttl` from now, unless renewed or released: then the
    /// reaper deletes its node.
    pub(super) fn lease_until(&self, token: &Token, ttl: Duration) {
        self.reap_after(token, ttl);
    }

    /// The reaper takes over `token`'s nodes `after` from now.
    pub(super) fn reap_after(&self, token: &Token, after: Duration) {
        self.with_claim(token, |claim| claim.due = Some(Instant::now() + after));
        self.inner.reap_now.notify_one();
    }

    /// The token's nodes were looked for (after a `sync`) and deleted: forget it, unless a
    /// `create` of it whose reply was lost could still land; then look once more, a session
    /// timeout later.
    pub(super) fn swept(&self, token: &str) {
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

    /// Claim `token`'s nodes under `key` before anything is sent, unless the map is full.
    pub(super) fn claim(&self, key: &str, token: &Token) -> Result<()> {
        let mut claims = self.claims();
        if claims.contains_key(token.as_str()) {
            return Ok(());
        }
        if claims.len() >= MAX_CLAIMS
            && claims.values().filter(|claim| claim.node.is_none()).count() >= MAX_CLAIMS
        {
            // The claims pile up only while the ensemble does not answer: an attempt now
            // would meet the same time-out, and leave one more claim behind.
            tracing::warn!(
                claims = claims.len(),
                "ZooKeeper: too many nodes left to look for; refusing a new attempt until the reaper has"
            );
            return Err(zk::Error::Timeout.into());
        }
        claims.insert(
            token.as_str().to_owned(),
            Claim {
                token: token.clone(),
                key: key.to_owned(),
                node: None,
                due: None,
                uncertain: false,
                lost_reply: false,
            },
        );
        Ok(())
    }
}
