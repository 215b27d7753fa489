//! Every setting of the service, from flags or environment variables (`seckill --help`).
//!
//! The settings come in groups, one struct each, as `--help` shows them: the HTTP side
//! ([`HttpSettings`]), PostgreSQL ([`DatabaseSettings`]), Redis ([`RedisSettings`]), the lock
//! ([`LockSettings`]) and the sale ([`SaleSettings`]). A duration is read once, as a whole
//! number of milliseconds, into a [`Duration`]. Each numeric setting's accepted values are
//! stated once, in [`range`]: clap refuses the command line and the environment outside
//! them, and [`Settings::check`] refuses settings built in code outside them, so both ways
//! in refuse the same values. The rules that tie settings together follow [`Settings::check`],
//! one function each.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

use crate::redis_link::RedisSource;

/// A flash-sale service: sells limited stock to a flood of buyers without overselling.
#[derive(Debug, Clone, Parser)]
#[command(name = "seckill", version, about, long_about = None)]
pub struct Settings {
    #[command(flatten)]
    pub http: HttpSettings,

    #[command(flatten)]
    pub database: DatabaseSettings,

    #[command(flatten)]
    pub redis: RedisSettings,

    #[command(flatten)]
    pub lock: LockSettings,

    #[command(flatten)]
    pub sale: SaleSettings,

    /// Log format on stdout. The level comes from RUST_LOG (default `info`).
    #[arg(long = "log-format", id = "log_format",
        value_name = "LOG_FORMAT", env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Where the service listens, and who may use its admin routes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP")]
pub struct HttpSettings {
    /// Address to listen on. Port 0 picks a free port; the bound address is printed on
    /// stdout as `listening on <address>`.
    #[arg(
        long = "bind-addr",
        id = "bind_addr",
        value_name = "BIND_ADDR",
        env = "BIND_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub bind_addr: SocketAddr,

    /// Token for the admin routes (`Authorization: Bearer <token>`), at least 16 characters
    /// and not blank. Unset: admin routes answer 403. Kept out of logs, error messages and
    /// debug output.
    #[arg(long = "admin-token", id = "admin_token",
        value_name = "ADMIN_TOKEN", env = "ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    pub admin_token: Option<SecretString>,
}

/// PostgreSQL: where it is, the service's pools, and the bounds of its sessions.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Database")]
pub struct DatabaseSettings {
    /// PostgreSQL URL. Migrations run at start-up, so an empty database works. Kept out of
    /// logs and debug output (it may hold a password).
    #[arg(long = "database-url", id = "database_url",
        value_name = "DATABASE_URL", env = "DATABASE_URL", hide_env_values = true, value_parser = secret)]
    pub url: SecretString,

    /// Size of the PostgreSQL connection pool. Lock holders' batches (the lock strategies)
    /// have a pool of their own of the same size, which opens a connection only when a
    /// holder needs one: about one per product being sold.
    #[arg(long = "database-max-connections", id = "database_max_connections",
        value_name = "DATABASE_MAX_CONNECTIONS", env = "DATABASE_MAX_CONNECTIONS", default_value_t = 10, value_parser = range::DATABASE_MAX_CONNECTIONS.parser())]
    pub max_connections: u32,

    /// Size of a second PostgreSQL pool, for public reads only (a product's books, order
    /// look-ups, purchases of ids this instance does not know yet): a flood of reads waits
    /// for these and never takes a connection the sale needs.
    #[arg(long = "database-read-connections", id = "database_read_connections",
        value_name = "DATABASE_READ_CONNECTIONS", env = "DATABASE_READ_CONNECTIONS", default_value_t = 2, value_parser = range::DATABASE_READ_CONNECTIONS.parser())]
    pub read_connections: u32,

    /// How long a request waits for a pooled connection before answering 503 busy, in ms.
    #[arg(long = "database-acquire-timeout-ms", id = "database_acquire_timeout_ms",
        value_name = "DATABASE_ACQUIRE_TIMEOUT_MS", env = "DATABASE_ACQUIRE_TIMEOUT_MS", default_value = "2000", value_parser = range::DATABASE_ACQUIRE_TIMEOUT.parser())]
    pub acquire_timeout: Duration,

    /// PostgreSQL `statement_timeout` of the service's sessions and transactions, in ms: no
    /// statement runs longer (503 busy).
    #[arg(long = "pg-statement-timeout-ms", id = "pg_statement_timeout_ms",
        value_name = "PG_STATEMENT_TIMEOUT_MS", env = "PG_STATEMENT_TIMEOUT_MS", default_value = "5000", value_parser = range::PG_STATEMENT_TIMEOUT.parser())]
    pub statement_timeout: Duration,

    /// PostgreSQL `lock_timeout`, in ms: a purchase waiting for a row that another session
    /// holds gives up after this long (503 busy) instead of hanging behind a hung instance.
    #[arg(long = "pg-lock-timeout-ms", id = "pg_lock_timeout_ms",
        value_name = "PG_LOCK_TIMEOUT_MS", env = "PG_LOCK_TIMEOUT_MS", default_value = "2000", value_parser = range::PG_LOCK_TIMEOUT.parser())]
    pub lock_timeout: Duration,

    /// PostgreSQL `idle_in_transaction_session_timeout`, in ms: PostgreSQL ends a session
    /// that sits in an open transaction this long (a hung or paused instance), rolling its
    /// transaction back and freeing its row locks.
    #[arg(long = "pg-idle-in-transaction-timeout-ms", id = "pg_idle_in_transaction_timeout_ms",
        value_name = "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", env = "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", default_value = "5000", value_parser = range::PG_IDLE_IN_TRANSACTION_TIMEOUT.parser())]
    pub idle_in_transaction_timeout: Duration,
}

