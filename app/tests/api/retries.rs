//! Batches that conflict with another writer are retried, but never past the batch's one
//! time-out and never for buyers who left: nothing commits after its buyer was answered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use seckill::LockStrategy;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::helpers::{TestApp, settings, shared_redis_url, spawn_with};

/// A pg-optimistic instance whose every batch attempt conflicts while `bumping` is set: each
/// attempt reads, works 300 ms inside its transaction, and finds the version changed by a
/// writer that bumps it every 20 ms. The batch time-out is 0.5 + 4 × 0.2 + 0.3 = 1.6 s.
struct Contended {
    app: TestApp,
    id: i64,
    bumping: Arc<AtomicBool>,
    bumper: JoinHandle<()>,
}

impl Contended {
    async fn start(pool: PgPool) -> Self {
        let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("retries"));
        settings.lock.strategy = LockStrategy::PgOptimistic;
        settings.sale.work = Duration::from_millis(300);
        settings.database.acquire_timeout = Duration::from_millis(500);
        settings.database.statement_timeout = Duration::from_millis(200);
        settings.lock.wait = Duration::from_millis(5_000);
        let app = spawn_with(settings, pool.clone()).await;
        let id = app.create_product("Phone", 10).await;
        let bumping = Arc::new(AtomicBool::new(true));
        let bumper = {
            let bumping = Arc::clone(&bumping);
            tokio::spawn(async move {
                while bumping.load(Ordering::Acquire) {
                    sqlx::query("UPDATE products SET version = version + 1 WHERE id = $1")
                        .bind(id)
                        .execute(&pool)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        Self {
            app,
            id,
            bumping,
            bumper,
        }
    }

    async fn stop_bumping(self) -> TestApp {
        self.bumping.store(false, Ordering::Release);
        self.bumper.await.unwrap();
        self.app
    }
}

/// A batch that keeps conflicting is answered within one batch timeout and commits nothing
/// after.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn conflicting_batch_answers_within_its_timeout_then_commits_nothing(pool: PgPool) {
    // Arrange
    let contended = Contended::start(pool).await;
    let id = contended.id;
    let started = Instant::now();

    // Act: one buyer, while every attempt conflicts; then the conflicts stop.
    let response = contended.app.purchase(id, 1, 1).await;
    let answered_after = started.elapsed();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    let app = contended.stop_bumping().await;
    // Long enough for any retry still going to succeed (each takes about 300 ms).
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Assert: answered by the desk itself within about one batch time-out (busy, or the
    // attempt the time-out cut short), well before 20 attempts of 300 ms or the buyer's own
    // wait of 5 s; and no order committed behind the answer.
    assert_eq!(status, 503, "{body}");
    assert!(
        answered_after < Duration::from_secs(4),
        "answered after {answered_after:?}"
    );
    assert_eq!(app.order_of(id, 1).await, None);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_who_left_while_their_batch_was_retried_gets_no_order(pool: PgPool) {
    // Arrange
    let contended = Contended::start(pool).await;
    let id = contended.id;

    // Act: the buyer gives up after 500 ms, while the batch is being retried; the conflicts
    // stop at 1 s, before the batch's time-out of 1.6 s.
    let gone = contended
        .app
        .client
        .post(contended.app.url(&format!("/api/products/{id}/purchase")))
        .bearer_auth(crate::helpers::buyer_token(1))
        .timeout(Duration::from_millis(500))
        .json(&json!({"user_id": 1, "quantity": 1}))
        .send()
        .await;
    assert!(gone.is_err(), "answered before leaving: {gone:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let app = contended.stop_bumping().await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Assert: no retry sold to the buyer who left; the desk still sells to the next one.
    assert_eq!(app.order_of(id, 1).await, None);
    assert_eq!(app.purchase(id, 2, 1).await.status(), 201);
}
