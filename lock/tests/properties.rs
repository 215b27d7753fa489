//! The properties a lock needs, written once and run against every backend: one Redis, a
//! Redlock majority of three private masters, Redis behind three Sentinels (a primary and a
//! replica, with the `sentinel` feature), and the PostgreSQL lock table (with the
//! `postgres` feature), ZooKeeper and etcd (private servers, with the `zookeeper` and `etcd`
//! features; all four features are on in the workspace). A property that only one backend can
//! show lives in that backend's own test file; the two properties of a backend that keeps its
//! own line of waiters (arrival order, no herd) are at the end, for ZooKeeper and etcd.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use distlock::backend::{Attempt, Token, Unlock};
use distlock::{Backend, Error, Fence, LockLost, LockOptions, ReleaseOutcome};
use support::*;
use tokio::time::{Instant, sleep, sleep_until, timeout};

/// Options for tests that wait: a deadline far beyond any scheduling hiccup.
fn patient() -> LockOptions {
    LockOptions::builder()
        .ttl(ms(5_000))
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(ms(1), ms(20))
        .build()
        .unwrap()
}

/// A lease that runs out quickly and is never renewed.
fn short_unwatched(ttl: u64) -> LockOptions {
    LockOptions::builder()
        .ttl(ms(ttl))
        .without_watchdog()
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn mutual_exclusion_keeps_a_racy_counter_exact_under_contention<H: Harness>(h: H) {
    // Arrange: 4 lockers (4 "processes"), 24 tasks, each doing a read-yield-write that
    // loses updates unless the lock keeps the tasks apart.
    let key = h.key("mutex");
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(locker(h.backend().await, patient()));
    }
    let counter = Arc::new(AtomicU64::new(0));
    const TASKS: usize = 24;
    const ROUNDS: usize = 5;

    // Act
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let (locker, key, counter) = (lockers[i % 4].clone(), key.clone(), Arc::clone(&counter));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locker.acquire(&key).await.unwrap();
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await; // widen the race the lock must close
                sleep(ms(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                assert!(
                    guard.release().await.unwrap().was_held(),
                    "lock lost mid-section"
                );
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // Assert
    assert_eq!(counter.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    assert_eq!(h.holder(&key).await, None, "the lock is left behind");
}

async fn the_lease_frees_a_lock_whose_holder_vanished<H: Harness>(h: H) {
    // Arrange: a holder that disappears without releasing (no Drop runs, no watchdog).
    // TIMING: the lease must outlast the second try below, which expects it held: 2 s (and
    // 5 short leases where a backend needs longer ones for fair answers).
    let key = h.key("vanish");
    let lease = ms((5 * h.short_ms()).max(2_000));
    let locker = locker(h.backend().await, short_unwatched(lease.as_millis() as u64));
    // Measured before the command is sent: the backend starts the lease later, so the lock
    // cannot be free less than a lease after this instant.
    let taken_at = Instant::now();
    std::mem::forget(locker.try_acquire(&key).await.unwrap());

    assert!(matches!(
        locker.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));

    // Act: another process waits for it.
    let next = crate::locker(h.backend().await, short_unwatched(lease.as_millis() as u64))
        .acquire(&key)
        .await
        .unwrap();

    // Assert: only the lease could have freed it, so not before it ran out.
    let waited = taken_at.elapsed();
    assert!(waited >= lease, "freed after {waited:?}");
    assert!(next.release().await.unwrap().was_held());
}

async fn a_stale_guards_release_does_not_delete_the_next_holders_lock<H: Harness>(h: H) {
    // Arrange: A's lease (no watchdog) runs out and B takes the lock.
    let key = h.key("stale");
    let short = h.short_ms();
    let locker = locker(h.backend().await, short_unwatched(short));
    let a = locker.try_acquire(&key).await.unwrap();
    sleep(ms(2 * short)).await;
    // TIMING: the store frees it by itself soon after the lease (a Redis or etcd expiry,
    // ZkLock's reaper): wait until it has, rather than count on a margin.
    wait_until_free(&h, &key, "the lapsed lease did not free the lock").await;
    assert!(!a.is_held());
    // B's lease is long: the steps below must not outlast it on a busy machine.
    let b = locker
        .try_acquire_with(&key, &short_unwatched(30_000))
        .await
        .unwrap();

    // Act
    let a_was_ours = a.release().await.unwrap().was_held();

    // Assert
    assert!(!a_was_ours, "a stale release must report the lock as lost");
    assert_eq!(h.holder(&key).await.as_deref(), Some(b.token().expose()));
    assert!(b.release().await.unwrap().was_held());
    assert_eq!(h.holder(&key).await, None);
}

async fn fences_strictly_increase_across_holders_and_a_deleted_lock<H: Harness>(h: H) {
    let key = h.key("fences");
    let mut previous = Fence::new(0);
    for round in 0..12 {
        // A new backend handle and locker each time: a new holder, as in another process.
        let locker = locker(h.backend().await, patient());
        let guard = locker.acquire(&key).await.unwrap();
        assert!(
            guard.fence() > previous,
            "{} after {previous}",
            guard.fence()
        );
        previous = guard.fence();
        if round % 3 == 0 {
            // Deleted behind the holder's back and then taken again: the fence still grows.
            h.delete(&key).await;
            drop(guard);
        } else {
            assert!(guard.release().await.unwrap().was_held());
        }
    }
}

async fn fences_follow_the_order_in_which_contending_holders_held_the_lock<H: Harness>(h: H) {
    // Arrange: 12 tasks on 3 lockers contend; each notes its place in the holding order
    // while it holds the lock (so the places are the true order of the holds).
    let key = h.key("fence-order");
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(h.backend().await, patient()));
    }
    let place = Arc::new(AtomicU64::new(0));

    // Act
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (locker, key, place) = (lockers[i % 3].clone(), key.clone(), Arc::clone(&place));
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..4 {
                let guard = locker.acquire(&key).await.unwrap();
                seen.push((place.fetch_add(1, Ordering::SeqCst), guard.fence()));
                assert!(guard.release().await.unwrap().was_held());
            }
            seen
        }));
    }
    let mut holds = Vec::new();
    for task in tasks {
        holds.extend(task.await.unwrap());
    }

    // Assert: in holding order, every fence is above the one before.
    holds.sort_unstable();
    assert_eq!(holds.len(), 48);
    for pair in holds.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "hold {} got fence {} after hold {} got {}",
            pair[1].0,
            pair[1].1,
            pair[0].0,
            pair[0].1
        );
    }
}

