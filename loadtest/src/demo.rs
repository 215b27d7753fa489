//! `loadtest demo`: the same attack on fresh instances of every strategy, one table, one
//! chart.
//!
//! A strategy that fails to start, or whose attack or books cannot be read, becomes a row
//! marked as an error, with its reason; the others still run. Every run's database and
//! Redis keys (Redlock masters' included) are removed whatever happens, and Ctrl-C stops the
//! whole demo, cleans up, and says so.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use goose::config::GooseConfiguration;
use seckill::LockStrategy;

use crate::attack::{self, AttackReport, Cancel, Extras};
use crate::books::{self, NO_LOST_UPDATE, NO_OVERSELL, NO_SERVER_ERROR, Verdict};
use crate::chart::{self, Bar};
use crate::cli::DemoArgs;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, Server, ThrowawayDatabase};

const ADMIN_TOKEN: &str = "demo-admin-token-0123456789";

/// One row of the comparison.
pub struct Row {
    pub strategy: LockStrategy,
    pub batch_max: u32,
    pub outcome: Result<Figures, String>,
}

/// What one strategy's run measured.
pub struct Figures {
    pub orders_per_sec: f64,
    /// Latency of every purchase attempt.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency of the purchases that got an order.
    pub created_p50_ms: f64,
    pub created_p99_ms: f64,
    pub oversold: i64,
    pub lost_updates: i64,
    pub busy_share: f64,
    /// Orders sold by each instance (from their `/metrics`).
    pub split: Vec<u64>,
    pub verdict: Verdict,
    pub orders_over_time: Vec<u64>,
}

impl Row {
    pub fn label(&self) -> String {
        if self.batch_max == 1 {
            format!("{}/1", self.strategy.name())
        } else {
            self.strategy.name().to_owned()
        }
    }

    /// `none` must fail on oversell or lost update, and on nothing that would mean the
    /// service broke (a 5xx); every other strategy must pass.
    pub fn as_expected(&self) -> bool {
        let Ok(figures) = &self.outcome else {
            return false;
        };
        if self.strategy == LockStrategy::None {
            (figures.verdict.check(NO_OVERSELL) == Some(false)
                || figures.verdict.check(NO_LOST_UPDATE) == Some(false))
                && figures.verdict.check(NO_SERVER_ERROR) == Some(true)
        } else {
            figures.verdict.passed()
        }
    }

    fn verdict_text(&self) -> String {
        match (&self.outcome, self.strategy == LockStrategy::None) {
            (Err(why), _) => format!("ERROR: {why}"),
            (Ok(_), true) if self.as_expected() => "FAIL (expected: no lock)".into(),
            (Ok(_), true) => "PASS (race not shown: unexpected)".into(),
            (Ok(_), false) if self.as_expected() => "PASS".into(),
            (Ok(figures), false) => {
                let failed: Vec<&str> = figures
                    .verdict
                    .checks
                    .iter()
                    .filter(|c| !c.pass)
                    .map(|c| c.name)
                    .collect();
                format!("FAIL ({})", failed.join(", "))
            }
        }
    }
}

/// Run the demo; `Ok(true)` when every strategy behaved as expected.
pub async fn run(args: DemoArgs, cancel: Cancel) -> anyhow::Result<bool> {
    let postgres = servers::postgres(args.database_url.as_deref()).await?;
    say_where("PostgreSQL", &postgres);
    let redis = servers::redis(args.redis_url.as_deref()).await?;
    say_where("Redis", &redis);
    let wants_redlock = args.strategies.contains(&LockStrategy::Redlock)
        || args.per_request.contains(&Some(LockStrategy::Redlock));
    let masters: Vec<Server> = if wants_redlock && args.redlock_urls.is_empty() {
        let masters = (0..3)
            .map(|_| servers::start_redis())
            .collect::<anyhow::Result<Vec<_>>>()
            .context("starting three private Redis masters for redlock")?;
        println!("redlock: three private Redis masters");
        masters
    } else {
        Vec::new()
    };
    let redlock_urls: Vec<String> = if masters.is_empty() {
        args.redlock_urls.clone()
    } else {
        masters.iter().map(|m| m.url.clone()).collect()
    };
    let runs: Vec<(LockStrategy, u32)> = args
        .strategies
        .iter()
        .map(|s| (*s, args.batch_max))
        .chain(args.per_request.iter().flatten().map(|s| (*s, 1)))
        .collect();
    let mut rows = Vec::new();
    for (strategy, batch_max) in runs {
        if cancel.is_set() {
            break;
        }
        println!("--- {} (BATCH_MAX={batch_max}) ---", strategy.name());
        let setup = Setup {
            args: &args,
            cancel: &cancel,
            database_url: &postgres.url,
            redis_url: &redis.url,
            redlock_urls: &redlock_urls,
        };
        let outcome = setup.run_one(strategy, batch_max).await;
        // An attack cut short by Ctrl-C measured nothing worth a row's figures.
        let outcome = match outcome {
            Ok(_) if cancel.is_set() => Err("interrupted by Ctrl-C".to_owned()),
            other => other,
        };
        if let Err(why) = &outcome {
            println!("{}: {why}", strategy.name());
        }
        rows.push(Row {
            strategy,
            batch_max,
            outcome,
        });
    }
    print!("{}", table(&args, &rows));
    if let Err(error) = draw_chart(&args, &rows) {
        println!("could not draw the chart: {error:#}");
    }
    // The servers (and their directories) go when they are dropped, here.
    drop((masters, redis, postgres));
    if cancel.is_set() {
        println!(
            "stopped by Ctrl-C after {} run(s); everything the demo started is gone",
            rows.len()
        );
        return Ok(false);
    }
    Ok(rows.iter().all(Row::as_expected))
}

