//! The private Patroni cluster fails over from a dead primary without losing a commit that
//! was answered, takes the dead member back as a standby, and leaves no process behind when
//! dropped: what the service's failover tests and the soak's `ha` database rely on.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use servers::{PatroniCluster, Tie};

/// TIMING: a failover waits out the leader lease (20 s) and a Patroni loop or two; a
/// returning member rewinds and streams again within a few loops. A minute for each holds
/// on a busy two-core machine.
const WITHIN: Duration = Duration::from_secs(60);

/// `psql -Atc sql` against `url`: its output, or `None` when it fails.
fn psql(url: &str, sql: &str) -> Option<String> {
    let out = Command::new("psql")
        .args([url, "-Atqc", sql])
        .env("PGCONNECT_TIMEOUT", "3")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_killed_primary_is_replaced_with_every_answered_commit() {
    // Arrange: a cluster serving through HAProxy, and commits answered before the kill.
    let mut cluster = PatroniCluster::start(&[("track_commit_timestamp", "on")], Tie::Child)
        .unwrap_or_else(|e| panic!("{e}"));
    let first = cluster.primary().expect("a primary");
    let standby = cluster.wait_for_sync_standby(WITHIN).unwrap();
    assert_ne!(first, standby);
    let url = cluster.url();
    psql(&url, "create table answered (n int primary key)").expect("created");
    for n in 0..100 {
        psql(&url, &format!("insert into answered values ({n})")).expect("answered");
    }

    // Act: the primary dies as its machine would.
    let pids = cluster.pids(first);
    assert!(pids.len() >= 2, "Patroni and its postmaster: {pids:?}");
    let killed_at = Instant::now();
    cluster.kill(first);
    let second = cluster
        .wait_for_primary(WITHIN)
        .unwrap_or_else(|e| panic!("{e}"));
    let took = killed_at.elapsed();

    // Assert: another member took over, in about the lease, with every answered commit.
    assert_ne!(second, first);
    assert!(pids.iter().all(|&pid| !running(pid) || is_zombie(pid)));
    assert_eq!(
        psql(&url, "select count(*) from answered").as_deref(),
        Some("100")
    );
    assert_eq!(
        psql(
            &url,
            "select count(pg_xact_commit_timestamp(xmin)) from answered"
        )
        .as_deref(),
        Some("100"),
        "the settings given hold on every member: commit times kept, and replayed"
    );
    assert_eq!(
        psql(&url, "select pg_is_in_recovery()").as_deref(),
        Some("f"),
        "HAProxy sends connections to the new primary"
    );
    eprintln!("failover took {took:?}");

    // Act: the dead member comes back.
    cluster.restart(first).unwrap();
    let deadline = Instant::now() + WITHIN;
    while psql(&cluster.member_url(first), "select pg_is_in_recovery()").as_deref() != Some("t") {
        assert!(
            Instant::now() < deadline,
            "the old primary came back as a standby: {}",
            cluster.log_tail(first, 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Assert: it streams the new primary's commits.
    psql(&url, "insert into answered values (100)").expect("written on the new primary");
    let deadline = Instant::now() + WITHIN;
    while psql(&cluster.member_url(first), "select count(*) from answered").as_deref()
        != Some("101")
    {
        assert!(
            Instant::now() < deadline,
            "the returned member replays the new commits"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Assert: dropped, nothing of it runs.
    let all: Vec<u32> = (0..3).flat_map(|i| cluster.pids(i)).collect();
    drop(cluster);
    assert!(
        all.iter().all(|&pid| !running(pid) || is_zombie(pid)),
        "every member's process is gone"
    );
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}
