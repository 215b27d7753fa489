//! What the load test's process-level tests share.

#![allow(dead_code)]

use sqlx::postgres::PgConnectOptions;

/// The `loadtest` binary under test; it also runs the instances (`loadtest serve`).
pub const LOADTEST: &str = env!("CARGO_BIN_EXE_loadtest");

/// The server the tests' databases live on (`DATABASE_URL`, as for `#[sqlx::test]`).
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A URL for the test database `#[sqlx::test]` made, for child processes: the server's URL
/// with the test database's name, so its user, password, host and parameters are kept.
pub fn database_url(connect: &PgConnectOptions) -> String {
    with_database(
        &server_url(),
        connect.get_database().expect("a test database"),
    )
}

/// `server` with its database replaced by `name`.
pub fn with_database(server: &str, name: &str) -> String {
    let mut url = reqwest::Url::parse(server).expect("DATABASE_URL is a URL");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

/// A child process that is SIGKILLed and reaped when dropped, so a test that fails midway
/// leaves no demo running.
pub struct Reaped(pub Option<std::process::Child>);

impl Reaped {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Take the child back (to wait for it), leaving nothing to kill.
    pub fn take(&mut self) -> std::process::Child {
        self.0.take().expect("running")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Keys under `pattern` in the Redis at `url`.
pub fn redis_keys(url: &str, pattern: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_connection()
        .expect("Redis answers");
    redis::cmd("KEYS").arg(pattern).query(&mut conn).unwrap()
}

pub fn shared_redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

#[test]
fn a_test_database_url_keeps_the_password_and_the_host_parameters() {
    let url = with_database(
        "postgres://app:s3cret@db.example:6543/postgres?host=/run/pg",
        "_sqlx_test_42",
    );
    assert_eq!(
        url,
        "postgres://app:s3cret@db.example:6543/_sqlx_test_42?host=/run/pg"
    );
}