/// The same owner reenters and the lock goes when the count returns to zero.
async fn reentrant_owner_releases_the_lock_when_its_count_reaches_zero<H: Harness>(h: H) {
    // Arrange
    let key = h.key("reentrant");
    let locker = locker(h.backend().await, patient());
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

    assert!(inner.release().await.unwrap().was_held());
    assert_eq!(outer.hold_count(), 1);
    assert_eq!(
        h.holder(&key).await.as_deref(),
        Some(outer.token().expose())
    );
    assert!(matches!(
        stranger.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));

    assert!(outer.release().await.unwrap().was_held());
    assert_eq!(h.holder(&key).await, None);
    let later = stranger.try_acquire(&key).await.unwrap();
    assert!(later.release().await.unwrap().was_held());
}

async fn plain_acquisitions_are_not_reentrant<H: Harness>(h: H) {
    let key = h.key("not-reentrant");
    let locker = locker(h.backend().await, patient());
    let first = locker.try_acquire(&key).await.unwrap();
    assert!(matches!(
        locker.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));
    assert!(first.release().await.unwrap().was_held());
}

async fn try_acquire_returns_at_once_when_the_lock_is_held<H: Harness>(h: H) {
    let key = h.key("try");
    let locker = locker(h.backend().await, patient()); // acquire would wait up to 60 s
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
    assert!(holder.release().await.unwrap().was_held());
}

async fn acquire_gives_up_at_its_deadline<H: Harness>(h: H) {
    // Arrange: the lock is held for longer than the waiter will wait.
    let key = h.key("deadline");
    let holder = locker(h.backend().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    let wait = ms(700);
    let waiter = locker(
        h.backend().await,
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
    assert!(holder.release().await.unwrap().was_held());
}

async fn acquire_gets_the_lock_once_the_holder_releases_it<H: Harness>(h: H) {
    let key = h.key("handoff");
    let locker = locker(h.backend().await, patient());
    let holder = locker.try_acquire(&key).await.unwrap();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.acquire(&key).await.map(|g| g.fence()) })
    };
    sleep(ms(100)).await;
    let holder_fence = holder.fence();
    assert!(holder.release().await.unwrap().was_held());
    let fence = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(fence > holder_fence);
}

async fn an_acquisition_that_had_to_wait_says_it_was_contended<H: Harness>(h: H) {
    // Arrange: a free key is taken at once.
    let key = h.key("contended");
    let locker = locker(h.backend().await, patient());
    let holder = locker.acquire(&key).await.unwrap();
    assert!(!holder.was_contended(), "the key was free");

    // Act: a waiter asks while the lock is held (it is released a second after the waiter
    // said it was about to ask, a margin no scheduling delay reaches).
    let (asking, asked) = tokio::sync::oneshot::channel();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move {
            asking.send(()).unwrap();
            locker.acquire(&key).await
        })
    };
    asked.await.unwrap();
    sleep(ms(1_000)).await;
    assert!(holder.release().await.unwrap().was_held());

    // Assert: the waiter had to wait; once the key is free again, neither the next acquire
    // nor a try says so.
    let waited = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(waited.was_contended(), "the waiter found the lock held");
    assert!(waited.release().await.unwrap().was_held());
    let again = locker.acquire(&key).await.unwrap();
    assert!(!again.was_contended(), "the key was free again");
    assert!(again.release().await.unwrap().was_held());
    let tried = locker.try_acquire(&key).await.unwrap();
    assert!(!tried.was_contended());
    assert!(tried.release().await.unwrap().was_held());
}

