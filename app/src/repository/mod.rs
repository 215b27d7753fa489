//! All SQL of the service. Handlers and strategies call these functions; none of them
//! writes SQL of its own.
//!
//! Functions that are one step of a batch take `&mut PgConnection`, so they run inside the
//! caller's transaction (`&mut *tx`).
//!
//! Every query is checked against the schema at compile time (`sqlx::query!` and friends):
//! a typo in a column or a wrong type fails the build, not a request. The build reads the
//! committed query data in `.sqlx/` (`SQLX_OFFLINE=true`, set in `.cargo/config.toml`);
//! after changing a query or a migration, refresh it with `cargo sqlx prepare --workspace`
//! against a database the migrations ran in (see the README).
//!
//! One file per what the SQL serves: `sale.rs` the statements of a batch (read, allocate,
//! write, as a transaction's steps or as a lock holder's one statement), `together.rs` the
//! lock holders' batches of several products in one statement, `admin.rs` the admin
//! writes (with their idempotency keys and the stock ledger), `reads.rs` the public reads, `answers.rs` what a purchase whose commit answer was lost
//! did.
//! This file holds what they share: the session bounds, `begin`, and how an error is read.

mod admin;
mod answers;
mod reads;
mod sale;
mod together;

use sqlx::{PgConnection, PgPool, Postgres, Transaction};

pub use admin::{
    IdempotencyKey, Keyed, Product, Restocked, add_stock, insert_product, set_on_sale_at, set_stock,
};
pub use answers::{FoundOrder, durable_order_of};
pub use reads::{ForSale, Order, ProductSales, find_product, order_of, product_sales};
pub use sale::{
    BatchSnapshot, HeldRow, HolderBatch, HolderWrite, Sold, StockWrite, batch_snapshot, held_row,
    restock_gen, sell_as_holder, sell_orders,
};
pub use together::sell_many_as_holder;

/// Limits on the service's own sessions, so a hung or paused instance cannot freeze a
/// product: set on every session of the service's pool (`startup`), and again at the start of
/// every transaction it opens with [`begin`]. A lock holder's batch is one statement, with no
/// transaction of its own to set them in: it relies on the session's.
#[derive(Debug, Clone, Copy)]
pub struct SessionBounds {
    /// `statement_timeout`: no statement runs longer (SQLSTATE 57014).
    pub statement_timeout_ms: u64,
    /// `lock_timeout`: no wait for a row lock lasts longer (SQLSTATE 55P03).
    pub lock_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout`: PostgreSQL ends a session that sits in an open
    /// transaction this long (a paused instance), rolling it back and freeing its row locks.
    pub idle_in_transaction_timeout_ms: u64,
}

/// Begin a transaction with `bounds` on it, in one round trip: `BEGIN` and the `SET LOCAL`s
/// go as one simple query. `SET LOCAL` lasts until the transaction ends, so a pooled
/// connection carries no setting over to its next user.
///
/// Statements in it are planned for their parameters at every execution
/// (`plan_cache_mode = force_custom_plan`). A cached generic plan made while `orders` was
/// small (right after autovacuum analyzed it, early in a fresh deployment's first sale)
/// scans the whole table for every batch until the next analyze: the sale slows down as it
/// sells. Planning costs a fraction of a millisecond per statement, and a batch plans two.
/// The service's own pools set the same for every session (`startup`), but for the lock
/// holders' pool, whose generic plans are kept on the indexes (`startup::holder_sessions`);
/// this keeps it true for transactions on any pool.
pub async fn begin(
    pool: &PgPool,
    bounds: SessionBounds,
) -> sqlx::Result<Transaction<'static, Postgres>> {
    // Only integers are formatted into the statement.
    pool.begin_with(format!(
        "BEGIN; SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}; \
         SET LOCAL idle_in_transaction_session_timeout = {}; \
         SET LOCAL plan_cache_mode = force_custom_plan",
        bounds.statement_timeout_ms, bounds.lock_timeout_ms, bounds.idle_in_transaction_timeout_ms
    ))
    .await
}

/// The stock a batch saw, and the restock generation it saw it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockSeen {
    pub stock: i64,
    pub restock_gen: i64,
}

/// Whether the server answers and would take a write: not a standby (`pg_is_in_recovery`,
/// as a demoted primary, or a member mid-promotion, is) and not read-only
/// (`default_transaction_read_only`).
pub async fn takes_writes(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS "writable!""#
    )
    .fetch_one(conn)
    .await
}

/// A transaction that lost a deadlock (40P01) or a serialization race (40001): nothing was
/// written, and the same work can simply be tried again.
pub(crate) fn is_lost_race(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| matches!(code.as_ref(), "40P01" | "40001"))
}

/// The database refused orders because the product's sale has not opened (SQLSTATE SK409,
/// from the `orders_only_once_on_sale` trigger): nothing was written.
pub(crate) fn is_not_open(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "SK409")
}

/// Whether a statement that commits (a `COMMIT`, or a write outside a transaction) may have
/// committed although it failed: its answer was lost with the connection (an I/O error, a
/// protocol error, the session ended by the server: 08xxx, 57P01-03). An error the server
/// answered for the statement itself (a time-out, a lost race, a constraint) rolled it back;
/// so did a statement that never got a connection.
pub(crate) fn may_have_committed(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => false,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => true,
    }
}

/// This database's deployment id (made by the migrations, once): what names the restock
/// channel, so that deployments sharing a Redis keep their news apart.
pub async fn deployment_id(pool: &PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!(r#"SELECT id::TEXT AS "id!" FROM deployment"#)
        .fetch_one(pool)
        .await
}
