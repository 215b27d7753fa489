//! The service's own PostgreSQL sessions are bounded: a purchase stuck behind a row that
//! another session holds answers 503 busy in bounded time; a full pool is contention, not an
//! outage; `/readyz` keeps telling the truth under load.

use std::time::Duration;

use seckill::LockStrategy;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::helpers::{error_code, hold_row, settings, shared_redis_url, spawn_with};

/// Every strategy that takes the product row in its transaction.
const STRATEGIES: [LockStrategy; 5] = [
    LockStrategy::Redis,
    LockStrategy::PgLock,
    LockStrategy::PgRow,
    LockStrategy::PgOptimistic,
    LockStrategy::PgAtomic,
];

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_purchase_behind_a_hung_session_answers_busy_within_the_lock_timeout(pool: PgPool) {
    for strategy in STRATEGIES {
        // Arrange: a session that took the product row and hangs, as an instance paused
        // inside its transaction would; PG_LOCK_TIMEOUT_MS is 500 ms.
        let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("hung"));
        settings.lock.strategy = strategy;
        settings.database.lock_timeout = Duration::from_millis(500);
        let app = spawn_with(settings, pool.clone()).await;
        let id = app.create_product("Phone", 10).await;
        let hung = hold_row(&pool, id).await;

        // Act
        let started = Instant::now();
        let response = app.purchase(id, 1, 1).await;
        let took = started.elapsed();

        // Assert: 503 busy with Retry-After, after the lock timeout and not much later.
        assert_eq!(response.headers()["retry-after"], "1", "{strategy:?}");
        assert_eq!(
            error_code(response).await,
            (503, "busy".to_owned()),
            "{strategy:?}"
        );
        assert!(took >= Duration::from_millis(500), "{strategy:?}: {took:?}");
        assert!(took < Duration::from_secs(5), "{strategy:?}: took {took:?}");
        hung.rollback().await.unwrap();
        assert_eq!(app.purchase(id, 1, 1).await.status(), 201, "{strategy:?}");
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn postgres_ends_a_session_left_idle_in_its_transaction(pool: PgPool) {
    // The bound the service puts on its own transactions, seen from PostgreSQL: a
    // transaction begun with the service's bounds and then left alone is rolled back.
    let bounds = seckill::repository::SessionBounds {
        statement_timeout_ms: 5_000,
        lock_timeout_ms: 5_000,
        idle_in_transaction_timeout_ms: 300,
    };
    let mut tx = seckill::repository::begin(&pool, bounds).await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();

    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let after = sqlx::query("SELECT 1").execute(&mut *tx).await;

    let error = after.expect_err("the idle transaction was left open");
    let code = error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    // 25P03 on the next statement, or the connection is already gone.
    assert!(
        code.as_deref() == Some("25P03") || error.as_database_error().is_none(),
        "{error}"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_full_pool_answers_busy_and_the_instance_stays_ready(pool: PgPool) {
    // Arrange: a pool of one connection, taken by someone else for the whole test.
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("pool"));
    settings.lock.strategy = LockStrategy::PgRow;
    settings.database.max_connections = 1;
    settings.database.acquire_timeout = Duration::from_millis(300);
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let app = spawn_with(settings, small.clone()).await;
    let id = app.create_product("Phone", 10).await;
    // Known to the instance already, so the purchase below reaches its desk's transaction.
    assert_eq!(app.purchase(id, 1, 1).await.status(), 201);
    let _taken = small.acquire().await.unwrap();

    // Act
    let purchase = app.purchase(id, 2, 1).await;
    let show = app
        .client
        .get(app.url(&format!("/api/products/{id}")))
        .send()
        .await
        .unwrap();
    let (ready, body) = app.ops_json("/readyz").await;

    // Assert: contention (503 busy, retry), not "database unavailable"; reads unaffected;
    // and still ready.
    assert_eq!(purchase.headers()["retry-after"], "1");
    assert_eq!(error_code(purchase).await, (503, "busy".to_owned()));
    // Public reads have connections of their own (DATABASE_READ_CONNECTIONS).
    assert_eq!(show.status(), 200);
    assert_eq!(ready, 200, "{body}");
    assert_eq!(body["postgres"], true);
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn pooled_connections_the_server_closed_while_idle_answer_503_never_500(
    _pool_options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    // Arrange: a product; PostgreSQL ends sessions idle for 300 ms (idle_session_timeout);
    // the service's own pool (which does not ping a connection before a batch uses it)...
    let admin = PgPool::connect_with(connect.clone()).await.unwrap();
    let product = insert_product(&admin).await;
    let database = connect.get_database().expect("a test database").to_owned();
    sqlx::query(&format!(
        "ALTER DATABASE \"{database}\" SET idle_session_timeout = '300ms'"
    ))
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    let prefix = testkit::unique_prefix("idle");
    let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
    let mut settings = settings(&shared_redis_url(), &prefix);
    settings.database.url = Some(server_url_with(&database).into());
    settings.lock.strategy = LockStrategy::PgAtomic;
    settings.database.max_connections = 3;
    let app = seckill::Application::build(settings)
        .await
        .expect("the app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    // ... whose connection (the one start-up used) the server has closed by now.
    tokio::time::sleep(Duration::from_millis(1_000)).await;

    // Act: buy until a purchase gets through on a fresh connection.
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for user in 1..=5 {
        let response = client
            .post(format!("{address}/api/products/{product}/purchase"))
            .bearer_auth(crate::helpers::buyer_token(user))
            .json(&serde_json::json!({"user_id": user}))
            .send()
            .await
            .unwrap();
        if response.status() == 201 {
            answers.push((201, String::new()));
            break;
        }
        answers.push(error_code(response).await);
    }

    // Assert: the dead connection cost one request a 503 (retry), never a 500, and the next
    // got through.
    assert_eq!(
        answers.first(),
        Some(&(503, "database_unavailable".to_owned())),
        "{answers:?}"
    );
    assert_eq!(answers.last().map(|a| a.0), Some(201), "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(status, _)| *status == 201 || *status == 503),
        "{answers:?}"
    );
}

/// A server that takes no writes (a standby: behind HAProxy, a member that holds Patroni's
/// lease but has not finished its promotion takes connections for a moment; found by the
/// fault soak on the `ha` database, which answered 500) refuses a batch with SQLSTATE 25006:
/// nothing was written, and the answer is 503 `database_unavailable`, to retry; `/readyz`
/// says the instance cannot sell (it asked `SELECT 1`, which a standby answers).
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_server_that_takes_no_writes_answers_503_never_500(
    _pool_options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    // Arrange: a product; then every new session of the database is read-only, as on a
    // standby; the service opens its sessions after that.
    let admin = PgPool::connect_with(connect.clone()).await.unwrap();
    let product = insert_product(&admin).await;
    let database = connect.get_database().expect("a test database").to_owned();
    sqlx::query(&format!(
        "ALTER DATABASE \"{database}\" SET default_transaction_read_only = on"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let url = server_url_with(&database);
    for strategy in [
        LockStrategy::Redis,
        LockStrategy::PgRow,
        LockStrategy::PgAtomic,
    ] {
        let prefix = testkit::unique_prefix("read-only");
        let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
        let mut settings = settings(&shared_redis_url(), &prefix);
        settings.database.url = Some(url.clone().into());
        settings.lock.strategy = strategy;
        // Migrations write: they ran before the database turned read-only.
        let app =
            seckill::Application::build_with_pool(settings, PgPool::connect(&url).await.unwrap())
                .await
                .expect("the app builds");
        let address = format!("http://127.0.0.1:{}", app.port());
        let operations = format!("http://{}", app.operations_address());
        tokio::spawn(app.run_until_stopped());

        // Act
        let client = reqwest::Client::new();
        let response = client
            .post(format!("{address}/api/products/{product}/purchase"))
            .bearer_auth(crate::helpers::buyer_token(1))
            .json(&serde_json::json!({"user_id": 1}))
            .send()
            .await
            .unwrap();
        let ready = client
            .get(format!("{operations}/readyz"))
            .send()
            .await
            .unwrap();

        // Assert: refused as unavailable, and /readyz says the database cannot sell.
        assert_eq!(
            error_code(response).await,
            (503, "database_unavailable".to_owned()),
            "{strategy:?}"
        );
        assert_eq!(ready.status(), 503, "{strategy:?}");
        let ready: serde_json::Value = ready.json().await.unwrap();
        assert_eq!(ready["postgres"], false, "{strategy:?}: {ready}");
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(orders, 0);
}

/// PostgreSQL restarting closes every session, and can close a new connection after its
/// first request, before any reply. Nothing is written then, and the answers say so. sqlx asks a new connection for TLS first
/// (`sslmode=prefer`, its default) and takes that close for a reply of 0x00: a protocol
/// error, which the service answered 500 (found by the fault soak under `pg-lock`, after
/// PostgreSQL restarts). It means PostgreSQL is not there: 503.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn connections_closed_as_they_are_made_answer_503_never_500(
    _pool_options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    for strategy in STRATEGIES {
        // Arrange: an instance reaching PostgreSQL through a door, which has sold once.
        let door = Door::open(connect.get_port()).await;
        let database = connect.get_database().expect("a test database").to_owned();
        let prefix = testkit::unique_prefix("closed");
        let _cleanup = testkit::PrefixCleanup::new(&shared_redis_url(), &prefix);
        let mut settings = settings(&shared_redis_url(), &prefix);
        // sqlx's default, named: a PGSSLMODE in the environment would change it.
        let url = format!(
            "postgres://{}@127.0.0.1:{}/{database}?sslmode=prefer",
            connect.get_username(),
            door.port
        );
        settings.database.url = Some(url.into());
        settings.database.acquire_timeout = Duration::from_millis(500);
        settings.lock.strategy = strategy;
        let app = seckill::Application::build(settings)
            .await
            .expect("the app builds");
        let address = format!("http://127.0.0.1:{}", app.port());
        tokio::spawn(app.run_until_stopped());
        let admin = PgPool::connect_with(connect.clone()).await.unwrap();
        let product = insert_product(&admin).await;
        admin.close().await;
        let client = reqwest::Client::new();
        let buy = |user: i64| {
            client
                .post(format!("{address}/api/products/{product}/purchase"))
                .bearer_auth(crate::helpers::buyer_token(user))
                .json(&serde_json::json!({"user_id": user}))
                .send()
        };
        assert_eq!(buy(1).await.unwrap().status(), 201, "{strategy:?}");

        // Act: every session ends, and every new connection is closed once it has asked.
        door.slam();
        let mut answers = Vec::new();
        for user in 2..=11 {
            answers.push(error_code(buy(user).await.unwrap()).await);
        }

        // Assert: 503s (retry), never a 500, and new connections were tried and closed.
        assert!(
            answers.iter().all(|(status, _)| *status == 503),
            "{strategy:?}: {answers:?}"
        );
        let closed = door.closed.load(std::sync::atomic::Ordering::SeqCst);
        assert!(closed > 0, "{strategy:?}: no new connection was tried");
        // Once every pooled connection is gone, a purchase gets no connection: nothing was
        // sent, so nothing was written (a lock holder's write is not `outcome_unknown`).
        assert_eq!(
            answers.last().map(|(_, code)| code.as_str()),
            Some("database_unavailable"),
            "{strategy:?}: {answers:?}"
        );
    }
}

/// A product of 100 units, written straight into the database (not through the service,
/// which these tests start on a pool of their own); its id.
/// `DATABASE_URL` (the tests' server, its user, password and parameters kept) with the
/// database `name`.
fn server_url_with(name: &str) -> String {
    let mut url = reqwest::Url::parse(
        &std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
    )
    .unwrap();
    url.set_path(&format!("/{name}"));
    url.to_string()
}

async fn insert_product(admin: &PgPool) -> i64 {
    sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 100) RETURNING id")
        .fetch_one(admin)
        .await
        .unwrap()
}

/// A door in front of PostgreSQL. Open, it passes connections through; slammed, it ends
/// every connection that passed and closes each new one once it has read what the client
/// sent first, before any reply: what a restarting PostgreSQL can do to a new connection.
struct Door {
    port: u16,
    slammed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// New connections closed while slammed.
    closed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    live: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Door {
    async fn open(target: u16) -> Self {
        use std::sync::atomic::Ordering;
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let door = Self {
            port: listener.local_addr().unwrap().port(),
            slammed: Default::default(),
            closed: Default::default(),
            live: Default::default(),
        };
        let (slammed, closed, live) =
            (door.slammed.clone(), door.closed.clone(), door.live.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if slammed.load(Ordering::SeqCst) {
                    closed.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        let mut first = [0u8; 64];
                        let _ = client.read(&mut first).await;
                    });
                    continue;
                }
                let pass = tokio::spawn(async move {
                    if let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                live.lock().unwrap().push(pass.abort_handle());
            }
        });
        door
    }

    fn slam(&self) {
        self.slammed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for pass in self.live.lock().unwrap().drain(..) {
            pass.abort();
        }
    }
}