async fn an_endless_wait_gets_the_lock_once_the_holder_releases_it<H: Harness>(h: H) {
    // `Duration::MAX` means no deadline: it must not overflow the clock it is added to.
    let key = h.key("endless");
    let endless = LockOptions::builder()
        .ttl(ms(5_000))
        .wait_timeout(Duration::MAX)
        .retry_delay(ms(1), ms(20))
        .build()
        .unwrap();
    let locker = locker(h.backend().await, endless);
    let holder = locker.try_acquire(&key).await.unwrap();
    let waiter = {
        let (locker, key) = (locker.clone(), key.clone());
        tokio::spawn(async move { locker.acquire(&key).await.map(|g| g.fence()) })
    };
    sleep(ms(100)).await;
    assert!(!waiter.is_finished(), "the waiter did not wait");
    let holder_fence = holder.fence();
    assert!(holder.release().await.unwrap().was_held());
    let fence = timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .expect("the waiter panicked")
        .unwrap();
    assert!(fence > holder_fence);
}

/// The watchdog keeps the lock through several ttls and stops after release.
async fn watchdog_keeps_the_lock_for_several_ttls_and_stops_at_release<H: Harness>(h: H) {
    // Arrange: ttl 3 s, renewed every second.
    // TIMING: a renewal may come a second late (a busy machine, a backend's slow answer)
    // and still land within the lease; without a watchdog the lock would go at 3 s, a third
    // of the way through the loop below.
    let key = h.key("watchdog");
    let options = LockOptions::builder().ttl(ms(3_000)).build().unwrap();
    let locker = locker(h.backend().await, options);
    let guard = locker.acquire(&key).await.unwrap();
    let token = guard.token().expose().to_owned();

    // Act: work for three ttls, checking as we go.
    for _ in 0..30 {
        sleep(ms(300)).await;
        assert!(guard.is_held());
        assert_eq!(h.holder(&key).await.as_deref(), Some(token.as_str()));
        assert!(matches!(
            locker.try_acquire(&key).await,
            Err(Error::Held { .. })
        ));
    }
    assert!(guard.renewals() >= 6, "renewed {} times", guard.renewals());
    assert!(guard.release().await.unwrap().was_held());

    // Assert: a lock with the old token, put back, is left to expire.
    assert_nothing_renews(&h, &key, &token, ms(1_000)).await;
}

async fn a_dropped_guard_releases_the_lock<H: Harness>(h: H) {
    // Arrange: a 30 s lease, so only the drop fallback can free the lock within the test.
    let key = h.key("drop");
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let guard = locker(h.backend().await, options)
        .try_acquire(&key)
        .await
        .unwrap();

    // Act
    let dropped = Instant::now();
    drop(guard);

    // Assert: freed in the background, long before the 30 s lease could have done it.
    wait_until_free(&h, &key, "the drop fallback did not release").await;
    assert!(dropped.elapsed() < Duration::from_secs(10));
}

async fn a_dropped_guard_stops_its_watchdog<H: Harness>(h: H) {
    // Arrange: a lease renewed every 300 ms, held until its watchdog has started and
    // renewed once, then dropped without release.
    let key = h.key("drop-watchdog");
    let locker = locker(
        h.backend().await,
        LockOptions::builder().ttl(ms(900)).build().unwrap(),
    );
    let guard = locker.try_acquire(&key).await.unwrap();
    let token = guard.token().expose().to_owned();
    timeout(Duration::from_secs(10), async {
        while guard.renewals() == 0 {
            sleep(ms(20)).await;
        }
    })
    .await
    .expect("the watchdog never renewed");

    // Act
    drop(guard);

    // Assert: the old token, put back, is no longer renewed.
    wait_until_free(&h, &key, "the drop fallback did not release").await;
    assert_nothing_renews(&h, &key, &token, ms(300)).await;
}

async fn a_dropped_reentrant_guard_counts_down_and_the_last_one_releases<H: Harness>(h: H) {
    // A 30 s lease, so only the last drop's release can free the lock within the wait below.
    let key = h.key("drop-reentrant");
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let locker = locker(h.backend().await, options);
    let owner = locker.owner();
    let outer = owner.try_acquire(&key).await.unwrap();
    let inner = owner.try_acquire(&key).await.unwrap();

    drop(inner);
    assert_eq!(outer.hold_count(), 1);
    assert!(h.holder(&key).await.is_some());
    drop(outer);

    wait_until_free(&h, &key, "the last drop did not release").await;
}

async fn the_lost_signal_fires_when_the_lock_is_deleted_behind_the_holder<H: Harness>(h: H) {
    // TIMING: a 3 s lease renewed every second: the renewal that finds the lock gone comes
    // long before the holder's own view of its lease runs out (which would say Expired or
    // Unreachable for the wrong reason), even a second late.
    let key = h.key("lost-deleted");
    let guard = locker(
        h.backend().await,
        LockOptions::builder().ttl(ms(3_000)).build().unwrap(),
    )
    .acquire(&key)
    .await
    .unwrap();
    assert!(guard.is_held());

    h.delete(&key).await;

    let why = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    assert_eq!(why, LockLost::Expired);
    assert!(!guard.is_held());
    assert!(!guard.release().await.unwrap().was_held());
}

