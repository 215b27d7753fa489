//! Four groups of settings, one struct each, as `seckill --help` shows them (the HTTP group
//! is in `http.rs`). Every flag and variable keeps the name it had before the groups
//! (`--database-url`, `DATABASE_URL`), so each field names both.

use std::time::Duration;

use clap::Args;
use secrecy::{ExposeSecret, SecretString};

use super::LockStrategy;
use super::range;
use super::tls::{CaFile, ca_file};
use crate::redis_link::RedisSource;

/// PostgreSQL: where it is, the service's pools, and the bounds of its sessions.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Database")]
pub struct DatabaseSettings {
    /// PostgreSQL URL. The schema is made at start-up when it is not current, so an empty
    /// database works for a role that may create tables (or with DATABASE_MIGRATION_URL).
    /// Kept out of logs and debug output (it may hold a password). This or
    /// DATABASE_URL_FILE is required.
    #[arg(
        long = "database-url",
        id = "database_url",
        value_name = "DATABASE_URL",
        env = "DATABASE_URL",
        hide_env_values = true,
        value_parser = secret,
        required_unless_present = "database_url_file",
        conflicts_with = "database_url_file",
    )]
    pub url: Option<SecretString>,

    /// A file holding the PostgreSQL URL (surrounding whitespace ignored), read at start-up:
    /// a URL with a password need not be in the environment or on the command line.
    #[arg(
        long = "database-url-file",
        id = "database_url_file",
        value_name = "DATABASE_URL_FILE",
        env = "DATABASE_URL_FILE",
        value_parser = secret_from_file,
    )]
    pub url_file: Option<SecretString>,

    /// The PostgreSQL URL migrations run with: a role that owns the schema, so that the
    /// service's own role (DATABASE_URL) needs no right to change it (deploy/postgres/
    /// roles.sql makes both). The schema changes run on one connection, closed once they
    /// are done. Unset: DATABASE_URL's role runs them, unless the schema is current already
    /// (read, not changed). Kept out of logs and debug output.
    #[arg(
        long = "database-migration-url",
        id = "database_migration_url",
        value_name = "DATABASE_MIGRATION_URL",
        env = "DATABASE_MIGRATION_URL",
        hide_env_values = true,
        value_parser = secret,
        conflicts_with = "database_migration_url_file",
    )]
    pub migration_url: Option<SecretString>,

    /// A file holding DATABASE_MIGRATION_URL (surrounding whitespace ignored), read at
    /// start-up.
    #[arg(
        long = "database-migration-url-file",
        id = "database_migration_url_file",
        value_name = "DATABASE_MIGRATION_URL_FILE",
        env = "DATABASE_MIGRATION_URL_FILE",
        value_parser = secret_from_file,
    )]
    pub migration_url_file: Option<SecretString>,

    /// Make the database schema (as DATABASE_MIGRATION_URL's role when it is set, else as
    /// DATABASE_URL's), the pg-lock table included whatever LOCK_STRATEGY says, and exit,
    /// starting nothing else: a deployment's migration job, so that the instances need no
    /// right to change the schema and no owner's URL. `--migrate-only` alone means true.
    #[arg(
        long = "migrate-only",
        id = "migrate_only",
        value_name = "MIGRATE_ONLY",
        env = "MIGRATE_ONLY",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        default_value_t = false,
    )]
    pub migrate_only: bool,

    /// Size of the PostgreSQL connection pool. Lock holders' batches (the lock strategies)
    /// have a pool of their own of the same size, which opens a connection only when one is
    /// needed: two at a time for their writes (the instance's writer), and one for each
    /// holder reading its product's row.
    #[arg(
        long = "database-max-connections",
        id = "database_max_connections",
        value_name = "DATABASE_MAX_CONNECTIONS",
        env = "DATABASE_MAX_CONNECTIONS",
        default_value_t = 10,
        value_parser = range::DATABASE_MAX_CONNECTIONS.parser(),
    )]
    pub max_connections: u32,

    /// Size of a second PostgreSQL pool, for public reads only (a product's books, order
    /// look-ups): a flood of reads waits for these and never takes a connection the sale
    /// needs, nor one of those a new product's first purchase is looked up on.
    #[arg(
        long = "database-read-connections",
        id = "database_read_connections",
        value_name = "DATABASE_READ_CONNECTIONS",
        env = "DATABASE_READ_CONNECTIONS",
        default_value_t = 2,
        value_parser = range::DATABASE_READ_CONNECTIONS.parser(),
    )]
    pub read_connections: u32,

    /// How long a request waits for a pooled connection before answering 503 busy, in ms.
    #[arg(
        long = "database-acquire-timeout-ms",
        id = "database_acquire_timeout_ms",
        value_name = "DATABASE_ACQUIRE_TIMEOUT_MS",
        env = "DATABASE_ACQUIRE_TIMEOUT_MS",
        default_value = "2000",
        value_parser = range::DATABASE_ACQUIRE_TIMEOUT.parser(),
    )]
    pub acquire_timeout: Duration,

    /// PostgreSQL `statement_timeout` of the service's sessions and transactions, in ms: no
    /// statement runs longer (503 busy).
    #[arg(
        long = "pg-statement-timeout-ms",
        id = "pg_statement_timeout_ms",
        value_name = "PG_STATEMENT_TIMEOUT_MS",
        env = "PG_STATEMENT_TIMEOUT_MS",
        default_value = "5000",
        value_parser = range::PG_STATEMENT_TIMEOUT.parser(),
    )]
    pub statement_timeout: Duration,

    /// PostgreSQL `lock_timeout`, in ms: a purchase waiting for a row that another session
    /// holds gives up after this long (503 busy) instead of hanging behind a hung instance.
    #[arg(
        long = "pg-lock-timeout-ms",
        id = "pg_lock_timeout_ms",
        value_name = "PG_LOCK_TIMEOUT_MS",
        env = "PG_LOCK_TIMEOUT_MS",
        default_value = "2000",
        value_parser = range::PG_LOCK_TIMEOUT.parser(),
    )]
    pub lock_timeout: Duration,

    /// PostgreSQL `idle_in_transaction_session_timeout`, in ms: PostgreSQL ends a session
    /// that sits in an open transaction this long (a hung or paused instance), rolling its
    /// transaction back and freeing its row locks.
    #[arg(
        long = "pg-idle-in-transaction-timeout-ms",
        id = "pg_idle_in_transaction_timeout_ms",
        value_name = "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        env = "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        default_value = "5000",
        value_parser = range::PG_IDLE_IN_TRANSACTION_TIMEOUT.parser(),
    )]
    pub idle_in_transaction_timeout: Duration,
}

