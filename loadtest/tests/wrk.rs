//! The bench's wrk buyers are buyers the service accepts: every request of the buy script
//! carries a token wrk signs itself, and every one of them buys.

use std::process::Command;

use clap::Parser;
use sqlx::PgPool;

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn every_wrk_buyer_carries_a_token_the_service_accepts(pool: PgPool) {
    // Arrange: an instance that checks the demo key, and a product with plenty of stock.
    let mut settings =
        seckill::Settings::try_parse_from(["seckill", "--database-url", "unused"]).unwrap();
    settings.http.bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.http.ops_bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.redis.key_prefix = testkit::unique_prefix("wrk");
    settings.identity.secret = Some(loadtest::buyers::DEMO_BUYER_SECRET.into());
    settings.http.admin_token = Some("wrk-test-admin-token-0123".into());
    settings.limits.address_rate = 0;
    if let Ok(url) = std::env::var("REDIS_URL") {
        settings.redis.url = url.into();
    }
    let _cleanup = testkit::PrefixCleanup::new(settings.redis.url(), &settings.redis.key_prefix);
    let app = seckill::Application::build_with_pool(settings, pool.clone())
        .await
        .unwrap();
    let base = format!("http://{}", app.address());
    let ops = format!("http://{}", app.operations_address());
    tokio::spawn(app.run_until_stopped());
    let product = loadtest::attack::create_product(&ops, "wrk-test-admin-token-0123", 1_000_000)
        .await
        .unwrap();
    let script = std::env::temp_dir().join(format!("{}.lua", testkit::unique_prefix("wrk-buy")));
    std::fs::write(
        &script,
        loadtest::bench::buy_script(loadtest::buyers::secret()),
    )
    .unwrap();

    // Act: one second of wrk's buyers.
    let url = format!("{base}/api/products/{product}/purchase");
    let out = tokio::task::spawn_blocking(move || {
        let out = Command::new("wrk")
            .args(["-t1", "-c4", "-d1s", "-s"])
            .arg(&script)
            .args([url.as_str(), "--", "1"])
            .output()
            .expect("wrk runs (Debian: apt-get install wrk)");
        let _ = std::fs::remove_file(&script);
        out
    })
    .await
    .unwrap();

    // Assert: wrk saw no answer but 201, and the orders are in PostgreSQL, one per request.
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !report.contains("Non-2xx"),
        "some buyers were refused:\n{report}"
    );
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE product_id = $1")
        .bind(product)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(orders >= 50, "only {orders} orders:\n{report}");
}
