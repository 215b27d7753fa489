//! `loadtest demo`: the same attack on fresh instances of every strategy, one table.

use std::fmt::Write as _;

use anyhow::Context;
use goose::config::GooseConfiguration;
use reqwest::Url;
use seckill::LockStrategy;
use sqlx::{Connection, PgConnection};

use crate::attack;
use crate::books::{self, Verdict};
use crate::cli::DemoArgs;
use crate::instances::{Instance, InstanceConfig};

const ADMIN_TOKEN: &str = "demo-admin-token";

/// One row of the comparison.
pub struct Row {
    pub strategy: LockStrategy,
    pub orders_per_sec: f64,
    /// Latency of every purchase attempt.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency of the purchases that got an order.
    pub created_p50_ms: f64,
    pub created_p99_ms: f64,
    pub oversold: i64,
    pub lost_updates: i64,
    pub busy: u64,
    pub passed: bool,
}

impl Row {
    /// `none` is expected to fail; every other strategy is expected to pass.
    pub fn as_expected(&self) -> bool {
        self.passed != (self.strategy == LockStrategy::None)
    }
}

/// Run the demo; `Ok(true)` when every strategy behaved as expected.
pub async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        !args.strategies.contains(&LockStrategy::Redlock) || !args.redlock_urls.is_empty(),
        "--strategies redlock needs --redlock-urls (independent Redis masters)"
    );
    let mut rows = Vec::new();
    for &strategy in &args.strategies {
        println!("--- {} ---", strategy.name());
        let row = run_one(&args, strategy).await?;
        rows.push(row);
    }
    print!("{}", table(&args, &rows));
    Ok(rows.iter().all(Row::as_expected))
}

async fn run_one(args: &DemoArgs, strategy: LockStrategy) -> anyhow::Result<Row> {
    let database = ThrowawayDatabase::create(&args.database_url, strategy).await?;
    let prefix = format!("demo:{}:{}:", std::process::id(), strategy.name());
    let config = InstanceConfig {
        database_url: &database.url,
        redis_url: &args.redis_url,
        redis_key_prefix: &prefix,
        admin_token: ADMIN_TOKEN,
        strategy,
        work_ms: args.work_ms,
        lock_wait_ms: 10_000,
        lock_ttl_ms: 5_000,
        redlock_urls: &args.redlock_urls.join(","),
    };
    let me = std::env::current_exe().context("finding this binary to start instances")?;
    let mut instances = Vec::new();
    for i in 0..args.instances {
        instances.push(Instance::start(&me, &config, &format!("{}-{i}", strategy.name())).await?);
    }
    let hosts: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();

    let product = attack::create_product(&hosts[0], ADMIN_TOKEN, args.stock).await?;
    let mut goose = GooseConfiguration::default();
    goose.users = Some(args.users as usize);
    goose.increase_rate = Some(args.users.to_string());
    goose.run_time = Some(args.seconds.to_string());
    goose.quiet = 1;
    goose.no_print_metrics = true;
    let report = attack::run(goose, &hosts, product, args.stock, args.buyers).await?;
    let books = books::read(&database.url, product).await?;
    let verdict = Verdict::judge(&report, books);
    println!("{}", verdict.render(&report));
    drop(instances);
    database.drop().await?;
    forget_keys(&args.redis_url, &prefix).await?;

    let tally = &report.tally;
    Ok(Row {
        strategy,
        orders_per_sec: report.orders_per_sec(),
        p50_ms: tally.latency(0.50).as_secs_f64() * 1e3,
        p99_ms: tally.latency(0.99).as_secs_f64() * 1e3,
        created_p50_ms: tally.created_latency(0.50).as_secs_f64() * 1e3,
        created_p99_ms: tally.created_latency(0.99).as_secs_f64() * 1e3,
        oversold: (books.sold - args.stock).max(0),
        lost_updates: books.sold - (args.stock - books.stock),
        busy: tally.count(&tally.busy),
        passed: verdict.passed(),
    })
}

/// The comparison table.
pub fn table(args: &DemoArgs, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n=== DEMO: {} instances per strategy, stock {}, {} buyers, {} users, {} s, WORK_MS={} ===\n\
         orders/s until sell-out; latency of every purchase attempt, then of those that got an order (201)",
        args.instances, args.stock, args.buyers, args.users, args.seconds, args.work_ms
    );
    let _ = writeln!(
        out,
        "| strategy      | orders/s | p50 ms | p99 ms | 201 p50 ms | 201 p99 ms | oversold | lost updates | 503 busy | verdict |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for row in rows {
        let verdict = match (row.passed, row.strategy == LockStrategy::None) {
            (true, false) => "PASS",
            (false, true) => "FAIL (expected: no lock)",
            (true, true) => "PASS (race not shown: unexpected)",
            (false, false) => "FAIL",
        };
        let _ = writeln!(
            out,
            "| {:<13} | {:>8.0} | {:>6.1} | {:>6.1} | {:>10.1} | {:>10.1} | {:>8} | {:>12} | {:>8} | {verdict} |",
            row.strategy.name(),
            row.orders_per_sec,
            row.p50_ms,
            row.p99_ms,
            row.created_p50_ms,
            row.created_p99_ms,
            row.oversold,
            row.lost_updates,
            row.busy
        );
    }
    out
}

/// A database of its own for one strategy's run, dropped afterwards.
struct ThrowawayDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ThrowawayDatabase {
    async fn create(admin_url: &str, strategy: LockStrategy) -> anyhow::Result<Self> {
        let name = format!(
            "seckill_demo_{}_{}",
            std::process::id(),
            strategy.name().replace('-', "_")
        );
        let mut admin = PgConnection::connect(admin_url)
            .await
            .context("cannot connect to PostgreSQL (--database-url) to create the demo database")?;
        sqlx::query(&format!(r#"CREATE DATABASE "{name}""#))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        let mut url = Url::parse(admin_url).context("invalid --database-url")?;
        url.set_path(&format!("/{name}"));
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url: url.to_string(),
        })
    }

    async fn drop(self) -> anyhow::Result<()> {
        let mut admin = PgConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, self.name))
            .execute(&mut admin)
            .await?;
        Ok(())
    }
}

/// Delete the run's keys from Redis: the lock's fence counter has no TTL by design.
async fn forget_keys(redis_url: &str, prefix: &str) -> anyhow::Result<()> {
    let mut conn = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await
        .context("cannot reach Redis to clean up the demo's keys")?;
    // The fence key wraps the lock key in a hash tag: `{<prefix>lock_sale_1}:fence`.
    for pattern in [format!("{prefix}*"), format!("{{{prefix}*")] {
        let mut keys: Vec<String> = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await?;
        }
    }
    Ok(())
}
