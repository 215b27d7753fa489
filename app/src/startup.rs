//! Building the service from its settings: pools, migrations, the lock, the HTTP server.

use std::net::{SocketAddr, TcpListener};
use std::str::FromStr;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::http::KeepAlive;
use actix_web::http::header;
use actix_web::middleware::DefaultHeaders;
use actix_web::{App, HttpServer, web};
use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::identity::Identity;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::redis_link::{RedisLink, RedisSource};
use crate::repository::{self, SessionBounds};
use crate::routes::access_log::AccessLog;
use crate::routes::admin::AdminTokens;
use crate::routes::body::BodyDeadline;
use crate::routes::buyer::Gate;
use crate::routes::health::Health;
use crate::routes::sold_out::SoldOutLane;
use crate::routes::{self, Side, not_found};
use crate::sale::fenced::probe_key;
use crate::sale::{Exclusion, Sale, SaleParts};
use crate::settings::{DatabaseSettings, HttpSettings, LockStrategy, Settings};

/// A bound, listening, not yet running service: the public listener and the operators'.
pub struct Application {
    server: Server,
    address: SocketAddr,
    operations: Server,
    operations_address: SocketAddr,
}

impl Application {
    /// Connect to PostgreSQL (and Redis, when the strategy sells with it), have the schema
    /// made unless it is current (`schema.rs`), bind `BIND_ADDR` and `OPS_BIND_ADDR`.
    ///
    /// # Errors
    /// A message naming what failed: an invalid setting, an unreachable PostgreSQL or Redis,
    /// a failed migration, an address that cannot be bound.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.check().map_err(anyhow::Error::msg)?;
        choose_tls_cryptography();
        let options = PgConnectOptions::from_str(settings.database.url())
            .context("invalid DATABASE_URL")?
            .options(session_bounds(&settings.database));
        let pool = pool_options(&settings.database)
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
        choose_tls_cryptography();
        crate::schema::prepare(&pool, &settings).await?;
        bound_sessions(&pool, &settings.database).await;
        let (source, redis) = connect_redis(&settings).await?;
        let exclusion = Exclusion::connect(&settings, &pool, &redis, &source).await?;
        let deployment = repository::deployment_id(&pool)
            .await
            .context("cannot read the deployment id from PostgreSQL")?;
        let health = Health::new(
            pool.connect_options().as_ref().clone(),
            redis.clone(),
            probe_key(&settings.redis.key_prefix),
        );
        let sale = open_sale(&settings, pool, redis, source, exclusion, deployment);
        let listener = bind(settings.http.bind_addr, "BIND_ADDR")?;
        let operations_listener = bind(settings.http.ops_bind_addr, "OPS_BIND_ADDR")?;
        let (address, operations_address) =
            (listener.local_addr()?, operations_listener.local_addr()?);
        let shared = Shared {
            sale: web::Data::new(sale),
            health: web::Data::new(health),
            admin: web::Data::new(
                AdminTokens::from_settings(&settings.http).map_err(anyhow::Error::msg)?,
            ),
            gate: web::Data::new(open_gate(&settings)?),
            body_deadline: BodyDeadline(settings.http.request_timeout),
        };
        let server = serve(listener, Side::Public, &settings.http, shared.clone())?;
        let operations = serve(
            operations_listener,
            Side::Operations,
            &settings.http,
            shared,
        )?;
        tracing::info!(%address, %operations_address, strategy = settings.lock.strategy.name(), "seckill listening");
        Ok(Self {
            server,
            address,
            operations,
            operations_address,
        })
    }

    /// The port actually bound (useful with port 0).
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The public address actually bound.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The operators' address actually bound.
    pub fn operations_address(&self) -> SocketAddr {
        self.operations_address
    }

    /// Serve until the process is asked to stop (SIGINT, SIGTERM): both listeners stop.
    ///
    /// # Errors
    /// An I/O error of either server.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let (public, operations) = (self.server.handle(), self.operations.handle());
        // Either server ending ends the other: a service half up is worse than one down.
        tokio::select! {
            ended = self.server => { operations.stop(true).await; ended }
            ended = self.operations => { public.stop(true).await; ended }
        }
    }
}

/// Redis, where it is: connected now when the strategy sells with it, in the background
/// otherwise. Warns about `LOCK_STRATEGY=none` on the way.
async fn connect_redis(settings: &Settings) -> anyhow::Result<(RedisSource, RedisLink)> {
    let strategy = settings.lock.strategy;
    let source = settings.redis.source();
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
    Ok((source, redis))
}

