//! `LOCK_STRATEGY=zookeeper` and `LOCK_STRATEGY=etcd`, each on a private server of its own
//! (testkit starts it on a free port and kills it by its pid): a flood sells exactly what was
//! supplied, `/readyz` follows the server down and back up, start-up names the setting that
//! is wrong, and a fence another backend left in a product's row is explained, not
//! overwritten.

use std::time::Duration;

use seckill::{LockStrategy, Settings};
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use testkit::{EtcdServer, ZooKeeperServer};
use tokio::task::spawn_blocking;
use tokio::time::Instant;

use crate::concurrency::flood_with;
use crate::helpers::{
    TestApp, books, build_error, error_code, settings, shared_redis_url, spawn_with,
};

/// A fence as Redis hands them out: the Redis host's clock in microseconds, far above any
/// zxid or revision a young server has reached.
const REDIS_LIKE_FENCE: i64 = 1_700_000_000_000_000;

async fn zookeeper() -> ZooKeeperServer {
    spawn_blocking(ZooKeeperServer::start).await.unwrap()
}

async fn etcd() -> EtcdServer {
    spawn_blocking(EtcdServer::start).await.unwrap()
}

/// Test settings that lock in the ZooKeeper at `connect`.
fn on_zookeeper(connect: String, label: &str) -> Settings {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix(label));
    settings.lock.strategy = LockStrategy::ZooKeeper;
    settings.lock.zookeeper_connect = connect;
    settings
}

/// Test settings that lock in the etcd at `endpoint`.
fn on_etcd(endpoint: String, label: &str) -> Settings {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix(label));
    settings.lock.strategy = LockStrategy::Etcd;
    settings.lock.etcd_endpoints = vec![endpoint];
    settings
}

