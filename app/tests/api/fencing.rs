//! A holder whose lease ran out must not be able to write.

use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;
use seckill::domain::{ProductId, Quantity, UserId};
use seckill::metrics::Metrics;
use seckill::sale::{PurchaseError, PurchaseRequest, fenced};
use sqlx::PgPool;

use crate::helpers::{BOUNDS, books, settings, shared_redis_url, spawn_with};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_stale_leaders_whole_batch_is_fenced_off_and_writes_nothing(pool: PgPool) {
    // Arrange: the service, and beside it a "paused" leader with a short lease and no
    // watchdog, on the same Redis keys and database.
    let prefix = testkit::unique_prefix("stale");
    let app = spawn_with(settings(&shared_redis_url(), &prefix), pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let redis = ConnectionManager::new(redis::Client::open(shared_redis_url()).unwrap())
        .await
        .unwrap();
    let short_lease = LockOptions::builder()
        .ttl(Duration::from_millis(300))
        .without_watchdog()
        .build()
        .unwrap();
    let stale = Locker::new(redis, short_lease).unwrap();
    let product = ProductId::parse(&id.to_string()).unwrap();
    let guard = stale
        .try_acquire(&fenced::lock_key(&prefix, product))
        .await
        .unwrap();

    // The lease runs out while the leader is "paused"; another buyer gets the lock and writes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);

    // Act: the stale leader wakes up and sells its batch of four buyers.
    let batch: Vec<PurchaseRequest> = (2..=5)
        .map(|user| PurchaseRequest {
            product_id: product,
            user_id: UserId::parse(user).unwrap(),
            quantity: Quantity::parse(1, 5).unwrap(),
        })
        .collect();
    let answers =
        fenced::sell_holding(&pool, BOUNDS, &Metrics::new(), &guard, product, &batch).await;

    // Assert: every buyer in it is told lock_lost, and none of it was written.
    assert_eq!(answers.len(), 4);
    for answer in &answers {
        assert!(matches!(answer, Err(PurchaseError::LockLost)), "{answer:?}");
    }
    let books = books(&pool, id).await;
    assert_eq!(
        (books.stock, books.orders),
        (9, 1),
        "the stale batch went through"
    );
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM products WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(stored > guard.fence().as_i64());
    assert!(!guard.release().await.unwrap());
}
