//! `loadtest demo`: the same attack on fresh instances of every strategy, one table, one
//! chart.
//!
//! Each run (a strategy, batched or per request) gets a fresh database and its own
//! instances, and ends once its sale is decided or at `--max-seconds`. With `--products N`
//! each run sells N products at once, its stock split over them and its buyers spread over
//! them; every product's books must balance on their own, and all of them together. What a run shows is
//! its [`RowVerdict`]: a safe strategy must keep its books, and `none` must break them. A
//! run that reaches the time bound before it sells out is `INCOMPLETE`, which is not a
//! failure by itself; a broken invariant always is.
//!
//! A strategy that fails to start, or whose attack or books cannot be read, becomes a row
//! marked as an error, with its reason; the others still run. A server a strategy needs that
//! the demo can neither find nor start (ZooKeeper or etcd not installed, say) stops the demo
//! before its first run instead, saying what to install and how to leave the strategy out: a
//! comparison with a row missing is not the one asked for. Every run's database and Redis
//! keys (Redlock masters' included) are removed whatever happens. Its ZooKeeper nodes and
//! etcd keys go by themselves: ephemeral nodes and leased keys end with the instances'
//! sessions, and ZooKeeper deletes each emptied lock node (a container node) within a minute
//! or two; only the lock crate's root node, `/distlock`, stays. Ctrl-C stops the whole demo,
//! cleans up, and says so.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use goose::config::GooseConfiguration;
use seckill::LockStrategy;

use crate::attack::{self, AttackReport, Cancel, Extras};
use crate::books::{self, NO_LOST_UPDATE, NO_OVERSELL, NO_SERVER_ERROR, SALE_HAPPENED, Verdict};
use crate::chart::{self, Bar, Header};
use crate::cli::DemoArgs;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, Server, ThrowawayDatabase};

const ADMIN_TOKEN: &str = "demo-admin-token-0123456789";

/// LOCK_TTL_MS of the instances.
const LOCK_TTL_MS: u64 = 5_000;

/// ZOOKEEPER_SESSION_TIMEOUT_MS of the `zookeeper` instances: the lease of their locks.
///
/// TIMING: at least [`LOCK_TTL_MS`] (the service refuses a lock that would outlive its
/// session), and at most what the private ZooKeeper grants
/// ([`servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS`]) and what a stock ZooKeeper grants (20
/// ticks of 2 s), or the instances refuse to start.
const ZOOKEEPER_SESSION_TIMEOUT_MS: u64 = 10_000;

/// One row of the comparison.
pub struct Row {
    pub strategy: LockStrategy,
    pub batch_max: u32,
    /// Units put on sale.
    pub stock: i64,
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
    /// The attack ran into `--max-seconds` before the sale was decided.
    pub time_bound: bool,
}

