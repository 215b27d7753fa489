//! `spawn_app` and friends: a real service on port 0, and direct looks at its database.

use std::time::Duration;

use reqwest::{Client, Response};
use seckill::{Application, LockStrategy, Settings};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

/// Session bounds for tests that drive the service's transactions directly.
pub const BOUNDS: seckill::repository::SessionBounds = seckill::repository::SessionBounds {
    statement_timeout_ms: 5_000,
    lock_timeout_ms: 2_000,
    idle_in_transaction_timeout_ms: 5_000,
};

pub const ADMIN_TOKEN: &str = "test-admin-token-0123";

/// The buyer key of every test instance (`BUYER_JWT_SECRET`): tests play the identity
/// provider with [`buyer_token`].
pub const BUYER_SECRET: &str = "test-buyer-secret-0123456789abcdef";

/// A token for `user`, valid for an hour, as the test instances accept.
pub fn buyer_token(user: i64) -> String {
    seckill::identity::Issuer::hs256(BUYER_SECRET).token(user, Duration::from_secs(3_600))
}

/// Settings for a test instance: port 0, a unique Redis key prefix, a patient lock.
pub fn settings(redis_url: &str, prefix: &str) -> Settings {
    let mut settings = Settings::new("postgres://unused-the-test-hands-in-its-pool", redis_url);
    settings.redis.key_prefix = prefix.into();
    settings.http.bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.http.ops_bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.http.admin_token = Some(ADMIN_TOKEN.into());
    settings.identity.secret = Some(BUYER_SECRET.into());
    // Every test client is one address, and some retry one buyer quickly: the limits'
    // own tests turn them on.
    settings.limits.buyer_rate = 0;
    settings.limits.address_rate = 0;
    settings.lock.strategy = LockStrategy::Redis;
    settings.lock.ttl = Duration::from_millis(5_000);
    settings.lock.wait = Duration::from_millis(30_000);
    settings.database.max_connections = 5;
    settings
}

/// Why the service would not start with `settings` (on `pool` when given, else connecting
/// itself): the error with all its causes.
///
/// # Panics
/// If it started.
pub async fn build_error(settings: Settings, pool: Option<PgPool>) -> String {
    let built = match pool {
        Some(pool) => Application::build_with_pool(settings, pool).await,
        None => Application::build(settings).await,
    };
    match built {
        Ok(_) => panic!("the app started with settings it should have refused"),
        Err(error) => format!("{error:#}"),
    }
}

/// The database URL of `connect`, which `#[sqlx::test]` made (trust authentication: no
/// password).
pub fn url_of(connect: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        connect.get_username(),
        connect.get_host(),
        connect.get_port(),
        connect.get_database().unwrap()
    )
}

pub fn shared_redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A connection to the Redis at `url` for what a test does beside the service (a lock held
/// from outside): it waits up to 10 s for an answer, and for a connection.
///
/// TIMING: redis-rs's own default response timeout, 500 ms, is within reach of a busy CI
/// machine; no test relies on these connections timing out.
pub async fn redis_connection(url: &str) -> redis::aio::ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    redis::aio::ConnectionManager::new_with_config(redis::Client::open(url).unwrap(), config)
        .await
        .unwrap_or_else(|e| panic!("cannot reach redis at {url}: {e}"))
}

/// The buyer of [`TestApp::post_raw`]'s requests that are not the admin's.
pub const RAW_BUYER: i64 = 1;

/// One running instance of the service.
pub struct TestApp {
    /// The public listener (`BIND_ADDR`), as `http://host:port`.
    pub address: String,
    /// The operators' listener (`OPS_BIND_ADDR`).
    pub ops_address: String,
    pub pool: PgPool,
    pub client: Client,
    /// Deletes the instance's Redis keys (fence counters have no TTL) when the test ends.
    _cleanup: testkit::PrefixCleanup,
}

/// Start an instance on `pool` with `settings`.
pub async fn spawn_with(settings: Settings, pool: PgPool) -> TestApp {
    let cleanup = testkit::PrefixCleanup::new(settings.redis.url(), &settings.redis.key_prefix);
    let app = Application::build_with_pool(settings, pool.clone())
        .await
        .expect("the app builds");
    let address = format!("http://{}", app.address());
    let ops_address = format!("http://{}", app.operations_address());
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        ops_address,
        pool,
        client: Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
        _cleanup: cleanup,
    }
}

