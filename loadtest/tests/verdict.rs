//! The load test against real instances (child processes of the `loadtest` binary) on a
//! fresh database: it must PASS on the Redis lock, end by itself, print no warnings, and
//! FAIL without a lock for the right reason. The demo runs on a bare machine too.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use loadtest::instances::{Instance, InstanceConfig};
use seckill::LockStrategy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::{LOADTEST, Reaped, database_url, redis_keys, server_url, shared_redis_url};

const ADMIN_TOKEN: &str = "loadtest-test-token-0123";

/// Three instances, and (dropped after them, so they stop first) their keys' cleanup.
struct Sale {
    instances: Vec<Instance>,
    _cleanup: testkit::PrefixCleanup,
}

async fn start_instances(database_url: &str, strategy: LockStrategy, work_ms: u64) -> Sale {
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
        extra: Vec::new(),
    };
    let mut instances = Vec::new();
    for i in 0..3 {
        let name = format!("verdict-{}-{i}", strategy.name());
        let instance = Instance::start(Path::new(LOADTEST), &config, &name).await;
        instances.push(instance.unwrap());
    }
    Sale {
        instances,
        _cleanup: cleanup,
    }
}

/// Run an attack with `extra` arguments; (exit code, stdout, stderr).
fn attack(sale: &Sale, database_url: &str, extra: &[&str]) -> (i32, String, String) {
    let hosts: Vec<&str> = sale.instances.iter().map(|i| i.url.as_str()).collect();
    let output = Command::new(LOADTEST)
        .args(["--hosts", &hosts.join(",")])
        // The product is made, and restocked, on an operators' listener.
        .args(["--ops-host", &sale.instances[0].ops_url])
        .args(["--admin-token", ADMIN_TOKEN, "--database-url", database_url])
        .args(["--users", "30", "--increase-rate", "30"])
        .args(["--quiet", "--no-print-metrics"])
        .args(extra)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    eprintln!("{stdout}\n{stderr}");
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

fn verdict_line(stdout: &str) -> String {
    stdout.lines().last().unwrap_or_default().to_owned()
}

/// The result column of one check line of the verdict table.
fn check<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line[name.len()..].split_whitespace().next())
        .unwrap_or_else(|| panic!("no {name:?} line in\n{stdout}"))
}