async fn the_lost_signal_fires_when_the_lock_is_taken_behind_the_holder<H: Harness>(h: H) {
    // TIMING: as above, the renewal that finds the intruder comes well within the lease.
    let key = h.key("lost-taken");
    let guard = locker(
        h.backend().await,
        LockOptions::builder().ttl(ms(3_000)).build().unwrap(),
    )
    .acquire(&key)
    .await
    .unwrap();

    h.put(&key, "intruder", Duration::from_secs(60)).await;

    let why = timeout(Duration::from_secs(10), guard.lost())
        .await
        .unwrap();
    assert_eq!(why, LockLost::Taken);
    assert!(!guard.is_held());
    assert!(!guard.release().await.unwrap().was_held());
    assert_eq!(h.holder(&key).await.as_deref(), Some("intruder"));
    h.delete(&key).await;
}

async fn the_holder_can_advance_its_fence_above_what_a_store_has_seen<H: Harness>(h: H) {
    // Arrange: a store reports a fence far above ours.
    let key = h.key("advance");
    let locker = locker(h.backend().await, patient());
    let guard = locker.try_acquire(&key).await.unwrap();
    let seen = Fence::new(guard.fence().get() + 1_000_000);
    if h.fences_are_assigned() {
        // ZooKeeper and etcd assign fences (a zxid, a revision) that can never be set back,
        // so no store can hold one above the holder's unless it came from elsewhere: they
        // say so, and a fence below the holder's leaves it as it is.
        let outcome = guard.advance_fence(seen).await;
        assert!(
            matches!(outcome, Err(Error::FenceOutOfReach { .. })),
            "{outcome:?}"
        );
        let below = Fence::new(guard.fence().get() - 1);
        assert_eq!(guard.advance_fence(below).await.unwrap(), guard.fence());
        assert!(guard.is_held());
        assert!(guard.release().await.unwrap().was_held());
        return;
    }

    // Act
    let fence = guard.advance_fence(seen).await.unwrap();

    // Assert: above what the store saw, kept by the guard, and the counter moved on.
    assert!(fence > seen, "{fence} after {seen}");
    assert_eq!(guard.fence(), fence);
    assert!(guard.release().await.unwrap().was_held());
    let next = locker.try_acquire(&key).await.unwrap();
    assert!(next.fence() > fence);
    assert!(next.release().await.unwrap().was_held());
}

async fn a_stale_holder_cannot_advance_its_fence<H: Harness>(h: H) {
    let key = h.key("advance-stale");
    let short = h.short_ms();
    let locker = locker(h.backend().await, short_unwatched(short));
    let stale = locker.try_acquire(&key).await.unwrap();
    sleep(ms(2 * short)).await;
    // TIMING: the store frees it by itself soon after the lease (a Redis or etcd expiry,
    // ZkLock's reaper): wait until it has, rather than count on a margin.
    wait_until_free(&h, &key, "the lapsed lease did not free the lock").await;
    // The newer lease is long: a short one could run out before its release below when
    // the machine is busy (it did, in CI, against PostgreSQL).
    let newer = locker
        .try_acquire_with(&key, &short_unwatched(30_000))
        .await
        .unwrap();

    let outcome = stale.advance_fence(newer.fence()).await;

    assert!(matches!(outcome, Err(Error::NotHeld { .. })), "{outcome:?}");
    assert!(stale.fence() < newer.fence());
    assert!(newer.release().await.unwrap().was_held());
}

