//! The sale's statements: what a batch reads, and how it writes its orders and the stock,
//! as steps of a transaction ([`batch_snapshot`], [`sell_orders`]) or as a lock holder's
//! one statement ([`held_row`], [`sell_as_holder`]).

use sqlx::{PgConnection, PgPool};

use super::StockSeen;
use crate::domain::ProductId;

/// What a batch reads before it allocates: the product's row and which of its buyers
/// already have an order, in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSnapshot {
    pub stock: i64,
    pub restock_gen: i64,
    /// Bumped by every write (the optimistic strategy compares it).
    pub version: i64,
    /// Of the batch's users, those who already have an order for the product.
    pub bought: Vec<i64>,
}

impl BatchSnapshot {
    pub fn seen(&self) -> StockSeen {
        StockSeen {
            stock: self.stock,
            restock_gen: self.restock_gen,
        }
    }
}

/// The product's restock generation now (`None`: no such product): what a batch that read
/// without a lock and writes nothing checks before it tells anyone `sold_out`.
pub async fn restock_gen(conn: &mut PgConnection, product: ProductId) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "SELECT restock_gen FROM products WHERE id = $1",
        product.get()
    )
    .fetch_optional(conn)
    .await
}

/// Read the product's row for a batch, with the batch's `users` who already have an order.
/// With `lock`, the row is locked until the transaction ends (`FOR UPDATE`: any other
/// writer's commit is waited for, so the stock read is the latest). `None`: no such product.
pub async fn batch_snapshot(
    conn: &mut PgConnection,
    id: ProductId,
    users: &[i64],
    lock: bool,
) -> sqlx::Result<Option<BatchSnapshot>> {
    if lock {
        sqlx::query_as!(
            BatchSnapshot,
            r#"SELECT p.stock, p.restock_gen, p.version,
                      ARRAY(SELECT o.user_id FROM orders o
                            WHERE o.product_id = p.id AND o.user_id = ANY($2)) AS "bought!"
               FROM products p WHERE p.id = $1
               FOR UPDATE OF p"#,
            id.get(),
            users,
        )
        .fetch_optional(conn)
        .await
    } else {
        sqlx::query_as!(
            BatchSnapshot,
            r#"SELECT p.stock, p.restock_gen, p.version,
                      ARRAY(SELECT o.user_id FROM orders o
                            WHERE o.product_id = p.id AND o.user_id = ANY($2)) AS "bought!"
               FROM products p WHERE p.id = $1"#,
            id.get(),
            users,
        )
        .fetch_optional(conn)
        .await
    }
}

/// How a batch writes the stock after its orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockWrite {
    /// `stock = read - sold`: the row is ours (locked), or nobody checks (`none`).
    Set { read: i64 },
    /// The same, only if nobody wrote since `version` was read (optimistic).
    IfVersion { read: i64, version: i64 },
    /// `stock = stock - sold`, only if that many are left (atomic); and, with
    /// `restock_gen`, only if no restock came in since that generation was read (a batch
    /// that told a buyer `sold_out` must not commit past a restock that had units for them).
    Take { restock_gen: Option<i64> },
}

/// What a batch's write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sold {
    /// The stock after the write.
    pub left: i64,
    /// `(user, order id)` of every order inserted.
    pub orders: Vec<(i64, i64)>,
}

