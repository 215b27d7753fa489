//! Every setting of the service, from flags or environment variables (`seckill --help`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

use crate::redis_link::RedisSource;

/// A flash-sale service: sells limited stock to a flood of buyers without overselling.
#[derive(Debug, Clone, Parser)]
#[command(name = "seckill", version, about, long_about = None)]
pub struct Settings {
    /// PostgreSQL URL. Migrations run at start-up, so an empty database works. Kept out of
    /// logs and debug output (it may hold a password).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = secret)]
    pub database_url: SecretString,

    /// Redis URL: the lock under LOCK_STRATEGY=redis, and restock messages between
    /// instances. The other strategies start and sell without it (restocks then reach other
    /// instances within SOLD_OUT_RECHECK_MS).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379", hide_env_values = true, value_parser = secret)]
    pub redis_url: SecretString,

    /// Redis Sentinels, comma-separated (`redis://host:26379` each). Set: Redis is the
    /// primary these Sentinels name for REDIS_SENTINEL_MASTER, for everything the service
    /// uses Redis for (the redis lock, restock messages, readiness), and REDIS_URL is not
    /// used. After a failover the service moves to the new primary by itself within about a
    /// second. The redis lock's waiters then poll (release messages do not follow a failover).
    #[arg(long, env = "REDIS_SENTINELS", value_delimiter = ',', hide_env_values = true, value_parser = secret)]
    pub redis_sentinels: Vec<SecretString>,

    /// The name the Sentinels monitor the primary under (`sentinel monitor <name> ...`); used
    /// with REDIS_SENTINELS.
    #[arg(long, env = "REDIS_SENTINEL_MASTER", default_value = "mymaster")]
    pub redis_sentinel_master: String,

    /// Prefix for every Redis key and channel the service uses (lock `<prefix>lock_sale_<id>`,
    /// its fence, the restock channel), so several deployments or test runs can share one Redis.
    /// Under zookeeper and etcd it starts each lock's name there too (no '/' then).
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,

    /// Independent Redis masters for LOCK_STRATEGY=redlock, comma-separated (3 or 5 is usual).
    #[arg(long, env = "REDLOCK_URLS", value_delimiter = ',', hide_env_values = true, value_parser = secret)]
    pub redlock_urls: Vec<SecretString>,

    /// ZooKeeper ensemble for LOCK_STRATEGY=zookeeper, as a connect string
    /// (`host:port,host:port,...`). Lock nodes live under `/distlock`.
    #[arg(long, env = "ZOOKEEPER_CONNECT", default_value = "127.0.0.1:2181")]
    pub zookeeper_connect: String,

    /// ZooKeeper session timeout asked for under LOCK_STRATEGY=zookeeper, in ms: the lease
    /// of every lock (the ensemble keeps a lock as long as its holder's session, up to this
    /// long after it last heard from the instance). Must be at least twice LOCK_TTL_MS, and
    /// the server must grant that much (its maxSessionTimeout, 20 ticks = 40 s by default):
    /// start-up fails otherwise, saying both numbers.
    #[arg(long, env = "ZOOKEEPER_SESSION_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(range::ZOOKEEPER_SESSION_TIMEOUT_MS))]
    pub zookeeper_session_timeout_ms: u64,

    /// etcd endpoints for LOCK_STRATEGY=etcd, comma-separated (`http://host:2379` each).
    /// Lock keys live under `distlock/`.
    #[arg(
        long,
        env = "ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,

    /// Address to listen on. Port 0 picks a free port; the bound address is printed on
    /// stdout as `listening on <address>`.
    #[arg(long, env = "BIND_ADDR", default_value = "127.0.0.1:8080")]
    pub bind_addr: SocketAddr,

    /// Token for the admin routes (`Authorization: Bearer <token>`), at least 16 characters
    /// and not blank. Unset: admin routes answer 403. Kept out of logs, error messages and
    /// debug output.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    pub admin_token: Option<SecretString>,

