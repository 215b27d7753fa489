//! The load test against real instances (child processes of the `loadtest` binary) on a
//! fresh database: it must PASS on the Redis lock and FAIL without a lock.

mod support;

use std::path::Path;
use std::process::Command;

use loadtest::instances::{Instance, InstanceConfig};
use seckill::LockStrategy;
use sqlx::postgres::PgConnectOptions;
use support::{LOADTEST, database_url, shared_redis_url};

const ADMIN_TOKEN: &str = "loadtest-test-token";

async fn start_instances(
    database_url: &str,
    strategy: LockStrategy,
    work_ms: u64,
) -> (Vec<Instance>, testkit::PrefixCleanup) {
    let prefix = testkit::unique_prefix("loadtest");
    let redis = shared_redis_url();
    let cleanup = testkit::PrefixCleanup::new(&redis, &prefix);
    let config = InstanceConfig {
        database_url,
        redis_url: &redis,
        redis_key_prefix: &prefix,
        admin_token: ADMIN_TOKEN,
        strategy,
        work_ms,
        lock_wait_ms: 30_000,
        lock_ttl_ms: 5_000,
        redlock_urls: "",
    };
    let mut instances = Vec::new();
    for i in 0..3 {
        instances.push(
            Instance::start(Path::new(LOADTEST), &config, &format!("test-{i}"))
                .await
                .unwrap(),
        );
    }
    (instances, cleanup)
}

/// Run a short attack, writing a Markdown report to `report`; returns (exit code, last line
/// of stdout).
fn attack(instances: &[Instance], database_url: &str, report: &Path) -> (i32, String) {
    let hosts: Vec<&str> = instances.iter().map(|i| i.url.as_str()).collect();
    let output = Command::new(LOADTEST)
        .args(["--hosts", &hosts.join(",")])
        .args(["--stock", "60", "--buyers", "400"])
        .args(["--admin-token", ADMIN_TOKEN, "--database-url", database_url])
        .args(["--users", "30", "--increase-rate", "30", "--run-time", "4"])
        .args(["--quiet", "--no-print-metrics"])
        .arg("--report-file")
        .arg(report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let last = stdout.lines().last().unwrap_or_default().to_owned();
    (output.status.code().unwrap_or(-1), last)
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_short_attack_on_three_redis_locked_instances_passes(
    _pool: sqlx::postgres::PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = database_url(&connect);
    let (instances, _cleanup) = start_instances(&url, LockStrategy::Redis, 0).await;
    let report = std::env::temp_dir().join(format!("loadtest-report-{}.md", std::process::id()));

    let (code, verdict) = attack(&instances, &url, &report);

    assert!(verdict.starts_with("VERDICT PASS"), "{verdict}");
    assert_eq!(code, 0);
    assert!(
        verdict.contains("initial=60 final=0 orders=60"),
        "did not sell out: {verdict}"
    );
    // goose's report counts the 409s as answers, not as errors.
    let markdown = std::fs::read_to_string(&report).expect("goose wrote the report");
    let _ = std::fs::remove_file(&report);
    assert!(
        markdown.contains("[409]"),
        "no 409s in the report:\n{markdown}"
    );
    assert!(
        !markdown.contains("## Error Metrics"),
        "expected outcomes listed as errors:\n{markdown}"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_verifier_fails_instances_without_a_lock(
    _pool: sqlx::postgres::PgPoolOptions,
    connect: PgConnectOptions,
) {
    // The negative control: the same attack on LOCK_STRATEGY=none with WORK_MS > 0 must be
    // caught, or a PASS above would mean nothing.
    let url = database_url(&connect);
    let (instances, _cleanup) = start_instances(&url, LockStrategy::None, 20).await;
    let report =
        std::env::temp_dir().join(format!("loadtest-report-none-{}.md", std::process::id()));

    let (code, verdict) = attack(&instances, &url, &report);
    let _ = std::fs::remove_file(&report);

    assert!(verdict.starts_with("VERDICT FAIL"), "{verdict}");
    assert_eq!(code, 1);
}

#[test]
fn the_demo_compares_strategies_and_marks_the_unlocked_race_as_expected() {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let output = Command::new(LOADTEST)
        .args(["demo", "--strategies", "redis,none", "--instances", "2"])
        .args([
            "--stock",
            "40",
            "--buyers",
            "200",
            "--users",
            "20",
            "--seconds",
            "3",
        ])
        .args([
            "--database-url",
            &database_url,
            "--redis-url",
            &shared_redis_url(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success());
    let row = |name: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(&format!("| {name} ")))
            .unwrap_or_else(|| panic!("no {name} row"))
            .to_owned()
    };
    assert!(row("redis").ends_with("| PASS |"), "{}", row("redis"));
    assert!(
        row("none").contains("FAIL (expected: no lock)"),
        "{}",
        row("none")
    );
}
