//! What only the single-Redis backend can show: TTLs on the key itself, the fence counter's
//! key and its floor at the server's clock, Redis going away, and wake-on-release. The
//! properties every backend shares are in `tests/properties.rs`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Error, Fence, LockLost, LockOptions, Locker, ReleaseSignals};
use redis::aio::ConnectionManager;
use support::*;
use testkit::RedisServer;
use tokio::time::{Instant, sleep, timeout};

/// Options for tests that wait: a deadline far beyond any scheduling hiccup.
fn patient() -> LockOptions {
    LockOptions::builder()
        .ttl(ms(5_000))
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(ms(1), ms(20))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_never_exists_without_a_ttl() {
    // Arrange: holders take and give back the lock in a loop while a probe watches the key.
    let (key, _cleanup) = unique_key("ttl");
    let locker = locker(shared_redis().await, patient());
    let mut holders = Vec::new();
    for _ in 0..4 {
        let (locker, key) = (locker.clone(), key.clone());
        holders.push(tokio::spawn(async move {
            for _ in 0..50 {
                let guard = locker.acquire(&key).await.unwrap();
                sleep(ms(1)).await; // long enough for the probe to see the key
                assert!(guard.release().await.unwrap().was_held());
            }
        }));
    }

    // Act: PTTL is -2 (no key) or positive; -1 would be a key without expiry.
    let mut probe = shared_redis().await;
    let (mut seen_locked, mut probes) = (0, 0);
    while holders.iter().any(|h| !h.is_finished()) {
        let ttl = pttl(&mut probe, &key).await;
        assert_ne!(ttl, -1, "the lock key existed without a TTL");
        seen_locked += usize::from(ttl > 0);
        probes += 1;
    }
    for h in holders {
        h.await.unwrap();
    }

    // Assert: the probe did see the key, so the check above meant something.
    assert!(
        seen_locked > 0,
        "the probe never saw the lock in {probes} probes"
    );
    let guard = locker.try_acquire(&key).await.unwrap();
    let ttl = pttl(&mut probe, &key).await;
    assert!(ttl > 0 && ttl <= 5_000, "pttl {ttl}");
    assert!(guard.release().await.unwrap().was_held());
}

#[tokio::test]
async fn the_fence_key_hashes_to_the_lock_keys_slot_and_has_no_ttl() {
    let mut conn = shared_redis().await;
    let (key, _cleanup) = unique_key("fence-key");
    let guard = locker(conn.clone(), patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let fence_key = distlock::redis::fence_key(&key).unwrap();
    assert_eq!(fence_key, format!("{{{key}}}:fence"));
    assert_eq!(
        get(&mut conn, &fence_key).await,
        Some(guard.fence().to_string())
    );
    assert_eq!(pttl(&mut conn, &fence_key).await, -1);
    assert!(guard.release().await.unwrap().was_held());
}

/// The server's clock, in microseconds since the epoch.
async fn server_clock_us(conn: &mut ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

/// Fences stay above every fence issued before when redis loses the counter.
#[tokio::test]
async fn fences_keep_growing_when_redis_loses_the_counter() {
    // Arrange: holders that never write anywhere push the counter on; then holder A takes
    // the highest fence so far and is paused (it keeps its guard, unused).
    let mut server = RedisServer::start();
    let conn = connect(&server.url()).await;
    let locker = locker(conn.clone(), patient());
    for _ in 0..5 {
        assert!(
            locker
                .try_acquire("lock_sale_1")
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
                .was_held()
        );
    }
    let a = locker.try_acquire("lock_sale_1").await.unwrap();
    let stale_fence = a.fence();

    // Act: Redis restarts empty (no persistence), and B takes the lock.
    server.restart_empty();
    let mut conn = connect(&server.url()).await;
    let b = Locker::new(conn.clone(), patient())
        .unwrap()
        .acquire("lock_sale_1")
        .await
        .unwrap();

    // Assert: B's fence is above A's, so a store that accepted B refuses the paused A.
    assert!(
        b.fence() > stale_fence,
        "{} is not above {stale_fence}",
        b.fence()
    );
    assert!(b.fence().get() <= server_clock_us(&mut conn).await);
    assert!(b.release().await.unwrap().was_held());
    drop(a);
}

#[tokio::test]
async fn a_new_fence_counter_starts_at_the_servers_clock_in_microseconds() {
    let (key, _cleanup) = unique_key("fence-clock");
    let mut conn = shared_redis().await;
    let before = server_clock_us(&mut conn).await;

    let guard = locker(conn.clone(), patient())
        .try_acquire(&key)
        .await
        .unwrap();

    let after = server_clock_us(&mut conn).await;
    assert!(
        (before..=after).contains(&guard.fence().get()),
        "fence {} outside the clock readings {before}..={after}",
        guard.fence()
    );
    assert!(guard.release().await.unwrap().was_held());
}

#[tokio::test]
async fn fences_too_large_for_a_lua_number_stay_exact() {
    // Lua numbers are doubles: 2^60 + 1 is not one. Scripts must never round a fence.
    let (key, _cleanup) = unique_key("fence-exact");
    let locker = locker(shared_redis().await, patient());
    let guard = locker.try_acquire(&key).await.unwrap();
    let seen = Fence::new((1 << 60) + 1);

    let advanced = guard.advance_fence(seen).await.unwrap();
    assert!(guard.release().await.unwrap().was_held());
    let next = locker.try_acquire(&key).await.unwrap();

    assert_eq!(advanced, Fence::new((1 << 60) + 2));
    assert_eq!(next.fence(), Fence::new((1 << 60) + 3));
    assert!(next.release().await.unwrap().was_held());
}

#[tokio::test]
async fn the_lost_signal_fires_when_redis_is_unreachable_until_the_lease_ends() {
    // Arrange: a private Redis we can kill.
    let mut server = RedisServer::start();
    let conn = connect(&server.url()).await;
    let options = LockOptions::builder().ttl(ms(900)).build().unwrap();
    let guard = locker(conn, options).acquire("lock_sale_1").await.unwrap();
    let lost = guard.lost();

    // Act
    server.kill();
    let killed_at = Instant::now();

    // Assert: lost once the lease the holder last knew of runs out (at most a ttl after its
    // last renewal, plus room for a busy machine).
    let why = timeout(Duration::from_secs(10), lost).await.unwrap();
    assert_eq!(why, LockLost::Unreachable);
    assert!(!guard.is_held());
    assert!(killed_at.elapsed() <= ms(900) + Duration::from_secs(5));
    drop(guard);
}

#[tokio::test]
async fn acquire_fails_at_once_when_redis_is_down() {
    let mut server = RedisServer::start();
    let conn = connect(&server.url()).await;
    server.kill();
    let locker = locker(conn, patient()); // would wait 60 s for a held lock
    let outcome = timeout(Duration::from_secs(30), locker.acquire("k"))
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            Err(Error::Backend {
                backend: "redis",
                ..
            })
        ),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn an_attempt_abandoned_at_the_deadline_does_not_leave_its_key_behind() {
    // Arrange: a private Redis, frozen (SIGSTOP) so the acquire command sits unanswered, and
    // a connection without a response timeout so the only deadline is the lock's.
    let server = RedisServer::start();
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(60)) // long: only a release, not expiry, can remove the key
        .wait_timeout(ms(300))
        .build()
        .unwrap();
    let locker = locker(conn.clone(), options);
    // Load the scripts first: a frozen server cannot answer a NOSCRIPT reload.
    let warm_up = locker.try_acquire("warm-up").await.unwrap();
    assert!(warm_up.release().await.unwrap().was_held());
    server.signal("-STOP");

    // Act: the attempt is abandoned at the deadline; then Redis wakes up and runs the
    // queued acquire, and after it the release by token.
    let outcome = locker.acquire("lock_sale_1").await;
    server.signal("-CONT");

    // Assert
    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    let mut conn = conn;
    let gone = async {
        loop {
            let exists: i64 = redis::cmd("EXISTS")
                .arg("lock_sale_1")
                .query_async(&mut conn)
                .await
                .unwrap();
            if exists == 0 {
                break;
            }
            sleep(ms(10)).await;
        }
    };
    timeout(Duration::from_secs(5), gone)
        .await
        .expect("the abandoned attempt's key was left behind");
    // The acquire did run (its fence counter exists), so the key really was set and released.
    let fence: Option<u64> = redis::cmd("GET")
        .arg("{lock_sale_1}:fence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(fence.is_some(), "the acquire never ran");
}

/// A locker on `url` whose waiters wait for release messages, with `backstop` as the
/// longest wait between attempts.
async fn signalled_locker(
    url: &str,
    backstop: Duration,
    wait: Duration,
) -> Locker<ConnectionManager> {
    let client = redis::Client::open(url).unwrap();
    let signals = ReleaseSignals::connect(&client).await.unwrap();
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .wait_timeout(wait)
        .retry_delay(backstop, backstop)
        .build()
        .unwrap();
    locker(connect(url).await, options).with_release_signals(signals)
}

/// Wait (up to 10 s) until one connection, other than the one with client id `not`, is
/// subscribed to the release channel of `key` on `admin`'s Redis; its client id.
async fn wait_for_subscriber(admin: &mut ConnectionManager, key: &str, not: Option<u64>) -> u64 {
    let channel = distlock::redis::release_channel(key).unwrap();
    let found = async {
        loop {
            let (_, count): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut *admin)
                .await
                .unwrap();
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("TYPE")
                .arg("pubsub")
                .query_async(&mut *admin)
                .await
                .unwrap();
            let subscribed = clients.lines().find_map(|line| {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                let id = field("id")?;
                (field("sub")? >= 1 && Some(id) != not).then_some(id)
            });
            if let (1, Some(id)) = (count, subscribed) {
                return id;
            }
            sleep(ms(10)).await;
        }
    };
    timeout(Duration::from_secs(10), found)
        .await
        .expect("the waiter never subscribed to the release channel")
}

/// A waiter is woken within milliseconds of the release not after its backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_within_milliseconds_not_after_its_backoff() {
    // Arrange: a waiter whose backoff would be 5 s without signals.
    let (key, _cleanup) = unique_key("wake");
    let holder = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let waiter = signalled_locker(
        &redis_url(),
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
    .await;
    let waiting = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = waiter.acquire(&key).await.unwrap();
            let got_it = Instant::now();
            assert!(guard.release().await.unwrap().was_held());
            got_it
        })
    };
    sleep(ms(300)).await; // the waiter has tried once and sleeps

    // Act
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap().was_held());
    let got_it = waiting.await.unwrap();

    // Assert: woken by the message, well before its backoff. TIMING: the waiter's first try
    // came at most about 300 ms before the release, so without the message its next one
    // would come some 4.7 s after it; 1.5 s leaves a busy machine room and still tells the
    // two apart.
    let handoff = got_it.duration_since(released_at);
    eprintln!("handoff after release: {handoff:?}");
    assert!(
        handoff < ms(1_500),
        "the waiter took {handoff:?} after the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_message_costs_at_most_the_backstop() {
    // Arrange: a private Redis; a waiter with a 300 ms backstop; a holder.
    let server = RedisServer::start();
    let mut admin = connect(&server.url()).await;
    let holder = locker(connect(&server.url()).await, patient())
        .try_acquire("lock_sale_1")
        .await
        .unwrap();
    let backstop = ms(300);
    let waiter = signalled_locker(&server.url(), backstop, Duration::from_secs(60)).await;
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire("lock_sale_1").await.unwrap();
        let got_it = Instant::now();
        assert!(guard.release().await.unwrap().was_held());
        got_it
    });
    wait_for_subscriber(&mut admin, "lock_sale_1", None).await;

    // Act: the subscription is killed from outside, then the lock goes away without any
    // message (deleted, as an expiry would).
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    sleep(ms(100)).await;
    let freed_at = Instant::now();
    redis::cmd("DEL")
        .arg("lock_sale_1")
        .exec_async(&mut admin)
        .await
        .unwrap();
    let got_it = timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter hung")
        .unwrap();

    // Assert: the waiter noticed within its backstop (plus room for a busy machine), not
    // never (its wait is a minute).
    assert_eq!(killed, 1, "the subscription connection was not found");
    let waited = got_it.duration_since(freed_at);
    assert!(
        waited < backstop + ms(2_500),
        "took {waited:?} after the lock was freed"
    );
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signalled_waiter_never_waits_past_its_deadline() {
    let (key, _cleanup) = unique_key("signal-deadline");
    let holder = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let wait = ms(400);
    let waiter = signalled_locker(&redis_url(), ms(150), wait).await;

    let started = Instant::now();
    let outcome = waiter.acquire(&key).await;
    let elapsed = started.elapsed();

    assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
    assert!(
        elapsed >= wait && elapsed < wait + Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert!(holder.release().await.unwrap().was_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_one_process_take_the_lock_in_the_order_they_asked() {
    // Arrange: the lock is held; five waiters of one locker ask for it a second apart.
    let (key, _cleanup) = unique_key("turns");
    let holder = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let waiter = signalled_locker(&redis_url(), ms(50), Duration::from_secs(60)).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (waiter, key, order) = (waiter.clone(), key.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let guard = waiter.acquire(&key).await.unwrap();
            order.lock().unwrap().push(i);
            sleep(ms(5)).await;
            assert!(guard.release().await.unwrap().was_held());
        }));
        sleep(ms(1_000)).await; // long enough to join the queue on a busy machine
    }

    // Act
    assert!(holder.release().await.unwrap().was_held());
    for task in tasks {
        task.await.unwrap();
    }

    // Assert
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_subscription_is_killed_a_waiter_is_woken_by_messages_again() {
    // Arrange: a waiter with a 10 s backstop, so only a message can wake it quickly; a
    // holder whose 30 s lease cannot free the lock meanwhile.
    let server = RedisServer::start();
    let mut admin = connect(&server.url()).await;
    let long_lease = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let holder = locker(connect(&server.url()).await, long_lease)
        .try_acquire("lock_sale_1")
        .await
        .unwrap();
    let waiter = signalled_locker(
        &server.url(),
        Duration::from_secs(10),
        Duration::from_secs(60),
    )
    .await;
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire("lock_sale_1").await.unwrap();
        let got_it = Instant::now();
        assert!(guard.release().await.unwrap().was_held());
        got_it
    });
    let first = wait_for_subscriber(&mut admin, "lock_sale_1", None).await;

    // Act: kill the subscription; wait until it is back; then a normal release.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    wait_for_subscriber(&mut admin, "lock_sale_1", Some(first)).await;
    let released_at = Instant::now();
    assert!(holder.release().await.unwrap().was_held());
    let got_it = timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();

    // Assert: woken by the release message on the new subscription, not by the backstop
    // (which would take up to 10 s).
    assert_eq!(killed, 1);
    let waited = got_it.duration_since(released_at);
    assert!(
        waited < ms(3_000),
        "took {waited:?}: the subscription did not come back"
    );
}

