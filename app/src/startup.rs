//! Building the service from its settings: pools, migrations, the lock, the HTTP server.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use distlock::{LockOptions, Locker, Redlock};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::MIGRATOR;
use crate::metrics::Metrics;
use crate::routes::admin::AdminToken;
use crate::routes::purchase::MaxQuantity;
use crate::routes::{self, not_found};
use crate::sale::Sale;
use crate::settings::{LockStrategy, Settings};

/// The waiting buyer's backoff between lock attempts: short, since a purchase holds the lock
/// for about one transaction.
const LOCK_RETRY_MIN: Duration = Duration::from_millis(2);
const LOCK_RETRY_MAX: Duration = Duration::from_millis(10);

/// A bound, listening, not yet running service.
pub struct Application {
    server: Server,
    port: u16,
}

impl Application {
    /// Connect to PostgreSQL and Redis, run migrations, bind `BIND_ADDR`.
    ///
    /// # Errors
    /// A message naming what failed: an unreachable PostgreSQL or Redis, a failed migration,
    /// invalid lock settings, an address that cannot be bound.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(settings.database_max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&settings.database_url)
            .await
            .context("cannot connect to PostgreSQL (DATABASE_URL)")?;
        Self::build_with_pool(settings, pool).await
    }

    /// As [`build`](Self::build), on a pool the caller made (tests hand in their own database).
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub async fn build_with_pool(settings: Settings, pool: PgPool) -> anyhow::Result<Self> {
        MIGRATOR
            .run(&pool)
            .await
            .context("cannot run database migrations")?;
        let redis = connect_redis(&settings.redis_url).await?;
        let lock_options = LockOptions::builder()
            .ttl(settings.lock_ttl())
            .wait_timeout(settings.lock_wait())
            .retry_delay(LOCK_RETRY_MIN, LOCK_RETRY_MAX)
            .build()
            .context("invalid LOCK_TTL_MS / LOCK_WAIT_MS")?;
        if settings.lock_strategy == LockStrategy::None {
            tracing::warn!(
                "LOCK_STRATEGY=none: purchases read and write stock WITHOUT ANY LOCK. \
                 Concurrent buyers WILL lose updates and oversell. Use only to demonstrate the race."
            );
        }
        let redlock = match settings.lock_strategy {
            LockStrategy::Redlock => {
                Some(connect_redlock(&settings.redlock_urls, lock_options.clone()).await?)
            }
            _ => None,
        };
        let sale = Sale {
            locker: Locker::new(redis.clone(), lock_options).context("invalid lock settings")?,
            redlock,
            pool,
            redis,
            key_prefix: settings.redis_key_prefix.clone(),
            strategy: settings.lock_strategy,
            work: settings.work(),
            metrics: Metrics::new(),
        };

        let listener = TcpListener::bind(settings.bind_addr)
            .with_context(|| format!("cannot listen on {} (BIND_ADDR)", settings.bind_addr))?;
        let port = listener.local_addr()?.port();
        let sale = web::Data::new(sale);
        let admin = web::Data::new(AdminToken(settings.admin_token.clone()));
        let max_quantity = web::Data::new(MaxQuantity(settings.max_quantity));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(sale.clone())
                .app_data(admin.clone())
                .app_data(max_quantity.clone())
                .configure(routes::configure)
                .default_service(web::to(not_found))
        })
        .listen(listener)?
        .run();
        tracing::info!(
            port,
            strategy = settings.lock_strategy.name(),
            "seckill listening"
        );
        Ok(Self { server, port })
    }

    /// The port actually bound (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serve until the process is asked to stop (SIGINT, SIGTERM).
    ///
    /// # Errors
    /// An I/O error of the server.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

/// One multiplexed, self-reconnecting Redis connection for the whole service.
async fn connect_redis(url: &str) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).context("invalid REDIS_URL")?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    ConnectionManager::new_with_config(client, config)
        .await
        .context("cannot connect to Redis (REDIS_URL)")
}

/// One connection per Redlock master; all must answer at start-up.
async fn connect_redlock(
    urls: &[String],
    lock_options: LockOptions,
) -> anyhow::Result<Locker<Redlock<ConnectionManager>>> {
    anyhow::ensure!(
        !urls.is_empty(),
        "LOCK_STRATEGY=redlock needs REDLOCK_URLS (comma-separated Redis masters)"
    );
    let mut nodes = Vec::new();
    for url in urls {
        nodes.push(
            connect_redis(url)
                .await
                .with_context(|| format!("REDLOCK_URLS: cannot connect to {url}"))?,
        );
    }
    let redlock = Redlock::new(nodes).context("invalid REDLOCK_URLS")?;
    Locker::new(redlock, lock_options).context("invalid Redlock settings")
}
