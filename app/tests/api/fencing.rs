//! A holder whose lease ran out must not be able to write.

use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;
use seckill::domain::{ProductId, Quantity, UserId};
use seckill::metrics::Metrics;
use seckill::sale::{PurchaseError, PurchaseRequest, Sale, fenced};
use sqlx::PgPool;

use crate::helpers::{books, settings, shared_redis_url, spawn_with};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_stale_holder_is_fenced_off_and_writes_nothing(pool: PgPool) {
    // Arrange: the service, and beside it a "paused" holder with a short lease and no
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
    let stale = Sale {
        pool: pool.clone(),
        redis: redis.clone(),
        locker: Locker::new(redis, short_lease).unwrap(),
        redlock: None,
        key_prefix: prefix.clone(),
        strategy: seckill::LockStrategy::Redis,
        work: Duration::ZERO,
        metrics: Metrics::new(),
    };
    let product_id = ProductId::parse(&id.to_string()).unwrap();
    let guard = stale
        .locker
        .try_acquire(&fenced::lock_key(&stale, product_id))
        .await
        .unwrap();

    // The lease runs out while the holder is "paused"; another buyer gets the lock and writes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);

    // Act: the stale holder wakes up and tries its write.
    let request = PurchaseRequest {
        product_id,
        user_id: UserId::parse(2).unwrap(),
        quantity: Quantity::parse(1, 5).unwrap(),
    };
    let outcome = fenced::purchase_holding(&stale, &guard, request).await;

    // Assert
    assert!(
        matches!(outcome, Err(PurchaseError::LockLost)),
        "{outcome:?}"
    );
    let books = books(&pool, id).await;
    assert_eq!(
        (books.stock, books.orders),
        (9, 1),
        "the stale write went through"
    );
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM products WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(stored > guard.fence().get() as i64);
    assert!(!guard.release().await.unwrap());
}
