//! The accepted values of every numeric setting, stated once: clap refuses the command line
//! and the environment outside them, and [`Settings::check`](super::Settings::check) refuses
//! settings built in code outside them, so both ways in refuse the same values.

use std::ops::RangeInclusive;
use std::time::Duration;

use clap::builder::TypedValueParser;

pub const HTTP_MAX_CONNECTIONS: Count = Count::new("HTTP_MAX_CONNECTIONS", 1..=1_000_000);
pub const HTTP_REQUEST_TIMEOUT: Millis = Millis::new("HTTP_REQUEST_TIMEOUT_MS", 1..=600_000);
pub const HTTP_KEEP_ALIVE: Millis = Millis::new("HTTP_KEEP_ALIVE_MS", 1..=3_600_000);
pub const LOCK_TTL: Millis = Millis::new("LOCK_TTL_MS", 1..=3_600_000);
pub const LOCK_WAIT: Millis = Millis::new("LOCK_WAIT_MS", 1..=600_000);
pub const BATCH_MAX: Count = Count::new("BATCH_MAX", 1..=10_000);
pub const HOLD: Millis = Millis::new("HOLD_MS", 1..=60_000);
pub const QUEUE_MAX: Count = Count::new("QUEUE_MAX", 1..=1_000_000);
pub const SOLD_OUT_RECHECK: Millis = Millis::new("SOLD_OUT_RECHECK_MS", 1..=600_000);
pub const WORK: Millis = Millis::new("WORK_MS", 0..=600_000);
pub const MAX_QUANTITY: Count = Count::new("MAX_QUANTITY", 1..=1_000_000);
pub const DATABASE_MAX_CONNECTIONS: Count = Count::new("DATABASE_MAX_CONNECTIONS", 1..=1_000);
pub const DATABASE_READ_CONNECTIONS: Count = Count::new("DATABASE_READ_CONNECTIONS", 1..=1_000);
pub const DATABASE_ACQUIRE_TIMEOUT: Millis =
    Millis::new("DATABASE_ACQUIRE_TIMEOUT_MS", 1..=600_000);
pub const PG_STATEMENT_TIMEOUT: Millis = Millis::new("PG_STATEMENT_TIMEOUT_MS", 1..=3_600_000);
pub const PG_LOCK_TIMEOUT: Millis = Millis::new("PG_LOCK_TIMEOUT_MS", 1..=3_600_000);
pub const PG_IDLE_IN_TRANSACTION_TIMEOUT: Millis =
    Millis::new("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", 1..=3_600_000);
pub const ZOOKEEPER_SESSION_TIMEOUT: Millis =
    Millis::new("ZOOKEEPER_SESSION_TIMEOUT_MS", 1..=3_600_000);
pub const BUYER_JWT_LEEWAY: Count = Count::new("BUYER_JWT_LEEWAY_S", 0..=300);
pub const BUYER_RATE: Count = Count::new("BUYER_RATE", 0..=1_000_000);
pub const BUYER_BURST: Count = Count::new("BUYER_BURST", 1..=1_000_000);
pub const ADDRESS_RATE: Count = Count::new("ADDRESS_RATE", 0..=1_000_000);
pub const ADDRESS_BURST: Count = Count::new("ADDRESS_BURST", 1..=1_000_000);

/// A duration setting: a whole number of milliseconds, from `min` to `max`.
#[derive(Debug, Clone, Copy)]
pub struct Millis {
    name: &'static str,
    min: u64,
    max: u64,
}

impl Millis {
    const fn new(name: &'static str, range: RangeInclusive<u64>) -> Self {
        Self {
            name,
            min: *range.start(),
            max: *range.end(),
        }
    }

    /// clap's parser: the milliseconds, refused outside the range, as a [`Duration`].
    pub(super) fn parser(self) -> impl TypedValueParser<Value = Duration> {
        clap::value_parser!(u64)
            .range(self.min..=self.max)
            .map(Duration::from_millis)
    }

    /// `Ok` when `value` is in the range; otherwise the message names the setting.
    pub(super) fn check(self, value: Duration) -> Result<(), String> {
        within(
            self.name,
            value.as_millis(),
            self.min.into()..=self.max.into(),
        )
    }
}

/// A count setting, from `min` to `max`.
#[derive(Debug, Clone, Copy)]
pub struct Count {
    name: &'static str,
    min: u32,
    max: u32,
}

impl Count {
    const fn new(name: &'static str, range: RangeInclusive<u32>) -> Self {
        Self {
            name,
            min: *range.start(),
            max: *range.end(),
        }
    }

    /// clap's parser (whose bounds for a `u32` are `i64`s).
    pub(super) fn parser(self) -> impl TypedValueParser<Value = u32> {
        clap::value_parser!(u32).range(i64::from(self.min)..=i64::from(self.max))
    }

    /// `Ok` when `value` is in the range; otherwise the message names the setting.
    pub(super) fn check(self, value: u32) -> Result<(), String> {
        within(self.name, value, self.min..=self.max)
    }
}

/// `Ok` when `value` of the setting `name` is in `range`.
fn within<T: PartialOrd + std::fmt::Display>(
    name: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{name} is {value}; it must be from {} to {}",
            range.start(),
            range.end()
        ))
    }
}
