//! One acquire attempt, or one place in a backend's line, made in a task of its own, and the
//! hold it becomes: its lease, its watchdog and the first wait for replicas.
//!
//! The task finishes what it started even if its caller goes away (a deadline, a cancelled
//! request): a release sent right away could overtake the acquire on another connection (a
//! pool). What it took travels back as an [`Unclaimed`], which gives the lock back if nobody
//! claims it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{Attempt, Backend};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::guard::{Hold, release_in_background};
use crate::lease::Lease;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::token::Token;
use crate::waiting::LocalKey;
use crate::watchdog::Watchdog;

/// What one acquire attempt came to: `T` taken, or the key held by another owner (an
/// answer, not an error).
pub(crate) enum Attempted<T> {
    /// The lock is ours.
    Took(T),
    /// Another owner holds the key; `expires_in` is what is left of its lease, when known.
    Held {
        /// The holder's remaining lease.
        expires_in: Option<Duration>,
    },
}

impl<B: Backend> Locker<B> {
    /// One acquire attempt: the hold, or the word that another owner holds the key. `local`
    /// is the key's local state, for the hold (when this process's waiters take turns). In a
    /// task of its own (see the module doc) when a tokio runtime runs.
    pub(super) async fn attempt(
        &self,
        key: &str,
        options: &LockOptions,
        local: Option<Arc<LocalKey>>,
    ) -> Result<Attempted<Hold<B>>> {
        let token = Token::new();
        let ttl = options.ttl();
        // TIMING: the lease is counted from before the command is sent (see `Lease`).
        let sent = Instant::now();
        let backend = Arc::clone(&self.backend);
        let taken = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (answer, answered) = oneshot::channel();
                let owned_key = key.to_owned();
                runtime.spawn(async move {
                    let attempt = backend.try_lock(&owned_key, &token, ttl).await;
                    // Unheard answers are dropped, and an `Unclaimed` gives its lock back.
                    let unclaimed = Unclaimed::from_attempt(backend, owned_key, token, attempt);
                    let _ = answer.send(unclaimed);
                });
                answered.await.map_err(|_| self.aborted(key))??
            }
            Err(_) => {
                let attempt = backend.try_lock(key, &token, ttl).await;
                Unclaimed::from_attempt(backend, key.to_owned(), token, attempt)?
            }
        };
        match taken {
            Attempted::Took(unclaimed) => {
                let hold = self.hold(unclaimed, options, sent, local).await?;
                Ok(Attempted::Took(hold))
            }
            Attempted::Held { expires_in } => Ok(Attempted::Held { expires_in }),
        }
    }

    /// Join the backend's line for `key` and wait for our turn; in a task of its own, which
    /// gives up its place (`unlock` by token) when this future is dropped.
    pub(super) async fn queue(&self, key: &str, options: &LockOptions) -> Result<Hold<B>> {
        let token = Token::new();
        let ttl = options.ttl();
        let (answer, mut answered) = oneshot::channel();
        let backend = Arc::clone(&self.backend);
        let owned_key = key.to_owned();
        tokio::spawn(async move {
            let mut answer = answer;
            let in_line = backend.lock_in_line(&owned_key, &token, ttl);
            let turn = tokio::select! {
                turn = in_line => turn,
                () = answer.closed() => {
                    // Nobody waits any more: leave the line (or give back what it took).
                    release_in_background(backend, owned_key, token, None);
                    return;
                }
            };
            let claimed = match turn {
                Ok(turn) => Ok((
                    Unclaimed::acquired(backend, owned_key, token, turn.fence),
                    turn,
                )),
                Err(error) => {
                    // Our place may be left in the line (a node, a key): give it up.
                    release_in_background(backend, owned_key, token, None);
                    Err(error)
                }
            };
            // Unheard answers are dropped, and an `Unclaimed` gives its lock back.
            let _ = answer.send(claimed);
        });
        let (unclaimed, turn) = (&mut answered).await.map_err(|_| self.aborted(key))??;
        // TIMING: the wait in line may have lasted longer than a ttl; the backend kept its
        // own lease (a session, a lease kept alive) meanwhile, and says when a request last
        // proved it alive. The holder's lease is counted from there.
        let mut hold = self.hold(unclaimed, options, turn.proven_at, None).await?;
        hold.contended = turn.waited;
        Ok(hold)
    }

    /// The hold of a lock an attempt took: its lease, its watchdog (inside a tokio runtime)
    /// and, when asked, the first wait for replicas.
    async fn hold(
        &self,
        unclaimed: Unclaimed<B>,
        options: &LockOptions,
        sent: Instant,
        local: Option<Arc<LocalKey>>,
    ) -> Result<Hold<B>> {
        let (key, token, fence) = unclaimed.claim();
        let ttl = options.ttl();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let renew_interval = options.renew_interval().filter(|_| runtime.is_some());
        if runtime.is_none() && options.renew_interval().is_some() {
            tracing::warn!(%key, "lock taken outside a tokio runtime: no watchdog; the lease frees it within one ttl");
        }
        let lease = Arc::new(Lease::with_ttl(
            sent,
            self.backend.lease(ttl),
            ttl,
            renew_interval.is_some(),
        ));
        let mut hold = Hold {
            backend: Arc::clone(&self.backend),
            key,
            token,
            fence: fence.get().into(),
            lease,
            watchdog: None,
            local,
            released: false.into(),
            contended: false,
            replicas: options.wait_for_replicas(),
            renew_interval,
        };
        if let Some((wanted, within)) = hold.replicas {
            // Dropping `hold` on an error gives the lock back (its drop fallback).
            hold.lease
                .set_replicas(self.backend.wait_for_replicas(wanted, within).await?);
        }
        if let (Some(every), Some(runtime)) = (renew_interval, runtime) {
            let watchdog = Watchdog {
                backend: Arc::clone(&self.backend),
                key: hold.key.clone(),
                token: hold.token.clone(),
                every,
                replicas: hold.replicas,
                first_sent: sent,
                lease: Arc::clone(&hold.lease),
            };
            hold.watchdog = Some(self.watchdogs.schedule(&runtime, watchdog));
        }
        Ok(hold)
    }

    pub(super) fn aborted(&self, key: &str) -> Error {
        Error::Aborted {
            key: key.to_owned(),
        }
    }
}

