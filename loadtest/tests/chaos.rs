//! The fault soak (`loadtest chaos`), short: a minute with a fixed seed, every kind of fault
//! injected at least once, and no violation, under `redis`, and under `zookeeper`, `etcd`,
//! `redlock` and Redis behind Sentinel with their own servers' faults, and on a database that
//! fails over (`--database ha`) with its primary killed and paused; and the negative
//! control, a soak under the unsafe `none` strategy, which must find the lost updates it
//! makes. That the checker catches each kind of violation (a 201 without its order, an
//! oversell, a lost update, a wrong sold_out, ...) is shown on fabricated histories by the
//! unit tests of `loadtest/src/chaos/checker/`, each rule's on its own.

mod support;

use std::process::{Command, Stdio};

use clap::CommandFactory;
use serde_json::Value;
use support::LOADTEST;

/// Every kind of fault that applies comes in the first round of any seed's schedule (eight
/// kinds under `redis`, nine under ZooKeeper or etcd, ten under Redlock or Sentinel).
const SEED: &str = "20261203";

/// One soak at a time: each starts a PostgreSQL, a Redis and three instances, and their
/// timing rules (the sold_out bound, 503s only) assume the machine is theirs.
static ONE_SOAK_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const KINDS: [&str; 8] = [
    "kill-instance",
    "pause-instance",
    "restart-redis",
    "fence-back",
    "terminate-backends",
    "restart-postgres",
    "delay-network",
    "cut-network",
];

/// The kinds that hit a lock's own servers, drawn under `zookeeper`, `etcd`, `redlock` and
/// Sentinel only.
const MEMBER_KINDS: [&str; 2] = ["kill-member", "pause-member"];

#[test]
fn a_one_minute_soak_with_every_kind_of_fault_finds_no_violation() {
    let _alone = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Arrange: a summary file of the test's own.
    let summary = std::env::temp_dir().join(format!(
        "seckill-chaos-summary-{}-{:08x}.json",
        std::process::id(),
        rand::random::<u32>()
    ));

    // Act: one minute of faults, every 2 s quiet spell followed by the next fault.
    // TIMING: the eight kinds take about 15 s of faults and 16 s of quiet spells; on a busy
    // two-core machine an instance's restart can take seconds more: a minute leaves room.
    let output = Command::new(LOADTEST)
        .args(["chaos", "--minutes", "1", "--seed", SEED])
        .args(["--fault-every-ms", "2000"])
        // A supply (50 units/s) well below what even a debug build on a busy machine sells,
        // so the product sells out between restocks and the sold_out rule has answers to judge.
        .args(["--restock-units", "100", "--summary"])
        .arg(&summary)
        .stdin(Stdio::null())
        .output()
        .expect("loadtest runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report = std::fs::read_to_string(&summary);
    let _ = std::fs::remove_file(&summary);

    // Assert: it passed, every kind ran, and the sale both sold and sold out (so the
    // checks had something to judge).
    assert!(
        output.status.success(),
        "the soak failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let report: Value = serde_json::from_str(&report.expect("a summary")).unwrap();
    assert_eq!(report["violations"], 0, "{stdout}");
    assert_eq!(report["passed"], true, "{stdout}");
    for kind in KINDS {
        let injected = report["faults"][kind]["injected"].as_u64().unwrap_or(0);
        assert!(injected >= 1, "{kind} was not injected:\n{stdout}");
    }
    assert!(report["orders"].as_u64().unwrap() > 100, "{stdout}");
    assert!(report["restocks_applied"].as_u64().unwrap() > 5, "{stdout}");
    assert!(report["sold_out_answers"].as_u64().unwrap() > 0, "{stdout}");
    assert!(stdout.contains("VERDICT PASS: 0 violations"), "{stdout}");
    assert!(
        stdout.contains(&format!("seed {SEED}")),
        "the seed is printed: {stdout}"
    );
}

/// A soak's summary (`--summary`), its exit code and its output.
fn soak(args: &[&str]) -> (Option<i32>, Value, String) {
    let summary = std::env::temp_dir().join(format!(
        "seckill-chaos-summary-{}-{:08x}.json",
        std::process::id(),
        rand::random::<u32>()
    ));
    let output = Command::new(LOADTEST)
        .arg("chaos")
        .args(args)
        .arg("--summary")
        .arg(&summary)
        .stdin(Stdio::null())
        .output()
        .expect("loadtest runs");
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let report = std::fs::read_to_string(&summary);
    let _ = std::fs::remove_file(&summary);
    let report = report.unwrap_or_else(|e| panic!("no summary ({e}):\n{said}"));
    (
        output.status.code(),
        serde_json::from_str(&report).unwrap(),
        said,
    )
}

/// The negative control: without a lock, three instances selling one product at once lose
/// updates, and the soak must say so (exit 1, violations of the lost-update or oversell
/// rule), with no fault needed. A checker that passed this would pass anything.
#[test]
fn a_soak_without_a_lock_finds_the_lost_updates_it_makes() {
    let _alone = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Act: 15 s under `none`, the first fault not due before the end.
    let (code, report, said) = soak(&[
        "--strategy",
        "none",
        "--minutes",
        "0.25",
        "--seed",
        SEED,
        "--fault-every-ms",
        "600000",
        "--restock-units",
        "100",
    ]);

    // Assert: it failed for the race, not for anything else.
    assert_eq!(code, Some(1), "the verdict FAIL, not an error:\n{said}");
    assert_eq!(report["passed"], false, "{said}");
    let broken: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["violations"].as_array().unwrap().is_empty())
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        broken.contains(&"no lost update") || broken.contains(&"no oversell"),
        "the race's own rules: {broken:?}\n{said}"
    );
    assert_eq!(
        report["fault_log"].as_array().unwrap().len(),
        0,
        "no fault was needed"
    );
    // Honest counts: fence-back rewrites the Redis lock's keys, which `none` has not.
    let counted: Vec<&String> = report["faults"].as_object().unwrap().keys().collect();
    assert!(!counted.iter().any(|k| *k == "fence-back"), "{counted:?}");
    assert_eq!(counted.len(), KINDS.len() - 1, "{counted:?}");
}

