//! etcd under faults, against private servers started (and killed, by pid) by each test:
//! the server killed under a holder, a cluster of three with its leader down and with a
//! majority down, and a holder cut off from etcd for longer than its lease. The properties
//! every backend shares run against etcd too, in `tests/properties.rs`.
#![cfg(feature = "etcd")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, EtcdLock, Fence, LockLost, LockOptions, Locker};
use support::*;
use testkit::{EtcdCluster, EtcdServer, TcpProxy};
use tokio::time::{Instant, sleep};

const KEY: &str = "lock_sale_1";

/// The lease of the holders that lose their lock.
///
/// TIMING: etcd counts leases in whole seconds, grants none under its minimum (2 s with
/// the default 1 s election timeout) and runs its expiry every 500 ms; 3 s leaves the
/// watchdog's keep-alives (every second) time to land on a busy machine.
const TTL: Duration = Duration::from_secs(3);

/// TIMING: what a busy two-core machine may add to a bound that the lock itself keeps (a
/// lease that runs out, an election): scheduling, a late expiry run, a reconnection.
const MARGIN: Duration = Duration::from_secs(3);

/// etcd's election timeout (its default), which a leader adds to every lease it takes over.
const ELECTION: Duration = Duration::from_secs(1);

fn options(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(ttl)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// A backend with a client of its own, as another process would have.
async fn etcd(endpoints: &[String]) -> EtcdLock {
    EtcdLock::connect(endpoints)
        .await
        .expect("a client of the private etcd")
}

/// Starting, restarting and waiting for servers blocks for seconds: off the runtime's
/// threads, so that watchdogs and waiters keep running meanwhile.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking step panicked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_is_told_within_its_lease_when_the_server_dies_and_nobody_gets_the_lock_before()
{
    // Arrange: A holds the lock on a 3 s lease; B is another process that wants it.
    let mut server = blocking(EtcdServer::start).await;
    let endpoints = vec![server.endpoint()];
    let a = locker(
        etcd(&endpoints).await,
        options(TTL, Duration::from_secs(30)),
    );
    let b = locker(
        etcd(&endpoints).await,
        options(TTL, Duration::from_secs(30)),
    );
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);

    // Act: the server dies; B tries all along; the server comes back once A was told.
    server.kill();
    let killed = Instant::now();
    let b_wants = keep_acquiring(b, KEY, held.lost());
    // TIMING: the watchdog's last keep-alive was sent at most a renewal period (ttl / 3)
    // before the kill, and the holder's lease is counted from there: told within one ttl.
    let (why, told_at) = within(TTL + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    let server = blocking(move || {
        server.restart();
        server
    })
    .await;
    // TIMING: the restarted etcd gives A's lease its whole TTL again, plus an election
    // timeout; nothing renews it any more, and B gets the lock once it runs out.
    let taken = within(
        TTL + ELECTION + Duration::from_secs(20),
        "B got the lock after the restart",
        b_wants,
    )
    .await
    .unwrap();
    println!(
        "B's {} failed attempts while the server was down, the first: {:?}",
        taken.errors.len(),
        taken.errors.first()
    );

    // Assert: A was told within its ttl, and B got the lock only after that.
    let told_after = told_at.duration_since(killed);
    println!(
        "after the kill: A told at {told_after:?}, B got the lock at {:?}",
        taken.at.duration_since(killed)
    );
    assert!(
        told_after <= TTL + MARGIN,
        "told {told_after:?} after the kill"
    );
    assert_eq!(why, LockLost::Unreachable);
    assert!(!held.is_held());
    assert_eq!(
        taken.old_holder_told,
        Some(LockLost::Unreachable),
        "B got the lock while A's guard still said it held it"
    );
    let b_guard = taken.guard;
    assert!(b_guard.fence() > held.fence());
    // A's release finds B's key at the head of the line.
    assert!(!held.release().await.unwrap().was_held());
    assert!(b_guard.release().await.unwrap().was_held());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_leader_of_three_down_a_held_lock_survives_and_two_processes_still_take_turns() {
    // Arrange: two processes on the whole cluster, and A holding the lock.
    // TIMING: a 20 s lease outlasts the survivors' election on a busy machine (a few
    // election timeouts); renewals every second show soon that the lock lives on after it.
    let cluster = blocking(|| EtcdCluster::start(3)).await;
    let endpoints = cluster.endpoints();
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let a = locker(etcd(&endpoints).await, options.clone());
    let b = locker(etcd(&endpoints).await, options);
    let held = a.acquire(KEY).await.unwrap();
    let leader = cluster.leader().expect("a leader");

    // Act: the leader dies; the two others elect a new one.
    let mut cluster = cluster;
    cluster.kill(leader);
    let cluster = blocking(move || {
        cluster.wait_until_healthy(Duration::from_secs(60));
        cluster
    })
    .await;
    let renewals = held.renewals();
    within(
        Duration::from_secs(20),
        "a renewal on the survivors",
        async {
            while held.renewals() <= renewals {
                sleep(ms(50)).await;
            }
        },
    )
    .await;

    // Assert: the lock lived through the election, and still excludes B.
    let new_leader = cluster.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    assert!(held.is_held());
    let tried = b.try_acquire(KEY).await;
    assert!(matches!(tried, Err(Error::Held { .. })), "{tried:?}");
    assert!(held.release().await.unwrap().was_held());

    // Act: A and B take the lock five times each, waiting in line for each other.
    let inside = Arc::new(AtomicBool::new(false));
    let holds: Arc<Mutex<Vec<(&str, Fence)>>> = Arc::default();
    let take_turns = |name: &'static str, locker: Locker<EtcdLock>| {
        let (inside, holds) = (Arc::clone(&inside), Arc::clone(&holds));
        tokio::spawn(async move {
            for _ in 0..5 {
                let guard = locker.acquire(KEY).await.unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                holds.lock().unwrap().push((name, guard.fence()));
                sleep(ms(50)).await;
                inside.store(false, Ordering::SeqCst);
                assert!(guard.release().await.unwrap().was_held());
            }
        })
    };
    let turns = [take_turns("A", a), take_turns("B", b)];
    for turn in turns {
        within(Duration::from_secs(60), "five turns each", turn)
            .await
            .unwrap();
    }

    // Assert: every hold came with a larger fence than the one before, both processes got
    // their five, and nothing is left in line.
    let holds = holds.lock().unwrap().clone();
    println!("holds in order: {holds:?}");
    assert_eq!(holds.len(), 10);
    assert_eq!(holds.iter().filter(|(name, _)| *name == "A").count(), 5);
    assert!(
        holds.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "fences out of order: {holds:?}"
    );
    assert_eq!(etcd_contenders(&endpoints, KEY).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_three_down_acquire_fails_by_its_deadline_and_once_they_are_back_nothing_is_left_and_the_lock_is_taken_again()
 {
    // Arrange: a process on the whole cluster, which has taken and given back the lock
    // once (so that its fence is known).
    let cluster = blocking(|| EtcdCluster::start(3)).await;
    let endpoints = cluster.endpoints();
    let wait = Duration::from_secs(5);
    let a = locker(etcd(&endpoints).await, options(TTL, wait));
    let first = a.acquire(KEY).await.unwrap();
    let first_fence = first.fence();
    assert!(first.release().await.unwrap().was_held());
    let leader = cluster.leader().expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();

    // Act: the leader and a follower die; the last member has no leader and no quorum.
    let mut cluster = cluster;
    cluster.kill(leader);
    cluster.kill(follower);
    let killed = Instant::now();
    let waited = a.acquire(KEY).await;
    let waited_for = killed.elapsed();
    let started = Instant::now();
    let tried = within(
        // TIMING: try_acquire has no deadline of its own; each request to etcd has the
        // client's (5 s, `EtcdLock::connect`), and the first that fails ends it.
        Duration::from_secs(5) + MARGIN,
        "try_acquire gave up",
        a.try_acquire(KEY),
    )
    .await;
    let tried_for = started.elapsed();

    // Assert: both failed, clearly and in time.
    let waited = waited.expect_err("acquired without a quorum");
    println!("acquire without a quorum, after {waited_for:?}: {waited:?}");
    assert!(
        matches!(
            waited,
            Error::Timeout { .. } | Error::Etcd(_) | Error::LostPlace { .. }
        ),
        "{waited:?}"
    );
    assert!(
        waited_for <= wait + MARGIN,
        "acquire took {waited_for:?}, its wait is {wait:?}"
    );
    let tried = tried.expect_err("try_acquire succeeded without a quorum");
    println!("try_acquire without a quorum, after {tried_for:?}: {tried:?}");
    assert!(matches!(tried, Error::Etcd(_)), "{tried:?}");

    // Act: both come back.
    let cluster = blocking(move || {
        cluster.restart(leader);
        cluster.restart(follower);
        cluster
    })
    .await;

    // Assert: once the leases of the failed attempts are over, no contender key is left,
    // and the lock is taken again with a larger fence.
    // TIMING: a key of a failed attempt could only live on its lease, which nothing renews:
    // the new leader gives it its TTL again plus an election timeout.
    within(
        TTL + ELECTION + MARGIN * 2,
        "the line emptied once the failed attempts' leases were over",
        async {
            loop {
                let line = etcd_contenders(&endpoints, KEY).await;
                if line.is_empty() {
                    break;
                }
                println!("still in line: {line:?}");
                sleep(ms(200)).await;
            }
        },
    )
    .await;
    let again = a.acquire(KEY).await.unwrap();
    assert!(again.fence() > first_fence);
    assert!(again.release().await.unwrap().was_held());
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_past_its_lease_is_told_the_next_holder_gets_a_larger_fence_and_the_old_guard_finds_the_lock_taken()
 {
    // Arrange: A reaches etcd through a proxy that the test cuts; B, directly, waits in
    // line behind A; a fenced store has A's write.
    let server = blocking(EtcdServer::start).await;
    let proxy = TcpProxy::start(server.port());
    let a = locker(
        etcd(&[format!("http://127.0.0.1:{}", proxy.port())]).await,
        options(TTL, Duration::from_secs(30)),
    );
    let b = locker(
        etcd(&[server.endpoint()]).await,
        options(TTL, Duration::from_secs(30)),
    );
    let store = FencedStore::default();
    let held = a.acquire(KEY).await.unwrap();
    assert!(store.write(held.fence(), "A"));
    let told = when_told(&held);
    let b_waits = keep_acquiring(b, KEY, held.lost());
    within(Duration::from_secs(10), "B joined the line", async {
        while a.inspect(KEY).await.unwrap().waiting != Some(1) {
            sleep(ms(20)).await;
        }
    })
    .await;

    // Act: A is cut off, as a holder paused or partitioned away would be.
    proxy.cut();
    let cut = Instant::now();
    let (why, told_at) = within(TTL + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    // TIMING: etcd ends A's lease one TTL after the last keep-alive it received, which was
    // before the cut, at its next expiry run (every 500 ms); B's watch then fires.
    let taken = within(TTL + MARGIN * 2, "B got the lock", b_waits)
        .await
        .unwrap();

    // Assert: A was told before B got the lock; B's fence is larger, and the store refuses
    // A's write once B has written.
    let told_after = told_at.duration_since(cut);
    println!(
        "after the cut: A told at {told_after:?}, B got the lock at {:?}",
        taken.at.duration_since(cut)
    );
    assert!(
        told_after <= TTL + MARGIN,
        "told {told_after:?} after the cut"
    );
    assert_eq!(why, LockLost::Unreachable);
    assert!(!held.is_held());
    assert_eq!(
        taken.old_holder_told,
        Some(LockLost::Unreachable),
        "B got the lock while A's guard still said it held it"
    );
    assert!(
        taken.errors.is_empty(),
        "B's wait in line failed: {:?}",
        taken.errors
    );
    let b_guard = taken.guard;
    assert!(b_guard.fence() > held.fence());
    assert!(store.write(b_guard.fence(), "B"));
    assert!(
        !store.write(held.fence(), "A"),
        "the cut-off holder's write was accepted"
    );
    assert_eq!(store.writer().as_deref(), Some("B"));

    // Act / Assert: back in reach, A cannot advance its fence, its release says the lock
    // was not its own any more, and it takes the lock again after B, with a larger fence.
    proxy.heal();
    let advanced = within(
        Duration::from_secs(10),
        "A's advance_fence answered",
        held.advance_fence(held.fence()),
    )
    .await;
    assert!(
        matches!(advanced, Err(Error::NotHeld { .. })),
        "{advanced:?}"
    );
    assert_eq!(
        held.release().await.unwrap(),
        distlock::ReleaseOutcome::Lost(LockLost::Taken)
    );
    let b_fence = b_guard.fence();
    assert!(b_guard.release().await.unwrap().was_held());
    let again = a.acquire(KEY).await.unwrap();
    assert!(again.fence() > b_fence);
    assert!(again.release().await.unwrap().was_held());
    drop(server);
}