    /// How purchases of one product are kept apart across instances.
    #[arg(long, env = "LOCK_STRATEGY", value_enum, default_value_t = LockStrategy::Redis)]
    pub lock_strategy: LockStrategy,

    /// Lease of the lock (redis, redlock, pg-lock, zookeeper, etcd), in ms. The watchdog renews
    /// it every third of it while a batch is sold; a crashed holder blocks the product for at
    /// most this long (under zookeeper, for the session timeout; under etcd, this rounded up
    /// to whole seconds).
    #[arg(long, env = "LOCK_TTL_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(range::LOCK_TTL_MS))]
    pub lock_ttl_ms: u64,

    /// How long a purchase may wait in its product's queue (for the lock, and for its turn)
    /// before answering 503 busy, in ms.
    #[arg(long, env = "LOCK_WAIT_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(range::LOCK_WAIT_MS))]
    pub lock_wait_ms: u64,

    /// Most purchases sold in one transaction: a batch takes whatever waits, up to this, so
    /// batches grow only while the queue is long. 1 sells one purchase per lock hold and per
    /// transaction: the per-request baseline.
    #[arg(long, env = "BATCH_MAX", default_value_t = 256, value_parser = clap::value_parser!(u32).range(range::BATCH_MAX))]
    pub batch_max: u32,

    /// How long an instance alone keeps a product's lock while buyers keep queueing, in ms,
    /// before it gives it up and asks again (a batch already started is finished first).
    /// While other instances want the product (an acquisition of this one found the lock
    /// held, or timed out, within the last second), a hold sells one batch, whatever this is.
    /// Must be below half of LOCK_WAIT_MS, or the buyers of other instances would give up
    /// waiting for their turn (an instance that comes to want the product usually gets it
    /// within one hold). Unset: 100, or just below half of LOCK_WAIT_MS when that is less.
    #[arg(long, env = "HOLD_MS", value_parser = clap::value_parser!(u64).range(range::HOLD_MS))]
    pub hold_ms: Option<u64>,

    /// Purchases that may queue for one product in one instance; beyond it, new arrivals get
    /// an immediate 503 busy with Retry-After.
    #[arg(long, env = "QUEUE_MAX", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(range::QUEUE_MAX))]
    pub queue_max: u32,

    /// How long an instance trusts its own memory that a product is sold out before it asks
    /// PostgreSQL again, in ms: the bound on how late a restock can reach an instance that
    /// missed the restock message (Redis down).
    #[arg(long, env = "SOLD_OUT_RECHECK_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(range::SOLD_OUT_RECHECK_MS))]
    pub sold_out_recheck_ms: u64,

    /// Extra time spent inside the critical section of every batch, in ms, to show leases,
    /// renewals and races at work. 0 in production. Must stay below
    /// PG_IDLE_IN_TRANSACTION_TIMEOUT_MS (the pg-* strategies spend it inside a transaction),
    /// and under pg-row below PG_LOCK_TIMEOUT_MS (a batch waiting for the row waits it out).
    #[arg(long, env = "WORK_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(range::WORK_MS))]
    pub work_ms: u64,

    /// The largest quantity one purchase may ask for.
    #[arg(long, env = "MAX_QUANTITY", default_value_t = 5, value_parser = clap::value_parser!(u32).range(range::MAX_QUANTITY))]
    pub max_quantity: u32,

    /// Size of the PostgreSQL connection pool. Lock holders' batches (the lock strategies)
    /// have a pool of their own of the same size, which opens a connection only when a
    /// holder needs one: about one per product being sold.
    #[arg(long, env = "DATABASE_MAX_CONNECTIONS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(range::DATABASE_MAX_CONNECTIONS))]
    pub database_max_connections: u32,