/// Who may buy, and how often. Warns loudly when buyers are not identified.
fn open_gate(settings: &Settings) -> anyhow::Result<Gate> {
    let identity = Identity::from_settings(&settings.identity)?;
    if let Identity::Off = identity {
        tracing::warn!(
            "BUYER_IDENTITY=off: purchases are made for whatever user_id the body names, and \
             anyone can read anyone's orders. Use only to benchmark the sale without identity."
        );
    }
    Ok(Gate {
        identity,
        limits: Limits::new(&settings.limits),
    })
}

/// Connections for admin writes: a few at once is all an operator needs, and all the sale
/// can spare.
const ADMIN_CONNECTIONS: u32 = 2;

/// Connections for reading products an instance does not know yet: one read per product at
/// a time, so a few serve a sale's opening of many products.
const LOOKUP_CONNECTIONS: u32 = 2;

/// Connections for looking up the orders of purchases whose commit answer was lost (a
/// connection cut, a database failing over): each look-up is one short transaction, and a
/// batch's buyers take turns.
const ANSWER_CONNECTIONS: u32 = 2;

/// How long a connection of the occasional pools (admin writes, first look-ups, restock
/// reads) stays open unused: they serve moments (an operator's write, a sale's opening, a
/// restock), and five connections per instance held between them would crowd PostgreSQL's
/// `max_connections` (the bench's nine instances went past 100). The next moment opens
/// them again, one connection's set-up each.
const OCCASIONAL_IDLE: Duration = Duration::from_secs(10);

/// The sale, with its pools beside `pool`: the public reads', the admin writes', the first
/// look-ups', the restock reads' and the lock holders'. Called after [`bound_sessions`], so their connections carry the session bounds too.
fn open_sale(
    settings: &Settings,
    pool: PgPool,
    redis: RedisLink,
    redis_source: RedisSource,
    exclusion: Exclusion,
    deployment: String,
) -> Sale {
    let (database, sale) = (&settings.database, &settings.sale);
    let reads_pool = PgPoolOptions::new()
        .max_connections(database.read_connections)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    // Admin writes wait for one of these (no longer than DATABASE_ACQUIRE_TIMEOUT_MS, then
    // 503 busy), and each of their statements is bounded like every session's.
    let admin_pool = PgPoolOptions::new()
        .max_connections(ADMIN_CONNECTIONS)
        .idle_timeout(OCCASIONAL_IDLE)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let lookups_pool = PgPoolOptions::new()
        .max_connections(LOOKUP_CONNECTIONS)
        .idle_timeout(OCCASIONAL_IDLE)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let restock_reads_pool = PgPoolOptions::new()
        .max_connections(1)
        .idle_timeout(OCCASIONAL_IDLE)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let answers_pool = PgPoolOptions::new()
        .max_connections(ANSWER_CONNECTIONS)
        .idle_timeout(OCCASIONAL_IDLE)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let holders_pool = PgPoolOptions::new()
        .max_connections(database.max_connections)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
        .connect_lazy_with(holder_sessions(&pool));
    Sale::new(SaleParts {
        pool,
        reads_pool,
        admin_pool,
        lookups_pool,
        restock_reads_pool,
        holders_pool,
        answers_pool,
        strategy: settings.lock.strategy,
        exclusion,
        metrics: Metrics::new(),
        redis_source,
        redis,
        key_prefix: settings.redis.key_prefix.clone(),
        deployment,
        batch_max: sale.batch_max as usize,
        queue_max: sale.queue_max as usize,
        hold: settings.hold(),
        work: sale.work,
        wait: settings.lock.wait,
        sold_out_recheck: sale.sold_out_recheck,
        max_quantity: sale.max_quantity,
        batch_timeout: batch_timeout(database, sale.work),
        bounds: SessionBounds {
            statement_timeout_ms: millis(database.statement_timeout),
            lock_timeout_ms: millis(database.lock_timeout),
            idle_in_transaction_timeout_ms: millis(database.idle_in_transaction_timeout),
        },
    })
}

/// A setting's milliseconds, as PostgreSQL takes them (every setting is at most an hour).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `address`, bound now so that start-up fails at once, naming `setting`, when it is taken.
fn bind(address: SocketAddr, setting: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).with_context(|| format!("cannot listen on {address} ({setting})"))
}

/// Most connections open at once on the operators' listener.
pub const OPERATIONS_MAX_CONNECTIONS: usize = 64;

/// What both listeners' apps share.
#[derive(Clone)]
struct Shared {
    sale: web::Data<Sale>,
    health: web::Data<Health>,
    admin: web::Data<AdminTokens>,
    gate: web::Data<Gate>,
    body_deadline: BodyDeadline,
}