async fn no_fence_can_be_advanced_past_the_largest<H: Harness>(h: H) {
    let key = h.key("advance-max");
    let guard = locker(h.backend().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();

    let outcome = guard.advance_fence(Fence::new(Fence::MAX)).await;

    assert!(
        matches!(outcome, Err(Error::InvalidFence(_))),
        "{outcome:?}"
    );
    assert!(guard.release().await.unwrap().was_held());
}

async fn a_retried_acquire_finds_its_own_token_and_succeeds<H: Harness>(h: H) {
    // Arrange: the same request twice, as a client re-sends one whose answer was lost.
    let key = h.key("retried-acquire");
    let backend = h.backend().await;
    let token = Token::new();
    let first = backend.try_lock(&key, &token, ms(5_000)).await.unwrap();

    // Act
    let retried = backend.try_lock(&key, &token, ms(5_000)).await.unwrap();

    // Assert: the retry is told the lock is ours, not that it is held (by us).
    let (Attempt::Acquired(a), Attempt::Acquired(b)) = (first, retried) else {
        panic!("{first:?} then {retried:?}");
    };
    assert!(b >= a);
    assert_eq!(h.holder(&key).await.as_deref(), Some(token.as_str()));
    assert_eq!(
        backend.unlock(&key, &token).await.unwrap(),
        Unlock::Released
    );
}

async fn a_retried_release_still_reports_the_lock_as_ours<H: Harness>(h: H) {
    // Arrange: a release's first try deleted the lock, but its answer was lost. No watchdog:
    // a renewal between the delete and the release would find the lock gone and mark it
    // lost; and a lease of 30 s that cannot run out before the release.
    let key = h.key("retried-release");
    let backend = h.backend().await;
    let guard = locker(backend.clone(), short_unwatched(30_000))
        .try_acquire(&key)
        .await
        .unwrap();
    assert_eq!(
        h.holder(&key).await.as_deref(),
        Some(guard.token().expose())
    );
    h.delete(&key).await; // what the first try did

    // Act: the retry finds nothing there.
    let was_ours = guard.release().await.unwrap().was_held();

    // Assert: the lease was still running, so nobody else can have had the lock.
    assert!(was_ours, "a retried release reported a lost lock");
}

async fn an_empty_key_is_refused_before_the_backend_is_asked<H: Harness>(h: H) {
    let locker = locker(h.backend().await, patient());
    assert!(matches!(
        locker.try_acquire("").await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        locker.acquire("").await,
        Err(Error::InvalidKey { .. })
    ));
}

async fn a_counter_at_the_largest_fence_refuses_cleanly_and_leaves_nothing<H: Harness>(h: H) {
    // Arrange: a store's fence just below the largest pushes the counter to it.
    let key = h.key("fence-exhausted");
    let locker = locker(h.backend().await, patient());
    let guard = locker.try_acquire(&key).await.unwrap();
    if h.fences_are_assigned() {
        // The server assigns fences (see the property above): no counter can be pushed to
        // the largest fence, and asking for it is refused without losing the lock.
        let outcome = guard.advance_fence(Fence::new(Fence::MAX - 1)).await;
        assert!(
            matches!(outcome, Err(Error::FenceOutOfReach { .. })),
            "{outcome:?}"
        );
        assert!(guard.release().await.unwrap().was_held());
        assert_eq!(h.holder(&key).await, None, "a release left its lock");
        return;
    }
    let top = guard
        .advance_fence(Fence::new(Fence::MAX - 1))
        .await
        .unwrap();
    assert_eq!(top, Fence::new(Fence::MAX));
    assert!(guard.release().await.unwrap().was_held());

    // Act: no fence can follow, so no acquisition can be made.
    let outcome = locker.try_acquire(&key).await;

    // Assert: an error, and no lock left behind that would block everyone for a ttl.
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(!matches!(outcome, Err(Error::Held { .. })), "{outcome:?}");
    assert_eq!(h.holder(&key).await, None, "a failed acquire left its lock");
    let left = locker.inspect(&key).await.unwrap();
    assert_eq!(
        left.fence,
        Some(Fence::new(Fence::MAX)),
        "the refusal moved the counter: {left:?}"
    );
}

async fn an_acquire_cancelled_after_its_attempt_took_the_lock_gives_it_back<H: Harness>(h: H) {
    // Arrange: a lease of a minute, so only a release can free the key within the test.
    let key = h.key("cancel-after-take");
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(60))
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let locker = locker(h.backend().await, options);
    let mut acquire = Box::pin(locker.acquire(&key));

    // Act: poll once (the attempt starts), let the attempt take the key and hand its answer
    // over, then drop the acquire without ever polling it again.
    assert!(futures::poll!(&mut acquire).is_pending());
    timeout(Duration::from_secs(5), async {
        while h.holder(&key).await.is_none() {
            sleep(ms(5)).await;
        }
    })
    .await
    .expect("the attempt never took the key");
    sleep(ms(300)).await;
    drop(acquire);

    // Assert: nobody claimed the acquisition, so it is given back, not left for a minute.
    wait_until_free(
        &h,
        &key,
        "an acquisition nobody claimed was left for its whole lease",
    )
    .await;
}

async fn a_release_after_another_holder_took_the_key_says_it_was_taken<H: Harness>(h: H) {
    // Arrange: A holds; its key is lost behind its back (a failover, an eviction, a DEL by
    // hand) and B takes it while A's own lease still runs.
    let key = h.key("release-taken");
    let a = locker(h.backend().await, patient())
        .try_acquire(&key)
        .await
        .unwrap();
    h.delete(&key).await;
    h.put(&key, "b-token", Duration::from_secs(30)).await;

    // Act
    let outcome = a.release().await.unwrap();

    // Assert: A is told its lock was taken (its work may have overlapped B's), and B's
    // lock is left alone.
    assert_eq!(
        outcome,
        ReleaseOutcome::Lost(LockLost::Taken),
        "A's release said the lock was still A's"
    );
    assert_eq!(h.holder(&key).await.as_deref(), Some("b-token"));
    h.delete(&key).await;
}

