//! etcd under faults, against private servers started (and killed, by pid) by each test:
//! the server killed under a holder, or restarted under a waiter; a cluster of three with
//! its leader down, with a majority down, with the member a waiter talks to down, and with
//! the member a holder, another process and a readiness probe talk to hung (SIGSTOP); a
//! holder cut off from etcd for longer than its lease; and answers lost on their way back
//! (a proxy that holds them, `AnswerHold`), so that a step is sent again to another member,
//! or a renewal's or a waiter's read is answered only after a delete. The properties every
//! backend shares run against etcd too, in `tests/properties.rs`.
#![cfg(feature = "etcd")]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::backend::{Attempt, Renewal, Token, Unlock};
use distlock::{Backend, Error, EtcdLock, Fence, LockLost, LockOptions, Locker};
use support::*;
use testkit::{EtcdCluster, EtcdServer, TcpProxy};
use tokio::task::JoinHandle;
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

/// How long `EtcdLock` waits for a member's answer before it sends the step to the next
/// member (`EtcdLock::connect`'s default).
const REQUEST_TIMEOUT: Duration = EtcdLock::DEFAULT_REQUEST_TIMEOUT;

/// TIMING: far beyond a join's few requests on a busy machine.
const JOINS_WITHIN: Duration = Duration::from_secs(10);

/// A lease that outlasts whatever a test does to etcd meanwhile (a restart, an election on a
/// busy machine): the holder keeps its lock through it, and only its release frees it.
///
/// TIMING: a holder's watchdog renews every 10 s and retries after an error, so its lock
/// lasts through 20 s without an answer; an etcd restart takes a few seconds.
const LONG_TTL: Duration = Duration::from_secs(30);

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

/// Another process: a locker on a backend of its own.
async fn process(endpoints: &[String], options: LockOptions) -> Locker<EtcdLock> {
    locker(etcd(endpoints).await, options)
}

/// `endpoints` starting at member `first`: where a process's requests go first.
fn from_member(endpoints: &[String], first: usize) -> Vec<String> {
    let mut endpoints = endpoints.to_vec();
    endpoints.rotate_left(first);
    endpoints
}

/// Starting, restarting and waiting for servers blocks for seconds: off the runtime's
/// threads, so that watchdogs and waiters keep running meanwhile.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking step panicked")
}

async fn start_server() -> EtcdServer {
    blocking(EtcdServer::start).await
}

async fn start_cluster(members: usize) -> EtcdCluster {
    blocking(move || EtcdCluster::start(members)).await
}

/// `server`, started again on its port with its data.
async fn restarted(mut server: EtcdServer) -> EtcdServer {
    blocking(move || {
        server.restart();
        server
    })
    .await
}

/// `cluster`, once every running member is healthy again (after a kill: the survivors'
/// election).
async fn healthy(mut cluster: EtcdCluster) -> EtcdCluster {
    blocking(move || {
        cluster.wait_until_healthy(Duration::from_secs(60));
        cluster
    })
    .await
}

/// Wait until `waiting` contenders wait behind the holder of `KEY`, for up to `bound`.
async fn until_waiting(endpoints: &[String], waiting: usize, bound: Duration) {
    within(bound, "the waiters joined the line", async {
        while etcd_line(endpoints, KEY).await.len() != waiting + 1 {
            sleep(ms(20)).await;
        }
    })
    .await;
}

/// A waiter's one acquire, in a task of its own.
type Waiting = JoinHandle<distlock::Result<distlock::LockGuard<EtcdLock>>>;

/// A process that asks for `KEY` once: its acquire must not fail, whatever etcd goes
/// through meanwhile.
fn waits_for(locker: &Locker<EtcdLock>) -> Waiting {
    let locker = locker.clone();
    tokio::spawn(async move { locker.acquire(KEY).await })
}

/// Fail, with what the waiter's acquire answered, if its wait has ended.
async fn assert_still_waiting(waiter: &mut Waiting, when: &str) {
    if waiter.is_finished() {
        let answer = match waiter.await.expect("the waiter's task") {
            Ok(_) => "the lock".to_owned(),
            Err(error) => error.to_string(),
        };
        panic!("the waiter's acquire ended {when} ({answer}); it should still wait in line");
    }
}

