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
    key: Option<&IdempotencyKey>,
) -> sqlx::Result<Keyed<Product>> {
    let mut tx = begin(pool, bounds).await?;
    if let Some(seen) = answered_before(&mut tx, key).await? {
        return Ok(seen);
    }
    let product = sqlx::query_as!(
        Product,
        "INSERT INTO products (name, stock) VALUES ($1, $2) RETURNING id, name, stock",
        name.as_str(),
        stock.get(),
    )
    .fetch_one(&mut *tx)
    .await?;
    record_change(&mut tx, product.id, stock.get(), "create", actor).await?;
    if let Some(key) = key {
        remember_answer(&mut tx, key, 201, &product).await?;
    }
    tx.commit().await?;
    Ok(Keyed::Fresh(product))
}

/// An admin write's `Idempotency-Key`, with what the request asked (a retry asks the same;
/// a key sent again with another request is refused).
#[derive(Debug, Clone)]
pub struct IdempotencyKey {
    pub key: String,
    pub request: String,
}

impl IdempotencyKey {
    /// The key a request came with, if any, tied to what it asked (`request`: its method,
    /// path and parameters, written out).
    pub fn of_request(key: Option<String>, request: String) -> Option<Self> {
        key.map(|key| Self { key, request })
    }
}

/// What an admin write sent with a key did.
#[derive(Debug)]
pub enum Keyed<T> {
    /// It ran now.
    Fresh(T),
    /// The key was answered before, with this status and product: nothing ran again.
    Replayed { status: u16, product: Product },
    /// The key was used before for another request: nothing ran.
    Reused,
}

/// Take `key` for the rest of the transaction, then the answer already given to it, if any:
/// a replay of it, or [`Keyed::Reused`] when the key came with another request.
///
/// A twin request sent with the same key at the same time waits here until this one's
/// transaction ends, and then finds its answer: twins never both decide (the second would
/// find the stock it expected changed, by its own twin).
async fn answered_before<T>(
    conn: &mut PgConnection,
    key: Option<&IdempotencyKey>,
) -> sqlx::Result<Option<Keyed<T>>> {
    let Some(key) = key else {
        return Ok(None);
    };
    sqlx::query!(
        "SELECT 1 AS \"held!\" FROM pg_advisory_xact_lock(hashtextextended($1, 0))",
        key.key
    )
    .fetch_one(&mut *conn)
    .await?;
    let seen = sqlx::query!(
        "SELECT request, status, product_id, name, stock FROM admin_requests WHERE key = $1",
        key.key
    )
    .fetch_optional(conn)
    .await?;
    Ok(seen.map(|seen| {
        if seen.request == key.request {
            Keyed::Replayed {
                status: seen.status as u16,
                product: Product {
                    id: seen.product_id,
                    name: seen.name,
                    stock: seen.stock,
                },
            }
        } else {
            Keyed::Reused
        }
    }))
}

/// Write down the answer to `key` in the write's own transaction (which holds the key: see
/// [`answered_before`]).
async fn remember_answer(
    conn: &mut PgConnection,
    key: &IdempotencyKey,
    status: u16,
    product: &Product,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO admin_requests (key, request, status, product_id, name, stock)
         VALUES ($1, $2, $3, $4, $5, $6)",
        key.key,
        key.request,
        status as i16,
        product.id,
        product.name,
        product.stock,
    )
    .execute(conn)
    .await?;
    Ok(())
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
    /// Its `Idempotency-Key` was answered before (a retry): that answer, nothing changed;
    /// and the product's restock generation now, to announce again (`None`: it is gone).
    Replayed {
        product: Product,
        restock_gen: Option<i64>,
    },
    /// Its `Idempotency-Key` came before with another request: nothing changed.
    KeyReused,
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
    key: Option<&IdempotencyKey>,
) -> sqlx::Result<Restocked> {
    change_stock(pool, bounds, id, actor, key, "restock", |current| {
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
    key: Option<&IdempotencyKey>,
) -> sqlx::Result<Restocked> {
    change_stock(pool, bounds, id, actor, key, "set", |current| {
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
    key: Option<&IdempotencyKey>,
    reason: &str,
    decide: impl FnOnce(i64) -> Option<i64>,
) -> sqlx::Result<Restocked> {
    let mut tx = begin(pool, bounds).await?;
    if let Some(seen) = answered_before(&mut tx, key).await? {
        // A retry: the first answer, with the generation now, to announce again (the first
        // request's news may have been lost with its answer).
        let restock_gen = restock_gen(&mut tx, id).await?;
        return Ok(replayed(seen, restock_gen));
    }
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
    let product = Product {
        id: changed.id,
        name: changed.name,
        stock: changed.stock,
    };
    if let Some(key) = key {
        remember_answer(&mut tx, key, 200, &product).await?;
    }
    tx.commit().await?;
    Ok(Restocked::Done {
        product,
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
    pool: &PgPool,
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
    .fetch_all(pool)
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

pub async fn ping(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("SELECT 1 AS one")
        .fetch_one(conn)
        .await
        .map(|_| ())
}

/// A transaction that lost a deadlock (40P01) or a serialization race (40001): nothing was
/// written, and the same work can simply be tried again.
pub(crate) fn is_lost_race(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| matches!(code.as_ref(), "40P01" | "40001"))
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

fn replayed(seen: Keyed<Restocked>, restock_gen: Option<i64>) -> Restocked {
    match seen {
        Keyed::Replayed { product, .. } => Restocked::Replayed {
            product,
            restock_gen,
        },
        Keyed::Fresh(done) => done,
        Keyed::Reused => Restocked::KeyReused,
    }
}
