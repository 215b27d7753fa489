//! Buyers are who their token says, the sale opens at its time, and one client cannot send
//! without limit: every refusal leaves no order and no Redis key behind.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Response;
use seckill::LockStrategy;
use seckill::settings::BuyerIdentity;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{
    ADMIN_TOKEN, BUYER_SECRET, TestApp, books, buyer_token, error_code, redis_keys, settings,
    shared_redis_url, spawn_app, spawn_instances, spawn_with, wait_until_listening,
};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token with these claims, signed with `secret` by `algorithm`.
fn signed(algorithm: Algorithm, secret: &str, claims: &Value) -> String {
    jsonwebtoken::encode(
        &Header::new(algorithm),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// Claims of buyer 5, valid for an hour, with `extra` on top.
fn claims(extra: Value) -> Value {
    let mut claims = json!({"sub": "5", "exp": now() + 3_600});
    claims
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    claims
}

async fn buy_with(app: &TestApp, id: i64, authorization: Option<&str>, body: Value) -> Response {
    let mut request = app
        .client
        .post(app.url(&format!("/api/products/{id}/purchase")))
        .json(&body);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request.send().await.unwrap()
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn every_bad_token_gets_401_and_leaves_nothing_behind(pool: PgPool) {
    // Arrange: an instance that checks the issuer and the audience too.
    let prefix = testkit::unique_prefix("tokens");
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.identity.issuer = Some("shop".into());
    settings.identity.audience = Some("seckill".into());
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let good = json!({"iss": "shop", "aud": "seckill"});
    let hs256 = |extra: Value| signed(Algorithm::HS256, BUYER_SECRET, &claims(extra));
    let mut no_exp = claims(good.clone());
    no_exp.as_object_mut().unwrap().remove("exp");
    let bearer = |token: String| Some(format!("Bearer {token}"));
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        ("another scheme", Some("Basic dXNlcjpwYXNz".into())),
        ("malformed", bearer("not.a.jwt".into())),
        (
            "alg none",
            bearer(
                "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiI1IiwiZXhwIjo0MTAyNDQ0ODAwfQ."
                    .into(),
            ),
        ),
        (
            "another algorithm",
            bearer(signed(
                Algorithm::HS512,
                BUYER_SECRET,
                &claims(good.clone()),
            )),
        ),
        (
            "wrong signature",
            bearer(signed(
                Algorithm::HS256,
                "another-secret-of-at-least-32-bytes!",
                &claims(good.clone()),
            )),
        ),
        (
            "no exp",
            bearer(signed(Algorithm::HS256, BUYER_SECRET, &no_exp)),
        ),
        (
            "expired",
            bearer(hs256(
                json!({"iss": "shop", "aud": "seckill", "exp": now() - 600}),
            )),
        ),
        (
            "not yet valid",
            bearer(hs256(
                json!({"iss": "shop", "aud": "seckill", "nbf": now() + 600}),
            )),
        ),
        (
            "wrong issuer",
            bearer(hs256(json!({"iss": "other", "aud": "seckill"}))),
        ),
        (
            "wrong audience",
            bearer(hs256(json!({"iss": "shop", "aud": "other"}))),
        ),
        ("no issuer", bearer(hs256(json!({"aud": "seckill"})))),
        (
            "subject not a number",
            bearer(hs256(
                json!({"iss": "shop", "aud": "seckill", "sub": "alice"}),
            )),
        ),
        (
            "subject zero",
            bearer(hs256(json!({"iss": "shop", "aud": "seckill", "sub": "0"}))),
        ),
        (
            "subject not written as its id",
            bearer(hs256(
                json!({"iss": "shop", "aud": "seckill", "sub": "005"}),
            )),
        ),
        (
            "subject negative",
            bearer(hs256(json!({"iss": "shop", "aud": "seckill", "sub": "-5"}))),
        ),
        ("oversized header", bearer("a".repeat(5_000))),
    ];

    for (what, authorization) in cases {
        let response = buy_with(&app, id, authorization.as_deref(), json!({"user_id": 5})).await;
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            error_code(response).await,
            (401, "unauthorized".to_owned()),
            "{what}"
        );
        let challenge = challenge.unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"));
        assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
    }

    // The same claims, well signed, buy: what was refused was the token.
    let right = bearer(hs256(good)).unwrap();
    let bought = buy_with(&app, id, Some(&right), json!({})).await;
    assert_eq!(bought.status(), 201);
    let body: Value = bought.json().await.unwrap();
    assert_eq!(body["user_id"], 5, "{body}");
    let books = books(&pool, id).await;
    assert_eq!(
        (books.stock, books.orders),
        (9, 1),
        "only the good token bought"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_refused_buyer_makes_no_redis_key(pool: PgPool) {
    let prefix = testkit::unique_prefix("nokeys");
    let app = spawn_with(settings(&shared_redis_url(), &prefix), pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let before = redis_keys(&shared_redis_url(), &prefix).await;

    let expired = signed(
        Algorithm::HS256,
        BUYER_SECRET,
        &json!({"sub": "5", "exp": now() - 600}),
    );
    let refused = [
        buy_with(&app, id, None, json!({"user_id": 5})).await,
        buy_with(&app, id, Some(&format!("Bearer {expired}")), json!({})).await,
        buy_with(
            &app,
            id,
            Some(&format!("Bearer {}", buyer_token(6))),
            json!({"user_id": 5}),
        )
        .await,
    ];

    let statuses: Vec<u16> = refused.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, [401, 401, 403]);
    assert_eq!(redis_keys(&shared_redis_url(), &prefix).await, before);
    assert_eq!(books(&pool, id).await.orders, 0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_token_is_checked_before_the_body_is_read(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let path = app.url(&format!("/api/products/{id}/purchase"));
    let malformed = app
        .client
        .post(&path)
        .header("content-type", "application/json")
        .body("{\"user_id\": ")
        .send()
        .await
        .unwrap();
    let wrong_type = app
        .client
        .post(&path)
        .header("content-type", "text/plain")
        .body("x".repeat(100_000))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(malformed).await,
        (401, "unauthorized".to_owned())
    );
    assert_eq!(
        error_code(wrong_type).await,
        (401, "unauthorized".to_owned())
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_body_naming_another_buyer_is_forbidden(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let other = buy_with(
        &app,
        id,
        Some(&format!("Bearer {}", buyer_token(6))),
        json!({"user_id": 5}),
    )
    .await;
    let same = buy_with(
        &app,
        id,
        Some(&format!("Bearer {}", buyer_token(6))),
        json!({"user_id": 6}),
    )
    .await;

    assert_eq!(error_code(other).await, (403, "forbidden".to_owned()));
    assert_eq!(same.status(), 201);
    assert_eq!(books(&pool, id).await.orders, 1);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_order_is_read_only_by_its_buyer_or_the_admin(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    assert_eq!(app.purchase(id, 5, 1).await.status(), 201);
    let path = format!("/api/products/{id}/orders/5");

    let own = app.get_json_as(&path, &buyer_token(5)).await;
    let admin_on_public = app.get_json_as(&path, ADMIN_TOKEN).await;
    let admin = app
        .client
        .get(app.ops_url(&path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .status();
    let other = app.get_json_as(&path, &buyer_token(6)).await;
    let missing = app
        .get_json_as(&format!("/api/products/{id}/orders/6"), &buyer_token(6))
        .await;
    let anonymous = app.get_json(&path).await;

    assert_eq!(own.0, 200);
    assert_eq!(own.1["user_id"], 5);
    assert_eq!(admin, 200);
    // The admin token opens nothing on the buyers' listener.
    assert_eq!(admin_on_public.0, 401);
    // Another buyer learns nothing: the same answer as for an order that does not exist.
    assert_eq!(other, missing);
    assert_eq!(other.0, 404);
    assert_eq!(anonymous.0, 401);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_token_never_opens_an_admin_route(pool: PgPool) {
    let app = spawn_app(pool).await;
    let response = app
        .client
        .post(app.ops_url("/api/products"))
        .bearer_auth(buyer_token(1))
        .json(&json!({"name": "Phone", "stock": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(response).await, (401, "unauthorized".to_owned()));
}

/// Create a product opening `opens_in` from the database's clock now.
async fn product_opening_in(app: &TestApp, pool: &PgPool, opens_in: Duration) -> i64 {
    let at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap();
    let at = at + chrono::Duration::from_std(opens_in).unwrap();
    app.create_product_from(json!({"name": "Phone", "stock": 10, "on_sale_at": at.to_rfc3339()}))
        .await
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_purchase_a_moment_before_the_opening_is_refused_and_one_after_buys(pool: PgPool) {
    // Arrange: a product opening in 2 s, on the database's clock.
    let prefix = testkit::unique_prefix("opening");
    let app = spawn_with(settings(&shared_redis_url(), &prefix), pool.clone()).await;
    let id = product_opening_in(&app, &pool, Duration::from_secs(2)).await;
    let keys = redis_keys(&shared_redis_url(), &prefix).await;

    // Act: buy at once, then poll until a purchase goes through.
    let early = app.purchase(id, 1, 1).await;
    let locks_after_early = app.metric("seckill_lock_acquisitions_total").await;
    let keys_after_early = redis_keys(&shared_redis_url(), &prefix).await;
    let (status, shown) = app.get_json(&format!("/api/products/{id}")).await;
    let mut refused_after = 0;
    let bought_at = loop {
        // Whether the opening had passed, by the database's clock, 20 ms before this attempt
        // was sent: such an attempt must not be refused.
        let late: bool = sqlx::query_scalar(
            "SELECT clock_timestamp() >= on_sale_at + interval '20 milliseconds' FROM products WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let response = app.purchase(id, 2, 1).await;
        if response.status() == 201 {
            break sqlx::query_scalar::<_, bool>(
                "SELECT created_at >= (SELECT on_sale_at FROM products WHERE id = $1) FROM orders WHERE product_id = $1 AND user_id = 2",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
        }
        assert_eq!(error_code(response).await, (409, "not_open".to_owned()));
        assert!(!late, "refused not_open after the opening had passed");
        refused_after += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Assert: the early purchase cost no lock and no key; the product shows its opening; the
    // first order is not earlier than the opening.
    assert_eq!(error_code(early).await, (409, "not_open".to_owned()));
    assert_eq!(status, 200);
    assert!(shown["on_sale_at"].is_string(), "{shown}");
    assert!(bought_at, "an order was written before the opening");
    assert!(
        refused_after > 10,
        "the refusals stopped too early: {refused_after}"
    );
    assert_eq!(locks_after_early, 0.0, "the early purchase took the lock");
    assert_eq!(
        keys_after_early, keys,
        "the early purchase made a Redis key"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_database_refuses_orders_before_the_opening_whatever_an_instance_thinks(pool: PgPool) {
    for strategy in [
        LockStrategy::Redis,
        LockStrategy::PgAtomic,
        LockStrategy::None,
    ] {
        // Arrange: an instance that has seen the product open; then the opening is moved
        // into the future behind its back (in the database only).
        let prefix = testkit::unique_prefix("moved");
        let mut settings = settings(&shared_redis_url(), &prefix);
        settings.lock.strategy = strategy;
        let app = spawn_with(settings, pool.clone()).await;
        let id = app.create_product("Phone", 10).await;
        assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
        sqlx::query("UPDATE products SET on_sale_at = now() + interval '1 hour' WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();

        // Act: the instance sells as if open.
        let refused = app.purchase(id, 2, 1).await;

        // Assert: the database refused it, and nothing was written.
        assert_eq!(
            error_code(refused).await,
            (409, "not_open".to_owned()),
            "{strategy:?}"
        );
        let books = books(&pool, id).await;
        assert_eq!((books.stock, books.orders), (9, 1), "{strategy:?}");
        assert!(books.balance(), "{strategy:?}");
        // The admin opens it again: sold on this instance at once.
        let opened = app
            .client
            .put(app.ops_url(&format!("/api/products/{id}/opening")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"on_sale_at": "2020-01-01T00:00:00Z"}))
            .send()
            .await
            .unwrap();
        assert_eq!(opened.status(), 200);
        assert_eq!(app.purchase(id, 2, 1).await.status(), 201, "{strategy:?}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_purchase_while_another_reads_the_opening_is_not_refused_for_it(pool: PgPool) {
    // Arrange: an open product the instance knows; the admin moves its opening (still past),
    // so the next purchase reads it again, and that read waits behind a lock on the table
    // (for as long as the test holds it: the sessions' time-outs are far longer).
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("unknown"));
    settings.database.lock_timeout = Duration::from_secs(60);
    settings.database.statement_timeout = Duration::from_secs(60);
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
    assert_eq!(move_opening(&app, id, "2020-01-01T00:00:00Z").await, 200);
    // TIMING: the instance hears its own news of the move (and forgets the opening once
    // more) within milliseconds; after it, the read below is the only one under way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = lock_the_products_table(&pool).await;
    let reading = buy_in_task(&app, id, 2);
    wait_for_sessions_waiting(&pool, 1).await;

    // Act: another buyer comes while that read waits, and is answered or waits in turn.
    let second = buy_in_task(&app, id, 3);
    // TIMING: a refusal from memory comes in milliseconds, a purchase that went on waits on
    // the table within seconds; 30 s is far beyond either on a busy machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !second.is_finished() && waiting_sessions(&pool).await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither answered nor waiting"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.rollback().await.unwrap();

    // Assert: both bought; neither was refused for an opening the instance did not know.
    for (user, response) in [(2, reading.await.unwrap()), (3, second.await.unwrap())] {
        assert_eq!(
            response.status(),
            201,
            "user {user}: {:?}",
            error_code(response).await
        );
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_read_of_the_opening_outlives_the_buyer_who_went_away(pool: PgPool) {
    // Arrange: a product opening in an hour, which the instance has read; the admin moves
    // the opening (still in the future), so the next purchase reads it again; that read
    // waits behind a lock on the table.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("gone"));
    settings.database.lock_timeout = Duration::from_secs(60);
    settings.database.statement_timeout = Duration::from_secs(60);
    let app = spawn_with(settings, pool.clone()).await;
    let id = product_opening_in(&app, &pool, Duration::from_secs(3_600)).await;
    assert_eq!(error_code(app.purchase(id, 1, 1).await).await.1, "not_open");
    assert_eq!(move_opening(&app, id, "2099-01-01T00:00:00Z").await, 200);
    // TIMING: the instance hears its own news of the move within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = lock_the_products_table(&pool).await;

    // Act: a buyer whose read waits on the table goes away; then the table is let go.
    let gone = buy_in_task(&app, id, 2);
    wait_for_sessions_waiting(&pool, 1).await;
    gone.abort();
    assert!(gone.await.is_err(), "answered while the table was held");
    // Time for the server to notice the client left and drop its handler.
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.rollback().await.unwrap();
    // TIMING: the read is answered once the table is let go; its answer is stored a moment
    // after (100 ms is far beyond it), and the next buyer comes well within a second of
    // the claim.
    wait_until_no_product_read_runs(&pool).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let locks_before = app.metric("seckill_lock_acquisitions_total").await;
    let next = app.purchase(id, 3, 1).await;

    // Assert: the read the first buyer started was finished and kept, so the next buyer,
    // well within a second of it, is refused from it, without the lock (with the read
    // dropped, the opening would stay unknown for that second, and purchases would go on
    // to the lock and the database).
    assert_eq!(error_code(next).await, (409, "not_open".to_owned()));
    assert_eq!(
        app.metric("seckill_lock_acquisitions_total").await,
        locks_before,
        "the next purchase went on to the lock: the read was dropped with its buyer"
    );
}

/// Move product `id`'s opening to `at` (RFC 3339) as the admin; the answer's status.
async fn move_opening(app: &TestApp, id: i64, at: &str) -> u16 {
    app.client
        .put(app.ops_url(&format!("/api/products/{id}/opening")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"on_sale_at": at}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A transaction holding the products table, so that every read of it waits.
async fn lock_the_products_table(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut held = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE products IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    held
}

/// A purchase of one unit by `user`, sent in a task of its own.
fn buy_in_task(app: &TestApp, id: i64, user: i64) -> tokio::task::JoinHandle<Response> {
    let request = app
        .client
        .post(app.url(&format!("/api/products/{id}/purchase")))
        .bearer_auth(buyer_token(user))
        .json(&json!({"user_id": user, "quantity": 1}));
    tokio::spawn(async move { request.send().await.unwrap() })
}

/// Sessions of this test's database waiting on a lock.
async fn waiting_sessions(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Wait (up to 30 s) until no session of this test's database runs the service's read of a
/// product (the query that reads `opens_in_us`).
async fn wait_until_no_product_read_runs(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%opens_in_us%'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if running == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the read still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait (up to 30 s) until at least `n` sessions of this test's database wait on a lock.
async fn wait_for_sessions_waiting(pool: &PgPool, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while waiting_sessions(pool).await < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session waits on the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_opening_brought_forward_on_one_instance_opens_the_others_at_once(
    pool_options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    // Arrange: two instances that have both read a product opening in an hour, and hear
    // each other's news.
    let settings = settings(&shared_redis_url(), &testkit::unique_prefix("brought"));
    let apps = spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let id = product_opening_in(a, &a.pool, Duration::from_secs(3_600)).await;
    wait_until_listening(a).await;
    wait_until_listening(b).await;
    assert_eq!(error_code(b.purchase(id, 1, 1).await).await.1, "not_open");

    // Act: the admin opens it now, on the other instance.
    let opened = a
        .client
        .put(a.ops_url(&format!("/api/products/{id}/opening")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"on_sale_at": "2020-01-01T00:00:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), 200);

    // Assert: the instance that read the opening a moment ago sells well before it would
    // read it again (a second after its read) had it not heard the news.
    let started = tokio::time::Instant::now();
    loop {
        let response = b.purchase(id, 1, 1).await;
        if response.status() == 201 {
            break;
        }
        assert_eq!(error_code(response).await.1, "not_open");
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "the other instance kept the old opening"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_over_the_limit_gets_429_with_retry_after(pool: PgPool) {
    let prefix = testkit::unique_prefix("limit");
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.limits.buyer_rate = 1;
    settings.limits.buyer_burst = 2;
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let answers = [
        app.purchase(id, 5, 1).await.status().as_u16(),
        app.purchase(id, 5, 1).await.status().as_u16(),
    ];
    let over = app.purchase(id, 5, 1).await;
    let other_buyer = app.purchase(id, 6, 1).await.status().as_u16();

    assert_eq!(answers, [201, 409], "bought, then already_purchased");
    let retry_after: u64 = over.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After: {retry_after}");
    assert_eq!(
        error_code(over).await,
        (429, "too_many_requests".to_owned())
    );
    assert_eq!(other_buyer, 201, "a buyer's limit is their own");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_address_over_the_limit_gets_429_before_its_token_is_read(pool: PgPool) {
    let prefix = testkit::unique_prefix("address");
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.limits.address_rate = 1;
    settings.limits.address_burst = 3;
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let mut statuses = Vec::new();
    for user in 1..=3 {
        statuses.push(app.purchase(id, user, 1).await.status().as_u16());
    }
    let over = buy_with(&app, id, None, json!({"user_id": 4})).await;

    assert_eq!(statuses, [201, 201, 201]);
    assert!(over.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(over).await,
        (429, "too_many_requests".to_owned())
    );
    assert_eq!(books(&pool, id).await.orders, 3);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn with_identity_off_the_body_names_the_buyer_and_readyz_says_so(pool: PgPool) {
    let prefix = testkit::unique_prefix("off");
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.identity.mode = BuyerIdentity::Off;
    settings.identity.secret = None;
    let app = spawn_with(settings, pool.clone()).await;
    let id = app.create_product("Phone", 10).await;

    let named = buy_with(&app, id, None, json!({"user_id": 9})).await;
    let unnamed = buy_with(&app, id, None, json!({})).await;
    let (_, ready) = app.ops_json("/readyz").await;
    let order = app.get_json(&format!("/api/products/{id}/orders/9")).await;

    assert_eq!(named.status(), 201);
    assert_eq!(error_code(unnamed).await, (400, "invalid_input".to_owned()));
    assert_eq!(ready["buyer_identity"], "off", "{ready}");
    assert_eq!(order.0, 200, "order reads are public with identity off");
    let on = spawn_app(pool).await;
    assert_eq!(on.ops_json("/readyz").await.1["buyer_identity"], "jwt");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_opening_outside_reason_is_refused_as_invalid_input(pool: PgPool) {
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    for at in ["-5000-01-01T00:00:00Z", "+200000-01-01T00:00:00Z"] {
        let created = app
            .client
            .post(app.ops_url("/api/products"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"name": "Phone", "stock": 1, "on_sale_at": at}))
            .send()
            .await
            .unwrap();
        let moved = app
            .client
            .put(app.ops_url(&format!("/api/products/{id}/opening")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"on_sale_at": at}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_code(created).await,
            (400, "invalid_input".to_owned()),
            "{at}"
        );
        assert_eq!(
            error_code(moved).await,
            (400, "invalid_input".to_owned()),
            "{at}"
        );
    }
}
