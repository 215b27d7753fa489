//! The sale desk: buyers queue while the product's lock is held elsewhere, then are sold in
//! one batch, each with their own answer.

use std::time::Duration;

use distlock::{LockGuard, LockOptions, Locker};
use redis::aio::ConnectionManager;
use reqwest::Response;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::helpers::{
    BOUNDS, TestApp, books, buyer_token, error_code, observed_session, orders_reads,
    redis_connection, settings, shared_redis_url, spawn_with,
};

/// An instance (under `redis`) and a product whose lock the test can hold from outside, so
/// that buyers queue at the instance's desk until the test lets go.
struct Desk {
    app: TestApp,
    id: i64,
    locker: Locker<ConnectionManager>,
    key: String,
}

impl Desk {
    async fn open(pool: PgPool, stock: i64, tune: impl FnOnce(&mut seckill::Settings)) -> Self {
        let prefix = testkit::unique_prefix("batch");
        let mut settings = settings(&shared_redis_url(), &prefix);
        tune(&mut settings);
        let app = spawn_with(settings, pool).await;
        let id = app.create_product("Phone", stock).await;
        let conn = redis_connection(&shared_redis_url()).await;
        Self {
            app,
            id,
            locker: Locker::new(conn, LockOptions::default()).unwrap(),
            key: format!("{prefix}lock_sale_{id}"),
        }
    }

    /// Take the product's lock from outside.
    async fn hold(&self) -> LockGuard<ConnectionManager> {
        self.locker.acquire(&self.key).await.unwrap()
    }

    /// Send a purchase in the background and wait until it is queued at the desk, so that
    /// buyers queue in the order this is called.
    async fn queue(&self, user: i64, quantity: i64) -> JoinHandle<Response> {
        let before = self.queued().await;
        let sent = self.send(user, quantity, Duration::from_secs(60));
        self.wait_for_queue(before + 1.0).await;
        sent
    }

    fn send(&self, user: i64, quantity: i64, timeout: Duration) -> JoinHandle<Response> {
        let request = self
            .app
            .client
            .post(self.app.url(&format!("/api/products/{}/purchase", self.id)))
            .bearer_auth(buyer_token(user))
            .timeout(timeout)
            .json(&json!({"user_id": user, "quantity": quantity}));
        tokio::spawn(async move { request.send().await.expect("an answer") })
    }

    async fn queued(&self) -> f64 {
        self.app.metric("seckill_queued_purchases").await
    }

