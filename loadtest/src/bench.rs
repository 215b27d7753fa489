//! `loadtest bench-http`: one instance per configuration, measured with wrk, a load
//! generator nobody here wrote. Runs alternate between configurations round by round, and
//! every figure is the median of its rounds, so the machine's moods fall on all of them.
//!
//! 1. Orders/s on one hot product, 64 connections, every request a new buyer: each
//!    strategy batched, and `redis` and `pg-atomic` with `BATCH_MAX=1` (the per-request
//!    baseline). Orders are counted in PostgreSQL, not from wrk's status codes.
//! 2. The sold-out answer against `/healthz`, on the same instance.
//! 3. Overload: 1,000 connections against 64 on one instance under `redis`: goodput and
//!    the share of purchases that failed.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use seckill::LockStrategy;
use sqlx::PgPool;

use crate::attack::create_product;
use crate::cli::BenchArgs;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, ThrowawayDatabase};

const ADMIN_TOKEN: &str = "bench-admin-token-0123456789";

/// Every request a new buyer, in every run: run `r` (the script's argument), thread `t`
/// counts from `r * 10^11 + t * 10^9`. (Lua numbers are doubles: exact up to 2^53.)
const BUY_SCRIPT: &str = r#"
local counter = 0
local threads = 0
local base = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  base = tonumber(args[1]) * 100000000000
end
request = function()
  counter = counter + 1
  local body = '{"user_id": ' .. string.format("%.0f", base + id * 1000000000 + counter) .. '}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
"#;

/// Numbers wrk runs, so no two runs share a buyer.
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One fixed purchase: for the sold-out answer, whose cost does not depend on the buyer.
const FIXED_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.body = '{"user_id": 3}'
wrk.headers["Content-Type"] = "application/json"
"#;

/// What one wrk run reported.
#[derive(Debug, Clone, Copy, Default)]
struct Wrk {
    requests: f64,
    per_sec: f64,
    failed: f64,
}

