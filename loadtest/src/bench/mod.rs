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
//! - The other strategies on one instance, 64 connections: `pg-atomic`, `pg-row` and
//!   `pg-lock` batched, `redis` and `pg-atomic` with `BATCH_MAX=1` (the per-request
//!   baseline). Batched `redis` is (a).
//! - The sold-out answer against `/healthz`, on the instance of (a).
//!
//! Each deployment (a set of instances) has a throwaway database and Redis key prefix of its
//! own, and the service's defaults but for `BATCH_MAX=1` where a row says so. For every run
//! that sells, the CPU time of the instances, PostgreSQL, Redis, the load generator and the
//! machine is read around it ([`cpu`]) and shown per order.

mod ceiling;
mod cpu;
mod report;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use seckill::LockStrategy;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::attack::create_product;
use crate::cli::BenchArgs;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, ThrowawayDatabase};
use ceiling::Ceiling;
use report::{Kind, Report, Round, Row};

const ADMIN_TOKEN: &str = "bench-admin-token-0123456789";

/// Units of every product sold, as many as the service accepts: no run sells out.
const STOCK: i64 = 1_000_000_000;

/// Connections of (a) and of the other strategies' runs, and of (b), (c) and (d) in all.
const FEW: u32 = 64;
const MANY: u32 = 1_000;

/// Instances of (c) and (d).
const THREE: usize = 3;

/// A set of instances of one configuration, sharing a database and a Redis key prefix.
struct Deployment {
    strategy: LockStrategy,
    /// `BATCH_MAX`, where a run sets it; `None`: the service's default.
    batch: Option<u32>,
    instances: Vec<Instance>,
    /// Counts the orders (one connection: the bench's own reads stay few).
    pool: PgPool,
    database: ThrowawayDatabase,
    prefix: String,
}

/// What the run keeps to remove whatever ends it: success, an error, or Ctrl-C.
#[derive(Default)]
struct Started {
    deployments: Vec<Deployment>,
    ceiling: Option<Ceiling>,
}

/// Where a round's runs go, and what they are charged to.
struct Bench<'a> {
    args: &'a BenchArgs,
    buy: PathBuf,
    /// PostgreSQL's postmaster and Redis, if they run on this machine (for their CPU time).
    postmaster: Option<u32>,
    redis: Option<u32>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is not installed: install it (Debian: apt-get install wrk)");
    }
    ceiling::check_installed()?;
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

