use sqlx::PgPool;

use crate::helpers::spawn_app;

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn healthz_answers_while_the_process_is_up(pool: PgPool) {
    let app = spawn_app(pool).await;
    let (status, body) = app.get_json("/healthz").await;
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn readyz_reports_both_backends_reachable(pool: PgPool) {
    let app = spawn_app(pool).await;
    let (status, body) = app.ops_json("/readyz").await;
    assert_eq!(status, 200);
    assert_eq!(body["postgres"], true);
    assert_eq!(body["redis"], true);
    assert_eq!(body["status"], "ready");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn metrics_are_served_in_prometheus_format(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Metered", 1).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);

    let text = app.metrics_text().await;

    for name in [
        "seckill_purchases_total{outcome=\"created\"} 1",
        "seckill_purchase_duration_seconds_bucket",
        "seckill_lock_wait_seconds_bucket",
        "seckill_lock_acquisitions_total 1",
        "seckill_lock_timeouts_total",
        "seckill_lock_renewals_total",
        "seckill_locks_lost_total",
        "seckill_sold_out_fast_path_total",
        "seckill_orders_total 1",
        "seckill_queued_purchases 0",
        "seckill_batch_size_count 1",
        "seckill_batches_per_hold_count 1",
        "seckill_queue_full_total 0",
        "seckill_buyers_gone_total 0",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn unknown_routes_answer_404_in_the_error_format(pool: PgPool) {
    let app = spawn_app(pool).await;
    let response = app.client.get(app.url("/nope")).send().await.unwrap();
    let (status, code) = crate::helpers::error_code(response).await;
    assert_eq!((status, code.as_str()), (404, "not_found"));
}

/// A known path asked with the wrong method answers 405 in the error format.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn wrong_method_on_a_known_path_answers_405_in_the_error_format(pool: PgPool) {
    let app = spawn_app(pool).await;
    for (method, path) in [
        (reqwest::Method::GET, "/api/products/1/purchase"),
        (reqwest::Method::DELETE, "/api/products/1"),
        (reqwest::Method::GET, "/api/products"),
    ] {
        let response = app
            .client
            .request(method.clone(), app.ops_url(path))
            .send()
            .await
            .unwrap();
        let (status, code) = crate::helpers::error_code(response).await;
        assert_eq!(
            (status, code.as_str()),
            (405, "method_not_allowed"),
            "{method} {path}"
        );
    }
}