/// Ask `/readyz` until its status is `want`, for up to `within`; the last answer.
async fn readyz_until(app: &TestApp, want: u16, within: Duration) -> (u16, Value) {
    let started = Instant::now();
    loop {
        let (status, body) = app.ops_json("/readyz").await;
        if status == want || started.elapsed() > within {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Under zookeeper, a flood on three instances sells exactly what was supplied.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn zookeeper_flood_on_three_instances_sells_exactly_the_supply(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    let server = zookeeper().await;
    flood_with(on_zookeeper(server.connect_string(), "flood-zk"), o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn under_etcd_a_flood_on_three_instances_sells_exactly_what_was_supplied(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    let server = etcd().await;
    flood_with(on_etcd(server.endpoint(), "flood-etcd"), o, c).await;
}

/// A server a lock lives in, which a test kills and starts again (by its pid, on the same
/// ports with the same data).
trait LockServer: Send + 'static {
    fn kill(&mut self);
    fn restart(&mut self);
}

impl LockServer for ZooKeeperServer {
    fn kill(&mut self) {
        ZooKeeperServer::kill(self);
    }
    fn restart(&mut self) {
        ZooKeeperServer::restart(self);
    }
}

impl LockServer for EtcdServer {
    fn kill(&mut self) {
        EtcdServer::kill(self);
    }
    fn restart(&mut self) {
        EtcdServer::restart(self);
    }
}

/// `/readyz` of `app`, whose lock lives in `server` (reported under `field`), while the
/// server dies and comes back: ready; then 503 saying `name` (and whatever `down` checks of
/// that answer); then ready again, and it sells.
async fn readyz_follows_the_lock_server<S: LockServer>(
    app: &TestApp,
    server: S,
    (field, name): (&str, &str),
    down: impl Fn(&Value),
) {
    let (status, body) = app.ops_json("/readyz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ready")),
        "{body}"
    );
    assert_eq!(body[field]["answers"], true, "{body}");

    // Act: kill it.
    let mut server = server;
    let server = spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();

    // Assert: not ready, saying why. TIMING: the client sees the connection close at once;
    // a readiness answer is reused for a second.
    let (status, body) = readyz_until(app, 503, Duration::from_secs(10)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body[field]["answers"], false, "{body}");
    assert!(body["message"].as_str().unwrap().contains(name), "{body}");
    down(&body);

    // Act: start it again, on the same ports with the same data.
    let mut server = server;
    let server = spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();

    // Assert: ready again, and it sells. TIMING: the clients find the server again within a
    // few seconds (ZooKeeper's retries, etcd's channel backoff); 30 s is room for a busy
    // machine.
    let (status, body) = readyz_until(app, 200, Duration::from_secs(30)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ready")),
        "{body}"
    );
    assert_eq!(body[field]["answers"], true, "{body}");
    let id = app.create_product("Phone", 1).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
    drop(server);
}

/// `/readyz` turns not ready while zookeeper is down and ready once it is back.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn readyz_is_not_ready_while_zookeeper_is_down_and_ready_after(pool: PgPool) {
    let server = zookeeper().await;
    let app = spawn_with(on_zookeeper(server.connect_string(), "ready-zk"), pool).await;
    let (_, body) = app.ops_json("/readyz").await;
    assert_eq!(body["zookeeper"]["session"], "SyncConnected", "{body}");

    readyz_follows_the_lock_server(&app, server, ("zookeeper", "ZooKeeper"), |body| {
        assert_ne!(body["zookeeper"]["session"], "SyncConnected", "{body}");
    })
    .await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn readyz_turns_not_ready_while_etcd_is_down_and_ready_once_it_is_back(pool: PgPool) {
    let server = etcd().await;
    let app = spawn_with(on_etcd(server.endpoint(), "ready-etcd"), pool).await;

    readyz_follows_the_lock_server(&app, server, ("etcd", "etcd"), |_| {}).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_unreachable_zookeeper_stops_start_up_naming_zookeeper_connect(pool: PgPool) {
    // A short session: the client tries for about one session timeout before it gives up.
    let mut settings = on_zookeeper(format!("127.0.0.1:{}", testkit::free_port()), "no-zk");
    settings.lock.zookeeper_session_timeout = Duration::from_millis(2_000);
    settings.lock.ttl = Duration::from_millis(1_000);
    let message = build_error(settings, Some(pool)).await;
    assert!(message.contains("ZOOKEEPER_CONNECT"), "{message}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_unreachable_etcd_stops_start_up_naming_etcd_endpoints(pool: PgPool) {
    let endpoint = format!("http://127.0.0.1:{}", testkit::free_port());
    let message = build_error(on_etcd(endpoint, "no-etcd"), Some(pool)).await;
    assert!(message.contains("ETCD_ENDPOINTS"), "{message}");
}

/// A zookeeper session granted shorter than the lock ttl stops start up saying both.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn granted_zookeeper_session_too_short_for_the_ttl_stops_start_up(pool: PgPool) {
    // Arrange: the server grants sessions of at most 2 s; the service asks for 10 s and
    // holds its locks for 5 s.
    let server =
        spawn_blocking(|| ZooKeeperServer::start_with_max_session_timeout(Duration::from_secs(2)))
            .await
            .unwrap();
    let mut settings = on_zookeeper(server.connect_string(), "short-zk");
    settings.lock.zookeeper_session_timeout = Duration::from_millis(10_000);
    settings.lock.ttl = Duration::from_millis(5_000);

    // Act
    let message = build_error(settings, Some(pool)).await;

    // Assert: both numbers, and what to change.
    assert!(
        message.contains("granted a session timeout of 2000 ms"),
        "{message}"
    );
    assert!(message.contains("LOCK_TTL_MS (5000 ms)"), "{message}");
    assert!(message.contains("maxSessionTimeout"), "{message}");
}

/// Under `strategy` (on its server, in `settings`): a product whose row holds a fence from
/// another backend is not sold to, and nothing is written; once the fences are reset as the
/// log says, it sells.
async fn a_fence_left_by_another_backend_is_refused_until_reset(settings: Settings, pool: PgPool) {
    // Arrange: the row was last written under Redis's clock-based fences.
    let strategy = settings.lock.strategy;
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    sqlx::query("UPDATE products SET fence = $2 WHERE id = $1")
        .bind(id)
        .bind(REDIS_LIKE_FENCE)
        .execute(&pool)
        .await
        .unwrap();

    // Act
    let response = app.purchase(id, 1, 1).await;

    // Assert: refused as a server-side problem (retrying cannot help), nothing written.
    assert_eq!(
        error_code(response).await,
        (500, "internal".to_owned()),
        "{strategy:?}"
    );
    let before = books(&pool, id).await;
    assert_eq!((before.stock, before.orders), (10, 0), "{strategy:?}");
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM products WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, REDIS_LIKE_FENCE, "{strategy:?}");

    // Act: what the log tells the operator to do.
    sqlx::query("UPDATE products SET fence = 0")
        .execute(&pool)
        .await
        .unwrap();

    // Assert: it sells.
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201, "{strategy:?}");
    assert_eq!(books(&pool, id).await.orders, 1);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn under_zookeeper_a_fence_left_by_another_backend_writes_nothing(pool: PgPool) {
    let server = zookeeper().await;
    let settings = on_zookeeper(server.connect_string(), "other-fence-zk");
    a_fence_left_by_another_backend_is_refused_until_reset(settings, pool).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn under_etcd_a_fence_left_by_another_backend_writes_nothing(pool: PgPool) {
    let server = etcd().await;
    let settings = on_etcd(server.endpoint(), "other-fence-etcd");
    a_fence_left_by_another_backend_is_refused_until_reset(settings, pool).await;
}
