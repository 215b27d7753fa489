//! The lock against a real Redis (`REDIS_URL`, default `redis://127.0.0.1:6379`).
//! Each test uses keys of its own; tests that kill Redis start their own `redis-server`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use distlock::{Error, LockLost, LockOptions, Locker};
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
async fn mutual_exclusion_keeps_a_racy_counter_exact_under_contention() {
    // Arrange: 4 connections, 32 tasks, each doing a non-atomic read-increment-write.
    let (key, _cleanup) = unique_key("mutex");
    let counter = format!("{key}:counter");
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(locker(shared_redis().await, patient()));
    }
    const TASKS: usize = 32;
    const ROUNDS: usize = 10;

    // Act
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let locker = lockers[i % lockers.len()].clone();
        let (key, counter) = (key.clone(), counter.clone());
        let mut conn = shared_redis().await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locker.acquire(&key).await.unwrap();
                let seen: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::task::yield_now().await; // widen the race the lock must close
                let _: () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(seen.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap(), "lock lost mid-section");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // Assert
    let mut conn = shared_redis().await;
    let total: u64 = get(&mut conn, &counter).await.unwrap().parse().unwrap();
    assert_eq!(total, (TASKS * ROUNDS) as u64);
    assert_eq!(
        get(&mut conn, &key).await,
        None,
        "the lock key is left behind"
    );
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
                guard.release().await.unwrap();
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

    // Assert: the probe did see the key, so the check above meant something.
    for h in holders {
        h.await.unwrap();
    }
    assert!(probes > 0);
    let guard = locker.try_acquire(&key).await.unwrap();
    let ttl = pttl(&mut probe, &key).await;
    assert!(ttl > 0 && ttl <= 5_000, "pttl {ttl}");
    guard.release().await.unwrap();
    eprintln!("probed {probes} times, saw the lock {seen_locked} times");
}

#[tokio::test]
async fn a_stale_guards_release_does_not_delete_the_next_holders_lock() {
    // Arrange: A's lease (no watchdog) runs out and B takes the lock.
    let (key, _cleanup) = unique_key("stale");
    let short = LockOptions::builder()
        .ttl(ms(200))
        .without_watchdog()
        .build()
        .unwrap();
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), short);
    let a = locker.try_acquire(&key).await.unwrap();
    sleep(ms(400)).await;
    assert!(!a.is_held());
    let b = locker.try_acquire(&key).await.unwrap();

    // Act
    let a_was_ours = a.release().await.unwrap();

    // Assert
    assert!(!a_was_ours, "a stale release must report the lock as lost");
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some(b.token()));
    assert!(b.release().await.unwrap());
    assert_eq!(get(&mut conn, &key).await, None);
}

#[tokio::test]
async fn the_lease_frees_a_lock_whose_holder_vanished() {
    // Arrange: a holder that disappears without releasing (no Drop runs, no watchdog).
    let (key, _cleanup) = unique_key("vanish");
    let options = LockOptions::builder()
        .ttl(ms(500))
        .without_watchdog()
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let locker = locker(shared_redis().await, options);
    // Measured before the command is sent: Redis starts the TTL later, so the key cannot
    // expire less than 500 ms after this instant.
    let taken_at = Instant::now();
    let vanished = locker.try_acquire(&key).await.unwrap();
    std::mem::forget(vanished);
    assert!(matches!(
        locker.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));

    // Act
    let next = locker.acquire(&key).await.unwrap();

    // Assert: only the lease could have freed it, so not before it ran out.
    assert!(
        taken_at.elapsed() >= ms(450),
        "freed after {:?}",
        taken_at.elapsed()
    );
    assert!(next.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_the_lock_through_several_ttls_and_stops_after_release() {
    // Arrange: ttl 1.5 s, renewed every 500 ms.
    let (key, _cleanup) = unique_key("watchdog");
    let options = LockOptions::builder().ttl(ms(1_500)).build().unwrap();
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), options);
    let guard = locker.acquire(&key).await.unwrap();
    let token = guard.token().to_owned();

    // Act: work for three ttls, checking as we go.
    for _ in 0..15 {
        sleep(ms(300)).await;
        assert!(guard.is_held());
        assert_eq!(get(&mut conn, &key).await.as_deref(), Some(token.as_str()));
        assert!(matches!(
            locker.try_acquire(&key).await,
            Err(Error::Held { .. })
        ));
    }
    assert!(guard.renewals() >= 6, "renewed {} times", guard.renewals());
    assert!(guard.release().await.unwrap());

    // Assert: put a key with the old token back; a watchdog still running would keep it
    // alive (it renews every 500 ms to 1.5 s), a stopped one lets it expire.
    assert_nothing_renews(&mut conn, &key, &token).await;
}

