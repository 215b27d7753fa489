//! What only Redlock can show, against private `redis-server`s started (and killed, by pid)
//! by each test: masters going down, majorities changing, fences across the set, and an
//! attempt abandoned halfway. The properties every backend shares run against Redlock too,
//! in `tests/properties.rs`.

mod support;

use std::time::Duration;

use distlock::{Error, Fence, LockLost, LockOptions, Locker, Redlock};
use redis::aio::ConnectionManager;
use support::{RedlockHarness, get, ms, pttl};
use tokio::time::timeout;

fn options(ttl: Duration) -> LockOptions {
    LockOptions::builder()
        .ttl(ttl)
        .wait_timeout(Duration::from_secs(10))
        .retry_delay(ms(20), ms(100))
        .build()
        .unwrap()
}

fn redlock(masters: &RedlockHarness, ttl: Duration) -> Locker<Redlock<ConnectionManager>> {
    Locker::new(
        Redlock::new(masters.conns().to_vec()).unwrap(),
        options(ttl),
    )
    .unwrap()
}

#[tokio::test]
async fn the_lock_is_set_with_a_ttl_on_every_master_and_excludes_others() {
    let cluster = RedlockHarness::start(3).await;
    let redlock = redlock(&cluster, ms(5_000));

    let guard = redlock.acquire("lock_sale_1").await.unwrap();

    for mut conn in cluster.conns().to_vec() {
        assert_eq!(
            get(&mut conn, "lock_sale_1").await.as_deref(),
            Some(guard.token().expose())
        );
        let ttl = pttl(&mut conn, "lock_sale_1").await;
        assert!(ttl > 0 && ttl <= 5_000, "pttl {ttl}");
    }
    assert!(matches!(
        redlock.try_acquire("lock_sale_1").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap().was_held());
    for mut conn in cluster.conns().to_vec() {
        assert_eq!(get(&mut conn, "lock_sale_1").await, None);
    }
}

#[tokio::test]
async fn one_of_three_masters_down_still_locks() {
    let mut cluster = RedlockHarness::start(3).await;
    cluster.servers()[0].kill();
    let redlock = redlock(&cluster, ms(5_000));

    let guard = redlock.acquire("k").await.unwrap();

    assert!(guard.is_held());
    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap().was_held());
}

#[tokio::test]
async fn two_of_five_masters_down_still_locks() {
    let mut cluster = RedlockHarness::start(5).await;
    cluster.servers()[1].kill();
    cluster.servers()[3].kill();
    let redlock = redlock(&cluster, ms(5_000));

    let guard = redlock.acquire("k").await.unwrap();

    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap().was_held());
}

#[tokio::test]
async fn with_a_majority_down_acquire_fails_with_a_clear_error() {
    let mut cluster = RedlockHarness::start(3).await;
    cluster.servers()[0].kill();
    cluster.servers()[2].kill();
    let redlock = redlock(&cluster, ms(5_000));

    let outcome = timeout(Duration::from_secs(30), redlock.acquire("k"))
        .await
        .unwrap();

    match outcome {
        Err(
            error @ Error::NoQuorum {
                reachable: 1,
                needed: 2,
                ..
            },
        ) => {
            assert!(error.to_string().contains("a majority needs 2"), "{error}");
        }
        other => panic!(
            "expected NoQuorum, got {:?}",
            other.map(|g| g.token().expose().to_owned())
        ),
    }
    // Nothing is left behind on the surviving node.
    assert_eq!(get(&mut cluster.conns()[1].clone(), "k").await, None);
}

/// What the refusal tests below write where a fence counter should be.
const NOT_A_COUNT: &str = "not a count";

/// Put something that is not a count in `fence_key` on each of `conns`.
async fn spoil_fence_counters(conns: &[ConnectionManager], fence_key: &str) {
    for conn in conns {
        redis::cmd("SET")
            .arg(fence_key)
            .arg(NOT_A_COUNT)
            .exec_async(&mut conn.clone())
            .await
            .unwrap();
    }
}

/// The counters `spoil_fence_counters` wrote are as it left them.
async fn assert_still_spoiled(conns: &[ConnectionManager], fence_key: &str) {
    for conn in conns {
        assert_eq!(
            get(&mut conn.clone(), fence_key).await.as_deref(),
            Some(NOT_A_COUNT)
        );
    }
}

