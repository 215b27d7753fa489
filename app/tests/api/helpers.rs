//! `spawn_app` and friends: a real service on port 0, and direct looks at its database.

use std::time::Duration;

use reqwest::{Client, Response};
use seckill::{Application, LockStrategy, Settings};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// Settings for a test instance: port 0, a unique Redis key prefix, a patient lock.
pub fn settings(redis_url: &str, prefix: &str) -> Settings {
    Settings {
        database_url: "unused: the test hands in its pool".into(),
        redis_url: redis_url.into(),
        redis_key_prefix: prefix.into(),
        redlock_urls: Vec::new(),
        bind_addr: "127.0.0.1:0".parse().unwrap(),
        admin_token: Some(ADMIN_TOKEN.into()),
        lock_strategy: LockStrategy::Redis,
        lock_ttl_ms: 5_000,
        lock_wait_ms: 30_000,
        work_ms: 0,
        max_quantity: 5,
        database_max_connections: 5,
        log_format: seckill::settings::LogFormat::Text,
    }
}

pub fn shared_redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// One running instance of the service.
pub struct TestApp {
    pub address: String,
    pub pool: PgPool,
    pub client: Client,
    /// Deletes the instance's Redis keys (fence counters have no TTL) when the test ends.
    _cleanup: testkit::PrefixCleanup,
}

/// Start an instance on `pool` with `settings`.
pub async fn spawn_with(settings: Settings, pool: PgPool) -> TestApp {
    let cleanup = testkit::PrefixCleanup::new(&settings.redis_url, &settings.redis_key_prefix);
    let app = Application::build_with_pool(settings, pool.clone())
        .await
        .expect("the app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
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
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn create_product(&self, name: &str, stock: i64) -> i64 {
        let response = self
            .client
            .post(self.url("/api/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"name": name, "stock": stock}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json::<Value>().await.unwrap()["id"]
            .as_i64()
            .unwrap()
    }

    pub async fn restock(&self, id: i64, stock: i64) -> Response {
        self.client
            .put(self.url(&format!("/api/products/{id}/stock")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"stock": stock}))
            .send()
            .await
            .unwrap()
    }

    pub async fn purchase(&self, id: i64, user: i64, quantity: i64) -> Response {
        self.client
            .post(self.url(&format!("/api/products/{id}/purchase")))
            .json(&json!({"user_id": user, "quantity": quantity}))
            .send()
            .await
            .unwrap()
    }

    /// POST a raw body with a content type, as an admin or not; for bad-input tests.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: String,
        admin: bool,
    ) -> Response {
        let mut request = self
            .client
            .post(self.url(path))
            .header("content-type", content_type);
        if admin {
            request = request.bearer_auth(ADMIN_TOKEN);
        }
        request.body(body).send().await.unwrap()
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let response = self.client.get(self.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// The value of one metric line (without labels, or with its exact label set).
    pub async fn metric(&self, name: &str) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|line| {
                let (key, value) = line.rsplit_once(' ')?;
                (key == name).then(|| value.parse().unwrap())
            })
            .unwrap_or(0.0)
    }
}

/// What PostgreSQL says about one product: the figures the books are checked with.
#[derive(Debug, PartialEq, Eq)]
pub struct Books {
    pub stock: i64,
    pub orders: i64,
    pub sold: i64,
    pub users_with_two_orders: i64,
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
    let (users_with_two_orders,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE product_id = $1
         GROUP BY user_id HAVING COUNT(*) > 1) d",
    )
    .bind(product)
    .fetch_one(pool)
    .await
    .unwrap();
    Books {
        stock,
        orders,
        sold,
        users_with_two_orders,
    }
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
