//! The single-instance lock through a Redis Cluster connection: both keys of a lock (the
//! lock and its fence) live in one slot, so the acquire script runs on one node.

use std::time::Duration;

use distlock::{Error, LockOptions, Locker};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use testkit::RedisCluster;

async fn cluster_connection(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .expect("a cluster connection")
}

async fn keyslot(conn: &mut ClusterConnection, key: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_works_through_a_cluster_with_both_keys_in_one_slot() {
    // Arrange: a three-master cluster, and keys that land on different masters.
    let cluster = RedisCluster::start(3);
    let mut conn = cluster_connection(&cluster).await;
    let options = LockOptions::builder()
        .ttl(Duration::from_secs(5))
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(20))
        .build()
        .unwrap();
    let locker = Locker::new(conn.clone(), options).unwrap();

    for id in 1..=20 {
        let key = format!("lock_sale_{id}");
        let fence_key = distlock::redis::fence_key(&key).unwrap();
        assert_eq!(
            keyslot(&mut conn, &key).await,
            keyslot(&mut conn, &fence_key).await,
            "{key}"
        );

        // Act
        let guard = locker.try_acquire(&key).await.unwrap();

        // Assert: the lock and its fence exist, the lock excludes others and has a TTL.
        assert!(matches!(
            locker.try_acquire(&key).await,
            Err(Error::Held { .. })
        ));
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key}: pttl {ttl}");
        let fence: u64 = redis::cmd("GET")
            .arg(&fence_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(fence, guard.fence().get());
        assert!(guard.release().await.unwrap().was_held());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_holds_through_a_cluster() {
    let cluster = RedisCluster::start(3);
    let conn = cluster_connection(&cluster).await;
    let options = LockOptions::builder()
        .wait_timeout(Duration::from_secs(60))
        .retry_delay(Duration::from_millis(1), Duration::from_millis(20))
        .build()
        .unwrap();
    let locker = Locker::new(conn.clone(), options).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (locker, mut conn) = (locker.clone(), conn.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = locker.acquire("{sale}:lock").await.unwrap();
                let seen: Option<u64> = redis::cmd("GET")
                    .arg("{sale}:counter")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
                let _: () = redis::cmd("SET")
                    .arg("{sale}:counter")
                    .arg(seen.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap().was_held());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut conn = conn;
    let total: u64 = redis::cmd("GET")
        .arg("{sale}:counter")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, 160);
}
