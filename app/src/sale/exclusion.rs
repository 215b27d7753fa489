//! How batches of different instances are kept apart ([`Exclusion`]), and one `connect` per
//! lock backend that builds it from the settings at start-up.

use std::time::Duration;

use anyhow::Context;
use distlock::{
    Backend, EtcdLock, LockOptions, Locker, PgLockTable, Redlock, ReleaseSignals, ZkLock,
};
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::batch::Step;
use super::fenced::probe_key;
use crate::redact::redacted;
use crate::redis_link::{self, RedisConn, RedisLink, RedisSource};
use crate::settings::{CaFile, LockSettings, LockStrategy, Settings};

/// A desk leader's backoff between lock attempts when it polls (Redlock, pg-lock): short,
/// since a hold lasts at most `HOLD_MS`. Under `redis` the leader waits for the release
/// message instead, and this is only its backstop.
const LOCK_RETRY_MIN: Duration = Duration::from_millis(2);
const LOCK_RETRY_MAX: Duration = Duration::from_millis(10);

/// How long start-up waits for ZooKeeper or etcd to answer its first read.
///
/// TIMING: a healthy server answers within milliseconds; an etcd client waits for an endpoint
/// that is down up to its own 5 s connect timeout before failing.
const CONSENSUS_PROBE_WITHIN: Duration = Duration::from_secs(10);

/// Connections of the lock table's own pool (`pg-lock`): one leader per product attempts and
/// renews through it.
const LOCK_TABLE_CONNECTIONS: u32 = 4;

/// How the desks of one instance keep batches of a product apart from other instances'.
pub enum Exclusion {
    /// The Redis lock `lock_sale_<id>`, fenced.
    Redis(Locker<RedisConn>),
    /// The same lock on a majority of independent Redis masters, fenced.
    Redlock(Locker<Redlock<redis::aio::ConnectionManager>>),
    /// The same lock in PostgreSQL's lock table, fenced.
    PgLock(Locker<PgLockTable>),
    /// The same lock in ZooKeeper (an ephemeral sequential node per contender), fenced with
    /// the holder node's creation zxid.
    ZooKeeper(Locker<ZkLock>),
    /// The same lock in etcd (a key on a lease per contender), fenced with the holder key's
    /// create revision.
    Etcd(Locker<EtcdLock>),
    /// No lock of ours: the batch's transaction reads and writes the stock `step`'s way.
    Transaction(Step),
}

impl Exclusion {
    /// The exclusion of the configured strategy, its lock service connected (and, for
    /// ZooKeeper and etcd, answering).
    ///
    /// # Errors
    /// A message naming the setting: a lock service that cannot be reached, or refuses.
    pub async fn connect(
        settings: &Settings,
        pool: &PgPool,
        redis: &RedisLink,
        source: &RedisSource,
    ) -> anyhow::Result<Self> {
        let lock = &settings.lock;
        let prefix = settings.redis.key_prefix.as_str();
        Ok(match lock.strategy {
            LockStrategy::Redis => connect_redis(lock, redis, source).await?,
            LockStrategy::Redlock => connect_redlock(lock, settings.redis.ca_file.as_ref()).await?,
            LockStrategy::PgLock => {
                connect_lock_table(lock, pool, settings.database.acquire_timeout).await?
            }
            LockStrategy::ZooKeeper => connect_zookeeper(lock, prefix).await?,
            LockStrategy::Etcd => connect_etcd(lock, prefix).await?,
            LockStrategy::PgRow => Exclusion::Transaction(Step::RowLock),
            LockStrategy::PgOptimistic => Exclusion::Transaction(Step::Optimistic),
            LockStrategy::PgAtomic => Exclusion::Transaction(Step::Atomic),
            LockStrategy::None => Exclusion::Transaction(Step::Unsafe),
        })
    }
}

/// Every lock's lease and wait, and the leaders' backoff.
fn lock_options(lock: &LockSettings) -> anyhow::Result<LockOptions> {
    LockOptions::builder()
        .ttl(lock.ttl)
        .wait_timeout(lock.wait)
        .retry_delay(LOCK_RETRY_MIN, LOCK_RETRY_MAX)
        .build()
        .context("invalid LOCK_TTL_MS / LOCK_WAIT_MS")
}

/// `redis`: the lock on the service's Redis, waiters woken by release messages (polling
/// instead behind Sentinel).
async fn connect_redis(
    lock: &LockSettings,
    redis: &RedisLink,
    source: &RedisSource,
) -> anyhow::Result<Exclusion> {
    let conn = redis.get().expect("connected at start-up under redis");
    // `connect` checks the server is Redis 7.0 or later, naming its version.
    let locker = Locker::connect(conn, lock_options(lock)?)
        .await
        .context("cannot lock on this Redis (REDIS_URL / REDIS_SENTINELS)")?;
    Ok(match source {
        RedisSource::Url { url, ca } => {
            let client = redis_link::client(url, ca.as_ref())?;
            let signals = ReleaseSignals::connect(&client)
                .await
                .context("cannot subscribe to lock releases (REDIS_URL)")?;
            Exclusion::Redis(locker.with_release_signals(signals))
        }
        // Release messages come over one fixed connection, which would not follow
        // a failover: through Sentinel, waiters poll.
        RedisSource::Sentinels { .. } => Exclusion::Redis(locker),
    })
}