/// The server dies under a holder: the holder is told within its lease, and another process
/// that wants the lock all along gets it only after that (once the server is back and the
/// holder's lease is over), with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_is_told_within_its_lease_when_the_server_dies() {
    // Arrange: A holds the lock on a 3 s lease; B is another process that wants it.
    let mut server = start_server().await;
    let endpoints = vec![server.endpoint()];
    let a = process(&endpoints, options(TTL, Duration::from_secs(30))).await;
    let b = process(&endpoints, options(TTL, Duration::from_secs(30))).await;
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
    let server = restarted(server).await;
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

    // Assert: A was told within its ttl, and B got the lock only after that, with a larger
    // fence.
    let b_guard = told_first(&held, (why, told_at), (killed, "kill"), TTL + MARGIN, taken);
    // A's release finds B's key at the head of the line.
    assert!(!held.release().await.unwrap().was_held());
    assert!(b_guard.release().await.unwrap().was_held());
    drop(server);
}

/// etcd is killed and started again while a waiter waits in line: the waiter keeps its
/// place (its watch breaks, its reads are refused), and gets the lock with that place when
/// the holder releases, woken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_through_a_restart_of_etcd() {
    // Arrange: A holds the lock; B waits in line behind it.
    let server = start_server().await;
    let endpoints = vec![server.endpoint()];
    let patient = options(LONG_TTL, Duration::from_secs(120));
    let a = process(&endpoints, patient.clone()).await;
    let b_backend = etcd(&endpoints).await;
    let b = locker(b_backend.clone(), patient);
    let held = a.acquire(KEY).await.unwrap();
    let mut b_waits = waits_for(&b);
    until_waiting(&endpoints, 1, JOINS_WITHIN).await;
    let b_place = etcd_line(&endpoints, KEY).await[1].clone();

    // Act: etcd is killed and started again (B's watch breaks, its reads are refused);
    // then A releases.
    let mut server = server;
    server.kill();
    // TIMING: long enough for B to find etcd gone and try again a few times.
    sleep(ms(500)).await;
    assert_still_waiting(&mut b_waits, "while etcd was down").await;
    let server = restarted(server).await;
    // TIMING: B reads and watches again within its pause after an error (at most 1 s).
    sleep(Duration::from_secs(2)).await;
    assert_still_waiting(&mut b_waits, "after etcd came back").await;
    assert!(held.release().await.unwrap().was_held());
    let b_guard = within(Duration::from_secs(20), "B got the lock", b_waits)
        .await
        .unwrap()
        .expect("B's wait in line failed");

    // Assert: B holds with the place it joined at, woken once (by A's release: a broken
    // watch is no wake-up), and nothing else is left in line.
    assert_eq!(b_guard.fence(), Fence::new(b_place.revision as u64));
    assert!(b_guard.was_contended());
    assert_eq!(b_backend.wake_ups(), 1, "B's wake-ups");
    assert!(b_guard.release().await.unwrap().was_held());
    assert!(etcd_line(&endpoints, KEY).await.is_empty());
    drop(server);
}

/// A cluster of three; the member a waiter talks to dies: the waiter keeps its place, and
/// its lease alive through another member past the lease's end, and gets the lock with that
/// place when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_when_the_member_it_talks_to_dies() {
    // Arrange: a cluster of three; A holds the lock; B waits in line, talking to a follower
    // (its first endpoint), on a lease it must keep alive past the kill.
    let cluster = start_cluster(3).await;
    let endpoints = cluster.endpoints();
    let leader = cluster.leader().expect("a leader");
    let follower = (0..3).find(|&i| i != leader).unwrap();
    // TIMING: a 6 s lease, kept alive every 2 s; no election follows a follower's death, so
    // A's watchdog renews on time.
    let ttl = Duration::from_secs(6);
    let a = process(
        &from_member(&endpoints, leader),
        options(ttl, Duration::from_secs(60)),
    )
    .await;
    let b_backend = etcd(&from_member(&endpoints, follower)).await;
    let b = locker(b_backend.clone(), options(ttl, Duration::from_secs(60)));
    let held = a.acquire(KEY).await.unwrap();
    let mut b_waits = waits_for(&b);
    until_waiting(&endpoints, 1, JOINS_WITHIN).await;
    let b_place = etcd_line(&endpoints, KEY).await[1].clone();

    // Act: the member B talks to dies; A releases once B's lease would have run out had B
    // not kept it alive through another member.
    let mut cluster = cluster;
    cluster.kill(follower);
    let cluster = healthy(cluster).await;
    sleep(ttl + MARGIN).await;
    assert_still_waiting(&mut b_waits, "after its member died").await;
    let survivors = from_member(&endpoints, leader);
    assert_eq!(etcd_line(&survivors, KEY).await[1], b_place, "B's place");
    assert!(held.is_held());
    assert!(held.release().await.unwrap().was_held());
    let b_guard = within(Duration::from_secs(20), "B got the lock", b_waits)
        .await
        .unwrap()
        .expect("B's wait in line failed");

    // Assert: B holds with the place it joined at, woken once.
    assert_eq!(b_guard.fence(), Fence::new(b_place.revision as u64));
    assert_eq!(b_backend.wake_ups(), 1, "B's wake-ups");
    assert!(b_guard.release().await.unwrap().was_held());
    assert!(etcd_line(&survivors, KEY).await.is_empty());
    drop(cluster);
}

