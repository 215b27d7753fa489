//! A holder whose lease ran out must not be able to write; and what a holder remembers of
//! the row between batches never decides an answer on its own.

use std::time::Duration;

use distlock::{LockOptions, Locker};
use redis::aio::ConnectionManager;
use seckill::domain::{ProductId, Quantity, UserId};
use seckill::metrics::Metrics;
use seckill::sale::{PurchaseError, PurchaseRequest, fenced};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{
    BOUNDS, books, observed_session, orders_reads, redis_connection, settings, shared_redis_url,
    spawn_with,
};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_stale_leaders_whole_batch_is_fenced_off_and_writes_nothing(pool: PgPool) {
    // Arrange: the service, and beside it a "paused" leader with a short lease and no
    // watchdog, on the same Redis keys and database.
    let prefix = testkit::unique_prefix("stale");
    let app = spawn_with(settings(&shared_redis_url(), &prefix), pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let redis = redis_connection(&shared_redis_url()).await;
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
    assert!(!guard.release().await.unwrap().was_held());
}

/// A lock on a fresh key of the shared Redis (its keys deleted when the cleanup is dropped),
/// and a product created with `stock` units (in the ledger too).
async fn holding(
    pool: &PgPool,
    stock: i64,
) -> (
    ProductId,
    distlock::LockGuard<ConnectionManager>,
    testkit::PrefixCleanup,
) {
    let product = seckill::repository::insert_product(
        pool,
        BOUNDS,
        &seckill::domain::ProductName::parse("Phone".into()).unwrap(),
        seckill::domain::Stock::parse(stock).unwrap(),
        None,
        "test",
        None,
    )
    .await
    .unwrap();
    let seckill::repository::Keyed::Fresh(product) = product else {
        panic!("a write without a key runs: {product:?}");
    };
    let product = ProductId::parse(&product.id.to_string()).unwrap();
    let redis = redis_connection(&shared_redis_url()).await;
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

/// An order bought outside the holder, with its decrement, as another instance would.
async fn bought_elsewhere(pool: &PgPool, product: ProductId, user: i64) {
    let mut tx = pool.begin().await.unwrap();
    buy_outside(&mut tx, product, user).await;
    tx.commit().await.unwrap();
}

/// Write `user`'s order of one unit and its decrement in `conn`'s transaction, as another
/// instance would (not committed here).
async fn buy_outside(conn: &mut sqlx::PgConnection, product: ProductId, user: i64) {
    sqlx::query("INSERT INTO orders (product_id, user_id, quantity) VALUES ($1, $2, 1)")
        .bind(product.get())
        .bind(user)
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("UPDATE products SET stock = stock - 1, version = version + 1 WHERE id = $1")
        .bind(product.get())
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// The product row's version: bumped by every write of the row.
async fn version(pool: &PgPool, product: ProductId) -> i64 {
    sqlx::query_scalar("SELECT version FROM products WHERE id = $1")
        .bind(product.get())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every 201 carries the order of its own buyer, and the books balance.
async fn assert_owned_and_balanced(
    pool: &PgPool,
    product: ProductId,
    batch: &[PurchaseRequest],
    answers: &[Result<seckill::sale::Bought, PurchaseError>],
) {
    for (request, answer) in batch.iter().zip(answers) {
        if let Ok(bought) = answer {
            let owner: i64 = sqlx::query_scalar("SELECT user_id FROM orders WHERE id = $1")
                .bind(bought.order_id)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(owner, request.user_id.get(), "{answers:?}");
        }
    }
    let books = books(pool, product.get()).await;
    assert!(books.balance(), "{books:?}");
}

/// A holder gives the units of a buyer who had bought already to the next in line.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn holder_gives_a_prior_buyers_units_to_the_next_in_line(pool: PgPool) {
    // Arrange: three units; user 7 bought one elsewhere (a twin on another instance).
    let (product, guard, _cleanup) = holding(&pool, 3).await;
    bought_elsewhere(&pool, product, 7).await;
    let before = version(&pool, product).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);

    // Act: 7, 8 and 9 in one batch. As if the stock were plenty, they ask for three units;
    // two are left, so the holder learns the row (and that 7 has an order) and allocates.
    let batch = buyers(product, &[7, 8, 9]);
    let answers = holder.sell(&batch).await;

    // Assert: 7 already bought; 8 and 9 have the two units, sold in one write.
    assert!(
        matches!(answers[0], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert!(answers[1].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert_eq!(version(&pool, product).await, before + 1, "one write");
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    assert_eq!(books(&pool, product.get()).await.stock, 0);
    let _ = guard.release().await.unwrap();
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_holder_tells_sold_out_only_when_no_unit_is_left_for_that_buyer(pool: PgPool) {
    // Arrange: two units; the holder knows the row (it sold one), then user 7 buys one
    // elsewhere, as a stale holder or an overlapping writer would.
    let (product, guard, _cleanup) = holding(&pool, 3).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);
    assert!(holder.sell(&buyers(product, &[1])).await[0].is_ok());
    bought_elsewhere(&pool, product, 7).await;

    // Act: 7 again, then 8 and 9, one unit left. Allocated against the row it remembers
    // (two left), 7 and 8 would get them and 9 would be sold out.
    let batch = buyers(product, &[7, 8, 9]);
    let answers = holder.sell(&batch).await;

    // Assert: 7 already bought, 8 has the last unit, 9 is sold out: nobody was told sold_out
    // while a unit was left for them.
    assert!(
        matches!(answers[0], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert!(answers[1].is_ok(), "{answers:?}");
    assert!(
        matches!(answers[2], Err(PurchaseError::SoldOut(_))),
        "{answers:?}"
    );
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    assert_eq!(books(&pool, product.get()).await.stock, 0);
    let _ = guard.release().await.unwrap();
}

/// An exact allocation is not written when a buyer it sells to has an order.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn exact_allocation_not_written_when_a_buyer_it_sells_to_has_an_order(pool: PgPool) {
    // Arrange: three units; in one hold, the holder sells one to user 1 and knows that two
    // are left.
    let (product, guard, _cleanup) = holding(&pool, 3).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);
    assert!(holder.sell(&buyers(product, &[1])).await[0].is_ok());

    // Act: user 1 again, then 2 and 3. Against the two units it knows of, the allocation
    // sells to 1 and 2 and tells 3 sold_out; but 1 has an order.
    let batch = buyers(product, &[1, 2, 3]);
    let answers = holder.sell(&batch).await;

    // Assert: 1 already bought; 2 and 3 have the two units. Written as allocated, the insert
    // would have skipped 1 and told 3 sold_out with a unit left.
    assert!(
        matches!(answers[0], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert!(answers[1].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    assert_eq!(books(&pool, product.get()).await.stock, 0);
    let _ = guard.release().await.unwrap();
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_left_without_a_unit_who_had_bought_is_told_already_purchased(pool: PgPool) {
    // Arrange: user 5 bought elsewhere; the holder sells to user 1 and knows that one unit
    // is left.
    let (product, guard, _cleanup) = holding(&pool, 3).await;
    bought_elsewhere(&pool, product, 5).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);
    assert!(holder.sell(&buyers(product, &[1])).await[0].is_ok());

    // Act: 2 takes the last unit; 5 comes after, with nothing left for them.
    let batch = buyers(product, &[2, 5]);
    let answers = holder.sell(&batch).await;

    // Assert: 5 is told what is true of them: they bought already.
    assert!(answers[0].is_ok(), "{answers:?}");
    assert!(
        matches!(answers[1], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    let _ = guard.release().await.unwrap();
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_batch_of_buyers_who_all_bought_already_leaves_the_row_alone(pool: PgPool) {
    // Arrange: users 1 and 2 bought elsewhere.
    let (product, guard, _cleanup) = holding(&pool, 5).await;
    bought_elsewhere(&pool, product, 1).await;
    bought_elsewhere(&pool, product, 2).await;
    let row = |pool: PgPool| async move {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT stock, version, fence FROM products WHERE id = $1",
        )
        .bind(product.get())
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = row(pool.clone()).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);

    // Act
    let answers = holder.sell(&buyers(product, &[1, 2])).await;

    // Assert: both told already_purchased; stock, version and stored fence unchanged.
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(PurchaseError::AlreadyPurchased(_)))),
        "{answers:?}"
    );
    assert_eq!(row(pool.clone()).await, before);
    let _ = guard.release().await.unwrap();
}

/// Buyers found with orders when the stock is short are answered without a write.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn buyers_with_orders_under_short_stock_are_answered_without_a_write(pool: PgPool) {
    // Arrange: users 1 and 2 bought elsewhere; one unit is left.
    let (product, guard, _cleanup) = holding(&pool, 3).await;
    bought_elsewhere(&pool, product, 1).await;
    bought_elsewhere(&pool, product, 2).await;
    let before = version(&pool, product).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);

    // Act: both ask again. As if the stock were plenty they want two units; the statement
    // finds one, and their orders.
    let answers = holder.sell(&buyers(product, &[1, 2])).await;

    // Assert: both already bought, with the stock they saw; nothing written.
    for answer in &answers {
        match answer {
            Err(PurchaseError::AlreadyPurchased(Some(seen))) => assert_eq!(seen.stock, 1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(version(&pool, product).await, before);
    assert_eq!(books(&pool, product.get()).await.stock, 1);
    let _ = guard.release().await.unwrap();
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
        None,
    )
    .await
    .unwrap();
    assert!(matches!(added, seckill::repository::Restocked::Done { .. }));
    let batch = buyers(product, &[3, 4, 5]);
    let answers = holder.sell(&batch).await;

    // Assert: the holder's memory of an empty stock did not answer for the row.
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    assert_eq!(books(&pool, product.get()).await.stock, 0);
    let _ = guard.release().await.unwrap();
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_holders_batch_reads_none_of_the_orders_the_product_has_already(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: the holder's session plans as the service's do (for its parameters, every
    // time), with no statistics on `orders` yet, as early in a fresh deployment's first
    // sale; it sells a few batches while the product has few orders...
    let connect = connect.options([("plan_cache_mode", "force_custom_plan")]);
    let (observer, session) = observed_session(pool_options, connect).await;
    let (product, guard, _cleanup) = holding(&observer, 1_000_000).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&session, &metrics, &guard, product);
    for first in (1..=80).step_by(8) {
        let users: Vec<i64> = (first..first + 8).collect();
        let answers = holder.sell(&buyers(product, &users)).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    }
    // ... then it has 20,000 (inserted by the same session, whose statistics `orders_reads`
    // flushes).
    sqlx::query(
        "INSERT INTO orders (product_id, user_id, quantity) \
         SELECT $1, g, 1 FROM generate_series(1000001, 1020000) g",
    )
    .bind(product.get())
    .execute(&session)
    .await
    .unwrap();
    let before = orders_reads(&session, &observer).await;

    // Act: three batches of 64 new buyers.
    for first in [100_001, 100_065, 100_129] {
        let users: Vec<i64> = (first..first + 64).collect();
        let answers = holder.sell(&buyers(product, &users)).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    }

    // Assert: the batches' cost does not grow with the orders the product has (a plan that
    // hashes all of them to find the batch's repeat buyers reads 20,000 rows per batch), as
    // the statistics say once they show the batches' 192 orders.
    let after = orders_reads(&session, &observer).await;
    assert_eq!(
        after.inserted - before.inserted,
        192,
        "statistics not flushed"
    );
    assert!(
        after.rows - before.rows < 1_000,
        "three batches read {} rows of orders",
        after.rows - before.rows
    );
    let _ = guard.release().await.unwrap();
}

/// An order committed by an overlapping writer undoes the batch and is answered.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn order_by_an_overlapping_writer_undoes_the_batch_and_is_answered(pool: PgPool) {
    // Arrange: user 7's order is being written by another writer (a holder whose lease ran
    // out, say), not yet committed, when the holder sells a batch with 7 and 8.
    let (product, guard, _cleanup) = holding(&pool, 10).await;
    let metrics = Metrics::new();
    let mut holder = fenced::Holder::new(&pool, &metrics, &guard, product);
    let mut overlapping = pool.begin().await.unwrap();
    buy_outside(&mut overlapping, product, 7).await;
    let batch = buyers(product, &[7, 8]);

    // Act: the holder's statement waits for the other writer's row lock; the other writer
    // commits, and the statement goes on to insert 7's order too.
    let commit_when_waited_for = async {
        // PostgreSQL shows the holder's statement waiting for a lock.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE NOT l.granted AND a.datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the holder never waited"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        overlapping.commit().await.unwrap();
    };
    let (answers, ()) = tokio::join!(holder.sell(&batch), commit_when_waited_for);

    // Assert: 7 already bought (the statement that met their order was undone, and the
    // write without them went through); 8 bought; the books balance with 2 orders.
    assert!(
        matches!(answers[0], Err(PurchaseError::AlreadyPurchased(_))),
        "{answers:?}"
    );
    assert!(answers[1].is_ok(), "{answers:?}");
    assert_owned_and_balanced(&pool, product, &batch, &answers).await;
    let books = books(&pool, product.get()).await;
    assert_eq!((books.stock, books.orders), (8, 2), "{books:?}");
    let _ = guard.release().await.unwrap();
}