/// Two tasks of one owner both get in while another process holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_two_waiting_tasks_both_get_in_after_another_holder() {
    // Arrange: another "process" holds the lock; two tasks of one owner wait for it.
    let (key, _cleanup) = unique_key("owner-turns");
    let other = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let owner = signalled_locker(&redis_url(), ms(50), Duration::from_secs(60))
        .await
        .owner();
    let (a, b) = (owner.clone(), owner.clone());
    let (key_a, key_b) = (key.clone(), key.clone());
    let first = tokio::spawn(async move { a.acquire(&key_a).await.unwrap() });
    let second = tokio::spawn(async move { b.acquire(&key_b).await.unwrap() });
    sleep(ms(200)).await;

    // Act
    assert!(other.release().await.unwrap().was_held());

    // Assert: both get in (one acquisition, re-entered); neither waits for the other.
    let first = timeout(Duration::from_secs(5), first)
        .await
        .expect("the first task hung")
        .unwrap();
    let second = timeout(Duration::from_secs(5), second)
        .await
        .expect("the second task hung")
        .unwrap();
    assert_eq!(first.fence(), second.fence());
    assert_eq!(first.hold_count(), 2);
    assert!(second.release().await.unwrap().was_held());
    assert!(first.release().await.unwrap().was_held());
}