    async fn wait_for_queue(&self, depth: f64) {
        let started = Instant::now();
        while self.queued().await < depth {
            assert!(started.elapsed() < Duration::from_secs(10), "never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Wait until every queued buyer has been taken into a batch.
    async fn wait_for_empty_queue(&self) {
        let started = Instant::now();
        while self.queued().await > 0.0 {
            assert!(started.elapsed() < Duration::from_secs(10), "never taken");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn answer(sent: JoinHandle<Response>) -> (u16, Value) {
    let response = sent.await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn one_batch_answers_each_buyer_on_their_own(pool: PgPool) {
    // Arrange: stock 4, of which user 7 buys one; then the lock is held from outside while
    // seven buyers queue, in this order: new ones, a user twice, the user who already
    // bought, and more demand than the 3 units left.
    let desk = Desk::open(pool.clone(), 4, |_| {}).await;
    assert_eq!(desk.app.purchase(desk.id, 7, 1).await.status(), 201);
    let held = desk.hold().await;
    let mut queued = Vec::new();
    for (user, quantity) in [(1, 1), (2, 1), (2, 1), (7, 1), (3, 2), (4, 1), (5, 1)] {
        queued.push((user, desk.queue(user, quantity).await));
    }

    // Act: the desk's leader gets the lock and sells everything waiting in one batch.
    assert!(held.release().await.unwrap().was_held());
    let mut answers = Vec::new();
    for (user, sent) in queued {
        answers.push((user, answer(sent).await));
    }

    // Assert: each answer is right and each 201 carries that buyer's own order.
    let codes: Vec<(i64, u16, String)> = answers
        .iter()
        .map(|(user, (status, body))| {
            let code = body["error"].as_str().unwrap_or("").to_owned();
            (*user, *status, code)
        })
        .collect();
    let expect = |user: i64, status: u16, code: &str| (user, status, code.to_owned());
    assert_eq!(
        codes,
        vec![
            expect(1, 201, ""),
            expect(2, 201, ""),
            expect(2, 409, "already_purchased"),
            expect(7, 409, "already_purchased"),
            expect(3, 409, "sold_out"),
            expect(4, 201, ""),
            expect(5, 409, "sold_out"),
        ]
    );
    for (user, (status, body)) in &answers {
        if *status == 201 {
            assert_eq!(body["user_id"], *user);
            let own = desk.app.order_of(desk.id, *user).await;
            assert_eq!(own, body["order_id"].as_i64(), "user {user}");
        }
    }
    assert_eq!(desk.app.order_of(desk.id, 3).await, None);
    assert_eq!(desk.app.order_of(desk.id, 5).await, None);
    // Two batches in all: user 7's purchase, then the seven queued buyers together.
    assert_eq!(desk.app.metric("seckill_batch_size_count").await, 2.0);
    assert_eq!(desk.app.metric("seckill_batch_size_sum").await, 8.0);
    let books = books(&pool, desk.id).await;
    assert_eq!((books.stock, books.orders, books.sold), (0, 4, 4));
    assert!(books.balance(), "{books:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_who_left_before_the_batch_was_taken_is_skipped(pool: PgPool) {
    // Arrange: the lock is held; buyer 9 gives up after 3 s; buyer 10 waits.
    // TIMING: buyer 9's 3 s must cover sending the request and its queueing at the desk on
    // a busy machine; the lock is held from outside until buyer 9 has given up.
    let desk = Desk::open(pool.clone(), 5, |_| {}).await;
    assert_eq!(desk.app.purchase(desk.id, 1, 1).await.status(), 201); // the desk is open
    let held = desk.hold().await;
    let impatient = desk.send(9, 1, Duration::from_millis(3_000));
    desk.wait_for_queue(1.0).await;
    assert!(
        impatient.await.is_err(),
        "the impatient buyer got an answer"
    );
    let patient = desk.queue(10, 1).await;

    // Act
    assert!(held.release().await.unwrap().was_held());

    // Assert: buyer 10 bought; buyer 9's purchase was never made.
    assert_eq!(answer(patient).await.0, 201);
    assert_eq!(desk.app.order_of(desk.id, 9).await, None);
    assert_eq!(desk.app.metric("seckill_buyers_gone_total").await, 1.0);
    let books = books(&pool, desk.id).await;
    assert_eq!((books.stock, books.orders), (3, 2));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn beyond_a_full_queue_buyers_are_told_busy_at_once(pool: PgPool) {
    // Arrange: a queue of two, and the lock held, with buyers allowed to wait 30 s.
    let desk = Desk::open(pool.clone(), 10, |s| s.sale.queue_max = 2).await;
    let held = desk.hold().await;
    let first = desk.queue(1, 1).await;
    let second = desk.queue(2, 1).await;

    // Act: three more arrive.
    let started = Instant::now();
    let mut refused = Vec::new();
    for user in 3..=5 {
        refused.push(desk.app.purchase(desk.id, user, 1).await);
    }
    let took = started.elapsed();

    // Assert: refused fast with 503 busy and Retry-After; the queued two still buy.
    for response in refused {
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(error_code(response).await, (503, "busy".to_owned()));
    }
    assert!(took < Duration::from_secs(5), "the refusals took {took:?}");
    assert_eq!(desk.app.metric("seckill_queue_full_total").await, 3.0);
    assert!(held.release().await.unwrap().was_held());
    assert_eq!(answer(first).await.0, 201);
    assert_eq!(answer(second).await.0, 201);
    assert_eq!(books(&pool, desk.id).await.orders, 2);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn batch_max_one_sells_one_purchase_per_transaction_and_per_hold(pool: PgPool) {
    let desk = Desk::open(pool.clone(), 10, |s| s.sale.batch_max = 1).await;
    let held = desk.hold().await;
    let mut queued = Vec::new();
    for user in 1..=4 {
        queued.push(desk.queue(user, 1).await);
    }

    assert!(held.release().await.unwrap().was_held());
    for sent in queued {
        assert_eq!(answer(sent).await.0, 201);
    }

    assert_eq!(desk.app.metric("seckill_batch_size_count").await, 4.0);
    assert_eq!(desk.app.metric("seckill_batch_size_sum").await, 4.0);
    assert_eq!(
        desk.app.metric("seckill_lock_acquisitions_total").await,
        4.0
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_hold_lasts_while_buyers_come_alone(pool: PgPool) {
    // Arrange: every batch spends 1.5 s of work under the lock; a hold may last 5 s (below
    // half of the test settings' 30 s LOCK_WAIT_MS).
    // TIMING: buyer 2 must reach the desk while buyer 1's batch is worked on, or the hold
    // ends with the queue empty and buyer 2 needs a hold of its own (as it would if holds
    // did not last); 1.5 s is room for a busy machine, and two batches fit in the 5 s.
    let desk = Desk::open(pool.clone(), 10, |s| {
        s.sale.work = Duration::from_millis(1_500);
        s.sale.hold = Some(Duration::from_millis(5_000));
    })
    .await;
    let acquisitions = || desk.app.metric("seckill_lock_acquisitions_total");

    // Act: buyer 2 comes while buyer 1's batch is being worked on.
    let first = desk.send(1, 1, Duration::from_secs(60));
    // The leader takes the batch right after the lock, before its work.
    let started = Instant::now();
    while acquisitions().await < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = desk.send(2, 1, Duration::from_secs(60));
    assert_eq!(answer(first).await.0, 201);
    assert_eq!(answer(second).await.0, 201);

    // Assert: one hold sold both batches.
    assert_eq!(desk.app.metric("seckill_batch_size_count").await, 2.0);
    assert_eq!(acquisitions().await, 1.0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_hold_sells_one_batch_while_others_want_the_lock(pool: PgPool) {
    // Arrange: every batch spends 100 ms of work under the lock; a hold may last 5 s.
    // TIMING: the leader remembers for 1 s (`CONTENTION_MEMORY`) that it found the lock
    // held; buyer 3's batch (its 100 ms of work and its transaction) must end within that
    // second, or the leader would rightly go on holding. The short work leaves most of the
    // second to a busy machine. It also leaves buyer 4 only those 100 ms to reach the desk
    // during buyer 3's batch: a buyer 4 that comes later needs a hold of its own however
    // holds are cut, so on a slow run this test passes without having shown the rule.
    let desk = Desk::open(pool.clone(), 10, |s| {
        s.sale.work = Duration::from_millis(100);
        s.sale.hold = Some(Duration::from_millis(5_000));
    })
    .await;
    let acquisitions = || desk.app.metric("seckill_lock_acquisitions_total");

    // Act: the lock is held from outside while buyer 3 queues, long enough for the leader
    // to find it held; then buyer 4 comes while buyer 3's batch is worked on.
    let held = desk.hold().await;
    let third = desk.queue(3, 1).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(held.release().await.unwrap().was_held());
    desk.wait_for_empty_queue().await;
    let fourth = desk.send(4, 1, Duration::from_secs(60));
    assert_eq!(answer(third).await.0, 201);
    assert_eq!(answer(fourth).await.0, 201);

    // Assert: two batches, each in a hold of its own (the budget had not run out).
    assert_eq!(desk.app.metric("seckill_batch_size_count").await, 2.0);
    assert_eq!(acquisitions().await, 2.0);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_buyer_can_look_up_their_order(pool: PgPool) {
    let desk = Desk::open(pool, 10, |_| {}).await;
    let response = desk.app.purchase(desk.id, 42, 2).await;
    let order: Value = response.json().await.unwrap();

    let (status, found) = desk
        .app
        .get_json_as(
            &format!("/api/products/{}/orders/42", desk.id),
            &buyer_token(42),
        )
        .await;
    let (missing, _) = desk
        .app
        .get_json_as(
            &format!("/api/products/{}/orders/43", desk.id),
            &buyer_token(43),
        )
        .await;
    let (bad, _) = desk
        .app
        .get_json_as(
            &format!("/api/products/{}/orders/zero", desk.id),
            &buyer_token(1),
        )
        .await;

    assert_eq!(status, 200);
    assert_eq!(found["order_id"], order["order_id"]);
    assert_eq!(found["quantity"], 2);
    assert_eq!((missing, bad), (404, 400));
}

/// Read a batch's snapshot the way a batch does: in a transaction of the service's.
async fn read_batch(pool: &PgPool, product: seckill::domain::ProductId) -> Vec<i64> {
    let mut tx = seckill::repository::begin(pool, BOUNDS).await.unwrap();
    let snapshot = seckill::repository::batch_snapshot(&mut tx, product, &[1, 2, 3], false)
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    snapshot.bought
}

/// The batch read uses the orders index however small the table was when first planned.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn batch_read_uses_the_orders_index_whatever_its_first_plan_saw(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: one session reads batches while `orders` holds a page of rows, and
    // PostgreSQL has just analyzed it (as autovacuum does early in a fresh deployment's
    // first sale: a plan cached then scans the whole table until the next analyze)...
    // (Only the test's own ANALYZE.)
    let (observer, session) = observed_session(pool_options, connect).await;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 10) RETURNING id")
            .fetch_one(&observer)
            .await
            .unwrap();
    let fill = |from: i64, to: i64| {
        sqlx::query(
            "INSERT INTO orders (product_id, user_id, quantity) SELECT $1, g, 1 FROM generate_series($2::BIGINT, $3::BIGINT) g",
        )
        .bind(id)
        .bind(from)
        .bind(to)
    };
    fill(100_001, 100_100).execute(&observer).await.unwrap();
    sqlx::query("ANALYZE orders")
        .execute(&observer)
        .await
        .unwrap();
    let product = seckill::domain::ProductId::parse(&id.to_string()).unwrap();
    for _ in 0..10 {
        read_batch(&session, product).await;
    }
    // ... then the table grows.
    fill(1, 20_000).execute(&observer).await.unwrap();
    let before = orders_reads(&session, &observer).await;

    // Act
    for _ in 0..5 {
        assert_eq!(read_batch(&session, product).await.len(), 3);
    }

    // Assert: found through the index, not by scanning the table.
    let after = orders_reads(&session, &observer).await;
    assert_eq!(after.seq_scans, before.seq_scans, "orders scanned");
    // (And the statistics read are the latest: the five reads used the index.)
    assert!(
        after.index_scans >= before.index_scans + 5,
        "statistics not flushed: {before:?} {after:?}"
    );
}

/// An optimistic batch that read before a restock writes nothing and the restock stays.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn optimistic_batch_read_before_a_restock_leaves_the_restock_intact(pool: PgPool) {
    // Arrange: a pg-optimistic batch has read the row (stock 10)...
    use seckill::repository::{self, Restocked, StockWrite};
    let id: i64 =
        sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 10) RETURNING id")
            .fetch_one(&pool)
            .await
            .unwrap();
    let product = seckill::domain::ProductId::parse(&id.to_string()).unwrap();
    let mut batch = repository::begin(&pool, BOUNDS).await.unwrap();
    let read = repository::batch_snapshot(&mut batch, product, &[7], false)
        .await
        .unwrap()
        .unwrap();
    // ... and an admin restocks 5 before the batch writes.
    let add = seckill::domain::Stock::parse(5).unwrap();
    let restocked = repository::add_stock(&pool, BOUNDS, product, add, "test", None)
        .await
        .unwrap();
    assert!(matches!(restocked, Restocked::Done { .. }));

    // Act: the batch writes what it read, minus one sold.
    let write = StockWrite::IfVersion {
        read: read.stock,
        version: read.version,
    };
    let sold = repository::sell_orders(&mut batch, product, &[7], &[1], write)
        .await
        .unwrap();
    batch.rollback().await.unwrap();

    // Assert: the compare-and-set saw the restock; nothing was sold over it.
    assert_eq!(sold, None, "the batch overwrote a restock it never saw");
    let (stock, orders): (i64, i64) = sqlx::query_as(
        "SELECT stock, (SELECT COUNT(*) FROM orders WHERE product_id = $1) FROM products WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((stock, orders), (15, 0));
}

/// How many sequential scans of `orders` PostgreSQL has counted, with the counts of
/// `session` (the one connection that ran the statements looked at) flushed first.
async fn orders_seq_scans(session: &PgPool) -> i64 {
    let mut conn = session.acquire().await.unwrap();
    // Flushed when the session next goes idle: after this statement.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'orders'")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// A holder's statement keeps to the indexes though its plan was made while orders was small.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn holders_statement_keeps_to_indexes_though_planned_on_a_small_table(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: a session as the lock holders' pool makes them (one generic plan per
    // statement, kept for the session's life), and `orders` small and just analyzed, as
    // early in a fresh deployment's first sale: the statistics say a scan of the whole
    // table is cheaper than the index.
    let pool = pool_options.connect_with(connect).await.unwrap();
    sqlx::query("INSERT INTO products (name, stock) VALUES ('Phone', 1000000)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO orders (product_id, user_id, quantity) SELECT 1, g, 1 FROM generate_series(1, 20) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE orders").execute(&pool).await.unwrap();
    let session = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(seckill::startup::holder_sessions(&pool))
        .await
        .unwrap();
    let product = seckill::domain::ProductId::parse("1").unwrap();
    let before = orders_seq_scans(&session).await;

    // Act: two batches of 32 buyers (the plan is made at the first), as a holder sells them.
    for batch in 0..2i64 {
        let users: Vec<i64> = (0..32).map(|u| 1_000 + batch * 100 + u).collect();
        let quantities = vec![1; users.len()];
        let written = seckill::repository::sell_as_holder(
            &mut session.acquire().await.unwrap(),
            product,
            seckill::repository::HolderBatch {
                users: &users,
                quantities: &quantities,
                fence: 1,
                exact: None,
                refused: &[],
            },
        )
        .await
        .unwrap();
        assert!(
            matches!(written, seckill::repository::HolderWrite::Committed { ref orders, .. } if orders.len() == 32),
            "{written:?}"
        );
    }

    // Assert: every buyer was looked for with the unique index, never by reading the table
    // (which, planned once while it was small, it would go on doing as it grows).
    let after = orders_seq_scans(&session).await;
    assert_eq!(
        after - before,
        0,
        "the holder's statement scanned the whole orders table"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_lock_holders_batch_is_sold_on_the_holders_sessions(pool: PgPool) {
    // Arrange: an instance under `redis`, and a product.
    let desk = Desk::open(pool.clone(), 10, |_| {}).await;

    // Act: one purchase, sold by the product's leader under the lock.
    let sent = desk.send(1, 1, Duration::from_secs(30));
    assert_eq!(answer(sent).await.0, 201);

    // Assert: the batch's statement ran on a session of the lock holders' pool (the one
    // whose plans are generic and kept on the indexes), not on the main pool.
    let last: Vec<String> = sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1",
    )
    .bind(seckill::startup::HOLDERS_APPLICATION_NAME)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        last.iter().any(|query| query.contains("WITH fresh AS")),
        "the holders' sessions last ran {last:?}"
    );
}
