//! Admin writes that survive their client: a restock whose client left is still announced,
//! and a retried write with its `Idempotency-Key` changes nothing again.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

use crate::helpers::{
    ADMIN_TOKEN, TestApp, books, buys_within, hold_row, settings, shared_redis_url, spawn_instances,
};

fn restock_with_key(app: &TestApp, id: i64, add: i64, key: &str) -> reqwest::RequestBuilder {
    app.client
        .post(app.ops_url(&format!("/api/products/{id}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .header("Idempotency-Key", key)
        .json(&json!({"add": add}))
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_retried_with_its_idempotency_key_adds_the_stock_once(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange
    let settings = settings(&shared_redis_url(), &testkit::unique_prefix("idempotent"));
    let apps = spawn_instances(1, &pool_options, &connect, &settings).await;
    let app = &apps[0];
    let id = app.create_product("Phone", 1).await;

    // Act: the same restock twice, as a client that lost the first answer sends it again;
    // then the key with another request.
    let first = restock_with_key(app, id, 10, "restock-7f3a")
        .send()
        .await
        .unwrap();
    let first = (
        first.status().as_u16(),
        first.json::<Value>().await.unwrap(),
    );
    let retried = restock_with_key(app, id, 10, "restock-7f3a")
        .send()
        .await
        .unwrap();
    let retried = (
        retried.status().as_u16(),
        retried.json::<Value>().await.unwrap(),
    );
    let reused = restock_with_key(app, id, 3, "restock-7f3a")
        .send()
        .await
        .unwrap();
    let reused = (
        reused.status().as_u16(),
        reused.json::<Value>().await.unwrap(),
    );

    // Assert: one restock of 10; the retry got the first answer; the reuse was refused.
    assert_eq!(first.0, 200, "{}", first.1);
    assert_eq!(first.1["stock"], 11);
    assert_eq!(retried, first);
    assert_eq!(reused.0, 422, "{}", reused.1);
    assert_eq!(reused.1["error"], "idempotency_key_reused");
    let books = books(&app.pool, id).await;
    assert_eq!((books.stock, books.supplied), (11, 11));
    assert!(books.balance(), "{books:?}");
}

/// Idempotency keys are kept for 24 hours, not for good: an older key is free again, and the
/// next keyed write deletes the old ones (the table does not grow with every write for ever).
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn idempotency_keys_expire_after_a_day(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: a restock under a key, written down 25 hours ago (moved back by hand).
    let settings = settings(&shared_redis_url(), &testkit::unique_prefix("keys-expire"));
    let apps = spawn_instances(1, &pool_options, &connect, &settings).await;
    let app = &apps[0];
    let id = app.create_product("Phone", 1).await;
    let first = restock_with_key(app, id, 10, "restock-old")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    sqlx::query("UPDATE admin_requests SET created_at = now() - interval '25 hours'")
        .execute(&app.pool)
        .await
        .unwrap();

    // Act: the old key with another request; then a write under a fresh key.
    let reused = restock_with_key(app, id, 3, "restock-old")
        .send()
        .await
        .unwrap();
    let reused_status = reused.status().as_u16();
    let other = restock_with_key(app, id, 1, "restock-new")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    // Assert: the old key was free again (the restock of 3 ran), and no row older than a
    // day is left.
    assert_eq!(reused_status, 200, "an expired key was refused as reused");
    let books = books(&app.pool, id).await;
    assert_eq!((books.stock, books.supplied), (15, 15));
    let old: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM admin_requests WHERE created_at < now() - interval '24 hours'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(old, 0, "expired keys are still kept");
}

/// A restock whose client went away still commits and reaches every instance.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn restock_commits_and_spreads_though_its_client_went_away(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: B remembers the product as sold out, and would for a minute without news.
    // The test holds the product's row, so A's restock waits for it.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("restock-gone"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(b.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 409);
    let pool: &PgPool = &a.pool;
    let row = hold_row(pool, id).await;

    // Act: the admin's client gives up while the restock waits; then the row is let go.
    let gone = a
        .client
        .post(a.ops_url(&format!("/api/products/{id}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .timeout(Duration::from_millis(500))
        .json(&json!({"add": 5}))
        .send()
        .await;
    assert!(gone.is_err(), "answered while the row was held: {gone:?}");
    // Time for the server to notice the client left and drop its handler.
    tokio::time::sleep(Duration::from_millis(500)).await;
    row.commit().await.unwrap();

    // Assert: the restock committed, and B heard of it (well inside its minute of memory).
    let heard = buys_within(b, id, 3, Duration::from_secs(10)).await;
    assert!(heard.is_some(), "B never heard of the restock");
    let books = books(&a.pool, id).await;
    assert_eq!((books.stock, books.supplied), (4, 6));
    assert!(books.balance(), "{books:?}");
}

/// The pids of sessions of this database waiting for a lock, once there are `n` of them.
async fn lock_waiters(pool: &PgPool, n: usize) -> Vec<i32> {
    let started = Instant::now();
    loop {
        let waiting: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        if waiting.len() >= n {
            return waiting;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} sessions waited for a lock, not {n}",
            waiting.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn set_stock_with_key(
    app: &TestApp,
    id: i64,
    stock: i64,
    expected: i64,
) -> reqwest::RequestBuilder {
    app.client
        .put(app.ops_url(&format!("/api/products/{id}/stock")))
        .bearer_auth(ADMIN_TOKEN)
        .header("Idempotency-Key", "set-9c1d")
        .json(&json!({"stock": stock, "expected_stock": expected}))
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn twin_stock_writes_sent_at_once_with_one_key_both_get_the_first_answer(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: the test holds the product's row, so the twins both wait, whatever for.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("twins"));
    settings.database.lock_timeout = Duration::from_millis(20_000);
    settings.database.statement_timeout = Duration::from_millis(20_000);
    let apps = spawn_instances(1, &pool_options, &connect, &settings).await;
    let app = &apps[0];
    let id = app.create_product("Phone", 1).await;
    let row = hold_row(&app.pool, id).await;

    // Act: a client that timed out sends the same write again while the first still waits.
    let first = tokio::spawn(set_stock_with_key(app, id, 5, 1).send());
    lock_waiters(&app.pool, 1).await;
    let second = tokio::spawn(set_stock_with_key(app, id, 5, 1).send());
    lock_waiters(&app.pool, 2).await;
    row.commit().await.unwrap();
    let mut answers = Vec::new();
    for twin in [first, second] {
        let answer = twin.await.unwrap().unwrap();
        answers.push((
            answer.status().as_u16(),
            answer.json::<Value>().await.unwrap(),
        ));
    }

    // Assert: one write; both were told it was made (the second did not see its twin's stock
    // as someone else's change).
    assert_eq!(answers[0].0, 200, "{answers:?}");
    assert_eq!(answers[1], answers[0], "the twin was answered otherwise");
    assert_eq!(answers[0].1["stock"], 5);
    let books = books(&app.pool, id).await;
    assert_eq!((books.stock, books.supplied), (5, 5));
    assert!(books.balance(), "{books:?}");
}

/// A restock whose connection was cut is answered outcome unknown and its retry adds it once.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn cut_restock_is_outcome_unknown_and_its_retry_adds_it_once(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: the restock waits for the product's row, which the test holds.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("restock-cut"));
    settings.database.lock_timeout = Duration::from_millis(20_000);
    settings.database.statement_timeout = Duration::from_millis(20_000);
    let apps = spawn_instances(1, &pool_options, &connect, &settings).await;
    let app = &apps[0];
    let id = app.create_product("Phone", 1).await;
    let row = hold_row(&app.pool, id).await;

    // Act: its session is ended while it waits; then the row is let go, and the admin sends
    // the restock again with its key.
    let cut = tokio::spawn(restock_with_key(app, id, 10, "restock-cut-1").send());
    let waiting = lock_waiters(&app.pool, 1).await;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(waiting[0])
        .execute(&app.pool)
        .await
        .unwrap();
    let cut = cut.await.unwrap().unwrap();
    let cut = (cut.status().as_u16(), cut.json::<Value>().await.unwrap());
    row.commit().await.unwrap();
    let retried = restock_with_key(app, id, 10, "restock-cut-1")
        .send()
        .await
        .unwrap();

    // Assert: the cut write was not said to have written nothing; its retry made it, once.
    assert_eq!(cut.0, 503, "{}", cut.1);
    assert_eq!(cut.1["error"], "outcome_unknown", "{}", cut.1);
    assert_eq!(retried.status(), 200);
    let books = books(&app.pool, id).await;
    assert_eq!((books.stock, books.supplied), (11, 11));
    assert!(books.balance(), "{books:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_retried_after_its_answer_was_lost_is_announced_again(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: B remembers the product as sold out, and would for a minute without news. A
    // restock committed and its answer and news were lost (what a connection cut right after
    // the commit leaves): its row, its key and its new generation are in the database.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("restock-lost"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(b.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 409);
    let mut tx = a.pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE products SET stock = stock + 5, restock_gen = restock_gen + 1, \
         version = version + 1 WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO stock_changes (product_id, delta, reason, actor) VALUES ($1, 5, 'restock', 'admin')",
    )
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO admin_requests (key, request, status, product_id, name, stock) \
         VALUES ('restock-lost-1', $2, 200, $1, 'Phone', 5)",
    )
    .bind(id)
    .bind(format!("POST /api/products/{id}/restock add=5"))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    // Act: the admin, who got no answer, sends the restock again with its key.
    let retried = restock_with_key(a, id, 5, "restock-lost-1")
        .send()
        .await
        .unwrap();
    assert_eq!(retried.status(), 200);

    // Assert: nothing was added again, and B heard of the restock (well inside its minute).
    let heard = buys_within(b, id, 3, Duration::from_secs(10)).await;
    assert!(heard.is_some(), "B never heard of the restock");
    let books = books(&a.pool, id).await;
    assert_eq!((books.stock, books.supplied), (4, 6));
    assert!(books.balance(), "{books:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_flood_of_stuck_admin_writes_does_not_take_the_sales_connections(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: `pg-atomic`, which sells on the sale's pool (5 connections, a 1 s wait for
    // one); restocks of product A stuck behind a session holding A's row for the 5 s lock
    // timeout, and buyers of product B.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("admin-flood"));
    settings.lock.strategy = seckill::LockStrategy::PgAtomic;
    settings.database.lock_timeout = Duration::from_millis(5_000);
    settings.database.acquire_timeout = Duration::from_millis(1_000);
    let sale_pool = PgPoolOptions::new()
        .max_connections(5)
        .acquire_timeout(Duration::from_millis(1_000));
    let mut apps = spawn_instances(1, &sale_pool, &connect, &settings).await;
    let app = std::sync::Arc::new(apps.pop().unwrap());
    let pool = pool_options.connect_with(connect).await.unwrap();
    let (a, b) = (
        app.create_product("A", 1).await,
        app.create_product("B", 100).await,
    );
    let held = hold_row(&pool, a).await;
    let mut restocks = Vec::new();
    for _ in 0..20 {
        let app = app.clone();
        restocks.push(tokio::spawn(
            async move { app.restock(a, 1).await.status() },
        ));
    }
    // TIMING: the restocks reach their handlers well within a second; each would then hold
    // a connection of the sale's for up to 5 s.
    tokio::time::sleep(Duration::from_millis(1_000)).await;

    // Act: ten buyers of B, one after another, while A's restocks are stuck.
    let mut answers = Vec::new();
    for user in 1..=10 {
        answers.push(app.purchase(b, user, 1).await.status().as_u16());
    }
    drop(held);

    // Assert: every buyer was sold to; the restocks answered (done, or busy past the lock
    // timeout).
    assert_eq!(answers, vec![201; 10]);
    for restock in restocks {
        let status = restock.await.unwrap().as_u16();
        assert!(matches!(status, 200 | 503), "{status}");
    }
    assert!(books(&pool, b).await.balance());
}