/// Redis: one server or the Sentinels that name it, and the prefix of every key.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisSettings {
    /// Redis URL: the lock under LOCK_STRATEGY=redis, and restock messages between
    /// instances. The other strategies start and sell without it (restocks then reach other
    /// instances within SOLD_OUT_RECHECK_MS).
    #[arg(long = "redis-url", id = "redis_url",
        value_name = "REDIS_URL", env = "REDIS_URL", default_value = "redis://127.0.0.1:6379", hide_env_values = true, value_parser = secret)]
    pub url: SecretString,

    /// Redis Sentinels, comma-separated (`redis://host:26379` each). Set: Redis is the
    /// primary these Sentinels name for REDIS_SENTINEL_MASTER, for everything the service
    /// uses Redis for (the redis lock, restock messages, readiness), and REDIS_URL is not
    /// used. After a failover the service moves to the new primary by itself within about a
    /// second. The redis lock's waiters then poll (release messages do not follow a failover).
    #[arg(long = "redis-sentinels", id = "redis_sentinels",
        value_name = "REDIS_SENTINELS", env = "REDIS_SENTINELS", value_delimiter = ',', hide_env_values = true, value_parser = secret)]
    pub sentinels: Vec<SecretString>,

    /// The name the Sentinels monitor the primary under (`sentinel monitor <name> ...`); used
    /// with REDIS_SENTINELS.
    #[arg(
        long = "redis-sentinel-master",
        id = "redis_sentinel_master",
        value_name = "REDIS_SENTINEL_MASTER",
        env = "REDIS_SENTINEL_MASTER",
        default_value = "mymaster"
    )]
    pub sentinel_master: String,

    /// Prefix for every Redis key and channel the service uses (lock `<prefix>lock_sale_<id>`,
    /// its fence, the restock channel), so several deployments or test runs can share one Redis.
    /// Under zookeeper and etcd it starts each lock's name there too (no '/' then).
    #[arg(
        long = "redis-key-prefix",
        id = "redis_key_prefix",
        value_name = "REDIS_KEY_PREFIX",
        env = "REDIS_KEY_PREFIX",
        default_value = ""
    )]
    pub key_prefix: String,
}

