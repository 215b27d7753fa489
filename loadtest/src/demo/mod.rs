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
//!
//! **Layout.** [`run`] plans the runs, starts the `Backends` they stand on, runs each
//! (`setup`: a database, instances, the attack, the books) into a [`Row`] (`row`: its
//! figures and verdict), then prints the table and draws the chart (`table`); `run_info`
//! says when, where and how.

mod row;
mod run_info;
mod setup;
mod table;

use std::time::{Duration, Instant};

use anyhow::Context;
use seckill::LockStrategy;

use crate::attack::Cancel;
use crate::cli::DemoArgs;
use crate::servers::{self, Server};
pub use row::{Figures, Row, RowVerdict};
pub use run_info::{RunInfo, command_line, machine};
use setup::Setup;
pub use table::table;

pub(super) const ADMIN_TOKEN: &str = "loadtest-demo-admin-token-0123456789";

/// LOCK_TTL_MS of the instances.
pub(super) const LOCK_TTL_MS: u64 = 5_000;

/// ZOOKEEPER_SESSION_TIMEOUT_MS of the `zookeeper` instances: the lease of their locks.
///
/// TIMING: at least [`LOCK_TTL_MS`] (the service refuses a lock that would outlive its
/// session), and at most what the private ZooKeeper grants
/// ([`servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS`]) and what a stock ZooKeeper grants (20
/// ticks of 2 s), or the instances refuse to start.
pub(super) const ZOOKEEPER_SESSION_TIMEOUT_MS: u64 = 10_000;

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
    let backends = Backends::start(&args, &runs).await?;
    let rows = run_all(&args, &cancel, &backends, &runs, started).await;
    print!("{}", table(&args, &info, &rows));
    if let Err(error) = table::draw_chart(&args, &info, &rows) {
        println!("could not draw the chart: {error:#}");
    }
    // The servers (and their directories) go when they are dropped, here.
    drop(backends);
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

/// The servers the runs stand on: found, or started for the demo. Fields drop in order, the
/// last started first.
struct Backends {
    /// Three private Redis masters for redlock, when it runs and `--redlock-urls` is empty
    /// (held only to be stopped when this is dropped).
    _masters: Vec<Server>,
    etcd: Option<Server>,
    zookeeper: Option<Server>,
    redis: Server,
    postgres: Server,
    /// The redlock runs' masters: `--redlock-urls`, or the private ones.
    redlock_urls: Vec<String>,
}

impl Backends {
    /// Find or start PostgreSQL and Redis, and what the runs need besides: ZooKeeper, etcd,
    /// redlock's masters.
    ///
    /// # Errors
    /// A server that can be neither found nor started (with how to leave its strategy out).
    async fn start(args: &DemoArgs, runs: &[Run]) -> anyhow::Result<Self> {
        let postgres = servers::postgres(args.database_url.as_deref()).await?;
        say_where("PostgreSQL", &postgres);
        let redis = servers::redis(args.redis_url.as_deref()).await?;
        say_where("Redis", &redis);
        let wants_redlock = wanted(runs, LockStrategy::Redlock);
        let zookeeper = if wanted(runs, LockStrategy::ZooKeeper) {
            let server = servers::zookeeper(args.zookeeper_connect.as_deref())
                .await
                .map_err(|e| {
                    anyhow::anyhow!("{e:#}; {}", without(LockStrategy::ZooKeeper, args))
                })?;
            say_where("ZooKeeper", &server);
            Some(server)
        } else {
            None
        };
        let etcd = if wanted(runs, LockStrategy::Etcd) {
            let server = servers::etcd(args.etcd_endpoints.as_deref())
                .await
                .map_err(|e| anyhow::anyhow!("{e:#}; {}", without(LockStrategy::Etcd, args)))?;
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
        Ok(Self {
            _masters: masters,
            etcd,
            zookeeper,
            redis,
            postgres,
            redlock_urls,
        })
    }
}

/// Every run in turn (until Ctrl-C), each a row.
async fn run_all(
    args: &DemoArgs,
    cancel: &Cancel,
    backends: &Backends,
    runs: &[Run],
    started: Instant,
) -> Vec<Row> {
    let setup = Setup {
        args,
        cancel,
        database_url: &backends.postgres.url,
        redis_url: &backends.redis.url,
        redlock_urls: &backends.redlock_urls,
        zookeeper_connect: backends.zookeeper.as_ref().map(|s| s.url.as_str()),
        etcd_endpoints: backends.etcd.as_ref().map(|s| s.url.as_str()),
    };
    let mut rows = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        if cancel.is_set() {
            break;
        }
        println!("{}", heading(args, run, i, runs.len(), started.elapsed()));
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
    rows
}

/// The line that opens run `i` (from 0) of `total`.
fn heading(args: &DemoArgs, run: &Run, i: usize, total: usize, so_far: Duration) -> String {
    let over = if args.products > 1 {
        format!(" over {} products", args.products)
    } else {
        String::new()
    };
    format!(
        "--- {} (BATCH_MAX={}), run {} of {}: {} units{over}, {} buyers; {} so far ---",
        run.strategy.name(),
        run.batch_max,
        i + 1,
        total,
        run.stock,
        run.buyers,
        clock(so_far)
    )
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