/// `outcome` is the masters' refusal: their own words, and the `FENCE` code.
fn assert_refusal<T: std::fmt::Debug>(outcome: distlock::Result<T>) {
    match outcome {
        Err(error @ Error::Backend { .. }) => {
            assert!(error.to_string().contains("holds no count"), "{error}");
            let redis = error.backend_source::<redis::RedisError>().unwrap();
            assert_eq!(redis.code(), Some("FENCE"), "{redis:?}");
        }
        other => panic!("expected the masters' refusal, got {other:?}"),
    }
}

/// Masters that answer but refuse (a fence counter no fence can follow) are named for what
/// they said, not counted as unreachable: the caller learns why, as from one Redis.
#[tokio::test]
async fn a_majority_that_refuses_says_why_and_leaves_nothing() {
    // Arrange: two masters of three hold a fence counter that is not a count.
    let masters = RedlockHarness::start(3).await;
    let locker = redlock(&masters, ms(5_000));
    let fence_key = distlock::redis::fence_key("lock_sale_1").unwrap();
    spoil_fence_counters(&masters.conns()[..2], &fence_key).await;

    // Act
    let outcome = timeout(Duration::from_secs(30), locker.acquire("lock_sale_1"))
        .await
        .unwrap();

    // Assert: the refusal's own words (not a wait until the 10 s deadline), and no key
    // left; the counters are as they were.
    assert_refusal(outcome.map(|g| g.token().expose().to_owned()));
    for conn in masters.conns() {
        assert_eq!(get(&mut conn.clone(), "lock_sale_1").await, None);
    }
    assert_still_spoiled(&masters.conns()[..2], &fence_key).await;
}

/// A holder whose fence counters a majority of masters refuse to count on is told why by
/// `advance_fence`, as by the acquire, not that too few masters answered.
#[tokio::test]
async fn advance_fence_names_a_majoritys_refusal() {
    // Arrange: a holder; then two masters of three find their fence counter holds no count.
    let masters = RedlockHarness::start(3).await;
    let locker = redlock(&masters, ms(5_000));
    let guard = locker.try_acquire("lock_sale_1").await.unwrap();
    let fence_key = distlock::redis::fence_key("lock_sale_1").unwrap();
    spoil_fence_counters(&masters.conns()[..2], &fence_key).await;

    // Act
    let advanced = guard.advance_fence(guard.fence()).await;

    // Assert: the refusal's words and code; the counters left as they were.
    assert_refusal(advanced);
    assert_still_spoiled(&masters.conns()[..2], &fence_key).await;
    assert!(guard.release().await.unwrap().was_held());
}

/// A refusal that could not have changed the outcome does not hide it: with a majority down,
/// the one master left refusing still makes it `NoQuorum`.
#[tokio::test]
async fn a_refusal_beside_a_majority_down_is_still_no_quorum() {
    // Arrange: two masters of three down; the third's fence counter is not a count.
    let mut masters = RedlockHarness::start(3).await;
    let fence_key = distlock::redis::fence_key("lock_sale_1").unwrap();
    spoil_fence_counters(&masters.conns()[2..], &fence_key).await;
    masters.servers()[0].kill();
    masters.servers()[1].kill();
    let locker = redlock(&masters, ms(5_000));

    // Act
    let outcome = timeout(Duration::from_secs(30), locker.acquire("lock_sale_1"))
        .await
        .unwrap();

    // Assert
    assert!(
        matches!(
            outcome,
            Err(Error::NoQuorum {
                reachable: 1,
                needed: 2,
                ..
            })
        ),
        "expected NoQuorum, got {:?}",
        outcome.map(|g| g.token().expose().to_owned())
    );
    assert_eq!(
        get(&mut masters.conns()[2].clone(), "lock_sale_1").await,
        None
    );
}

#[tokio::test]
async fn a_lost_minority_does_not_let_a_second_holder_in() {
    // One node held by someone else: we still get the other two, and the third party
    // cannot form a majority against us.
    let cluster = RedlockHarness::start(3).await;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut cluster.conns()[2].clone())
        .await
        .unwrap();
    let redlock = redlock(&cluster, ms(5_000));

    let guard = redlock.try_acquire("k").await.unwrap();

    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap().was_held());
    assert_eq!(
        get(&mut cluster.conns()[2].clone(), "k").await.as_deref(),
        Some("someone-else")
    );
}

