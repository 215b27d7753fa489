//! Lock throughput, measured against a real Redis.
//!
//! ```text
//! cargo run --release -p distlock --example bench -- --concurrency 50 --seconds 5
//! ```
//!
//! Modes (`--mode`, default `all`):
//! - `uncontended`: `--concurrency` tasks, each on its own key, doing acquire + release as
//!   fast as they can through one multiplexed connection, watchdog on as shipped.
//! - `rslock`: the same loop with the rslock crate (no watchdog, no fence), for comparison.
//! - `contended`: `--concurrency` tasks fighting over one key, in `--rounds` rounds that
//!   alternate between waiting by polling (backoff, as without release signals) and waiting
//!   for release signals (`Locker::with_release_signals`); reports the median handoffs/s and
//!   the p50/p99 wait for the lock of each, and their ratio.
//! - `all`: contended, then `--rounds` rounds alternating rslock and distlock uncontended.
//! - `consensus` (built with `--features zookeeper,etcd`): the contended loop on Redis (with
//!   release signals), ZooKeeper (`--zookeeper`) and etcd (`--etcd`) in alternating rounds
//!   of the same run: handoffs/s and the p50/p99 wait of each, and their ratios to Redis.
//!
//! The machine's load varies from second to second, so the uncontended loops run in
//! alternating rounds and their medians are compared. The last line is
//! `cycles_per_sec=N`, distlock's uncontended median (when it ran). Each uncontended round
//! also reports the client's CPU and the Redis server's CPU per cycle (from `INFO cpu`), so
//! what the fence's scripts cost Redis shows beside rslock's, in the same run.
//! `--wait-replicas N` makes each distlock acquisition wait for N replicas (`WAIT`), to
//! see what that costs (against a Redis that has replicas).

use std::time::Duration;

use clap::{Parser, ValueEnum};
use redis::aio::ConnectionManager;

mod contended;
mod uncontended;

#[derive(Parser, Debug)]
#[command(about = "Measure distlock acquire/release throughput against a real Redis")]
struct Args {
    /// Redis to measure against.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Seconds per measured run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Tokio worker threads for the benchmark. On a small machine that also runs Redis,
    /// one leaves Redis a core of its own; both crates get the same runtime either way.
    #[arg(long, default_value_t = 1)]
    worker_threads: usize,
    /// Uncontended runs per crate; the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Turn the watchdog off in the uncontended loop (to see what it costs).
    #[arg(long)]
    no_watchdog: bool,
    /// Use a plain `MultiplexedConnection` (as rslock does) instead of a `ConnectionManager`.
    #[arg(long)]
    multiplexed: bool,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::All)]
    mode: Mode,
    /// In distlock's uncontended loop, wait for this many replicas to acknowledge each
    /// acquisition (`wait_for_replicas`, up to 100 ms each); 0: no wait. Needs a Redis with
    /// that many replicas at `--redis-url`.
    #[arg(long, default_value_t = 0)]
    wait_replicas: u32,
    /// ZooKeeper ensemble for `--mode consensus` (`host:port,...`).
    #[arg(long, default_value = "127.0.0.1:2181")]
    zookeeper: String,
    /// etcd endpoints for `--mode consensus` (comma-separated).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    etcd: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// distlock, uncontended.
    Uncontended,
    /// rslock, uncontended.
    Rslock,
    /// distlock, one key.
    Contended,
    /// Contended, then alternating rounds of both uncontended loops.
    All,
    /// Contended on Redis, ZooKeeper and etcd, in alternating rounds.
    Consensus,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.worker_threads > 0,
        "--worker-threads must be at least 1"
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.worker_threads)
        .enable_all()
        .build()?
        .block_on(run(args))
}

/// The run's phases: the contended loop, or the consensus stores, then the uncontended
/// rounds and their comparison.
async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be above zero");
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let run_for = Duration::from_secs_f64(args.seconds);
    let prefix = format!("distlock-bench:{}", std::process::id());
    // Every lock leaves a fence counter, which has no TTL by design: the run's keys (rslock's
    // `<prefix>...` and ours, with `{<prefix>...}:fence`) are deleted however the run ends.
    let _cleanup = Cleanup {
        url: args.redis_url.clone(),
        prefix: prefix.clone(),
    };
    println!(
        "redis={} concurrency={} seconds={} rounds={} worker_threads={}",
        args.redis_url, args.concurrency, args.seconds, args.rounds, args.worker_threads
    );
    let conn = ConnectionManager::new(redis::Client::open(args.redis_url.as_str())?).await?;
    if args.mode == Mode::Consensus {
        return contended::consensus(&args, conn, run_for, &prefix).await;
    }
    if matches!(args.mode, Mode::Contended | Mode::All) {
        contended::contended(&args, conn.clone(), run_for, &prefix).await?;
    }
    let (mut ours, mut theirs) = uncontended::rounds(&args, &conn, run_for, &prefix).await?;
    uncontended::report(&args, &mut ours, &mut theirs);
    Ok(())
}

/// Deletes the run's keys when the run ends, however it ends: every lock leaves a fence
/// counter, which has no TTL by design.
struct Cleanup {
    url: String,
    prefix: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // rslock's keys start with the prefix; ours too, and their fences with `{prefix`.
        if let Err(error) = servers::forget_prefix(&self.url, &self.prefix) {
            eprintln!(
                "could not delete the bench's keys under {}: {error}",
                self.prefix
            );
        }
    }
}

/// The middle of `rates` (sorted in place).
fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}
