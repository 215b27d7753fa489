//! `loadtest bench-http`: seckill instances measured with wrk, a load generator nobody here
//! wrote, against the physical limit: how fast PostgreSQL itself sells from one row on this
//! machine (the ceiling, measured with pgbench). Every run is measured in every round, the
//! runs alternating round by round; each figure is the median of its rounds and each ratio
//! the median of the rounds' ratios, so the machine's moods fall on all of them alike.
//!
//! The runs of a round, every request a new buyer and orders counted in PostgreSQL:
//!
//! - The ceiling: pgbench, one client, `loadtest/scripts/ceiling.sql` (one statement takes
//!   64 units from one row and inserts 64 orders), in a database of its own.
//! - (a) `redis`, one instance, one product, 64 connections, with p99 and failed purchases;
//!   (b) the same instance at 1,000 connections.
//! - (c) three instances of `redis`, one product, 1,000 connections in all: three wrk
//!   processes at once, one per instance (334/333/333).
//! - (d) the same three instances, `--products` products at once: each wrk process runs a
//!   thread per product, so that every product has connections of its own (a product that
//!   sells slowly then sells less, and shows).
//! - (e) the instance of (a) and (b), `--products` products at once, 1,000 connections: what
//!   many products cost one instance, against (b). One wrk process of two threads, as (b),
//!   each thread's requests taking its share of the products in turn.
//! - (g) (d) through the router: the compose stack's HAProxy configuration in front of the
//!   three instances, sending each product to one instance; one wrk process of two threads,
//!   as (e), 1,000 connections to the router.
//! - The other strategies on one instance, 64 connections: `pg-atomic`, `pg-row` and
//!   `pg-lock` batched, `redis` and `pg-atomic` with `BATCH_MAX=1` (the per-request
//!   baseline). Batched `redis` is (a).
//! - The sold-out answer against `/healthz`, on the instance of (a).
//!
//! Each deployment (a set of instances) has a throwaway database and Redis key prefix of its
//! own, and the service's defaults but for `BATCH_MAX=1` where a row says so. For every run
//! that sells, the CPU time of the instances, PostgreSQL, Redis, the load generator and the
//! machine is read around it (`cpu`) and shown per order, with what the instances' desks did
//! (`desks`: batches per second and their size, lock holds per 1,000 orders, the mean write).
//!
//! Layout: this module runs the phases ([`run`] cleans up after `measure`, whose phases set
//! up, create the products and run the rounds); `deployment` starts and removes a set of
//! instances; `runs` holds one run of each kind; `ceiling` and `wrk` drive pgbench and wrk;
//! `cpu` reads CPU times and `desks` the instances' batch and lock counters; `header` and
//! `report` write the report.

mod ceiling;
mod cpu;
mod deployment;
mod desks;
mod header;
mod report;
mod runs;
mod wrk;

pub use wrk::buy_script;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use seckill::LockStrategy;
use sqlx::postgres::PgPoolOptions;

use crate::attack::create_product;
use crate::cli::BenchArgs;
use crate::instances::Instance;
use crate::router::{Backend, Router};
use crate::servers;
use ceiling::Ceiling;
use deployment::{Deployment, deploy};
use report::{Kind, Report, Round, Row};
use runs::Bench;

const ADMIN_TOKEN: &str = "bench-admin-token-0123456789";

/// Units of every product sold, as many as the service accepts: no run sells out.
const STOCK: i64 = 1_000_000_000;

/// Connections of (a) and of the other strategies' runs, and of (b), (c) and (d) in all.
const FEW: u32 = 64;
const MANY: u32 = 1_000;

/// Instances of (c) and (d).
const THREE: usize = 3;