#[tokio::test]
async fn fences_keep_growing_when_the_majority_changes() {
    // Arrange: node 0's counter is far ahead of the others (and of the clock).
    let mut cluster = RedlockHarness::start(3).await;
    let fence_key = distlock::redis::fence_key("k").unwrap();
    let ahead: u64 = 1 << 61;
    let _: () = redis::cmd("SET")
        .arg(&fence_key)
        .arg(ahead)
        .query_async(&mut cluster.conns()[0].clone())
        .await
        .unwrap();
    let redlock = redlock(&cluster, ms(5_000));
    let first = redlock.acquire("k").await.unwrap();
    let first_fence = first.fence();
    assert_eq!(
        first_fence,
        Fence::new(ahead + 1),
        "the fence is the maximum of the majority"
    );
    assert!(first.release().await.unwrap().was_held());

    // Act: the node that gave the maximum disappears; the next majority is nodes 1 and 2.
    cluster.servers()[0].kill();
    let second = redlock.acquire("k").await.unwrap();

    // Assert: the second round raised nodes 1 and 2 to 101, so the fence still grows.
    assert!(
        second.fence() > first_fence,
        "{} after {}",
        second.fence(),
        first_fence
    );
    assert!(second.release().await.unwrap().was_held());
}

#[tokio::test]
async fn the_watchdog_keeps_the_majority_through_several_ttls() {
    // TIMING: a 3 s lease renewed every second (node timeouts of 300 ms) keeps the majority
    // through a late renewal on a busy machine; without renewals it would be gone at 3 s.
    let cluster = RedlockHarness::start(3).await;
    let redlock = redlock(&cluster, ms(3_000));
    let guard = redlock.acquire("k").await.unwrap();

    tokio::time::sleep(ms(7_000)).await;

    assert!(guard.is_held());
    assert!(guard.renewals() >= 5, "renewed {} times", guard.renewals());
    for mut conn in cluster.conns().to_vec() {
        assert_eq!(
            get(&mut conn, "k").await.as_deref(),
            Some(guard.token().expose())
        );
    }
    assert!(guard.release().await.unwrap().was_held());
}

#[tokio::test]
async fn losing_the_majority_while_holding_is_signalled() {
    let mut cluster = RedlockHarness::start(3).await;
    let redlock = redlock(&cluster, ms(900));
    let guard = redlock.acquire("k").await.unwrap();
    let lost = guard.lost();

    cluster.servers()[0].kill();
    cluster.servers()[1].kill();

    let why = timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost in time");
    assert_eq!(why, LockLost::Unreachable);
    assert!(!guard.is_held());
    drop(guard);
}