#[tokio::test]
async fn the_lost_signal_fires_when_the_key_is_deleted_behind_the_holder() {
    let (key, _cleanup) = unique_key("lost-del");
    let options = LockOptions::builder().ttl(ms(600)).build().unwrap();
    let mut conn = shared_redis().await;
    let guard = locker(conn.clone(), options).acquire(&key).await.unwrap();
    assert!(guard.is_held());

    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();

    let why = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    assert_eq!(why, LockLost::Expired);
    assert!(!guard.is_held());
    assert!(!guard.release().await.unwrap());
}

#[tokio::test]
async fn the_lost_signal_fires_when_the_key_is_overwritten_behind_the_holder() {
    let (key, _cleanup) = unique_key("lost-set");
    let options = LockOptions::builder().ttl(ms(600)).build().unwrap();
    let mut conn = shared_redis().await;
    let guard = locker(conn.clone(), options).acquire(&key).await.unwrap();

    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("intruder")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();

    let why = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    assert_eq!(why, LockLost::Taken);
    assert!(!guard.release().await.unwrap());
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some("intruder"));
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_lost_signal_fires_when_redis_is_unreachable_until_the_lease_ends() {
    // Arrange: a private Redis we can kill.
    let mut server = RedisServer::start();
    let conn = connect(&server.url()).await;
    let options = LockOptions::builder().ttl(ms(900)).build().unwrap();
    let guard = Locker::new(conn, options)
        .acquire("lock_sale_1")
        .await
        .unwrap();
    let lost = guard.lost();

    // Act
    server.kill();
    let killed_at = Instant::now();

    // Assert: lost once the lease the holder last knew of runs out, not before.
    let why = timeout(Duration::from_secs(10), lost).await.unwrap();
    assert_eq!(why, LockLost::Unreachable);
    assert!(!guard.is_held());
    assert!(killed_at.elapsed() <= ms(900) + Duration::from_secs(5));
    drop(guard);
}

