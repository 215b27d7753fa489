//! What became of a purchase whose commit answer was lost.

use sqlx::PgPool;

use super::StockSeen;
use crate::domain::ProductId;

/// A buyer's order of a product, found after the answer to its commit was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundOrder {
    pub order_id: i64,
    pub quantity: i32,
    /// How long before this look-up's statement began the order's transaction began, on
    /// the database's clock.
    pub age_us: i64,
    /// The product's stock now.
    pub left: StockSeen,
}

/// `user`'s order of `product`, if one is stored, and known to be durable. The look-up
/// writes a transactional logical message (`pg_logical_emit_message`, which every role may
/// call and which touches no row): its transaction then commits with a commit record, which
/// a primary in synchronous replication acknowledges only once a synchronous standby has
/// every record before it. An order whose own commit was carried out on the primary while
/// its answer was lost (cut before the standby confirmed it) is therefore returned only once
/// a promoted standby would hold it too; while no standby confirms, the look-up waits, like
/// every commit, and the caller's time bound ends it. (A transaction that only reads, or
/// only takes a transaction id, writes no commit record that waits; rewriting the order's
/// row would change the transaction it carries, which the fault soak reads its commit time
/// from.)
///
/// `Ok(None)` when the product has no order of `user` now (a write still in flight on a
/// session the service lost may yet add one: the caller cannot conclude that nothing was
/// bought).
pub async fn durable_order_of(
    pool: &PgPool,
    product: ProductId,
    user: i64,
) -> sqlx::Result<Option<FoundOrder>> {
    let mut tx = pool.begin().await?;
    let found = sqlx::query!(
        r#"SELECT pg_logical_emit_message(true, 'seckill', 'order looked up') IS NOT NULL AS "marked!",
                  o.id AS "order_id?", o.quantity AS "quantity?",
                  (EXTRACT(EPOCH FROM statement_timestamp() - o.created_at) * 1000000)::BIGINT AS "age_us?",
                  p.stock, p.restock_gen
           FROM products p
           LEFT JOIN orders o ON o.product_id = p.id AND o.user_id = $2
           WHERE p.id = $1"#,
        product.get(),
        user,
    )
    .fetch_optional(&mut *tx)
    .await?;
    // The answer counts only once the commit is acknowledged (after the standby's).
    tx.commit().await?;
    Ok(found.and_then(|row| {
        Some(FoundOrder {
            order_id: row.order_id?,
            quantity: row.quantity?,
            age_us: row.age_us?,
            left: StockSeen {
                stock: row.stock,
                restock_gen: row.restock_gen,
            },
        })
    }))
}