#[tokio::test]
async fn a_fence_counter_set_back_by_a_failover_still_hands_out_a_larger_fence() {
    // Arrange: A takes a fence; then Redis comes back with its counter *behind* (a failover
    // to a replica that missed A's acquisition, or a restore from an older snapshot): not
    // empty, just one step back.
    let (key, _cleanup) = unique_key("fence-behind");
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), patient());
    let a = locker.try_acquire(&key).await.unwrap();
    let a_fence = a.fence();
    drop(a);
    wait_until_gone(&mut conn, &key).await;
    redis::cmd("SET")
        .arg(distlock::redis::fence_key(&key).unwrap())
        .arg(a_fence.get() - 1)
        .exec_async(&mut conn)
        .await
        .unwrap();

    // Act: B acquires from the counter that went back.
    let b = locker.try_acquire(&key).await.unwrap();

    // Assert: two acquisitions never share a fence, and B's is above the server's clock
    // reading at A's acquisition.
    assert!(
        b.fence() > a_fence,
        "B got fence {} after A's {a_fence}: a stale A would be let through",
        b.fence()
    );
    assert!(b.release().await.unwrap().was_held());
}

/// Wait (up to 10 s) until `key` is gone from the shared Redis.
async fn wait_until_gone(conn: &mut ConnectionManager, key: &str) {
    for _ in 0..1_000 {
        if get(conn, key).await.is_none() {
            return;
        }
        sleep(ms(10)).await;
    }
    panic!("{key} was not released");
}