/// How purchases of one product are kept apart across instances, and where that lock lives.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Lock")]
pub struct LockSettings {
    /// How purchases of one product are kept apart across instances.
    #[arg(long = "lock-strategy", id = "lock_strategy",
        value_name = "LOCK_STRATEGY", env = "LOCK_STRATEGY", value_enum, default_value_t = LockStrategy::Redis)]
    pub strategy: LockStrategy,

    /// Lease of the lock (redis, redlock, pg-lock, zookeeper, etcd), in ms. The watchdog renews
    /// it every third of it while a batch is sold; a crashed holder blocks the product for at
    /// most this long (under zookeeper, for the session timeout; under etcd, this rounded up
    /// to whole seconds).
    #[arg(long = "lock-ttl-ms", id = "lock_ttl_ms",
        value_name = "LOCK_TTL_MS", env = "LOCK_TTL_MS", default_value = "5000", value_parser = range::LOCK_TTL.parser())]
    pub ttl: Duration,

    /// How long a purchase may wait in its product's queue (for the lock, and for its turn)
    /// before answering 503 busy, in ms.
    #[arg(long = "lock-wait-ms", id = "lock_wait_ms",
        value_name = "LOCK_WAIT_MS", env = "LOCK_WAIT_MS", default_value = "2000", value_parser = range::LOCK_WAIT.parser())]
    pub wait: Duration,

    /// Independent Redis masters for LOCK_STRATEGY=redlock, comma-separated (3 or 5 is usual).
    #[arg(long = "redlock-urls", id = "redlock_urls",
        value_name = "REDLOCK_URLS", env = "REDLOCK_URLS", value_delimiter = ',', hide_env_values = true, value_parser = secret)]
    pub redlock_urls: Vec<SecretString>,

    /// ZooKeeper ensemble for LOCK_STRATEGY=zookeeper, as a connect string
    /// (`host:port,host:port,...`). Lock nodes live under `/distlock`.
    #[arg(
        long = "zookeeper-connect",
        id = "zookeeper_connect",
        value_name = "ZOOKEEPER_CONNECT",
        env = "ZOOKEEPER_CONNECT",
        default_value = "127.0.0.1:2181"
    )]
    pub zookeeper_connect: String,

    /// ZooKeeper session timeout asked for under LOCK_STRATEGY=zookeeper, in ms: the lease
    /// of every lock (the ensemble keeps a lock as long as its holder's session, up to this
    /// long after it last heard from the instance). Must be at least twice LOCK_TTL_MS, and
    /// the server must grant that much (its maxSessionTimeout, 20 ticks = 40 s by default):
    /// start-up fails otherwise, saying both numbers.
    #[arg(long = "zookeeper-session-timeout-ms", id = "zookeeper_session_timeout_ms",
        value_name = "ZOOKEEPER_SESSION_TIMEOUT_MS", env = "ZOOKEEPER_SESSION_TIMEOUT_MS", default_value = "10000", value_parser = range::ZOOKEEPER_SESSION_TIMEOUT.parser())]
    pub zookeeper_session_timeout: Duration,

    /// etcd endpoints for LOCK_STRATEGY=etcd, comma-separated (`http://host:2379` each).
    /// Lock keys live under `distlock/`.
    #[arg(
        long = "etcd-endpoints",
        id = "etcd_endpoints",
        value_name = "ETCD_ENDPOINTS",
        env = "ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,
}

