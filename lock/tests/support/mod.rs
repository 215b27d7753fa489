//! What the lock tests share: a connection to the shared Redis and unique keys.

#![allow(dead_code)]

use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("valid redis url");
    ConnectionManager::new(client)
        .await
        .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"))
}

/// A new connection to the shared test Redis.
pub async fn shared_redis() -> ConnectionManager {
    connect(&redis_url()).await
}

/// A key no other test (or earlier run) uses, and the guard that deletes what the test
/// leaves under its prefix (the fence counter, counters) when the test ends.
pub fn unique_key(test: &str) -> (String, testkit::PrefixCleanup) {
    let prefix = testkit::unique_prefix(test);
    let cleanup = testkit::PrefixCleanup::new(&redis_url(), &prefix);
    (format!("{prefix}lock"), cleanup)
}

pub fn locker(conn: ConnectionManager, options: LockOptions) -> Locker<ConnectionManager> {
    Locker::new(conn, options)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

pub async fn get(conn: &mut ConnectionManager, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

/// Wait (up to 3 s) until `key` is gone; `why` names what should have deleted it.
pub async fn wait_until_gone(conn: &mut ConnectionManager, key: &str, why: &str) {
    let gone = async {
        while get(conn, key).await.is_some() {
            tokio::time::sleep(ms(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), gone)
        .await
        .unwrap_or_else(|_| panic!("{why}"));
}

/// Put `token` back in `key` with a 400 ms lease and check that nothing renews it: a
/// watchdog still running for that token would keep it alive.
pub async fn assert_nothing_renews(conn: &mut ConnectionManager, key: &str, token: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("PX")
        .arg(400)
        .query_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(ms(1_500)).await;
    assert_eq!(
        get(conn, key).await,
        None,
        "something renewed the old token"
    );
}