/// The leader of a cluster of three dies under a holder: the lock lives through the
/// survivors' election and still excludes another process (told it is held, not that etcd
/// is out of reach); then two processes still take turns, each fence larger than the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_survives_the_loss_of_the_leader_of_three() {
    // Arrange: two processes on the whole cluster, and A holding the lock.
    // TIMING: a 20 s lease outlasts the survivors' election on a busy machine (a few
    // election timeouts); renewals every second show soon that the lock lives on after it.
    let cluster = start_cluster(3).await;
    let endpoints = cluster.endpoints();
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let leader = cluster.leader().expect("a leader");
    // Both start with the leader, so both lose the member they talk to.
    let a = process(&from_member(&endpoints, leader), options.clone()).await;
    let b = process(&from_member(&endpoints, leader), options).await;
    let held = a.acquire(KEY).await.unwrap();

    // Act: the leader dies; the two others elect a new one.
    let mut cluster = cluster;
    cluster.kill(leader);
    let cluster = healthy(cluster).await;
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

    // Assert: the lock lived through the election, and still excludes B: B is told it is
    // held, not that etcd could not be reached.
    let new_leader = cluster.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    assert!(held.is_held());
    let tried = b.try_acquire(KEY).await;
    assert!(matches!(tried, Err(Error::Held { .. })), "{tried:?}");
    assert!(held.release().await.unwrap().was_held());

    // Act / Assert: A and B take the lock five times each, waiting in line for each other;
    // every hold comes with a larger fence than the one before.
    five_turns_each(a, b, KEY).await;
    // Nothing is left in line.
    assert!(etcd_line(&endpoints, KEY).await.is_empty());
}

/// With two of three members down (the leader and a follower), a process's acquire fails
/// with `Timeout` by its deadline and its `try_acquire` fails with etcd's error within a
/// request timeout; once they are back and the failed attempts' leases are over, nothing
/// is left in line and the lock is taken again, with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_three_down_acquire_fails_in_time_and_recovers_after() {
    let cluster = start_cluster(3).await;
    let endpoints = cluster.endpoints();
    let a = process(&endpoints, options(TTL, Duration::from_secs(5))).await;
    let bounds = TwoDownBounds {
        margin: MARGIN,
        // TIMING: try_acquire has no deadline of its own; each request to etcd has the
        // request timeout at each member (1 s, `EtcdLock::connect`), and the first that
        // fails at every member ends it.
        try_acquire_within: REQUEST_TIMEOUT + MARGIN,
        // TIMING: a key of a failed attempt could only live on its lease, which nothing
        // renews: the new leader gives it its TTL again plus an election timeout.
        line_empty_within: TTL + ELECTION + MARGIN * 2,
    };
    let etcd_failed = |tried: &Error| {
        matches!(
            tried,
            Error::Backend {
                backend: "etcd",
                ..
            }
        )
    };
    let line = || etcd_line(&endpoints, KEY);
    let cluster = two_of_three_down(cluster, a, KEY, bounds, etcd_failed, line).await;
    drop(cluster);
}

/// A member hangs (SIGSTOP) under a holder and another process that both talk to it first:
/// the holder's renewals get past it and it is never told otherwise; the other process is
/// told the lock is held, and once the holder releases, gets it within its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_lives_through_a_hung_member() {
    // Arrange: a cluster of three; A holds the lock with a watchdog; A and B (another
    // process) both talk first to a follower, which will hang. (A hung leader would add an
    // election, which `a_held_lock_survives_the_loss_of_the_leader_of_three` covers with a
    // kill.)
    let cluster = start_cluster(3).await;
    let endpoints = cluster.endpoints();
    let leader = cluster.leader().expect("a leader");
    let hung = (0..3).find(|&i| i != leader).unwrap();
    // TIMING: a 6 s lease renewed every 2 s leaves each renewal 4 s to land in: time to
    // wait out the hung member once (the request timeout, 1 s) and be answered by another.
    let ttl = Duration::from_secs(6);
    let first = from_member(&endpoints, hung);
    let a = process(&first, options(ttl, Duration::from_secs(30))).await;
    let b = process(&first, options(ttl, Duration::from_secs(2))).await;
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);
    let renewals = held.renewals();

    // Act: the member hangs (SIGSTOP): its TCP connections stay up, and nothing answers.
    cluster.signal(hung, "-STOP");
    // TIMING: a lease and more: every renewal in it had to get past the hung member.
    sleep(ttl + MARGIN).await;

    // Assert: A still holds, renewed through the others, and was never told otherwise.
    if told.is_finished() {
        let (why, _) = told.await.unwrap();
        panic!("A was told its lock is lost while a member hung: {why:?}");
    }
    assert!(held.is_held());
    let renewed = held.renewals() - renewals;
    assert!(renewed >= 2, "{renewed} renewals while the member hung");

    // Act / Assert: B, whose steps start at the hung member, is told the lock is held
    // (not that etcd could not be reached) ...
    let tried = within(
        REQUEST_TIMEOUT + MARGIN,
        "B's try_acquire answered",
        b.try_acquire(KEY),
    )
    .await;
    assert!(matches!(tried, Err(Error::Held { .. })), "{tried:?}");
    // ... and once A releases, gets the lock within its 2 s wait: its steps no longer
    // start at the hung member.
    let a_fence = held.fence();
    assert!(held.release().await.unwrap().was_held());
    let b_guard = b.acquire(KEY).await.expect("B's acquire after A's release");
    assert!(b_guard.fence() > a_fence);
    assert!(b_guard.release().await.unwrap().was_held());

    // The member goes on, and the cluster is whole again, with nothing left in line.
    cluster.signal(hung, "-CONT");
    let cluster = healthy(cluster).await;
    assert!(etcd_line(&endpoints, KEY).await.is_empty());
    drop(cluster);
}