/// How one instance sells a product: its batches, holds, queue and limits.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sale")]
pub struct SaleSettings {
    /// Most purchases sold in one transaction: a batch takes whatever waits, up to this, so
    /// batches grow only while the queue is long. 1 sells one purchase per lock hold and per
    /// transaction: the per-request baseline.
    #[arg(long = "batch-max", id = "batch_max",
        value_name = "BATCH_MAX", env = "BATCH_MAX", default_value_t = 256, value_parser = range::BATCH_MAX.parser())]
    pub batch_max: u32,

    /// How long an instance alone keeps a product's lock while buyers keep queueing, in ms,
    /// before it gives it up and asks again (a batch already started is finished first).
    /// While other instances want the product (an acquisition of this one found the lock
    /// held, or timed out, within the last second), a hold sells one batch, whatever this is.
    /// Must be below half of LOCK_WAIT_MS, or the buyers of other instances would give up
    /// waiting for their turn (an instance that comes to want the product usually gets it
    /// within one hold). Unset: 100, or just below half of LOCK_WAIT_MS when that is less.
    #[arg(long = "hold-ms", id = "hold_ms",
        value_name = "HOLD_MS", env = "HOLD_MS", value_parser = range::HOLD.parser())]
    pub hold: Option<Duration>,

    /// Purchases that may queue for one product in one instance; beyond it, new arrivals get
    /// an immediate 503 busy with Retry-After.
    #[arg(long = "queue-max", id = "queue_max",
        value_name = "QUEUE_MAX", env = "QUEUE_MAX", default_value_t = 10_000, value_parser = range::QUEUE_MAX.parser())]
    pub queue_max: u32,

    /// How long an instance trusts its own memory that a product is sold out before it asks
    /// PostgreSQL again, in ms: the bound on how late a restock can reach an instance that
    /// missed the restock message (Redis down).
    #[arg(long = "sold-out-recheck-ms", id = "sold_out_recheck_ms",
        value_name = "SOLD_OUT_RECHECK_MS", env = "SOLD_OUT_RECHECK_MS", default_value = "1000", value_parser = range::SOLD_OUT_RECHECK.parser())]
    pub sold_out_recheck: Duration,

    /// Extra time spent inside the critical section of every batch, in ms, to show leases,
    /// renewals and races at work. 0 in production. Must stay below
    /// PG_IDLE_IN_TRANSACTION_TIMEOUT_MS (the pg-* strategies spend it inside a transaction),
    /// and under pg-row below PG_LOCK_TIMEOUT_MS (a batch waiting for the row waits it out).
    #[arg(long = "work-ms", id = "work_ms",
        value_name = "WORK_MS", env = "WORK_MS", default_value = "0", value_parser = range::WORK.parser())]
    pub work: Duration,

    /// The largest quantity one purchase may ask for.
    #[arg(long = "max-quantity", id = "max_quantity",
        value_name = "MAX_QUANTITY", env = "MAX_QUANTITY", default_value_t = 5, value_parser = range::MAX_QUANTITY.parser())]
    pub max_quantity: u32,
}

