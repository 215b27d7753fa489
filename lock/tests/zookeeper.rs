//! ZooKeeper under faults, against private servers started (and killed, by pid) by each
//! test: the server killed under a holder, an ensemble of three with its leader down and
//! with a majority down, a holder cut off from the ensemble for longer than its session,
//! the server a holder's session is connected to hung, a server that grants a shorter
//! session than asked, and a handle's reaper through an outage. The properties every backend
//! shares run against ZooKeeper too, in `tests/properties.rs`.
#![cfg(feature = "zookeeper")]

mod support;

use std::time::Duration;

use distlock::backend::{Attempt, Token, Unlock};
use distlock::{Backend, Error, LockLost, LockOptions, ZkLock};
use support::*;
use testkit::zookeeper::TICK_TIME;
use testkit::{TcpProxy, ZooKeeperEnsemble, ZooKeeperServer};
use tokio::time::{Instant, sleep};

const KEY: &str = "lock_sale_1";

/// The session of the holders that lose their lock: short, so that the tests are quick.
const SESSION: Duration = Duration::from_secs(3);

/// Their locks' ttl: as long as the session allows (half of it: `ZkLock::max_ttl`).
const TTL: Duration = Duration::from_millis(1_500);

/// TIMING: what a busy two-core machine may add to a bound that the lock itself keeps (a
/// lease that runs out, a session the server expires): scheduling, a JVM that is slow to
/// answer, a reconnection.
const MARGIN: Duration = Duration::from_secs(3);

fn options(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(ttl)
        .wait_timeout(wait)
        .build()
        .unwrap()
}

/// How long one request may take: shorter than the default, so that the tests without a
/// quorum end sooner.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A backend with a session of its own, as another process would have.
async fn zk(connect_string: &str, session: Duration) -> ZkLock {
    ZkLock::builder(connect_string)
        .session_timeout(session)
        .request_timeout(REQUEST_TIMEOUT)
        .connect()
        .await
        .expect("a ZooKeeper session")
}

/// Starting, restarting and waiting for JVMs blocks for seconds: off the runtime's threads,
/// so that watchdogs and waiters keep running meanwhile.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking step panicked")
}

/// The server a holder's session is on dies: the holder is told within its ttl, and nobody
/// gets the lock before it is told (B gets it once the restarted server has ended the
/// holder's session), with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_holder_is_told_before_anyone_gets_the_lock() {
    // Arrange: A holds the lock on a 3 s session, through a proxy; B is another process
    // that wants it, and reaches the server directly.
    let mut server = blocking(ZooKeeperServer::start).await;
    let connect_string = server.connect_string();
    let proxy = TcpProxy::start(server.port());
    let a_backend = zk(&format!("127.0.0.1:{}", proxy.port()), SESSION).await;
    let a = locker(a_backend.clone(), options(TTL, Duration::from_secs(30)));
    let b = locker(
        zk(&connect_string, SESSION).await,
        options(TTL, Duration::from_secs(30)),
    );
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);

    // Act: the server dies, and A's way to it with it (so that A's client cannot bring its
    // session, and its node, back: the server must end it by itself). The server is
    // restarted at once; B tries all along.
    proxy.cut();
    server.kill();
    let killed = Instant::now();
    let b_wants = keep_acquiring(b, KEY, held.lost());
    let server = blocking(move || {
        server.restart();
        server
    })
    .await;
    // TIMING: the restarted server has A's session back from its log, with a whole
    // session timeout from its start (rounded up to a tick); B then gets the lock.
    let taken = within(
        SESSION + TICK_TIME + Duration::from_secs(20),
        "B got the lock after the restart",
        b_wants,
    )
    .await
    .unwrap();
    println!(
        "B's failed attempts while the server was down: {:?}",
        taken.errors
    );

    // Assert: B could get the lock as soon as the server let it (a session timeout after
    // the restart, not after A's client gave up), and A had been told by then.
    assert!(
        taken.old_holder_told.is_some(),
        "B got the lock {:?} after the kill while A's guard still said it held it",
        taken.at.duration_since(killed)
    );
    // TIMING: the watchdog's last renewal was sent at most a renewal period (ttl / 3)
    // before the kill, and the holder's lease is counted from there: told within one ttl.
    let (why, told_at) = within(TTL + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    // A was told within its ttl, and B got the lock only after that, with a larger fence.
    let b_guard = told_first(&held, (why, told_at), (killed, "kill"), TTL + MARGIN, taken);
    // TIMING: the client library gives its session up 7/5 of the session timeout after it
    // last heard from the server (at the kill, when A's way to it was cut).
    tokio::time::timeout_at(killed + SESSION * 7 / 5 + MARGIN, async {
        while !a_backend.zookeeper().state().is_terminated() {
            sleep(ms(50)).await;
        }
    })
    .await
    .expect("A's client gave its session up");
    // Back in reach, A's release (on a new session) finds B's node at the head of the line.
    proxy.heal();
    assert!(!held.release().await.unwrap().was_held());
    assert!(b_guard.release().await.unwrap().was_held());
    drop(server);
}