/// What a soak under a lock kept by servers of its own locks in.
struct OwnServers<'a> {
    /// The strategy and its options (`--lock-ttl-ms`, `--sentinel`).
    args: &'a [&'a str],
    /// How long the faults go on, in minutes.
    minutes: &'a str,
    /// The schedule's seed.
    seed: &'a str,
    /// Whether the lock is kept in Redis (so that `fence-back` applies).
    in_redis: bool,
}

/// A soak under a lock kept by servers of its own (`zookeeper`, `etcd`, `redlock`, Redis
/// behind Sentinel): every kind that applies (the instances', PostgreSQL's and Redis's
/// faults, and the members' own) and no violation. Its report.
fn a_soak_under_its_own_servers_finds_no_violation(servers: OwnServers) -> Value {
    let _alone = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Act: a minute and a half or two of faults.
    let mut args = vec![
        "--minutes",
        servers.minutes,
        "--seed",
        servers.seed,
        "--fault-every-ms",
        "2000",
        "--restock-units",
        "100",
    ];
    args.extend_from_slice(servers.args);
    let (code, report, said) = soak(&args);

    // Assert: it passed, every kind that applies ran (fence-back, which rewrites a Redis
    // lock's keys, only where the lock is in Redis), and the sale both sold and sold out.
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(report["violations"], 0, "{said}");
    let expected: Vec<&str> = KINDS
        .into_iter()
        .filter(|kind| *kind != "fence-back" || servers.in_redis)
        .chain(MEMBER_KINDS)
        .collect();
    for kind in &expected {
        let injected = report["faults"][kind]["injected"].as_u64().unwrap_or(0);
        assert!(injected >= 1, "{kind} was not injected:\n{said}");
    }
    let counted = report["faults"].as_object().unwrap().len();
    assert_eq!(counted, expected.len(), "only the kinds that apply: {said}");
    assert!(report["orders"].as_u64().unwrap() > 100, "{said}");
    assert!(report["sold_out_answers"].as_u64().unwrap() > 0, "{said}");
    report
}

// TIMING: under ZooKeeper, etcd and Redlock the nine or ten kinds take about 35 s of faults
// (a pause or a cut outlasts a session or lease of up to 4 s) and 20 s of quiet spells; a
// member's restart can take seconds more on a busy two-core machine: 90 s leaves room.

#[test]
fn a_soak_under_zookeeper_with_its_members_killed_and_paused_finds_no_violation() {
    a_soak_under_its_own_servers_finds_no_violation(OwnServers {
        args: &["--strategy", "zookeeper", "--lock-ttl-ms", "2000"],
        minutes: "1.5",
        seed: SEED,
        in_redis: false,
    });
}

#[test]
fn a_soak_under_redlock_with_its_masters_restarted_paused_and_set_back_finds_no_violation() {
    a_soak_under_its_own_servers_finds_no_violation(OwnServers {
        args: &["--strategy", "redlock", "--lock-ttl-ms", "2000"],
        minutes: "1.5",
        seed: SEED,
        in_redis: true,
    });
}

#[test]
fn a_soak_under_etcd_with_its_members_killed_and_paused_finds_no_violation() {
    // The etcd lock takes no shorter lease with three members (`--help`).
    a_soak_under_its_own_servers_finds_no_violation(OwnServers {
        args: &["--strategy", "etcd", "--lock-ttl-ms", "3000"],
        minutes: "1.5",
        seed: SEED,
        in_redis: false,
    });
}

