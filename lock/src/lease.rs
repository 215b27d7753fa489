//! What the holder knows about its lease.
//!
//! The [`Lease`] is shared by the guard and the watchdog: the deadline until which the lock
//! is known to be ours, whether it has been lost and why, and how often it was renewed.
//! "Lost" is final: once anyone sees the deadline pass, or the backend says the lock is gone
//! or taken, [`Lease::is_held`] stays `false` and a renewal that lands later changes nothing.
//!
//! The watchdog that renews it is in `watchdog`; [`renew`] is the one renewal both it and
//! `LockGuard::extend` send.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use crate::backend::{Backend, Renewal};
use crate::token::Token;

/// Why a holder lost its lock before releasing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockLost {
    /// The lock is gone: the lease ran out, or somebody deleted it.
    Expired,
    /// Another owner's token is in the lock: the lease ran out and someone else took it,
    /// or it was overwritten.
    Taken,
    /// The backend could not be reached to renew the lease before it ran out, so the lock
    /// must be presumed expired.
    Unreachable,
}

impl std::fmt::Display for LockLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockLost::Expired => "the lock expired or was deleted",
            LockLost::Taken => "another owner took the lock",
            LockLost::Unreachable => "the lock's backend was unreachable until the lease ran out",
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
    // TIMING: the deadline is counted from the moment the acquire or renew command was
    // *sent*. The backend starts its own expiry when it *runs* the command, later, so the
    // local deadline falls before the real expiry as long as the two clocks run at the same
    // rate (a drift of a few ms per ttl between hosts, which Redlock's drift allowance
    // covers). The holder's side is a monotonic clock; the server's is not: Redis keeps a
    // key's expiry as an absolute Unix time in ms, and the lock table compares
    // `clock_timestamp()`. A server wall clock that steps *forward* expires the lease before
    // this deadline, while `is_held()` still says true; one that steps back lengthens it.
    // Servers must slew their clocks, not step them; the fence covers a holder caught out.
    until_ns: AtomicU64,
    /// 0 while not lost, else a `LockLost` code; final once set.
    lost: AtomicU8,
    /// Whether a watchdog renews this lease (if not, running out means plain expiry).
    watched: bool,
    /// Successful renewals.
    renewals: AtomicU64,
    /// Woken when the lease is renewed or lost, for `wait_lost`.
    changed: Notify,
    /// The ttl renewals ask for, in ms: the options' ttl, until `LockGuard::extend` changes it.
    ttl_ms: AtomicU64,
    /// Held while a renewal (the watchdog's, or an `extend`) is in flight, so that they land
    /// one at a time, in the order they were sent, and the deadline can be set to the last
    /// one's (an `extend` may shorten it).
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// Replicas that acknowledged the last acquire or renewal (`NO_REPLICA_COUNT` until asked).
    replicas: AtomicU64,
}

/// `Lease::replicas` before any replica was waited for.
const NO_REPLICA_COUNT: u64 = u64::MAX;

impl Lease {
    /// `ttl` is at most [`LockOptions::MAX_TTL`](crate::LockOptions::MAX_TTL), so it fits in
    /// 64 bits of nanoseconds.
    #[cfg(test)]
    pub(crate) fn new(sent: Instant, ttl: Duration, watched: bool) -> Self {
        Self::with_ttl(sent, ttl, ttl, watched)
    }

    /// A lease the holder may count on for `lease` from `sent`, renewed with `ttl`.
    pub(crate) fn with_ttl(sent: Instant, lease: Duration, ttl: Duration, watched: bool) -> Self {
        Self {
            base: sent,
            until_ns: AtomicU64::new(lease.as_nanos() as u64),
            lost: AtomicU8::new(0),
            watched,
            renewals: AtomicU64::new(0),
            changed: Notify::new(),
            ttl_ms: AtomicU64::new(ttl.as_millis() as u64),
            renewing: tokio::sync::Mutex::new(()),
            replicas: AtomicU64::new(NO_REPLICA_COUNT),
        }
    }