/// An attack on three instances locked with Redis passes, ends by itself (no Ctrl-C) and
/// prints no warnings.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_attack_on_three_redis_locked_instances_passes_cleanly(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = database_url(&connect);
    let sale = start_instances(&url, LockStrategy::Redis, 0).await;
    let report = std::env::temp_dir().join(format!("loadtest-report-{}.md", std::process::id()));
    let report_arg = report.to_str().unwrap().to_owned();

    // No --run-time: the attack must stop once the sale is decided.
    let started = Instant::now();
    let (code, stdout, stderr) = attack(
        &sale,
        &url,
        &[
            "--stock",
            "60",
            "--buyers",
            "400",
            "--report-file",
            &report_arg,
        ],
    );
    let took = started.elapsed();

    let verdict = verdict_line(&stdout);
    assert!(verdict.starts_with("VERDICT PASS"), "{verdict}");
    assert_eq!(code, 0);
    assert!(
        verdict.contains("supplied=60 final=0 orders=60"),
        "did not sell out: {verdict}"
    );
    assert!(
        took < Duration::from_secs(40),
        "ran {took:?}: it did not stop by itself"
    );
    for noise in ["WARN", "warning", "no longer needed"] {
        assert!(
            !stderr.contains(noise),
            "a normal run printed {noise:?}:\n{stderr}"
        );
    }
    // Twin buyers were sent, and none of them got two orders.
    assert_eq!(check(&stdout, "one order per user"), "PASS");
    let twins = stdout
        .lines()
        .find(|l| l.starts_with("one order per user"))
        .unwrap();
    assert!(
        !twins.contains(" 0 twin pairs"),
        "no twin pairs were sent: {twins}"
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
async fn an_attack_with_a_restock_in_the_middle_keeps_the_books(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = database_url(&connect);
    let sale = start_instances(&url, LockStrategy::PgOptimistic, 0).await;

    let (code, stdout, _) = attack(
        &sale,
        &url,
        &["--stock", "60", "--buyers", "300", "--restock", "40"],
    );

    let verdict = verdict_line(&stdout);
    assert!(verdict.starts_with("VERDICT PASS"), "{verdict}");
    assert!(
        verdict.contains("supplied=100 final=0 orders=100"),
        "{verdict}"
    );
    assert_eq!(code, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_verifier_fails_instances_without_a_lock_on_the_books_not_on_errors(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // The negative control: LOCK_STRATEGY=none with WORK_MS > 0 must be caught by the books,
    // or a PASS above would mean nothing.
    let url = database_url(&connect);
    let sale = start_instances(&url, LockStrategy::None, 20).await;

    let (code, stdout, _) = attack(
        &sale,
        &url,
        &["--stock", "60", "--buyers", "400", "--run-time", "20"],
    );

    assert!(
        verdict_line(&stdout).starts_with("VERDICT FAIL"),
        "{stdout}"
    );
    assert_eq!(code, 1);
    let books_failed =
        check(&stdout, "no oversell") == "FAIL" || check(&stdout, "no lost update") == "FAIL";
    assert!(
        books_failed,
        "the race did not show in the books:\n{stdout}"
    );
    assert_eq!(check(&stdout, "no 5xx but busy"), "PASS", "{stdout}");
    assert_eq!(check(&stdout, "no other 4xx"), "PASS", "{stdout}");
}

#[test]
fn goose_options_that_would_do_nothing_are_refused() {
    for (option, value) in [
        ("--host", "http://127.0.0.1:1"),
        ("--throttle-requests", "5"),
        ("--timeout", "3"),
    ] {
        let output = Command::new(LOADTEST)
            .args(["--hosts", "http://127.0.0.1:1", option, value])
            .args([
                "--admin-token",
                ADMIN_TOKEN,
                "--database-url",
                "postgres://x",
            ])
            .output()
            .unwrap();
        let (_, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{option}: {stderr}");
        assert!(stderr.contains(option), "{option}: {stderr}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_failed_goose_threshold_still_checks_the_books_and_prints_a_verdict(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = database_url(&connect);
    let sale = start_instances(&url, LockStrategy::Redis, 0).await;

    let (code, stdout, _) = attack(
        &sale,
        &url,
        &["--stock", "30", "--buyers", "100", "--threshold", "p50<1us"],
    );

    let verdict = verdict_line(&stdout);
    assert!(verdict.starts_with("VERDICT FAIL"), "{stdout}");
    assert!(verdict.contains("goose thresholds"), "{verdict}");
    assert_eq!(check(&stdout, "no lost update"), "PASS", "{stdout}");
    assert_eq!(code, 1);
}

/// Fail the test, saying what it `needs`, unless `holds`: a test that cannot run here fails
/// rather than report `ok` having checked nothing. Under CI (`CI=true`) the machine must
/// provide it; elsewhere the message also says how to leave the test out on purpose.
fn require(holds: bool, needs: &str, test: &str) {
    if holds {
        return;
    }
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("CI must provide what this test needs: {needs}");
    }
    panic!("this test needs {needs}; to leave it out on purpose: cargo test -- --skip {test}");
}

/// Whether this process may make a network namespace (`unshare --net` needs root, or
/// CAP_SYS_ADMIN, and `ip` from iproute2).
fn can_isolate() -> bool {
    Command::new("unshare")
        .args(["--net", "sh", "-c", "ip link set lo up"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Run the demo with `args`, in a network namespace of its own when `isolated` (so that
/// nothing answers at the default addresses); (success, stdout, stderr, pid).
fn demo(args: &[&str], isolated: bool) -> (bool, String, String, u32) {
    let mut command = if isolated {
        let mut command = Command::new("unshare");
        command.args([
            "--net",
            "sh",
            "-c",
            r#"ip link set lo up && exec "$0" "$@""#,
            LOADTEST,
        ]);
        command
    } else {
        Command::new(LOADTEST)
    };
    let child = command
        .arg("demo")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = Reaped(Some(child));
    let output = child.take().wait_with_output().unwrap();
    let (stdout, stderr) = text(&output);
    eprintln!("{stdout}\n{stderr}");
    (output.status.success(), stdout, stderr, pid)
}

fn row(stdout: &str, name: &str, batch: &str) -> String {
    stdout
        .lines()
        .find(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            cells.len() > 2 && cells[1] == name && cells[2] == batch
        })
        .unwrap_or_else(|| panic!("no {name} row with batch {batch}"))
        .to_owned()
}

const SMALL_DEMO: [&str; 12] = [
    // A little work inside each critical section, so that `none` races for sure.
    "--work-ms",
    "2",
    "--instances",
    "2",
    "--stock",
    "300",
    "--buyers",
    "600",
    "--users",
    "20",
    "--max-seconds",
    "30",
];

/// On a machine where nothing runs at the default addresses (a network namespace of its
/// own) and no address is given, the demo starts private PostgreSQL, Redis, ZooKeeper and
/// etcd servers, runs every strategy, draws its chart, and removes the servers' directories.
#[test]
fn the_demo_runs_on_a_bare_machine_and_draws_its_chart() {
    // Arrange: a network namespace where nothing listens at 127.0.0.1:5432, :6379, :2181 or
    // :2379, and no address given.
    require(
        can_isolate(),
        "`unshare --net` (root or CAP_SYS_ADMIN) and `ip` (iproute2), to hide the local \
         servers from the demo",
        "the_demo_runs_on_a_bare_machine_and_draws_its_chart",
    );
    let chart = std::env::temp_dir().join(format!("demo-chart-{}.svg", std::process::id()));

    // Act
    let (ok, stdout, stderr, pid) = demo(
        &[
            &SMALL_DEMO[..],
            &[
                "--strategies",
                "redis,zookeeper,etcd,none",
                "--per-request",
                "redis",
            ],
            &["--chart", chart.to_str().unwrap()],
        ]
        .concat(),
        true,
    );

    // Assert: private servers were started, every row is as expected, the chart is there,
    // and the private servers' directories are gone.
    assert!(ok, "the demo failed: {stderr}");
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            ["pg", "zk", "etcd"]
                .iter()
                .any(|server| name.starts_with(&format!("seckill-{server}-{pid}-")))
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    for server in ["PostgreSQL", "Redis", "ZooKeeper", "etcd"] {
        assert!(
            stdout.contains(&format!(
                "{server}: nothing answered at the default address"
            )),
            "{stdout}"
        );
    }
    assert!(row(&stdout, "redis", "256").ends_with("| PASS |"));
    assert!(row(&stdout, "zookeeper", "256").ends_with("| PASS |"));
    assert!(row(&stdout, "etcd", "256").ends_with("| PASS |"));
    assert!(row(&stdout, "redis", "1").ends_with("| PASS |"));
    assert!(row(&stdout, "none", "256").contains("FAIL (expected: no lock)"));
    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    let _ = std::fs::remove_file(&chart);
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    for label in [
        "orders/s at full load",
        "redis/1",
        "zookeeper",
        "etcd",
        "none",
        "orders over time",
    ] {
        assert!(svg.contains(label), "the chart has no {label:?}");
    }
}

/// A demo asked for etcd, with none at the default address and none installed, says what
/// to install and what to run instead, and runs nothing.
#[test]
fn a_demo_without_etcd_says_what_to_install_before_any_run() {
    // Arrange: nothing at etcd's default address, and no etcd on the PATH.
    require(
        std::net::TcpStream::connect("127.0.0.1:2379").is_err(),
        "nothing at 127.0.0.1:2379 (the demo would use it): stop the etcd there",
        "a_demo_without_etcd_says_what_to_install_before_any_run",
    );
    let empty = std::env::temp_dir().join(format!("empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();

    // Act
    let output = Command::new(LOADTEST)
        .env("PATH", &empty)
        .arg("demo")
        .args(["--strategies", "etcd,pg-atomic", "--per-request", ""])
        .args(["--database-url", &server_url()])
        .args(["--redis-url", &shared_redis_url()])
        .args(["--chart", "/dev/null"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&empty);
    let (stdout, stderr) = text(&output);
    eprintln!("{stdout}\n{stderr}");

    // Assert: it could not start (2), said what to install and what to run instead, and ran
    // nothing.
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr.contains("apt-get install etcd-server"), "{stderr}");
    assert!(stderr.contains("--etcd-endpoints"), "{stderr}");
    assert!(
        stderr.contains("to run the demo without etcd: --strategies pg-atomic"),
        "{stderr}"
    );
    assert!(!stdout.contains("--- "), "a run started: {stdout}");
}

#[test]
fn a_strategy_that_cannot_start_is_an_error_row_and_the_others_still_run() {
    let dead = format!("redis://127.0.0.1:{}", testkit::free_port());
    let chart = std::env::temp_dir().join(format!("demo-chart-error-{}.svg", std::process::id()));

    let (ok, stdout, _, _) = demo(
        &[
            &SMALL_DEMO[..],
            &["--strategies", "redlock,pg-atomic", "--per-request", ""],
            &["--redlock-urls", &dead, "--chart", chart.to_str().unwrap()],
            &[
                "--database-url",
                &server_url(),
                "--redis-url",
                &shared_redis_url(),
            ],
        ]
        .concat(),
        false,
    );
    let _ = std::fs::remove_file(&chart);

    assert!(!ok, "a failed strategy must fail the demo");
    assert!(row(&stdout, "redlock", "256").contains("ERROR"), "{stdout}");
    assert!(
        row(&stdout, "pg-atomic", "256").ends_with("| PASS |"),
        "{stdout}"
    );
}

/// A run stopped by the time bound with its books intact is incomplete, and does not fail
/// the demo.
#[test]
fn a_run_cut_by_the_time_bound_is_incomplete_not_a_failure() {
    // Arrange: one instance selling one purchase per transaction, each with 20 ms of work
    // inside it.
    // TIMING: one leader per product and instance, so at most 50 orders/s: 2,000 units cannot
    // sell out in 5 s even on a machine ten times faster, and the first order (20 ms of work)
    // comes well within them even on a busy one.
    let chart = std::env::temp_dir().join(format!("demo-chart-bound-{}.svg", std::process::id()));

    // Act
    let (ok, stdout, stderr, _) = demo(
        &[
            &[
                "--strategies",
                "pg-atomic",
                "--per-request",
                "",
                "--batch-max",
                "1",
            ][..],
            &["--work-ms", "20", "--instances", "1", "--users", "10"],
            &["--stock", "2000", "--buyers", "3000", "--max-seconds", "5"],
            &[
                "--database-url",
                &server_url(),
                "--redis-url",
                &shared_redis_url(),
            ],
            &["--chart", chart.to_str().unwrap()],
        ]
        .concat(),
        false,
    );
    let _ = std::fs::remove_file(&chart);

    // Assert: the row says what happened, and the demo still succeeds.
    let row = row(&stdout, "pg-atomic", "1");
    assert!(row.contains("| INCOMPLETE: time bound, "), "{row}");
    assert!(row.contains(" of 2000 sold |"), "{row}");
    assert!(stdout.contains("reached the time bound"), "{stdout}");
    assert!(ok, "an incomplete run failed the demo: {stderr}");
}

#[test]
fn ctrl_c_stops_the_whole_demo_and_cleans_up() {
    // Arrange: a demo with long attacks.
    use std::os::unix::process::CommandExt;
    let chart = std::env::temp_dir().join(format!("demo-ctrl-c-{}.svg", std::process::id()));
    let child = Command::new(LOADTEST)
        // Its own process group, as a shell gives a foreground job: Ctrl-C goes to it all.
        .process_group(0)
        .arg("demo")
        .args(["--strategies", "pg-atomic,pg-row", "--per-request", ""])
        .args([
            "--instances",
            "2",
            "--stock",
            "1000000",
            "--buyers",
            "2000000",
        ])
        .args(["--users", "10", "--max-seconds", "120"])
        .args([
            "--database-url",
            &server_url(),
            "--redis-url",
            &shared_redis_url(),
        ])
        .arg("--chart")
        .arg(&chart)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut child = Reaped(Some(child));
    let database_prefix = format!("seckill_demo_{pid}_");
    let started = Instant::now();
    while count_databases(&database_prefix) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the demo never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3)); // into the attack

    // Act: Ctrl-C, as the terminal sends it: to the whole foreground process group.
    let sent = Command::new("kill")
        .args(["-INT", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    assert!(sent.success());
    let output = child.take().wait_with_output().unwrap();
    let (stdout, stderr) = text(&output);
    eprintln!("{stdout}\n{stderr}");
    let _ = std::fs::remove_file(&chart);

    // Assert: it stopped (not only the attack), said so, and left nothing behind.
    assert!(stdout.contains("stopped by Ctrl-C"), "{stdout}");
    assert!(
        !stdout.contains("--- pg-row"),
        "the demo went on to the next strategy"
    );
    assert_eq!(
        count_databases(&database_prefix),
        0,
        "a demo database was left behind"
    );
    let redis = shared_redis_url();
    for pattern in [format!("demo:{pid}:*"), format!("{{demo:{pid}:*")] {
        assert_eq!(redis_keys(&redis, &pattern), Vec::<String>::new());
    }
    assert!(!output.status.success());
}

fn count_databases(prefix: &str) -> usize {
    let output = Command::new("psql")
        .args([&server_url(), "-Atc"])
        .arg(format!(
            "SELECT count(*) FROM pg_database WHERE datname LIKE '{prefix}%'"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn the_instances_die_with_a_demo_that_is_killed() {
    use std::io::BufRead;
    // Arrange: a demo whose instances are up.
    let mut child = Command::new(LOADTEST)
        .arg("demo")
        .args(["--strategies", "pg-atomic", "--per-request", ""])
        .args([
            "--instances",
            "2",
            "--stock",
            "1000000",
            "--buyers",
            "2000000",
        ])
        .args(["--users", "5", "--max-seconds", "120"])
        .args([
            "--database-url",
            &server_url(),
            "--redis-url",
            &shared_redis_url(),
        ])
        .arg("--chart")
        .arg("/dev/null")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let pid = child.id();
    let mut child = Reaped(Some(child));
    let urls: Vec<String> = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("instances: ").map(str::to_owned))
        .expect("the demo started its instances")
        .split_whitespace()
        .map(str::to_owned)
        .collect();

    // Act: SIGKILL, which the demo cannot catch.
    let mut child = child.take();
    child.kill().unwrap();
    child.wait().unwrap();

    // Assert: the kernel took its instances down with it.
    let started = Instant::now();
    for url in &urls {
        let address = url.trim_start_matches("http://");
        while std::net::TcpStream::connect(address).is_ok() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{url} outlived the demo"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Its database is left (nothing could clean up after a SIGKILL): remove it here.
    let output = Command::new("psql")
        .args([&server_url(), "-Atc"])
        .arg(format!(
            "SELECT datname FROM pg_database WHERE datname LIKE 'seckill_demo_{pid}_%'"
        ))
        .output()
        .unwrap();
    for name in String::from_utf8_lossy(&output.stdout).lines() {
        let _ = Command::new("psql")
            .args([&server_url(), "-qc"])
            .arg(format!(r#"DROP DATABASE "{name}" WITH (FORCE)"#))
            .status();
    }
}