/// Start an instance with the default test settings on the shared Redis.
pub async fn spawn_app(pool: PgPool) -> TestApp {
    let prefix = testkit::unique_prefix("app");
    spawn_with(settings(&shared_redis_url(), &prefix), pool).await
}

/// `n` instances sharing one database (each with its own pool) and one key prefix.
pub async fn spawn_instances(
    n: usize,
    pool_options: &PgPoolOptions,
    connect: &PgConnectOptions,
    settings: &Settings,
) -> Vec<TestApp> {
    let mut apps = Vec::new();
    for _ in 0..n {
        let pool = pool_options
            .clone()
            .connect_with(connect.clone())
            .await
            .unwrap();
        apps.push(spawn_with(settings.clone(), pool).await);
    }
    apps
}

impl TestApp {
    /// `path` on the public listener.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `path` on the operators' listener (admin writes, `/metrics`, `/readyz`, the document).
    pub fn ops_url(&self, path: &str) -> String {
        format!("{}{path}", self.ops_address)
    }

    pub async fn create_product(&self, name: &str, stock: i64) -> i64 {
        self.create_product_from(json!({"name": name, "stock": stock}))
            .await
    }

    /// `POST /api/products` with this body (`on_sale_at` among its fields, say): the id.
    pub async fn create_product_from(&self, body: Value) -> i64 {
        let response = self
            .client
            .post(self.ops_url("/api/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json::<Value>().await.unwrap()["id"]
            .as_i64()
            .unwrap()
    }

    /// `POST .../restock {"add": add}`.
    pub async fn restock(&self, id: i64, add: i64) -> Response {
        self.client
            .post(self.ops_url(&format!("/api/products/{id}/restock")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"add": add}))
            .send()
            .await
            .unwrap()
    }

    /// `PUT .../stock {"stock", "expected_stock"}`.
    pub async fn set_stock(&self, id: i64, stock: i64, expected: i64) -> Response {
        self.client
            .put(self.ops_url(&format!("/api/products/{id}/stock")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"stock": stock, "expected_stock": expected}))
            .send()
            .await
            .unwrap()
    }

    /// `GET .../orders/{user}`, as that buyer: the buyer's order id, or `None` on 404.
    pub async fn order_of(&self, id: i64, user: i64) -> Option<i64> {
        let (status, body) = self
            .get_json_as(
                &format!("/api/products/{id}/orders/{user}"),
                &buyer_token(user),
            )
            .await;
        match status {
            200 => {
                assert_eq!(body["user_id"], user, "{body}");
                assert_eq!(body["product_id"], id, "{body}");
                Some(body["order_id"].as_i64().unwrap())
            }
            404 => None,
            other => panic!("GET order answered {other}: {body}"),
        }
    }

    pub async fn purchase(&self, id: i64, user: i64, quantity: i64) -> Response {
        self.client
            .post(self.url(&format!("/api/products/{id}/purchase")))
            .bearer_auth(buyer_token(user))
            .json(&json!({"user_id": user, "quantity": quantity}))
            .send()
            .await
            .unwrap()
    }

    /// POST a raw body with a content type, as the admin or as buyer [`RAW_BUYER`], on the
    /// operators' listener; for bad-input tests.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: String,
        admin: bool,
    ) -> Response {
        // The operators' listener serves every route: an admin route with a buyer's token
        // is refused there for the token, not for the listener.
        let mut request = self
            .client
            .post(self.ops_url(path))
            .header("content-type", content_type);
        request = request.bearer_auth(if admin {
            ADMIN_TOKEN.to_owned()
        } else {
            buyer_token(RAW_BUYER)
        });
        request.body(body).send().await.unwrap()
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        status_and_json(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    /// `GET` on the operators' listener.
    pub async fn ops_json(&self, path: &str) -> (u16, Value) {
        status_and_json(self.client.get(self.ops_url(path)).send().await.unwrap()).await
    }

    /// `GET` with a bearer token (a buyer's, or the admin's).
    pub async fn get_json_as(&self, path: &str, token: &str) -> (u16, Value) {
        let response = self
            .client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        status_and_json(response).await
    }

    /// The `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        let response = self
            .client
            .get(self.ops_url("/metrics"))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    }

    /// The value of one metric line (without labels, or with its exact label set). Panics
    /// when the metric is not there, so a misspelt name cannot read as zero.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|line| {
                let (key, value) = line.rsplit_once(' ')?;
                (key == name).then(|| value.parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }
}

/// What PostgreSQL says about one product: the figures the books are checked with.
#[derive(Debug, PartialEq, Eq)]
pub struct Books {
    pub stock: i64,
    pub orders: i64,
    pub sold: i64,
    /// What the stock ledger says the product was supplied with.
    pub supplied: i64,
}

