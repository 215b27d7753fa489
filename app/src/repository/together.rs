//! The lock holders' batches of several products in one statement: what the instance's
//! writer (`sale/writer.rs`) sends. Each product is decided as [`sell_as_holder`] decides it.

use sqlx::PgConnection;

use super::sale::{HeldRow, HolderBatch, HolderWrite, sell_as_holder};
use crate::domain::ProductId;

/// The lock holders' batches of several products, each `(product, batch)` as
/// [`sell_as_holder`] takes it, written by one statement: one round trip and one commit for
/// all of them. Each product's batch is decided as [`sell_as_holder`] would decide it alone
/// (its own fence, stock, version and buyers checked against its own row): one that writes
/// nothing leaves the others written. A product must appear once; callers pass the batches
/// sorted by product, so that every such statement takes its rows' locks in one order.
///
/// The answers come one per batch, in the order of `batches`. When PostgreSQL refuses the
/// statement for what one product's batch met ([`one_product_to_blame`]: its sale not open
/// yet, its row locked past `lock_timeout`, an overlapping writer's order of one of its
/// buyers, a deadlock or serialization failure), the statement was rolled back, and each
/// batch that `still_wanted(i)` is then written alone, in order, on the same connection, so
/// that only its own conditions decide it: `Some` of its own write or its own error. `None`:
/// a batch not sent because nobody waits for it any more (its holder answered its buyers
/// already). `Err`: the statement failed for all alike (its answer lost, when it may have
/// committed: see `may_have_committed`; or refused for a reason that is no one product's,
/// a statement time-out above all, which writing each batch alone would only repeat);
/// nothing more was sent.
///
/// Costs: one statement over many rows costs PostgreSQL far less per order than a statement
/// per product (docs/performance.md).
pub async fn sell_many_as_holder(
    conn: &mut PgConnection,
    batches: &[(ProductId, HolderBatch<'_>)],
    still_wanted: impl Fn(usize) -> bool,
) -> sqlx::Result<Vec<Option<sqlx::Result<HolderWrite>>>> {
    match sell_together(conn, batches).await {
        Ok(writes) => Ok(writes.into_iter().map(|w| Some(Ok(w))).collect()),
        Err(error) if !one_product_to_blame(&error) => Err(error),
        Err(_one_products) => {
            let mut writes = Vec::with_capacity(batches.len());
            for (i, (product, batch)) in batches.iter().enumerate() {
                if !still_wanted(i) {
                    writes.push(None);
                    continue;
                }
                writes.push(Some(sell_as_holder(conn, *product, *batch).await));
            }
            Ok(writes)
        }
    }
}

/// Whether PostgreSQL refused the statement for what one product's batch met, which the
/// others need not share: SK409 (the sale not open yet), 55P03 (a row lock not granted in
/// time), 23505 (a unique violation: an overlapping writer's order), 40P01 and 40001 (a
/// deadlock, a serialization failure).
fn one_product_to_blame(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| {
        matches!(
            e.code().as_deref(),
            Some("SK409" | "55P03" | "23505" | "40P01" | "40001")
        )
    })
}

/// Batches as the columns [`sell_together`] binds: one row per batch (`products`, `fences`,
/// `exacts`), one per buyer sold to (`buyer_products`, `users`, `quantities`) and one per
/// buyer refused (`refused_products`, `refused`).
#[derive(Default)]
struct Columns {
    products: Vec<i64>,
    fences: Vec<i64>,
    exacts: Vec<Option<i64>>,
    buyer_products: Vec<i64>,
    users: Vec<i64>,
    quantities: Vec<i32>,
    refused_products: Vec<i64>,
    refused: Vec<i64>,
}

impl Columns {
    fn of(batches: &[(ProductId, HolderBatch<'_>)]) -> Self {
        let mut columns = Self::default();
        for (product, batch) in batches {
            let id = product.get();
            columns.products.push(id);
            columns.fences.push(batch.fence);
            columns.exacts.push(batch.exact);
            columns
                .buyer_products
                .extend(std::iter::repeat_n(id, batch.users.len()));
            columns.users.extend_from_slice(batch.users);
            columns.quantities.extend_from_slice(batch.quantities);
            columns
                .refused_products
                .extend(std::iter::repeat_n(id, batch.refused.len()));
            columns.refused.extend_from_slice(batch.refused);
        }
        columns
    }
}

/// [`sell_many_as_holder`]'s one statement: [`sell_as_holder`]'s over a table of batches.
/// Each per-product figure (what its fresh buyers take, how many there are, which refused
/// buyers had an order) is computed once per product by grouping, never per output row, so
/// the statement's cost grows with its buyers, not with their product.
async fn sell_together(
    conn: &mut PgConnection,
    batches: &[(ProductId, HolderBatch<'_>)],
) -> sqlx::Result<Vec<HolderWrite>> {
    let c = Columns::of(batches);
    let rows = sqlx::query_as!(
        SoldRow,
        r#"WITH batch AS (
               SELECT b.p, b.fence, b.exact
               FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[]) AS b (p, fence, exact)
           ),
           buyer AS (
               SELECT t.p, t.u, t.q
               FROM UNNEST($4::BIGINT[], $5::BIGINT[], $6::INT[]) AS t (p, u, q)
           ),
           fresh AS (
               SELECT t.p, t.u, t.q FROM buyer t
               WHERE NOT EXISTS (SELECT 1 FROM orders o
                                 WHERE o.product_id = t.p AND o.user_id = t.u
                                 OFFSET 0)
           ),
           -- Per product, as sell_as_holder: with nobody fresh there is no total and the
           -- product's row is not written.
           wanted AS (
               SELECT b.p, b.fence, b.exact, f.total,
                      COALESCE(f.fresh_count, 0) AS fresh_count, a.buyer_count
               FROM batch b
               LEFT JOIN (SELECT p, SUM(q) AS total, COUNT(*) AS fresh_count
                          FROM fresh GROUP BY p) f ON f.p = b.p
               LEFT JOIN (SELECT p, COUNT(*) AS buyer_count FROM buyer GROUP BY p) a
                      ON a.p = b.p
           ),
           written AS (
               UPDATE products p
               SET stock = p.stock - w.total,
                   fence = w.fence,
                   version = p.version + 1
               FROM wanted w
               WHERE p.id = w.p
                 AND p.fence <= w.fence
                 AND p.stock >= w.total
                 AND (w.exact IS NULL
                      OR (p.version = w.exact AND w.fresh_count = w.buyer_count))
               RETURNING p.id, p.stock, p.version, p.restock_gen, w.fence
           ),
           inserted AS (
               INSERT INTO orders (product_id, user_id, quantity, fence)
               SELECT w.id, f.u, f.q, w.fence
               FROM written w JOIN fresh f ON f.p = w.id
               RETURNING product_id, user_id, id
           ),
           -- The refused buyers who had an order before the statement, per product.
           bought AS (
               SELECT r.p, ARRAY_AGG(o.user_id) AS users
               FROM UNNEST($7::BIGINT[], $8::BIGINT[]) AS r (p, u)
               JOIN orders o ON o.product_id = r.p AND o.user_id = r.u
               GROUP BY r.p
           )
           -- One row per product written: its row, its orders, its refused who had one.
           SELECT w.id AS "product!", w.stock AS "left!", w.version AS "version!",
                  w.restock_gen AS "restock_gen!",
                  i.users AS "users!", i.order_ids AS "order_ids!",
                  COALESCE(bo.users, '{}'::BIGINT[]) AS "bought!"
           FROM written w
           JOIN (SELECT product_id, ARRAY_AGG(user_id) AS users, ARRAY_AGG(id) AS order_ids
                 FROM inserted GROUP BY product_id) i ON i.product_id = w.id
           LEFT JOIN bought bo ON bo.p = w.id"#,
        &c.products,
        &c.fences,
        &c.exacts as &[Option<i64>],
        &c.buyer_products,
        &c.users,
        &c.quantities,
        &c.refused_products,
        &c.refused,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(SoldRow::writes(batches, &rows))
}

/// A product [`sell_together`] wrote: its row as the statement left it, its orders (`users`
/// and `order_ids`, pairwise), and its refused buyers who had an order before.
struct SoldRow {
    product: i64,
    left: i64,
    version: i64,
    restock_gen: i64,
    users: Vec<i64>,
    order_ids: Vec<i64>,
    bought: Vec<i64>,
}

impl SoldRow {
    /// Each batch's write, from its product's row: none means not written.
    fn writes(batches: &[(ProductId, HolderBatch<'_>)], rows: &[SoldRow]) -> Vec<HolderWrite> {
        batches
            .iter()
            .map(|(product, batch)| {
                let Some(sold) = rows.iter().find(|r| r.product == product.get()) else {
                    return HolderWrite::NotWritten;
                };
                HolderWrite::Committed {
                    row: HeldRow {
                        stock: sold.left,
                        version: sold.version,
                        fence: batch.fence,
                        restock_gen: sold.restock_gen,
                    },
                    orders: sold
                        .users
                        .iter()
                        .copied()
                        .zip(sold.order_ids.iter().copied())
                        .collect(),
                    bought: sold.bought.clone(),
                }
            })
            .collect()
    }
}
