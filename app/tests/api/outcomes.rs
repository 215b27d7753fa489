//! What a buyer is told when the outcome is not a plain yes or no: a commit whose answer was
//! lost, and a second purchase by a buyer who has an order.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::helpers::{hold_row, spawn_app};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_who_bought_already_is_told_their_order(pool: PgPool) {
    // Arrange
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 10).await;
    let first = app.purchase(id, 42, 1).await;
    assert_eq!(first.status(), 201);
    let order_id = first.json::<Value>().await.unwrap()["order_id"].clone();

    // Act
    let again = app.purchase(id, 42, 1).await;

    // Assert
    assert_eq!(again.status(), 409);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["error"], "already_purchased", "{body}");
    assert_eq!(body["order_id"], order_id, "{body}");
}

/// A write whose connection was cut is answered outcome unknown with the order lookup.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn cut_write_is_answered_outcome_unknown_with_the_order_lookup(pool: PgPool) {
    // Arrange: the test holds the product's row, so the instance's write (one statement, the
    // lock holder's) waits for it; then PostgreSQL ends that session, as a failover or an
    // operator would. The client cannot tell whether such a write committed.
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let row = hold_row(&pool, id).await;
    let buying = {
        let request = app
            .client
            .post(app.url(&format!("/api/products/{id}/purchase")))
            .bearer_auth(crate::helpers::buyer_token(42))
            .json(&serde_json::json!({"user_id": 42}));
        tokio::spawn(async move { request.send().await.expect("an answer") })
    };
    let waiting = "SELECT pid FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let started = Instant::now();
    let writer: i32 = loop {
        if let Some(pid) = sqlx::query_scalar(waiting)
            .fetch_optional(&pool)
            .await
            .unwrap()
        {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the write never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // Act
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(writer)
        .execute(&pool)
        .await
        .unwrap();
    row.commit().await.unwrap();
    let answer = buying.await.unwrap();

    // Assert: not "unavailable" (which says nothing was recorded) but "unknown", with where
    // to look; the look-up answers, and a retry after it buys.
    assert_eq!(answer.status(), 503);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"], "outcome_unknown", "{body}");
    let path = format!("/api/products/{id}/orders/42");
    assert_eq!(body["order_path"], path.as_str(), "{body}");
    assert_eq!(
        app.get_json_as(&path, &crate::helpers::buyer_token(42))
            .await
            .0,
        404
    );
    assert_eq!(app.purchase(id, 42, 1).await.status(), 201);
}