fn say_where(what: &str, server: &Server) {
    if server.is_private() {
        println!(
            "{what}: nothing answered at the default address, so a private one was started for the demo (removed when it ends)"
        );
    }
}

/// Where the runs go.
struct Setup<'a> {
    args: &'a DemoArgs,
    cancel: &'a Cancel,
    database_url: &'a str,
    redis_url: &'a str,
    redlock_urls: &'a [String],
}

impl Setup<'_> {
    /// One strategy's run, cleaned up whatever happens.
    async fn run_one(&self, strategy: LockStrategy, batch_max: u32) -> Result<Figures, String> {
        let prefix = format!(
            "demo:{}:{}:{}:",
            std::process::id(),
            strategy.name(),
            batch_max
        );
        let name = format!(
            "seckill_demo_{}_{}_{batch_max}",
            std::process::id(),
            strategy.name().replace('-', "_")
        );
        let database = ThrowawayDatabase::create(self.database_url, name)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let outcome = self
            .attack(strategy, batch_max, &database.url, &prefix)
            .await;
        let mut cleanup = Vec::new();
        if let Err(error) = database.remove().await {
            cleanup.push(format!("dropping the database: {error:#}"));
        }
        for url in
            std::iter::once(self.redis_url).chain(self.redlock_urls.iter().map(String::as_str))
        {
            if let Err(error) = servers::forget_keys(url, &prefix).await {
                cleanup.push(format!("deleting the keys on {url}: {error:#}"));
            }
        }
        if !cleanup.is_empty() {
            println!("cleanup: {}", cleanup.join("; "));
        }
        outcome.map_err(|e| format!("{e:#}"))
    }

    async fn attack(
        &self,
        strategy: LockStrategy,
        batch_max: u32,
        database_url: &str,
        prefix: &str,
    ) -> anyhow::Result<Figures> {
        let args = self.args;
        let redlock_urls = self.redlock_urls.join(",");
        let config = InstanceConfig {
            database_url,
            redis_url: self.redis_url,
            redis_key_prefix: prefix,
            admin_token: ADMIN_TOKEN,
            strategy,
            work_ms: args.work_ms,
            lock_wait_ms: 10_000,
            lock_ttl_ms: 5_000,
            redlock_urls: &redlock_urls,
            extra: vec![
                ("BATCH_MAX", batch_max.to_string()),
                ("DATABASE_MAX_CONNECTIONS", "20".into()),
            ],
        };
        let me = std::env::current_exe().context("finding this binary to start instances")?;
        let mut instances = Vec::new();
        for i in 0..args.instances {
            let name = format!("{}-{batch_max}-{i}", strategy.name());
            instances.push(Instance::start(&me, &config, &name).await?);
        }
        let hosts: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
        println!("instances: {}", hosts.join(" "));
        let figures = self.attack_instances(&hosts, database_url).await;
        if figures.is_err() {
            // Whatever failed, the instances' logs may say why: keep them, and say where.
            for instance in &mut instances {
                instance.keep_log();
            }
            let logs: Vec<String> = instances
                .iter()
                .map(|i| i.log.display().to_string())
                .collect();
            return figures.with_context(|| format!("instance logs kept: {}", logs.join(" ")));
        }
        figures
    }

    /// Attack running instances and judge the books.
    async fn attack_instances(
        &self,
        hosts: &[String],
        database_url: &str,
    ) -> anyhow::Result<Figures> {
        let args = self.args;
        let product = attack::create_product(&hosts[0], ADMIN_TOKEN, args.stock).await?;
        let mut goose = GooseConfiguration::default();
        goose.users = Some(args.users as usize);
        goose.increase_rate = Some(args.users.to_string());
        goose.run_time = Some(args.max_seconds.to_string());
        goose.quiet = 1;
        goose.no_print_metrics = true;
        let report = attack::run(
            goose,
            hosts,
            Some(ADMIN_TOKEN),
            product,
            args.stock,
            args.buyers,
            Extras {
                restock: 0,
                cancel: Some(self.cancel.clone()),
            },
        )
        .await?;
        let verdict = books::judge(&report, &hosts[0], database_url).await?;
        println!("{}", verdict.render(&report));
        let mut split = Vec::new();
        for host in hosts {
            split.push(orders_sold_by(host).await.unwrap_or(0));
        }
        Ok(figures(&report, verdict, split))
    }
}