/// A readiness prober gives each probe up before the request timeout (as the service's
/// `/readyz` does) while the member it talks to first hangs: its steps still move off that
/// member, and after the first few, probes are answered by the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_given_up_early_still_move_a_process_off_a_hung_member() {
    // Arrange: a cluster of three; A holds the lock (talking to the leader first); a prober
    // that only inspects the lock, as the service's readiness probe does, talks first to a
    // follower, which will hang. It has answered once, so its connection is up.
    let cluster = start_cluster(3).await;
    let endpoints = cluster.endpoints();
    let leader = cluster.leader().expect("a leader");
    let hung = (0..3).find(|&i| i != leader).unwrap();
    let a = process(
        &from_member(&endpoints, leader),
        options(LONG_TTL, Duration::from_secs(30)),
    )
    .await;
    let held = a.acquire(KEY).await.unwrap();
    let prober = process(
        &from_member(&endpoints, hung),
        options(LONG_TTL, Duration::from_secs(30)),
    )
    .await;
    assert!(prober.inspect(KEY).await.unwrap().held);

    // Act: the member hangs; the prober probes again and again, giving each probe up after
    // 700 ms (the service's gives up after 1 s): no probe is let run until the request
    // timeout (1 s) ends its wait on the hung member.
    // TIMING: 700 ms is far beyond two reads on a member that answers.
    const GIVEN_UP_AFTER: Duration = Duration::from_millis(700);
    cluster.signal(hung, "-STOP");
    let stopped = Instant::now();
    let mut answered = Vec::new();
    while stopped.elapsed() < Duration::from_secs(15) && !answered.ends_with(&[true; 3]) {
        let probe = tokio::time::timeout(GIVEN_UP_AFTER, prober.inspect(KEY)).await;
        answered.push(
            matches!(probe, Ok(Ok(state)) if state.held && state.fence == Some(held.fence())),
        );
    }
    println!("probes after the stop (answered or not): {answered:?}");

    // Assert: after the first few (given up while the hung member was still where the
    // prober's steps started), probes are answered, by the others.
    assert!(
        answered.ends_with(&[true; 3]),
        "the probes never got past the hung member: {answered:?}"
    );
    let given_up = answered.iter().filter(|ok| !**ok).count();
    assert!(given_up <= 4, "{given_up} probes given up: {answered:?}");

    cluster.signal(hung, "-CONT");
    assert!(held.release().await.unwrap().was_held());
    drop(cluster);
}

/// A holder is cut off from etcd for longer than its lease: it is told before the waiter
/// behind it gets the lock, whose fence is larger (a fenced store refuses the old holder's
/// write); back in reach, the old guard finds the lock taken, and takes it again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_past_its_lease_is_told_and_fenced_off() {
    // Arrange: A reaches etcd through a proxy that the test cuts; B, directly, waits in
    // line behind A; a fenced store has A's write.
    let server = start_server().await;
    let proxy = TcpProxy::start(server.port());
    let a = process(
        &[format!("http://127.0.0.1:{}", proxy.port())],
        options(TTL, Duration::from_secs(30)),
    )
    .await;
    let b = process(&[server.endpoint()], options(TTL, Duration::from_secs(30))).await;
    let store = FencedStore::default();
    let held = a.acquire(KEY).await.unwrap();
    assert!(store.write(held.fence(), "A"));
    let told = when_told(&held);
    let b_waits = keep_acquiring(b, KEY, held.lost());
    until_waiting(&[server.endpoint()], 1, JOINS_WITHIN).await;

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
    let b_guard =
        told_first_and_fenced_off(&held, (why, told_at), cut, TTL + MARGIN, taken, &store);

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

