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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use distlock::{LockOptions, Locker, ReleaseSignals};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

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
        return consensus(&args, conn, run_for, &prefix).await;
    }

    if matches!(args.mode, Mode::Contended | Mode::All) {
        contended(&args, conn.clone(), run_for, &prefix).await?;
    }
    // Rounds alternate between the two crates so that both see the same machine load;
    // the medians are compared.
    let mut options = LockOptions::builder();
    if args.no_watchdog {
        options = options.without_watchdog();
    }
    if args.wait_replicas > 0 {
        options = options.wait_for_replicas(args.wait_replicas, Duration::from_millis(100));
    }
    let options = options.build()?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut our_cpu, mut their_cpu) = (Vec::new(), Vec::new());
    let (mut our_server, mut their_server) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        // Alternate which crate goes first, so neither always inherits the other's wake.
        let order = if round % 2 == 1 {
            [Mode::Rslock, Mode::Uncontended]
        } else {
            [Mode::Uncontended, Mode::Rslock]
        };
        for mode in order {
            if !matches!(args.mode, Mode::All) && args.mode != mode {
                continue;
            }
            let cpu_before = process_cpu();
            let server_before = server_cpu(&conn).await?;
            let (rate, cycles_in) = if mode == Mode::Rslock {
                rslock_cycles(&args.redis_url, args.concurrency, run_for, &prefix).await?
            } else if args.multiplexed {
                let client = redis::Client::open(args.redis_url.as_str())?;
                let conn = client.get_multiplexed_async_connection().await?;
                uncontended(
                    Locker::new(conn, options.clone())?,
                    args.concurrency,
                    run_for,
                    &prefix,
                )
                .await?
            } else {
                let locker = Locker::new(conn.clone(), options.clone())?;
                uncontended(locker, args.concurrency, run_for, &prefix).await?
            };
            let cpu_us = (process_cpu() - cpu_before).as_secs_f64() * 1e6 / cycles_in as f64;
            let server_us = (server_cpu(&conn).await? - server_before) * 1e6 / cycles_in as f64;
            let name = if mode == Mode::Rslock {
                "rslock"
            } else {
                "distlock"
            };
            println!(
                "round {round}: {name} cycles/s {rate:.0}, client cpu {cpu_us:.1} us/cycle, redis cpu {server_us:.1} us/cycle"
            );
            if mode == Mode::Rslock {
                theirs.push(rate);
                their_cpu.push(cpu_us);
                their_server.push(server_us);
            } else {
                ours.push(rate);
                our_cpu.push(cpu_us);
                our_server.push(server_us);
            }
        }
    }
    if !theirs.is_empty() {
        println!(
            "rslock 0.10 uncontended (no watchdog, no fence): median {:.0} cycles/s, {:.1} us client cpu/cycle, {:.1} us redis cpu/cycle",
            median(&mut theirs),
            median(&mut their_cpu),
            median(&mut their_server)
        );
    }
    if !ours.is_empty() {
        let watchdog = if args.no_watchdog { "off" } else { "on" };
        let rate = median(&mut ours);
        println!(
            "distlock uncontended (watchdog {watchdog}, fence on, replica wait {}): median {rate:.0} cycles/s, {:.1} us client cpu/cycle, {:.1} us redis cpu/cycle",
            args.wait_replicas,
            median(&mut our_cpu),
            median(&mut our_server)
        );
        if !theirs.is_empty() {
            println!(
                "distlock / rslock: throughput {:.2}, client cpu per cycle {:.2}, redis cpu per cycle {:.2}",
                rate / median(&mut theirs),
                median(&mut our_cpu) / median(&mut their_cpu),
                median(&mut our_server) / median(&mut their_server)
            );
        }
        println!("cycles_per_sec={rate:.0}");
    }
    Ok(())
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat` (Linux).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    // Linux reports them in USER_HZ, which is 100 on every mainstream build.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// CPU time (user + system) the Redis server has used so far, in seconds (`INFO cpu`; Redis
/// is shared, so other clients' work counts too: run the bench on a quiet Redis).
async fn server_cpu(conn: &ConnectionManager) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn.clone())
        .await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

/// Deletes the run's keys when the run ends, however it ends: every lock leaves a fence
/// counter, which has no TTL by design.
struct Cleanup {
    url: String,
    prefix: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let clean = || -> redis::RedisResult<()> {
            let mut conn = redis::Client::open(self.url.as_str())?.get_connection()?;
            // rslock's keys start with the prefix; ours too, and their fences with `{prefix`.
            for pattern in [format!("{}*", self.prefix), format!("{{{}*", self.prefix)] {
                let keys: Vec<String> = redis::cmd("SCAN")
                    .cursor_arg(0)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .clone()
                    .iter(&mut conn)?
                    .collect::<redis::RedisResult<_>>()?;
                for chunk in keys.chunks(500) {
                    redis::cmd("DEL").arg(chunk).exec(&mut conn)?;
                }
            }
            Ok(())
        };
        if let Err(error) = clean() {
            eprintln!(
                "could not delete the bench's keys under {}: {error}",
                self.prefix
            );
        }
    }
}

fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Acquire + release cycles per second, each task on its own key.
async fn uncontended<C>(
    locker: Locker<C>,
    concurrency: usize,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<(f64, u64)>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let cycles = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (locker, cycles) = (locker.clone(), Arc::clone(&cycles));
        let key = format!("{prefix}:u:{i}");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let guard = locker.try_acquire(&key).await?;
                anyhow::ensure!(
                    guard.release().await?.was_held(),
                    "lost an uncontended lock"
                );
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    let cycles = cycles.load(Ordering::Relaxed);
    Ok((cycles as f64 / started.elapsed().as_secs_f64(), cycles))
}

/// The same loop with rslock, on the same Redis.
async fn rslock_cycles(
    url: &str,
    concurrency: usize,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<(f64, u64)> {
    let manager = Arc::new(rslock::LockManager::new(vec![url.to_owned()]));
    let cycles = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (manager, cycles) = (Arc::clone(&manager), Arc::clone(&cycles));
        let key = format!("{prefix}:r:{i}");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let lock = manager
                    .lock(key.as_bytes(), Duration::from_secs(10))
                    .await
                    .map_err(|e| anyhow::anyhow!("rslock: {e:?}"))?;
                manager.unlock(&lock).await;
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    let cycles = cycles.load(Ordering::Relaxed);
    Ok((cycles as f64 / started.elapsed().as_secs_f64(), cycles))
}

/// How waiters wait in the contended mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// Jittered backoff between attempts (no release signals).
    Poll,
    /// Release signals: woken by the holder's release, one turn at a time in this process.
    Signal,
}

/// Tasks fighting over one key, polling and with release signals in alternating rounds:
/// median handoffs per second and p50/p99 wait for the lock of each.
async fn contended(
    args: &Args,
    conn: ConnectionManager,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<()> {
    let options = LockOptions::builder()
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(20))
        .build()?;
    let signals = ReleaseSignals::connect(&redis::Client::open(args.redis_url.as_str())?).await?;
    let polling = Locker::new(conn.clone(), options.clone())?;
    let signalled = Locker::new(conn, options)?.with_release_signals(signals);
    let key = format!("{prefix}:contended");
    let mut results: Vec<(Waiting, f64, Duration, Duration)> = Vec::new();
    for round in 1..=args.rounds {
        let order = if round % 2 == 1 {
            [Waiting::Poll, Waiting::Signal]
        } else {
            [Waiting::Signal, Waiting::Poll]
        };
        for waiting in order {
            let locker = match waiting {
                Waiting::Poll => polling.clone(),
                Waiting::Signal => signalled.clone(),
            };
            let (rate, p50, p99) =
                contended_round(&locker, &key, args.concurrency, run_for).await?;
            println!(
                "round {round}: contended {waiting:?}: handoffs_per_sec={rate:.0} wait_p50={p50:?} wait_p99={p99:?}"
            );
            results.push((waiting, rate, p50, p99));
        }
    }
    let summary = |waiting: Waiting| {
        let mut rates: Vec<f64> = results
            .iter()
            .filter(|r| r.0 == waiting)
            .map(|r| r.1)
            .collect();
        let mut p50s: Vec<Duration> = results
            .iter()
            .filter(|r| r.0 == waiting)
            .map(|r| r.2)
            .collect();
        let mut p99s: Vec<Duration> = results
            .iter()
            .filter(|r| r.0 == waiting)
            .map(|r| r.3)
            .collect();
        p50s.sort_unstable();
        p99s.sort_unstable();
        (
            median(&mut rates),
            p50s[p50s.len() / 2],
            p99s[p99s.len() / 2],
        )
    };
    let (poll_rate, poll_p50, poll_p99) = summary(Waiting::Poll);
    let (signal_rate, signal_p50, signal_p99) = summary(Waiting::Signal);
    println!(
        "distlock contended (1 key, {} tasks), medians of {} rounds:\n  polling: handoffs_per_sec={poll_rate:.0} wait_p50={poll_p50:?} wait_p99={poll_p99:?}\n  signals: handoffs_per_sec={signal_rate:.0} wait_p50={signal_p50:?} wait_p99={signal_p99:?}\n  signals / polling: handoffs {:.2}",
        args.concurrency,
        args.rounds,
        signal_rate / poll_rate
    );
    Ok(())
}

/// The contended loop on each backend in turn, in alternating rounds: Redis with release
/// signals against ZooKeeper and etcd, which keep their own line of waiters.
#[cfg(all(feature = "zookeeper", feature = "etcd"))]
async fn consensus(
    args: &Args,
    conn: ConnectionManager,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<()> {
    use distlock::{EtcdLock, ZkLock};
    // A ttl of at most half the ZooKeeper session (`ZkLock::max_ttl`), the same for all three.
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(60))
        .build()?;
    let signals = ReleaseSignals::connect(&redis::Client::open(args.redis_url.as_str())?).await?;
    let redis = Locker::new(conn, options.clone())?.with_release_signals(signals);
    let zk = ZkLock::builder(args.zookeeper.clone())
        .session_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("ZooKeeper at {}: {e}", args.zookeeper))?;
    let zookeeper = Locker::new(zk, options.clone())?;
    let etcd = EtcdLock::connect(&args.etcd)
        .await
        .map_err(|e| anyhow::anyhow!("etcd at {:?}: {e}", args.etcd))?;
    let etcd = Locker::new(etcd, options)?;
    // Keys without the Redis prefix's `:` (ZooKeeper and etcd keys may not hold `/`).
    let key = format!("{}-contended", prefix.replace(':', "-"));
    let names = ["redis", "zookeeper", "etcd"];
    let mut results: Vec<(usize, f64, Duration, Duration)> = Vec::new();
    for round in 1..=args.rounds {
        // Rotate which backend goes first.
        for i in 0..names.len() {
            let which = (i + round) % names.len();
            let (rate, p50, p99) = match which {
                0 => contended_round(&redis, &key, args.concurrency, run_for).await?,
                1 => contended_round(&zookeeper, &key, args.concurrency, run_for).await?,
                _ => contended_round(&etcd, &key, args.concurrency, run_for).await?,
            };
            println!(
                "round {round}: {}: handoffs_per_sec={rate:.0} wait_p50={p50:?} wait_p99={p99:?}",
                names[which]
            );
            results.push((which, rate, p50, p99));
        }
    }
    println!(
        "contended (1 key, {} tasks in one process), medians of {} rounds:",
        args.concurrency, args.rounds
    );
    let mut redis_rate = 0.0;
    for (which, name) in names.iter().enumerate() {
        let mine = results.iter().filter(|r| r.0 == which);
        let mut rates: Vec<f64> = mine.clone().map(|r| r.1).collect();
        let mut p50s: Vec<Duration> = mine.clone().map(|r| r.2).collect();
        let mut p99s: Vec<Duration> = mine.map(|r| r.3).collect();
        p50s.sort_unstable();
        p99s.sort_unstable();
        let rate = median(&mut rates);
        if which == 0 {
            redis_rate = rate;
        }
        println!(
            "  {name}: handoffs_per_sec={rate:.0} wait_p50={:?} wait_p99={:?} handoffs_vs_redis={:.3}",
            p50s[p50s.len() / 2],
            p99s[p99s.len() / 2],
            rate / redis_rate
        );
    }
    Ok(())
}

#[cfg(not(all(feature = "zookeeper", feature = "etcd")))]
async fn consensus(_: &Args, _: ConnectionManager, _: Duration, _: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "--mode consensus needs the ZooKeeper and etcd backends: run with --features zookeeper,etcd"
    )
}

/// One round of the contended mode: handoffs per second, p50 and p99 of the wait.
async fn contended_round<B: distlock::Backend>(
    locker: &Locker<B>,
    key: &str,
    concurrency: usize,
    run_for: Duration,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (locker, key) = (locker.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < end {
                let asked = Instant::now();
                let guard = locker.acquire(&key).await?;
                waits.push(asked.elapsed());
                anyhow::ensure!(guard.release().await?.was_held(), "lost a contended lock");
            }
            anyhow::Ok(waits)
        }));
    }
    let started = Instant::now();
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    waits.sort_unstable();
    let pct = |p: f64| waits[((waits.len() - 1) as f64 * p) as usize];
    Ok((waits.len() as f64 / elapsed, pct(0.50), pct(0.99)))
}
