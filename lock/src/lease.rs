//! What the holder knows about its lease, and the watchdog that keeps it alive.
//!
//! The [`Lease`] is shared by the guard and the watchdog: the deadline until which the lock
//! is known to be ours, whether it has been lost and why, and how often it was renewed.
//! The watchdog is one tokio task per held lock. It renews with a compare-and-pexpire script,
//! so it can never extend a lock another owner holds, and it is aborted before the release
//! script runs, so it never renews after unlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::sync::Notify;
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

impl LockLost {
    fn code(self) -> u8 {
        match self {
            LockLost::Expired => 1,
            LockLost::Taken => 2,
            LockLost::Unreachable => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(LockLost::Expired),
            2 => Some(LockLost::Taken),
            3 => Some(LockLost::Unreachable),
            _ => None,
        }
    }
}

/// The lease as the holder sees it.
pub(crate) struct Lease {
    /// When the acquire command was sent; deadlines are stored relative to it.
    base: Instant,
    /// The lease is ours until `base + until_ns`, unless renewed.
    ///
    // SAFETY(timing): the deadline is counted from the moment the acquire or renew command
    // was *sent*. Redis starts the key's TTL when it *runs* the command, later, so the local
    // deadline falls before the real expiry as long as the two clocks run at the same rate
    // (monotonic clocks on one host; a drift of a few ms per ttl between hosts).
    until_ns: AtomicU64,
    /// 0 while not lost, else a `LockLost` code; final once set.
    lost: AtomicU8,
    /// Whether a watchdog renews this lease (if not, running out means plain expiry).
    watched: bool,
    /// Successful renewals.
    renewals: AtomicU64,
    /// Woken when the lease is renewed or lost, for `wait_lost`.
    changed: Notify,
}

impl Lease {
    pub(crate) fn new(sent: Instant, ttl: Duration, watched: bool) -> Self {
        Self {
            base: sent,
            until_ns: AtomicU64::new(ttl.as_nanos() as u64),
            lost: AtomicU8::new(0),
            watched,
            renewals: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    pub(crate) fn until(&self) -> Instant {
        self.base + Duration::from_nanos(self.until_ns.load(Ordering::Acquire))
    }

    pub(crate) fn lost(&self) -> Option<LockLost> {
        LockLost::from_code(self.lost.load(Ordering::Acquire))
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost().is_none() && Instant::now() < self.until()
    }

    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = (sent + ttl).saturating_duration_since(self.base).as_nanos() as u64;
        self.until_ns.fetch_max(until, Ordering::AcqRel);
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    pub(crate) fn lose(&self, why: LockLost) {
        let _ = self
            .lost
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire);
        self.changed.notify_waiters();
    }
}

/// Wait until the lease is lost, whether the watchdog says so or the deadline passes
/// without a renewal.
pub(crate) async fn wait_lost(lease: Arc<Lease>) -> LockLost {
    loop {
        // Register for a change before looking, so a change in between is not missed.
        let changed = lease.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Some(why) = lease.lost() {
            return why;
        }
        let until = lease.until();
        tokio::select! {
            () = changed => {}
            () = sleep_until(until) => {
                if let Some(why) = lease.lost() {
                    return why;
                }
                if lease.until() <= Instant::now() {
                    return if lease.watched { LockLost::Unreachable } else { LockLost::Expired };
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
    pub(crate) lease: Arc<Lease>,
}

/// A failed renewal is retried this often until the lease runs out.
pub(crate) const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

impl<C> Watchdog<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(crate) fn spawn(self) -> JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn run(mut self) {
        let ttl_ms = self.ttl.as_millis() as u64;
        loop {
            // SAFETY(timing): renewing every `ttl / 3` leaves two thirds of a lease for a
            // renewal to reach Redis, for the runtime to schedule this task, and for retries
            // after an error. A process paused for longer (GC-like stall, SIGSTOP) loses the
            // lock; fencing, not this task, protects the data then.
            sleep(self.every).await;
            loop {
                let until = self.lease.until();
                let sent = Instant::now();
                if sent >= until {
                    self.lease.lose(LockLost::Unreachable);
                    return;
                }
                let mut renew = RENEW.key(&self.key);
                renew.arg(&self.token).arg(ttl_ms);
                match timeout(until - sent, renew.invoke_async::<i64>(&mut self.conn)).await {
                    Ok(Ok(1)) => {
                        self.lease.renewed(sent, self.ttl);
                        break;
                    }
                    Ok(Ok(0)) => {
                        self.lease.lose(LockLost::Expired);
                        return;
                    }
                    Ok(Ok(_)) => {
                        self.lease.lose(LockLost::Taken);
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