/// Insert one order per `(user, quantity)` and write the stock `how`, in one statement. A user who has an order already is skipped,
/// and what they asked for is not taken from the stock. `None`: the write's condition
/// failed (another writer came first); the caller rolls the transaction back.
pub async fn sell_orders(
    conn: &mut PgConnection,
    id: ProductId,
    users: &[i64],
    quantities: &[i32],
    how: StockWrite,
) -> sqlx::Result<Option<Sold>> {
    let (mode, read, version, restock_gen) = match how {
        StockWrite::Set { read } => ("set", Some(read), None, None),
        StockWrite::IfVersion { read, version } => ("if_version", Some(read), Some(version), None),
        StockWrite::Take { restock_gen } => ("take", None, None, restock_gen),
    };
    // The sub-statements see one snapshot; the stock write reads the insert's RETURNING, so
    // it takes exactly what was inserted.
    let rows = sqlx::query!(
        r#"WITH inserted AS (
               INSERT INTO orders (product_id, user_id, quantity)
               SELECT $1::BIGINT, u, q FROM UNNEST($2::BIGINT[], $3::INT[]) AS t (u, q)
               ON CONFLICT ON CONSTRAINT orders_one_per_user DO NOTHING
               RETURNING user_id, id, quantity
           ),
           sold AS (SELECT COALESCE(SUM(quantity), 0)::BIGINT AS units FROM inserted),
           written AS (
               UPDATE products p
               SET stock = (CASE WHEN $4::TEXT = 'take' THEN p.stock ELSE $5::BIGINT END) - sold.units,
                   version = p.version + 1
               FROM sold
               WHERE p.id = $1
                 AND ($4 <> 'if_version' OR p.version = $6::BIGINT)
                 AND ($4 <> 'take' OR p.stock >= sold.units)
                 AND ($7::BIGINT IS NULL OR p.restock_gen = $7)
               RETURNING p.stock
           )
           SELECT w.stock AS "left!", i.user_id AS "user_id?", i.id AS "order_id?"
           FROM written w LEFT JOIN inserted i ON true"#,
        id.get(),
        users,
        quantities,
        mode,
        read,
        version,
        restock_gen,
    )
    .fetch_all(conn)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(Sold {
        left: first.left,
        orders: rows
            .iter()
            .filter_map(|r| Some((r.user_id?, r.order_id?)))
            .collect(),
    }))
}

/// The product's row as the holder of its lock keeps track of it between batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRow {
    pub stock: i64,
    /// Bumped by every write: a sale, a restock, a stale holder's batch.
    pub version: i64,
    /// The highest fence that has written the row.
    pub fence: i64,
    pub restock_gen: i64,
}

impl HeldRow {
    pub fn seen(&self) -> StockSeen {
        StockSeen {
            stock: self.stock,
            restock_gen: self.restock_gen,
        }
    }
}

/// The product's row, read without a lock (one statement, with no commit to wait for), and
/// which of `users` already have an order for it. `None`: no such product.
pub async fn held_row(
    pool: &PgPool,
    id: ProductId,
    users: &[i64],
) -> sqlx::Result<Option<(HeldRow, Vec<i64>)>> {
    let row = sqlx::query!(
        r#"SELECT p.stock, p.version, p.fence, p.restock_gen,
                  ARRAY(SELECT o.user_id FROM orders o
                        WHERE o.product_id = p.id AND o.user_id = ANY($2)) AS "bought!"
           FROM products p WHERE p.id = $1"#,
        id.get(),
        users,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| {
        let row = HeldRow {
            stock: r.stock,
            version: r.version,
            fence: r.fence,
            restock_gen: r.restock_gen,
        };
        (row, r.bought)
    }))
}

/// What a lock holder's write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderWrite {
    /// Committed: the row as the write left it, `(user, order id)` of every order (a buyer
    /// sold to who has an order already gets none), and which of the buyers told `sold_out`
    /// had an order before.
    Committed {
        row: HeldRow,
        orders: Vec<(i64, i64)>,
        bought: Vec<i64>,
    },
    /// Nothing written: the row holds a fence above ours, or its stock is short of the
    /// orders, or every buyer sold to has an order already; or, for an exact allocation, the
    /// row is not at the version the allocation was made against, or a buyer sold to has an
    /// order already; or an overlapping writer committed an order of a buyer sold to while
    /// the statement ran. Read the row to learn which.
    NotWritten,
}

/// What a lock holder's allocation decided, for [`sell_as_holder`].
#[derive(Debug, Clone, Copy)]
pub struct HolderBatch<'a> {
    /// The buyers sold to (each once), with what each gets.
    pub users: &'a [i64],
    pub quantities: &'a [i32],
    /// The holder's fence.
    pub fence: i64,
    /// The version of the row the allocation was made against, when it was made against
    /// the stock (`None`: as if the stock were plenty).
    pub exact: Option<i64>,
    /// The buyers the allocation tells `sold_out`.
    pub refused: &'a [i64],
}

