//! The uncontended loops: distlock and rslock in alternating rounds, each task on its own
//! key, with the client's and the Redis server's CPU per cycle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::{Args, Mode, median};

/// One crate's figures over the rounds: cycles per second, and the client's and the Redis
/// server's CPU per cycle, in microseconds.
#[derive(Default)]
pub(crate) struct Samples {
    rate: Vec<f64>,
    client_cpu: Vec<f64>,
    server_cpu: Vec<f64>,
}

impl Samples {
    fn is_empty(&self) -> bool {
        self.rate.is_empty()
    }

    /// The medians: cycles/s, client CPU and Redis CPU per cycle.
    fn medians(&mut self) -> (f64, f64, f64) {
        (
            median(&mut self.rate),
            median(&mut self.client_cpu),
            median(&mut self.server_cpu),
        )
    }
}

/// The options distlock's uncontended loop runs with.
fn options(args: &Args) -> anyhow::Result<LockOptions> {
    let mut options = LockOptions::builder();
    if args.no_watchdog {
        options = options.without_watchdog();
    }
    if args.wait_replicas > 0 {
        options = options.wait_for_replicas(args.wait_replicas, Duration::from_millis(100));
    }
    Ok(options.build()?)
}

/// Rounds alternating between the two crates so that both see the same machine load (the
/// medians are compared): distlock's samples, then rslock's.
pub(crate) async fn rounds(
    args: &Args,
    conn: &ConnectionManager,
    run_for: Duration,
    prefix: &str,
) -> anyhow::Result<(Samples, Samples)> {
    let options = options(args)?;
    let (mut ours, mut theirs) = (Samples::default(), Samples::default());
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
            let server_before = server_cpu(conn).await?;
            let (rate, cycles_in) = if mode == Mode::Rslock {
                rslock_cycles(&args.redis_url, args.concurrency, run_for, prefix).await?
            } else if args.multiplexed {
                let client = redis::Client::open(args.redis_url.as_str())?;
                let conn = client.get_multiplexed_async_connection().await?;
                cycles(
                    Locker::new(conn, options.clone())?,
                    args.concurrency,
                    run_for,
                    prefix,
                )
                .await?
            } else {
                let locker = Locker::new(conn.clone(), options.clone())?;
                cycles(locker, args.concurrency, run_for, prefix).await?
            };
            let cpu_us = (process_cpu() - cpu_before).as_secs_f64() * 1e6 / cycles_in as f64;
            let server_us = (server_cpu(conn).await? - server_before) * 1e6 / cycles_in as f64;
            let (name, samples) = if mode == Mode::Rslock {
                ("rslock", &mut theirs)
            } else {
                ("distlock", &mut ours)
            };
            println!(
                "round {round}: {name} cycles/s {rate:.0} ({cycles_in} cycles), client cpu {cpu_us:.1} us/cycle, redis cpu {server_us:.1} us/cycle"
            );
            samples.rate.push(rate);
            samples.client_cpu.push(cpu_us);
            samples.server_cpu.push(server_us);
        }
    }
    Ok((ours, theirs))
}

/// Print each crate's medians, their ratios, and last `cycles_per_sec=N` (distlock's).
pub(crate) fn report(args: &Args, ours: &mut Samples, theirs: &mut Samples) {
    let their_medians = (!theirs.is_empty()).then(|| theirs.medians());
    if let Some((rate, cpu, server)) = their_medians {
        println!(
            "rslock 0.10 uncontended (no watchdog, no fence): median {rate:.0} cycles/s, {cpu:.1} us client cpu/cycle, {server:.1} us redis cpu/cycle"
        );
    }
    if ours.is_empty() {
        return;
    }
    let watchdog = if args.no_watchdog { "off" } else { "on" };
    let (rate, cpu, server) = ours.medians();
    println!(
        "distlock uncontended (watchdog {watchdog}, fence on, replica wait {}): median {rate:.0} cycles/s, {cpu:.1} us client cpu/cycle, {server:.1} us redis cpu/cycle",
        args.wait_replicas,
    );
    if let Some((their_rate, their_cpu, their_server)) = their_medians {
        println!(
            "distlock / rslock: throughput {:.2}, client cpu per cycle {:.2}, redis cpu per cycle {:.2}",
            rate / their_rate,
            cpu / their_cpu,
            server / their_server
        );
    }
    println!("cycles_per_sec={rate:.0}");
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

/// Acquire + release cycles per second, each task on its own key.
pub(crate) async fn cycles<C>(
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
