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

use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::domain::{ProductId, ProductName, Stock};

/// Limits on the service's own sessions, so a hung or paused instance cannot freeze a
/// product: set at the start of every transaction the service opens.
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

/// Begin a transaction with `bounds` on it. `set_config(.., true)` lasts until the
/// transaction ends, so a pooled connection carries no setting over to its next user.
pub async fn begin(
    pool: &PgPool,
    bounds: SessionBounds,
) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "SELECT set_config('statement_timeout', $1, true) AS statement_timeout,
                set_config('lock_timeout', $2, true) AS lock_timeout,
                set_config('idle_in_transaction_session_timeout', $3, true) AS idle_timeout",
        format!("{}ms", bounds.statement_timeout_ms),
        format!("{}ms", bounds.lock_timeout_ms),
        format!("{}ms", bounds.idle_in_transaction_timeout_ms),
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(tx)
}

/// A product as the admin API returns it.
#[derive(Debug, Clone)]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub stock: i64,
}

/// A product and its books: what it was supplied with, and how much of it has been sold.
#[derive(Debug, Clone)]
pub struct ProductSales {
    pub id: i64,
    pub name: String,
    pub stock: i64,
    pub sold: i64,
    pub supplied: i64,
}

/// The stock a batch saw, and the restock generation it saw it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockSeen {
    pub stock: i64,
    pub restock_gen: i64,
}

/// One recorded order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub id: i64,
    pub product_id: i64,
    pub user_id: i64,
    pub quantity: i32,
}

/// Create a product and record its initial stock in the ledger, in one transaction.
pub async fn insert_product(
    pool: &PgPool,
    bounds: SessionBounds,
    name: &ProductName,
    stock: Stock,
    actor: &str,
) -> sqlx::Result<Product> {
    let mut tx = begin(pool, bounds).await?;
    let product = sqlx::query_as!(
        Product,
        "INSERT INTO products (name, stock) VALUES ($1, $2) RETURNING id, name, stock",
        name.as_str(),
        stock.get(),
    )
    .fetch_one(&mut *tx)
    .await?;
    record_change(&mut tx, product.id, stock.get(), "create", actor).await?;
    tx.commit().await?;
    Ok(product)
}