async fn extend_by_hand_sets_a_longer_lease_that_others_must_wait_out<H: Harness>(h: H) {
    // Arrange: a lease of 2 s with no watchdog.
    let key = h.key("extend");
    let guard = locker(h.backend().await, short_unwatched(2_000))
        .try_acquire(&key)
        .await
        .unwrap();

    // Act: extend it to 30 s at once, then wait well past the first lease.
    guard.extend(ms(30_000)).await.unwrap();
    sleep(ms(5_000)).await;

    // Assert: still ours, and another owner is refused; after release, free.
    assert!(guard.is_held());
    assert_eq!(
        h.holder(&key).await.as_deref(),
        Some(guard.token().expose())
    );
    let other = locker(h.backend().await, patient());
    assert!(matches!(
        other.try_acquire(&key).await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap().was_held());
    assert!(other.try_acquire(&key).await.is_ok());
}

async fn extend_after_the_lease_ran_out_says_not_held<H: Harness>(h: H) {
    // Arrange: a short lease, left to run out.
    let key = h.key("extend-late");
    let short = h.short_ms();
    let locker = locker(h.backend().await, short_unwatched(short));
    let guard = locker.try_acquire(&key).await.unwrap();
    sleep(ms(2 * short + 600)).await;
    // TIMING: the store frees it by itself soon after the lease (a Redis or etcd expiry,
    // ZkLock's reaper): wait until it has, rather than count on a margin.
    wait_until_free(&h, &key, "the lapsed lease did not free the lock").await;

    // Act
    let extended = guard.extend(ms(30_000)).await;

    // Assert: refused, and the lock was not brought back to life.
    assert!(
        matches!(extended, Err(Error::NotHeld { .. })),
        "{extended:?}"
    );
    assert!(!guard.is_held());
    assert_eq!(h.holder(&key).await, None);
}

async fn inspect_tells_whether_a_key_is_held_its_lease_and_its_fence<H: Harness>(h: H) {
    // Arrange
    let key = h.key("inspect");
    let locker = locker(h.backend().await, short_unwatched(20_000));
    let before = locker.inspect(&key).await.unwrap();

    // Act
    let guard = locker.try_acquire(&key).await.unwrap();
    let during = locker.inspect(&key).await.unwrap();
    let fence = guard.fence();
    assert!(guard.release().await.unwrap().was_held());
    let after = locker.inspect(&key).await.unwrap();

    // Assert: nothing held before; held with a lease of at most the ttl and the holder's
    // fence during; not held after (the fence stays: it never goes back).
    assert!(!before.held, "{before:?}");
    assert!(during.held, "{during:?}");
    if let Some(left) = during.expires_in {
        assert!(left > ms(0) && left <= ms(20_000), "{during:?}");
    }
    assert_eq!(during.fence, Some(fence), "{during:?}");
    assert!(!after.held, "{after:?}");
    assert!(after.fence.is_none_or(|f| f >= fence), "{after:?}");
}

async fn a_forced_unlock_frees_the_lock_and_its_holder_finds_it_lost<H: Harness>(h: H) {
    // Arrange: A holds the lock with a long lease.
    let key = h.key("force");
    let operator = locker(h.backend().await, patient());
    let a = locker(h.backend().await, short_unwatched(30_000))
        .try_acquire(&key)
        .await
        .unwrap();

    // Act
    let forced = operator.force_unlock(&key).await.unwrap();
    let b = operator.try_acquire(&key).await;

    // Assert: there was a lock; B gets it at once; A's release says it was not A's any
    // more; a second forced unlock of a free key finds nothing.
    assert!(forced);
    let b = b.expect("the lock was not free after the forced unlock");
    assert!(!a.release().await.unwrap().was_held());
    assert!(b.release().await.unwrap().was_held());
    assert!(!operator.force_unlock(&key).await.unwrap());
}

async fn run_locked_hands_the_work_its_fence_returns_its_output_and_releases<H: Harness>(h: H) {
    // Arrange
    let key = h.key("run-locked");
    let locker = locker(h.backend().await, patient());

    // Act: the work reports its fence and whether the key was held while it ran.
    let ran = {
        let (h, key) = (&h, key.clone());
        locker
            .run_locked(&key.clone(), |fence| async move {
                (fence, h.holder(&key).await.is_some())
            })
            .await
            .unwrap()
    };

    // Assert
    let distlock::Ran::Finished { output, release } = ran else {
        panic!("the work did not finish");
    };
    let (fence, held_meanwhile) = output;
    assert!(held_meanwhile, "the work ran without the lock");
    assert!(fence > Fence::new(0));
    assert!(release.unwrap().was_held());
    assert_eq!(h.holder(&key).await, None, "the lock was left behind");
}

async fn run_locked_drops_the_work_when_the_lock_is_lost<H: Harness>(h: H) {
    // Arrange: the watchdog renews every third of 3 s; the work deletes the lock behind its
    // own back, then would run for 15 s more and say so.
    let key = h.key("run-lost");
    let options = LockOptions::builder()
        .ttl(ms(3_000))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let locker = locker(h.backend().await, options);
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Act
    let started = Instant::now();
    let ran = {
        let (h, key, finished) = (&h, key.clone(), Arc::clone(&finished));
        timeout(
            Duration::from_secs(30),
            locker.run_locked(&key.clone(), |_| async move {
                h.delete(&key).await;
                sleep(Duration::from_secs(15)).await;
                finished.store(true, Ordering::SeqCst);
            }),
        )
        .await
        .expect("run_locked did not notice the lost lock")
        .unwrap()
    };

    // Assert: told the lock was lost before the work's 15 s were up; and the work was
    // dropped, not left running: it never finishes.
    assert!(matches!(ran, distlock::Ran::Lost(_)), "the work finished");
    assert!(started.elapsed() < Duration::from_secs(15));
    sleep_until(started + Duration::from_secs(18)).await;
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work went on after the lock was lost"
    );
}

