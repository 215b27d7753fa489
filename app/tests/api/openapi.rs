//! The OpenAPI document describes the service that serves it: every route it serves is in
//! the document, and what each operation answers is among the statuses it documents.

use reqwest::Method;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{ADMIN_TOKEN, spawn_app};

/// Every operation the service routes, as (method, path template).
const ROUTES: [(&str, &str); 10] = [
    ("post", "/api/products"),
    ("get", "/api/products/{id}"),
    ("post", "/api/products/{id}/purchase"),
    ("post", "/api/products/{id}/restock"),
    ("put", "/api/products/{id}/stock"),
    ("put", "/api/products/{id}/opening"),
    ("get", "/api/products/{id}/orders/{user_id}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
];

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_document_lists_every_route_and_each_answer_is_documented(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Documented", 5).await;
    let (status, document) = app.ops_json("/api-docs/openapi.json").await;
    assert_eq!(status, 200);
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3."),
        "{document}"
    );

    let mut documented: Vec<(String, String)> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    documented.sort();
    let mut served: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(documented, served);
    assert!(
        document["components"]["schemas"]["ErrorBody"].is_object(),
        "the error format is in the document"
    );

    // Ask each operation twice, once well and once badly, and check that every answer's
    // status is one the document gives for it.
    for (method, template) in ROUTES {
        let operation = &document["paths"][template][method];
        let path = template
            .replace("{id}", &id.to_string())
            .replace("{user_id}", "7");
        let good = match template {
            "/api/products" => json!({"name": "Another", "stock": 1}),
            "/api/products/{id}/purchase" => json!({"user_id": 7}),
            "/api/products/{id}/restock" => json!({"add": 1}),
            "/api/products/{id}/stock" => json!({"stock": 9, "expected_stock": 6}),
            "/api/products/{id}/opening" => json!({"on_sale_at": "2020-01-01T00:00:00Z"}),
            _ => Value::Null,
        };
        for body in [good, json!({"unexpected": true})] {
            let mut request = app
                .client
                .request(
                    Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    // Every route of the document is on the operators' listener.
                    app.ops_url(&path),
                )
                .bearer_auth(ADMIN_TOKEN);
            if method != "get" {
                request = request.json(&body);
            }
            let status = request.send().await.unwrap().status().as_u16();
            assert!(
                operation["responses"][status.to_string()].is_object(),
                "{method} {path} answered {status}, which its operation does not document: {}",
                operation["responses"]
            );
        }
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_admin_operations_declare_the_bearer_token(pool: PgPool) {
    let app = spawn_app(pool).await;
    let (_, document) = app.ops_json("/api-docs/openapi.json").await;
    assert_eq!(
        document["components"]["securitySchemes"]["admin_token"]["scheme"],
        "bearer"
    );
    for (method, path) in [
        ("post", "/api/products"),
        ("post", "/api/products/{id}/restock"),
        ("put", "/api/products/{id}/stock"),
        ("put", "/api/products/{id}/opening"),
    ] {
        let security = &document["paths"][path][method]["security"];
        assert_eq!(security, &json!([{"admin_token": []}]), "{method} {path}");
    }
    assert_eq!(
        document["components"]["securitySchemes"]["buyer_token"]["bearerFormat"],
        "JWT"
    );
    let purchase = &document["paths"]["/api/products/{id}/purchase"]["post"]["security"];
    assert_eq!(purchase, &json!([{"buyer_token": []}]));
    let order = &document["paths"]["/api/products/{id}/orders/{user_id}"]["get"]["security"];
    assert_eq!(order, &json!([{"buyer_token": []}, {"admin_token": []}]));
}