fn figures(report: &AttackReport, verdict: Verdict, split: Vec<u64>) -> Figures {
    let t = &report.tally;
    let books = verdict.books;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Figures {
        orders_per_sec: report.orders_per_sec(),
        p50_ms: ms(t.latency(0.50)),
        p99_ms: ms(t.latency(0.99)),
        created_p50_ms: ms(t.created_latency(0.50)),
        created_p99_ms: ms(t.created_latency(0.99)),
        oversold: (books.sold - books.supplied).max(0),
        lost_updates: books.sold - (books.supplied - books.stock),
        busy_share: t.busy_share(),
        split,
        verdict,
        orders_over_time: report.orders_over_time(chart::BIN),
    }
}

/// `seckill_orders_total` of one instance.
async fn orders_sold_by(host: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{host}/metrics"))
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|line| line.strip_prefix("seckill_orders_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map(|n| n as u64)
        .context("no seckill_orders_total")
}

/// The comparison table.
pub fn table(args: &DemoArgs, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n=== DEMO: {} instances per strategy, stock {}, {} buyers, {} users, WORK_MS={} ===\n\
         orders/s at full load; latency of every purchase attempt, then of those that got an order (201);\n\
         batch: BATCH_MAX (1 = one purchase per transaction, the per-request baseline)",
        args.instances, args.stock, args.buyers, args.users, args.work_ms
    );
    let _ = writeln!(
        out,
        "| strategy      | batch | orders/s | p50 ms | p99 ms | 201 p50 ms | 201 p99 ms | oversold | lost updates | busy % | orders per instance | verdict |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for row in rows {
        let name = row.strategy.name();
        let verdict = row.verdict_text();
        match &row.outcome {
            Ok(f) => {
                let split: Vec<String> = f.split.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    out,
                    "| {name:<13} | {:>5} | {:>8.0} | {:>6.1} | {:>6.1} | {:>10.1} | {:>10.1} | {:>8} | {:>12} | {:>6.2} | {} | {verdict} |",
                    row.batch_max,
                    f.orders_per_sec,
                    f.p50_ms,
                    f.p99_ms,
                    f.created_p50_ms,
                    f.created_p99_ms,
                    f.oversold,
                    f.lost_updates,
                    f.busy_share * 100.0,
                    split.join(" / "),
                );
            }
            Err(_) => {
                let _ = writeln!(
                    out,
                    "| {name:<13} | {:>5} | - | - | - | - | - | - | - | - | - | {verdict} |",
                    row.batch_max
                );
            }
        }
    }
    out
}

fn draw_chart(args: &DemoArgs, rows: &[Row]) -> anyhow::Result<()> {
    let bars: Vec<Bar> = rows
        .iter()
        .filter_map(|row| {
            let f = row.outcome.as_ref().ok()?;
            Some(Bar {
                label: row.label(),
                orders_per_sec: f.orders_per_sec,
                created_p99_ms: f.created_p99_ms,
                oversold: f.oversold,
                lost_updates: f.lost_updates,
                orders_over_time: f.orders_over_time.clone(),
            })
        })
        .collect();
    if bars.is_empty() {
        return Ok(());
    }
    let title = format!(
        "seckill strategies: {} instances, {} units, {} buyers, {} users (\"/1\": BATCH_MAX=1)",
        args.instances, args.stock, args.buyers, args.users
    );
    chart::draw(&args.chart, &title, &bars)?;
    println!("chart: {}", display(&args.chart));
    Ok(())
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
