//! Lock options and their builder.

use std::time::Duration;

use crate::error::{Error, Result};

/// How a [`Locker`](crate::Locker) takes, keeps and waits for locks.
///
/// Build one with [`LockOptions::builder`]; [`LockOptions::default`] gives the defaults below.
///
/// | option | default | meaning |
/// |---|---|---|
/// | `ttl` | 10 s | lease: how long the backend keeps the lock if the holder stops renewing it (whole ms, 1 ms to [`LockOptions::MAX_TTL`]) |
/// | `renew_interval` | `ttl / 3` | how often the watchdog renews the lease (at most 3/4 of the ttl); `None` turns it off |
/// | `wait_timeout` | 5 s | how long [`acquire`](crate::Locker::acquire) waits before [`Error::Timeout`]; `Duration::MAX` waits for ever |
/// | `retry_delay` | 5 ms to 100 ms | backoff between attempts while waiting, doubled each time, with jitter; with [release signals](crate::ReleaseSignals), the longest wait for a signal before trying again |
/// | `wait_for_replicas` | off | after every acquire and renewal, wait (Redis `WAIT`) until this many replicas acknowledged it, up to a timeout; [`LockGuard::replicas`](crate::LockGuard::replicas) tells how many did |
///
/// One locker's options are its defaults; [`Locker::acquire_with`](crate::Locker::acquire_with)
/// and [`Locker::try_acquire_with`](crate::Locker::try_acquire_with) take other options for
/// one call (start from [`LockOptions::to_builder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    renew_interval: Option<Duration>,
    wait_timeout: Duration,
    retry_min: Duration,
    retry_max: Duration,
    replicas: Option<(u32, Duration)>,
}

impl LockOptions {
    /// Default lease.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
    /// Default deadline for [`acquire`](crate::Locker::acquire).
    pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default first backoff step.
    pub const DEFAULT_RETRY_MIN: Duration = Duration::from_millis(5);
    /// Default largest backoff step.
    pub const DEFAULT_RETRY_MAX: Duration = Duration::from_millis(100);
    /// The longest lease: a day. Longer leases are almost always a mistake (a crashed holder
    /// blocks everyone that long), and this keeps every deadline far from overflowing.
    pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

    /// A builder that starts from the defaults.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder::default()
    }

    /// A builder that starts from these options (to change one of them for one call).
    pub fn to_builder(&self) -> LockOptionsBuilder {
        LockOptionsBuilder {
            ttl: self.ttl,
            renewal: match self.renew_interval {
                Some(every) if every == self.ttl / 3 => Renewal::ThirdOfTtl,
                Some(every) => Renewal::Every(every),
                None => Renewal::Off,
            },
            wait_timeout: self.wait_timeout,
            retry_min: self.retry_min,
            retry_max: self.retry_max,
            replicas: self.replicas,
        }
    }

    /// The lease given to the backend with every acquire and renewal, in whole milliseconds.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The watchdog's renewal period, or `None` when the watchdog is off.
    pub fn renew_interval(&self) -> Option<Duration> {
        self.renew_interval
    }

    /// How long [`acquire`](crate::Locker::acquire) waits.
    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// The smallest and largest backoff step.
    pub fn retry_delay(&self) -> (Duration, Duration) {
        (self.retry_min, self.retry_max)
    }

    /// How many replicas each acquire and renewal waits for, and for how long at most;
    /// `None` when off.
    pub fn wait_for_replicas(&self) -> Option<(u32, Duration)> {
        self.replicas
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptionsBuilder::default()
            .build()
            .expect("the default options are valid")
    }
}

/// Builds [`LockOptions`], checking them in [`build`](Self::build).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LockOptionsBuilder {
    ttl: Duration,
    renewal: Renewal,
    wait_timeout: Duration,
    retry_min: Duration,
    retry_max: Duration,
    replicas: Option<(u32, Duration)>,
}

/// What the caller asked of the watchdog; the default period depends on the final ttl.
#[derive(Debug, Clone, Copy)]
enum Renewal {
    ThirdOfTtl,
    Every(Duration),
    Off,
}

impl Default for LockOptionsBuilder {
    fn default() -> Self {
        Self {
            ttl: LockOptions::DEFAULT_TTL,
            renewal: Renewal::ThirdOfTtl,
            wait_timeout: LockOptions::DEFAULT_WAIT_TIMEOUT,
            retry_min: LockOptions::DEFAULT_RETRY_MIN,
            retry_max: LockOptions::DEFAULT_RETRY_MAX,
            replicas: None,
        }
    }
}

