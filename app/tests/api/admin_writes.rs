//! Admin writes that survive their client: a restock whose client left is still announced,
//! and a retried write with its `Idempotency-Key` changes nothing again.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

use crate::helpers::{
    ADMIN_TOKEN, TestApp, books, hold_row, settings, shared_redis_url, spawn_instances,
};

fn restock_with_key(app: &TestApp, id: i64, add: i64, key: &str) -> reqwest::RequestBuilder {
    app.client
        .post(app.url(&format!("/api/products/{id}/restock")))
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

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_whose_client_went_away_still_commits_and_reaches_every_instance(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: B remembers the product as sold out, and would for a minute without news.
    // The test holds the product's row, so A's restock waits for it.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("restock-gone"));
    settings.sold_out_recheck_ms = 60_000;
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
        .post(a.url(&format!("/api/products/{id}/restock")))
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
    let started = Instant::now();
    loop {
        let response = b.purchase(id, 3, 1).await;
        if response.status() == 201 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B never heard of the restock: {}",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let books = books(&a.pool, id).await;
    assert_eq!((books.stock, books.supplied), (4, 6));
    assert!(books.balance(), "{books:?}");
}