#[tokio::test]
async fn a_majority_holder_can_advance_its_fence_and_a_stale_one_cannot() {
    // TIMING: Redlock gives each node a tenth of the lease to answer: the holder's 1.5 s lease
    // leaves 150 ms per node (a 300 ms one left 30 ms, too little on a busy machine), and the
    // newer holder's 30 s lease cannot run out before the steps after it.
    let cluster = RedlockHarness::start(3).await;
    let unwatched = |ttl| {
        LockOptions::builder()
            .ttl(ttl)
            .without_watchdog()
            .build()
            .unwrap()
    };
    let redlock = Locker::new(
        Redlock::new(cluster.conns().to_vec()).unwrap(),
        unwatched(ms(1_500)),
    )
    .unwrap();
    let holder = redlock.try_acquire("k").await.unwrap();
    let seen = Fence::new(holder.fence().get() + 1_000_000);

    let advanced = holder.advance_fence(seen).await.unwrap();
    assert!(advanced > seen);
    assert_eq!(holder.fence(), advanced);

    tokio::time::sleep(ms(2_000)).await;
    let newer = redlock
        .try_acquire_with("k", &unwatched(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(newer.fence() > advanced);
    assert!(matches!(
        holder.advance_fence(newer.fence()).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(newer.release().await.unwrap().was_held());
}

#[tokio::test]
async fn options_that_leave_no_room_for_drift_and_node_timeouts_are_refused() {
    let masters = RedlockHarness::start(3).await;
    let nodes = || Redlock::new(masters.conns().to_vec()).unwrap();
    assert!(matches!(
        Redlock::<ConnectionManager>::new(vec![]),
        Err(Error::InvalidOptions(_))
    ));
    // A 5 ms ttl leaves nothing after 2 ms of drift and two 5 ms node timeouts.
    let tiny = LockOptions::builder()
        .ttl(ms(5))
        .without_watchdog()
        .build()
        .unwrap();
    assert!(matches!(
        Locker::new(nodes(), tiny),
        Err(Error::InvalidOptions(_))
    ));
    // With a drift factor of 0.4, a 1 s lease is 598 ms net of drift; a renewal every
    // 700 ms plus a 100 ms node timeout would land after it.
    let late = LockOptions::builder()
        .ttl(ms(1_000))
        .renew_interval(ms(700))
        .build()
        .unwrap();
    let drifty = nodes().with_drift_factor(0.4).unwrap();
    assert!(
        matches!(Locker::new(drifty, late), Err(Error::InvalidOptions(ref why)) if why.contains("renew")),
    );
    assert!(Locker::new(nodes(), options(ms(1_000))).is_ok());
    assert!(matches!(
        nodes().with_drift_factor(0.7),
        Err(Error::InvalidOptions(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_dropped_after_a_majority_granted_it_leaves_no_keys() {
    // Arrange: one master frozen, so the attempt waits on it after the other two granted.
    let mut masters = RedlockHarness::start(3).await;
    let redlock = redlock(&masters, Duration::from_secs(30)); // keys outlive the test
    masters.servers()[2].signal("-STOP");

    // Act: the caller gives up while the attempt still waits for the frozen master.
    let outcome = timeout(ms(300), redlock.try_acquire("lock_sale_1")).await;
    masters.servers()[2].signal("-CONT");

    // Assert: what the two masters granted is released in the background, not left for 30 s.
    assert!(outcome.is_err(), "the attempt finished: {outcome:?}");
    let cleaned = async {
        loop {
            let mut left = 0;
            for mut conn in masters.conns().to_vec() {
                left += usize::from(get(&mut conn, "lock_sale_1").await.is_some());
            }
            if left == 0 {
                break;
            }
            tokio::time::sleep(ms(20)).await;
        }
    };
    timeout(Duration::from_secs(5), cleaned)
        .await
        .expect("the abandoned attempt left its keys behind");
    let next = redlock.try_acquire("lock_sale_1").await.unwrap();
    assert!(next.release().await.unwrap().was_held());
}

#[tokio::test]
async fn masters_restarted_empty_still_hand_out_larger_fences() {
    // Arrange: a fence taken; then every master loses everything (no persistence).
    let mut masters = RedlockHarness::start(3).await;
    let before = {
        let redlock = redlock(&masters, ms(5_000));
        let guard = redlock.acquire("lock_sale_1").await.unwrap();
        let fence = guard.fence();
        assert!(guard.release().await.unwrap().was_held());
        fence
    };
    for server in masters.servers() {
        server.restart_empty();
    }

    // Act
    let masters = {
        let mut fresh = Vec::new();
        for server in masters.servers() {
            fresh.push(support::connect(&server.url()).await);
        }
        fresh
    };
    let redlock = Locker::new(Redlock::new(masters).unwrap(), options(ms(5_000))).unwrap();
    let after = redlock.acquire("lock_sale_1").await.unwrap();

    // Assert: the counters started again above the clock, so above the old fence.
    assert!(after.fence() > before, "{} after {before}", after.fence());
    assert!(after.release().await.unwrap().was_held());
}

/// A master that comes back with its counter behind still gives a larger fence.
#[tokio::test]
async fn a_master_whose_counter_went_back_still_gives_a_larger_fence() {
    // Arrange: A takes a fence over three masters and gives the lock back; then every master
    // comes back with its counter one step behind A's fence (each failed over to a replica
    // that missed A's acquisition).
    let masters = RedlockHarness::start(3).await;
    let locker = redlock(&masters, Duration::from_secs(5));
    let a = locker.try_acquire("lock_sale_1").await.unwrap();
    let a_fence = a.fence();
    assert!(a.release().await.unwrap().was_held());
    for conn in masters.conns() {
        redis::cmd("SET")
            .arg(distlock::redis::fence_key("lock_sale_1").unwrap())
            .arg(a_fence.get() - 1)
            .exec_async(&mut conn.clone())
            .await
            .unwrap();
    }

    // Act
    let b = locker.try_acquire("lock_sale_1").await.unwrap();

    // Assert
    assert!(
        b.fence() > a_fence,
        "B got fence {} after A's {a_fence}",
        b.fence()
    );
    assert!(b.release().await.unwrap().was_held());
}