/// Redis: one server or the Sentinels that name it, and the prefix of every key.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisSettings {
    /// Redis URL: the lock under LOCK_STRATEGY=redis, and restock messages between
    /// instances. The other strategies start and sell without it (restocks then reach other
    /// instances within SOLD_OUT_RECHECK_MS).
    #[arg(
        long = "redis-url",
        id = "redis_url",
        value_name = "REDIS_URL",
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true,
        value_parser = secret,
    )]
    pub url: SecretString,

    /// A PEM file of the certificate authorities a Redis reached over TLS (a `rediss://`
    /// URL, in REDIS_URL or REDLOCK_URLS) must be signed by, instead of the system's. Not
    /// used through REDIS_SENTINELS (not supported over TLS).
    #[arg(
        long = "redis-ca-file",
        id = "redis_ca_file",
        value_name = "REDIS_CA_FILE",
        env = "REDIS_CA_FILE",
        value_parser = ca_file,
    )]
    pub ca_file: Option<CaFile>,

    /// Redis Sentinels, comma-separated (`redis://host:26379` each). Set: Redis is the
    /// primary these Sentinels name for REDIS_SENTINEL_MASTER, for everything the service
    /// uses Redis for (the redis lock, restock messages, readiness), and REDIS_URL is not
    /// used. After a failover the service moves to the new primary by itself within about a
    /// second. The redis lock's waiters then poll (release messages do not follow a failover).
    #[arg(
        long = "redis-sentinels",
        id = "redis_sentinels",
        value_name = "REDIS_SENTINELS",
        env = "REDIS_SENTINELS",
        value_delimiter = ',',
        hide_env_values = true,
        value_parser = secret,
    )]
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
    #[arg(
        long = "lock-strategy",
        id = "lock_strategy",
        value_name = "LOCK_STRATEGY",
        env = "LOCK_STRATEGY",
        value_enum,
        default_value_t = LockStrategy::Redis,
    )]
    pub strategy: LockStrategy,

    /// Lease of the lock (redis, redlock, pg-lock, zookeeper, etcd), in ms. The watchdog renews
    /// it every third of it while a batch is sold; a crashed holder blocks the product for at
    /// most this long (under zookeeper, for the session timeout; under etcd, this rounded up
    /// to whole seconds).
    #[arg(
        long = "lock-ttl-ms",
        id = "lock_ttl_ms",
        value_name = "LOCK_TTL_MS",
        env = "LOCK_TTL_MS",
        default_value = "5000",
        value_parser = range::LOCK_TTL.parser(),
    )]
    pub ttl: Duration,

    /// How long a purchase may wait in its product's queue (for the lock, and for its turn)
    /// before answering 503 busy, in ms.
    #[arg(
        long = "lock-wait-ms",
        id = "lock_wait_ms",
        value_name = "LOCK_WAIT_MS",
        env = "LOCK_WAIT_MS",
        default_value = "2000",
        value_parser = range::LOCK_WAIT.parser(),
    )]
    pub wait: Duration,

    /// Independent Redis masters for LOCK_STRATEGY=redlock, comma-separated (3 or 5 is usual).
    #[arg(
        long = "redlock-urls",
        id = "redlock_urls",
        value_name = "REDLOCK_URLS",
        env = "REDLOCK_URLS",
        value_delimiter = ',',
        hide_env_values = true,
        value_parser = secret,
    )]
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
    #[arg(
        long = "zookeeper-session-timeout-ms",
        id = "zookeeper_session_timeout_ms",
        value_name = "ZOOKEEPER_SESSION_TIMEOUT_MS",
        env = "ZOOKEEPER_SESSION_TIMEOUT_MS",
        default_value = "10000",
        value_parser = range::ZOOKEEPER_SESSION_TIMEOUT.parser(),
    )]
    pub zookeeper_session_timeout: Duration,

    /// etcd endpoints for LOCK_STRATEGY=etcd, comma-separated (`http://host:2379` each, or
    /// `https://host:2379` over TLS). Lock keys live under `distlock/`.
    #[arg(
        long = "etcd-endpoints",
        id = "etcd_endpoints",
        value_name = "ETCD_ENDPOINTS",
        env = "ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,

    /// A PEM file of the certificate authorities that etcd's certificates (`https://`
    /// ETCD_ENDPOINTS) must be signed by, instead of the system's.
    #[arg(
        long = "etcd-ca-file",
        id = "etcd_ca_file",
        value_name = "ETCD_CA_FILE",
        env = "ETCD_CA_FILE",
        value_parser = ca_file,
    )]
    pub etcd_ca_file: Option<CaFile>,
}

