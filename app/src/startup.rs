//! Building the service from its settings: pools, migrations, the lock, the HTTP server.

use std::net::TcpListener;
use std::str::FromStr;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use distlock::{
    Backend, EtcdLock, LockOptions, Locker, PgLockTable, Redlock, ReleaseSignals, ZkLock,
};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::MIGRATOR;
use crate::metrics::Metrics;
use crate::redis_link::{self, RedisLink, RedisSource};
use crate::repository::{self, SessionBounds};
use crate::routes::admin::AdminToken;
use crate::routes::health::Health;
use crate::routes::sold_out::SoldOutLane;
use crate::routes::{self, not_found};
use crate::sale::batch::Step;
use crate::sale::fenced::probe_key;
use crate::sale::{Exclusion, Sale, SaleParts};
use crate::settings::{LockStrategy, Settings, redacted};
use secrecy::ExposeSecret;

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

/// A bound, listening, not yet running service.
pub struct Application {
    server: Server,
    address: std::net::SocketAddr,
}

impl Application {
    /// Connect to PostgreSQL (and Redis, when the strategy sells with it), run migrations,
    /// bind `BIND_ADDR`.
    ///
    /// # Errors
    /// A message naming what failed: an invalid setting, an unreachable PostgreSQL or Redis,
    /// a failed migration, an address that cannot be bound.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.check().map_err(anyhow::Error::msg)?;
        let options = PgConnectOptions::from_str(settings.database_url())
            .context("invalid DATABASE_URL")?
            .options(session_bounds(&settings));
        let pool = pool_options(&settings)
            .connect_with(options)
            .await
            .context("cannot connect to PostgreSQL (DATABASE_URL)")?;
        Self::build_with_pool(settings, pool).await
    }

    /// As [`build`](Self::build), on a pool the caller made (tests hand in their own
    /// database). Every session the service uses must carry the session bounds: a lock
    /// holder's batch is one statement with no transaction of its own to set them in. A pool
    /// made without them (as `build` makes it with them) gets them for its new connections
    /// from now on, and the connections it has are closed as they come back, for up to a
    /// second: one the caller keeps checked out longer keeps its own settings, so hand in a
    /// pool nobody is using.
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub async fn build_with_pool(settings: Settings, pool: PgPool) -> anyhow::Result<Self> {
        settings.check().map_err(anyhow::Error::msg)?;
        MIGRATOR
            .run(&pool)
            .await
            .context("cannot run database migrations")?;
        bound_sessions(&pool, &settings).await;
        let strategy = settings.lock_strategy;
        let source = settings.redis_source();
        let redis = if strategy.needs_redis() {
            RedisLink::connect_now(&source).await?
        } else {
            RedisLink::connect_in_background(&source)?
        };
        if strategy == LockStrategy::None {
            tracing::warn!(
                "LOCK_STRATEGY=none: purchases read and write stock WITHOUT ANY LOCK. \
                 Concurrent buyers WILL lose updates and oversell. Use only to demonstrate the race."
            );
        }
        let exclusion = exclusion(&settings, &pool, &redis, &source).await?;
        let metrics = Metrics::new();
        let deployment = repository::deployment_id(&pool)
            .await
            .context("cannot read the deployment id from PostgreSQL")?;
        // After `bound_sessions`: its connections carry the session bounds too.
        let reads_pool = PgPoolOptions::new()
            .max_connections(settings.database_read_connections)
            .acquire_timeout(settings.database_acquire_timeout())
            .test_before_acquire(false)
            .connect_lazy_with(pool.connect_options().as_ref().clone());
        let holders_pool = PgPoolOptions::new()
            .max_connections(settings.database_max_connections)
            .acquire_timeout(settings.database_acquire_timeout())
            .test_before_acquire(false)
            .connect_lazy_with(holder_sessions(&pool));
        let sale = Sale::new(SaleParts {
            pool: pool.clone(),
            reads_pool,
            holders_pool,
            strategy,
            exclusion,
            metrics,
            redis_source: source,
            redis: redis.clone(),
            key_prefix: settings.redis_key_prefix.clone(),
            deployment,
            batch_max: settings.batch_max as usize,
            queue_max: settings.queue_max as usize,
            hold: settings.hold(),
            work: settings.work(),
            wait: settings.lock_wait(),
            sold_out_recheck: settings.sold_out_recheck(),
            max_quantity: settings.max_quantity,
            batch_timeout: batch_timeout(&settings),
            bounds: SessionBounds {
                statement_timeout_ms: settings.pg_statement_timeout_ms,
                lock_timeout_ms: settings.pg_lock_timeout_ms,
                idle_in_transaction_timeout_ms: settings.pg_idle_in_transaction_timeout_ms,
            },
        });

        let listener = TcpListener::bind(settings.bind_addr)
            .with_context(|| format!("cannot listen on {} (BIND_ADDR)", settings.bind_addr))?;
        let address = listener.local_addr()?;
        let sale = web::Data::new(sale);
        let health = web::Data::new(Health::new(
            pool.connect_options().as_ref().clone(),
            redis,
            probe_key(&settings.redis_key_prefix),
        ));
        let admin = web::Data::new(AdminToken(settings.admin_token.clone()));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(sale.clone())
                .app_data(health.clone())
                .app_data(admin.clone())
                .configure(routes::configure)
                .default_service(web::to(not_found))
                // The flood after a sale is answered before the router sees it.
                .wrap(SoldOutLane)
        })
        // A buyer who disconnects while queued (EOF on the socket) has their request dropped,
        // so the desk skips them instead of selling to nobody.
        .h1_allow_half_closed(false)
        .listen(listener)?
        .run();
        tracing::info!(%address, strategy = strategy.name(), "seckill listening");
        Ok(Self { server, address })
    }

    /// The port actually bound (useful with port 0).
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The address actually bound.
    pub fn address(&self) -> std::net::SocketAddr {
        self.address
    }

    /// Serve until the process is asked to stop (SIGINT, SIGTERM).
    ///
    /// # Errors
    /// An I/O error of the server.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