impl Books {
    /// `supplied = stock + sold`: no unit lost, none sold twice.
    pub fn balance(&self) -> bool {
        self.supplied == self.stock + self.sold && self.stock >= 0
    }
}

pub async fn books(pool: &PgPool, product: i64) -> Books {
    let (stock,): (i64,) = sqlx::query_as("SELECT stock FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(pool)
        .await
        .unwrap();
    let (orders, sold): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(SUM(quantity), 0)::BIGINT FROM orders WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(pool)
    .await
    .unwrap();
    let (supplied,): (i64,) = sqlx::query_as(
        "SELECT COALESCE(SUM(delta), 0)::BIGINT FROM stock_changes WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(pool)
    .await
    .unwrap();
    Books {
        stock,
        orders,
        sold,
        supplied,
    }
}

/// Every key under `prefix` in the Redis at `url` (lock keys, fence counters).
pub async fn redis_keys(url: &str, prefix: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut keys = Vec::new();
    for pattern in [format!("{prefix}*"), format!("{{{prefix}*")] {
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(found);
    }
    keys
}

/// The status of `response`, and its body as JSON (null when it is not).
async fn status_and_json(response: Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub async fn error_code(response: Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("error answers are JSON");
    assert!(body["message"].is_string(), "no message in {body}");
    (
        status,
        body["error"].as_str().expect("an error code").to_owned(),
    )
}

/// How PostgreSQL has counted reads of `orders` so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrdersReads {
    /// Sequential scans started.
    pub seq_scans: i64,
    /// Index scans started.
    pub index_scans: i64,
    /// Rows read by them, and rows and index entries read through its indexes (bitmap and
    /// index-only scans included).
    pub rows: i64,
    /// Rows inserted: proof that the statistics read are the session's latest.
    pub inserted: i64,
}

/// For tests of what PostgreSQL reads: a pool to look from, and a session of one connection
/// (made with `connect`), whose statistics [`orders_reads`] flushes. Autovacuum is off on
/// `orders`, so that only the test decides what the planner knows of it: an autovacuum
/// analyze in the middle would replan, and hide a plan trap on code without its fix.
pub async fn observed_session(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) -> (PgPool, PgPool) {
    let observer = pool_options.connect_with(connect.clone()).await.unwrap();
    let session = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(connect)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE orders SET (autovacuum_enabled = off)")
        .execute(&observer)
        .await
        .unwrap();
    (observer, session)
}

/// The reads of `orders` counted so far, as `observer` sees them once the pending
/// statistics of `pool`'s one connection are flushed.
pub async fn orders_reads(pool: &PgPool, observer: &PgPool) -> OrdersReads {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    // The flush happens as the session goes idle after that call; one more round trip makes
    // sure it is done before the observer reads.
    sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
    let (seq_scans, index_scans, rows, inserted) = sqlx::query_as(
        "SELECT seq_scan, COALESCE(idx_scan, 0), \
                seq_tup_read + COALESCE(idx_tup_fetch, 0) \
                  + (SELECT COALESCE(SUM(idx_tup_read), 0)::BIGINT \
                     FROM pg_stat_user_indexes WHERE relname = 'orders'), \
                n_tup_ins \
         FROM pg_stat_user_tables WHERE relname = 'orders'",
    )
    .fetch_one(observer)
    .await
    .unwrap();
    OrdersReads {
        seq_scans,
        index_scans,
        rows,
        inserted,
    }
}

/// Take product `id`'s row in a transaction of the test's own, as a hung or slow writer
/// would: whoever writes the row waits until the transaction ends.
pub async fn hold_row(pool: &PgPool, id: i64) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut row = pool.begin().await.unwrap();
    sqlx::query("SELECT stock FROM products WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *row)
        .await
        .unwrap();
    row
}

/// Buy as `user` until it works or `within` has passed; how long it took.
pub async fn buys_within(app: &TestApp, id: i64, user: i64, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        let response = app.purchase(id, user, 1).await;
        match response.status().as_u16() {
            201 => return Some(started.elapsed()),
            409 => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    None
}

/// Wait until the instance's restock subscription is up (it connects in the background).
pub async fn wait_until_listening(app: &TestApp) {
    let started = Instant::now();
    loop {
        let (_, body) = app.ops_json("/readyz").await;
        if body["restock_news"] == true && body["status"] == "ready" {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