/// A reentrant owner gets in at once while another owner waits for its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_owner_gets_in_at_once_past_a_waiting_owner() {
    // Arrange: X (another process) holds the key. In this process T1 (owner O) waits with the
    // local turn, T3 (owner P) waits behind it, then T2 (owner O) behind T3.
    let (key, _cleanup) = unique_key("reenter-turn");
    let x = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let here = signalled_locker(&redis_url(), ms(50), Duration::from_secs(60)).await;
    let (o, p) = (here.owner(), here.owner());
    let t1 = {
        let (o, key) = (o.clone(), key.clone());
        tokio::spawn(async move { o.acquire(&key).await.unwrap() })
    };
    sleep(ms(1_000)).await; // long enough to join the queue on a busy machine
    let t3 = {
        let (p, key) = (p.clone(), key.clone());
        tokio::spawn(async move { p.acquire(&key).await.unwrap() })
    };
    sleep(ms(1_000)).await; // long enough to join the queue on a busy machine
    let t2 = {
        let (o, key) = (o.clone(), key.clone());
        tokio::spawn(async move { o.acquire(&key).await.unwrap() })
    };
    sleep(ms(1_000)).await; // long enough to join the queue on a busy machine

    // Act: X releases; T1 gets the lock for O.
    assert!(x.release().await.unwrap().was_held());
    let t1 = timeout(Duration::from_secs(10), t1)
        .await
        .expect("T1 did not get the lock")
        .unwrap();

    // Assert: T2 re-enters O's hold at once, although T3 has the local turn now.
    // (Behind P, T2 would wait until O let go, which happens only after this check.)
    let t2 = timeout(Duration::from_secs(10), t2)
        .await
        .expect("T2 waited behind another owner although its own owner holds the key")
        .unwrap();
    assert_eq!(t2.fence(), t1.fence());
    assert_eq!(t1.hold_count(), 2);
    assert!(!t3.is_finished(), "P got in while O holds the key");
    drop(t2);
    drop(t1);
    let t3 = timeout(Duration::from_secs(10), t3).await.unwrap().unwrap();
    drop(t3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_wait_with_release_signals_makes_exactly_one_attempt() {
    // Arrange: a free key, and a locker whose wait is zero ("try once") and whose release
    // signals come from a Redis that has stopped answering (its subscription would never
    // be confirmed).
    let (key, _cleanup) = unique_key("zero-wait");
    let signals_server = RedisServer::start();
    let client = redis::Client::open(signals_server.url()).unwrap();
    let signals = ReleaseSignals::connect(&client).await.unwrap();
    signals_server.signal("-STOP");
    let once = locker(
        shared_redis().await,
        LockOptions::builder()
            .wait_timeout(Duration::ZERO)
            .build()
            .unwrap(),
    )
    .with_release_signals(signals);

    // Act
    let outcome = timeout(Duration::from_secs(10), once.acquire(&key))
        .await
        .expect("a zero wait did not return");

    // Assert: the one attempt is made, and it finds the key free.
    signals_server.signal("-CONT");
    let guard = outcome.expect("a zero wait gave up without making its one attempt");
    assert!(guard.release().await.unwrap().was_held());
}

#[test]
fn try_acquire_outside_a_tokio_runtime_works_and_the_lease_frees_the_lock() {
    // Arrange: a connection made inside a runtime, used from a thread outside any runtime
    // (its driver task keeps running on the runtime's worker).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (key, _cleanup) = unique_key("no-runtime");
    // A multiplexed connection without a response timeout needs no tokio timer per
    // request (a `ConnectionManager` does).
    let conn = runtime.block_on(async {
        redis::Client::open(redis_url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .unwrap()
    });
    let options = LockOptions::builder().ttl(ms(3_000)).build().unwrap();
    let locker = locker(conn.clone(), options);

    // Act: no runtime here, so nothing can be spawned: no watchdog, no background release.
    let guard = futures::executor::block_on(locker.try_acquire(&key))
        .expect("try_acquire outside a runtime failed");

    // Assert: held, and freed by its lease once dropped.
    assert!(guard.is_held());
    drop(guard);
    runtime.block_on(async {
        let mut conn = shared_redis().await;
        timeout(Duration::from_secs(10), async {
            while get(&mut conn, &key).await.is_some() {
                sleep(ms(20)).await;
            }
        })
        .await
        .expect("the lease did not free the lock");
    });
}