/// A holder told its lock is lost does not block the next one when the server comes back
/// with its session: the handle's reaper deletes the lapsed node, long before the session
/// could end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_holder_does_not_block_when_its_session_comes_back() {
    // Arrange: A holds the lock with a 2 s ttl on a 20 s session; B is another process
    // that wants it.
    // TIMING: the server comes back long before A's client would give its session up
    // (7/5 of 20 s), so the restarted server revives A's session from its log, and with
    // it A's node at the head of the line.
    let mut server = blocking(ZooKeeperServer::start).await;
    let connect_string = server.connect_string();
    let session = Duration::from_secs(20);
    let ttl = Duration::from_secs(2);
    let a_backend = zk(&connect_string, session).await;
    let a = locker(a_backend.clone(), options(ttl, Duration::from_secs(30)));
    let held = a.acquire(KEY).await.unwrap();
    let a_session = a_backend.zookeeper().session_id();
    let told = when_told(&held);

    // Act: the server dies; A's watchdog cannot renew and A is told; the server is then
    // restarted at once, and B asks for the lock.
    server.kill();
    let (why, _) = within(ttl + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    let server = blocking(move || {
        server.restart();
        server
    })
    .await;
    let restarted = Instant::now();
    let b = locker(
        zk(&connect_string, session).await,
        options(ttl, Duration::from_secs(30)),
    );
    let taken = within(
        // TIMING: A's client finds the server again within a few seconds, and the reaper
        // deletes A's node on its next try (every 200 ms); nothing waits for A's session.
        Duration::from_secs(15),
        "B got the lock while A's session lives on",
        keep_acquiring(b, KEY, held.lost()),
    )
    .await
    .unwrap();

    // Assert: B got the lock long before A's session could have ended, and A's session is
    // the same one (revived, not replaced): only the lapsed lease freed the lock.
    println!(
        "B got the lock {:?} after the restart",
        taken.at.duration_since(restarted)
    );
    assert_eq!(why, LockLost::Unreachable);
    assert_eq!(a_backend.zookeeper().session_id(), a_session);
    assert!(!a_backend.zookeeper().state().is_terminated());
    assert_eq!(taken.old_holder_told, Some(LockLost::Unreachable));
    let b_guard = taken.guard;
    assert!(b_guard.fence() > held.fence());
    assert!(!held.release().await.unwrap().was_held());
    assert!(b_guard.release().await.unwrap().was_held());
    assert_eq!(
        zk_contenders(&connect_string, KEY).await,
        Vec::<String>::new()
    );
    drop(server);
}