// Answers lost on their way back. A backend on two endpoints of one server, the first
// through an `AnswerHold`: a step whose answer is held is given up after the client's
// timeout and sent again, to the same server, through the second.

/// A backend that talks to `server` through `hold` first, and directly once a step through
/// `hold` got no answer.
async fn through(hold: &AnswerHold, server: &EtcdServer) -> EtcdLock {
    etcd(&[hold.endpoint(), server.endpoint()]).await
}

/// The answer to the transaction that puts our key is lost, and the same transaction is
/// sent again to another endpoint: it finds our key there, on its lease, and the lock is
/// ours (renewed, then released, leaving no lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_sent_again_after_its_answer_was_lost_keeps_its_key_on_its_lease() {
    // Arrange: the answer to the transaction that puts our key (the first request to carry
    // our token) is held.
    let server = start_server().await;
    let hold = AnswerHold::start(server.port());
    let backend = through(&hold, &server).await;
    let token = Token::new();
    hold.hold_after(token.as_str());

    // Act: the put is applied, its answer held; the client gives up on it and the same
    // transaction goes to the other endpoint, where it finds our key.
    let attempt = within(
        REQUEST_TIMEOUT + MARGIN * 2,
        "try_lock answered",
        backend.try_lock(KEY, &token, LONG_TTL),
    )
    .await
    .unwrap();

    // Assert: the lock is ours, with our key in place on a live lease: renewed, then
    // released.
    assert!(
        hold.held(),
        "the put's answer went through: nothing was sent again"
    );
    let line = etcd_line(&[server.endpoint()], KEY).await;
    assert_eq!(
        line.iter().map(|c| c.token.as_str()).collect::<Vec<_>>(),
        [token.as_str()],
        "the line after the retried join"
    );
    assert_eq!(
        attempt,
        Attempt::Acquired(Fence::new(line[0].revision as u64))
    );
    assert_eq!(
        backend.renew(KEY, &token, LONG_TTL).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(backend.unlock(KEY, &token).await.unwrap(), Unlock::Released);
    assert!(etcd_leases(&server.endpoint()).await.is_empty());
}

/// The holder's key is deleted (its lease living on) while a renewal's read is on its way:
/// the keep-alive finds a live lease, but the read after it finds no key, and the renewal is
/// not counted (`Gone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_fails_when_the_key_was_deleted_before_its_keep_alive() {
    // Arrange: we hold the lock; the answer to the renewal's first request (the first to
    // carry our token from now on) will be held.
    let server = start_server().await;
    let hold = AnswerHold::start(server.port());
    let backend = through(&hold, &server).await;
    let token = Token::new();
    let taken = backend.try_lock(KEY, &token, LONG_TTL).await.unwrap();
    assert!(matches!(taken, Attempt::Acquired(_)), "{taken:?}");
    hold.hold_after(token.as_str());

    // Act: while that answer is held, our key is deleted and its lease lives on (an
    // operator's `etcdctl del`; a forced unlock was once a delete and then a revoke); then
    // the answer goes on and the renewal goes on with it.
    let renewal = {
        let (backend, token) = (backend.clone(), token.clone());
        tokio::spawn(async move { backend.renew(KEY, &token, LONG_TTL).await })
    };
    within(
        REQUEST_TIMEOUT,
        "the renewal's read went out",
        hold.until_holding(),
    )
    .await;
    let own = format!("{}{KEY}/{}", distlock::etcd::DEFAULT_PREFIX, token.as_str());
    let deleted = etcd_client(&server.endpoint())
        .await
        .delete(own, None)
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), 1);
    hold.release();
    let renewal = within(REQUEST_TIMEOUT + MARGIN, "the renewal answered", renewal)
        .await
        .unwrap()
        .unwrap();

    // Assert: the keep-alive found a live lease, but no lock: the renewal says it is gone.
    assert_eq!(renewal, Renewal::Gone);
}