#[tokio::test]
async fn fences_strictly_increase_across_holders() {
    let (key, _cleanup) = unique_key("fence");
    let mut previous = 0;
    for _ in 0..20 {
        // A new connection and locker each time: a new holder, as in another process.
        let locker = locker(shared_redis().await, patient());
        let guard = locker.acquire(&key).await.unwrap();
        assert!(
            guard.fence().get() > previous,
            "{} after {previous}",
            guard.fence()
        );
        previous = guard.fence().get();
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_never_share_a_fence() {
    let (key, _cleanup) = unique_key("fence-race");
    let locker = locker(shared_redis().await, patient());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (locker, key) = (locker.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..5 {
                let guard = locker.acquire(&key).await.unwrap();
                fences.push(guard.fence().get());
                guard.release().await.unwrap();
            }
            fences
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "two acquisitions got the same fence");
}

#[tokio::test]
async fn the_fence_key_hashes_to_the_lock_keys_slot_and_has_no_ttl() {
    let mut conn = shared_redis().await;
    let (key, _cleanup) = unique_key("fence-key");
    let guard = locker(conn.clone(), patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let fence_key = distlock::fence_key(&key).unwrap();
    assert_eq!(fence_key, format!("{{{key}}}:fence"));
    assert_eq!(
        get(&mut conn, &fence_key).await,
        Some(guard.fence().to_string())
    );
    assert_eq!(pttl(&mut conn, &fence_key).await, -1);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn the_same_owner_reenters_and_the_key_goes_when_the_count_returns_to_zero() {
    // Arrange
    let (key, _cleanup) = unique_key("reentrant");
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), patient());
    let owner = locker.owner();
    let stranger = locker.owner();

    // Act / Assert: the owner re-enters, others are kept out.
    let outer = owner.acquire(&key).await.unwrap();
    let inner = owner.clone().try_acquire(&key).await.unwrap();
    assert_eq!(inner.hold_count(), 2);
    assert_eq!(inner.fence(), outer.fence(), "one acquisition, one fence");
    assert!(matches!(
        stranger.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));
    assert!(matches!(
        locker.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));

    assert!(inner.release().await.unwrap());
    assert_eq!(outer.hold_count(), 1);
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some(outer.token()));
    assert!(matches!(
        stranger.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));

    assert!(outer.release().await.unwrap());
    assert_eq!(get(&mut conn, &key).await, None);
    stranger
        .try_acquire(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn plain_acquisitions_are_not_reentrant() {
    let (key, _cleanup) = unique_key("not-reentrant");
    let locker = locker(shared_redis().await, patient());
    let first = locker.try_acquire(&key).await.unwrap();
    assert!(matches!(
        locker.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));
    first.release().await.unwrap();
}

#[tokio::test]
async fn try_acquire_returns_at_once_when_the_lock_is_held() {
    let (key, _cleanup) = unique_key("try");
    let locker = locker(shared_redis().await, patient()); // waits up to 60 s in acquire
    let holder = locker.try_acquire(&key).await.unwrap();

    let started = Instant::now();
    let outcome = locker.try_acquire(&key).await;

    assert!(
        matches!(outcome, Err(Error::Held { key: ref held }) if *held == key),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    holder.release().await.unwrap();
}

#[tokio::test]
async fn acquire_gives_up_at_its_deadline() {
    // Arrange: the lock is held for longer than the waiter will wait.
    let (key, _cleanup) = unique_key("deadline");
    let holder = locker(shared_redis().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let wait = ms(700);
    let waiter = locker(
        shared_redis().await,
        LockOptions::builder().wait_timeout(wait).build().unwrap(),
    );

    // Act
    let started = Instant::now();
    let outcome = waiter.acquire(&key).await;
    let elapsed = started.elapsed();

    // Assert: not before the deadline, and not long after it.
    match outcome {
        Err(Error::Timeout { waited, .. }) => assert!(waited >= wait, "{waited:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        elapsed >= wait && elapsed < wait + Duration::from_secs(5),
        "{elapsed:?}"
    );
    holder.release().await.unwrap();
}

#[tokio::test]
async fn acquire_gets_the_lock_once_the_holder_releases_it() {
    let (key, _cleanup) = unique_key("handoff");
    let locker = locker(shared_redis().await, patient());
    let holder = locker.try_acquire(&key).await.unwrap();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.acquire(&key).await.map(|g| g.fence()) })
    };
    sleep(ms(100)).await;
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let fence = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(fence > holder_fence);
}

#[tokio::test]
async fn an_empty_key_is_refused_before_redis_is_asked() {
    let locker = locker(shared_redis().await, patient());
    assert!(matches!(
        locker.try_acquire("").await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        locker.acquire("").await,
        Err(Error::InvalidKey { .. })
    ));
}

#[tokio::test]
async fn acquire_fails_at_once_when_redis_is_down() {
    let mut server = RedisServer::start();
    let conn = connect(&server.url()).await;
    server.kill();
    let locker = Locker::new(conn, patient()); // would wait 60 s for a held lock
    let outcome = timeout(Duration::from_secs(30), locker.acquire("k"))
        .await
        .unwrap();
    assert!(matches!(outcome, Err(Error::Redis(_))), "{outcome:?}");
}

#[tokio::test]
async fn dropping_an_unreleased_guard_releases_the_lock() {
    let (key, _cleanup) = unique_key("drop");
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), patient()); // ttl 5 s: only the fallback frees it sooner
    let guard = locker.try_acquire(&key).await.unwrap();

    drop(guard);

    wait_until_gone(&mut conn, &key, "the drop fallback did not release").await;
    locker
        .try_acquire(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dropped_reentrant_guard_counts_down_and_the_last_one_releases() {
    let (key, _cleanup) = unique_key("drop-reentrant");
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), patient());
    let owner = Arc::new(locker.owner());
    let outer = owner.try_acquire(&key).await.unwrap();
    let inner = owner.try_acquire(&key).await.unwrap();

    drop(inner);
    assert_eq!(outer.hold_count(), 1);
    assert!(get(&mut conn, &key).await.is_some());
    drop(outer);

    wait_until_gone(&mut conn, &key, "the last drop did not release").await;
}

#[tokio::test]
async fn the_holder_can_advance_its_fence_past_a_counter_that_went_back() {
    // Arrange: a store has seen fence 1000, but the counter was lost and restarts low.
    let (key, _cleanup) = unique_key("advance");
    let mut conn = shared_redis().await;
    let locker = locker(conn.clone(), patient());
    let guard = locker.try_acquire(&key).await.unwrap();
    assert!(guard.fence().get() < 1000);

    // Act
    let fence = guard.advance_fence(distlock::Fence(1000)).await.unwrap();

    // Assert: above what the store saw, kept by the guard, and the counter moved on.
    assert_eq!(fence.get(), 1001);
    assert_eq!(guard.fence(), fence);
    guard.release().await.unwrap();
    let next = locker.try_acquire(&key).await.unwrap();
    assert_eq!(next.fence().get(), 1002);
    next.release().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(distlock::fence_key(&key).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stale_holder_cannot_advance_its_fence() {
    let (key, _cleanup) = unique_key("advance-stale");
    let short = LockOptions::builder()
        .ttl(ms(200))
        .without_watchdog()
        .build()
        .unwrap();
    let locker = locker(shared_redis().await, short);
    let stale = locker.try_acquire(&key).await.unwrap();
    sleep(ms(400)).await;
    let newer = locker.try_acquire(&key).await.unwrap();

    let outcome = stale.advance_fence(newer.fence()).await;

    assert!(matches!(outcome, Err(Error::NotHeld { .. })), "{outcome:?}");
    assert!(stale.fence() < newer.fence());
    newer.release().await.unwrap();
}

#[tokio::test]
async fn a_dropped_guard_stops_its_watchdog() {
    // Arrange: a lease renewed every 300 ms, dropped without release.
    let (key, _cleanup) = unique_key("drop-watchdog");
    let mut conn = shared_redis().await;
    let locker = locker(
        conn.clone(),
        LockOptions::builder().ttl(ms(900)).build().unwrap(),
    );
    let guard = locker.try_acquire(&key).await.unwrap();
    let token = guard.token().to_owned();

    // Act
    drop(guard);
    wait_until_gone(&mut conn, &key, "the drop fallback did not release").await;

    // Assert: a key with the old token is left to expire; a live watchdog would renew it.
    assert_nothing_renews(&mut conn, &key, &token).await;
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
    let locker = Locker::new(conn.clone(), options);
    // Load the scripts first: a frozen server cannot answer a NOSCRIPT reload.
    locker
        .try_acquire("warm-up")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.signal("-STOP");

    // Act: the attempt is abandoned at the deadline; then Redis wakes up and runs the
    // queued SET, and after it the release by token.
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
    // The SET did run (the fence moved), so the key really was set and then released.
    let fence: Option<u64> = redis::cmd("GET")
        .arg("{lock_sale_1}:fence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fence, Some(1));
}