/// `redlock`: the lock on a majority of the masters in `REDLOCK_URLS` (those reached over
/// TLS checked against `ca`).
async fn connect_redlock(lock: &LockSettings, ca: Option<&CaFile>) -> anyhow::Result<Exclusion> {
    let mut nodes = Vec::new();
    for url in &lock.redlock_urls {
        nodes.push(connect_master(url, ca).await?);
    }
    let redlock = Redlock::new(nodes).context("invalid REDLOCK_URLS")?;
    // `connect` checks every master runs Redis 7.0 or later, naming its version.
    Ok(Exclusion::Redlock(
        Locker::connect(redlock, lock_options(lock)?)
            .await
            .context("cannot lock on these Redis masters (REDLOCK_URLS)")?,
    ))
}

/// One Redlock master, named without its password when it cannot be reached.
async fn connect_master(
    url: &SecretString,
    ca: Option<&CaFile>,
) -> anyhow::Result<redis::aio::ConnectionManager> {
    let url = url.expose_secret();
    let setting = format!("REDLOCK_URLS: {}", redacted(url));
    redis_link::connect(url, ca, redis_link::config())
        .await
        .with_context(|| format!("cannot connect to Redis ({setting})"))
}

/// `pg-lock`: the lock in a PostgreSQL table (made with the schema, at start-up), on a pool
/// of its own: the leaders' attempts and their watchdogs' renewals must not wait behind the
/// batches for a connection (a late renewal costs the lease).
async fn connect_lock_table(
    lock: &LockSettings,
    pool: &PgPool,
    acquire_timeout: Duration,
) -> anyhow::Result<Exclusion> {
    let locks = PgPoolOptions::new()
        .max_connections(LOCK_TABLE_CONNECTIONS)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    Ok(Exclusion::PgLock(
        Locker::new(PgLockTable::new(locks), lock_options(lock)?)
            .context("invalid lock settings")?,
    ))
}

/// `zookeeper`: a session on the ensemble, long enough for the lease, and a first read.
async fn connect_zookeeper(lock: &LockSettings, prefix: &str) -> anyhow::Result<Exclusion> {
    let connect = lock.zookeeper_connect.as_str();
    // The connector tries every server in turn for about one session timeout before
    // it gives up.
    let zk = ZkLock::builder(connect)
        .session_timeout(lock.zookeeper_session_timeout)
        .connect()
        .await
        .with_context(|| {
            format!(
                "cannot open a ZooKeeper session at {connect} within about {} ms (ZOOKEEPER_CONNECT)",
                lock.zookeeper_session_timeout.as_millis()
            )
        })?;
    granted_session_outlasts_two_leases(&zk, lock)?;
    let locker = Locker::new(zk, lock_options(lock)?).context("invalid lock settings")?;
    probe(&locker, prefix)
        .await
        .with_context(|| format!("ZooKeeper at {connect} does not answer (ZOOKEEPER_CONNECT)"))?;
    Ok(Exclusion::ZooKeeper(locker))
}

/// The server bounds the session timeout to its own minSessionTimeout .. maxSessionTimeout;
/// a lock's lease may be at most half the session's.
fn granted_session_outlasts_two_leases(zk: &ZkLock, lock: &LockSettings) -> anyhow::Result<()> {
    let granted = zk.session_timeout();
    if zk.max_ttl() < lock.ttl {
        anyhow::bail!(
            "ZooKeeper at {} granted a session timeout of {} ms, less than twice \
             LOCK_TTL_MS ({} ms) (ZOOKEEPER_SESSION_TIMEOUT_MS asked for {} ms): a lock \
             lives only as long as its session, and the ensemble may end a session 0.6 of \
             its timeout after the holder last proved it alive, so a holder could write \
             after the ensemble gave its lock away. Lower LOCK_TTL_MS to at most {} ms, \
             or raise the servers' maxSessionTimeout (zoo.cfg) to at least {} ms",
            lock.zookeeper_connect,
            granted.as_millis(),
            lock.ttl.as_millis(),
            lock.zookeeper_session_timeout.as_millis(),
            zk.max_ttl().as_millis(),
            2 * lock.ttl.as_millis(),
        );
    }
    Ok(())
}

/// `etcd`: a client of the cluster, and a first read (the client connects lazily: only a
/// request tells whether etcd is there).
async fn connect_etcd(lock: &LockSettings, prefix: &str) -> anyhow::Result<Exclusion> {
    let endpoints = lock.etcd_endpoints.join(",");
    let mut builder = EtcdLock::builder(&lock.etcd_endpoints);
    if let Some(ca) = &lock.etcd_ca_file {
        builder = builder.ca_certificate(ca.pem.to_vec());
    }
    let etcd = builder
        .connect()
        .await
        .with_context(|| format!("cannot connect to etcd at {endpoints} (ETCD_ENDPOINTS)"))?;
    let locker = Locker::new(etcd, lock_options(lock)?).context("invalid lock settings")?;
    probe(&locker, prefix)
        .await
        .with_context(|| format!("cannot reach etcd at {endpoints} (ETCD_ENDPOINTS)"))?;
    Ok(Exclusion::Etcd(locker))
}

/// One read of the lock service (what it knows of a lock nobody takes), so that start-up
/// fails now, naming the setting, rather than at the first purchase.
async fn probe<B: Backend>(locker: &Locker<B>, prefix: &str) -> anyhow::Result<()> {
    let key = probe_key(prefix);
    match tokio::time::timeout(CONSENSUS_PROBE_WITHIN, locker.inspect(&key)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => anyhow::bail!("no answer within {CONSENSUS_PROBE_WITHIN:?}"),
    }
}