/// A waiter's lease grant is applied but its answer lost, so it is sent again elsewhere;
/// the wait is then given up (as at a deadline) and unlocked: at once, neither the waiter's
/// key nor any lease granted for it (the first grant's too) is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_after_a_lost_grant_answer_leaves_no_key_or_lease() {
    // Arrange: A holds the lock; every answer to the waiter through the hold is held, the
    // first its lease grant's.
    let server = start_server().await;
    let endpoints = vec![server.endpoint()];
    let a = process(&endpoints, options(LONG_TTL, Duration::from_secs(30))).await;
    let held = a.acquire(KEY).await.unwrap();
    let leases_before = etcd_leases(&server.endpoint()).await;
    let hold = AnswerHold::start(server.port());
    let waiter = through(&hold, &server).await;
    let token = Token::new();
    hold.hold();

    // Act: the grant is applied, its answer held; the client gives up on it and sends it
    // to the other endpoint, then joins the line there. Then the locker gives up the wait
    // as at a deadline: it drops the wait and unlocks with the same token.
    let in_line = {
        let (waiter, token) = (waiter.clone(), token.clone());
        tokio::spawn(async move { waiter.lock_in_line(KEY, &token, LONG_TTL).await })
    };
    // TIMING: the grant is sent again after the client's timeout.
    until_waiting(&endpoints, 1, REQUEST_TIMEOUT + JOINS_WITHIN).await;
    assert!(
        hold.held(),
        "the grant's answer went through: nothing was sent again"
    );
    in_line.abort();
    assert!(in_line.await.unwrap_err().is_cancelled());
    let unlocked = waiter.unlock(KEY, &token).await.unwrap();

    // Assert: at once, not after the lease: the waiter's key is gone, and every lease
    // granted for it (the first grant's too) was revoked.
    assert_eq!(unlocked, Unlock::Released);
    let line = etcd_line(&endpoints, KEY).await;
    assert_eq!(
        line.iter().map(|c| c.token.as_str()).collect::<Vec<_>>(),
        [held.token().as_str()]
    );
    assert_eq!(etcd_leases(&server.endpoint()).await, leases_before);
    assert!(held.release().await.unwrap().was_held());
}

/// A waiter's read finds nobody before it, and its key is deleted (its lease living on)
/// while that answer is on its way: the keep-alive that follows finds the lease alive, but
/// the waiter is not handed the lock for a key that is gone; it loses its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_was_deleted_is_not_handed_the_lock() {
    // Arrange: A holds the lock; W waits in line behind it, through a hold, on a 6 s lease
    // kept alive every 2 s. W's requests wait longer than any answer is held here, so a
    // held answer comes late instead of being sent again elsewhere.
    let server = start_server().await;
    let endpoints = vec![server.endpoint()];
    let a = process(&endpoints, options(LONG_TTL, Duration::from_secs(30))).await;
    let held = a.acquire(KEY).await.unwrap();
    let hold = AnswerHold::start(server.port());
    let w = EtcdLock::builder([hold.endpoint()])
        .request_timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let token = Token::new();
    let in_line = {
        let (w, token) = (w.clone(), token.clone());
        tokio::spawn(async move { w.lock_in_line(KEY, &token, Duration::from_secs(6)).await })
    };
    until_waiting(&endpoints, 1, JOINS_WITHIN).await;
    // One of W's reads after a keep-alive (the first request to carry its token from now
    // on) goes by, held for a moment: A releases right after it, not while a read of the
    // line is on its way (it could then find nobody before W, and be answered at once).
    // TIMING: the next keep-alive and read are 2 s away.
    hold.hold_after(token.as_str());
    within(JOINS_WITHIN, "W's periodic read", hold.until_holding()).await;
    hold.release();
    assert!(!in_line.is_finished(), "W's wait ended before A released");

    // Act: A releases; the answer to W's next read of the line (woken by the release),
    // which finds nobody before W, is held while W's key is deleted (its lease lives on)
    // and until a keep-alive is due; then it goes on.
    hold.hold_after(token.as_str());
    assert!(held.release().await.unwrap().was_held());
    within(JOINS_WITHIN, "W's read went out", hold.until_holding()).await;
    let own = format!("{}{KEY}/{}", distlock::etcd::DEFAULT_PREFIX, token.as_str());
    let deleted = etcd_client(&server.endpoint())
        .await
        .delete(own, None)
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), 1);
    // TIMING: the read went out less than a keep-alive period (2 s) after W's last
    // keep-alive (milliseconds, as it was woken then); answered 3 s later, a keep-alive is
    // due then, and W's 6 s lease has not run out (if it had, W would lose its place for
    // that reason instead).
    sleep(Duration::from_secs(3)).await;
    hold.release();
    let turn = within(Duration::from_secs(20), "W's wait ended", in_line)
        .await
        .unwrap();

    // Assert: W is not handed the lock for a key that is gone (the keep-alive that followed
    // found its lease alive): the line is empty, and W's place is lost.
    assert!(
        matches!(turn, Err(Error::LostPlace { why, .. }) if why.contains("key was deleted")),
        "{turn:?}"
    );
    assert!(etcd_line(&endpoints, KEY).await.is_empty());
    assert_eq!(w.unlock(KEY, &token).await.unwrap(), Unlock::Gone);
    assert!(etcd_leases(&server.endpoint()).await.is_empty());
}

