//! Every setting of the service, from flags or environment variables (`seckill --help`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// A flash-sale service: sells limited stock to a flood of buyers without overselling.
#[derive(Debug, Clone, Parser)]
#[command(name = "seckill", version, about, long_about = None)]
pub struct Settings {
    /// PostgreSQL URL. Migrations run at start-up, so an empty database works.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// Redis URL, for the lock (LOCK_STRATEGY=redis) and the sold-out marks.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Prefix for every Redis key the service writes (lock `<prefix>lock_sale_<id>`, fence,
    /// sold-out marks), so several deployments or test runs can share one Redis.
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,

    /// Independent Redis masters for LOCK_STRATEGY=redlock, comma-separated (3 or 5 is usual).
    #[arg(long, env = "REDLOCK_URLS", value_delimiter = ',')]
    pub redlock_urls: Vec<String>,

    /// Address to listen on. Port 0 picks a free port.
    #[arg(long, env = "BIND_ADDR", default_value = "127.0.0.1:8080")]
    pub bind_addr: SocketAddr,

    /// Token for the admin routes (`Authorization: Bearer <token>`). Unset: admin routes
    /// answer 403.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// How a purchase is kept from racing other purchases of the same product.
    #[arg(long, env = "LOCK_STRATEGY", value_enum, default_value_t = LockStrategy::Redis)]
    pub lock_strategy: LockStrategy,

    /// Lease of the Redis lock, in ms. The watchdog renews it every third of it while a
    /// purchase runs; a crashed holder blocks the product for at most this long.
    #[arg(long, env = "LOCK_TTL_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub lock_ttl_ms: u64,

    /// How long a purchase waits for the Redis lock before answering 503 busy, in ms.
    #[arg(long, env = "LOCK_WAIT_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub lock_wait_ms: u64,

    /// Extra time spent inside the critical section, in ms, to show leases, renewals and
    /// races at work. 0 in production.
    #[arg(long, env = "WORK_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub work_ms: u64,

    /// The largest quantity one purchase may ask for.
    #[arg(long, env = "MAX_QUANTITY", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_quantity: u32,

    /// Size of the PostgreSQL connection pool.
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub database_max_connections: u32,

    /// Log format on stdout. The level comes from RUST_LOG (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Settings {
    pub fn lock_ttl(&self) -> Duration {
        Duration::from_millis(self.lock_ttl_ms)
    }

    pub fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }

    pub fn work(&self) -> Duration {
        Duration::from_millis(self.work_ms)
    }
}

/// The purchase strategies; each lives in its own module under `sale/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum LockStrategy {
    /// Redis lock `lock_sale_<id>` with watchdog and fencing, then one transaction.
    Redis,
    /// The same lock on a majority of the masters in REDLOCK_URLS (Redlock), same fencing.
    Redlock,
    /// `SELECT ... FOR UPDATE` on the product row.
    PgRow,
    /// Optimistic: compare-and-set on a version column, with bounded retries.
    PgOptimistic,
    /// One guarded `UPDATE ... WHERE stock >= quantity`: no lock at all needed.
    PgAtomic,
    /// Read-modify-write with no lock: UNSAFE, shows the lost update.
    None,
}

impl LockStrategy {
    /// The name as given in `LOCK_STRATEGY`.
    pub fn name(self) -> &'static str {
        match self {
            LockStrategy::Redis => "redis",
            LockStrategy::Redlock => "redlock",
            LockStrategy::PgRow => "pg-row",
            LockStrategy::PgOptimistic => "pg-optimistic",
            LockStrategy::PgAtomic => "pg-atomic",
            LockStrategy::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_name_is_what_lock_strategy_accepts() {
        for strategy in LockStrategy::value_variants() {
            let accepted = strategy.to_possible_value().expect("not hidden");
            assert_eq!(accepted.get_name(), strategy.name());
        }
    }
}
