//! What a client cannot do to the service: hold a connection open by trickling a request,
//! have its input echoed back at any length, or have an answer cached or sniffed.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

use crate::helpers::{buyer_token, settings, shared_redis_url, spawn_app, spawn_with};

/// Write `head`, then `body` one byte every `gap`, until the service answers or closes;
/// what it sent back, and when.
async fn trickle(address: &str, head: &str, body: &[u8], gap: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut socket = TcpStream::connect(address.trim_start_matches("http://"))
        .await
        .unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    for byte in body {
        // A write to a socket the service closed may still succeed: the read says.
        let _ = socket.write_all(std::slice::from_ref(byte)).await;
        match timeout(gap, socket.read(&mut buffer)).await {
            Err(_still_waiting) => {}
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buffer[..n]),
        }
    }
    // Whatever else comes, until the service closes.
    while let Ok(Ok(n)) = timeout(Duration::from_secs(5), socket.read(&mut buffer)).await {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buffer[..n]);
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_body_sent_a_byte_at_a_time_is_cut_off_with_408_at_the_request_timeout(pool: PgPool) {
    // Arrange: a 1 s request timeout, and a purchase whose 60-byte body would take 30 s
    // at a byte every 500 ms.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("trickle"));
    settings.http.request_timeout = Duration::from_millis(1_000);
    let app = spawn_with(settings, pool).await;
    let id = app.create_product("Phone", 10).await;
    let body = format!("{{\"quantity\": 1{}}}", " ".repeat(45));
    let head = format!(
        "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        buyer_token(7),
        body.len()
    );

    // Act
    let (answer, took) = trickle(
        &app.address,
        &head,
        body.as_bytes(),
        Duration::from_millis(500),
    )
    .await;

    // Assert: 408, and the connection closed long before the body could have arrived.
    // TIMING: the cut comes at 1 s; 20 s leaves a busy machine room and still fails on a
    // service that waits for the whole body (30 s).
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    // Closed after the 408: the rest of the trickle was never read as another request.
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let sold: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(sold, 0);
}

/// A connection's first head (actix's own deadline, which does not apply to the next
/// request's head on a kept-alive connection: docs/operations.md).
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_first_head_sent_a_byte_at_a_time_is_cut_off_at_the_request_timeout(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("trickle-head"));
    settings.http.request_timeout = Duration::from_millis(1_000);
    let app = spawn_with(settings, pool).await;
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n",
        "y".repeat(60)
    );

    let (answer, took) = trickle(
        &app.address,
        "",
        head.as_bytes(),
        Duration::from_millis(500),
    )
    .await;

    // TIMING: as above; the whole head would take 40 s.
    assert!(!answer.contains("200 OK"), "{answer}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_bad_value_or_id_is_echoed_short_however_long_it_was(pool: PgPool) {
    let app = spawn_app(pool).await;
    let long = "x".repeat(10_000);

    let bad_body = app
        .client
        .post(app.ops_url("/api/products"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(format!(r#"{{"name": "a", "stock": "{long}"}}"#))
        .send()
        .await
        .unwrap();
    let bad_id = app
        .client
        .get(app.url(&format!("/api/products/-{}1", "0".repeat(5_000))))
        .send()
        .await
        .unwrap();

    for response in [bad_body, bad_id] {
        assert_eq!(response.status(), 400);
        let body: Value = response.json().await.unwrap();
        let message = body["message"].as_str().unwrap();
        assert!(
            message.len() < 300,
            "{} characters: {message:.300}",
            message.len()
        );
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn answers_are_neither_cached_nor_sniffed(pool: PgPool) {
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 1).await;
    let bought = app.purchase(id, 1, 1).await;
    assert_eq!(bought.status(), 201);
    // The sold-out lane answers before the router; the order look-up carries an order.
    let sold_out = app.purchase(id, 2, 1).await;
    let order = app
        .client
        .get(app.url(&format!("/api/products/{id}/orders/1")))
        .bearer_auth(buyer_token(1))
        .send()
        .await
        .unwrap();
    let missing = app
        .client
        .get(app.url("/no-such-route"))
        .send()
        .await
        .unwrap();

    for response in [bought, sold_out, order, missing] {
        let headers = response.headers();
        assert_eq!(headers["x-content-type-options"], "nosniff", "{response:?}");
        assert_eq!(headers["cache-control"], "no-store", "{response:?}");
        assert!(!headers["x-request-id"].is_empty(), "{response:?}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_quick_body_is_not_cut_off(pool: PgPool) {
    // The deadline is for trickles: a body sent in two parts well inside it is sold.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("quick"));
    settings.http.request_timeout = Duration::from_millis(3_000);
    let app = spawn_with(settings, pool).await;
    let id = app.create_product("Phone", 10).await;
    let body = b"{\"quantity\": 1}";
    let head = format!(
        "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        buyer_token(8),
        body.len()
    );
    let mut socket = TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&body[..5]).await.unwrap();
    sleep(Duration::from_millis(100)).await;
    socket.write_all(&body[5..]).await.unwrap();
    let mut answer = String::new();
    timeout(Duration::from_secs(30), socket.read_to_string(&mut answer))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}