/// With the leader of an ensemble of three down, a held lock survives the election, and two
/// processes still take turns, each hold with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_of_three_down_a_held_lock_survives_and_turns_go_on() {
    // Arrange: two processes on the whole ensemble, and A holding the lock.
    // TIMING: a 20 s session outlasts the survivors' election on a busy machine (a few
    // seconds); renewals every second show soon that the lock lives on after it.
    let ensemble = blocking(|| ZooKeeperEnsemble::start(3)).await;
    let connect_string = ensemble.connect_string();
    let session = Duration::from_secs(20);
    let options = LockOptions::builder()
        .ttl(session / 2)
        .renew_interval(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let a = locker(zk(&connect_string, session).await, options.clone());
    let b = locker(zk(&connect_string, session).await, options);
    let held = a.acquire(KEY).await.unwrap();
    let leader = ensemble.leader().expect("a leader");

    // Act: the leader dies; the two others elect a new one.
    let mut ensemble = ensemble;
    ensemble.kill(leader);
    let ensemble = blocking(move || {
        ensemble.wait_for_quorum(Duration::from_secs(60));
        ensemble
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
    let new_leader = ensemble.leader().expect("a new leader");
    assert_ne!(new_leader, leader);
    assert!(held.is_held());
    assert!(matches!(b.try_acquire(KEY).await, Err(Error::Held { .. })));
    assert!(held.release().await.unwrap().was_held());

    // Act / Assert: A and B take the lock five times each, waiting in line for each other;
    // every hold comes with a larger fence than the one before.
    five_turns_each(a, b, KEY).await;
    // Nothing is left in line.
    assert_eq!(
        zk_contenders(&connect_string, KEY).await,
        Vec::<String>::new()
    );
}

/// With two of three members down, acquire fails by its deadline (and try_acquire by its
/// request timeout); once they are back, nothing is left in line and the lock is taken
/// again with a larger fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_down_acquire_times_out_and_recovers_after() {
    let ensemble = blocking(|| ZooKeeperEnsemble::start(3)).await;
    let connect_string = ensemble.connect_string();
    let session = Duration::from_secs(4);
    let a = locker(
        zk(&connect_string, session).await,
        options(session / 2, Duration::from_secs(5)),
    );
    let bounds = TwoDownBounds {
        margin: MARGIN,
        // TIMING: the client holds requests while it looks for a server that serves; each
        // is bounded by the request timeout, and a create that timed out is looked for
        // once (a sync, bounded the same way) before the attempt fails.
        try_acquire_within: REQUEST_TIMEOUT * 2 + MARGIN,
        // TIMING: the new leader gives every session it finds in its log a whole session
        // timeout (rounded up to a tick) from its election: a node of a failed attempt could
        // only live in such a session, as long as that.
        line_empty_within: session + TICK_TIME + MARGIN * 2,
    };
    // A waiter retries what it could not send until its deadline (the session lives on:
    // the client gives it up only 7/5 of its timeout after it last heard from a server), so
    // acquire ends in `Timeout`; try_acquire ends in the client's own time-out.
    let zk_timed_out = |tried: &Error| {
        matches!(
            tried.backend_source(),
            Some(zookeeper_client::Error::Timeout)
        )
    };
    let line = || zk_contenders(&connect_string, KEY);
    let ensemble = two_of_three_down(ensemble, a, KEY, bounds, zk_timed_out, line).await;
    drop(ensemble);
}

/// A holder cut off for longer than its session is told; the next holder gets a larger
/// fence, the store refuses the old holder's write, and the old guard finds the lock taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_cut_off_past_its_session_is_fenced_off() {
    // Arrange: A reaches the server through a proxy that the test cuts; B, directly, waits
    // in line behind A; a fenced store has A's write.
    let server = blocking(ZooKeeperServer::start).await;
    let proxy = TcpProxy::start(server.port());
    let a_backend = zk(&format!("127.0.0.1:{}", proxy.port()), SESSION).await;
    let a = locker(a_backend, options(TTL, Duration::from_secs(30)));
    let b = locker(
        zk(&server.connect_string(), SESSION).await,
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
    // TIMING: the server expires A's session one session timeout (rounded up to a tick)
    // after it last heard from A, which was before the cut; B's watch then fires.
    let taken = within(SESSION + TICK_TIME + MARGIN * 2, "B got the lock", b_waits)
        .await
        .unwrap();

    // Assert: A was told before B got the lock; B's fence is larger, and the store refuses
    // A's write once B has written.
    let b_guard =
        told_first_and_fenced_off(&held, (why, told_at), cut, TTL + MARGIN, taken, &store);

    // Act / Assert: back in reach, A learns its session is over: it cannot advance its
    // fence, its release says the lock was not its own any more, and (on a new session)
    // it takes the lock again after B, with a larger fence still.
    proxy.heal();
    let advanced = within(
        SESSION * 2 + MARGIN,
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

/// A held lock lives through a hang (SIGSTOP) of the server its session is connected to.
///
/// zookeeper-client takes a connection that has not answered for its connection timeout as
/// lost, and reconnects to a server of its list shuffled again, the hung one included (one
/// time in three it picks it again, and waits out another timeout). With its own default
/// (0.4 of the session) the session moved 5.4 to 6.9 s after the stop one time in three,
/// and the holder lost its lock in 9 runs of 20; `ZkLock`'s default, a tenth of the
/// session, leaves room for that second try within the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lock_lives_through_a_hang_of_its_sessions_server() {
    // Arrange: an ensemble of three; A holds the lock with a watchdog, on a session to the
    // whole ensemble that the client has connected to a follower (a hung leader would stop
    // every write until the others elect another, which the leader-down test covers with a
    // kill); B is another process.
    let ensemble = blocking(|| ZooKeeperEnsemble::start(3)).await;
    let connect_string = ensemble.connect_string();
    // TIMING: the ttl is half the session, as the crate is about to require.
    let session = Duration::from_secs(8);
    let ttl = session / 2;
    let leader = ensemble.leader().expect("a leader");
    // The client picks a server at random: sessions until one is on a follower.
    let mut tries = 0;
    let (a_backend, hung) = loop {
        tries += 1;
        assert!(tries <= 20, "no session of 20 was connected to a follower");
        let backend = zk(&connect_string, session).await;
        let sid = backend.zookeeper().session_id().0;
        match ensemble.member_with_session(sid) {
            Some(member) if member != leader => break (backend, member),
            _ => {}
        }
    };
    let sid = a_backend.zookeeper().session_id().0;
    let a = locker(a_backend, options(ttl, Duration::from_secs(30)));
    let b = locker(
        zk(&connect_string, session).await,
        options(ttl, Duration::from_secs(30)),
    );
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);
    let renewals = held.renewals();

    // Act: the server A's session is connected to hangs (SIGSTOP): its connections stay up
    // and nothing answers on them. Watch the session move to another server.
    ensemble.signal(hung, "-STOP");
    let stopped = Instant::now();
    let others: Vec<usize> = (0..3).filter(|&i| i != hung).collect();
    let mut moved_after = None;
    // TIMING: the session and more: renewals had to land through another server all along.
    while stopped.elapsed() < session + MARGIN {
        if moved_after.is_none() && others.iter().any(|&i| ensemble.has_session(i, sid)) {
            moved_after = Some(stopped.elapsed());
        }
        sleep(ms(100)).await;
    }
    let renewed = held.renewals() - renewals;
    println!(
        "after the stop: A's session on another server after {moved_after:?}; {renewed} renewals"
    );

    // Assert: A still holds, renewed through another server, and was never told otherwise.
    if told.is_finished() {
        let (why, at) = told.await.unwrap();
        panic!(
            "A was told its lock is lost {:?} after the stop ({why:?}); its session moved after {moved_after:?}",
            at.duration_since(stopped)
        );
    }
    assert!(moved_after.is_some(), "A's session did not move");
    assert!(held.is_held());
    assert!(renewed >= 2, "{renewed} renewals while the server hung");

    // Act / Assert: B cannot take the lock; once A releases, it can.
    let tried = within(
        REQUEST_TIMEOUT * 2 + MARGIN,
        "B's try_acquire answered",
        b.try_acquire(KEY),
    )
    .await;
    assert!(matches!(tried, Err(Error::Held { .. })), "{tried:?}");
    let a_fence = held.fence();
    assert!(held.release().await.unwrap().was_held());
    let b_guard = within(Duration::from_secs(20), "B got the lock", b.acquire(KEY))
        .await
        .expect("B's acquire after A's release");
    assert!(b_guard.fence() > a_fence);
    assert!(b_guard.release().await.unwrap().was_held());

    // The server goes on; the ensemble is whole again, with nothing left in line.
    ensemble.signal(hung, "-CONT");
    let _ensemble = blocking(move || {
        let mut ensemble = ensemble;
        ensemble.wait_for_quorum(Duration::from_secs(60));
        ensemble
    })
    .await;
    assert_eq!(
        zk_contenders(&connect_string, KEY).await,
        Vec::<String>::new()
    );
}

/// The server grants less than the session asked for (its `maxSessionTimeout` is 4 s, the
/// ask 10 s): the connection timeout is a tenth of the session granted, not of the one asked
/// for (1 s, a quarter of the granted session, which the hang test shows loses the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_timeout_is_a_tenth_of_the_granted_session() {
    // Arrange: a server that grants sessions of at most 4 s.
    let granted = Duration::from_secs(4);
    let server = blocking(move || ZooKeeperServer::start_with_max_session_timeout(granted)).await;

    // Act: a handle asks for 10 s.
    let backend = zk(&server.connect_string(), Duration::from_secs(10)).await;

    // Assert: 4 s granted, and the connection timeout is a tenth of that.
    assert_eq!(backend.session_timeout(), granted);
    assert_eq!(backend.connection_timeout(), granted / 10);
    assert_eq!(backend.max_ttl(), granted / 2);
    drop(server);
}