#[test]
fn a_soak_behind_sentinel_with_failovers_finds_no_violation() {
    // TIMING: behind Sentinel a failed-over primary follows the new one only some 8 s after
    // the Sentinels see it again, so a member fault that fails over takes 15 to 20 s here
    // (18 s measured); the ten kinds take about 60 s with their quiet spells: two and a
    // half minutes leave room.
    let report = a_soak_under_its_own_servers_finds_no_violation(OwnServers {
        args: &["--strategy", "redis", "--sentinel"],
        minutes: "2.5",
        // A seed whose first round kills the primary and promotes a stalled replica (drawn
        // by role, whichever node has it then).
        seed: "20261204",
        in_redis: true,
    });

    // Both failovers happened: the primary killed, and the replica stalled then promoted.
    let log = report["fault_log"].as_array().expect("a fault log");
    let details: Vec<&str> = log.iter().filter_map(|f| f["detail"].as_str()).collect();
    let killed_primary = details.iter().any(|d| {
        d.contains("(the primary) (pid") && d.contains("SIGKILLed") && d.contains("now leading")
    });
    let promoted = details
        .iter()
        .any(|d| d.contains("(the replica) stalled") && d.contains("promoted"));
    assert!(killed_primary && promoted, "{details:#?}");
}

/// The kinds that fail the `ha` database over, drawn with `--database ha` only (instead of
/// `restart-postgres`).
const DATABASE_KINDS: [&str; 3] = ["kill-primary", "pause-primary", "kill-standby"];

#[test]
fn a_soak_on_a_database_that_fails_over_finds_no_violation() {
    let _alone = ONE_SOAK_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Act: PostgreSQL run by Patroni, its primary killed and paused, its standby killed.
    // TIMING: a failover takes about 20 s (Patroni's lease) and the old primary's return as
    // a standby some 5 s more; the ten kinds take about 100 s with their quiet spells: two
    // and a half minutes leave room.
    let (code, report, said) = soak(&[
        "--database",
        "ha",
        "--minutes",
        "2.5",
        "--seed",
        SEED,
        "--fault-every-ms",
        "2000",
        "--restock-units",
        "100",
    ]);

    // Assert: it passed, every kind that applies ran (the database's own instead of
    // restart-postgres), and the sale both sold and sold out.
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(report["violations"], 0, "{said}");
    let expected: Vec<&str> = KINDS
        .into_iter()
        .filter(|kind| *kind != "restart-postgres")
        .chain(DATABASE_KINDS)
        .collect();
    for kind in &expected {
        let injected = report["faults"][kind]["injected"].as_u64().unwrap_or(0);
        assert!(injected >= 1, "{kind} was not injected:\n{said}");
    }
    let counted = report["faults"].as_object().unwrap().len();
    assert_eq!(counted, expected.len(), "only the kinds that apply: {said}");
    assert!(report["orders"].as_u64().unwrap() > 100, "{said}");
    assert!(report["sold_out_answers"].as_u64().unwrap() > 0, "{said}");
}

#[test]
fn bad_chaos_options_are_refused_with_a_message_and_nothing_is_started() {
    for (args, message) in [
        (
            &["--minutes", "0"] as &[&str],
            "not a number of minutes above 0",
        ),
        (&["--minutes", "soon"], "not a number of minutes above 0"),
        (&["--strategy", "lockless"], "is not a strategy"),
        (&["--instances", "0"], "0 is not in 1..=9"),
        (&["--fault-every-ms", "10"], "10 is not in 500..=600000"),
        // Leases the lock servers would not keep: refused before anything starts.
        (
            &["--strategy", "etcd", "--lock-ttl-ms", "2000"],
            "needs --lock-ttl-ms of at least 3000",
        ),
        (
            &["--strategy", "zookeeper", "--lock-ttl-ms", "40000"],
            "takes --lock-ttl-ms of at most 30000",
        ),
        (
            &["--strategy", "etcd", "--sentinel", "--lock-ttl-ms", "3000"],
            "goes with --strategy redis only",
        ),
    ] {
        let output = Command::new(LOADTEST)
            .arg("chaos")
            .args(args)
            .output()
            .expect("loadtest runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?} started something");
    }
}

#[test]
fn every_chaos_option_is_explained_in_its_help() {
    let cli = loadtest::cli::Cli::command();
    let chaos = cli.find_subcommand("chaos").expect("a chaos subcommand");
    assert!(chaos.get_about().is_some());
    let mut undocumented = Vec::new();
    for arg in chaos.get_arguments() {
        if arg.get_id() != "help" && arg.get_help().is_none() {
            undocumented.push(arg.get_id().to_string());
        }
    }
    assert!(undocumented.is_empty(), "without help: {undocumented:?}");
    assert!(chaos.get_arguments().count() >= 13);
}
