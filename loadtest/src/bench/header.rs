//! The report's head: when and where the bench ran, the PostgreSQL server's settings, what
//! could not be measured, and (after the rounds) how close the runs came to
//! `max_connections`.

use sqlx::PgPool;

use super::runs::Bench;

/// The lines known before the first round.
pub(super) async fn opening(admin: &PgPool, bench: &Bench<'_>) -> Vec<String> {
    let mut header = vec![
        format!(
            "date: {}; machine: {}; command: {}",
            chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
            crate::demo::machine(),
            crate::demo::command_line(&std::env::args().skip(1).collect::<Vec<_>>())
        ),
        server_settings(admin).await,
    ];
    if bench.postmaster.is_none() {
        header.push("PostgreSQL is not a process of this machine: its CPU is n/a".to_owned());
    }
    if bench.redis.is_none() {
        header.push("Redis is not a process of this machine: its CPU is n/a".to_owned());
    }
    header
}

/// The lines known after the last round: the most client connections seen open after a
/// round (`connections`), and how wrk's processes and threads were laid out.
pub(super) async fn closing(admin: &PgPool, connections: i64, products: u64) -> Vec<String> {
    let mut header = Vec::new();
    let max_connections: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(admin)
        .await
        .unwrap_or_else(|_| "?".to_owned());
    header.push(format!(
        "PostgreSQL client connections open after a round, at most: {connections} of max_connections {max_connections} (every instance's pools, this tool's, and anyone else's)"
    ));
    // A refused connection fails purchases (503): the figures would measure that instead.
    if max_connections
        .parse::<i64>()
        .is_ok_and(|max| connections * 10 >= max * 9)
    {
        header.push(
            "WARNING: close to max_connections; purchases refused a connection count as failed: raise max_connections, or run on a server nobody else uses".to_owned(),
        );
    }
    header.push(format!(
        "(c) and (d): one wrk process per instance; (c): one thread each; (d): a thread per product (up to its connections), each of the {products} products with connections of its own; otherwise one wrk process, two threads"
    ));
    header
}

/// The server's version and the settings the ceiling depends on.
async fn server_settings(admin: &PgPool) -> String {
    let mut parts = Vec::new();
    for setting in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "wal_sync_method",
    ] {
        let value: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(admin)
            .await
            .unwrap_or_else(|_| "?".to_owned());
        parts.push(format!("{setting}={value}"));
    }
    format!("PostgreSQL: {}", parts.join(", "))
}

/// Client connections open on the server now (every database).
pub(super) async fn client_connections(admin: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .fetch_one(admin)
    .await?)
}