    /// Size of a second PostgreSQL pool, for public reads only (a product's books, order
    /// look-ups, purchases of ids this instance does not know yet): a flood of reads waits
    /// for these and never takes a connection the sale needs.
    #[arg(long, env = "DATABASE_READ_CONNECTIONS", default_value_t = 2, value_parser = clap::value_parser!(u32).range(range::DATABASE_READ_CONNECTIONS))]
    pub database_read_connections: u32,

    /// How long a request waits for a pooled connection before answering 503 busy, in ms.
    #[arg(long, env = "DATABASE_ACQUIRE_TIMEOUT_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(range::DATABASE_ACQUIRE_TIMEOUT_MS))]
    pub database_acquire_timeout_ms: u64,

    /// PostgreSQL `statement_timeout` of the service's sessions and transactions, in ms: no
    /// statement runs longer (503 busy).
    #[arg(long, env = "PG_STATEMENT_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(range::PG_STATEMENT_TIMEOUT_MS))]
    pub pg_statement_timeout_ms: u64,

    /// PostgreSQL `lock_timeout`, in ms: a purchase waiting for a row that another session
    /// holds gives up after this long (503 busy) instead of hanging behind a hung instance.
    #[arg(long, env = "PG_LOCK_TIMEOUT_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(range::PG_LOCK_TIMEOUT_MS))]
    pub pg_lock_timeout_ms: u64,

    /// PostgreSQL `idle_in_transaction_session_timeout`, in ms: PostgreSQL ends a session
    /// that sits in an open transaction this long (a hung or paused instance), rolling its
    /// transaction back and freeing its row locks.
    #[arg(long, env = "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(range::PG_IDLE_IN_TRANSACTION_TIMEOUT_MS))]
    pub pg_idle_in_transaction_timeout_ms: u64,

    /// Log format on stdout. The level comes from RUST_LOG (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The accepted values of every numeric setting. clap checks the command line and the
/// environment against them, and [`Settings::check`] checks settings built in code, so that
/// both ways in refuse the same values. (clap's parser for `u32` takes its bounds as `i64`.)
mod range {
    use std::ops::RangeInclusive;

    pub const LOCK_TTL_MS: RangeInclusive<u64> = 1..=3_600_000;
    pub const LOCK_WAIT_MS: RangeInclusive<u64> = 1..=600_000;
    pub const BATCH_MAX: RangeInclusive<i64> = 1..=10_000;
    pub const HOLD_MS: RangeInclusive<u64> = 1..=60_000;
    pub const QUEUE_MAX: RangeInclusive<i64> = 1..=1_000_000;
    pub const SOLD_OUT_RECHECK_MS: RangeInclusive<u64> = 1..=600_000;
    pub const WORK_MS: RangeInclusive<u64> = 0..=600_000;
    pub const MAX_QUANTITY: RangeInclusive<i64> = 1..=1_000_000;
    pub const DATABASE_MAX_CONNECTIONS: RangeInclusive<i64> = 1..=1_000;
    pub const DATABASE_READ_CONNECTIONS: RangeInclusive<i64> = 1..=1_000;
    pub const DATABASE_ACQUIRE_TIMEOUT_MS: RangeInclusive<u64> = 1..=600_000;
    pub const PG_STATEMENT_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
    pub const PG_LOCK_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
    pub const PG_IDLE_IN_TRANSACTION_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
    pub const ZOOKEEPER_SESSION_TIMEOUT_MS: RangeInclusive<u64> = 1..=3_600_000;
}

/// `HOLD_MS` when it is not set (and `LOCK_WAIT_MS` is long enough for it).
pub const DEFAULT_HOLD_MS: u64 = 100;

/// `Ok` when `value` of the setting `name` is in `range`.
fn within<T: PartialOrd + std::fmt::Display>(
    name: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
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

/// The shortest admin token accepted: 16 characters, about 95 bits if random.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw))
}

/// `ADMIN_TOKEN`: refused when blank (an empty token would match a request without any
/// `Authorization` header) or too short to be secret. The message never shows the token.
pub fn check_admin_token(token: &SecretString) -> Result<(), String> {
    let raw = token.expose_secret();
    if raw.trim().is_empty() {
        return Err(
            "ADMIN_TOKEN is empty or blank; leave it unset to disable the admin routes".into(),
        );
    }
    let chars = raw.chars().count();
    if chars < MIN_ADMIN_TOKEN_CHARS {
        return Err(format!(
            "ADMIN_TOKEN has {chars} characters; use at least {MIN_ADMIN_TOKEN_CHARS} (for example `openssl rand -hex 16`)"
        ));
    }
    Ok(())
}

/// A URL with any password in it replaced, for messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl Settings {
    /// Settings for tests and embedding: every default, with this database and Redis.
    pub fn new(database_url: &str, redis_url: &str) -> Self {
        Self::parse_from([
            "seckill",
            "--database-url",
            database_url,
            "--redis-url",
            redis_url,
        ])
    }