async fn acquire_with_takes_the_lease_and_wait_of_the_call_not_the_lockers<H: Harness>(h: H) {
    // Arrange: a locker whose own lease is long and whose own wait is zero (one attempt);
    // one call asks for a short lease with no watchdog.
    let key = h.key("per-call");
    let lockers_own = LockOptions::builder()
        .ttl(ms(60_000))
        .without_watchdog()
        .wait_timeout(ms(0))
        .build()
        .unwrap();
    let first_locker = locker(h.backend().await, lockers_own.clone());
    let first = first_locker
        .try_acquire_with(&key, &short_unwatched(h.short_ms()))
        .await
        .unwrap();
    // The waiter is another process.
    let locker = locker(h.backend().await, lockers_own);

    // Act: another owner waits with a per-call deadline that outlasts the short lease only.
    let patient_call = LockOptions::builder()
        .ttl(ms(60_000))
        .without_watchdog()
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let second = timeout(
        Duration::from_secs(30),
        locker.acquire_with(&key, &patient_call),
    )
    .await
    .expect("acquire_with did not keep its own deadline");

    // Assert: the short lease ran out and the second call, waiting as it asked (the
    // locker's own zero wait would have given up at once), got the lock; the first guard
    // knows it is no longer held.
    let second = second.expect("the per-call lease was not used");
    assert!(second.fence() > first.fence());
    assert!(!first.release().await.unwrap().was_held());
    assert!(second.release().await.unwrap().was_held());
}

/// Every property, instantiated for every backend.
macro_rules! suite {
    ($($property:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::RedisHarness::new(stringify!($property)).await;
                    crate::$property(harness).await;
                }
            )*
        }

        mod redlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::RedlockHarness::start(3).await;
                    crate::$property(harness).await;
                }
            )*
        }

        #[cfg(feature = "sentinel")]
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::SentinelHarness::start().await;
                    crate::$property(harness).await;
                }
            )*
        }

        #[cfg(feature = "zookeeper")]
        mod zookeeper {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::ZkHarness::start().await;
                    crate::$property(harness).await;
                }
            )*
        }

        #[cfg(feature = "etcd")]
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::EtcdHarness::start().await;
                    crate::$property(harness).await;
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[sqlx::test]
                async fn $property(pool: sqlx::PgPool) {
                    let harness = crate::support::PgHarness::new(pool).await;
                    crate::$property(harness).await;
                }
            )*
        }
    };
}

suite!(
    mutual_exclusion_keeps_a_racy_counter_exact_under_contention,
    the_lease_frees_a_lock_whose_holder_vanished,
    a_stale_guards_release_does_not_delete_the_next_holders_lock,
    fences_strictly_increase_across_holders_and_a_deleted_lock,
    fences_follow_the_order_in_which_contending_holders_held_the_lock,
    reentrant_owner_releases_the_lock_when_its_count_reaches_zero,
    plain_acquisitions_are_not_reentrant,
    try_acquire_returns_at_once_when_the_lock_is_held,
    acquire_gives_up_at_its_deadline,
    acquire_gets_the_lock_once_the_holder_releases_it,
    an_acquisition_that_had_to_wait_says_it_was_contended,
    an_endless_wait_gets_the_lock_once_the_holder_releases_it,
    watchdog_keeps_the_lock_for_several_ttls_and_stops_at_release,
    a_dropped_guard_releases_the_lock,
    a_dropped_guard_stops_its_watchdog,
    a_dropped_reentrant_guard_counts_down_and_the_last_one_releases,
    the_lost_signal_fires_when_the_lock_is_deleted_behind_the_holder,
    the_lost_signal_fires_when_the_lock_is_taken_behind_the_holder,
    the_holder_can_advance_its_fence_above_what_a_store_has_seen,
    a_stale_holder_cannot_advance_its_fence,
    no_fence_can_be_advanced_past_the_largest,
    a_retried_acquire_finds_its_own_token_and_succeeds,
    a_retried_release_still_reports_the_lock_as_ours,
    an_empty_key_is_refused_before_the_backend_is_asked,
    a_counter_at_the_largest_fence_refuses_cleanly_and_leaves_nothing,
    an_acquire_cancelled_after_its_attempt_took_the_lock_gives_it_back,
    a_release_after_another_holder_took_the_key_says_it_was_taken,
    extend_by_hand_sets_a_longer_lease_that_others_must_wait_out,
    extend_after_the_lease_ran_out_says_not_held,
    inspect_tells_whether_a_key_is_held_its_lease_and_its_fence,
    a_forced_unlock_frees_the_lock_and_its_holder_finds_it_lost,
    run_locked_hands_the_work_its_fence_returns_its_output_and_releases,
    run_locked_drops_the_work_when_the_lock_is_lost,
    acquire_with_takes_the_lease_and_wait_of_the_call_not_the_lockers,
);

