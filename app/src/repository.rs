//! All SQL of the service. Handlers and strategies call these functions; none of them
//! writes SQL of its own.
//!
//! Functions that are one step of a purchase take `&mut PgConnection`, so they run inside
//! the caller's transaction (`&mut *tx`).

use sqlx::{PgConnection, PgPool};

use crate::domain::{ProductId, ProductName, Quantity, Stock, UserId};

/// A product as the admin API returns it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub stock: i64,
}

/// A product and how much of it has been sold.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProductSales {
    pub id: i64,
    pub name: String,
    pub stock: i64,
    pub sold: i64,
}

/// The stock a purchase saw, and the restock generation it saw it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct StockSeen {
    pub stock: i64,
    pub restock_gen: i64,
}

pub async fn insert_product(
    pool: &PgPool,
    name: &ProductName,
    stock: Stock,
) -> sqlx::Result<Product> {
    sqlx::query_as("INSERT INTO products (name, stock) VALUES ($1, $2) RETURNING id, name, stock")
        .bind(name.as_str())
        .bind(stock.get())
        .fetch_one(pool)
        .await
}

#[derive(sqlx::FromRow)]
struct Restocked {
    #[sqlx(flatten)]
    product: Product,
    restock_gen: i64,
}

#[derive(sqlx::FromRow)]
struct StockVersion {
    #[sqlx(flatten)]
    seen: StockSeen,
    version: i64,
}

/// Set the stock (a restock) and start a new restock generation. `None`: no such product.
pub async fn restock(
    pool: &PgPool,
    id: ProductId,
    stock: Stock,
) -> sqlx::Result<Option<(Product, i64)>> {
    let row: Option<Restocked> = sqlx::query_as(
        "UPDATE products SET stock = $2, restock_gen = restock_gen + 1 WHERE id = $1
         RETURNING id, name, stock, restock_gen",
    )
    .bind(id.get())
    .bind(stock.get())
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| (row.product, row.restock_gen)))
}

pub async fn product_sales(pool: &PgPool, id: ProductId) -> sqlx::Result<Option<ProductSales>> {
    sqlx::query_as(
        "SELECT p.id, p.name, p.stock,
                COALESCE((SELECT SUM(o.quantity) FROM orders o WHERE o.product_id = p.id), 0)::BIGINT AS sold
         FROM products p WHERE p.id = $1",
    )
    .bind(id.get())
    .fetch_optional(pool)
    .await
}

/// What a fenced write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceClaim {
    /// Our fence is now stored and the row is locked by our transaction; here is its stock,
    /// read after the claim, so no earlier holder's write can be missed.
    Claimed(StockSeen),
    /// The row holds a fence at or above ours.
    Refused {
        stored: i64,
    },
    NoSuchProduct,
}

/// Store `fence` on the product if it is above the stored one, and read the stock.
pub async fn claim_fence(
    conn: &mut PgConnection,
    id: ProductId,
    fence: i64,
) -> sqlx::Result<FenceClaim> {
    let claimed: Option<StockSeen> = sqlx::query_as(
        "UPDATE products SET fence = $2 WHERE id = $1 AND fence < $2 RETURNING stock, restock_gen",
    )
    .bind(id.get())
    .bind(fence)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(seen) = claimed {
        return Ok(FenceClaim::Claimed(seen));
    }
    let stored: Option<i64> = sqlx::query_scalar("SELECT fence FROM products WHERE id = $1")
        .bind(id.get())
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
    sqlx::query_as("SELECT stock, restock_gen FROM products WHERE id = $1 FOR UPDATE")
        .bind(id.get())
        .fetch_optional(conn)
        .await
}

/// Read the stock and the version without locking anything.
pub async fn read_stock(
    conn: &mut PgConnection,
    id: ProductId,
) -> sqlx::Result<Option<(StockSeen, i64)>> {
    let row: Option<StockVersion> =
        sqlx::query_as("SELECT stock, restock_gen, version FROM products WHERE id = $1")
            .bind(id.get())
            .fetch_optional(conn)
            .await?;
    Ok(row.map(|row| (row.seen, row.version)))
}

/// Overwrite the stock with a value the caller computed (under its lock).
pub async fn write_stock(conn: &mut PgConnection, id: ProductId, stock: i64) -> sqlx::Result<()> {
    sqlx::query("UPDATE products SET stock = $2, version = version + 1 WHERE id = $1")
        .bind(id.get())
        .bind(stock)
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
    let done = sqlx::query(
        "UPDATE products SET stock = $3, version = version + 1 WHERE id = $1 AND version = $2",
    )
    .bind(id.get())
    .bind(version)
    .bind(stock)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Take `quantity` from the stock in one guarded statement. `None`: not enough stock, or no
/// such product.
pub async fn take_stock(
    conn: &mut PgConnection,
    id: ProductId,
    quantity: Quantity,
) -> sqlx::Result<Option<StockSeen>> {
    sqlx::query_as(
        "UPDATE products SET stock = stock - $2, version = version + 1
         WHERE id = $1 AND stock >= $2 RETURNING stock, restock_gen",
    )
    .bind(id.get())
    .bind(i64::from(quantity.get()))
    .fetch_optional(conn)
    .await
}

/// Record an order. `None`: this user already has an order for this product.
pub async fn insert_order(
    conn: &mut PgConnection,
    product: ProductId,
    user: UserId,
    quantity: Quantity,
    fence: Option<i64>,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar(
        "INSERT INTO orders (product_id, user_id, quantity, fence) VALUES ($1, $2, $3, $4)
         ON CONFLICT ON CONSTRAINT orders_one_per_user DO NOTHING RETURNING id",
    )
    .bind(product.get())
    .bind(user.get())
    .bind(quantity.get())
    .bind(fence)
    .fetch_optional(conn)
    .await
}

pub async fn ping(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query("SELECT 1").execute(pool).await.map(|_| ())
}