/// An acquisition on its way from the task that made it to its caller. If nobody claims it
/// (the caller went away just before or just after it was handed over), dropping it gives
/// the lock back in the background: no lock is left for a whole ttl with no watchdog.
struct Unclaimed<B: Backend> {
    backend: Arc<B>,
    key: String,
    /// `None` once claimed.
    token: Option<Token>,
    fence: Fence,
}

impl<B: Backend> Unclaimed<B> {
    /// What an attempt's answer hands over: the acquisition, or what is left of the
    /// holder's lease. An error may hide an acquire that ran anyway (a reply lost after the
    /// backend took the key), so the token is given back then too.
    fn from_attempt(
        backend: Arc<B>,
        key: String,
        token: Token,
        attempt: Result<Attempt>,
    ) -> Result<Attempted<Self>> {
        match attempt {
            Ok(Attempt::Acquired(fence)) => {
                Ok(Attempted::Took(Self::acquired(backend, key, token, fence)))
            }
            Ok(Attempt::Held { expires_in }) => Ok(Attempted::Held { expires_in }),
            Err(error) => {
                release_in_background(backend, key, token, None);
                Err(error)
            }
        }
    }

    /// `token` took `key` with `fence`.
    fn acquired(backend: Arc<B>, key: String, token: Token, fence: Fence) -> Self {
        Self {
            backend,
            key,
            token: Some(token),
            fence,
        }
    }

    fn claim(mut self) -> (String, Token, Fence) {
        let token = self.token.take().expect("claimed once");
        (std::mem::take(&mut self.key), token, self.fence)
    }
}

impl<B: Backend> Drop for Unclaimed<B> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let key = std::mem::take(&mut self.key);
            release_in_background(Arc::clone(&self.backend), key, token, None);
        }
    }
}