#[cfg(any(feature = "zookeeper", feature = "etcd"))]
/// A store that keeps its own line of waiters, and counts the watches that woke them.
trait LineHarness: Harness {
    /// Watches that woke a waiter of `backend` so far.
    fn wake_ups(backend: &Self::B) -> u64;
}

#[cfg(feature = "zookeeper")]
impl LineHarness for support::ZkHarness {
    fn wake_ups(backend: &distlock::ZkLock) -> u64 {
        backend.wake_ups()
    }
}

#[cfg(feature = "etcd")]
impl LineHarness for support::EtcdHarness {
    fn wake_ups(backend: &distlock::EtcdLock) -> u64 {
        backend.wake_ups()
    }
}

/// Line up `n` waiters behind a holder, one process each, each joining only once the one
/// before it is in line; answers the holder, and the waiters' tasks (each answers when it
/// got the lock, as a place in the order of holds) with their backends.
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
async fn line_up<H: LineHarness>(
    h: &H,
    key: &str,
    n: usize,
    order: &Arc<AtomicU64>,
) -> (
    distlock::LockGuard<H::B>,
    Vec<(H::B, tokio::task::JoinHandle<u64>)>,
) {
    let watcher = locker(h.backend().await, patient());
    let holder = locker(h.backend().await, patient())
        .acquire(key)
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..n {
        let backend = h.backend().await;
        let (waiter, owned_key, order) = (
            locker(backend.clone(), patient()),
            key.to_owned(),
            Arc::clone(order),
        );
        let task = tokio::spawn(async move {
            let guard = waiter.acquire(&owned_key).await.unwrap();
            let place = order.fetch_add(1, Ordering::SeqCst);
            // Held a little, so that a waiter woken out of turn would find it held.
            sleep(ms(50)).await;
            assert!(guard.release().await.unwrap().was_held());
            place
        });
        // TIMING: the next waiter joins only once this one is in line; 20 s is far beyond
        // any scheduling delay.
        timeout(Duration::from_secs(20), async {
            while watcher.inspect(key).await.unwrap().waiting != Some(i + 1) {
                sleep(ms(10)).await;
            }
        })
        .await
        .expect("a waiter never joined the line");
        waiters.push((backend, task));
    }
    (holder, waiters)
}

#[cfg(any(feature = "zookeeper", feature = "etcd"))]
async fn the_lock_is_granted_in_arrival_order_whichever_process_asked<H: LineHarness>(h: H) {
    // Arrange: a holder, and five processes that ask one after another.
    let key = h.key("arrival-order");
    let order = Arc::new(AtomicU64::new(0));
    let (holder, waiters) = line_up(&h, &key, 5, &order).await;

    // Act
    assert!(holder.release().await.unwrap().was_held());
    let mut places = Vec::new();
    for (_, task) in waiters {
        places.push(
            timeout(Duration::from_secs(60), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }

    // Assert: each got it in the order it asked.
    assert_eq!(
        places,
        vec![0, 1, 2, 3, 4],
        "places in the order of holds, by arrival"
    );
}

#[cfg(any(feature = "zookeeper", feature = "etcd"))]
async fn a_release_wakes_only_the_next_waiter<H: LineHarness>(h: H) {
    // Arrange: a holder and five waiters, none woken yet.
    let key = h.key("no-herd");
    let order = Arc::new(AtomicU64::new(0));
    let (holder, waiters) = line_up(&h, &key, 5, &order).await;
    let woken = |waiters: &[(H::B, tokio::task::JoinHandle<u64>)]| -> u64 {
        waiters
            .iter()
            .map(|(backend, _)| H::wake_ups(backend))
            .sum()
    };
    assert_eq!(woken(&waiters), 0);

    // Act: the holder releases; the first waiter takes the lock, holds it a little and
    // passes it on, and so on down the line.
    assert!(holder.release().await.unwrap().was_held());
    let backends: Vec<H::B> = waiters.iter().map(|(b, _)| b.clone()).collect();
    for (_, task) in waiters {
        timeout(Duration::from_secs(60), task)
            .await
            .unwrap()
            .unwrap();
    }
    // TIMING: a watch that fired out of turn is counted when its event arrives; half a
    // second more lets any such event in.
    sleep(ms(500)).await;

    // Assert: each of the five releases woke one waiter, so five wake-ups in all (a herd,
    // every waiter watching the holder, would have woken 5 + 4 + 3 + 2 + 1).
    let woken: u64 = backends.iter().map(H::wake_ups).sum();
    assert_eq!(woken, 5, "wake-ups for five releases");
}

/// The properties of a line of waiters, for the backends that keep one.
macro_rules! line_suite {
    ($($property:ident),* $(,)?) => {
        #[cfg(feature = "zookeeper")]
        mod zookeeper_line {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::ZkHarness::start().await;
                    crate::$property(harness).await;
                }
            )*
        }

        #[cfg(feature = "etcd")]
        mod etcd_line {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $property() {
                    let harness = crate::support::EtcdHarness::start().await;
                    crate::$property(harness).await;
                }
            )*
        }
    };
}

line_suite!(
    the_lock_is_granted_in_arrival_order_whichever_process_asked,
    a_release_wakes_only_the_next_waiter,
);