/// The HTTP server of `side` on `listener`, not yet running.
fn serve(
    listener: TcpListener,
    side: Side,
    http: &HttpSettings,
    shared: Shared,
) -> anyhow::Result<Server> {
    // actix counts connections per worker thread; one worker per core for the buyers, as
    // actix starts, and one for the operators.
    // The operators' side is a handful of tools and a scraper: a small fixed cap, beside
    // (not within) HTTP_MAX_CONNECTIONS.
    let (workers, per_worker) = match side {
        Side::Public => {
            let workers = std::thread::available_parallelism().map_or(1, usize::from);
            let connections = usize::try_from(http.max_connections).unwrap_or(usize::MAX);
            (workers, connections.div_ceil(workers))
        }
        Side::Operations => (1, OPERATIONS_MAX_CONNECTIONS),
    };
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(shared.sale.clone())
            .app_data(shared.health.clone())
            .app_data(shared.admin.clone())
            .app_data(shared.gate.clone())
            .app_data(shared.body_deadline)
            .app_data(side)
            .configure(routes::configure(side))
            .default_service(web::to(not_found))
            // The flood after a sale is answered before the router sees it.
            .wrap(SoldOutLane)
            // Every answer has its request id, and its line in the access log.
            .wrap(AccessLog)
            // Every answer is live state or a buyer's order: no cache keeps it, and no
            // browser guesses another type than the one it says.
            .wrap(
                DefaultHeaders::new()
                    .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
                    .add((header::CACHE_CONTROL, "no-store")),
            )
    })
    .workers(workers)
    .max_connections(per_worker)
    // A connection's first request head must arrive within the timeout of its accept (408 and
    // closed otherwise; later heads are bounded by the keep-alive timer only); a body has the
    // same deadline, kept by the `Body` extractor.
    .client_request_timeout(http.request_timeout)
    .keep_alive(KeepAlive::Timeout(http.keep_alive))
    // A buyer who disconnects while queued (EOF on the socket) has their request dropped,
    // so the desk skips them instead of selling to nobody.
    .h1_allow_half_closed(false)
    .listen(listener)?
    .run())
}

/// The session bounds as connection options: every session the service uses has them (see
/// [`bound_sessions`]). With them, custom plans for every statement: see
/// [`crate::repository::begin`] for why a cached generic plan is a trap on a table that grows
/// during the sale (the order lookup, and the lock table under `pg-lock`, run outside
/// `begin`). The lock holders' sessions keep generic plans instead, made safe another way
/// ([`holder_sessions`]).
fn session_bounds(database: &DatabaseSettings) -> [(&'static str, String); 4] {
    let ms = |value: Duration| format!("{}ms", value.as_millis());
    [
        ("statement_timeout", ms(database.statement_timeout)),
        ("lock_timeout", ms(database.lock_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(database.idle_in_transaction_timeout),
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
async fn bound_sessions(pool: &PgPool, database: &DatabaseSettings) {
    const HANDED_BACK: Duration = Duration::from_secs(1);
    let bounded = PgConnectOptions::new_without_pgpass().options(session_bounds(database));
    let options = pool.connect_options().as_ref().clone();
    if let Some(bounds) = bounded.get_options()
        && options.get_options().is_some_and(|o| o.ends_with(bounds))
    {
        return;
    }
    pool.set_connect_options(options.options(session_bounds(database)));
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
/// The lock holders' writer bounds each of its statements by the same (with, when one is
/// refused, the writes of its batches one by one): past it, every batch in it is answered
/// `outcome_unknown`.
fn batch_timeout(database: &DatabaseSettings, work: Duration) -> Duration {
    database.acquire_timeout + database.statement_timeout * 4 + work
}

/// The cryptography of every TLS link (PostgreSQL, Redis, etcd): rustls with *ring*, chosen
/// once for the process. sqlx and etcd's client name *ring* themselves; redis-rs asks
/// rustls for the process's choice, which rustls cannot make by itself when a crate built
/// alongside turns its other provider on (as the load tester's HTTP client does). Called by
/// [`Application::build`]; a program that opens Redis links of its own before that (the
/// load tester) calls it first.
pub fn choose_tls_cryptography() {
    // Already chosen (a second build in one process, a test): nothing to do.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// No ping before a pooled connection is handed out (sqlx pings by default): it would be one
/// more round trip on every batch. A connection that died while idle fails its batch
/// instead, and is dropped from the pool: its buyers are answered as for any lost
/// connection (503 `database_unavailable`, or `outcome_unknown` where the write may have been
/// sent: they look their order up, then retry).
fn pool_options(database: &DatabaseSettings) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(database.max_connections)
        .acquire_timeout(database.acquire_timeout)
        .test_before_acquire(false)
}
