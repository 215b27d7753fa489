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
//! - `contended`: `--concurrency` tasks fighting over one key; reports handoffs/s and the
//!   p50/p99 wait for the lock.
//! - `all`: contended, then `--rounds` rounds alternating rslock and distlock uncontended.
//!
//! The machine's load varies from second to second, so the uncontended loops run in
//! alternating rounds and their medians are compared. The last line is
//! `cycles_per_sec=N`, distlock's uncontended median (when it ran).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use distlock::{LockOptions, Locker};
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
    /// Uncontended runs per crate; the median is reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Turn the watchdog off in the uncontended loop (to see what it costs).
    #[arg(long)]
    no_watchdog: bool,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::All)]
    mode: Mode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Uncontended,
    Rslock,
    Contended,
    All,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be above zero");
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let run_for = Duration::from_secs_f64(args.seconds);
    let prefix = format!("distlock-bench:{}", std::process::id());
    println!(
        "redis={} concurrency={} seconds={} rounds={}",
        args.redis_url, args.concurrency, args.seconds, args.rounds
    );
    let conn = ConnectionManager::new(redis::Client::open(args.redis_url.as_str())?).await?;

    if matches!(args.mode, Mode::Contended | Mode::All) {
        contended(conn.clone(), args.concurrency, run_for, &prefix).await?;
    }
    // Rounds alternate between the two crates so that both see the same machine load;
    // the medians are compared.
    let options = if args.no_watchdog {
        LockOptions::builder().without_watchdog().build()?
    } else {
        LockOptions::default()
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        if matches!(args.mode, Mode::Rslock | Mode::All) {
            let rate = rslock_cycles(&args.redis_url, args.concurrency, run_for, &prefix).await?;
            println!("round {round}: rslock cycles/s {rate:.0}");
            theirs.push(rate);
        }
        if matches!(args.mode, Mode::Uncontended | Mode::All) {
            let locker = Locker::new(conn.clone(), options.clone());
            let rate = uncontended(locker, args.concurrency, run_for, &prefix).await?;
            println!("round {round}: distlock cycles/s {rate:.0}");
            ours.push(rate);
        }
    }
    if !theirs.is_empty() {
        println!(
            "rslock 0.10 uncontended (no watchdog, no fence): median cycles_per_sec={:.0}",
            median(&mut theirs)
        );
    }
    if !ours.is_empty() {
        let watchdog = if args.no_watchdog { "off" } else { "on" };
        let ours = median(&mut ours);
        if !theirs.is_empty() {
            println!("distlock / rslock = {:.2}", ours / median(&mut theirs));
        }
        println!("distlock uncontended (watchdog {watchdog}, fence on): median");
        println!("cycles_per_sec={ours:.0}");
    }
    Ok(())
}

fn median(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Acquire + release cycles per second, each task on its own key.
async fn uncontended(
    locker: Locker<ConnectionManager>,
    concurrency: usize,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<f64> {
    let cycles = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (locker, cycles) = (locker.clone(), Arc::clone(&cycles));
        let key = format!("{prefix}:u:{i}");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let guard = locker.try_acquire(&key).await?;
                anyhow::ensure!(guard.release().await?, "lost an uncontended lock");
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    Ok(cycles.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// The same loop with rslock, on the same Redis.
async fn rslock_cycles(
    url: &str,
    concurrency: usize,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<f64> {
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
    Ok(cycles.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Tasks fighting over one key: handoffs per second and the wait for the lock.
async fn contended(
    conn: ConnectionManager,
    concurrency: usize,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<()> {
    let options = LockOptions::builder()
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(20))
        .build()?;
    let locker = Locker::new(conn, options);
    let key = format!("{prefix}:contended");
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (locker, key) = (locker.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < end {
                let asked = Instant::now();
                let guard = locker.acquire(&key).await?;
                waits.push(asked.elapsed());
                guard.release().await?;
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
    println!(
        "distlock contended (1 key): handoffs_per_sec={:.0} wait_p50={:?} wait_p99={:?}",
        waits.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99)
    );
    Ok(())
}