/// What the run keeps to remove whatever ends it: success, an error, or Ctrl-C.
#[derive(Default)]
struct Started {
    deployments: Vec<Deployment>,
    ceiling: Option<Ceiling>,
    /// In front of the three instances of (c), (d) and (g); stopped when dropped.
    router: Option<Router>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is not installed: install it (Debian: apt-get install wrk)");
    }
    ceiling::check_installed()?;
    crate::router::haproxy()?;
    raise_open_files_limit();
    let postgres = servers::postgres(args.database_url.as_deref()).await?;
    let redis = servers::redis(args.redis_url.as_deref()).await?;
    let dir = std::env::temp_dir().join(format!("seckill-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut started = Started::default();
    let outcome = tokio::select! {
        outcome = measure(&args, &postgres.url, &redis.url, &dir, &mut started) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("stopped by Ctrl-C")),
    };
    drop(started.router.take());
    for deployment in started.deployments {
        if let Err(error) = deployment.remove(&redis.url).await {
            eprintln!("cleanup: {error:#}");
        }
    }
    if let Some(ceiling) = started.ceiling
        && let Err(error) = ceiling.remove().await
    {
        eprintln!("cleanup: {error:#}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// The bench, in phases: write wrk's scripts, open the head of the report, start every
/// deployment and create its products, run the rounds, close the head, print the report.
async fn measure(
    args: &BenchArgs,
    postgres_url: &str,
    redis_url: &str,
    dir: &Path,
    started: &mut Started,
) -> anyhow::Result<()> {
    let scripts = Scripts::write(dir)?;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(postgres_url)
        .await
        .context("cannot connect to PostgreSQL")?;
    let bench = Bench {
        args,
        buy: scripts.buy.clone(),
        postmaster: cpu::postmaster(&admin).await,
        redis: cpu::local_redis(servers::redis_pid(redis_url)),
    };
    let mut header = header::opening(&admin, &bench).await;

    println!("setting up: the ceiling's database, and the instances of every configuration");
    set_up(postgres_url, redis_url, dir, started).await?;
    let stage = Stage::of(started)?;
    let products = Products::create(args, &stage).await?;

    let mut rows = rows(args, stage.others);
    let mut health = Vec::new();
    let mut connections = 0;
    for round in 1..=args.rounds {
        println!("--- round {round} of {} ---", args.rounds);
        let measured = measure_round(&bench, &stage, &products).await?;
        for (row, figures) in rows.iter_mut().zip(measured) {
            println!(
                "round {round}: {}: {}",
                row.label,
                runs::summary(row, &figures)
            );
            row.rounds.push(figures);
        }
        health.push(sold_out_against_health(&bench, round, &stage, &products, &scripts).await?);
        connections = connections.max(header::client_connections(&admin).await.unwrap_or(0));
    }
    header.extend(header::closing(&admin, connections, args.products).await);
    admin.close().await;
    let report = Report {
        header,
        rounds: args.rounds,
        seconds: args.seconds,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        products: args.products as usize,
        rows,
        health,
    };
    print!("{}", report.render());
    Ok(())
}

/// wrk's scripts, written where wrk can read them.
struct Scripts {
    /// A purchase by a new buyer each request.
    buy: PathBuf,
    /// The same purchase every request (the sold-out one).
    fixed: PathBuf,
    get: PathBuf,
}

impl Scripts {
    fn write(dir: &Path) -> anyhow::Result<Self> {
        let scripts = Self {
            buy: dir.join("buy.lua"),
            fixed: dir.join("fixed.lua"),
            get: dir.join("get.lua"),
        };
        std::fs::write(&scripts.buy, wrk::buy_script(crate::buyers::secret()))?;
        std::fs::write(&scripts.fixed, wrk::fixed_script(&crate::buyers::token(3)))?;
        std::fs::write(&scripts.get, wrk::GET_SCRIPT)?;
        Ok(scripts)
    }
}

/// Create the ceiling's database and start every deployment, each kept in `started` as
/// soon as it exists (so that it is removed whatever happens next).
async fn set_up(
    postgres_url: &str,
    redis_url: &str,
    dir: &Path,
    started: &mut Started,
) -> anyhow::Result<()> {
    let id = std::process::id();
    let ceiling = Ceiling::create(postgres_url, format!("seckill_bench_{id}_ceiling"), dir).await?;
    started.ceiling = Some(ceiling);
    // (f)'s one instance takes the body's `user_id` without a token: what (b) costs with the
    // buyer's identity checked is read against it.
    let identity_off: &[(&str, &str)] = &[("BUYER_IDENTITY", "off")];
    let deployments = [
        ("one", LockStrategy::Redis, None, 1, &[][..]),
        ("three", LockStrategy::Redis, None, THREE, &[][..]),
        ("open", LockStrategy::Redis, None, 1, identity_off),
        ("pg_atomic_1", LockStrategy::PgAtomic, Some(1), 1, &[][..]),
        ("redis_1", LockStrategy::Redis, Some(1), 1, &[][..]),
        ("pg_atomic", LockStrategy::PgAtomic, None, 1, &[][..]),
        ("pg_row", LockStrategy::PgRow, None, 1, &[][..]),
        ("pg_lock", LockStrategy::PgLock, None, 1, &[][..]),
    ];
    for (name, strategy, batch, count, more) in deployments {
        let name = format!("seckill_bench_{id}_{name}");
        let deployment = deploy(postgres_url, redis_url, name, strategy, batch, count, more);
        started.deployments.push(deployment.await?);
    }
    // (g): the router in front of the three instances, without its log line per request.
    let three = started.deployments.get(1).context("the three instances")?;
    let backends = three
        .instances
        .iter()
        .map(Backend::of)
        .collect::<anyhow::Result<Vec<_>>>()?;
    started.router = Some(Router::start(&backends, true).await?);
    Ok(())
}

/// What a round runs on: the ceiling, the one instance of (a) and (b), the three of (c)
/// and (d), the one instance of (f) with identity off, and one instance of each other
/// strategy.
struct Stage<'a> {
    ceiling: &'a Ceiling,
    one: &'a Deployment,
    three: &'a Deployment,
    router: &'a Router,
    open: &'a Deployment,
    others: &'a [Deployment],
}

impl<'a> Stage<'a> {
    fn of(started: &'a Started) -> anyhow::Result<Self> {
        let [one, three, open, others @ ..] = started.deployments.as_slice() else {
            bail!("bench-http starts eight sets of instances, and has fewer");
        };
        let Some(ceiling) = &started.ceiling else {
            bail!("bench-http creates the ceiling's database first, and has none");
        };
        let Some(router) = &started.router else {
            bail!("bench-http starts the router with the instances, and has none");
        };
        Ok(Self {
            ceiling,
            one,
            three,
            router,
            open,
            others,
        })
    }
}

/// The products: one for (a) and (b), one for (c), `--products` for (d) and as many for (e),
/// one for each other strategy, and a sold-out one beside (a)'s.
struct Products {
    single: i64,
    shared: i64,
    many: Vec<i64>,
    many_on_one: Vec<i64>,
    /// (f)'s, on the instance with identity off.
    open: i64,
    alone: Vec<i64>,
    gone: i64,
}

impl Products {
    async fn create(args: &BenchArgs, stage: &Stage<'_>) -> anyhow::Result<Self> {
        // Products are made on the operators' listeners; buyers reach the public ones.
        let (one, three) = (
            &stage.one.instances[0].ops_url,
            &stage.three.instances[0].ops_url,
        );
        let single = create_product(one, ADMIN_TOKEN, STOCK).await?;
        let shared = create_product(three, ADMIN_TOKEN, STOCK).await?;
        let mut many = Vec::new();
        let mut many_on_one = Vec::new();
        for _ in 0..args.products {
            many.push(create_product(three, ADMIN_TOKEN, STOCK).await?);
            many_on_one.push(create_product(one, ADMIN_TOKEN, STOCK).await?);
        }
        let open = create_product(&stage.open.instances[0].ops_url, ADMIN_TOKEN, STOCK).await?;
        let mut alone = Vec::new();
        for other in stage.others {
            alone.push(create_product(&other.instances[0].ops_url, ADMIN_TOKEN, STOCK).await?);
        }
        let gone = sold_out_product(&stage.one.instances[0]).await?;
        Ok(Self {
            single,
            shared,
            many,
            many_on_one,
            open,
            alone,
            gone,
        })
    }
}

/// The report's rows, in the order a round measures them.
fn rows(args: &BenchArgs, others: &[Deployment]) -> Vec<Row> {
    let mut rows = vec![
        row(
            Kind::Ceiling,
            format!(
                "ceiling: PostgreSQL alone (pgbench, 1 client, {} orders per commit)",
                ceiling::ORDERS_PER_COMMIT
            ),
            false,
        ),
        row(
            Kind::OneAt64,
            format!("(a) redis, 1 instance, 1 product, {FEW} connections"),
            true,
        ),
        row(
            Kind::OneAt1000,
            format!("(b) redis, 1 instance, 1 product, {MANY} connections"),
            true,
        ),
        row(
            Kind::ThreeAt1000,
            format!("(c) redis, {THREE} instances, 1 product, {MANY} connections in all"),
            true,
        ),
        row(
            Kind::ThreeManyProducts,
            format!(
                "(d) redis, {THREE} instances, {} products, {MANY} connections in all",
                args.products
            ),
            true,
        ),
        row(
            Kind::OneManyProducts,
            format!(
                "(e) redis, 1 instance, {} products, {MANY} connections",
                args.products
            ),
            true,
        ),
        row(
            Kind::OneIdentityOff,
            "(f) as (b), with BUYER_IDENTITY=off (no token checked)".to_owned(),
            true,
        ),
        row(
            Kind::ThreeRouted,
            format!(
                "(g) as (d), through the router (HAProxy, one instance per product), {MANY} connections",
            ),
            true,
        ),
    ];
    for other in others {
        let batch = other
            .batch
            .map_or_else(|| "batched".to_owned(), |b| format!("BATCH_MAX={b}"));
        rows.push(row(
            Kind::Strategy {
                strategy: other.strategy,
                batch: other.batch,
            },
            format!(
                "{}, {batch}, 1 instance, 1 product, {FEW} connections",
                other.strategy.name()
            ),
            true,
        ));
    }
    rows
}

/// One round's figures, a run per row, in the rows' order.
async fn measure_round(
    bench: &Bench<'_>,
    stage: &Stage<'_>,
    products: &Products,
) -> anyhow::Result<Vec<Round>> {
    let split = runs::split(MANY, THREE);
    let (one, three) = (stage.one, stage.three);
    let mut measured = vec![bench.ceiling(stage.ceiling).await?];
    measured.push(bench.sell(one, &[FEW], &[products.single]).await?);
    measured.push(bench.sell(one, &[MANY], &[products.single]).await?);
    measured.push(bench.sell(three, &split, &[products.shared]).await?);
    measured.push(bench.sell(three, &split, &products.many).await?);
    measured.push(bench.sell(one, &[MANY], &products.many_on_one).await?);
    measured.push(bench.sell(stage.open, &[MANY], &[products.open]).await?);
    let through = [(stage.router.url.as_str(), MANY)];
    measured.push(bench.sell_through(three, &through, &products.many).await?);
    for (other, product) in stage.others.iter().zip(&products.alone) {
        measured.push(bench.sell(other, &[FEW], &[*product]).await?);
    }
    Ok(measured)
}

/// Requests/s of `/healthz` and of the sold-out answer, on the instance of (a).
async fn sold_out_against_health(
    bench: &Bench<'_>,
    round: u64,
    stage: &Stage<'_>,
    products: &Products,
    scripts: &Scripts,
) -> anyhow::Result<(f64, f64)> {
    let url = &stage.one.instances[0].url;
    let path = format!("/api/products/{}/purchase", products.gone);
    let h = bench.requests(url, "/healthz", &scripts.get).await?;
    let so = bench.requests(url, &path, &scripts.fixed).await?;
    println!(
        "round {round}: /healthz {h:.0}, sold-out {so:.0} requests/s ({:.3}x)",
        so / h
    );
    Ok((h, so))
}

fn row(kind: Kind, label: String, has_instances: bool) -> Row {
    Row {
        kind,
        label,
        has_instances,
        rounds: Vec::new(),
    }
}

/// A product of one unit, sold, then refused once so that the instance answers from its
/// sold-out lane.
async fn sold_out_product(instance: &Instance) -> anyhow::Result<i64> {
    let gone = create_product(&instance.ops_url, ADMIN_TOKEN, 1).await?;
    let url = &instance.url;
    let client = reqwest::Client::new();
    for user in 1..=2 {
        client
            .post(format!("{url}/api/products/{gone}/purchase"))
            .bearer_auth(crate::buyers::token(user))
            .json(&serde_json::json!({"user_id": user}))
            .send()
            .await?;
    }
    Ok(gone)
}

/// 1,000 connections need more open files than the usual soft limit of 1,024; the
/// instances, started after this, inherit the raised limit.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