async fn record_change(
    conn: &mut PgConnection,
    product: i64,
    delta: i64,
    reason: &str,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO stock_changes (product_id, delta, reason, actor) VALUES ($1, $2, $3, $4)",
        product,
        delta,
        reason,
        actor,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// What a restock did.
#[derive(Debug)]
pub enum Restocked {
    /// Done: the product now, and the restock generation the change started.
    Done { product: Product, restock_gen: i64 },
    /// No such product.
    NotFound,
    /// The stock was not what the caller expected (an absolute write), or would pass
    /// [`Stock::MAX`] (a relative one); nothing changed.
    Refused { current: i64 },
}

/// Add `add` units ("restock by N"), start a new restock generation and record the change.
/// Every strategy's concurrency control sees it: the row is locked until commit and its
/// `version` moves on, so an optimistic writer that read before it must try again.
pub async fn add_stock(
    pool: &PgPool,
    bounds: SessionBounds,
    id: ProductId,
    add: Stock,
    actor: &str,
) -> sqlx::Result<Restocked> {
    change_stock(pool, bounds, id, actor, "restock", |current| {
        (current + add.get() <= Stock::MAX).then_some(current + add.get())
    })
    .await
}

/// Set the stock to `stock`, only if it is `expected` now (an absolute restock, or a
/// withdrawal, with its precondition).
pub async fn set_stock(
    pool: &PgPool,
    bounds: SessionBounds,
    id: ProductId,
    stock: Stock,
    expected: i64,
    actor: &str,
) -> sqlx::Result<Restocked> {
    change_stock(pool, bounds, id, actor, "set", |current| {
        (current == expected).then_some(stock.get())
    })
    .await
}

/// Read the stock under the row lock, decide the new value, write it with the ledger row.
async fn change_stock(
    pool: &PgPool,
    bounds: SessionBounds,
    id: ProductId,
    actor: &str,
    reason: &str,
    decide: impl FnOnce(i64) -> Option<i64>,
) -> sqlx::Result<Restocked> {
    let mut tx = begin(pool, bounds).await?;
    let current = sqlx::query_scalar!(
        "SELECT stock FROM products WHERE id = $1 FOR UPDATE",
        id.get()
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(current) = current else {
        return Ok(Restocked::NotFound);
    };
    let Some(stock) = decide(current) else {
        return Ok(Restocked::Refused { current });
    };
    let changed = sqlx::query!(
        "UPDATE products SET stock = $2, restock_gen = restock_gen + 1, version = version + 1
         WHERE id = $1 RETURNING id, name, stock, restock_gen",
        id.get(),
        stock,
    )
    .fetch_one(&mut *tx)
    .await?;
    record_change(&mut tx, id.get(), stock - current, reason, actor).await?;
    tx.commit().await?;
    Ok(Restocked::Done {
        product: Product {
            id: changed.id,
            name: changed.name,
            stock: changed.stock,
        },
        restock_gen: changed.restock_gen,
    })
}

/// The product and its books, or `None`.
pub async fn product_sales(pool: &PgPool, id: ProductId) -> sqlx::Result<Option<ProductSales>> {
    sqlx::query_as!(
        ProductSales,
        r#"SELECT p.id, p.name, p.stock,
                COALESCE((SELECT SUM(o.quantity) FROM orders o WHERE o.product_id = p.id), 0)::BIGINT AS "sold!",
                COALESCE((SELECT SUM(c.delta) FROM stock_changes c WHERE c.product_id = p.id), 0)::BIGINT AS "supplied!"
         FROM products p WHERE p.id = $1"#,
        id.get()
    )
    .fetch_optional(pool)
    .await
}

/// The product's stock and restock generation, if it exists (no lock taken).
pub async fn find_product(pool: &PgPool, id: ProductId) -> sqlx::Result<Option<StockSeen>> {
    sqlx::query_as!(
        StockSeen,
        "SELECT stock, restock_gen FROM products WHERE id = $1",
        id.get()
    )
    .fetch_optional(pool)
    .await
}

/// The order `user` placed for `product`, if any.
pub async fn order_of(pool: &PgPool, product: ProductId, user: i64) -> sqlx::Result<Option<Order>> {
    sqlx::query_as!(
        Order,
        "SELECT id, product_id, user_id, quantity FROM orders WHERE product_id = $1 AND user_id = $2",
        product.get(),
        user,
    )
    .fetch_optional(pool)
    .await
}

/// What a fenced claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceClaim {
    /// Our fence is now stored and the row is locked by our transaction; here is its stock,
    /// read after the claim, so no earlier holder's write can be missed.
    Claimed(StockSeen),
    /// The row holds a higher fence than ours: a newer holder has written.
    Refused {
        stored: i64,
    },
    NoSuchProduct,
}

/// Store `fence` on the product unless a higher one is there, and read the stock. One
/// holder may claim several times with its fence (one claim per batch); two acquisitions
/// never share a fence.
pub async fn claim_fence(
    conn: &mut PgConnection,
    id: ProductId,
    fence: i64,
) -> sqlx::Result<FenceClaim> {
    let claimed = sqlx::query_as!(
        StockSeen,
        "UPDATE products SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING stock, restock_gen",
        id.get(),
        fence,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(seen) = claimed {
        return Ok(FenceClaim::Claimed(seen));
    }
    let stored = sqlx::query_scalar!("SELECT fence FROM products WHERE id = $1", id.get())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(
        stored.map_or(FenceClaim::NoSuchProduct, |stored| FenceClaim::Refused {
            stored,
        }),
    )
}

/// Read the stock and lock the row until the transaction ends (`pg-row`).
pub async fn lock_stock(conn: &mut PgConnection, id: ProductId) -> sqlx::Result<Option<StockSeen>> {
    sqlx::query_as!(
        StockSeen,
        "SELECT stock, restock_gen FROM products WHERE id = $1 FOR UPDATE",
        id.get()
    )
    .fetch_optional(conn)
    .await
}

/// Read the stock and the version without locking anything.
pub async fn read_stock(
    conn: &mut PgConnection,
    id: ProductId,
) -> sqlx::Result<Option<(StockSeen, i64)>> {
    let row = sqlx::query!(
        "SELECT stock, restock_gen, version FROM products WHERE id = $1",
        id.get()
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| {
        let seen = StockSeen {
            stock: row.stock,
            restock_gen: row.restock_gen,
        };
        (seen, row.version)
    }))
}

/// Which of `users` already have an order for the product.
pub async fn buyers_among(
    conn: &mut PgConnection,
    id: ProductId,
    users: &[i64],
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        "SELECT user_id FROM orders WHERE product_id = $1 AND user_id = ANY($2)",
        id.get(),
        users,
    )
    .fetch_all(conn)
    .await
}

/// Insert one order per `(user, quantity)` in one statement, under `fence` if any. A user
/// who has an order already is skipped; returns `(user, order id)` for those inserted.
pub async fn insert_orders(
    conn: &mut PgConnection,
    id: ProductId,
    users: &[i64],
    quantities: &[i32],
    fence: Option<i64>,
) -> sqlx::Result<Vec<(i64, i64)>> {
    let inserted = sqlx::query!(
        r#"INSERT INTO orders (product_id, user_id, quantity, fence)
         SELECT $1::BIGINT, u, q, $4::BIGINT FROM UNNEST($2::BIGINT[], $3::INT[]) AS t (u, q)
         ON CONFLICT ON CONSTRAINT orders_one_per_user DO NOTHING
         RETURNING user_id, id"#,
        id.get(),
        users,
        quantities,
        fence,
    )
    .fetch_all(conn)
    .await?;
    Ok(inserted
        .into_iter()
        .map(|row| (row.user_id, row.id))
        .collect())
}

/// Overwrite the stock with a value the caller computed (under its lock).
pub async fn write_stock(conn: &mut PgConnection, id: ProductId, stock: i64) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE products SET stock = $2, version = version + 1 WHERE id = $1",
        id.get(),
        stock,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Overwrite the stock only if nobody wrote since `version` was read. `false`: someone did.
pub async fn write_stock_if_version(
    conn: &mut PgConnection,
    id: ProductId,
    version: i64,
    stock: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE products SET stock = $3, version = version + 1 WHERE id = $1 AND version = $2",
        id.get(),
        version,
        stock,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Take `sold` units in one guarded statement. `None`: fewer are left (someone sold since
/// the caller read the stock).
pub async fn take_stock(
    conn: &mut PgConnection,
    id: ProductId,
    sold: i64,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "UPDATE products SET stock = stock - $2, version = version + 1
         WHERE id = $1 AND stock >= $2 RETURNING stock",
        id.get(),
        sold,
    )
    .fetch_optional(conn)
    .await
}

pub async fn ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("SELECT 1 AS one")
        .fetch_one(conn)
        .await
        .map(|_| ())
}
