//! The reaper: a task per handle that deletes the nodes of claims that fell due (a lease
//! that ran out without a renewal or a release, a release that failed, a create whose reply
//! was lost), holders first, one listing per key, until the handle is gone.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};
use zookeeper_client as zk;

use super::claims::Claim;
use super::contenders::is_own;
use super::session::{RETRY_AFTER, transient};
use super::{Inner, ZkLock};
use crate::error::Result;
use crate::token::Token;

/// How a pass of the reaper ended.
enum Pass {
    /// Every due claim was dealt with; the next falls due then (`None`: none is left).
    Done(Option<Instant>),
    /// The ensemble did not answer: every due claim waits for the retry.
    Unreachable,
}

impl ZkLock {
    /// Delete the nodes of every claim whose time has come, holders first.
    async fn reap_due(&self) -> Pass {
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
                    let away = transient(&error);
                    let rest: Vec<Sweep> = if away {
                        sweeps.by_ref().collect()
                    } else {
                        Vec::new()
                    };
                    for token in std::iter::once(&sweep).chain(&rest).flat_map(|s| &s.tokens) {
                        self.with_claim(token, |claim| claim.due = Some(retry));
                    }
                    if away {
                        return Pass::Unreachable;
                    }
                }
            }
        }
        Pass::Done(self.claims().values().filter_map(|claim| claim.due).min())
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
pub(super) async fn reap(inner: Weak<Inner>, wake: Arc<Notify>) {
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
            // TIMING: wake-ups (a claim just fell due) wait for the retry too, so that the
            // next pass takes every due claim, holders first, and not the newest alone.
            Pass::Unreachable => sleep(RETRY_AFTER).await,
            Pass::Done(Some(at)) => {
                tokio::select! {
                    () = sleep_until(at) => {}
                    () = woken => {}
                }
            }
            Pass::Done(None) => woken.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn claim(key: &str, node: Option<&str>, due: Option<Instant>, uncertain: bool) -> Claim {
        Claim {
            token: Token::new(),
            key: key.to_owned(),
            node: node.map(str::to_owned),
            due,
            uncertain,
            lost_reply: false,
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
}