/// One configuration under test: an instance with its database and product.
struct Subject {
    strategy: LockStrategy,
    batch: u32,
    instance: Instance,
    pool: PgPool,
    product: i64,
    database: ThrowawayDatabase,
    prefix: String,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if Command::new("wrk").arg("--version").output().is_err() {
        bail!("wrk is not installed: install it (Debian: apt-get install wrk)");
    }
    raise_open_files_limit();
    let postgres = servers::postgres(args.database_url.as_deref()).await?;
    let redis = servers::redis(args.redis_url.as_deref()).await?;
    let dir = std::env::temp_dir().join(format!("seckill-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Every subject started is kept here, so that it is removed (instance, database, keys)
    // whatever ends the run: success, an error, or Ctrl-C.
    let mut subjects = Vec::new();
    let outcome = tokio::select! {
        outcome = measure(&args, &postgres.url, &redis.url, &dir, &mut subjects) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("stopped by Ctrl-C")),
    };
    for subject in subjects {
        if let Err(error) = subject.remove(&redis.url).await {
            eprintln!("cleanup: {error:#}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

async fn measure(
    args: &BenchArgs,
    postgres_url: &str,
    redis_url: &str,
    dir: &Path,
    subjects: &mut Vec<Subject>,
) -> anyhow::Result<()> {
    let buy = dir.join("buy.lua");
    let fixed = dir.join("fixed.lua");
    let get = dir.join("get.lua");
    std::fs::write(&buy, BUY_SCRIPT)?;
    std::fs::write(&fixed, FIXED_SCRIPT)?;
    std::fs::write(&get, "wrk.method = \"GET\"\n")?;
    let seconds = args.seconds;
    let configs = [
        (LockStrategy::PgAtomic, 1),
        (LockStrategy::Redis, 1),
        (LockStrategy::PgAtomic, 64),
        (LockStrategy::PgRow, 64),
        (LockStrategy::PgLock, 64),
        (LockStrategy::Redis, 64),
    ];
    for (strategy, batch) in configs {
        subjects.push(subject(postgres_url, redis_url, strategy, batch).await?);
    }
    let mut report = String::new();
    // 1. Orders per second.
    let mut orders: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    for round in 0..args.rounds {
        for (i, s) in subjects.iter().enumerate() {
            let before = sold(&s.pool, s.product).await?;
            wrk(&s.instance.url, &s.product_path(), &buy, 64, seconds).await?;
            let after = sold(&s.pool, s.product).await?;
            orders[i].push((after - before) as f64 / seconds as f64);
            println!(
                "round {}: {} {:.0} orders/s",
                round + 1,
                s.label(),
                orders[i].last().unwrap()
            );
        }
    }
    let baseline = median(&orders[0]);
    let _ = writeln!(
        report,
        "\n=== orders/s, one instance, one hot product, 64 connections, every request a new buyer (median of {} rounds of {seconds} s) ===",
        args.rounds
    );
    let _ = writeln!(
        report,
        "| strategy | BATCH_MAX | orders/s | vs pg-atomic/1 |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|");
    for (s, figures) in subjects.iter().zip(&orders) {
        let m = median(figures);
        let _ = writeln!(
            report,
            "| {} | {} | {m:.0} | {:.2} |",
            s.strategy.name(),
            s.batch,
            m / baseline
        );
    }
    // 2. The sold-out answer against /healthz, on the redis instance.
    let redis_subject = subjects.last().expect("configured");
    let url = &redis_subject.instance.url;
    let gone = create_product(url, ADMIN_TOKEN, 1).await?;
    let client = reqwest::Client::new();
    for user in 1..=2 {
        client
            .post(format!("{url}/api/products/{gone}/purchase"))
            .json(&serde_json::json!({"user_id": user}))
            .send()
            .await?;
    }
    let (mut health, mut sold_out) = (Vec::new(), Vec::new());
    let path = format!("/api/products/{gone}/purchase");
    for round in 0..args.rounds {
        let h = wrk(url, "/healthz", &get, 64, seconds).await?.per_sec;
        let so = wrk(url, &path, &fixed, 64, seconds).await?.per_sec;
        println!(
            "round {}: /healthz {h:.0}, sold-out {so:.0} requests/s ({:.2}x)",
            round + 1,
            so / h
        );
        health.push(h);
        sold_out.push(so);
    }
    let (h, so) = (median(&health), median(&sold_out));
    let _ = writeln!(
        report,
        "\n=== the sold-out answer against /healthz, 64 connections ==="
    );
    let _ = writeln!(
        report,
        "| path | requests/s |\n|---|---:|\n| GET /healthz | {h:.0} |\n| POST purchase of a sold-out product | {so:.0} |"
    );
    let _ = writeln!(report, "sold-out / healthz: {:.2}", so / h);
    // 3. Overload.
    let (mut at64, mut at1000, mut failed64, mut failed1000) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        for (connections, goodput, failed) in [
            (64, &mut at64, &mut failed64),
            (1000, &mut at1000, &mut failed1000),
        ] {
            let before = sold(&redis_subject.pool, redis_subject.product).await?;
            let run = wrk(
                url,
                &redis_subject.product_path(),
                &buy,
                connections,
                seconds,
            )
            .await?;
            let after = sold(&redis_subject.pool, redis_subject.product).await?;
            goodput.push((after - before) as f64 / seconds as f64);
            failed.push(run.failed / run.requests.max(1.0));
        }
    }
    let _ = writeln!(
        report,
        "\n=== overload: one instance, redis, BATCH_MAX=64 ==="
    );
    let _ = writeln!(
        report,
        "| connections | orders/s | failed purchases |\n|---:|---:|---:|"
    );
    let _ = writeln!(
        report,
        "| 64 | {:.0} | {:.2} % |",
        median(&at64),
        median(&failed64) * 100.0
    );
    let _ = writeln!(
        report,
        "| 1000 | {:.0} | {:.2} % |",
        median(&at1000),
        median(&failed1000) * 100.0
    );
    let _ = writeln!(
        report,
        "goodput at 1000 / at 64: {:.2}",
        median(&at1000) / median(&at64)
    );
    print!("{report}");
    Ok(())
}

impl Subject {
    fn product_path(&self) -> String {
        format!("/api/products/{}/purchase", self.product)
    }

    fn label(&self) -> String {
        format!("{}/{}", self.strategy.name(), self.batch)
    }

    /// Stop the instance, drop its database, delete its Redis keys.
    async fn remove(self, redis_url: &str) -> anyhow::Result<()> {
        drop(self.instance);
        self.pool.close().await;
        self.database.remove().await?;
        servers::forget_keys(redis_url, &self.prefix).await
    }
}

async fn subject(
    admin_url: &str,
    redis_url: &str,
    strategy: LockStrategy,
    batch: u32,
) -> anyhow::Result<Subject> {
    let name = format!(
        "seckill_bench_{}_{}_{batch}",
        std::process::id(),
        strategy.name().replace('-', "_")
    );
    let prefix = format!("bench:{name}:");
    let database = ThrowawayDatabase::create(admin_url, name).await?;
    let config = InstanceConfig {
        database_url: &database.url,
        redis_url,
        redis_key_prefix: &prefix,
        admin_token: ADMIN_TOKEN,
        strategy,
        work_ms: 0,
        lock_wait_ms: 2_000,
        lock_ttl_ms: 5_000,
        redlock_urls: "",
        extra: vec![("BATCH_MAX", batch.to_string())],
    };
    let started = async {
        let me = std::env::current_exe()?;
        let name = format!("bench-{}-{batch}", strategy.name());
        let instance = Instance::start(&me, &config, &name).await?;
        let product = create_product(&instance.url, ADMIN_TOKEN, 1_000_000_000).await?;
        let pool = PgPool::connect(&database.url).await?;
        anyhow::Ok((instance, product, pool))
    }
    .await;
    match started {
        Ok((instance, product, pool)) => Ok(Subject {
            strategy,
            batch,
            instance,
            pool,
            product,
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

/// Orders of `product` so far.
async fn sold(pool: &PgPool, product: i64) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "orders!" FROM orders WHERE product_id = $1"#,
        product
    )
    .fetch_one(pool)
    .await?)
}

/// Run wrk (2 threads) against `url` + `path` with `script`.
async fn wrk(
    url: &str,
    path: &str,
    script: &Path,
    connections: u32,
    seconds: u64,
) -> anyhow::Result<Wrk> {
    let output = tokio::process::Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--timeout",
            "10s",
        ])
        .arg("-s")
        .arg(script)
        .arg(format!("{url}{path}"))
        .arg("--")
        .arg(
            RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .to_string(),
        )
        .kill_on_drop(true)
        .output()
        .await
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let number = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0)
    };
    let requests = text
        .lines()
        .find(|line| line.contains(" requests in "))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let timeouts = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("Socket errors:"))
        .map(|rest| {
            rest.split(',')
                .filter_map(|part| part.split_whitespace().last())
                .filter_map(|n| n.parse::<f64>().ok())
                .sum::<f64>()
        })
        .unwrap_or(0.0);
    if requests == 0.0 {
        bail!(
            "wrk measured nothing: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(Wrk {
        requests,
        per_sec: number("Requests/sec:"),
        failed: number("Non-2xx or 3xx responses:") + timeouts,
    })
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
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