async fn measure(
    args: &BenchArgs,
    postgres_url: &str,
    redis_url: &str,
    dir: &Path,
    started: &mut Started,
) -> anyhow::Result<()> {
    let buy = dir.join("buy.lua");
    let fixed = dir.join("fixed.lua");
    let get = dir.join("get.lua");
    std::fs::write(&buy, wrk::BUY_SCRIPT)?;
    std::fs::write(&fixed, wrk::FIXED_SCRIPT)?;
    std::fs::write(&get, wrk::GET_SCRIPT)?;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(postgres_url)
        .await
        .context("cannot connect to PostgreSQL")?;
    let mut header = vec![
        format!(
            "date: {}; machine: {}; command: {}",
            chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
            crate::demo::machine(),
            crate::demo::command_line(&std::env::args().skip(1).collect::<Vec<_>>())
        ),
        server_settings(&admin).await,
    ];
    let bench = Bench {
        args,
        buy,
        postmaster: cpu::postmaster(&admin).await,
        redis: cpu::local_redis(servers::redis_pid(redis_url)),
    };
    if bench.postmaster.is_none() {
        header.push("PostgreSQL is not a process of this machine: its CPU is n/a".to_owned());
    }
    if bench.redis.is_none() {
        header.push("Redis is not a process of this machine: its CPU is n/a".to_owned());
    }

    let id = std::process::id();
    println!("setting up: the ceiling's database, and the instances of every configuration");
    let ceiling = Ceiling::create(postgres_url, format!("seckill_bench_{id}_ceiling"), dir).await?;
    let ceiling = &*started.ceiling.insert(ceiling);
    let deployments = [
        ("one", LockStrategy::Redis, None, 1),
        ("three", LockStrategy::Redis, None, THREE),
        ("pg_atomic_1", LockStrategy::PgAtomic, Some(1), 1),
        ("redis_1", LockStrategy::Redis, Some(1), 1),
        ("pg_atomic", LockStrategy::PgAtomic, None, 1),
        ("pg_row", LockStrategy::PgRow, None, 1),
        ("pg_lock", LockStrategy::PgLock, None, 1),
    ];
    for (name, strategy, batch, count) in deployments {
        let name = format!("seckill_bench_{id}_{name}");
        started
            .deployments
            .push(deploy(postgres_url, redis_url, name, strategy, batch, count).await?);
    }
    let [one, three, others @ ..] = started.deployments.as_slice() else {
        bail!("bench-http starts seven sets of instances, and has fewer");
    };
    // The products: one for (a) and (b), one for (c), `--products` for (d), one for each
    // other strategy, and a sold-out one beside (a)'s.
    let single = create_product(&one.instances[0].url, ADMIN_TOKEN, STOCK).await?;
    let shared = create_product(&three.instances[0].url, ADMIN_TOKEN, STOCK).await?;
    let mut many = Vec::new();
    for _ in 0..args.products {
        many.push(create_product(&three.instances[0].url, ADMIN_TOKEN, STOCK).await?);
    }
    let mut alone = Vec::new();
    for other in others {
        alone.push(create_product(&other.instances[0].url, ADMIN_TOKEN, STOCK).await?);
    }
    let gone = sold_out_product(&one.instances[0].url).await?;

    let split = split(MANY, THREE);
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
    let mut health = Vec::new();
    let mut connections = 0;
    for round in 1..=args.rounds {
        println!("--- round {round} of {} ---", args.rounds);
        let mut measured = vec![bench.ceiling(ceiling).await?];
        measured.push(bench.sell(one, &[FEW], &[single]).await?);
        measured.push(bench.sell(one, &[MANY], &[single]).await?);
        measured.push(bench.sell(three, &split, &[shared]).await?);
        measured.push(bench.sell(three, &split, &many).await?);
        for (other, product) in others.iter().zip(&alone) {
            measured.push(bench.sell(other, &[FEW], &[*product]).await?);
        }
        for (row, figures) in rows.iter_mut().zip(measured) {
            println!("round {round}: {}: {}", row.label, summary(row, &figures));
            row.rounds.push(figures);
        }
        let url = &one.instances[0].url;
        let path = format!("/api/products/{gone}/purchase");
        let h = bench.requests(url, "/healthz", &get).await?;
        let so = bench.requests(url, &path, &fixed).await?;
        println!(
            "round {round}: /healthz {h:.0}, sold-out {so:.0} requests/s ({:.3}x)",
            so / h
        );
        health.push((h, so));
        connections = connections.max(client_connections(&admin).await.unwrap_or(0));
    }
    let max_connections: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&admin)
        .await
        .unwrap_or_else(|_| "?".to_owned());
    header.push(format!(
        "PostgreSQL client connections open after a round, at most: {connections} of max_connections {max_connections} (every instance's pools, this tool's, and anyone else's)"
    ));
    // A refused connection fails purchases (503): the figures would measure that instead.
    if max_connections
        .parse::<i64>()
        .is_ok_and(|max| connections * 10 >= max * 9)
    {
        header.push(
            "WARNING: close to max_connections; purchases refused a connection count as failed: raise max_connections, or run on a server nobody else uses".to_owned(),
        );
    }
    header.push(format!(
        "(c) and (d): one wrk process per instance; (c): one thread each; (d): a thread per product (up to its connections), each of the {} products with connections of its own; otherwise one wrk process, two threads",
        args.products
    ));
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

fn row(kind: Kind, label: String, has_instances: bool) -> Row {
    Row {
        kind,
        label,
        has_instances,
        rounds: Vec::new(),
    }
}