/// The session bounds as connection options: every session the service uses has them (see
/// [`bound_sessions`]). With them, custom plans for every statement: see
/// [`crate::repository::begin`] for why a cached generic plan is a trap on a table that grows
/// during the sale (the order lookup, and the lock table under `pg-lock`, run outside
/// `begin`). The lock holders' sessions keep generic plans instead, made safe another way
/// ([`holder_sessions`]).
fn session_bounds(settings: &Settings) -> [(&'static str, String); 4] {
    let ms = |value: u64| format!("{value}ms");
    [
        ("statement_timeout", ms(settings.pg_statement_timeout_ms)),
        ("lock_timeout", ms(settings.pg_lock_timeout_ms)),
        (
            "idle_in_transaction_session_timeout",
            ms(settings.pg_idle_in_transaction_timeout_ms),
        ),
        ("plan_cache_mode", "force_custom_plan".to_owned()),
    ]
}

/// The sessions of the lock holders' pool: `pool`'s (with the session bounds), with one
/// generic plan per statement kept for the session's life, and no sequential scan.
///
/// A holder's batch is one statement ([`crate::repository::sell_as_holder`]) sent again and
/// again with new buyers; planning it for its parameters every time (a custom plan, as every
/// other session of the service does) costs about as much as running it for a batch of 32,
/// and about a third of a batch's time in PostgreSQL. Its generic plan is as good: every
/// table it reads is reached by a key (the product's primary key, one probe of the unique
/// index `orders_one_per_user` per buyer). But a generic plan is made once, with the
/// statistics of that moment: made while `orders` was small (a fresh deployment's first
/// sale, right after autovacuum analyzed it), it would scan the whole table for every buyer
/// for as long as the session lives, a sale slowing down as it sells. `enable_seqscan = off`
/// keeps the planner on the indexes whatever the statistics say (tested in
/// `tests/api/batches.rs`); these sessions run nothing else.
pub fn holder_sessions(pool: &PgPool) -> PgConnectOptions {
    pool.connect_options()
        .as_ref()
        .clone()
        .options([
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_seqscan", "off"),
        ])
        // Told apart in `pg_stat_activity` (operators; a test checks holders sell here).
        .application_name(HOLDERS_APPLICATION_NAME)
}

/// The `application_name` of the lock holders' sessions.
pub const HOLDERS_APPLICATION_NAME: &str = "seckill lock holders";

/// Give every session of `pool` from now on the session bounds, unless its connections are
/// made with them already: as options of its new connections; and the connections made
/// before are closed, each as soon as it is idle (one handed back just now becomes idle a
/// moment later), waiting for them up to `HANDED_BACK`.
async fn bound_sessions(pool: &PgPool, settings: &Settings) {
    const HANDED_BACK: Duration = Duration::from_secs(1);
    let bounded = PgConnectOptions::new_without_pgpass().options(session_bounds(settings));
    let options = pool.connect_options().as_ref().clone();
    if let Some(bounds) = bounded.get_options()
        && options.get_options().is_some_and(|o| o.ends_with(bounds))
    {
        return;
    }
    pool.set_connect_options(options.options(session_bounds(settings)));
    let deadline = tokio::time::Instant::now() + HANDED_BACK;
    loop {
        while let Some(mut idle) = pool.try_acquire() {
            idle.close_on_drop();
        }
        if pool.size() == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                connections = pool.size(),
                "connections of the pool handed in stayed checked out; they keep the settings they were made with"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The longest a healthy batch can take: waiting for a connection, then its four
/// statements (begin, read, insert-and-write, commit; a lock holder's batch sends at most
/// four, usually one), each bounded by `statement_timeout` on the server, plus the work.
fn batch_timeout(settings: &Settings) -> Duration {
    settings.database_acquire_timeout()
        + Duration::from_millis(settings.pg_statement_timeout_ms) * 4
        + settings.work()
}

/// No ping before a pooled connection is handed out (sqlx pings by default): it would be one
/// more round trip on every batch. A connection that died while idle fails its batch
/// instead, and is dropped from the pool: its buyers are answered as for any lost
/// connection (503 `database_unavailable`, or `outcome_unknown` where the write may have been
/// sent: they look their order up, then retry).
fn pool_options(settings: &Settings) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(settings.database_max_connections)
        .acquire_timeout(settings.database_acquire_timeout())
        .test_before_acquire(false)
}

/// How batches of different instances are kept apart, for the configured strategy.
async fn exclusion(
    settings: &Settings,
    pool: &PgPool,
    redis: &RedisLink,
    source: &RedisSource,
) -> anyhow::Result<Exclusion> {
    let options = || {
        LockOptions::builder()
            .ttl(settings.lock_ttl())
            .wait_timeout(settings.lock_wait())
            .retry_delay(LOCK_RETRY_MIN, LOCK_RETRY_MAX)
            .build()
            .context("invalid LOCK_TTL_MS / LOCK_WAIT_MS")
    };
    Ok(match settings.lock_strategy {
        LockStrategy::Redis => {
            let conn = redis.get().expect("connected at start-up under redis");
            // `connect` checks the server is Redis 7.0 or later, naming its version.
            let locker = Locker::connect(conn, options()?)
                .await
                .context("cannot lock on this Redis (REDIS_URL / REDIS_SENTINELS)")?;
            match source {
                RedisSource::Url(url) => {
                    let client = redis::Client::open(url.as_str())?;
                    let signals = ReleaseSignals::connect(&client)
                        .await
                        .context("cannot subscribe to lock releases (REDIS_URL)")?;
                    Exclusion::Redis(locker.with_release_signals(signals))
                }
                // Release messages come over one fixed connection, which would not follow
                // a failover: through Sentinel, waiters poll.
                RedisSource::Sentinels { .. } => Exclusion::Redis(locker),
            }
        }
        LockStrategy::Redlock => {
            let mut nodes = Vec::new();
            for url in &settings.redlock_urls {
                let url = url.expose_secret();
                let setting = format!("REDLOCK_URLS: {}", redacted(url));
                let node = redis_link::connect(url, redis_link::config())
                    .await
                    .with_context(|| format!("cannot connect to Redis ({setting})"))?;
                nodes.push(node);
            }
            let redlock = Redlock::new(nodes).context("invalid REDLOCK_URLS")?;
            // `connect` checks every master runs Redis 7.0 or later, naming its version.
            Exclusion::Redlock(
                Locker::connect(redlock, options()?)
                    .await
                    .context("cannot lock on these Redis masters (REDLOCK_URLS)")?,
            )
        }
        LockStrategy::PgLock => {
            // A pool of its own: the leaders' attempts and their watchdogs' renewals must not
            // wait behind the batches for a connection (a late renewal costs the lease).
            let locks = PgPoolOptions::new()
                .max_connections(LOCK_TABLE_CONNECTIONS)
                .acquire_timeout(settings.database_acquire_timeout())
                .connect_lazy_with(pool.connect_options().as_ref().clone());
            let table = PgLockTable::new(locks);
            table
                .install()
                .await
                .context("cannot create the lock table in PostgreSQL")?;
            Exclusion::PgLock(Locker::new(table, options()?).context("invalid lock settings")?)
        }
        LockStrategy::ZooKeeper => {
            let connect = settings.zookeeper_connect.as_str();
            // The connector tries every server in turn for about one session timeout before
            // it gives up.
            let zk = ZkLock::builder(connect)
                .session_timeout(settings.zookeeper_session_timeout())
                .connect()
                .await
                .with_context(|| {
                    format!(
                        "cannot open a ZooKeeper session at {connect} within about {} ms (ZOOKEEPER_CONNECT)",
                        settings.zookeeper_session_timeout_ms
                    )
                })?;
            // The server bounds the session timeout to its own minSessionTimeout ..
            // maxSessionTimeout; a lock's lease may be at most half the session's.
            let granted = zk.session_timeout();
            if zk.max_ttl() < settings.lock_ttl() {
                anyhow::bail!(
                    "ZooKeeper at {connect} granted a session timeout of {} ms, less than twice \
                     LOCK_TTL_MS ({} ms) (ZOOKEEPER_SESSION_TIMEOUT_MS asked for {} ms): a lock \
                     lives only as long as its session, and the ensemble may end a session 0.6 of \
                     its timeout after the holder last proved it alive, so a holder could write \
                     after the ensemble gave its lock away. Lower LOCK_TTL_MS to at most {} ms, \
                     or raise the servers' maxSessionTimeout (zoo.cfg) to at least {} ms",
                    granted.as_millis(),
                    settings.lock_ttl_ms,
                    settings.zookeeper_session_timeout_ms,
                    zk.max_ttl().as_millis(),
                    2 * settings.lock_ttl_ms,
                );
            }
            let locker = Locker::new(zk, options()?).context("invalid lock settings")?;
            probe(&locker, settings).await.with_context(|| {
                format!("ZooKeeper at {connect} does not answer (ZOOKEEPER_CONNECT)")
            })?;
            Exclusion::ZooKeeper(locker)
        }
        LockStrategy::Etcd => {
            let endpoints = settings.etcd_endpoints.join(",");
            let etcd = EtcdLock::connect(&settings.etcd_endpoints)
                .await
                .with_context(|| {
                    format!("cannot connect to etcd at {endpoints} (ETCD_ENDPOINTS)")
                })?;
            let locker = Locker::new(etcd, options()?).context("invalid lock settings")?;
            // The client connects lazily: only a request tells whether etcd is there.
            probe(&locker, settings)
                .await
                .with_context(|| format!("cannot reach etcd at {endpoints} (ETCD_ENDPOINTS)"))?;
            Exclusion::Etcd(locker)
        }
        LockStrategy::PgRow => Exclusion::Transaction(Step::RowLock),
        LockStrategy::PgOptimistic => Exclusion::Transaction(Step::Optimistic),
        LockStrategy::PgAtomic => Exclusion::Transaction(Step::Atomic),
        LockStrategy::None => Exclusion::Transaction(Step::Unsafe),
    })
}

/// One read of the lock service (what it knows of a lock nobody takes), so that start-up
/// fails now, naming the setting, rather than at the first purchase.
async fn probe<B: Backend>(locker: &Locker<B>, settings: &Settings) -> anyhow::Result<()> {
    let key = probe_key(&settings.redis_key_prefix);
    match tokio::time::timeout(CONSENSUS_PROBE_WITHIN, locker.inspect(&key)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => anyhow::bail!("no answer within {CONSENSUS_PROBE_WITHIN:?}"),
    }
}