/// What a row shows, for the table and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowVerdict {
    /// A safe strategy sold out (or answered every buyer) and kept its books.
    Pass,
    /// `none` broke the books (oversold or lost updates), as it must, and nothing else.
    FailedAsExpected,
    /// A safe strategy kept its books but reached the time bound with stock left: `sold` of
    /// `supplied` units were sold. Its figures are from a partial sale.
    Incomplete { sold: i64, supplied: i64 },
    /// A check failed: these.
    Fail(Vec<&'static str>),
    /// `none` did not show the race; with the checks that failed, if any.
    RaceNotShown(Vec<&'static str>),
    /// The run could not be made or judged.
    Error(String),
}

impl RowVerdict {
    /// Whether this row makes the demo exit non-zero: anything but a pass, `none` failing
    /// as it must, or a run stopped by the time bound with its books intact.
    pub fn fails_the_demo(&self) -> bool {
        !matches!(
            self,
            RowVerdict::Pass | RowVerdict::FailedAsExpected | RowVerdict::Incomplete { .. }
        )
    }
}

impl std::fmt::Display for RowVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowVerdict::Pass => write!(f, "PASS"),
            RowVerdict::FailedAsExpected => write!(f, "FAIL (expected: no lock)"),
            RowVerdict::Incomplete { sold, supplied } => {
                write!(f, "INCOMPLETE: time bound, {sold} of {supplied} sold")
            }
            RowVerdict::Fail(failed) => write!(f, "FAIL ({})", failed.join(", ")),
            RowVerdict::RaceNotShown(failed) if failed.is_empty() => {
                write!(f, "UNEXPECTED: no oversell or lost update shown")
            }
            RowVerdict::RaceNotShown(failed) => write!(
                f,
                "UNEXPECTED: no oversell or lost update shown; failed: {}",
                failed.join(", ")
            ),
            RowVerdict::Error(why) => write!(f, "ERROR: {why}"),
        }
    }
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
    /// service broke (a 5xx); every other strategy must pass, or keep its books until the
    /// time bound stopped it.
    pub fn verdict(&self) -> RowVerdict {
        let figures = match &self.outcome {
            Ok(figures) => figures,
            Err(why) => return RowVerdict::Error(why.clone()),
        };
        let verdict = &figures.verdict;
        let failed: Vec<&'static str> = verdict
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| c.name)
            .collect();
        if self.strategy == LockStrategy::None {
            let race_shown = verdict.check(NO_OVERSELL) == Some(false)
                || verdict.check(NO_LOST_UPDATE) == Some(false);
            return match (race_shown, verdict.check(NO_SERVER_ERROR)) {
                (true, Some(true)) => RowVerdict::FailedAsExpected,
                (true, _) => RowVerdict::Fail(vec![NO_SERVER_ERROR]),
                (false, _) => RowVerdict::RaceNotShown(failed),
            };
        }
        let books = verdict.books;
        match failed.as_slice() {
            [] => RowVerdict::Pass,
            // Only the time bound kept the sale from its end: what was sold balanced, and
            // something was, of every product (a service that sells nothing, or nothing of
            // one product, in the bound is broken, not slow).
            [SALE_HAPPENED]
                if figures.time_bound
                    && books.stock > 0
                    && verdict.products.iter().all(|(_, product)| product.sold > 0) =>
            {
                RowVerdict::Incomplete {
                    sold: books.sold,
                    supplied: books.supplied,
                }
            }
            _ => RowVerdict::Fail(failed),
        }
    }
}

/// When, where and how a demo ran: the table's and the chart's header.
pub struct RunInfo {
    /// UTC, to the minute.
    pub date: String,
    /// Cores and CPU model.
    pub machine: String,
    /// The command line, as `loadtest demo ...`, passwords in URLs hidden.
    pub command: String,
}

impl RunInfo {
    /// This process, now.
    pub fn now() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        Self {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            machine: machine(),
            command: command_line(&args),
        }
    }
}

/// `2 cores, Intel(R) Xeon(R) Processor`: the cores this process may use (as `nproc`
/// counts them) and the CPU model from `/proc/cpuinfo` (Linux).
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "CPU model unknown".to_owned());
    format!("{cores} cores, {model}")
}

/// `loadtest` and `args` as a shell would take them back, with any password in a URL hidden.
pub fn command_line(args: &[String]) -> String {
    let mut line = String::from("loadtest");
    for arg in args {
        let arg = if arg.contains("://") {
            seckill::redact::redacted(arg)
        } else {
            arg.clone()
        };
        line.push(' ');
        if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '"') {
            line.push_str(&format!("{arg:?}"));
        } else {
            line.push_str(&arg);
        }
    }
    line
}

/// One run of the demo: a strategy, its `BATCH_MAX`, what it sells and to how many buyers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub strategy: LockStrategy,
    pub batch_max: u32,
    pub stock: i64,
    pub buyers: u64,
}

/// The runs `args` ask for: every strategy batched, then the per-request ones, which sell
/// `--per-request-stock` units (at most `--stock`) to as many buyers per unit.
pub fn runs(args: &DemoArgs) -> Vec<Run> {
    let per_request_stock = args.per_request_stock.min(args.stock);
    let per_request_buyers =
        (args.buyers as u128 * per_request_stock as u128).div_ceil(args.stock as u128) as u64;
    args.strategies
        .iter()
        .map(|s| Run {
            strategy: *s,
            batch_max: args.batch_max,
            stock: args.stock,
            buyers: args.buyers,
        })
        .chain(args.per_request.iter().flatten().map(|s| Run {
            strategy: *s,
            batch_max: 1,
            stock: per_request_stock,
            buyers: per_request_buyers.max(1),
        }))
        .collect()
}

