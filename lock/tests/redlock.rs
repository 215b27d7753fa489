//! Redlock against private `redis-server`s started (and killed, by pid) by each test.

mod support;

use std::time::Duration;

use distlock::{Error, FencedGuard, LockLost, LockOptions, Redlock, RedlockOptions};
use redis::aio::ConnectionManager;
use support::{connect, get, ms, pttl};
use testkit::RedisServer;
use tokio::time::timeout;

struct Cluster {
    servers: Vec<RedisServer>,
    conns: Vec<ConnectionManager>,
}

async fn masters(n: usize) -> Cluster {
    let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(connect(&server.url()).await);
    }
    Cluster { servers, conns }
}

fn options(ttl: Duration) -> RedlockOptions {
    RedlockOptions::new(
        LockOptions::builder()
            .ttl(ttl)
            .wait_timeout(Duration::from_secs(10))
            .retry_delay(ms(20), ms(100))
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn the_lock_is_set_with_a_ttl_on_every_master_and_excludes_others() {
    let mut cluster = masters(3).await;
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();

    let guard = redlock.acquire("lock_sale_1").await.unwrap();

    for conn in &mut cluster.conns {
        assert_eq!(
            get(conn, "lock_sale_1").await.as_deref(),
            Some(guard.token())
        );
        let ttl = pttl(conn, "lock_sale_1").await;
        assert!(ttl > 0 && ttl <= 5_000, "pttl {ttl}");
    }
    assert!(matches!(
        redlock.try_acquire("lock_sale_1").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap());
    for conn in &mut cluster.conns {
        assert_eq!(get(conn, "lock_sale_1").await, None);
    }
}

#[tokio::test]
async fn one_of_three_masters_down_still_locks() {
    let mut cluster = masters(3).await;
    cluster.servers[0].kill();
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();

    let guard = redlock.acquire("k").await.unwrap();

    assert!(guard.is_held());
    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn two_of_five_masters_down_still_locks() {
    let mut cluster = masters(5).await;
    cluster.servers[1].kill();
    cluster.servers[3].kill();
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();

    let guard = redlock.acquire("k").await.unwrap();

    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn with_a_majority_down_acquire_fails_with_a_clear_error() {
    let mut cluster = masters(3).await;
    cluster.servers[0].kill();
    cluster.servers[2].kill();
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();

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
            other.map(|g| g.token().to_owned())
        ),
    }
    // Nothing is left behind on the surviving node.
    assert_eq!(get(&mut cluster.conns[1], "k").await, None);
}

#[tokio::test]
async fn a_lost_minority_does_not_let_a_second_holder_in() {
    // One node held by someone else: we still get the other two, and the third party
    // cannot form a majority against us.
    let mut cluster = masters(3).await;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut cluster.conns[2])
        .await
        .unwrap();
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();

    let guard = redlock.try_acquire("k").await.unwrap();

    assert!(matches!(
        redlock.try_acquire("k").await,
        Err(Error::Held { .. })
    ));
    assert!(guard.release().await.unwrap());
    assert_eq!(
        get(&mut cluster.conns[2], "k").await.as_deref(),
        Some("someone-else")
    );
}

#[tokio::test]
async fn fences_keep_growing_when_the_majority_changes() {
    // Arrange: node 0's counter is far ahead of the others.
    let mut cluster = masters(3).await;
    let fence_key = distlock::fence_key("k").unwrap();
    let _: () = redis::cmd("SET")
        .arg(&fence_key)
        .arg(100)
        .query_async(&mut cluster.conns[0])
        .await
        .unwrap();
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(5_000))).unwrap();
    let first = redlock.acquire("k").await.unwrap();
    let first_fence = first.fence();
    assert_eq!(
        first_fence.get(),
        101,
        "the fence is the maximum of the majority"
    );
    first.release().await.unwrap();

    // Act: the node that gave the maximum disappears; the next majority is nodes 1 and 2.
    cluster.servers[0].kill();
    let second = redlock.acquire("k").await.unwrap();

    // Assert: the second round raised nodes 1 and 2 to 101, so the fence still grows.
    assert!(
        second.fence() > first_fence,
        "{} after {}",
        second.fence(),
        first_fence
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_the_majority_through_several_ttls() {
    let mut cluster = masters(3).await;
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(900))).unwrap();
    let guard = redlock.acquire("k").await.unwrap();

    tokio::time::sleep(ms(3_000)).await;

    assert!(guard.is_held());
    assert!(guard.renewals() >= 5, "renewed {} times", guard.renewals());
    for conn in &mut cluster.conns {
        assert_eq!(get(conn, "k").await.as_deref(), Some(guard.token()));
    }
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn losing_the_majority_while_holding_is_signalled() {
    let mut cluster = masters(3).await;
    let redlock = Redlock::new(cluster.conns.clone(), options(ms(900))).unwrap();
    let guard = redlock.acquire("k").await.unwrap();
    let lost = guard.lost();

    cluster.servers[0].kill();
    cluster.servers[1].kill();

    let why = timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost in time");
    assert_eq!(why, LockLost::Unreachable);
    assert!(!guard.is_held());
    drop(guard);
}

#[tokio::test]
async fn a_majority_holder_can_advance_its_fence_and_a_stale_one_cannot() {
    let cluster = masters(3).await;
    let short = RedlockOptions::new(
        LockOptions::builder()
            .ttl(ms(300))
            .without_watchdog()
            .build()
            .unwrap(),
    );
    let redlock = Redlock::new(cluster.conns.clone(), short).unwrap();
    let holder = redlock.try_acquire("k").await.unwrap();

    let advanced = holder.advance_fence(distlock::Fence(500)).await.unwrap();
    assert!(advanced.get() > 500);
    assert_eq!(holder.fence(), advanced);

    tokio::time::sleep(ms(600)).await;
    let newer = redlock.try_acquire("k").await.unwrap();
    assert!(newer.fence() > advanced);
    assert!(matches!(
        holder.advance_fence(newer.fence()).await,
        Err(Error::NotHeld { .. })
    ));
    newer.release().await.unwrap();
}

#[test]
fn options_that_leave_no_validity_are_refused() {
    assert!(matches!(
        Redlock::<ConnectionManager>::new(vec![], RedlockOptions::default()),
        Err(Error::InvalidOptions(_))
    ));
    // A 5 ms ttl leaves nothing after 2 ms of drift and a 5 ms node timeout.
    let tiny = LockOptions::builder()
        .ttl(ms(5))
        .without_watchdog()
        .build()
        .unwrap();
    assert!(matches!(
        RedlockOptions::new(tiny).with_drift_factor(0.01),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        RedlockOptions::default().with_drift_factor(0.7),
        Err(Error::InvalidOptions(_))
    ));
}