    /// The ttl renewals ask for.
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Acquire))
    }

    pub(crate) fn set_ttl(&self, ttl: Duration) {
        self.ttl_ms.store(ttl.as_millis() as u64, Ordering::Release);
    }

    /// Replicas that acknowledged the last acquire or renewal, once asked.
    pub(crate) fn replicas(&self) -> Option<u32> {
        match self.replicas.load(Ordering::Acquire) {
            NO_REPLICA_COUNT => None,
            n => Some(n as u32),
        }
    }

    pub(crate) fn set_replicas(&self, replicas: u32) {
        self.replicas.store(u64::from(replicas), Ordering::Release);
    }

    pub(crate) fn until(&self) -> Instant {
        self.base + Duration::from_nanos(self.until_ns.load(Ordering::Acquire))
    }

    pub(crate) fn lost(&self) -> Option<LockLost> {
        LockLost::from_code(self.lost.load(Ordering::Acquire))
    }

    /// Whether the lease is still ours. Seeing the deadline pass records the loss, so the
    /// answer never turns from `false` back to `true`.
    pub(crate) fn is_held(&self) -> bool {
        if self.lost().is_some() {
            return false;
        }
        if Instant::now() >= self.until() {
            self.lose(self.ran_out());
            return false;
        }
        true
    }

    /// Why a lease that ran out without a renewal is lost.
    fn ran_out(&self) -> LockLost {
        if self.watched {
            LockLost::Unreachable
        } else {
            LockLost::Expired
        }
    }

    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// A renewal sent at `sent` succeeded: the lease now ends `lease` after `sent` (earlier
    /// than before, after an `extend` with a shorter ttl). Returns `false` when it came too
    /// late: the lease had already been seen lost, which stays final.
    ///
    /// Renewals are serialized by [`renewing`](Self::renewing), so the last one to land is
    /// the last one sent, and its deadline is the one the backend keeps.
    pub(crate) fn renewed(&self, sent: Instant, lease: Duration) -> bool {
        let until = (sent + lease)
            .saturating_duration_since(self.base)
            .as_nanos() as u64;
        let mut current = self.until_ns.load(Ordering::Acquire);
        loop {
            if !self.is_held() {
                return false;
            }
            match self.until_ns.compare_exchange_weak(
                current,
                until,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        self.renewals.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        true
    }

    pub(crate) fn lose(&self, why: LockLost) {
        let _ = self
            .lost
            .compare_exchange(0, why.code(), Ordering::AcqRel, Ordering::Acquire);
        self.changed.notify_waiters();
    }
}

/// Wait until the lease is lost, whether the watchdog says so or the deadline passes
/// without a renewal (which records the loss, as [`Lease::is_held`] does).
pub(crate) async fn wait_lost(lease: Arc<Lease>) -> LockLost {
    loop {
        // Register for a change before looking, so a change in between is not missed.
        let changed = lease.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if !lease.is_held() {
            return lease.lost().expect("a lease that is not held is lost");
        }
        tokio::select! {
            () = changed => {}
            () = sleep_until(lease.until()) => {}
        }
    }
}

/// One renewal of the lease (the watchdog's, or `LockGuard::extend`'s), sent at `sent` with
/// the lease's current ttl, and the replica wait after it when asked; records what it found.
/// `Renewal::Renewed` only if the lease is still held afterwards. The caller holds
/// [`Lease::renewing`].
pub(crate) async fn renew<B: Backend>(
    backend: &B,
    key: &str,
    token: &Token,
    lease: &Lease,
    sent: Instant,
    replicas: Option<(u32, Duration)>,
) -> crate::Result<Renewal> {
    let ttl = lease.ttl();
    match backend.renew(key, token, ttl).await? {
        Renewal::Renewed => {
            if !lease.renewed(sent, backend.lease(ttl)) {
                return Ok(Renewal::Gone);
            }
            if let Some((wanted, within)) = replicas {
                lease.set_replicas(backend.wait_for_replicas(wanted, within).await?);
            }
            Ok(Renewal::Renewed)
        }
        Renewal::Taken => {
            lease.lose(LockLost::Taken);
            Ok(Renewal::Taken)
        }
        other => {
            lease.lose(LockLost::Expired);
            Ok(other)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_seen_lost_stays_lost_even_if_a_late_renewal_succeeds() {
        // Arrange: a watched lease of 100 ms, and a renewal sent at 90 ms.
        let started = Instant::now();
        let lease = Lease::new(started, Duration::from_millis(100), true);
        tokio::time::advance(Duration::from_millis(90)).await;
        let sent = Instant::now();

        // Act: the deadline passes before the renewal's answer comes back.
        tokio::time::advance(Duration::from_millis(20)).await;
        let held_before = lease.is_held();
        let renewed = lease.renewed(sent, Duration::from_millis(100));

        // Assert
        assert!(!held_before);
        assert!(!renewed, "a late renewal revived a lost lease");
        assert!(!lease.is_held());
        assert_eq!(lease.lost(), Some(LockLost::Unreachable));
        assert_eq!(wait_lost(Arc::new(lease)).await, LockLost::Unreachable);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_lost_records_the_loss_it_reports() {
        let lease = Arc::new(Lease::new(Instant::now(), Duration::from_millis(50), false));

        let why = wait_lost(Arc::clone(&lease)).await;

        assert_eq!(why, LockLost::Expired);
        assert_eq!(
            lease.lost(),
            Some(LockLost::Expired),
            "lost() told a story is_held() does not"
        );
        assert!(!lease.renewed(Instant::now(), Duration::from_secs(1)));
    }
}
