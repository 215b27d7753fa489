//! What the load test's process-level tests share.

#![allow(dead_code)]

use sqlx::postgres::PgConnectOptions;

/// The `loadtest` binary under test; it also runs the instances (`loadtest serve`).
pub const LOADTEST: &str = env!("CARGO_BIN_EXE_loadtest");

/// A URL for the test database `#[sqlx::test]` made, for child processes.
pub fn database_url(connect: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        connect.get_username(),
        connect.get_host(),
        connect.get_port(),
        connect.get_database().expect("a test database")
    )
}

pub fn shared_redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}