/// `2:05`: minutes and seconds.
fn clock(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

/// What the demo is about to do and how long it may take, before it starts.
fn announce(args: &DemoArgs, runs: &[Run]) -> String {
    // TIMING: a run's set-up (a database, its migrations, the instances' start) and its
    // books take a few seconds on a two-core machine; 15 s is a generous allowance.
    let bound = runs.len() as u64 * (args.max_seconds + 15);
    format!(
        "demo: {} runs, {} instance(s) each, {} product(s) at once, {} users; each run ends once its sale is decided, or after {} s.\n\
         The default run takes 1 to 3 minutes on a two-core machine; this one at most about {} minutes, if every run reached its time bound.",
        runs.len(),
        args.instances,
        args.products,
        args.users,
        args.max_seconds,
        bound.div_ceil(60)
    )
}

/// Why `runs` cannot sell `--products` products (each needs a unit and a buyer), if so.
pub fn check_products(args: &DemoArgs, runs: &[Run]) -> Result<(), String> {
    let n = args.products;
    match runs.iter().find(|r| r.stock < n as i64 || r.buyers < n) {
        Some(run) => Err(format!(
            "--products {n}: every product needs a unit and a buyer, and the {} run (BATCH_MAX={}) has {} units and {} buyers: raise --stock, --per-request-stock or --buyers, or lower --products",
            run.strategy.name(),
            run.batch_max,
            run.stock,
            run.buyers
        )),
        None => Ok(()),
    }
}

/// Run the demo; `Ok(true)` when no row fails it ([`RowVerdict::fails_the_demo`]).
pub async fn run(args: DemoArgs, cancel: Cancel) -> anyhow::Result<bool> {
    let started = Instant::now();
    let info = RunInfo::now();
    let runs = runs(&args);
    check_products(&args, &runs).map_err(anyhow::Error::msg)?;
    println!("{}", announce(&args, &runs));
    let postgres = servers::postgres(args.database_url.as_deref()).await?;
    say_where("PostgreSQL", &postgres);
    let redis = servers::redis(args.redis_url.as_deref()).await?;
    say_where("Redis", &redis);
    let wants_redlock = wanted(&runs, LockStrategy::Redlock);
    let zookeeper = if wanted(&runs, LockStrategy::ZooKeeper) {
        let server = servers::zookeeper(args.zookeeper_connect.as_deref())
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}; {}", without(LockStrategy::ZooKeeper, &args)))?;
        say_where("ZooKeeper", &server);
        Some(server)
    } else {
        None
    };
    let etcd = if wanted(&runs, LockStrategy::Etcd) {
        let server = servers::etcd(args.etcd_endpoints.as_deref())
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}; {}", without(LockStrategy::Etcd, &args)))?;
        say_where("etcd", &server);
        Some(server)
    } else {
        None
    };
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
    let mut rows = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        if cancel.is_set() {
            break;
        }
        let over = if args.products > 1 {
            format!(" over {} products", args.products)
        } else {
            String::new()
        };
        println!(
            "--- {} (BATCH_MAX={}), run {} of {}: {} units{over}, {} buyers; {} so far ---",
            run.strategy.name(),
            run.batch_max,
            i + 1,
            runs.len(),
            run.stock,
            run.buyers,
            clock(started.elapsed())
        );
        let setup = Setup {
            args: &args,
            cancel: &cancel,
            database_url: &postgres.url,
            redis_url: &redis.url,
            redlock_urls: &redlock_urls,
            zookeeper_connect: zookeeper.as_ref().map(|s| s.url.as_str()),
            etcd_endpoints: etcd.as_ref().map(|s| s.url.as_str()),
        };
        let outcome = setup.run_one(run).await;
        // An attack cut short by Ctrl-C measured nothing worth a row's figures.
        let outcome = match outcome {
            Ok(_) if cancel.is_set() => Err("interrupted by Ctrl-C".to_owned()),
            other => other,
        };
        let row = Row {
            strategy: run.strategy,
            batch_max: run.batch_max,
            stock: run.stock,
            outcome,
        };
        println!("=> {}: {}", row.label(), row.verdict());
        rows.push(row);
    }
    print!("{}", table(&args, &info, &rows));
    if let Err(error) = draw_chart(&args, &info, &rows) {
        println!("could not draw the chart: {error:#}");
    }
    // The servers (and their directories) go when they are dropped, here.
    drop((masters, etcd, zookeeper, redis, postgres));
    if cancel.is_set() {
        println!(
            "stopped by Ctrl-C after {} run(s); everything the demo started is gone",
            rows.len()
        );
        return Ok(false);
    }
    let ok = !rows.iter().any(|row| row.verdict().fails_the_demo());
    println!("{}", conclusion(&rows, started.elapsed()));
    Ok(ok)
}