/// The accepted values of every numeric setting, stated once for the command line, the
/// environment and [`Settings::check`].
pub mod range {
    use super::{Count, Millis};

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
}

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
    fn parser(self) -> impl TypedValueParser<Value = Duration> {
        clap::value_parser!(u64)
            .range(self.min..=self.max)
            .map(Duration::from_millis)
    }

    /// `Ok` when `value` is in the range; otherwise the message names the setting.
    fn check(self, value: Duration) -> Result<(), String> {
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
    fn parser(self) -> impl TypedValueParser<Value = u32> {
        clap::value_parser!(u32).range(i64::from(self.min)..=i64::from(self.max))
    }

    /// `Ok` when `value` is in the range; otherwise the message names the setting.
    fn check(self, value: u32) -> Result<(), String> {
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

/// `HOLD_MS` when it is not set (and `LOCK_WAIT_MS` is long enough for it).
pub const DEFAULT_HOLD: Duration = Duration::from_millis(100);

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

    /// `HOLD_MS`, or when unset [`DEFAULT_HOLD`], shortened to stay below half of
    /// `LOCK_WAIT_MS`.
    pub fn hold(&self) -> Duration {
        self.sale.hold.unwrap_or_else(|| {
            let wait_ms = u64::try_from(self.lock.wait.as_millis()).unwrap_or(u64::MAX);
            DEFAULT_HOLD
                .min(Duration::from_millis(wait_ms.saturating_sub(1) / 2))
                .max(Duration::from_millis(1))
        })
    }

    /// Every setting in its range, then the rules that tie settings together.
    ///
    /// # Errors
    /// A message naming the settings.
    pub fn check(&self) -> Result<(), String> {
        self.ranges()?;
        work_ends_before_a_waiting_batch_gives_up(&self.lock, &self.sale, &self.database)?;
        if let Some(token) = &self.http.admin_token {
            check_admin_token(token)?;
        }
        hold_is_below_half_the_wait(self.hold(), self.lock.wait)?;
        work_ends_before_postgres_ends_the_transaction(&self.sale, &self.database)?;
        sentinels_name_their_primary(&self.redis)?;
        redlock_has_masters(&self.lock)?;
        zookeeper_session_outlasts_two_leases(&self.lock)?;
        zookeeper_has_an_ensemble(&self.lock)?;
        etcd_has_endpoints(&self.lock)?;
        lock_names_hold_no_slash(&self.lock, &self.redis)
    }

    /// Every numeric setting in its [`range`] (settings built in code skip clap's check).
    fn ranges(&self) -> Result<(), String> {
        let (lock, sale, db) = (&self.lock, &self.sale, &self.database);
        range::LOCK_TTL.check(lock.ttl)?;
        range::LOCK_WAIT.check(lock.wait)?;
        range::BATCH_MAX.check(sale.batch_max)?;
        range::HOLD.check(self.hold())?;
        range::QUEUE_MAX.check(sale.queue_max)?;
        range::SOLD_OUT_RECHECK.check(sale.sold_out_recheck)?;
        range::WORK.check(sale.work)?;
        range::MAX_QUANTITY.check(sale.max_quantity)?;
        range::DATABASE_MAX_CONNECTIONS.check(db.max_connections)?;
        range::DATABASE_READ_CONNECTIONS.check(db.read_connections)?;
        range::DATABASE_ACQUIRE_TIMEOUT.check(db.acquire_timeout)?;
        range::PG_STATEMENT_TIMEOUT.check(db.statement_timeout)?;
        range::PG_LOCK_TIMEOUT.check(db.lock_timeout)?;
        range::PG_IDLE_IN_TRANSACTION_TIMEOUT.check(db.idle_in_transaction_timeout)?;
        range::ZOOKEEPER_SESSION_TIMEOUT.check(lock.zookeeper_session_timeout)
    }
}

impl DatabaseSettings {
    /// The database URL, for connecting (never for logging).
    pub fn url(&self) -> &str {
        self.url.expose_secret()
    }
}

impl RedisSettings {
    /// The Redis URL, for connecting (never for logging).
    pub fn url(&self) -> &str {
        self.url.expose_secret()
    }

    /// Where Redis is: the Sentinels when REDIS_SENTINELS is set, REDIS_URL otherwise.
    pub fn source(&self) -> RedisSource {
        if self.sentinels.is_empty() {
            RedisSource::Url(self.url().to_owned())
        } else {
            RedisSource::Sentinels {
                urls: self
                    .sentinels
                    .iter()
                    .map(|url| url.expose_secret().to_owned())
                    .collect(),
                master: self.sentinel_master.clone(),
            }
        }
    }
}

/// Under pg-row, a batch waiting for the row waits out another batch's work.
fn work_ends_before_a_waiting_batch_gives_up(
    lock: &LockSettings,
    sale: &SaleSettings,
    database: &DatabaseSettings,
) -> Result<(), String> {
    if lock.strategy == LockStrategy::PgRow && sale.work >= database.lock_timeout {
        return Err(format!(
            "WORK_MS ({}) must be below PG_LOCK_TIMEOUT_MS ({}) under LOCK_STRATEGY=pg-row: a batch that waits for the row waits out another batch's work, and would give up every time",
            sale.work.as_millis(),
            database.lock_timeout.as_millis()
        ));
    }
    Ok(())
}

/// A hold shorter than half the wait leaves other instances' buyers time for their turn.
fn hold_is_below_half_the_wait(hold: Duration, wait: Duration) -> Result<(), String> {
    if hold * 2 >= wait {
        return Err(format!(
            "HOLD_MS ({}) must be below half of LOCK_WAIT_MS ({}): other instances' buyers would give up waiting for their turn",
            hold.as_millis(),
            wait.as_millis()
        ));
    }
    Ok(())
}

/// The pg-* strategies work inside a transaction, which PostgreSQL ends when idle too long.
fn work_ends_before_postgres_ends_the_transaction(
    sale: &SaleSettings,
    database: &DatabaseSettings,
) -> Result<(), String> {
    if sale.work >= database.idle_in_transaction_timeout {
        return Err(format!(
            "WORK_MS ({}) must be below PG_IDLE_IN_TRANSACTION_TIMEOUT_MS ({}): the pg-* strategies work inside a transaction, which PostgreSQL would end",
            sale.work.as_millis(),
            database.idle_in_transaction_timeout.as_millis()
        ));
    }
    Ok(())
}

fn sentinels_name_their_primary(redis: &RedisSettings) -> Result<(), String> {
    if !redis.sentinels.is_empty() && redis.sentinel_master.trim().is_empty() {
        return Err("REDIS_SENTINELS needs REDIS_SENTINEL_MASTER, the name the Sentinels monitor the primary under".into());
    }
    Ok(())
}

fn redlock_has_masters(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::Redlock && lock.redlock_urls.is_empty() {
        return Err(
            "LOCK_STRATEGY=redlock needs REDLOCK_URLS (comma-separated Redis masters)".into(),
        );
    }
    Ok(())
}

/// Under zookeeper a lock lives only as long as its session.
fn zookeeper_session_outlasts_two_leases(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::ZooKeeper && lock.zookeeper_session_timeout < 2 * lock.ttl {
        return Err(format!(
            "ZOOKEEPER_SESSION_TIMEOUT_MS ({}) must be at least twice LOCK_TTL_MS ({}) under LOCK_STRATEGY=zookeeper: a lock lives only as long as its session, and the ensemble may end a session 0.6 of its timeout after the holder last proved it alive, so a holder counting on a longer lease could write after the ensemble gave the lock away",
            lock.zookeeper_session_timeout.as_millis(),
            lock.ttl.as_millis()
        ));
    }
    Ok(())
}

fn zookeeper_has_an_ensemble(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::ZooKeeper && lock.zookeeper_connect.trim().is_empty() {
        return Err(
            "LOCK_STRATEGY=zookeeper needs ZOOKEEPER_CONNECT (host:port,host:port,...)".into(),
        );
    }
    Ok(())
}

fn etcd_has_endpoints(lock: &LockSettings) -> Result<(), String> {
    if lock.strategy == LockStrategy::Etcd
        && lock.etcd_endpoints.iter().all(|e| e.trim().is_empty())
    {
        return Err(
            "LOCK_STRATEGY=etcd needs ETCD_ENDPOINTS (comma-separated http://host:2379)".into(),
        );
    }
    Ok(())
}

/// Under zookeeper and etcd the prefix starts every lock's name, which cannot hold a '/'.
fn lock_names_hold_no_slash(lock: &LockSettings, redis: &RedisSettings) -> Result<(), String> {
    if lock.strategy.locks_in_consensus() && redis.key_prefix.contains('/') {
        return Err(format!(
            "REDIS_KEY_PREFIX ({:?}) must not contain '/' under LOCK_STRATEGY={}: it starts every lock's name there, and a lock's name cannot hold a '/'",
            redis.key_prefix,
            lock.strategy.name()
        ));
    }
    Ok(())
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
    fn secrets_stay_out_of_debug_output() {
        let mut settings = Settings::new(
            "postgres://app:hunter2-password@db/seckill",
            "redis://:redis-password@r",
        );
        settings.http.admin_token = Some("super-secret-admin-token".into());
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2-password"), "{shown}");
        assert!(!shown.contains("super-secret-admin-token"), "{shown}");
        assert!(!shown.contains("redis-password"), "{shown}");
    }

    #[test]
    fn settings_built_in_code_are_held_to_the_ranges_the_command_line_is() {
        type Spoil = fn(&mut Settings);
        let cases: [(&str, Spoil); 4] = [
            ("BATCH_MAX", |s| s.sale.batch_max = 0),
            ("QUEUE_MAX", |s| s.sale.queue_max = 0),
            ("SOLD_OUT_RECHECK_MS", |s| {
                s.sale.sold_out_recheck = Duration::ZERO
            }),
            ("DATABASE_MAX_CONNECTIONS", |s| {
                s.database.max_connections = 0
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
        settings.lock.strategy = LockStrategy::PgRow;
        settings.sale.work = Duration::from_millis(2_000);
        settings.database.lock_timeout = Duration::from_millis(2_000);
        assert!(settings.check().unwrap_err().contains("PG_LOCK_TIMEOUT_MS"));
        settings.lock.strategy = LockStrategy::Redis;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn an_unset_hold_ms_stays_below_half_a_short_lock_wait_and_a_set_one_is_checked() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        assert_eq!(settings.hold(), DEFAULT_HOLD);
        settings.lock.wait = Duration::from_millis(150);
        assert_eq!(
            settings.check(),
            Ok(()),
            "the default adapts to a short wait"
        );
        assert_eq!(settings.hold(), Duration::from_millis(74));
        settings.sale.hold = Some(Duration::from_millis(100));
        let why = settings.check().unwrap_err();
        assert!(why.contains("HOLD_MS (100)"), "{why}");
    }

    #[test]
    fn under_zookeeper_the_session_must_last_at_least_twice_the_lock_ttl() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.lock.strategy = LockStrategy::ZooKeeper;
        assert_eq!(settings.check(), Ok(()), "the defaults fit together");
        settings.lock.ttl = Duration::from_millis(5_001);
        let why = settings.check().unwrap_err();
        assert!(
            why.contains("ZOOKEEPER_SESSION_TIMEOUT_MS (10000)"),
            "{why}"
        );
        assert!(why.contains("twice LOCK_TTL_MS (5001)"), "{why}");
        // The session timeout means nothing to the other strategies.
        settings.lock.strategy = LockStrategy::Etcd;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn a_lock_name_prefix_with_a_slash_is_refused_where_lock_names_cannot_hold_one() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.redis.key_prefix = "shop/a:".into();
        assert_eq!(settings.check(), Ok(()), "Redis keys may hold a '/'");
        for strategy in [LockStrategy::ZooKeeper, LockStrategy::Etcd] {
            settings.lock.strategy = strategy;
            let why = settings.check().unwrap_err();
            assert!(why.starts_with("REDIS_KEY_PREFIX"), "{why}");
        }
    }

    #[test]
    fn etcd_endpoints_are_comma_separated_with_a_local_default() {
        let parsed = Settings::parse_from(["seckill", "--database-url", "x"]);
        assert_eq!(parsed.lock.etcd_endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(parsed.lock.zookeeper_connect, "127.0.0.1:2181");
        let parsed = Settings::parse_from([
            "seckill",
            "--database-url",
            "x",
            "--etcd-endpoints",
            "http://a:2379,http://b:2379",
        ]);
        assert_eq!(
            parsed.lock.etcd_endpoints,
            ["http://a:2379", "http://b:2379"]
        );
    }

    #[test]
    fn work_inside_a_transaction_must_end_before_postgres_ends_the_session() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.sale.work = Duration::from_millis(6_000);
        assert!(
            settings
                .check()
                .unwrap_err()
                .contains("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS")
        );
    }
}