/// How one instance sells a product: its batches, holds, queue and limits.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sale")]
pub struct SaleSettings {
    /// Most purchases in one batch of a product: a batch takes whatever waits, up to this, so
    /// batches grow only while the queue is long. 1 sells one purchase per lock hold and per
    /// transaction: the per-request baseline.
    #[arg(
        long = "batch-max",
        id = "batch_max",
        value_name = "BATCH_MAX",
        env = "BATCH_MAX",
        default_value_t = 256,
        value_parser = range::BATCH_MAX.parser(),
    )]
    pub batch_max: u32,

    /// How long an instance alone keeps a product's lock while buyers keep queueing, in ms,
    /// before it gives it up and asks again (a batch already started is finished first).
    /// While other instances want the product (an acquisition of this one found the lock
    /// held, or timed out, within the last second), a hold sells one batch, whatever this is.
    /// Must be below half of LOCK_WAIT_MS, or the buyers of other instances would give up
    /// waiting for their turn (an instance that comes to want the product usually gets it
    /// within one hold). Unset: 100, or just below half of LOCK_WAIT_MS when that is less.
    #[arg(
        long = "hold-ms",
        id = "hold_ms",
        value_name = "HOLD_MS",
        env = "HOLD_MS",
        value_parser = range::HOLD.parser(),
    )]
    pub hold: Option<Duration>,

    /// Purchases that may queue for one product in one instance; beyond it, new arrivals get
    /// an immediate 503 busy with Retry-After.
    #[arg(
        long = "queue-max",
        id = "queue_max",
        value_name = "QUEUE_MAX",
        env = "QUEUE_MAX",
        default_value_t = 10_000,
        value_parser = range::QUEUE_MAX.parser(),
    )]
    pub queue_max: u32,

    /// How long an instance trusts its own memory that a product is sold out before it asks
    /// PostgreSQL again, in ms: the bound on how late a restock can reach an instance that
    /// missed the restock message (Redis down).
    #[arg(
        long = "sold-out-recheck-ms",
        id = "sold_out_recheck_ms",
        value_name = "SOLD_OUT_RECHECK_MS",
        env = "SOLD_OUT_RECHECK_MS",
        default_value = "1000",
        value_parser = range::SOLD_OUT_RECHECK.parser(),
    )]
    pub sold_out_recheck: Duration,

    /// Extra time spent inside the critical section of every batch, in ms, to show leases,
    /// renewals and races at work. 0 in production. Must stay below
    /// PG_IDLE_IN_TRANSACTION_TIMEOUT_MS (the pg-* strategies spend it inside a transaction),
    /// and under pg-row below PG_LOCK_TIMEOUT_MS (a batch waiting for the row waits it out).
    #[arg(
        long = "work-ms",
        id = "work_ms",
        value_name = "WORK_MS",
        env = "WORK_MS",
        default_value = "0",
        value_parser = range::WORK.parser(),
    )]
    pub work: Duration,

    /// The largest quantity one purchase may ask for.
    #[arg(
        long = "max-quantity",
        id = "max_quantity",
        value_name = "MAX_QUANTITY",
        env = "MAX_QUANTITY",
        default_value_t = 5,
        value_parser = range::MAX_QUANTITY.parser(),
    )]
    pub max_quantity: u32,
}

