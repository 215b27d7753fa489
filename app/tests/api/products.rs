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
        .post(app.url("/api/products"))
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
    assert_eq!(
        shown,
        json!({"id": id, "name": "Phone", "stock": 100, "sold": 0})
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn admin_routes_refuse_a_missing_or_wrong_token(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let body = json!({"name": "Phone", "stock": 1});
    let cases = [
        app.client.post(app.url("/api/products")).json(&body),
        app.client
            .post(app.url("/api/products"))
            .bearer_auth("wrong")
            .json(&body),
        app.client
            .post(app.url("/api/products"))
            .header("Authorization", format!("Basic {ADMIN_TOKEN}"))
            .json(&body),
        app.client
            .put(app.url("/api/products/1/stock"))
            .json(&json!({"stock": 5})),
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
    settings.admin_token = None;
    let app = spawn_with(settings, pool.clone()).await;

    let response = app
        .client
        .post(app.url("/api/products"))
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
async fn a_restock_sets_the_stock(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 1).await;

    let response = app.restock(id, 7).await;

    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["stock"], 7);
    assert_eq!(
        app.get_json(&format!("/api/products/{id}")).await.1["stock"],
        7
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_bad_restock_gets_a_4xx_and_changes_nothing(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 3).await;
    let put = |path: String, body: &'static str| {
        app.client
            .put(app.url(&path))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    for (path, body, status, code) in [
        (
            format!("/api/products/{id}/stock"),
            r#"{"stock": -1}"#,
            400,
            "invalid_input",
        ),
        (
            format!("/api/products/{id}/stock"),
            r#"{"stock": "x"}"#,
            400,
            "malformed_body",
        ),
        (
            format!("/api/products/{id}/stock"),
            r#"{}"#,
            400,
            "malformed_body",
        ),
        (
            "/api/products/x/stock".to_owned(),
            r#"{"stock": 1}"#,
            400,
            "invalid_input",
        ),
        (
            "/api/products/777/stock".to_owned(),
            r#"{"stock": 1}"#,
            404,
            "not_found",
        ),
    ] {
        let response = put(path.clone(), body).await.unwrap();
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