/// The bound on a handle's claims is on the reaper's backlog (attempts that got no node),
/// not on what it holds: a handle holding more locks than the bound still takes another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_past_the_claims_bound_refuses_no_new_lock() {
    // Arrange: one handle on a healthy server holds BACKLOG locks (more than the bound).
    let server = blocking(ZooKeeperServer::start).await;
    let h = zk(&server.connect_string(), Duration::from_secs(20)).await;
    let ttl = Duration::from_secs(10);
    let mut held = Vec::new();
    for i in 0..BACKLOG {
        let token = Token::new();
        let attempt = h.try_lock(&format!("many_{i}"), &token, ttl).await;
        assert!(
            matches!(attempt, Ok(Attempt::Acquired(_))),
            "lock {i}: {attempt:?}"
        );
        held.push((format!("many_{i}"), token));
    }

    // Act: one more, on a free key.
    let token = Token::new();
    let attempt = h.try_lock("one_more", &token, ttl).await;

    // Assert: taken, not refused as if the ensemble were away.
    assert!(matches!(attempt, Ok(Attempt::Acquired(_))), "{attempt:?}");
    assert_eq!(
        h.unlock("one_more", &token).await.unwrap(),
        Unlock::Released
    );
    for (key, token) in held {
        assert_eq!(h.unlock(&key, &token).await.unwrap(), Unlock::Released);
    }
}