    pub fn lock_ttl(&self) -> Duration {
        Duration::from_millis(self.lock_ttl_ms)
    }

    pub fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }

    pub fn work(&self) -> Duration {
        Duration::from_millis(self.work_ms)
    }

    /// `HOLD_MS`, or when unset [`DEFAULT_HOLD_MS`], shortened to stay below half of
    /// `LOCK_WAIT_MS`.
    pub fn hold_ms(&self) -> u64 {
        self.hold_ms.unwrap_or(
            DEFAULT_HOLD_MS
                .min(self.lock_wait_ms.saturating_sub(1) / 2)
                .max(1),
        )
    }

    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.hold_ms())
    }

    pub fn sold_out_recheck(&self) -> Duration {
        Duration::from_millis(self.sold_out_recheck_ms)
    }

    pub fn zookeeper_session_timeout(&self) -> Duration {
        Duration::from_millis(self.zookeeper_session_timeout_ms)
    }

    pub fn database_acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.database_acquire_timeout_ms)
    }

    /// The database URL, for connecting (never for logging).
    pub fn database_url(&self) -> &str {
        self.database_url.expose_secret()
    }

    /// The Redis URL, for connecting (never for logging).
    pub fn redis_url(&self) -> &str {
        self.redis_url.expose_secret()
    }

    /// Where Redis is: the Sentinels when REDIS_SENTINELS is set, REDIS_URL otherwise.
    pub fn redis_source(&self) -> RedisSource {
        if self.redis_sentinels.is_empty() {
            RedisSource::Url(self.redis_url().to_owned())
        } else {
            RedisSource::Sentinels {
                urls: self
                    .redis_sentinels
                    .iter()
                    .map(|url| url.expose_secret().to_owned())
                    .collect(),
                master: self.redis_sentinel_master.clone(),
            }
        }
    }

    /// Settings that are valid one by one but not together.
    ///
    /// # Errors
    /// A message naming the settings.
    pub fn check(&self) -> Result<(), String> {
        within("LOCK_TTL_MS", self.lock_ttl_ms, range::LOCK_TTL_MS)?;
        within("LOCK_WAIT_MS", self.lock_wait_ms, range::LOCK_WAIT_MS)?;
        within("BATCH_MAX", i64::from(self.batch_max), range::BATCH_MAX)?;
        within("HOLD_MS", self.hold_ms(), range::HOLD_MS)?;
        within("QUEUE_MAX", i64::from(self.queue_max), range::QUEUE_MAX)?;
        within(
            "SOLD_OUT_RECHECK_MS",
            self.sold_out_recheck_ms,
            range::SOLD_OUT_RECHECK_MS,
        )?;
        within("WORK_MS", self.work_ms, range::WORK_MS)?;
        within(
            "MAX_QUANTITY",
            i64::from(self.max_quantity),
            range::MAX_QUANTITY,
        )?;
        within(
            "DATABASE_MAX_CONNECTIONS",
            i64::from(self.database_max_connections),
            range::DATABASE_MAX_CONNECTIONS,
        )?;
        within(
            "DATABASE_READ_CONNECTIONS",
            i64::from(self.database_read_connections),
            range::DATABASE_READ_CONNECTIONS,
        )?;
        within(
            "DATABASE_ACQUIRE_TIMEOUT_MS",
            self.database_acquire_timeout_ms,
            range::DATABASE_ACQUIRE_TIMEOUT_MS,
        )?;
        within(
            "PG_STATEMENT_TIMEOUT_MS",
            self.pg_statement_timeout_ms,
            range::PG_STATEMENT_TIMEOUT_MS,
        )?;
        within(
            "PG_LOCK_TIMEOUT_MS",
            self.pg_lock_timeout_ms,
            range::PG_LOCK_TIMEOUT_MS,
        )?;
        within(
            "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
            self.pg_idle_in_transaction_timeout_ms,
            range::PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
        )?;
        within(
            "ZOOKEEPER_SESSION_TIMEOUT_MS",
            self.zookeeper_session_timeout_ms,
            range::ZOOKEEPER_SESSION_TIMEOUT_MS,
        )?;
        if self.lock_strategy == LockStrategy::PgRow && self.work_ms >= self.pg_lock_timeout_ms {
            return Err(format!(
                "WORK_MS ({}) must be below PG_LOCK_TIMEOUT_MS ({}) under LOCK_STRATEGY=pg-row: a batch that waits for the row waits out another batch's work, and would give up every time",
                self.work_ms, self.pg_lock_timeout_ms
            ));
        }
        if let Some(token) = &self.admin_token {
            check_admin_token(token)?;
        }
        if self.hold_ms() * 2 >= self.lock_wait_ms {
            return Err(format!(
                "HOLD_MS ({}) must be below half of LOCK_WAIT_MS ({}): other instances' buyers would give up waiting for their turn",
                self.hold_ms(),
                self.lock_wait_ms
            ));
        }
        if self.work_ms >= self.pg_idle_in_transaction_timeout_ms {
            return Err(format!(
                "WORK_MS ({}) must be below PG_IDLE_IN_TRANSACTION_TIMEOUT_MS ({}): the pg-* strategies work inside a transaction, which PostgreSQL would end",
                self.work_ms, self.pg_idle_in_transaction_timeout_ms
            ));
        }
        if !self.redis_sentinels.is_empty() && self.redis_sentinel_master.trim().is_empty() {
            return Err("REDIS_SENTINELS needs REDIS_SENTINEL_MASTER, the name the Sentinels monitor the primary under".into());
        }
        if self.lock_strategy == LockStrategy::Redlock && self.redlock_urls.is_empty() {
            return Err(
                "LOCK_STRATEGY=redlock needs REDLOCK_URLS (comma-separated Redis masters)".into(),
            );
        }
        if self.lock_strategy == LockStrategy::ZooKeeper
            && self.zookeeper_session_timeout_ms < 2 * self.lock_ttl_ms
        {
            return Err(format!(
                "ZOOKEEPER_SESSION_TIMEOUT_MS ({}) must be at least twice LOCK_TTL_MS ({}) under LOCK_STRATEGY=zookeeper: a lock lives only as long as its session, and the ensemble may end a session 0.6 of its timeout after the holder last proved it alive, so a holder counting on a longer lease could write after the ensemble gave the lock away",
                self.zookeeper_session_timeout_ms, self.lock_ttl_ms
            ));
        }
        if self.lock_strategy == LockStrategy::ZooKeeper && self.zookeeper_connect.trim().is_empty()
        {
            return Err(
                "LOCK_STRATEGY=zookeeper needs ZOOKEEPER_CONNECT (host:port,host:port,...)".into(),
            );
        }
        if self.lock_strategy == LockStrategy::Etcd
            && self.etcd_endpoints.iter().all(|e| e.trim().is_empty())
        {
            return Err(
                "LOCK_STRATEGY=etcd needs ETCD_ENDPOINTS (comma-separated http://host:2379)".into(),
            );
        }
        if self.lock_strategy.locks_in_consensus() && self.redis_key_prefix.contains('/') {
            return Err(format!(
                "REDIS_KEY_PREFIX ({:?}) must not contain '/' under LOCK_STRATEGY={}: it starts every lock's name there, and a lock's name cannot hold a '/'",
                self.redis_key_prefix,
                self.lock_strategy.name()
            ));
        }
        Ok(())
    }
}

