//! Many buyers at once on several instances: every strategy but `none` must sell the stock
//! exactly, with no oversell, no lost update and one order per user.

use futures::future::join_all;
use seckill::LockStrategy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{Books, books, settings, shared_redis_url, spawn_instances};

const STOCK: i64 = 40;
const BUYERS: i64 = 120;

/// `BUYERS` distinct users (plus every tenth one trying twice) hit three instances at once.
async fn flood(strategy: LockStrategy, pool_options: PgPoolOptions, connect: PgConnectOptions) {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("flood"));
    settings.lock_strategy = strategy;
    flood_with(settings, pool_options, connect).await;
}

async fn flood_with(
    mut settings: seckill::Settings,
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange
    let strategy = settings.lock_strategy;
    settings.work_ms = 2; // widen the window a missing lock would show in
    let apps = spawn_instances(3, &pool_options, &connect, &settings).await;
    let id = apps[0].create_product("Phone", STOCK).await;

    // Act
    let attempts = (1..=BUYERS).chain((1..=BUYERS).step_by(10));
    let answers = join_all(attempts.enumerate().map(|(i, user)| {
        let app = &apps[i % apps.len()];
        async move { app.purchase(id, user, 1).await.status().as_u16() }
    }))
    .await;

    // Assert
    let created = answers.iter().filter(|&&s| s == 201).count() as i64;
    let unexpected: Vec<_> = answers
        .iter()
        .filter(|&&s| s != 201 && s != 409 && s != 503)
        .collect();
    assert!(
        unexpected.is_empty(),
        "{strategy:?}: unexpected answers {unexpected:?}"
    );
    let books = books(&apps[0].pool, id).await;
    assert_eq!(
        books,
        Books {
            stock: STOCK - created,
            orders: created,
            sold: created,
            users_with_two_orders: 0,
        },
        "{strategy:?}"
    );
    assert!(books.sold <= STOCK, "{strategy:?} oversold");
    if strategy != LockStrategy::PgOptimistic {
        // Only the optimistic strategy may give up (503 busy) under contention.
        assert_eq!(created, STOCK, "{strategy:?} did not sell out: {answers:?}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_redis_lock_sells_the_stock_exactly_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::Redis, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_row_lock_sells_the_stock_exactly_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgRow, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_optimistic_strategy_never_oversells_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgOptimistic, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_atomic_update_sells_the_stock_exactly_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgAtomic, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn without_a_lock_concurrent_buyers_lose_updates(o: PgPoolOptions, c: PgConnectOptions) {
    // The control: the same flood with LOCK_STRATEGY=none must break the books, or the
    // tests above prove nothing.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("none"));
    settings.lock_strategy = LockStrategy::None;
    settings.work_ms = 20;
    let apps = spawn_instances(3, &o, &c, &settings).await;
    let id = apps[0].create_product("Phone", STOCK).await;

    let answers = join_all((1..=BUYERS).map(|user| {
        let app = &apps[user as usize % apps.len()];
        async move { app.purchase(id, user, 1).await.status().as_u16() }
    }))
    .await;

    let books = books(&apps[0].pool, id).await;
    let created = answers.iter().filter(|&&s| s == 201).count() as i64;
    assert_eq!(books.orders, created);
    assert!(
        STOCK - books.stock < books.sold,
        "no lost update showed: stock {} after {} units sold",
        books.stock,
        books.sold
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn redlock_sells_the_stock_exactly_across_instances(o: PgPoolOptions, c: PgConnectOptions) {
    let masters: Vec<testkit::RedisServer> =
        (0..3).map(|_| testkit::RedisServer::start()).collect();
    let mut settings = settings(
        &shared_redis_url(),
        &testkit::unique_prefix("flood-redlock"),
    );
    settings.lock_strategy = LockStrategy::Redlock;
    settings.redlock_urls = masters.iter().map(testkit::RedisServer::url).collect();
    flood_with(settings, o, c).await;
}