/// How many acquires the reaper test lets fail during its outage: more than the 1,024
/// claims a handle keeps for its reaper at most.
const BACKLOG: usize = 1_100;

/// A handle cut off from the ensemble: its holder is told, and every acquire that fails
/// meanwhile leaves a claim for the reaper (a create whose answer never came may still land).
/// Their number stays bounded; once the handle is back in reach, the lapsed holder's node
/// goes (the next process gets the lock) and every claim is settled, nothing left in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_backlog_stays_bounded_through_an_outage() {
    // Arrange: H reaches the server through a proxy; A holds the lock on H; B, another
    // process, reaches the server directly.
    let server = blocking(ZooKeeperServer::start).await;
    let proxy = TcpProxy::start(server.port());
    let session = Duration::from_secs(20);
    let ttl = Duration::from_secs(2);
    let h = zk(&format!("127.0.0.1:{}", proxy.port()), session).await;
    let a = std::sync::Arc::new(locker(h.clone(), options(ttl, Duration::from_secs(30))));
    let b = locker(
        zk(&server.connect_string(), session).await,
        options(ttl, Duration::from_secs(60)),
    );
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);

    // Act: H is cut off; A is told; many acquires on H fail meanwhile.
    proxy.cut();
    within(ttl + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    let attempts: Vec<_> = (0..BACKLOG)
        .map(|_| {
            let a = std::sync::Arc::clone(&a);
            tokio::spawn(async move { a.try_acquire("backlog").await.map(drop) })
        })
        .collect();
    within(
        // TIMING: a create and a sync, each bounded by the request timeout; the busy
        // machine runs 1,100 of them.
        REQUEST_TIMEOUT * 2 + MARGIN * 5,
        "the attempts failed",
        async {
            for attempt in attempts {
                assert!(attempt.await.unwrap().is_err(), "acquired while cut off");
            }
        },
    )
    .await;

    // Assert: the claims left for the reaper are bounded: at most 1,024 without a node,
    // and the lapsed holder's.
    let unreaped = h.unreaped();
    println!("claims after {BACKLOG} failed attempts: {unreaped}");
    assert!(unreaped <= 1_024 + 1, "{unreaped} claims");

    // Act: H is back in reach (long before its session could end); B asks for the lock.
    proxy.heal();
    let taken = within(
        Duration::from_secs(20),
        "B got the lapsed lock",
        keep_acquiring(b, KEY, held.lost()),
    )
    .await
    .unwrap();

    // Assert: B holds with a larger fence; every claim of H is settled in the end (a
    // create that may have landed is looked for again a session timeout later), with
    // nothing left in either line.
    assert!(taken.guard.fence() > held.fence());
    assert!(taken.guard.release().await.unwrap().was_held());
    within(
        session + TICK_TIME + MARGIN * 3,
        "the reaper settled every claim",
        async {
            while h.unreaped() > 0 {
                sleep(ms(200)).await;
            }
        },
    )
    .await;
    for key in [KEY, "backlog"] {
        assert_eq!(
            zk_contenders(&server.connect_string(), key).await,
            Vec::<String>::new()
        );
    }
    drop(held);
}