/// A lock holder's batch: one statement, which is its own transaction, so one round trip
/// and one commit. Buyers who have an order already are left out (`fresh`); one guarded
/// `UPDATE` takes exactly what the others ask from the stock and stores the holder's fence,
/// only if the row holds no fence above it and its stock covers those orders, and, for an
/// `exact` allocation (whose `sold_out` answers assume every buyer sold to takes their
/// units), only if the row is still at that version and nobody was left out; only then are
/// the orders inserted. An order committed by an overlapping writer after the statement
/// began (under a lock, only a holder whose lease ran out writes beside the holder) makes
/// the insert fail (a unique violation of `orders_one_per_user`): the whole statement is
/// undone. It also tells which of `refused` had an order before, so that they
/// are told `already_purchased` (looked up only when there are any).
///
/// Finding the buyers with an order costs one probe of the unique index per buyer, however
/// many orders the product has: the `OFFSET 0` keeps PostgreSQL from turning the
/// `NOT EXISTS` into a join (it stays a subquery run per buyer, which only the unique index
/// serves), which it may plan (before `orders` has statistics, early in a first sale, the
/// planner guesses few orders per product) as a hash of all of the product's orders: a batch
/// would then cost more with every order sold. It runs on the lock holders' sessions, which
/// keep one generic plan of it and no sequential scan (`startup::holder_sessions`).
///
/// Under `READ COMMITTED` the `UPDATE` waits for any other writer of the row and then checks
/// its conditions against the row as that writer left it, as `pg-atomic`'s does.
pub async fn sell_as_holder(
    conn: &mut PgConnection,
    id: ProductId,
    batch: HolderBatch<'_>,
) -> sqlx::Result<HolderWrite> {
    let rows = sqlx::query!(
        r#"WITH fresh AS (
               SELECT t.u, t.q FROM UNNEST($2::BIGINT[], $3::INT[]) AS t (u, q)
               WHERE NOT EXISTS (SELECT 1 FROM orders o
                                 WHERE o.product_id = $1 AND o.user_id = t.u
                                 OFFSET 0)
           ),
           -- With nobody fresh the SUM is NULL and the UPDATE matches nothing: a batch of
           -- buyers who all have an order writes nothing (not even the version or fence).
           written AS (
               UPDATE products p
               SET stock = p.stock - (SELECT SUM(f.q) FROM fresh f),
                   fence = $4,
                   version = p.version + 1
               WHERE p.id = $1
                 AND p.fence <= $4
                 AND p.stock >= (SELECT SUM(f.q) FROM fresh f)
                 AND ($5::BIGINT IS NULL
                      OR (p.version = $5
                          AND (SELECT COUNT(*) FROM fresh) = CARDINALITY($2::BIGINT[])))
               RETURNING p.stock, p.version, p.restock_gen
           ),
           inserted AS (
               INSERT INTO orders (product_id, user_id, quantity, fence)
               SELECT $1::BIGINT, f.u, f.q, $4::BIGINT
               FROM written, fresh f
               RETURNING user_id, id
           )
           SELECT w.stock AS "left!", w.version AS "version!", w.restock_gen AS "restock_gen!",
                  i.user_id AS "user_id!", i.id AS "order_id!",
                  CASE WHEN CARDINALITY($6::BIGINT[]) = 0 THEN '{}'::BIGINT[]
                       ELSE ARRAY(SELECT o.user_id FROM orders o
                                  WHERE o.product_id = $1 AND o.user_id = ANY($6))
                  END AS "bought!"
           FROM written w JOIN inserted i ON true"#,
        id.get(),
        batch.users,
        batch.quantities,
        batch.fence,
        batch.exact,
        batch.refused,
    )
    .fetch_all(&mut *conn)
    .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(error)
            if error
                .as_database_error()
                .and_then(|e| e.constraint())
                .is_some_and(|constraint| constraint == "orders_one_per_user") =>
        {
            return Ok(HolderWrite::NotWritten);
        }
        Err(error) => return Err(error),
    };
    let Some(first) = rows.first() else {
        return Ok(HolderWrite::NotWritten);
    };
    Ok(HolderWrite::Committed {
        row: HeldRow {
            stock: first.left,
            version: first.version,
            fence: batch.fence,
            restock_gen: first.restock_gen,
        },
        orders: rows.iter().map(|r| (r.user_id, r.order_id)).collect(),
        bought: first.bought.clone(),
    })
}