/// One line of a round's figures, as it goes.
fn summary(row: &Row, round: &Round) -> String {
    let mut line = format!("{:.0} orders/s", round.orders_per_sec);
    if let Some(p99) = round.p99_ms {
        line.push_str(&format!(", p99 {p99:.1} ms"));
    }
    if let Some(failed) = round.failed_share {
        line.push_str(&format!(", {:.2} % failed", failed * 100.0));
    }
    let per_order = |seconds: Option<f64>| {
        seconds.filter(|_| round.orders > 0.0).map_or_else(
            || "n/a".to_owned(),
            |s| format!("{:.1}", s * 1e6 / round.orders),
        )
    };
    let instances = if row.has_instances {
        per_order(round.cpu.instances)
    } else {
        "-".to_owned()
    };
    line.push_str(&format!(
        "; CPU µs/order: seckill {instances}, PostgreSQL {}, Redis {}, load generator {}, other {}, machine {}",
        per_order(round.cpu.postgres),
        per_order(round.cpu.redis),
        per_order(round.cpu.load),
        per_order(round.cpu.other()),
        per_order(round.cpu.machine),
    ));
    line
}

/// `total` connections over `parts` wrk processes, the first ones taking the remainder
/// (1,000 over three: 334, 333, 333).
fn split(total: u32, parts: usize) -> Vec<u32> {
    let parts = parts as u32;
    (0..parts)
        .map(|i| total / parts + u32::from(i < total % parts))
        .collect()
}

impl Bench<'_> {
    fn watch(&self, instances: &[Instance]) -> cpu::Watch {
        cpu::Watch {
            instances: instances.iter().map(Instance::pid).collect(),
            postmaster: self.postmaster,
            redis: self.redis,
        }
    }

    async fn ceiling(&self, ceiling: &Ceiling) -> anyhow::Result<Round> {
        let watch = self.watch(&[]);
        let before = watch.sample();
        let started = Instant::now();
        let run = ceiling.run(self.args.seconds).await?;
        let wall_seconds = started.elapsed().as_secs_f64();
        let after = watch.sample();
        let orders_per_sec = run.tps * ceiling::ORDERS_PER_COMMIT as f64;
        Ok(Round {
            orders_per_sec,
            per_product: vec![orders_per_sec],
            p99_ms: None,
            failed_share: None,
            orders: run.orders as f64,
            cpu: cpu::spent(&before, &after),
            wall_seconds,
        })
    }

    /// Sell `products` through the first `connections.len()` instances of `deployment`,
    /// one wrk process each with its share of the connections, all at once.
    async fn sell(
        &self,
        deployment: &Deployment,
        connections: &[u32],
        products: &[i64],
    ) -> anyhow::Result<Round> {
        let seconds = self.args.seconds;
        let paths: Vec<String> = products
            .iter()
            .map(|p| format!("/api/products/{p}/purchase"))
            .collect();
        // One product: the URL's path is enough.
        let extra: &[String] = if paths.len() > 1 { &paths } else { &[] };
        // Several products: a thread per product (up to a process's connections), so that
        // each product has connections of its own (see `wrk::BUY_SCRIPT`). One product: three
        // processes of one thread each run about as many threads as one of two.
        let threads = match (paths.len(), connections.len()) {
            (1, 1) => 2,
            (1, _) => 1,
            (products, _) => {
                let fewest = connections.iter().copied().min().unwrap_or(1);
                u32::try_from(products).unwrap_or(u32::MAX).min(fewest)
            }
        };
        let mut before = Vec::new();
        for product in products {
            before.push(sold(&deployment.pool, *product).await?);
        }
        let watch = self.watch(&deployment.instances);
        let at_start = watch.sample();
        let started = Instant::now();
        let loads = deployment
            .instances
            .iter()
            .zip(connections)
            .map(|(instance, connections)| {
                wrk::run(wrk::Load {
                    url: &instance.url,
                    path: &paths[0],
                    script: &self.buy,
                    threads,
                    connections: *connections,
                    seconds,
                    paths: extra,
                })
            });
        let reports = futures::future::try_join_all(loads).await?;
        let wall_seconds = started.elapsed().as_secs_f64();
        let at_end = watch.sample();
        let mut per_product = Vec::new();
        let mut orders = 0;
        for (product, before) in products.iter().zip(before) {
            let sold = sold(&deployment.pool, *product).await? - before;
            orders += sold;
            per_product.push(sold as f64 / seconds as f64);
        }
        let requests: f64 = reports.iter().map(|r| r.requests).sum();
        let failed: f64 = reports.iter().map(|r| r.failed).sum();
        Ok(Round {
            orders_per_sec: orders as f64 / seconds as f64,
            per_product,
            p99_ms: reports.iter().filter_map(|r| r.p99_ms).reduce(f64::max),
            failed_share: Some(failed / requests.max(1.0)),
            orders: orders as f64,
            cpu: cpu::spent(&at_start, &at_end),
            wall_seconds,
        })
    }

    /// Requests/s of `path` under `script`, 64 connections.
    async fn requests(&self, url: &str, path: &str, script: &Path) -> anyhow::Result<f64> {
        let report = wrk::run(wrk::Load {
            url,
            path,
            script,
            threads: 2,
            connections: FEW,
            seconds: self.args.seconds,
            paths: &[],
        })
        .await?;
        Ok(report.per_sec)
    }
}