/// How many keys the ordering test's failed attempts leave claims on: one listing each.
const BACKLOG_KEYS: usize = 50;

/// A handle cut off from the ensemble: its holder's lease lapses, and acquires on other keys
/// fail meanwhile (their creates, held by the client, land when it reconnects). Once back
/// in reach, the reaper deletes the lapsed holder's node, which blocks others, before any
/// node those attempts left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_deletes_lapsed_holders_before_the_backlog() {
    // Arrange: H reaches the server through a proxy; A holds the lock on H; an observer
    // sees every node created and deleted under the root, in the server's order.
    let server = blocking(ZooKeeperServer::start).await;
    let proxy = TcpProxy::start(server.port());
    let session = Duration::from_secs(20);
    let ttl = Duration::from_secs(2);
    let h = zk(&format!("127.0.0.1:{}", proxy.port()), session).await;
    let a = std::sync::Arc::new(locker(h, options(ttl, Duration::from_secs(30))));
    // Each other key's lock node exists (taken and given back once): a create sent to it
    // lands whenever the server gets it.
    for i in 0..BACKLOG_KEYS {
        let guard = a.acquire(&format!("backlog_{i}")).await.unwrap();
        assert!(guard.release().await.unwrap().was_held());
    }
    let held = a.acquire(KEY).await.unwrap();
    let told = when_told(&held);
    let observer = zookeeper_client::Client::connect(&server.connect_string())
        .await
        .expect("an observer's session");
    let mut events = observer
        .watch(
            distlock::zookeeper::DEFAULT_ROOT,
            zookeeper_client::AddWatchMode::PersistentRecursive,
        )
        .await
        .expect("a recursive watch on the root");

    // Act: H is cut off; A is told; an acquire on each of many other keys fails meanwhile.
    proxy.cut();
    within(ttl + MARGIN, "the holder was told", told)
        .await
        .unwrap();
    let attempts: Vec<_> = (0..BACKLOG_KEYS)
        .map(|i| {
            let a = std::sync::Arc::clone(&a);
            tokio::spawn(async move { a.try_acquire(&format!("backlog_{i}")).await.map(drop) })
        })
        .collect();
    within(
        REQUEST_TIMEOUT * 2 + MARGIN * 2,
        "the attempts failed",
        async {
            for attempt in attempts {
                assert!(attempt.await.unwrap().is_err(), "acquired while cut off");
            }
        },
    )
    .await;
    // TIMING: each failed attempt's release times out too (a request timeout) before it
    // leaves its claim to the reaper: all of them are the reaper's by then.
    sleep(REQUEST_TIMEOUT + MARGIN).await;
    proxy.heal();

    // Assert: the first contender node deleted is A's, while nodes the failed attempts left
    // were there to be deleted.
    let (first_deleted, left) = within(Duration::from_secs(20), "a node was deleted", async {
        let mut left = 0;
        loop {
            let event = events.changed().await;
            if event.path.matches('/').count() != 3 {
                continue;
            }
            match event.event_type {
                zookeeper_client::EventType::NodeCreated => left += 1,
                zookeeper_client::EventType::NodeDeleted => return (event.path, left),
                _ => {}
            }
        }
    })
    .await;
    println!("first deleted: {first_deleted}, after {left} nodes of failed attempts landed");
    let holders = format!("{}/{KEY}/", distlock::zookeeper::DEFAULT_ROOT);
    assert!(
        first_deleted.starts_with(&holders),
        "{first_deleted} was deleted before the lapsed holder's node"
    );
    assert!(left > 0, "no node of a failed attempt landed");
    drop(held);
}
