use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{ADMIN_TOKEN, error_code, settings, shared_redis_url, spawn_app, spawn_with};

async fn product_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM products")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_admin_creates_a_product(pool: PgPool) {
    let app = spawn_app(pool).await;

    let response = app
        .client
        .post(app.ops_url("/api/products"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "Phone", "stock": 100}))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["name"], "Phone");
    assert_eq!(body["stock"], 100);
    let id = body["id"].as_i64().unwrap();
    let (status, shown) = app.get_json(&format!("/api/products/{id}")).await;
    assert_eq!(status, 200);
    // On sale from its creation (no `on_sale_at` given): the opening is the creation's time.
    let opening = shown["on_sale_at"]
        .as_str()
        .expect("on_sale_at is shown")
        .to_owned();
    assert!(
        opening.parse::<chrono::DateTime<chrono::Utc>>().is_ok(),
        "{opening}"
    );
    assert_eq!(
        shown,
        json!({"id": id, "name": "Phone", "stock": 100, "sold": 0, "supplied": 100, "on_sale_at": opening})
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn admin_routes_refuse_a_missing_or_wrong_token(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let body = json!({"name": "Phone", "stock": 1});
    let cases = [
        app.client.post(app.ops_url("/api/products")).json(&body),
        app.client
            .post(app.ops_url("/api/products"))
            .bearer_auth("wrong")
            .json(&body),
        app.client
            .post(app.ops_url("/api/products"))
            .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
            .json(&body),
        app.client
            .put(app.ops_url("/api/products/1/stock"))
            .json(&json!({"stock": 5, "expected_stock": 1})),
        app.client
            .post(app.ops_url("/api/products/1/restock"))
            .bearer_auth("test-admin-token-0124")
            .json(&json!({"add": 5})),
    ];
    for request in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        assert_eq!(error_code(response).await, (401, "unauthorized".to_owned()));
    }
    assert_eq!(product_count(&pool).await, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn admin_routes_are_disabled_without_an_admin_token(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("no-admin"));
    settings.http.admin_token = None;
    let app = spawn_with(settings, pool.clone()).await;

    let response = app
        .client
        .post(app.ops_url("/api/products"))
        .bearer_auth("anything")
        .json(&json!({"name": "Phone", "stock": 1}))
        .send()
        .await
        .unwrap();

    assert_eq!(
        error_code(response).await,
        (403, "admin_disabled".to_owned())
    );
    assert_eq!(product_count(&pool).await, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn bad_product_input_gets_a_4xx_and_changes_nothing(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let huge_name = "x".repeat(201);
    let huge_body = format!(r#"{{"name": "{}", "stock": 1}}"#, "x".repeat(100_000));
    let cases: Vec<(&str, String, &str, u16, &str)> = vec![
        (
            "malformed JSON",
            "{".into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "not an object",
            "[]".into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "missing stock",
            r#"{"name": "a"}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "missing name",
            r#"{"stock": 1}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "unknown field",
            r#"{"name": "a", "stock": 1, "price": 3}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "stock as text",
            r#"{"name": "a", "stock": "1"}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "fractional stock",
            r#"{"name": "a", "stock": 1.5}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "overflowing stock",
            r#"{"name": "a", "stock": 99999999999999999999}"#.into(),
            "application/json",
            400,
            "malformed_body",
        ),
        (
            "negative stock",
            r#"{"name": "a", "stock": -1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "absurd stock",
            r#"{"name": "a", "stock": 1000000000000}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "empty name",
            r#"{"name": "", "stock": 1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "blank name",
            r#"{"name": "   ", "stock": 1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "huge name",
            format!(r#"{{"name": "{huge_name}", "stock": 1}}"#),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "control characters",
            r#"{"name": "a\u0000b", "stock": 1}"#.into(),
            "application/json",
            400,
            "invalid_input",
        ),
        (
            "wrong content type",
            r#"{"name": "a", "stock": 1}"#.into(),
            "text/plain",
            415,
            "unsupported_media_type",
        ),
        (
            "huge body",
            huge_body,
            "application/json",
            413,
            "payload_too_large",
        ),
    ];
    for (what, body, content_type, status, code) in cases {
        let response = app
            .post_raw("/api/products", content_type, body, true)
            .await;
        assert_eq!(
            error_code(response).await,
            (status, code.to_owned()),
            "{what}"
        );
    }
    assert_eq!(product_count(&pool).await, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn bad_product_ids_get_a_4xx(pool: PgPool) {
    let app = spawn_app(pool).await;
    app.create_product("Phone", 1).await;
    for (path, status, code) in [
        ("/api/products/abc", 400, "invalid_input"),
        ("/api/products/0", 400, "invalid_input"),
        ("/api/products/-3", 400, "invalid_input"),
        ("/api/products/1.0", 400, "invalid_input"),
        ("/api/products/99999999999999999999", 400, "invalid_input"),
        ("/api/products/424242", 404, "not_found"),
    ] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(
            error_code(response).await,
            (status, code.to_owned()),
            "{path}"
        );
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_unauthenticated_request_is_refused_before_its_body_is_read(pool: PgPool) {
    // Bodies that would get a 400 or 413 naming what is wrong with them, if they were read.
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 1).await;
    let huge = format!(r#"{{"name": "{}", "stock": 1}}"#, "x".repeat(100_000));
    let cases = [
        ("/api/products", "{", "application/json"),
        ("/api/products", r#"{"price": 3}"#, "application/json"),
        ("/api/products", huge.as_str(), "application/json"),
        ("/api/products", "name=x", "text/plain"),
    ];
    for (path, body, content_type) in cases {
        let response = app
            .post_raw(path, content_type, body.to_owned(), false)
            .await;
        assert_eq!(
            error_code(response).await,
            (401, "unauthorized".to_owned()),
            "{body:.40}"
        );
    }
    let restock = app
        .client
        .post(app.ops_url(&format!("/api/products/{id}/restock")))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(restock).await, (401, "unauthorized".to_owned()));
    assert_eq!(product_count(&pool).await, 1);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_adds_to_the_stock_and_the_ledger_keeps_the_books(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 3).await;
    assert_eq!(app.purchase(id, 1, 2).await.status(), 201);

    let response = app.restock(id, 7).await;

    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["stock"], 8);
    let (_, shown) = app.get_json(&format!("/api/products/{id}")).await;
    assert_eq!(
        (
            shown["stock"].clone(),
            shown["sold"].clone(),
            shown["supplied"].clone()
        ),
        (json!(8), json!(2), json!(10))
    );
    let reasons: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT delta, reason, actor FROM stock_changes WHERE product_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(reasons.len(), 2);
    assert_eq!((reasons[0].0, reasons[0].1.as_str()), (3, "create"));
    assert_eq!((reasons[1].0, reasons[1].1.as_str()), (7, "restock"));
    assert!(
        reasons[1].2.starts_with("admin@127.0.0.1"),
        "{}",
        reasons[1].2
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_absolute_stock_write_needs_the_stock_it_expects(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 5).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201); // the stock is 4 now

    // The admin believed it was still 5: refused, nothing changes.
    let stale = app.set_stock(id, 20, 5).await;
    let (status, code) = error_code(stale).await;
    assert_eq!((status, code.as_str()), (409, "stock_changed"));
    assert_eq!(crate::helpers::books(&pool, id).await.stock, 4);

    // With the right expectation it is written, withdrawals included, and recorded.
    assert_eq!(app.set_stock(id, 2, 4).await.status(), 200);
    let books = crate::helpers::books(&pool, id).await;
    assert_eq!((books.stock, books.sold, books.supplied), (2, 1, 3));
    assert!(books.balance());
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_past_the_largest_stock_is_refused(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 999_999_999).await;

    let (status, code) = error_code(app.restock(id, 2).await).await;

    assert_eq!((status, code.as_str()), (409, "stock_too_large"));
    assert_eq!(crate::helpers::books(&pool, id).await.stock, 999_999_999);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_bad_restock_gets_a_4xx_and_changes_nothing(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 3).await;
    let send = |method: reqwest::Method, path: String, body: &'static str| {
        app.client
            .request(method, app.ops_url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let (put, post) = (reqwest::Method::PUT, reqwest::Method::POST);
    for (method, path, body, status, code) in [
        (
            post.clone(),
            format!("/api/products/{id}/restock"),
            r#"{"add": 0}"#,
            400,
            "invalid_input",
        ),
        (
            post.clone(),
            format!("/api/products/{id}/restock"),
            r#"{"add": -1}"#,
            400,
            "invalid_input",
        ),
        (
            post.clone(),
            format!("/api/products/{id}/restock"),
            r#"{"add": "x"}"#,
            400,
            "malformed_body",
        ),
        (
            post.clone(),
            format!("/api/products/{id}/restock"),
            r#"{"stock": 1}"#,
            400,
            "malformed_body",
        ),
        (
            post.clone(),
            "/api/products/777/restock".to_owned(),
            r#"{"add": 1}"#,
            404,
            "not_found",
        ),
        (
            put.clone(),
            format!("/api/products/{id}/stock"),
            r#"{"stock": -1, "expected_stock": 3}"#,
            400,
            "invalid_input",
        ),
        (
            put.clone(),
            format!("/api/products/{id}/stock"),
            r#"{"stock": 5}"#,
            400,
            "malformed_body",
        ),
        (
            put.clone(),
            format!("/api/products/{id}/stock"),
            r#"{}"#,
            400,
            "malformed_body",
        ),
        (
            put.clone(),
            "/api/products/x/stock".to_owned(),
            r#"{"stock": 1, "expected_stock": 3}"#,
            400,
            "invalid_input",
        ),
        (
            put.clone(),
            "/api/products/777/stock".to_owned(),
            r#"{"stock": 1, "expected_stock": 3}"#,
            404,
            "not_found",
        ),
    ] {
        let response = send(method, path.clone(), body).await.unwrap();
        assert_eq!(
            error_code(response).await,
            (status, code.to_owned()),
            "{path} {body}"
        );
    }
    assert_eq!(
        app.get_json(&format!("/api/products/{id}")).await.1["stock"],
        3
    );
}