/// The purchase strategies; each one's way of selling a batch lives under `sale/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum LockStrategy {
    /// Redis lock `lock_sale_<id>` with watchdog and fencing, then one transaction per batch.
    Redis,
    /// The same lock on a majority of the masters in REDLOCK_URLS (Redlock), same fencing.
    Redlock,
    /// The same lock in a PostgreSQL lock table (the seed's database lock), same fencing.
    PgLock,
    /// The same lock in ZooKeeper (ZOOKEEPER_CONNECT; the seed's third lock), its fence the
    /// holder node's creation zxid; waiters queue in arrival order.
    #[value(name = "zookeeper")]
    ZooKeeper,
    /// The same lock in etcd (ETCD_ENDPOINTS), its fence the holder key's create revision;
    /// waiters queue in arrival order.
    Etcd,
    /// `SELECT ... FOR UPDATE` on the product row.
    PgRow,
    /// Optimistic: compare-and-set on a version column, with bounded retries.
    PgOptimistic,
    /// One guarded `UPDATE ... WHERE stock >= sold`: no lock at all needed.
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
            LockStrategy::PgLock => "pg-lock",
            LockStrategy::ZooKeeper => "zookeeper",
            LockStrategy::Etcd => "etcd",
            LockStrategy::PgRow => "pg-row",
            LockStrategy::PgOptimistic => "pg-optimistic",
            LockStrategy::PgAtomic => "pg-atomic",
            LockStrategy::None => "none",
        }
    }

    /// Whether the strategy needs `REDIS_URL` to sell at all (the others only use it for
    /// restock messages, and start and sell without it; Redlock locks on REDLOCK_URLS).
    pub fn needs_redis(self) -> bool {
        matches!(self, LockStrategy::Redis)
    }

    /// Whether the lock lives in a consensus service (ZooKeeper, etcd), whose fences the
    /// server assigns.
    pub fn locks_in_consensus(self) -> bool {
        matches!(self, LockStrategy::ZooKeeper | LockStrategy::Etcd)
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

    #[test]
    fn an_empty_blank_or_short_admin_token_is_refused_with_the_settings_name() {
        for bad in ["", "   ", "\t\n", "short-token"] {
            let why = check_admin_token(&bad.into()).expect_err(bad);
            assert!(why.contains("ADMIN_TOKEN"), "{why}");
            if !bad.trim().is_empty() {
                assert!(!why.contains(bad), "the message shows the token: {why}");
            }
        }
        assert!(check_admin_token(&"0123456789abcdef".into()).is_ok());
    }

    #[test]
    fn passwords_in_urls_are_redacted_for_messages() {
        assert_eq!(
            redacted("redis://user:hunter2@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redacted("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let mut settings = Settings::new(
            "postgres://app:hunter2-password@db/seckill",
            "redis://:redis-password@r",
        );
        settings.admin_token = Some("super-secret-admin-token".into());
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2-password"), "{shown}");
        assert!(!shown.contains("super-secret-admin-token"), "{shown}");
        assert!(!shown.contains("redis-password"), "{shown}");
    }

    #[test]
    fn settings_built_in_code_are_held_to_the_ranges_the_command_line_is() {
        type Spoil = fn(&mut Settings);
        let cases: [(&str, Spoil); 4] = [
            ("BATCH_MAX", |s| s.batch_max = 0),
            ("QUEUE_MAX", |s| s.queue_max = 0),
            ("SOLD_OUT_RECHECK_MS", |s| s.sold_out_recheck_ms = 0),
            ("DATABASE_MAX_CONNECTIONS", |s| {
                s.database_max_connections = 0
            }),
        ];
        for (name, spoil) in cases {
            let mut settings = Settings::new("postgres://x", "redis://r");
            assert_eq!(settings.check(), Ok(()));
            spoil(&mut settings);
            let why = settings.check().expect_err(name);
            assert!(why.starts_with(name), "{name}: {why}");
            // The command line refuses the same value.
            let flag = format!("--{}", name.to_lowercase().replace('_', "-"));
            let parsed = Settings::try_parse_from([
                "seckill",
                "--database-url",
                "postgres://x",
                flag.as_str(),
                "0",
            ]);
            assert!(parsed.is_err(), "{flag} 0 was accepted");
        }
    }

    #[test]
    fn under_pg_row_the_work_must_end_before_a_waiting_batch_gives_up() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.lock_strategy = LockStrategy::PgRow;
        settings.work_ms = 2_000;
        settings.pg_lock_timeout_ms = 2_000;
        assert!(settings.check().unwrap_err().contains("PG_LOCK_TIMEOUT_MS"));
        settings.lock_strategy = LockStrategy::Redis;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn an_unset_hold_ms_stays_below_half_a_short_lock_wait_and_a_set_one_is_checked() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        assert_eq!(settings.hold_ms(), DEFAULT_HOLD_MS);
        settings.lock_wait_ms = 150;
        assert_eq!(
            settings.check(),
            Ok(()),
            "the default adapts to a short wait"
        );
        assert_eq!(settings.hold_ms(), 74);
        settings.hold_ms = Some(100);
        let why = settings.check().unwrap_err();
        assert!(why.contains("HOLD_MS (100)"), "{why}");
    }

    #[test]
    fn under_zookeeper_the_session_must_last_at_least_twice_the_lock_ttl() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.lock_strategy = LockStrategy::ZooKeeper;
        assert_eq!(settings.check(), Ok(()), "the defaults fit together");
        settings.lock_ttl_ms = 5_001;
        let why = settings.check().unwrap_err();
        assert!(
            why.contains("ZOOKEEPER_SESSION_TIMEOUT_MS (10000)"),
            "{why}"
        );
        assert!(why.contains("twice LOCK_TTL_MS (5001)"), "{why}");
        // The session timeout means nothing to the other strategies.
        settings.lock_strategy = LockStrategy::Etcd;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn a_lock_name_prefix_with_a_slash_is_refused_where_lock_names_cannot_hold_one() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.redis_key_prefix = "shop/a:".into();
        assert_eq!(settings.check(), Ok(()), "Redis keys may hold a '/'");
        for strategy in [LockStrategy::ZooKeeper, LockStrategy::Etcd] {
            settings.lock_strategy = strategy;
            let why = settings.check().unwrap_err();
            assert!(why.starts_with("REDIS_KEY_PREFIX"), "{why}");
        }
    }

    #[test]
    fn etcd_endpoints_are_comma_separated_with_a_local_default() {
        let parsed = Settings::parse_from(["seckill", "--database-url", "x"]);
        assert_eq!(parsed.etcd_endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(parsed.zookeeper_connect, "127.0.0.1:2181");
        let parsed = Settings::parse_from([
            "seckill",
            "--database-url",
            "x",
            "--etcd-endpoints",
            "http://a:2379,http://b:2379",
        ]);
        assert_eq!(parsed.etcd_endpoints, ["http://a:2379", "http://b:2379"]);
    }

    #[test]
    fn work_inside_a_transaction_must_end_before_postgres_ends_the_session() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.work_ms = 6_000;
        assert!(
            settings
                .check()
                .unwrap_err()
                .contains("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS")
        );
    }
}
