//! The admin writes: products created and restocked, each with its ledger row and, when
//! the request carries one, its idempotency key's answer, in one transaction.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::{SessionBounds, begin, restock_gen};
use crate::domain::{ProductId, ProductName, Stock};

/// A product as the admin API returns it.
#[derive(Debug, Clone)]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub stock: i64,
}

/// Move the product's opening; `None`: no such product. One statement: sent again, it
/// changes nothing more.
pub async fn set_on_sale_at(
    pool: &PgPool,
    id: ProductId,
    on_sale_at: DateTime<Utc>,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar!(
        "UPDATE products SET on_sale_at = $2 WHERE id = $1 RETURNING on_sale_at",
        id.get(),
        on_sale_at,
    )
    .fetch_optional(pool)
    .await
}

/// Create a product and record its initial stock in the ledger, in one transaction.
pub async fn insert_product(
    pool: &PgPool,
    bounds: SessionBounds,
    name: &ProductName,
    stock: Stock,
    on_sale_at: Option<DateTime<Utc>>,
    actor: &str,
    key: Option<&IdempotencyKey>,
) -> sqlx::Result<Keyed<Product>> {
    let mut tx = begin(pool, bounds).await?;
    if let Some(seen) = answered_before(&mut tx, key).await? {
        return Ok(seen);
    }
    let product = sqlx::query_as!(
        Product,
        "INSERT INTO products (name, stock, on_sale_at) VALUES ($1, $2, COALESCE($3, now()))
         RETURNING id, name, stock",
        name.as_str(),
        stock.get(),
        on_sale_at,
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
    // Keys past their time are forgotten here, by whichever keyed write comes next: a few at
    // a time (a database with months of keys catches up over the next writes, each bounded),
    // and never ones another write is deleting (two keyed writes do not wait on each other).
    sqlx::query!(
        "DELETE FROM admin_requests WHERE key IN (
             SELECT key FROM admin_requests
             WHERE created_at < now() - interval '24 hours'
             ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED)"
    )
    .execute(&mut *conn)
    .await?;
    let seen = sqlx::query!(
        "SELECT request, status, product_id, name, stock FROM admin_requests
         WHERE key = $1 AND created_at >= now() - interval '24 hours'",
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
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (key) DO UPDATE SET request = EXCLUDED.request, status = EXCLUDED.status,
             product_id = EXCLUDED.product_id, name = EXCLUDED.name, stock = EXCLUDED.stock,
             created_at = now()",
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