/// Whether any of `runs` is of `strategy`.
fn wanted(runs: &[Run], strategy: LockStrategy) -> bool {
    runs.iter().any(|r| r.strategy == strategy)
}

/// The options that leave `strategy` out of the demo, for a user who would rather run
/// without it than install its server.
fn without(strategy: LockStrategy, args: &DemoArgs) -> String {
    let name = strategy.name();
    let others = |list: Vec<LockStrategy>| -> Vec<&'static str> {
        list.into_iter()
            .filter(|s| *s != strategy)
            .map(LockStrategy::name)
            .collect()
    };
    let mut without = Vec::new();
    if args.strategies.contains(&strategy) {
        let rest = others(args.strategies.clone());
        if rest.is_empty() {
            without.push("another strategy in --strategies".to_owned());
        } else {
            without.push(format!("--strategies {}", rest.join(",")));
        }
    }
    if args.per_request.contains(&Some(strategy)) {
        let rest = others(args.per_request.iter().flatten().copied().collect());
        without.push(format!("--per-request \"{}\"", rest.join(",")));
    }
    format!("to run the demo without {name}: {}", without.join(" "))
}

/// The demo's last line: what the rows showed, and how long it all took.
fn conclusion(rows: &[Row], took: Duration) -> String {
    let verdicts: Vec<(String, RowVerdict)> =
        rows.iter().map(|r| (r.label(), r.verdict())).collect();
    let failed: Vec<String> = verdicts
        .iter()
        .filter(|(_, v)| v.fails_the_demo())
        .map(|(label, v)| format!("{label} {v}"))
        .collect();
    let incomplete = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, RowVerdict::Incomplete { .. }))
        .count();
    let mut line = if failed.is_empty() {
        "demo OK: every safe strategy kept its books".to_owned()
    } else {
        format!("demo FAILED: {}", failed.join("; "))
    };
    if incomplete > 0 {
        line.push_str(&format!(
            "; {incomplete} run(s) reached the time bound before selling out (INCOMPLETE: their figures are from a partial sale, raise --max-seconds or lower the stock)"
        ));
    }
    line.push_str(&format!("; took {}", clock(took)));
    line
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
    /// The connect string of the `zookeeper` runs' ZooKeeper, if any run is of `zookeeper`.
    zookeeper_connect: Option<&'a str>,
    /// The endpoints of the `etcd` runs' etcd, if any run is of `etcd`.
    etcd_endpoints: Option<&'a str>,
}