impl DatabaseSettings {
    /// The database URL (`DATABASE_URL`, or the content of `DATABASE_URL_FILE`), for
    /// connecting (never for logging); empty when neither is set (`Settings::check` refuses
    /// that).
    pub fn url(&self) -> &str {
        self.url
            .as_ref()
            .or(self.url_file.as_ref())
            .map_or("", ExposeSecret::expose_secret)
    }

    /// The URL migrations run with (DATABASE_MIGRATION_URL or its file), if another than
    /// [`url`](Self::url)'s; never for logging.
    pub fn migration_url(&self) -> Option<&str> {
        self.migration_url
            .as_ref()
            .or(self.migration_url_file.as_ref())
            .map(ExposeSecret::expose_secret)
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
            RedisSource::Url {
                url: self.url().to_owned(),
                ca: self.ca_file.clone(),
            }
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

pub(super) fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw))
}

/// A secret read from the file named by `raw`, trimmed; the message names the file, never
/// its content.
fn secret_from_file(raw: &str) -> Result<SecretString, String> {
    let content = std::fs::read_to_string(raw).map_err(|e| format!("cannot read {raw}: {e}"))?;
    let trimmed = content.trim();
    if trimmed.is_empty() {
        return Err(format!("{raw} is empty"));
    }
    Ok(SecretString::from(trimmed))
}
