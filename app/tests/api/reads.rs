//! Public reads cannot starve the sale: a flood of product reads and of purchases of unknown
//! ids, during a sale, on an instance with a small pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};

use crate::helpers::{settings, shared_redis_url, spawn_with};

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_flood_of_reads_and_unknown_ids_does_not_make_the_sale_busy(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: a sale's pool of 2 connections that gives up after 100 ms; a product whose
    // books take a scan of 500,000 orders to add up.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("reads"));
    // A strategy whose batches run on the main pool (a lock holder's have a pool of their
    // own): the reads must not take the sale's connections from it.
    settings.lock.strategy = seckill::LockStrategy::PgAtomic;
    settings.database.max_connections = 2;
    settings.database.acquire_timeout = Duration::from_millis(100);
    // The instance's pool is the one handed in: made as these settings say.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(100))
        .connect_with(connect.clone())
        .await
        .unwrap();
    let app = Arc::new(spawn_with(settings, pool).await);
    let id = app.create_product("Phone", 1_000).await;
    // On a connection of the test's own: the instance's sessions have its statement
    // timeout, which half a million rows can outlast on a busy machine.
    let mut own = PgConnection::connect_with(&connect).await.unwrap();
    sqlx::query(
        "INSERT INTO orders (product_id, user_id, quantity) \
         SELECT $1, 1000000 + u, 1 FROM generate_series(1, 500000) AS u",
    )
    .bind(id)
    .execute(&mut own)
    .await
    .unwrap();
    own.close().await.unwrap();
    let flooding = Arc::new(AtomicBool::new(true));
    let reads = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for reader in 0..64_u64 {
        let (app, flooding, reads) = (Arc::clone(&app), Arc::clone(&flooding), Arc::clone(&reads));
        flood.push(tokio::spawn(async move {
            let mut unknown = 1_000_000_000 + reader * 1_000_000;
            while flooding.load(Ordering::Relaxed) {
                let (status, _) = app.get_json(&format!("/api/products/{id}")).await;
                assert!(status == 200 || status == 503, "read answered {status}");
                unknown += 1;
                let bought = app.purchase(unknown as i64, 1, 1).await.status().as_u16();
                assert!(
                    bought == 404 || bought == 503,
                    "unknown id answered {bought}"
                );
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Act: 200 buyers, 10 at a time, while the flood goes on.
    let mut buyers = Vec::new();
    for lane in 0..10_i64 {
        let app = Arc::clone(&app);
        buyers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for n in 0..20 {
                let user = lane * 100 + n + 1;
                statuses.push(app.purchase(id, user, 1).await.status().as_u16());
            }
            statuses
        }));
    }
    let mut answers = Vec::new();
    for buyer in buyers {
        answers.extend(buyer.await.unwrap());
    }
    flooding.store(false, Ordering::Relaxed);
    for reader in flood {
        reader.await.unwrap();
    }

    // Assert: every buyer bought; none was told busy; the flood did run.
    let busy = answers.iter().filter(|&&s| s == 503).count();
    assert_eq!(
        busy, 0,
        "{busy} of 200 buyers were told 503 during the read flood"
    );
    assert!(answers.iter().all(|&s| s == 201), "{answers:?}");
    assert!(reads.load(Ordering::Relaxed) > 64, "the flood hardly ran");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_read_flood_does_not_turn_a_new_products_first_buyers_away(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: two instances; the second has never seen product P. Its public reads hang:
    // a session holds the stock ledger that a product's books add up, so every books read
    // waits on it with a read connection (and the rest wait 1 s for one, then give up).
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("first-buyers"));
    settings.database.acquire_timeout = Duration::from_millis(1_000);
    let apps = crate::helpers::spawn_instances(2, &pool_options, &connect, &settings).await;
    let (a, b) = (&apps[0], &apps[1]);
    let mut flooded = Vec::new();
    for n in 0..5 {
        flooded.push(a.create_product(&format!("Read {n}"), 1).await);
    }
    let p = a.create_product("New", 100).await;
    let mut ledger = PgConnection::connect_with(&connect).await.unwrap();
    let mut held = ledger.begin().await.unwrap();
    sqlx::query("LOCK TABLE stock_changes IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    for reader in 0..20 {
        let (client, url) = (
            b.client.clone(),
            b.url(&format!("/api/products/{}", flooded[reader % 5])),
        );
        let stop = Arc::clone(&stop);
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = client.get(&url).send().await;
            }
        }));
    }
    // TIMING: the flood takes both read connections well within this.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Act: P's first buyers on the second instance, while the flood lasts.
    let mut answers = Vec::new();
    for user in 1..=5 {
        answers.push(b.purchase(p, user, 1).await.status().as_u16());
    }
    stop.store(true, Ordering::Relaxed);
    held.rollback().await.unwrap();
    for reader in flood {
        reader.await.unwrap();
    }

    // Assert: every first buyer was sold to.
    assert_eq!(answers, vec![201; 5]);
}