impl Deployment {
    /// Stop the instances, drop the database, delete the Redis keys.
    async fn remove(self, redis_url: &str) -> anyhow::Result<()> {
        drop(self.instances);
        self.pool.close().await;
        self.database.remove().await?;
        servers::forget_keys(redis_url, &self.prefix).await
    }
}

/// Start `count` instances of `strategy` on a throwaway database `name`.
async fn deploy(
    admin_url: &str,
    redis_url: &str,
    name: String,
    strategy: LockStrategy,
    batch: Option<u32>,
    count: usize,
) -> anyhow::Result<Deployment> {
    let prefix = format!("bench:{name}:");
    let database = ThrowawayDatabase::create(admin_url, name.clone()).await?;
    let config = InstanceConfig {
        database_url: &database.url,
        redis_url,
        redis_key_prefix: &prefix,
        admin_token: ADMIN_TOKEN,
        strategy,
        work_ms: 0,
        // The service's defaults (LOCK_WAIT_MS, LOCK_TTL_MS), written out because the
        // instance's configuration names them.
        lock_wait_ms: 2_000,
        lock_ttl_ms: 5_000,
        redlock_urls: "",
        extra: batch
            .map(|b| vec![("BATCH_MAX", b.to_string())])
            .unwrap_or_default(),
    };
    let started = async {
        let me = std::env::current_exe()?;
        let mut instances = Vec::new();
        for i in 0..count {
            instances.push(Instance::start(&me, &config, &format!("{name}-{i}")).await?);
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database.url)
            .await?;
        anyhow::Ok((instances, pool))
    }
    .await;
    match started {
        Ok((instances, pool)) => Ok(Deployment {
            strategy,
            batch,
            instances,
            pool,
            database,
            prefix,
        }),
        Err(error) => {
            // Nothing of it is kept: the database and any keys go now.
            let _ = database.remove().await;
            let _ = servers::forget_keys(redis_url, &prefix).await;
            Err(error)
        }
    }
}

/// A product of one unit, sold, then refused once so that the instance answers from its
/// sold-out lane.
async fn sold_out_product(url: &str) -> anyhow::Result<i64> {
    let gone = create_product(url, ADMIN_TOKEN, 1).await?;
    let client = reqwest::Client::new();
    for user in 1..=2 {
        client
            .post(format!("{url}/api/products/{gone}/purchase"))
            .json(&serde_json::json!({"user_id": user}))
            .send()
            .await?;
    }
    Ok(gone)
}

/// Orders of `product` so far.
async fn sold(pool: &PgPool, product: i64) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "orders!" FROM orders WHERE product_id = $1"#,
        product
    )
    .fetch_one(pool)
    .await?)
}

/// The server's version and the settings the ceiling depends on.
async fn server_settings(admin: &PgPool) -> String {
    let mut parts = Vec::new();
    for setting in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
    ] {
        let value: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(admin)
            .await
            .unwrap_or_else(|_| "?".to_owned());
        parts.push(format!("{setting}={value}"));
    }
    format!("PostgreSQL: {}", parts.join(", "))
}

/// Client connections open on the server now (every database).
async fn client_connections(admin: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .fetch_one(admin)
    .await?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_connections_over_three_instances_are_334_333_333() {
        assert_eq!(split(1_000, 3), [334, 333, 333]);
        assert_eq!(split(64, 1), [64]);
        assert_eq!(split(1_000, 3).iter().sum::<u32>(), 1_000);
    }
}
