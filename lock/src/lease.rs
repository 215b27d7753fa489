//! What the holder knows about its lease, and the watchdog that keeps it alive.
//!
//! The watchdog is one tokio task per held lock. It owns the only [`watch::Sender`] of the
//! lease state; guards read the state through a receiver. It renews with a compare-and-pexpire
//! script, so it can never extend a lock that another owner holds, and it is aborted before
//! the release script runs, so it never renews after unlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::scripts::RENEW;

/// Why a holder lost its lock before releasing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockLost {
    /// The key is gone: the lease ran out, or somebody deleted it.
    Expired,
    /// Another owner's token is in the key: the lease ran out and someone else took the lock,
    /// or the key was overwritten.
    Taken,
    /// Redis could not be reached to renew the lease before it ran out, so the lock must be
    /// presumed expired.
    Unreachable,
}

impl std::fmt::Display for LockLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockLost::Expired => "the lock expired or was deleted",
            LockLost::Taken => "another owner took the lock",
            LockLost::Unreachable => "redis was unreachable until the lease ran out",
        })
    }
}

/// The lease as the holder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Ours until `until`, unless renewed.
    ///
    // SAFETY(timing): `until` is counted from the moment the acquire or renew command was
    // *sent*. Redis starts the key's TTL when it *runs* the command, later, so the local
    // deadline falls before the real expiry as long as the two clocks run at the same rate
    // (monotonic clocks on one host; a drift of a few ms per ttl between hosts).
    Held { until: Instant },
    /// Lost before release; final.
    Lost(LockLost),
}

impl Lease {
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, Lease::Held { until } if Instant::now() < *until)
    }
}

/// Wait until the lease in `state` is lost, whether the watchdog says so or the local
/// deadline passes without a renewal.
pub(crate) async fn wait_lost(mut state: watch::Receiver<Lease>) -> LockLost {
    loop {
        let lease = *state.borrow_and_update();
        match lease {
            Lease::Lost(why) => return why,
            Lease::Held { until } => {
                tokio::select! {
                    changed = state.changed() => {
                        if changed.is_err() {
                            // No watchdog (off, or stopped): nothing will renew the lease.
                            sleep_until(until).await;
                            return LockLost::Expired;
                        }
                    }
                    () = sleep_until(until) => {
                        // The deadline may have just been pushed forward: look again
                        // before calling it lost.
                        if !state.borrow().is_held() {
                            return match *state.borrow() {
                                Lease::Lost(why) => why,
                                Lease::Held { .. } => LockLost::Unreachable,
                            };
                        }
                    }
                }
            }
        }
    }
}

/// What the watchdog needs to renew one lock.
pub(crate) struct Watchdog<C> {
    pub(crate) conn: C,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    pub(crate) every: Duration,
    /// Successful renewals, shared with the guard.
    pub(crate) renewals: Arc<AtomicU64>,
}

/// A failed renewal is retried this often until the lease runs out.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

impl<C> Watchdog<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn spawn(self, state: watch::Sender<Lease>) -> JoinHandle<()> {
        tokio::spawn(self.run(state))
    }

    async fn run(mut self, state: watch::Sender<Lease>) {
        let ttl_ms = self.ttl.as_millis() as u64;
        loop {
            // SAFETY(timing): renewing every `ttl / 3` leaves two thirds of a lease for a
            // renewal to reach Redis, for the runtime to schedule this task, and for retries
            // after an error. A process paused for longer (GC-like stall, SIGSTOP) loses the
            // lock; fencing, not this task, protects the data then.
            sleep(self.every).await;
            loop {
                let Lease::Held { until } = *state.borrow() else {
                    return;
                };
                let sent = Instant::now();
                if sent >= until {
                    state.send_replace(Lease::Lost(LockLost::Unreachable));
                    return;
                }
                let mut renew = RENEW.key(&self.key);
                renew.arg(&self.token).arg(ttl_ms);
                match timeout(until - sent, renew.invoke_async::<i64>(&mut self.conn)).await {
                    Ok(Ok(1)) => {
                        self.renewals.fetch_add(1, Ordering::Relaxed);
                        state.send_replace(Lease::Held {
                            until: sent + self.ttl,
                        });
                        break;
                    }
                    Ok(Ok(0)) => {
                        state.send_replace(Lease::Lost(LockLost::Expired));
                        return;
                    }
                    Ok(Ok(_)) => {
                        state.send_replace(Lease::Lost(LockLost::Taken));
                        return;
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(key = %self.key, %error, "lock renewal failed; retrying");
                        sleep(
                            RETRY_AFTER_ERROR.min(until.saturating_duration_since(Instant::now())),
                        )
                        .await;
                    }
                    Err(_elapsed) => {}
                }
            }
        }
    }
}