impl LockOptionsBuilder {
    /// The lease: 1 ms to [`LockOptions::MAX_TTL`]. It is rounded down to whole milliseconds,
    /// the unit backends keep it in, so the holder never counts on more than the backend has.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Renew the lease this often instead of every `ttl / 3`: at most three quarters of the
    /// ttl, so a renewal has time to land.
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.renewal = Renewal::Every(every);
        self
    }

    /// Turn the watchdog off: the lock then lasts at most one ttl, whatever the holder does.
    pub fn without_watchdog(mut self) -> Self {
        self.renewal = Renewal::Off;
        self
    }

    /// How long [`acquire`](crate::Locker::acquire) waits. Zero means a single attempt;
    /// `Duration::MAX` (or anything too long to add to a clock reading) means no deadline.
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait_timeout = wait;
        self
    }

    /// The backoff between attempts: it starts at `min`, doubles up to `max`, and each sleep
    /// is drawn at random from the upper half of the current step.
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max;
        self
    }

    /// After every acquire and renewal, wait until `replicas` replicas have acknowledged it
    /// (Redis's `WAIT replicas timeout`), for at most `timeout`: at most a quarter of the
    /// ttl, since the wait is part of the lease.
    ///
    /// The trade-off: a lock that reached a replica survives a failover to that replica
    /// (Redisson's lock checks the same), at the cost of a replica round trip on every
    /// acquire and renewal. It does not make the lock safe against every failover (an
    /// asynchronous replica can still be promoted without it, and `WAIT` does not make
    /// Redis consistent); the fence is still what keeps the store safe. The guard says how
    /// many replicas acknowledged ([`LockGuard::replicas`](crate::LockGuard::replicas)); a
    /// lock that reached fewer is still held on the primary. Only the single-Redis backend
    /// (and a Sentinel connection) can wait for replicas. Keep `timeout` below the
    /// connection's response timeout (2 s for a `SentinelConnection` by default): a `WAIT`
    /// that outlasts it fails the acquisition (the lock is given back) or the renewal.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((replicas, timeout));
        self
    }

    /// Do not wait for replicas (the default).
    pub fn without_replica_wait(mut self) -> Self {
        self.replicas = None;
        self
    }

    /// Check the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the ttl is under 1 ms or over [`LockOptions::MAX_TTL`],
    /// the renewal interval is zero or above three quarters of the ttl, the backoff is
    /// zero or has `min > max`, or the replica wait asks for no replica or takes more than a
    /// quarter of the ttl.
    pub fn build(self) -> Result<LockOptions> {
        let invalid = |why: String| Err(Error::InvalidOptions(why));
        if self.ttl < Duration::from_millis(1) {
            return invalid(format!("ttl must be at least 1 ms, got {:?}", self.ttl));
        }
        if self.ttl > LockOptions::MAX_TTL {
            return invalid(format!(
                "ttl {:?} is above the largest, {:?}",
                self.ttl,
                LockOptions::MAX_TTL
            ));
        }
        // TIMING: backends keep whole milliseconds; the holder must not count on the fraction.
        let ttl = Duration::from_millis(self.ttl.as_millis() as u64);
        let renew_interval = match self.renewal {
            Renewal::ThirdOfTtl => Some(ttl / 3),
            Renewal::Every(every) => Some(every),
            Renewal::Off => None,
        };
        if let Some(every) = renew_interval {
            if every.is_zero() {
                return invalid("renew interval must be above zero".into());
            }
            // TIMING: a renewal sent `every` after the last must still land within the ttl;
            // a quarter of it is left for the round trip, scheduling and a retry.
            if every * 4 > ttl * 3 {
                return invalid(format!(
                    "renew interval {every:?} must be at most three quarters of the ttl {ttl:?}, or the lease may run out before a renewal lands"
                ));
            }
        }
        if let Some((replicas, timeout)) = self.replicas {
            if replicas == 0 {
                return invalid("wait_for_replicas needs at least one replica".into());
            }
            // TIMING: the wait is part of the lease counted from the command's sending.
            if timeout < Duration::from_millis(1) || timeout * 4 > ttl {
                return invalid(format!(
                    "the replica wait {timeout:?} must be at least 1 ms and at most a quarter of the ttl {ttl:?}"
                ));
            }
        }
        if self.retry_min.is_zero() {
            return invalid("retry delay must be above zero".into());
        }
        if self.retry_min > self.retry_max {
            return invalid(format!(
                "retry delay min {:?} is above max {:?}",
                self.retry_min, self.retry_max
            ));
        }
        Ok(LockOptions {
            ttl,
            renew_interval,
            wait_timeout: self.wait_timeout,
            retry_min: self.retry_min,
            retry_max: self.retry_max,
            replicas: self.replicas,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(builder: LockOptionsBuilder) -> String {
        match builder.build() {
            Err(Error::InvalidOptions(why)) => why,
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
    }

    #[test]
    fn defaults_renew_every_third_of_the_ttl() {
        let options = LockOptions::default();
        assert_eq!(options.ttl(), Duration::from_secs(10));
        assert_eq!(options.renew_interval(), Some(options.ttl() / 3));
    }

    #[test]
    fn a_zero_ttl_is_refused() {
        assert!(refused(LockOptions::builder().ttl(Duration::ZERO)).contains("ttl"));
    }

    #[test]
    fn a_renew_interval_that_leaves_no_time_to_renew_is_refused() {
        let ttl = Duration::from_millis(400);
        for every in [Duration::from_millis(301), ttl, ttl * 2] {
            let why = refused(LockOptions::builder().ttl(ttl).renew_interval(every));
            assert!(why.contains("three quarters"), "{why}");
        }
        assert!(
            LockOptions::builder()
                .ttl(ttl)
                .renew_interval(Duration::from_millis(300))
                .build()
                .is_ok()
        );
        assert!(
            refused(LockOptions::builder().renew_interval(Duration::ZERO)).contains("above zero")
        );
    }

    #[test]
    fn the_ttl_is_rounded_down_to_what_backends_keep() {
        let options = LockOptions::builder()
            .ttl(Duration::from_micros(1_500))
            .build()
            .unwrap();
        assert_eq!(options.ttl(), Duration::from_millis(1));
    }

    #[test]
    fn a_ttl_too_long_to_count_with_is_refused() {
        for ttl in [
            Duration::MAX,
            Duration::from_secs(u64::MAX / 1000),
            LockOptions::MAX_TTL * 2,
        ] {
            assert!(
                refused(LockOptions::builder().ttl(ttl)).contains("largest"),
                "{ttl:?}"
            );
        }
        assert!(
            LockOptions::builder()
                .ttl(LockOptions::MAX_TTL)
                .build()
                .is_ok()
        );
    }

    #[test]
    fn an_endless_wait_is_accepted() {
        let options = LockOptions::builder()
            .wait_timeout(Duration::MAX)
            .build()
            .unwrap();
        assert_eq!(options.wait_timeout(), Duration::MAX);
    }

    #[test]
    fn options_rebuilt_from_themselves_are_the_same() {
        let ms = Duration::from_millis;
        for options in [
            LockOptions::default(),
            LockOptions::builder()
                .ttl(ms(900))
                .renew_interval(ms(100))
                .wait_timeout(Duration::ZERO)
                .retry_delay(ms(1), ms(2))
                .wait_for_replicas(1, ms(50))
                .build()
                .unwrap(),
            LockOptions::builder().without_watchdog().build().unwrap(),
        ] {
            assert_eq!(options.to_builder().build().unwrap(), options);
        }
    }

    #[test]
    fn a_replica_wait_for_nobody_or_longer_than_a_quarter_of_the_ttl_is_refused() {
        let ms = Duration::from_millis;
        let ttl = LockOptions::builder().ttl(ms(400));
        assert!(refused(ttl.clone().wait_for_replicas(0, ms(10))).contains("at least one"));
        assert!(refused(ttl.clone().wait_for_replicas(1, ms(101))).contains("quarter"));
        assert!(refused(ttl.clone().wait_for_replicas(1, Duration::ZERO)).contains("quarter"));
        assert!(ttl.wait_for_replicas(1, ms(100)).build().is_ok());
    }

    #[test]
    fn a_bad_backoff_is_refused() {
        let ms = Duration::from_millis;
        assert!(refused(LockOptions::builder().retry_delay(ms(0), ms(5))).contains("above zero"));
        assert!(refused(LockOptions::builder().retry_delay(ms(9), ms(5))).contains("above max"));
    }
}
