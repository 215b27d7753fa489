//! The service's links over TLS, each to a private server that presents a certificate of a
//! test's own authority: PostgreSQL (`sslmode=verify-full&sslrootcert=` in `DATABASE_URL`),
//! Redis (`rediss://` and `REDIS_CA_FILE`) and etcd (`https://` and `ETCD_CA_FILE`). Over
//! each, the service sells; told to trust another authority, it refuses to start, naming
//! the setting.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use seckill::LockStrategy;
use seckill::settings::CaFile;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use testkit::{EtcdServer, PostgresServer, RedisServer, ServerCertificate, TestAuthority, Tie};
use tokio::task::spawn_blocking;

use crate::helpers::{TestApp, build_error, settings, shared_redis_url, spawn_with};

/// An authority's certificate in a file of its own, removed when dropped.
struct CaOnDisk {
    file: CaFile,
}

impl CaOnDisk {
    fn new(authority: &TestAuthority) -> Self {
        let path = std::env::temp_dir().join(format!(
            "seckill-test-ca-{}-{:016x}.pem",
            std::process::id(),
            rand::random::<u64>()
        ));
        let pem = authority.ca_pem();
        std::fs::write(&path, &pem).unwrap();
        Self {
            file: CaFile {
                path,
                pem: Arc::from(pem.into_bytes()),
            },
        }
    }

    fn path(&self) -> &PathBuf {
        &self.file.path
    }
}

impl Drop for CaOnDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file.path);
    }
}

/// The authority the servers' certificates come from, and one nobody's come from.
fn authorities() -> (TestAuthority, TestAuthority) {
    (
        TestAuthority::new("seckill test authority"),
        TestAuthority::new("an authority of nobody's servers"),
    )
}

/// One product of 3 units, two buyers: both are sold to.
async fn sells(app: &TestApp) {
    let id = app.create_product("sold over TLS", 3).await;
    for user in [1, 2] {
        let response = app.purchase(id, user, 1).await;
        assert_eq!(response.status(), 201, "{:?}", response.text().await);
    }
}

/// `postgres://...?sslmode=verify-full&sslrootcert=<ca>` for `server`.
fn verified_url(server: &PostgresServer, ca: &CaOnDisk) -> String {
    format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port(),
        ca.path().display()
    )
}

async fn start_postgres(certificate: ServerCertificate) -> PostgresServer {
    spawn_blocking(move || PostgresServer::start_tls_only(&[], &certificate, Tie::Child))
        .await
        .unwrap()
        .unwrap()
}

/// PostgreSQL over TLS only: the service migrates and sells over verified TLS (every session
/// it opened is encrypted, as the server says), a plain connection is refused by the server,
/// and a URL naming another authority stops start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_is_checked_against_the_url_s_root_certificate() {
    // Arrange: a PostgreSQL that lets TCP clients in over TLS only.
    let (authority, stranger) = authorities();
    let server = start_postgres(authority.issue_for_localhost()).await;
    let (ca, other_ca) = (CaOnDisk::new(&authority), CaOnDisk::new(&stranger));
    let url = verified_url(&server, &ca);

    // Act: sell through a pool made from the verified URL (migrations run on it), then try
    // a plain connection and a URL that trusts another authority.
    let pool = PgPoolOptions::new()
        .max_connections(5)
        .connect_with(PgConnectOptions::from_str(&url).unwrap())
        .await
        .expect("a pool over verified TLS");
    let prefix = testkit::unique_prefix("tls-pg");
    let app = spawn_with(settings(&shared_redis_url(), &prefix), pool.clone()).await;
    sells(&app).await;
    let plain = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        server.port()
    );
    let plain = PgPool::connect(&plain).await.map(|_| ()).unwrap_err();
    let mut untrusting = settings(&shared_redis_url(), &prefix);
    untrusting.database.url = Some(verified_url(&server, &other_ca).into());
    let why = build_error(untrusting, None).await;

    // Assert: every session of the service's database is encrypted; the others were refused.
    let (sessions, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.datname = 'postgres' AND a.pid <> pg_backend_pid()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(sessions >= 1, "the service has sessions open");
    assert_eq!(
        encrypted, sessions,
        "every session of the service is over TLS"
    );
    assert!(
        plain.to_string().contains("no encryption"),
        "the server refuses plain text: {plain}"
    );
    assert!(why.contains("DATABASE_URL"), "names the setting: {why}");
    assert!(why.contains("certificate"), "says why: {why}");
    drop(server);
}

/// Redis over TLS (`rediss://`): the redis lock sells through it, its certificate checked
/// against `REDIS_CA_FILE`; another authority stops start-up, naming REDIS_URL.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn redis_over_tls_is_checked_against_redis_ca_file(pool: PgPool) {
    // Arrange: a Redis that presents a certificate of the test's authority.
    let (authority, stranger) = authorities();
    let certificate = authority.issue_for_localhost();
    let server = spawn_blocking(move || RedisServer::start_tls(&certificate))
        .await
        .unwrap();
    let (ca, other_ca) = (CaOnDisk::new(&authority), CaOnDisk::new(&stranger));
    // No prefix to clean: the server is the test's own, and gone with it.
    let mut trusting = settings(&server.tls_url(), "");
    trusting.redis.ca_file = Some(ca.file.clone());
    let mut untrusting = trusting.clone();
    untrusting.redis.ca_file = Some(other_ca.file.clone());

    // Act: sell under the redis lock over TLS; start another instance that trusts another
    // authority.
    let app = spawn_with(trusting, pool.clone()).await;
    sells(&app).await;
    let why = build_error(untrusting, Some(pool)).await;

    // Assert: the lock's fence came from the Redis over TLS; the other was refused.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k.contains("lock_sale_")),
        "the lock lives in the Redis over TLS: {keys:?}"
    );
    assert!(why.contains("REDIS_URL"), "names the setting: {why}");
    assert!(
        why.to_lowercase().contains("certificate"),
        "says why: {why}"
    );
}

/// etcd over TLS (`https://`): the etcd lock sells through it, its certificate checked
/// against `ETCD_CA_FILE`; another authority stops start-up, naming ETCD_ENDPOINTS.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn etcd_over_tls_is_checked_against_etcd_ca_file(pool: PgPool) {
    // Arrange: an etcd that presents a certificate of the test's authority.
    let (authority, stranger) = authorities();
    let certificate = authority.issue_for_localhost();
    let server = spawn_blocking(move || EtcdServer::start_tls(&certificate))
        .await
        .unwrap();
    let (ca, other_ca) = (CaOnDisk::new(&authority), CaOnDisk::new(&stranger));
    let mut trusting = settings(&shared_redis_url(), &testkit::unique_prefix("tls-etcd"));
    trusting.lock.strategy = LockStrategy::Etcd;
    trusting.lock.etcd_endpoints = vec![server.tls_endpoint()];
    trusting.lock.etcd_ca_file = Some(ca.file.clone());
    let mut untrusting = trusting.clone();
    untrusting.lock.etcd_ca_file = Some(other_ca.file.clone());

    // Act: sell under the etcd lock over TLS; start another instance that trusts another
    // authority.
    let app = spawn_with(trusting, pool.clone()).await;
    sells(&app).await;
    let why = build_error(untrusting, Some(pool)).await;

    // Assert: the other was refused, naming the setting and why.
    assert!(why.contains("ETCD_ENDPOINTS"), "names the setting: {why}");
    assert!(why.contains("certificate"), "says why: {why}");
    drop(server);
}
