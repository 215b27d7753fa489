//! A holder whose lease ran out must not be able to write; and what a holder remembers of
//! the row between batches never decides an answer on its own.

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
    let metrics = Metrics::new();
    let answers = fenced::Holder::new(&pool, &metrics, &guard, product)
        .sell(&batch)
        .await;

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

/// A lock on a fresh key of the shared Redis (its keys deleted when the cleanup is dropped),
/// and a product with `stock` units.
async fn holding(
    pool: &PgPool,
    stock: i64,
) -> (
    ProductId,
    distlock::LockGuard<ConnectionManager>,
    testkit::PrefixCleanup,
) {
    let id: i64 =
        sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('Phone', $1) RETURNING id")
            .bind(stock)
            .fetch_one(pool)
            .await
            .unwrap();
    let product = ProductId::parse(&id.to_string()).unwrap();
    let redis = ConnectionManager::new(redis::Client::open(shared_redis_url()).unwrap())
        .await
        .unwrap();
    let locker = Locker::new(redis, LockOptions::default()).unwrap();
    let prefix = testkit::unique_prefix("holder");
    let cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let guard = locker
        .try_acquire(&fenced::lock_key(&prefix, product))
        .await
        .unwrap();
    (product, guard, cleanup)
}

fn buyers(product: ProductId, users: &[i64]) -> Vec<PurchaseRequest> {
    users
        .iter()
        .map(|&user| PurchaseRequest {
            product_id: product,
            user_id: UserId::parse(user).unwrap(),
            quantity: Quantity::parse(1, 5).unwrap(),
        })
        .collect()
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_holder_gives_the_units_of_a_buyer_who_had_bought_already_to_the_next_in_line(
    pool: PgPool,
) {
    // Arrange: two units left, and user 7 bought before (a twin on another instance).
    let (product, guard, _cleanup) = holding(&pool, 2).await;
    sqlx::query("INSERT INTO orders (product_id, user_id, quantity) VALUES ($1, 7, 1)")
        .bind(product.get())
        .execute(&pool)
        .await
        .unwrap();
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);

    // Act: 7, 8 and 9 in one batch. Allocated against the stock, 7 and 8 get the two units
    // and 9 is sold out; the write then skips 7.
    let answers = holder.sell(&buyers(product, &[7, 8, 9])).await;

    // Assert: 7 already bought; 8 and 9 have the two units.
    assert!(
        matches!(answers[0], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert!(answers[1].is_ok() && answers[2].is_ok(), "{answers:?}");
    let books = books(&pool, product.get()).await;
    assert_eq!((books.stock, books.orders), (0, 3));
    guard.release().await.unwrap();
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_holder_that_saw_the_stock_gone_sells_again_after_a_restock(pool: PgPool) {
    // Arrange: the holder sells the only unit, and then tells the next buyer sold_out.
    let (product, guard, _cleanup) = holding(&pool, 1).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);
    assert!(holder.sell(&buyers(product, &[1])).await[0].is_ok());
    let answers = holder.sell(&buyers(product, &[2])).await;
    assert!(
        matches!(answers[0], Err(PurchaseError::SoldOut(_))),
        "{answers:?}"
    );

    // Act: an admin restocks 3 (the row lock only: it does not wait for our lock), then the
    // same holder sells to three more buyers.
    let added = seckill::repository::add_stock(
        &pool,
        BOUNDS,
        product,
        seckill::domain::Stock::parse(3).unwrap(),
        "test",
    )
    .await
    .unwrap();
    assert!(matches!(added, seckill::repository::Restocked::Done { .. }));
    let answers = holder.sell(&buyers(product, &[3, 4, 5])).await;

    // Assert: the holder's memory of an empty stock did not answer for the row.
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let books = books(&pool, product.get()).await;
    assert_eq!((books.stock, books.orders), (0, 4));
    guard.release().await.unwrap();
}
