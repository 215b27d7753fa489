use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{books, buyer_token, error_code, spawn_app};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_purchase_records_an_order_and_takes_the_stock(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let response = app.purchase(id, 42, 3).await;

    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["product_id"], id);
    assert_eq!(body["user_id"], 42);
    assert_eq!(body["quantity"], 3);
    assert!(body["order_id"].as_i64().unwrap() > 0);
    let books = books(&pool, id).await;
    assert_eq!((books.stock, books.orders, books.sold), (7, 1, 3));
    assert_eq!(
        app.get_json(&format!("/api/products/{id}")).await.1["sold"],
        3
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_quantity_defaults_to_one(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let response = app
        .client
        .post(app.url(&format!("/api/products/{id}/purchase")))
        .bearer_auth(buyer_token(1))
        .json(&json!({"user_id": 1}))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    assert_eq!(response.json::<Value>().await.unwrap()["quantity"], 1);
    assert_eq!(books(&pool, id).await.stock, 9);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_second_purchase_by_the_same_user_is_refused(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    assert_eq!(app.purchase(id, 5, 1).await.status(), 201);

    let response = app.purchase(id, 5, 1).await;

    assert_eq!(
        error_code(response).await,
        (409, "already_purchased".to_owned())
    );
    let books = books(&pool, id).await;
    assert_eq!((books.stock, books.orders), (9, 1));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn buying_more_than_is_left_is_sold_out(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 2).await;

    let response = app.purchase(id, 1, 3).await;

    assert_eq!(error_code(response).await, (409, "sold_out".to_owned()));
    assert_eq!(books(&pool, id).await.stock, 2);
    assert_eq!(app.purchase(id, 1, 2).await.status(), 201);
    assert_eq!(
        error_code(app.purchase(id, 2, 1).await).await,
        (409, "sold_out".to_owned())
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_unknown_product_is_404(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    assert_eq!(
        error_code(app.purchase(9_999, 1, 1).await).await,
        (404, "not_found".to_owned())
    );
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn bad_purchase_input_gets_a_4xx_and_changes_nothing(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let path = format!("/api/products/{id}/purchase");
    let cases: Vec<(&str, String, String, &str, u16, &str)> = vec![
        (
            "zero quantity",
            path.clone(),
            r#"{"user_id": 1, "quantity": 0}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "negative quantity",
            path.clone(),
            r#"{"user_id": 1, "quantity": -2}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "quantity above MAX_QUANTITY",
            path.clone(),
            r#"{"user_id": 1, "quantity": 6}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "overflowing quantity",
            path.clone(),
            r#"{"user_id": 1, "quantity": 18446744073709551616}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "zero user: another buyer than the token's",
            path.clone(),
            r#"{"user_id": 0}"#.into(),
            "application/json",
            403,
            "forbidden",
        ),
        (
            "negative user: another buyer than the token's",
            path.clone(),
            r#"{"user_id": -1}"#.into(),
            "application/json",
            403,
            "forbidden",
        ),
        (
            "overflowing user",
            path.clone(),
            r#"{"user_id": 9223372036854775808}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "user as text",
            path.clone(),
            r#"{"user_id": "1"}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "malformed JSON",
            path.clone(),
            r#"{"user_id": "#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "empty body",
            path.clone(),
            String::new(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "wrong content type",
            path.clone(),
            r#"{"user_id": 1}"#.into(),
            "application/x-www-form-urlencoded",
            415,
            "unsupported_media_type",
        ),
        (
            "huge body",
            path.clone(),
            format!(r#"{{"user_id": 1, "pad": "{}"}}"#, "x".repeat(200_000)),
            "application/json",
            413,
            "payload_too_large",
        ),
        (
            "non-numeric id",
            "/api/products/phone/purchase".into(),
            r#"{"user_id": 1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            // The body is checked before the id, as it always was.
            "non-numeric id and the wrong content type",
            "/api/products/phone/purchase".into(),
            r#"{"user_id": 1}"#.into(),
            "text/plain",
            415,
            "unsupported_media_type",
        ),
        (
            "out-of-range id",
            "/api/products/99999999999999999999/purchase".into(),
            r#"{"user_id": 1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
    ];
    for (what, path, body, content_type, status, code) in cases {
        let response = app.post_raw(&path, content_type, body, false).await;
        assert_eq!(
            error_code(response).await,
            (status, code.to_owned()),
            "{what}"
        );
    }
    let books = books(&pool, id).await;
    assert_eq!((books.stock, books.orders), (10, 0));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_purchase_waiting_too_long_for_the_lock_is_told_busy(pool: PgPool) {
    // Arrange: an instance that waits 300 ms, and the lock held elsewhere meanwhile.
    let prefix = testkit::unique_prefix("busy");
    let mut settings = crate::helpers::settings(&crate::helpers::shared_redis_url(), &prefix);
    settings.lock.wait = Duration::from_millis(300);
    let app = crate::helpers::spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let conn = crate::helpers::redis_connection(&crate::helpers::shared_redis_url()).await;
    let holder = distlock::Locker::new(conn, distlock::LockOptions::default())
        .unwrap()
        .try_acquire(&format!("{prefix}lock_sale_{id}"))
        .await
        .unwrap();

    // Act
    let response = app.purchase(id, 1, 1).await;

    // Assert
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(error_code(response).await, (503, "busy".to_owned()));
    assert_eq!(books(&pool, id).await.orders, 0);
    assert_eq!(app.metric("seckill_lock_timeouts_total").await, 1.0);
    let _ = holder.release().await.unwrap();
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
}
