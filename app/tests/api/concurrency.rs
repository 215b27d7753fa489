//! Many buyers at once on several instances, with a restock in the middle: every strategy
//! but `none` must sell exactly what was supplied, with no oversell, no lost update, and at
//! most one order per buyer even when a buyer asks two instances at the same moment.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use seckill::LockStrategy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{TestApp, books, settings, shared_redis_url, spawn_instances};

const STOCK: i64 = 40;
const RESTOCK: i64 = 10;
const BUYERS: i64 = 120;

/// One purchase: (user, status, order id of a 201).
async fn buy(app: &TestApp, id: i64, user: i64) -> (i64, u16, Option<i64>) {
    let response = app.purchase(id, user, 1).await;
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    (user, status, body["order_id"].as_i64())
}

/// `BUYERS` distinct users hit three instances at once; every tenth one asks two instances
/// at the same moment; halfway, an admin restocks.
async fn flood(strategy: LockStrategy, pool_options: PgPoolOptions, connect: PgConnectOptions) {
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("flood"));
    settings.lock.strategy = strategy;
    flood_with(settings, pool_options, connect).await;
}

pub(crate) async fn flood_with(
    mut settings: seckill::Settings,
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange
    let strategy = settings.lock.strategy;
    settings.sale.work = Duration::from_millis(2); // widen the window a missing lock would show in
    let apps = spawn_instances(3, &pool_options, &connect, &settings).await;
    let id = apps[0].create_product("Phone", STOCK).await;

    // Act: the first wave of buyers; a restock once some of them have been answered; then
    // a second wave, so that buyers remain for what the restock added.
    let started = tokio::time::Instant::now();
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let purchases = (1..=BUYERS).flat_map(|user| {
        let first = &apps[user as usize % 3];
        let twice = (user % 10 == 0).then(|| &apps[(user as usize + 1) % 3]);
        std::iter::once(first)
            .chain(twice)
            .map(move |app| (app, user))
    });
    let (mut answers, restocked) = tokio::join!(
        join_all(purchases.map(|(app, user)| {
            let answered = &answered;
            async move {
                let answer = buy(app, id, user).await;
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                answer
            }
        })),
        async {
            while answered.load(std::sync::atomic::Ordering::SeqCst) < 20 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            apps[1].restock(id, RESTOCK).await.status().as_u16()
        }
    );
    let second_wave = BUYERS + 1..=BUYERS + 40;
    answers.extend(join_all(second_wave.map(|user| buy(&apps[user as usize % 3], id, user))).await);
    eprintln!(
        "{strategy:?}: {} purchases answered in {:?}",
        answers.len(),
        started.elapsed()
    );

    // Assert: only expected answers; nobody got two orders; every 201 is its buyer's order.
    assert_eq!(restocked, 200);
    let unexpected: Vec<_> = answers
        .iter()
        .filter(|(_, s, _)| !matches!(s, 201 | 409))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{strategy:?}: unexpected answers {unexpected:?}"
    );
    let mut created: HashMap<i64, i64> = HashMap::new();
    for (user, status, order) in &answers {
        if *status == 201 {
            let order = order.expect("a 201 names its order");
            assert!(
                created.insert(*user, order).is_none(),
                "{strategy:?}: user {user} got two orders"
            );
        }
    }
    for (user, order) in &created {
        assert_eq!(
            apps[2].order_of(id, *user).await,
            Some(*order),
            "{strategy:?}"
        );
    }
    let books = books(&apps[0].pool, id).await;
    assert_eq!(books.supplied, STOCK + RESTOCK, "{strategy:?}");
    assert!(
        books.balance(),
        "{strategy:?}: the books do not balance: {books:?}"
    );
    assert_eq!(
        books.orders,
        created.len() as i64,
        "{strategy:?}: {books:?}"
    );
    // Enough buyers for everything supplied, so every strategy must sell out.
    assert_eq!(
        (books.sold, books.stock),
        (STOCK + RESTOCK, 0),
        "{strategy:?} did not sell out: {books:?}"
    );
    fences_are_recorded(&apps[0].pool, id, strategy).await;
}

/// Under a lock with a fence, every order carries the fence of the hold that wrote it, in
/// the order the orders were written (the row's lock serializes the writes, and a fence below
/// the row's is refused), and the row keeps the last one; without one, no order has a fence.
async fn fences_are_recorded(pool: &sqlx::PgPool, id: i64, strategy: LockStrategy) {
    let fences: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT fence FROM orders WHERE product_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
    let fenced = matches!(
        strategy,
        LockStrategy::Redis
            | LockStrategy::Redlock
            | LockStrategy::PgLock
            | LockStrategy::ZooKeeper
            | LockStrategy::Etcd
    );
    if !fenced {
        assert!(
            fences.iter().all(Option::is_none),
            "{strategy:?}: {fences:?}"
        );
        return;
    }
    let fences: Vec<i64> = fences
        .into_iter()
        .map(|fence| fence.unwrap_or_else(|| panic!("{strategy:?}: an order without a fence")))
        .collect();
    assert!(fences.iter().all(|&f| f > 0), "{strategy:?}: {fences:?}");
    assert!(
        fences.windows(2).all(|w| w[0] <= w[1]),
        "{strategy:?}: the fences of later orders went down: {fences:?}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT fence FROM products WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(Some(&stored), fences.last(), "{strategy:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_redis_lock_sells_exactly_what_was_supplied_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::Redis, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_lock_table_sells_exactly_what_was_supplied_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgLock, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_row_lock_sells_exactly_what_was_supplied_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgRow, o, c).await;
}

/// The optimistic strategy sells exactly what was supplied across instances.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn pg_optimistic_sells_exactly_the_supply_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgOptimistic, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_atomic_update_sells_exactly_what_was_supplied_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    flood(LockStrategy::PgAtomic, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn redlock_sells_exactly_what_was_supplied_across_instances(
    o: PgPoolOptions,
    c: PgConnectOptions,
) {
    let masters: Vec<testkit::RedisServer> =
        (0..3).map(|_| testkit::RedisServer::start()).collect();
    let mut settings = settings(
        &shared_redis_url(),
        &testkit::unique_prefix("flood-redlock"),
    );
    settings.lock.strategy = LockStrategy::Redlock;
    settings.lock.redlock_urls = masters.iter().map(|m| m.url().into()).collect();
    flood_with(settings, o, c).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn without_a_lock_concurrent_buyers_lose_updates(o: PgPoolOptions, c: PgConnectOptions) {
    // The control: the same flood with LOCK_STRATEGY=none must break the books, or the
    // tests above prove nothing.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("none"));
    settings.lock.strategy = LockStrategy::None;
    settings.sale.work = Duration::from_millis(20);
    let apps = spawn_instances(3, &o, &c, &settings).await;
    let id = apps[0].create_product("Phone", STOCK).await;

    let answers = join_all((1..=BUYERS).map(|user| buy(&apps[user as usize % 3], id, user))).await;

    let books = books(&apps[0].pool, id).await;
    let created = answers.iter().filter(|(_, s, _)| *s == 201).count() as i64;
    assert_eq!(books.orders, created);
    assert!(
        !books.balance(),
        "no lost update showed: {books:?} after {created} orders"
    );
}
