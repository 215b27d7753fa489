//! What a buyer is told when the outcome is not a plain yes or no: a commit whose answer was
//! lost, and a second purchase by a buyer who has an order.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::helpers::{hold_row, spawn_app};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_who_bought_already_is_told_their_order(pool: PgPool) {
    // Arrange
    let app = spawn_app(pool).await;
    let id = app.create_product("Phone", 10).await;
    let first = app.purchase(id, 42, 1).await;
    assert_eq!(first.status(), 201);
    let order_id = first.json::<Value>().await.unwrap()["order_id"].clone();

    // Act
    let again = app.purchase(id, 42, 1).await;

    // Assert
    assert_eq!(again.status(), 409);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["error"], "already_purchased", "{body}");
    assert_eq!(body["order_id"], order_id, "{body}");
}

/// A write whose connection was cut is answered outcome unknown with the order lookup.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn cut_write_is_answered_outcome_unknown_with_the_order_lookup(pool: PgPool) {
    // Arrange: the test holds the product's row, so the instance's write (one statement, the
    // lock holder's) waits for it; then PostgreSQL ends that session, as a failover or an
    // operator would. The client cannot tell whether such a write committed.
    let app = spawn_app(pool.clone()).await;
    let id = app.create_product("Phone", 10).await;
    let row = hold_row(&pool, id).await;
    let buying = {
        let request = app
            .client
            .post(app.url(&format!("/api/products/{id}/purchase")))
            .bearer_auth(crate::helpers::buyer_token(42))
            .json(&serde_json::json!({"user_id": 42}));
        tokio::spawn(async move { request.send().await.expect("an answer") })
    };
    let waiting = "SELECT pid FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let started = Instant::now();
    let writer: i32 = loop {
        if let Some(pid) = sqlx::query_scalar(waiting)
            .fetch_optional(&pool)
            .await
            .unwrap()
        {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the write never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // Act
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(writer)
        .execute(&pool)
        .await
        .unwrap();
    row.commit().await.unwrap();
    let answer = buying.await.unwrap();

    // Assert: not "unavailable" (which says nothing was recorded) but "unknown", with where
    // to look; the look-up answers, and a retry after it buys.
    assert_eq!(answer.status(), 503);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"], "outcome_unknown", "{body}");
    let path = format!("/api/products/{id}/orders/42");
    assert_eq!(body["order_path"], path.as_str(), "{body}");
    assert_eq!(
        app.get_json_as(&path, &crate::helpers::buyer_token(42))
            .await
            .0,
        404
    );
    assert_eq!(app.purchase(id, 42, 1).await.status(), 201);
}

/// A commit PostgreSQL carried out whose answer was lost is answered as what it was: the
/// service looks the order up, durably, and answers 201 with it. The test's PostgreSQL waits
/// for a synchronous standby that does not exist (`synchronous_standby_names`), as a primary
/// does for a slow standby: the write commits locally and waits; its session is then ended,
/// as a failover ends it, so its answer is lost. While no standby confirms, the look-up waits
/// too (an order only this server has is not answered 201); once the setting is cleared (a
/// standby confirms), it finds the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_is_answered_with_its_order_once_it_is_durable() {
    // Arrange: a private PostgreSQL (the setting is the server's), an instance on it.
    let server = tokio::task::spawn_blocking(|| {
        testkit::PostgresServer::start(&[], testkit::Tie::Child).unwrap()
    })
    .await
    .unwrap();
    let pool = PgPool::connect(&server.url()).await.unwrap();
    let prefix = testkit::unique_prefix("lost-answer");
    let app = crate::helpers::spawn_with(
        crate::helpers::settings(&crate::helpers::shared_redis_url(), &prefix),
        pool.clone(),
    )
    .await;
    let id = app.create_product("Phone", 10).await;
    let standby = |names: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
            ))
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    standby("a_standby_that_never_comes").await;
    let buying = {
        let request = app
            .client
            .post(app.url(&format!("/api/products/{id}/purchase")))
            .bearer_auth(crate::helpers::buyer_token(42))
            .json(&serde_json::json!({"user_id": 42}));
        tokio::spawn(async move { request.send().await.expect("an answer") })
    };

    // Act: end the session whose commit waits for the standby; then, once the look-up waits
    // for the standby too, let commits through.
    let writer = wait_for_sessions_waiting_for_a_standby(&pool, None).await;
    // Waits (5 s at most) until the session is gone.
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(writer)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(ended, "the writer's session ended");
    wait_for_sessions_waiting_for_a_standby(&pool, Some(writer)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !buying.is_finished(),
        "answered before the order was durable"
    );
    standby("").await;
    let answer = buying.await.unwrap();

    // Assert: 201 with the order the lost commit stored.
    let status = answer.status();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    let stored: i64 =
        sqlx::query_scalar("SELECT id FROM orders WHERE product_id = $1 AND user_id = 42")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(body["order_id"], stored, "{body}");
    let metrics = app
        .client
        .get(app.ops_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"seckill_lost_answers_total{answer="created"} 1"#),
        "{metrics}"
    );
    drop(server);
}

/// The pid of a session whose commit waits for a synchronous standby, other than `not`,
/// once there is one (within 20 s).
async fn wait_for_sessions_waiting_for_a_standby(pool: &PgPool, not: Option<i32>) -> i32 {
    let started = Instant::now();
    loop {
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
                .fetch_all(pool)
                .await
                .unwrap();
        if let Some(pid) = pids.into_iter().find(|pid| Some(*pid) != not) {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no session waited for the standby"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