/// W waits in line behind A through a member so slow that a keep-alive and a read together
/// take longer than W's keep-alive period (a third of its ttl). When A releases, W heads
/// the line with a proof older than that period: it keeps its lease alive and reads the
/// line again, and that read, sent after the keep-alive, is proof enough. (It used to ask
/// for a fresher proof, and keep alive and read for ever, its lease alive, holding up
/// everyone behind it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_of_the_line_takes_its_turn_through_a_slow_member() {
    // Arrange: A holds the lock; W waits in line behind it, through a proxy that slows
    // every answer by 300 ms, with a 1.2 s ttl (a keep-alive every 400 ms) and a request
    // timeout no answer comes near.
    // TIMING: a keep-alive and then a read take at least 600 ms through the proxy, more
    // than W's 400 ms keep-alive period; etcd grants W a lease of at least 2 s (its
    // minimum), which W's keep-alives, one every loop, renew in time.
    let server = start_server().await;
    let endpoints = vec![server.endpoint()];
    let a = process(&endpoints, options(LONG_TTL, Duration::from_secs(30))).await;
    let held = a.acquire(KEY).await.unwrap();
    let slow = AnswerHold::start(server.port());
    slow.delay_answers(ms(300));
    let w = EtcdLock::builder([slow.endpoint()])
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let token = Token::new();
    let in_line = {
        let (w, token) = (w.clone(), token.clone());
        tokio::spawn(async move { w.lock_in_line(KEY, &token, ms(1_200)).await })
    };
    until_waiting(&endpoints, 1, JOINS_WITHIN).await;
    let w_place = etcd_line(&endpoints, KEY).await[1].clone();
    // TIMING: W's join is answered, then its first keep-alive and read (about a second
    // through the proxy): by then W has found A before it, and watches A's key.
    sleep(Duration::from_secs(3)).await;
    assert!(!in_line.is_finished(), "W's wait ended before A released");

    // Act: A releases.
    assert!(held.release().await.unwrap().was_held());
    // TIMING: a few slow round trips: W's watch fires, it reads, keeps alive and reads.
    let turn = within(Duration::from_secs(10), "W's turn came", in_line)
        .await
        .unwrap()
        .expect("W's wait in line failed");

    // Assert: W holds with the place it joined at, after waiting; its release frees the line.
    assert_eq!(turn.fence, Fence::new(w_place.revision as u64));
    assert!(turn.waited);
    assert_eq!(w.wake_ups(), 1, "W's wake-ups");
    assert_eq!(w.unlock(KEY, &token).await.unwrap(), Unlock::Released);
    assert!(etcd_line(&endpoints, KEY).await.is_empty());
}

/// A TCP forwarder in front of one etcd member that can hold back the member's answers, as
/// a network that loses them would: the requests reach etcd and are applied, and the
/// client's own timeout gives up on the answer. It can also slow every answer, as a slow
/// member (or a slow link to it) would. Every connection through it is closed on drop.
struct AnswerHold {
    port: u16,
    shared: Arc<HoldState>,
}

#[derive(Default)]
struct HoldState {
    /// While set, answers wait in the forwarder.
    holding: AtomicBool,
    /// Hold every answer once a request carrying these bytes has gone through.
    marker: Mutex<Option<Vec<u8>>>,
    /// Some answer was held.
    held: AtomicBool,
    /// How long each answer waits in the forwarder before it goes on.
    delay: Mutex<Duration>,
    /// Set on drop: the threads end.
    stopped: AtomicBool,
    /// Both ends of every connection, to close them on drop.
    live: Mutex<Vec<TcpStream>>,
}

