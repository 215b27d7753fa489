//! The public reads: a product's books, its stock, a buyer's order. None takes a lock.

use sqlx::PgPool;

use crate::domain::ProductId;

/// A product and its books: what it was supplied with, and how much of it has been sold.
#[derive(Debug, Clone)]
pub struct ProductSales {
    pub id: i64,
    pub name: String,
    pub stock: i64,
    pub sold: i64,
    pub supplied: i64,
    pub on_sale_at: chrono::DateTime<chrono::Utc>,
}

/// One recorded order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub id: i64,
    pub product_id: i64,
    pub user_id: i64,
    pub quantity: i32,
}

/// The product and its books, or `None`.
pub async fn product_sales(pool: &PgPool, id: ProductId) -> sqlx::Result<Option<ProductSales>> {
    sqlx::query_as!(
        ProductSales,
        r#"SELECT p.id, p.name, p.stock, p.on_sale_at,
                COALESCE((SELECT SUM(o.quantity) FROM orders o WHERE o.product_id = p.id), 0)::BIGINT AS "sold!",
                COALESCE((SELECT SUM(c.delta) FROM stock_changes c WHERE c.product_id = p.id), 0)::BIGINT AS "supplied!"
         FROM products p WHERE p.id = $1"#,
        id.get()
    )
    .fetch_optional(pool)
    .await
}

/// What a purchase needs to know of a product it has not seen yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForSale {
    pub restock_gen: i64,
    /// Microseconds from the database's clock now to the product's `on_sale_at` (zero or
    /// less: open).
    pub opens_in_us: i64,
}

/// The product's restock generation and how long until it opens, if it exists (no lock
/// taken).
pub async fn find_product(pool: &PgPool, id: ProductId) -> sqlx::Result<Option<ForSale>> {
    sqlx::query_as!(
        ForSale,
        r#"SELECT restock_gen,
                  (EXTRACT(EPOCH FROM on_sale_at - clock_timestamp()) * 1000000)::BIGINT AS "opens_in_us!"
           FROM products WHERE id = $1"#,
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
