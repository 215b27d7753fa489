//! Sold out, from memory: no queue, no lock, no round trip; and restocks that reach every
//! instance within a stated bound.

use std::time::Duration;

use seckill::LockStrategy;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::time::Instant;

use crate::helpers::{
    TestApp, books, buys_within, error_code, redis_connection, settings, shared_redis_url,
    spawn_instances, wait_until_listening,
};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn once_an_instance_has_seen_the_sell_out_it_answers_from_memory(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: two instances; A sells the last unit.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("sold-out"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(a.purchase(id, 1, 1).await.status(), 201);

    // Act: A is asked again; B is asked twice (it has not seen the sell-out yet).
    let from_a = a.purchase(id, 2, 1).await;
    let first_b = b.purchase(id, 3, 1).await;
    let second_b = b.purchase(id, 4, 1).await;

    // Assert: A answered from memory at once; B learnt it from one batch, then from memory.
    for response in [from_a, first_b, second_b] {
        assert_eq!(error_code(response).await, (409, "sold_out".to_owned()));
    }
    assert_eq!(a.metric("seckill_sold_out_fast_path_total").await, 1.0);
    assert_eq!(a.metric("seckill_lock_acquisitions_total").await, 1.0);
    assert_eq!(b.metric("seckill_sold_out_fast_path_total").await, 1.0);
    assert_eq!(b.metric("seckill_lock_acquisitions_total").await, 1.0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_batch_that_answers_only_already_purchased_still_teaches_the_sell_out(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: A sells the last unit to user 1; B has not seen the sell-out.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("sold-out"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(a.purchase(id, 1, 1).await.status(), 201);

    // Act: user 1 asks B again (a batch finds their order, and the stock at 0), then user 5.
    let again = b.purchase(id, 1, 1).await;
    let other = b.purchase(id, 5, 1).await;

    // Assert: the second answer came from memory, without another batch or lock.
    assert_eq!(
        error_code(again).await,
        (409, "already_purchased".to_owned())
    );
    assert_eq!(error_code(other).await, (409, "sold_out".to_owned()));
    assert_eq!(b.metric("seckill_sold_out_fast_path_total").await, 1.0);
    assert_eq!(b.metric("seckill_lock_acquisitions_total").await, 1.0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_restock_reaches_another_instance_by_message_at_once(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: B remembers the product as sold out, and would for a minute without news.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("restock-news"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(b.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 409);
    assert_eq!(b.metric("seckill_sold_out_fast_path_total").await, 1.0);
    wait_until_listening(b).await;

    // Act: restock through A.
    assert_eq!(a.restock(id, 2).await.status(), 200);

    // Assert: B sells at once (well inside the 60 s its memory would last; 10 s is room
    // for a busy machine).
    let took = buys_within(b, id, 3, Duration::from_secs(10)).await;
    assert!(took.is_some(), "the restock did not reach B by message");
    let books = books(&a.pool, id).await;
    assert_eq!((books.stock, books.orders), (1, 2));
    assert!(books.balance(), "{books:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn without_redis_a_restock_reaches_another_instance_within_the_recheck(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: pg-row instances with no Redis at all (so no restock message can arrive);
    // B remembers the product as sold out, for at most 500 ms at a time.
    let dead_redis = format!("redis://127.0.0.1:{}", testkit::free_port());
    let mut settings = settings(&dead_redis, "");
    settings.lock.strategy = LockStrategy::PgRow;
    settings.sale.sold_out_recheck = Duration::from_millis(500);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(b.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 409);

    // Act
    assert_eq!(a.restock(id, 2).await.status(), 200);

    // Assert: B sells once its memory is due for a recheck: within the 500 ms bound, plus
    // room for a busy machine (without the recheck, B would answer sold out for ever).
    let took = buys_within(b, id, 3, Duration::from_secs(8)).await;
    let took = took.expect("the restock never reached B");
    assert!(took < Duration::from_millis(500 + 3_500), "took {took:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_product_with_stock_left_is_not_marked_sold_out(pool: PgPool) {
    let app = crate::helpers::spawn_app(pool).await;
    let id = app.create_product("Phone", 2).await;
    // Too many for what is left, but not sold out: the next buyer of 1 must get through.
    assert_eq!(
        error_code(app.purchase(id, 1, 3).await).await,
        (409, "sold_out".to_owned())
    );
    assert_eq!(app.purchase(id, 2, 1).await.status(), 201);
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 0.0);
}

/// Another deployment sharing redis and prefix cannot switch our sold out memory off.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn other_deployment_on_our_redis_cannot_clear_our_sold_out_memory(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: two deployments, each with its own database, on one Redis under one key
    // prefix. In ours, product 1 is sold out and remembered so for a minute.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("deployments"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let ours = spawn_instances(1, &pool_options, &connect, &settings).await;
    let ours = &ours[0];
    let theirs_db = format!("seckill_other_deployment_{}", std::process::id());
    let admin = pool_options
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {theirs_db} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {theirs_db}"))
        .execute(&admin)
        .await
        .unwrap();
    let theirs = spawn_instances(
        1,
        &pool_options,
        &connect.clone().database(&theirs_db),
        &settings,
    )
    .await;
    let theirs = &theirs[0];
    let id = ours.create_product("Phone", 1).await;
    assert_eq!(
        theirs.create_product("Lamp", 1).await,
        id,
        "both are product 1"
    );
    assert_eq!(ours.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(ours.purchase(id, 2, 1).await.status(), 409);
    wait_until_listening(ours).await;
    wait_until_listening(theirs).await;

    // Act: the other deployment restocks its product 1; any news of it has time to arrive.
    assert_eq!(theirs.restock(id, 5).await.status(), 200);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Assert: ours still answers from memory (the news was not ours), and still sold out.
    let fast_before = ours.metric("seckill_sold_out_fast_path_total").await;
    assert_eq!(ours.purchase(id, 3, 1).await.status(), 409);
    assert_eq!(
        ours.metric("seckill_sold_out_fast_path_total").await,
        fast_before + 1.0,
        "another deployment's restock reopened our product"
    );
    theirs.pool.close().await;
    sqlx::query(&format!("DROP DATABASE {theirs_db} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
}

/// A forged restock message (the channel is open to whoever reaches the Redis) cannot switch
/// the sold-out memory off: the news makes the instance read the product again, and the
/// read finds no restock.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_forged_restock_message_does_not_switch_the_sold_out_memory_off(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: the product is sold out and remembered so for a minute.
    let prefix = testkit::unique_prefix("forged-news");
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(1, &pool_options, &connect, &settings).await;
    let app = &apps[0];
    let id = app.create_product("Phone", 1).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(app.purchase(id, 2, 1).await.status(), 409);
    wait_until_listening(app).await;
    let locks_before = app.metric("seckill_lock_acquisitions_total").await;
    let fast_before = app.metric("seckill_sold_out_fast_path_total").await;

    // Act: publish, as an attacker would, the largest generation on the channel it finds.
    let mut redis = redis_connection(&shared_redis_url()).await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{prefix}seckill:restocks:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(channels.len(), 1, "{channels:?}");
    let heard: i64 = redis::cmd("PUBLISH")
        .arg(&channels[0])
        .arg(format!("{id}:{}", i64::MAX))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(heard, 1, "the instance is subscribed");
    // Time for the message, and a read of the product it may start, on a busy machine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for user in 3..6 {
        assert_eq!(
            error_code(app.purchase(id, user, 1).await).await,
            (409, "sold_out".to_owned())
        );
    }

    // Assert: every purchase was still answered from memory, without a lock.
    assert_eq!(
        app.metric("seckill_sold_out_fast_path_total").await,
        fast_before + 3.0,
        "the forged message switched the sold-out memory off"
    );
    assert_eq!(
        app.metric("seckill_lock_acquisitions_total").await,
        locks_before
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn after_redis_restarts_restock_news_is_heard_again(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: two instances on a private Redis that restarts (longer than its clients'
    // own reconnect attempts); B remembers the product as sold out for a minute.
    let mut redis = testkit::RedisServer::start();
    let mut settings = settings(&redis.url(), "");
    settings.lock.strategy = LockStrategy::PgRow;
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = a.create_product("Phone", 1).await;
    assert_eq!(b.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(b.purchase(id, 2, 1).await.status(), 409);
    wait_until_listening(b).await;
    redis.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart_empty();
    wait_until_listening(b).await;
    wait_until_listening(a).await;

    // Act
    assert_eq!(a.restock(id, 2).await.status(), 200);

    // Assert: the news reached B by message, not by its minute-long recheck.
    let took = buys_within(b, id, 3, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "the restock news was not heard after the restart"
    );
}

/// Send `head`, then `body` 100 ms later; read the answer: its status line and whether it
/// closes the connection.
async fn exchange(stream: &mut tokio::net::TcpStream, head: &str, body: &str) -> (String, bool) {
    use tokio::io::AsyncWriteExt;
    stream.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.write_all(body.as_bytes()).await.unwrap();
    read_answers(stream, 1).await.remove(0)
}

/// An instance, and a product it has seen sell out and trusts to be sold out for the whole
/// test: its one unit sold (the batch that sold it marked it sold out), and one purchase
/// answered `sold_out` since (from memory: one answer on the fast-path counter).
async fn seen_sold_out(pool: PgPool) -> (TestApp, i64) {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("sold-out"));
    settings.sale.sold_out_recheck = Duration::from_millis(60_000);
    let app = crate::helpers::spawn_with(settings, pool).await;
    let id = app.create_product("Phone", 1).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(
        error_code(app.purchase(id, 2, 1).await).await,
        (409, "sold_out".to_owned())
    );
    (app, id)
}

/// A sold out product answers before the body is checked and keeps the connection.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn sold_out_answers_before_the_body_is_checked_keeping_the_connection(pool: PgPool) {
    // Arrange: a product this instance has seen sell out (and trusts it for the whole test).
    let (app, id) = seen_sold_out(pool).await;
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();

    // Act: on one connection, two purchases whose bodies arrive after their heads: one the
    // body check would refuse (user 0), then a well-formed one.
    let mut answers = Vec::new();
    for body in [r#"{"user_id": 0}"#, r#"{"user_id": 3}"#] {
        let head = format!(
            "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        answers.push(exchange(&mut stream, &head, body).await);
    }

    // Assert: both answered 409 from memory (sold out whoever buys), on one open connection:
    // the late body was read to its end before the answer.
    for (status, closes) in &answers {
        assert!(status.starts_with("http/1.1 409"), "{status}");
        assert!(!closes, "the answer closed the connection");
    }
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 3.0);

    // A chunked body is read to its end too: same connection, still open.
    let head = format!(
        "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let (status, closes) = exchange(&mut stream, &head, "e\r\n{\"user_id\": 4}\r\n0\r\n\r\n").await;
    assert!(status.starts_with("http/1.1 409"), "{status}");
    assert!(!closes, "the chunked answer closed the connection");
    // And one longer than any route reads, whose end comes only after the answer: the lane
    // stops reading past 16 KiB and lets go of the body, actix reads out the rest, and the
    // connection carries the next purchase.
    {
        use tokio::io::AsyncWriteExt;
        let long_chunk = format!("{:x}\r\n{}\r\n", 17 * 1024, " ".repeat(17 * 1024));
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(long_chunk.as_bytes()).await.unwrap();
        let (status, closes) = read_answers(&mut stream, 1).await.remove(0);
        assert!(status.starts_with("http/1.1 409"), "{status}");
        assert!(!closes, "the long chunked answer closed the connection");
        stream.write_all(b"0\r\n\r\n").await.unwrap();
    }
    let whole = format!("{head}e\r\n{{\"user_id\": 5}}\r\n0\r\n\r\n");
    let (status, closes) = exchange_whole(&mut stream, &whole, 1).await.remove(0);
    assert!(status.starts_with("http/1.1 409"), "{status}");
    assert!(
        !closes,
        "the connection did not carry on after the long body"
    );
    // A purchase with no body at all: answered at once, connection open.
    let empty = format!(
        "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"
    );
    let (status, closes) = exchange_whole(&mut stream, &empty, 1).await.remove(0);
    assert!(status.starts_with("http/1.1 409"), "{status}");
    assert!(!closes, "the answer to an empty body closed the connection");

    // A body announced larger than any route takes is not waited for, nor one that stops
    // arriving (partway, or before its first byte): 409 without it, and the connection is
    // closed (its body was never read).
    for (length, sent) in [(1 << 20, ""), (100, r#"{"user_id""#), (20, "")] {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let head = format!(
            "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        );
        let (status, closes) = exchange(&mut stream, &head, sent).await;
        assert!(status.starts_with("http/1.1 409"), "{length}: {status}");
        assert!(
            closes,
            "{length}: a connection with an unread body must close"
        );
    }
    assert_eq!(
        app.metric("seckill_purchases_total{outcome=\"sold_out\"}")
            .await,
        10.0
    );
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 10.0);
}

/// A whole sold out purchase in one write is answered at once and a stalled one within the
/// bound.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn sold_out_write_answers_at_once_and_a_stalled_one_within_the_bound(pool: PgPool) {
    // Arrange: a product this instance has seen sell out, and one connection.
    let (app, id) = seen_sold_out(pool).await;
    let address = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = |user: i64| {
        let body = format!(r#"{{"user_id": {user}}}"#);
        format!(
            "POST /api/products/{id}/purchase HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };

    // Act: a purchase whose head and body come in one write, as a buyer's client sends
    // them; then two such purchases pipelined in one write.
    let started = Instant::now();
    let one = exchange_whole(&mut stream, &request(3), 1).await;
    let took = started.elapsed();
    let two = exchange_whole(&mut stream, &(request(4) + &request(5)), 2).await;
    // On another connection: a whole purchase, and behind it one whose body stops partway.
    let mut stalled = tokio::net::TcpStream::connect(address).await.unwrap();
    let late = request(6);
    let cut = &late[..late.len() - 4];
    let pair = exchange_whole(&mut stalled, &(request(7) + cut), 2).await;

    // Assert: every whole purchase is answered 409 on its open connection, and the first
    // without waiting for the 2 s bound on a late body (which it would wait for if the body
    // that came with its head were not read in the same pass). The pipelined purchase whose
    // body stopped is answered too, within the bound (actix closes that connection: the
    // answer before it already goes out with a body behind it unread).
    for (status, closes) in one.iter().chain(&two) {
        assert!(status.starts_with("http/1.1 409"), "{status}");
        assert!(!closes, "the answer closed the connection");
    }
    assert!(pair[0].0.starts_with("http/1.1 409"), "{}", pair[0].0);
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert!(pair[1].0.starts_with("http/1.1 409"), "{}", pair[1].0);
    assert!(pair[1].1, "a connection with an unread body must close");
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 6.0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_sold_out_lane_leaves_what_it_does_not_answer_to_the_routes(pool: PgPool) {
    // Arrange: a product this instance has seen sell out.
    let (app, id) = seen_sold_out(pool).await;
    let client = reqwest::Client::new();
    let url = |path: String| format!("{}{path}", app.address);

    // Act: the purchase path with another method, a trailing slash, and an id spelled
    // percent-encoded; then a well-formed purchase with a malformed body.
    let get = client
        .get(url(format!("/api/products/{id}/purchase")))
        .send()
        .await
        .unwrap();
    let slash = client
        .post(url(format!("/api/products/{id}/purchase/")))
        .json(&serde_json::json!({"user_id": 3}))
        .send()
        .await
        .unwrap();
    let encoded_id: String = id
        .to_string()
        .bytes()
        .map(|b| format!("%{b:02X}"))
        .collect();
    let encoded = client
        .post(url(format!("/api/products/{encoded_id}/purchase")))
        .bearer_auth(crate::helpers::buyer_token(3))
        .json(&serde_json::json!({"user_id": 3, "quantity": 0}))
        .send()
        .await
        .unwrap();
    let encoded_well_formed = client
        .post(url(format!("/api/products/{encoded_id}/purchase")))
        .bearer_auth(crate::helpers::buyer_token(3))
        .json(&serde_json::json!({"user_id": 3}))
        .send()
        .await
        .unwrap();

    // Assert: the routes answered each as they answer it for any product (405, 404; the
    // encoded id is decoded and its body checked: quantity 0 is refused), and the lane answered
    // none of them; the well-formed purchase with the encoded id got the lane's answer from
    // the route (sold out, from the same memory: the one answer from memory besides the
    // first, and no batch).
    assert_eq!(
        error_code(get).await,
        (405, "method_not_allowed".to_owned())
    );
    assert_eq!(error_code(slash).await, (404, "not_found".to_owned()));
    assert_eq!(error_code(encoded).await, (400, "invalid_input".to_owned()));
    assert_eq!(
        error_code(encoded_well_formed).await,
        (409, "sold_out".to_owned())
    );
    assert_eq!(app.metric("seckill_sold_out_fast_path_total").await, 2.0);
    assert_eq!(app.metric("seckill_lock_acquisitions_total").await, 1.0);
}

/// Send `requests` (whole, in one write) and read `answers` answers.
async fn exchange_whole(
    stream: &mut tokio::net::TcpStream,
    requests: &str,
    answers: usize,
) -> Vec<(String, bool)> {
    use tokio::io::AsyncWriteExt;
    stream.write_all(requests.as_bytes()).await.unwrap();
    read_answers(stream, answers).await
}

/// Read until `answers` answers (heads and the bodies their Content-Length announces) are
/// in: the status line of each, and whether it closes the connection.
async fn read_answers(stream: &mut tokio::net::TcpStream, answers: usize) -> Vec<(String, bool)> {
    use tokio::io::AsyncReadExt;
    let mut response = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&response).to_lowercase();
        if let Some(parsed) = whole_answers(&text, answers) {
            return parsed;
        }
        let n = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut chunk))
            .await
            .expect("an answer within 15 s")
            .unwrap();
        assert!(n > 0, "the connection closed before an answer");
        response.extend_from_slice(&chunk[..n]);
    }
}

/// The first `answers` answers in `text`, as [`read_answers`] gives them; `None` until all
/// of them are in.
fn whole_answers(mut text: &str, answers: usize) -> Option<Vec<(String, bool)>> {
    let mut parsed = Vec::new();
    while parsed.len() < answers {
        let (head, rest) = text.split_once("\r\n\r\n")?;
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |n| n.trim().parse().unwrap());
        if rest.len() < length {
            return None;
        }
        let status = head.lines().next().unwrap().to_owned();
        parsed.push((status, head.contains("connection: close")));
        text = &rest[length..];
    }
    Some(parsed)
}
