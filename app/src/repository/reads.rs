//! The public reads: a product's books, its stock, a buyer's order. None takes a lock.

use sqlx::PgPool;

use super::StockSeen;
use crate::domain::ProductId;

/// A product and its books: what it was supplied with, and how much of it has been sold.
#[derive(Debug, Clone)]
pub struct ProductSales {
    pub id: i64,
    pub name: String,
    pub stock: i64,
    pub sold: i64,
    pub supplied: i64,
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
