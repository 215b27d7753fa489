//! The contended loops: tasks fighting over one key, waiting by polling or by release
//! signals, and (`--mode consensus`) the same on Redis, ZooKeeper and etcd.

use std::time::Duration;

use distlock::{LockOptions, Locker, ReleaseSignals};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::{Args, median};

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
pub(crate) async fn contended(
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
pub(crate) async fn consensus(
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
pub(crate) async fn consensus(
    _: &Args,
    _: ConnectionManager,
    _: Duration,
    _: &str,
) -> anyhow::Result<()> {
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