impl AnswerHold {
    fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(HoldState::default());
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || {
            while !accepting.stopped.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(ms(5));
                        continue;
                    }
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                accepting
                    .live
                    .lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (requests, answers) = (Arc::clone(&accepting), Arc::clone(&accepting));
                std::thread::spawn(move || requests.forward_requests(client, server));
                std::thread::spawn(move || answers.forward_answers(s, c));
            }
        });
        Self { port, shared }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Hold every answer from now on.
    fn hold(&self) {
        self.shared.holding.store(true, Ordering::SeqCst);
    }

    /// Hold every answer once a request carrying `marker` has gone through (its own
    /// answer included). [`held`](Self::held) starts over.
    fn hold_after(&self, marker: &str) {
        self.shared.held.store(false, Ordering::SeqCst);
        *self.shared.marker.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// Slow every answer from now on by `delay`.
    fn delay_answers(&self, delay: Duration) {
        *self.shared.delay.lock().unwrap() = delay;
    }

    /// Let the answers go on.
    fn release(&self) {
        self.shared.holding.store(false, Ordering::SeqCst);
    }

    /// Whether some answer was held.
    fn held(&self) -> bool {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Resolves once an answer is being held.
    async fn until_holding(&self) {
        while !self.held() {
            sleep(ms(5)).await;
        }
    }
}

impl HoldState {
    /// Client to server: forwarded as it comes, watching for the marker (which may span
    /// two reads).
    fn forward_requests(&self, mut from: TcpStream, mut to: TcpStream) {
        let mut buf = [0u8; 16 * 1024];
        let mut seen = Vec::new();
        while let Ok(n @ 1..) = from.read(&mut buf) {
            {
                let mut marker = self.marker.lock().unwrap();
                if let Some(wanted) = marker.as_ref() {
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(wanted.len()).any(|w| w == wanted.as_slice()) {
                        // Before the request goes on, so that its answer is held too.
                        self.holding.store(true, Ordering::SeqCst);
                        *marker = None;
                        seen.clear();
                    } else {
                        let keep = seen.len().saturating_sub(wanted.len());
                        seen.drain(..keep);
                    }
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    }

    /// Server to client: each answer goes on `delay` after it came (a reader thread stamps
    /// it, so that a slow member adds latency, not a queue), and waits here while answers
    /// are held.
    fn forward_answers(&self, mut from: TcpStream, mut to: TcpStream) {
        let (stamped, due) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
        let Ok(closing) = from.try_clone() else {
            return;
        };
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    let at = std::time::Instant::now() + *self.delay.lock().unwrap();
                    if stamped.send((at, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            });
            for (at, answer) in due {
                std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
                while self.holding.load(Ordering::SeqCst) && !self.stopped.load(Ordering::SeqCst) {
                    self.held.store(true, Ordering::SeqCst);
                    std::thread::sleep(ms(5));
                }
                if to.write_all(&answer).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Both);
            let _ = closing.shutdown(Shutdown::Both);
        });
    }
}

impl Drop for AnswerHold {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for stream in self.shared.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Over TLS (`https://`), a member's certificate is checked against the authority given:
/// one that authority issued is trusted and the lock works; against another authority the
/// same member is refused, and no lock is taken.
#[cfg(feature = "etcd-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_tls_checks_the_members_certificate() {
    // Arrange: a member that presents a certificate of this test's authority.
    let authority = testkit::TestAuthority::new("distlock etcd test authority");
    let certificate = authority.issue_for_localhost();
    let server = blocking(move || EtcdServer::start_tls(&certificate)).await;
    let endpoints = [server.tls_endpoint()];
    let connect = |ca: String| {
        let endpoints = endpoints.clone();
        async move {
            let etcd = EtcdLock::builder(endpoints)
                .ca_certificate(ca)
                .connect()
                .await
                .expect("a client (it connects lazily)");
            locker(etcd, options(TTL, Duration::from_secs(2)))
        }
    };

    // Act: lock through a client that trusts the authority, then through one that trusts
    // another.
    let trusting = connect(authority.ca_pem()).await;
    let held = trusting.acquire(KEY).await.expect("the lock, over TLS");
    let fence = held.fence();
    assert!(held.release().await.unwrap().was_held());
    let stranger = testkit::TestAuthority::new("another authority");
    let doubting = connect(stranger.ca_pem()).await;
    // One list with a plain member and a member over TLS: each is reached its own way.
    let mixed = EtcdLock::builder([server.endpoint(), server.tls_endpoint()])
        .ca_certificate(authority.ca_pem())
        .connect()
        .await;
    // A read, which answers the backend's error (an acquire would retry until its wait ran
    // out, as it does while a member is down).
    let refused = doubting.inspect(KEY).await;

    // Assert: the first got the lock with a fence; the second never reached the member.
    assert!(
        doubting.acquire(KEY).await.is_err(),
        "no lock through a refused member"
    );
    let mixed = locker(
        mixed.expect("plain and TLS endpoints in one list"),
        options(TTL, TTL),
    );
    assert!(
        mixed
            .acquire(KEY)
            .await
            .unwrap()
            .release()
            .await
            .unwrap()
            .was_held()
    );
    assert!(fence.get() > 0, "a fence from etcd: {fence:?}");
    let error = refused.expect_err("a member whose certificate the authority did not sign");
    assert!(
        matches!(error, Error::Backend { .. }),
        "refused by the TLS handshake: {error:?}"
    );
    let chain = format!("{:?}", sources(&error));
    assert!(chain.contains("certificate"), "says why: {chain}");
    drop(server);
}

/// `error` and every source under it, for a message.
#[cfg(feature = "etcd-tls")]
fn sources(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect()
}