impl Setup<'_> {
    /// One run, cleaned up whatever happens.
    async fn run_one(&self, run: &Run) -> Result<Figures, String> {
        let (strategy, batch_max) = (run.strategy, run.batch_max);
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
        let outcome = self.attack(run, &database.url, &prefix).await;
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

    async fn attack(&self, run: &Run, database_url: &str, prefix: &str) -> anyhow::Result<Figures> {
        let (strategy, batch_max) = (run.strategy, run.batch_max);
        let args = self.args;
        let redlock_urls = self.redlock_urls.join(",");
        let mut extra = vec![
            ("BATCH_MAX", batch_max.to_string()),
            ("DATABASE_MAX_CONNECTIONS", "20".into()),
        ];
        extra.extend(consensus_settings(
            strategy,
            self.zookeeper_connect,
            self.etcd_endpoints,
        ));
        let config = InstanceConfig {
            database_url,
            redis_url: self.redis_url,
            redis_key_prefix: prefix,
            admin_token: ADMIN_TOKEN,
            strategy,
            work_ms: args.work_ms,
            lock_wait_ms: 10_000,
            lock_ttl_ms: LOCK_TTL_MS,
            redlock_urls: &redlock_urls,
            extra,
        };
        let me = std::env::current_exe().context("finding this binary to start instances")?;
        let mut instances = Vec::new();
        for i in 0..args.instances {
            let name = format!("{}-{batch_max}-{i}", strategy.name());
            instances.push(Instance::start(&me, &config, &name).await?);
        }
        let hosts: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
        println!("instances: {}", hosts.join(" "));
        let figures = self.attack_instances(run, &hosts, database_url).await;
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
        run: &Run,
        hosts: &[String],
        database_url: &str,
    ) -> anyhow::Result<Figures> {
        let args = self.args;
        let products =
            attack::create_products(&hosts[0], ADMIN_TOKEN, run.stock, args.products).await?;
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
            &products,
            run.buyers,
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

/// The settings that point a `zookeeper` or `etcd` run's instances at their server (none for
/// the other strategies).
fn consensus_settings(
    strategy: LockStrategy,
    zookeeper_connect: Option<&str>,
    etcd_endpoints: Option<&str>,
) -> Vec<(&'static str, String)> {
    match (strategy, zookeeper_connect, etcd_endpoints) {
        (LockStrategy::ZooKeeper, Some(connect), _) => vec![
            ("ZOOKEEPER_CONNECT", connect.to_owned()),
            (
                "ZOOKEEPER_SESSION_TIMEOUT_MS",
                ZOOKEEPER_SESSION_TIMEOUT_MS.to_string(),
            ),
        ],
        (LockStrategy::Etcd, _, Some(endpoints)) => {
            vec![("ETCD_ENDPOINTS", endpoints.to_owned())]
        }
        _ => Vec::new(),
    }
}

fn figures(report: &AttackReport, verdict: Verdict, split: Vec<u64>) -> Figures {
    let t = &report.tally;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Figures {
        orders_per_sec: report.orders_per_sec(),
        p50_ms: ms(t.latency(0.50)),
        p99_ms: ms(t.latency(0.99)),
        created_p50_ms: ms(t.created_latency(0.50)),
        created_p99_ms: ms(t.created_latency(0.99)),
        // Product by product: one product's oversell is not made good by another's unsold
        // units.
        oversold: verdict.products.iter().map(|(_, b)| b.oversold()).sum(),
        lost_updates: verdict.products.iter().map(|(_, b)| b.lost_updates()).sum(),
        busy_share: t.busy_share(),
        split,
        verdict,
        orders_over_time: report.orders_over_time(chart::BIN),
        time_bound: !report.decided && report.goose_error.is_none(),
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

/// The comparison table, under a header that says when, where and how it was measured.
pub fn table(args: &DemoArgs, info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n=== DEMO: {} instances per run, {} product(s) per run, {} users, WORK_MS={}; {:.1} buyers per unit ===\n\
         date: {}; machine: {}; command: {}\n\
         orders/s at full load; latency of every purchase attempt, then of those that got an order (201);\n\
         batch: BATCH_MAX (1 = one purchase per transaction, the per-request baseline); stock: of all products together",
        args.instances,
        args.products,
        args.users,
        args.work_ms,
        args.buyers as f64 / args.stock as f64,
        info.date,
        info.machine,
        info.command,
    );
    let _ = writeln!(
        out,
        "| strategy      | batch | stock | orders/s | p50 ms | p99 ms | 201 p50 ms | 201 p99 ms | oversold | lost updates | busy % | orders per instance | verdict |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for row in rows {
        let name = row.strategy.name();
        let verdict = row.verdict();
        match &row.outcome {
            Ok(f) => {
                let split: Vec<String> = f.split.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    out,
                    "| {name:<13} | {:>5} | {:>5} | {:>8.0} | {:>6.1} | {:>6.1} | {:>10.1} | {:>10.1} | {:>8} | {:>12} | {:>6.2} | {} | {verdict} |",
                    row.batch_max,
                    row.stock,
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
                    "| {name:<13} | {:>5} | {:>5} | - | - | - | - | - | - | - | - | - | {verdict} |",
                    row.batch_max, row.stock
                );
            }
        }
    }
    out
}

fn draw_chart(args: &DemoArgs, info: &RunInfo, rows: &[Row]) -> anyhow::Result<()> {
    let bars: Vec<Bar> = rows
        .iter()
        .filter_map(|row| {
            let f = row.outcome.as_ref().ok()?;
            Some(Bar {
                strategy: row.strategy,
                per_request: row.batch_max == 1,
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
    let per_request = rows
        .iter()
        .find(|r| r.batch_max == 1)
        .map(|r| {
            format!(
                " ({} in the per-request runs)",
                chart::thousands(r.stock as u64)
            )
        })
        .unwrap_or_default();
    let header = Header {
        title: format!(
            "seckill demo: {} instances per strategy, {} units on sale{per_request}{}, {} users",
            args.instances,
            chart::thousands(args.stock as u64),
            if args.products > 1 {
                format!(" over {} products", args.products)
            } else {
                String::new()
            },
            args.users
        ),
        lines: vec![
            format!("{} · {} · {}", info.date, info.machine, info.command),
            "solid: batches of up to BATCH_MAX purchases per transaction; light, dashed, \"/1\": BATCH_MAX=1, one purchase per transaction; compare runs of one chart, not charts".to_owned(),
        ],
    };
    chart::draw(&args.chart, &header, &bars)?;
    println!("chart: {}", display(&args.chart));
    Ok(())
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::books::{BUSY_SHARE, Books, Check, NO_WRONG_SOLD_OUT, ONE_ORDER_PER_USER};

    /// Every check of the verdict, those named in `failed` failing.
    fn verdict(failed: &[&'static str], books: Books) -> Verdict {
        let names = [
            SALE_HAPPENED,
            NO_OVERSELL,
            NO_LOST_UPDATE,
            ONE_ORDER_PER_USER,
            NO_WRONG_SOLD_OUT,
            BUSY_SHARE,
            NO_SERVER_ERROR,
        ];
        Verdict {
            products: vec![(1, books)],
            checks: names
                .into_iter()
                .map(|name| Check {
                    name,
                    pass: !failed.contains(&name),
                    detail: String::new(),
                })
                .collect(),
            books,
        }
    }

    fn sold(sold: i64, supplied: i64) -> Books {
        Books {
            stock: supplied - sold,
            orders: sold,
            sold,
            supplied,
            users_with_several_orders: 0,
        }
    }

    fn row(strategy: LockStrategy, verdict: Verdict, time_bound: bool) -> Row {
        Row {
            strategy,
            batch_max: 1,
            stock: verdict.books.supplied,
            outcome: Ok(Figures {
                orders_per_sec: 300.0,
                p50_ms: 1.0,
                p99_ms: 2.0,
                created_p50_ms: 1.0,
                created_p99_ms: 2.0,
                oversold: (verdict.books.sold - verdict.books.supplied).max(0),
                lost_updates: 0,
                busy_share: 0.0,
                split: vec![],
                verdict,
                orders_over_time: vec![],
                time_bound,
            }),
        }
    }

    #[test]
    fn a_safe_run_that_kept_its_books_until_the_time_bound_is_incomplete_not_failed() {
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(36_717, 50_000)),
            true,
        );

        let verdict = row.verdict();

        assert_eq!(
            verdict,
            RowVerdict::Incomplete {
                sold: 36_717,
                supplied: 50_000
            }
        );
        assert_eq!(
            verdict.to_string(),
            "INCOMPLETE: time bound, 36717 of 50000 sold"
        );
        assert!(!verdict.fails_the_demo());
    }

    #[test]
    fn a_run_that_sold_nothing_of_one_product_by_the_time_bound_fails() {
        let mut figures = verdict(&[SALE_HAPPENED], sold(36_717, 50_000));
        figures.products = vec![(1, sold(36_717, 25_000)), (2, sold(0, 25_000))];
        let row = row(LockStrategy::Redis, figures, true);

        assert_eq!(row.verdict(), RowVerdict::Fail(vec![SALE_HAPPENED]));
        assert!(row.verdict().fails_the_demo());
    }

    #[test]
    fn a_broken_invariant_fails_the_demo_even_when_the_time_bound_was_reached() {
        for broken in [
            NO_OVERSELL,
            NO_LOST_UPDATE,
            ONE_ORDER_PER_USER,
            NO_SERVER_ERROR,
            BUSY_SHARE,
        ] {
            let row = row(
                LockStrategy::PgAtomic,
                verdict(&[SALE_HAPPENED, broken], sold(1_000, 5_000)),
                true,
            );

            let verdict = row.verdict();

            assert_eq!(verdict, RowVerdict::Fail(vec![SALE_HAPPENED, broken]));
            assert!(verdict.fails_the_demo(), "{broken}");
        }
    }

    #[test]
    fn an_unfinished_sale_that_did_not_reach_the_time_bound_fails() {
        // Stopped by something else (a goose threshold): not the time bound.
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(100, 5_000)),
            false,
        );
        assert_eq!(row.verdict(), RowVerdict::Fail(vec![SALE_HAPPENED]));
        assert!(row.verdict().fails_the_demo());
    }

    #[test]
    fn a_run_that_sold_nothing_within_the_time_bound_fails() {
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(0, 5_000)),
            true,
        );
        assert!(row.verdict().fails_the_demo(), "{}", row.verdict());
    }

    #[test]
    fn a_safe_run_that_sold_out_and_kept_its_books_passes() {
        let row = row(LockStrategy::PgRow, verdict(&[], sold(5_000, 5_000)), false);
        assert_eq!(row.verdict(), RowVerdict::Pass);
        assert_eq!(row.verdict().to_string(), "PASS");
    }

    #[test]
    fn none_must_break_the_books_and_nothing_else() {
        let oversold = row(
            LockStrategy::None,
            verdict(&[NO_OVERSELL, NO_LOST_UPDATE], sold(7_500, 5_000)),
            false,
        );
        assert_eq!(oversold.verdict(), RowVerdict::FailedAsExpected);
        assert!(!oversold.verdict().fails_the_demo());

        let race_hidden = row(LockStrategy::None, verdict(&[], sold(5_000, 5_000)), false);
        assert!(race_hidden.verdict().fails_the_demo());
        assert!(race_hidden.verdict().to_string().starts_with("UNEXPECTED"));

        let with_errors = row(
            LockStrategy::None,
            verdict(&[NO_OVERSELL, NO_SERVER_ERROR], sold(7_500, 5_000)),
            false,
        );
        assert_eq!(
            with_errors.verdict(),
            RowVerdict::Fail(vec![NO_SERVER_ERROR])
        );
    }

    #[test]
    fn a_run_that_could_not_be_made_fails_the_demo() {
        let row = Row {
            strategy: LockStrategy::Redlock,
            batch_max: 64,
            stock: 100,
            outcome: Err("no master answered".into()),
        };
        assert_eq!(row.verdict().to_string(), "ERROR: no master answered");
        assert!(row.verdict().fails_the_demo());
    }

    #[test]
    fn per_request_runs_sell_their_own_stock_to_as_many_buyers_per_unit() {
        use clap::Parser;
        let cli = crate::cli::Cli::parse_from(["loadtest", "demo"]);
        let Some(crate::cli::Command::Demo(args)) = cli.command else {
            panic!("not the demo");
        };
        let planned = runs(&args);
        let batched = planned.iter().find(|r| r.batch_max > 1).unwrap();
        let per_request = planned.iter().find(|r| r.batch_max == 1).unwrap();
        assert_eq!(per_request.stock, args.per_request_stock);
        assert_eq!(
            per_request.buyers * batched.stock as u64,
            batched.buyers * per_request.stock as u64
        );

        // Never more than the batched runs sell.
        let cli =
            crate::cli::Cli::parse_from(["loadtest", "demo", "--stock", "300", "--buyers", "600"]);
        let Some(crate::cli::Command::Demo(args)) = cli.command else {
            panic!("not the demo");
        };
        let per_request = runs(&args).into_iter().find(|r| r.batch_max == 1).unwrap();
        assert_eq!((per_request.stock, per_request.buyers), (300, 600));
    }

    fn demo_args(extra: &[&str]) -> DemoArgs {
        use clap::Parser;
        let line = ["loadtest", "demo"].iter().chain(extra).copied();
        let cli = crate::cli::Cli::parse_from(line);
        let Some(crate::cli::Command::Demo(args)) = cli.command else {
            panic!("not the demo");
        };
        args
    }

    #[test]
    fn every_run_must_have_a_unit_and_a_buyer_for_each_product() {
        let args = demo_args(&["--products", "4"]);
        assert_eq!(check_products(&args, &runs(&args)), Ok(()));
        assert_eq!(args.products, 4);
        assert_eq!(demo_args(&[]).products, 1);

        let args = demo_args(&["--products", "4", "--per-request-stock", "3"]);
        let refused = check_products(&args, &runs(&args)).unwrap_err();
        assert!(refused.contains("3 units"), "{refused}");
    }

    #[test]
    fn the_default_demo_runs_zookeeper_and_etcd_batched_like_the_other_locks() {
        let planned = runs(&demo_args(&[]));
        for strategy in [
            LockStrategy::Redis,
            LockStrategy::Redlock,
            LockStrategy::PgLock,
            LockStrategy::ZooKeeper,
            LockStrategy::Etcd,
        ] {
            let batched = planned
                .iter()
                .filter(|r| r.strategy == strategy && r.batch_max > 1)
                .collect::<Vec<_>>();
            assert_eq!(batched.len(), 1, "{strategy:?}: {planned:?}");
            assert_eq!(batched[0].batch_max, 256, "{strategy:?}");
            assert_eq!(batched[0].stock, 25_000, "{strategy:?}");
        }
        assert!(announce(&demo_args(&[]), &planned).starts_with("demo: 11 runs"));
    }

    #[test]
    fn the_zookeeper_runs_settings_are_accepted_by_the_service_and_granted_by_the_server() {
        use clap::{CommandFactory, Parser};
        let mut line: Vec<String> = ["seckill", "--database-url", "postgres://x"]
            .map(String::from)
            .to_vec();
        let env = [
            ("LOCK_STRATEGY", "zookeeper".to_owned()),
            ("LOCK_TTL_MS", LOCK_TTL_MS.to_string()),
        ]
        .into_iter()
        .chain(consensus_settings(
            LockStrategy::ZooKeeper,
            Some("127.0.0.1:2181"),
            None,
        ));
        // Each as its flag, so that a renamed setting fails here rather than at the demo.
        let command = seckill::Settings::command();
        for (name, value) in env {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == name))
                .unwrap_or_else(|| panic!("{name} is not a seckill setting"));
            line.push(format!("--{}", arg.get_long().unwrap()));
            line.push(value);
        }
        let settings = seckill::Settings::try_parse_from(&line).unwrap();

        assert_eq!(settings.lock.zookeeper_connect, "127.0.0.1:2181");
        assert_eq!(settings.check(), Ok(()));
        // What the private ZooKeeper grants: the service refuses a shorter session.
        let asked = settings.lock.zookeeper_session_timeout;
        assert!(
            asked.as_millis() <= u128::from(servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS),
            "the private ZooKeeper would grant {} ms, less than the {} ms asked",
            servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS,
            asked.as_millis()
        );
        assert!(asked >= 2 * settings.lock.ttl);
    }

    #[test]
    fn only_the_consensus_runs_are_pointed_at_a_consensus_server() {
        let zk = Some("127.0.0.1:1");
        let etcd = Some("http://127.0.0.1:2");
        let names = |strategy| -> Vec<&str> {
            consensus_settings(strategy, zk, etcd)
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        assert_eq!(
            consensus_settings(LockStrategy::Etcd, zk, etcd),
            vec![("ETCD_ENDPOINTS", "http://127.0.0.1:2".to_owned())]
        );
        assert_eq!(
            names(LockStrategy::ZooKeeper),
            ["ZOOKEEPER_CONNECT", "ZOOKEEPER_SESSION_TIMEOUT_MS"]
        );
        assert!(names(LockStrategy::Redis).is_empty());
    }

    #[test]
    fn a_missing_consensus_server_says_how_to_run_the_demo_without_it() {
        assert_eq!(
            without(LockStrategy::ZooKeeper, &demo_args(&[])),
            "to run the demo without zookeeper: --strategies redis,redlock,pg-lock,etcd,pg-row,pg-optimistic,pg-atomic,none"
        );
        let args = demo_args(&["--strategies", "etcd,none", "--per-request", "etcd,redis"]);
        assert_eq!(
            without(LockStrategy::Etcd, &args),
            r#"to run the demo without etcd: --strategies none --per-request "redis""#
        );
    }

    #[test]
    fn the_command_line_hides_passwords_and_quotes_empty_arguments() {
        let args: Vec<String> = [
            "demo",
            "--database-url",
            "postgres://me:hunter2@db/x",
            "--per-request",
            "",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            command_line(&args),
            r#"loadtest demo --database-url postgres://***@db/x --per-request """#
        );
    }
}
