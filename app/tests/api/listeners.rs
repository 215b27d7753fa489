//! Two listeners: buyers reach the sale and `/healthz` on `BIND_ADDR`; the admin routes,
//! `/metrics`, `/readyz` and the OpenAPI document are only on `OPS_BIND_ADDR`.

use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{ADMIN_TOKEN, buyer_token, spawn_app};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_operators_routes_are_not_on_the_buyers_listener(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 10).await;
    let operators: [(Method, String, Option<serde_json::Value>); 7] = [
        (
            Method::POST,
            "/api/products".into(),
            Some(json!({"name": "X", "stock": 1})),
        ),
        (
            Method::POST,
            format!("/api/products/{id}/restock"),
            Some(json!({"add": 1})),
        ),
        (
            Method::PUT,
            format!("/api/products/{id}/stock"),
            Some(json!({"stock": 5, "expected_stock": 11})),
        ),
        (
            Method::PUT,
            format!("/api/products/{id}/opening"),
            Some(json!({"on_sale_at": "2020-01-01T00:00:00Z"})),
        ),
        (Method::GET, "/metrics".into(), None),
        (Method::GET, "/readyz".into(), None),
        (Method::GET, "/api-docs/openapi.json".into(), None),
    ];
    for (method, path, body) in operators {
        let send = |url: String| {
            let request = app
                .client
                .request(method.clone(), url)
                .bearer_auth(ADMIN_TOKEN);
            match &body {
                Some(body) => request.json(body).send(),
                None => request.send(),
            }
        };
        let public = send(app.url(&path)).await.unwrap().status();
        let private = send(app.ops_url(&path)).await.unwrap().status();
        assert_eq!(public, 404, "{method} {path} on the public listener");
        assert!(
            private.is_success(),
            "{method} {path} on the operators' listener: {private}"
        );
    }
    // The restock above made 11 units, and the stock write 5.
    let buyers: [(Method, String); 3] = [
        (Method::GET, "/healthz".into()),
        (Method::GET, format!("/api/products/{id}")),
        (Method::POST, format!("/api/products/{id}/purchase")),
    ];
    for (method, path) in buyers {
        let response = app
            .client
            .request(method.clone(), app.url(&path))
            .bearer_auth(buyer_token(3))
            .json(&json!({"quantity": 1}))
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{method} {path}: {}",
            response.status()
        );
    }
}

#[test]
fn the_operators_listener_is_on_loopback_unless_told_otherwise() {
    let settings = seckill::Settings::new("postgres://db/x", "redis://r");
    assert!(settings.http.ops_bind_addr.ip().is_loopback());
    assert_ne!(
        settings.http.ops_bind_addr.port(),
        settings.http.bind_addr.port()
    );
}
