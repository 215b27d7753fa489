//! Fault injection: instances (child processes of the `loadtest` binary) are killed, paused
//! past their lease, cut off from Redis or from PostgreSQL mid-sale; every test then checks
//! the books in PostgreSQL as the load test does. Every process is stopped by its own pid.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::future::join_all;
use loadtest::books::{self, Books};
use loadtest::instances::{Instance, InstanceConfig};
use seckill::LockStrategy;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::{LOADTEST, database_url, shared_redis_url};
use testkit::RedisServer;
use tokio::time::Instant;

const ADMIN_TOKEN: &str = "faults-admin-token";

struct Setup<'a> {
    database_url: &'a str,
    redis_url: &'a str,
    prefix: &'a str,
    strategy: LockStrategy,
    work_ms: u64,
    lock_ttl_ms: u64,
}

async fn start(setup: &Setup<'_>, n: usize) -> Vec<Instance> {
    let config = InstanceConfig {
        database_url: setup.database_url,
        redis_url: setup.redis_url,
        redis_key_prefix: setup.prefix,
        admin_token: ADMIN_TOKEN,
        strategy: setup.strategy,
        work_ms: setup.work_ms,
        lock_wait_ms: 30_000,
        lock_ttl_ms: setup.lock_ttl_ms,
        redlock_urls: "",
    };
    let mut instances = Vec::new();
    for i in 0..n {
        instances.push(
            Instance::start(Path::new(LOADTEST), &config, &format!("fault-{i}"))
                .await
                .unwrap(),
        );
    }
    instances
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn create_product(host: &str, stock: i64) -> i64 {
    loadtest::attack::create_product(host, ADMIN_TOKEN, stock)
        .await
        .unwrap()
}

/// One purchase: (status, error code), or (0, reason) when no answer came.
async fn buy(client: &reqwest::Client, host: &str, product: i64, user: i64) -> (u16, String) {
    match client
        .post(format!("{host}/api/products/{product}/purchase"))
        .json(&json!({"user_id": user}))
        .send()
        .await
    {
        Ok(response) => {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (
                status,
                body["error"].as_str().unwrap_or_default().to_owned(),
            )
        }
        Err(error) => (0, error.to_string()),
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The load test's checks: no oversell, no lost update, one order per user, and every
/// 201 answer has its order.
fn assert_books_balance(books: Books, initial: i64, created_answers: i64) {
    assert!(
        books.stock >= 0 && books.sold <= initial,
        "oversold: {books:?}"
    );
    assert_eq!(initial - books.stock, books.sold, "lost update: {books:?}");
    assert_eq!(books.users_with_several_orders, 0, "{books:?}");
    assert!(
        books.orders >= created_answers,
        "a 201 without its order: {books:?}, {created_answers} answers"
    );
}

async fn lock_exists(redis_url: &str, key: &str) -> bool {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut conn)
        .await
        .unwrap()
        == 1
}

/// Instances (lease 1 s), a product of 10, and a first purchase on instance 0 that has
/// taken the lock and is inside its `work_ms` of work when this returns.
struct LockHeld {
    instances: Vec<Instance>,
    product: i64,
    client: reqwest::Client,
    /// The first purchase's answer, once it comes.
    first: tokio::task::JoinHandle<(u16, String)>,
    url: String,
    _cleanup: testkit::PrefixCleanup,
}

async fn hold_the_lock_on_instance_0(
    connect: &PgConnectOptions,
    label: &str,
    n: usize,
    work_ms: u64,
) -> LockHeld {
    let url = database_url(connect);
    let redis = shared_redis_url();
    let prefix = testkit::unique_prefix(label);
    let cleanup = testkit::PrefixCleanup::new(&redis, &prefix);
    let setup = Setup {
        database_url: &url,
        redis_url: &redis,
        prefix: &prefix,
        strategy: LockStrategy::Redis,
        work_ms,
        lock_ttl_ms: 1_000,
    };
    let instances = start(&setup, n).await;
    let product = create_product(&instances[1].url, 10).await;
    let client = client();
    let first = {
        let (client, host) = (client.clone(), instances[0].url.clone());
        tokio::spawn(async move { buy(&client, &host, product, 1).await })
    };
    let lock_key = format!("{prefix}lock_sale_{product}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lock_exists(&redis, &lock_key).await {
        assert!(
            Instant::now() < deadline,
            "the first buyer never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    LockHeld {
        instances,
        product,
        client,
        first,
        url,
        _cleanup: cleanup,
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_instance_killed_while_holding_the_lock_holds_up_the_others_at_most_one_ttl(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: three instances; a purchase on instance 0 holds the lock for 1.5 s of work.
    let mut sale = hold_the_lock_on_instance_0(&connect, "sigkill", 3, 1_500).await;
    let (client, product) = (sale.client.clone(), sale.product);

    // Act: kill it while it holds the lock; another instance sells.
    sale.instances[0].kill();
    let killed_at = Instant::now();
    let (status, code) = buy(&client, &sale.instances[1].url, product, 2).await;
    let waited = killed_at.elapsed();

    // Assert: the next buyer got through once the lease (1 s) ran out, and the books balance.
    assert_eq!((status, code.as_str()), (201, ""), "the next buyer failed");
    // At most one lease plus the buyer's own 1.5 s of work, with room for a busy machine.
    let bound = Duration::from_millis(1_000 + 1_500) + Duration::from_secs(5);
    assert!(waited < bound, "waited {waited:?}");
    let (victim_status, _) = sale.first.await.unwrap();
    assert_eq!(victim_status, 0, "the killed instance cannot have answered");
    let (status, _) = buy(&client, &sale.instances[2].url, product, 3).await;
    assert_eq!(status, 201);
    assert_books_balance(books::read(&sale.url, product).await.unwrap(), 10, 2);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_instance_paused_past_its_lease_is_fenced_off_when_it_resumes(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: a purchase on instance 0 is inside its critical section (1 s of work).
    let sale = hold_the_lock_on_instance_0(&connect, "sigstop", 2, 1_000).await;
    let (client, product, pid) = (sale.client.clone(), sale.product, sale.instances[0].pid());

    // Act: SIGSTOP it (its watchdog freezes too) for well over the 1 s lease; another
    // instance takes the lock and sells meanwhile; then SIGCONT.
    signal(pid, "-STOP");
    let (status, _) = buy(&client, &sale.instances[1].url, product, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(pid, "-CONT");
    let (paused_status, paused_code) = sale.first.await.unwrap();

    // Assert: the other sale went through; the resumed holder's write was refused.
    assert_eq!(status, 201);
    assert_eq!((paused_status, paused_code.as_str()), (503, "lock_lost"));
    let books = books::read(&sale.url, product).await.unwrap();
    assert_eq!((books.orders, books.stock), (1, 9), "{books:?}");
    assert_books_balance(books, 10, 1);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn redis_killed_mid_sale_and_restarted_empty_gives_503s_then_sales_resume(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: instances on a private Redis, buyers arriving steadily.
    let url = database_url(&connect);
    let mut redis = RedisServer::start();
    let redis_url = redis.url();
    let setup = Setup {
        database_url: &url,
        redis_url: &redis_url,
        prefix: "",
        strategy: LockStrategy::Redis,
        work_ms: 0,
        lock_ttl_ms: 2_000,
    };
    let instances = start(&setup, 2).await;
    let product = create_product(&instances[0].url, 1_000).await;
    let client = client();
    let mut answers = Vec::new();
    let mut user = 0;
    let mut round = |phase: &'static str| {
        user += 1;
        let (client, host, user) = (
            client.clone(),
            instances[user as usize % 2].url.clone(),
            user,
        );
        async move { (phase, buy(&client, &host, product, user).await) }
    };
    for _ in 0..20 {
        answers.push(round("before").await);
    }

    // Act: kill Redis, keep buying, restart it empty, keep buying.
    redis.kill();
    for _ in 0..10 {
        answers.push(round("outage").await);
    }
    redis.restart_empty();
    let resumed_by = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = round("after").await;
        let sold = answer.1.0 == 201;
        answers.push(answer);
        if sold
            && answers
                .iter()
                .filter(|(p, (s, _))| *p == "after" && *s == 201)
                .count()
                >= 10
        {
            break;
        }
        assert!(
            Instant::now() < resumed_by,
            "sales did not resume: {:?}",
            &answers[answers.len().saturating_sub(5)..]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Assert
    let count = |phase: &str, status: u16| {
        answers
            .iter()
            .filter(|(p, (s, _))| *p == phase && *s == status)
            .count()
    };
    assert_eq!(count("before", 201), 20);
    assert_eq!(count("outage", 503), 10, "{answers:?}");
    assert!(
        answers.iter().all(|(_, (s, _))| matches!(s, 201 | 503)),
        "{answers:?}"
    );
    let created = answers.iter().filter(|(_, (s, _))| *s == 201).count() as i64;
    let books = books::read(&url, product).await.unwrap();
    assert_eq!(books.orders, created, "{books:?}");
    assert_books_balance(books, 1_000, created);
}

async fn terminate_backends_during_a_flood(strategy: LockStrategy, connect: PgConnectOptions) {
    // Arrange
    let url = database_url(&connect);
    let redis = shared_redis_url();
    let prefix = testkit::unique_prefix("pg-terminate");
    let _cleanup = testkit::PrefixCleanup::new(&redis, &prefix);
    let setup = Setup {
        database_url: &url,
        redis_url: &redis,
        prefix: &prefix,
        strategy,
        work_ms: 5,
        lock_ttl_ms: 5_000,
    };
    let instances = start(&setup, 2).await;
    const STOCK: i64 = 150;
    let product = create_product(&instances[0].url, STOCK).await;
    let database = connect.get_database().unwrap().to_owned();

    // Act: buyers flood both instances while a killer terminates the instances' database
    // connections every 25 ms, mid-transaction or not.
    let killer = {
        let connect = connect.clone();
        tokio::spawn(async move {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(connect)
                .await
                .unwrap();
            let mut terminated = 0i64;
            for _ in 0..60 {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                )
                .bind(&database)
                .fetch_one(&pool)
                .await
                .unwrap();
                terminated += n;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            terminated
        })
    };
    let client = client();
    let answers = join_all((1..=300).map(|user| {
        let (client, host) = (client.clone(), instances[user as usize % 2].url.clone());
        async move { buy(&client, &host, product, user).await }
    }))
    .await;
    let terminated = killer.await.unwrap();

    // Assert: connections were really cut, some purchases failed for it, and still never an
    // order without its decrement nor a decrement without its order.
    assert!(terminated > 0, "no backend was terminated");
    assert!(
        answers.iter().all(|(s, _)| matches!(s, 201 | 409 | 503)),
        "{answers:?}"
    );
    let created = answers.iter().filter(|(s, _)| *s == 201).count() as i64;
    let books = books::read(&url, product).await.unwrap();
    assert_books_balance(books, STOCK, created);
    eprintln!("{strategy:?}: {terminated} backends terminated, {created} sold, books {books:?}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn terminated_postgres_connections_never_split_an_order_from_its_decrement_under_the_redis_lock(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    terminate_backends_during_a_flood(LockStrategy::Redis, connect).await;
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn terminated_postgres_connections_never_split_an_order_from_its_decrement_under_the_row_lock(
    _pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    terminate_backends_during_a_flood(LockStrategy::PgRow, connect).await;
}
