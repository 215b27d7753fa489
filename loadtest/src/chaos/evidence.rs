//! What the checker needs besides the answers, gathered once the load has stopped: the
//! product's rows in PostgreSQL with their commit times, and the order lookup of every buyer
//! whose outcome was unknown.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use rand::Rng;
use serde_json::Value;
use sqlx::PgPool;
use tokio::task::JoinSet;

use super::checker::{Database, DbOrder, LedgerEntry, Lookup};
use super::cluster::Urls;
use super::history::{Attempt, Micros};
use crate::books;

/// Wait until the product's books stop changing (batches in flight when the load stopped
/// commit or give up), reading them every half second, for at most `within`.
///
/// # Errors
/// When PostgreSQL cannot be read.
pub async fn settle(pool: &PgPool, product_id: i64, within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last = None;
    let mut same = 0;
    while tokio::time::Instant::now() < deadline {
        let books = books::read_from(pool, product_id).await?;
        same = if Some(books) == last { same + 1 } else { 0 };
        if same >= 3 {
            return Ok(());
        }
        last = Some(books);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("the books of product {product_id} still changed {within:?} after the load stopped")
}

/// The product's stock, orders and ledger, each row with its commit time.
///
/// # Errors
/// When PostgreSQL cannot be read, or a row has no commit time (`track_commit_timestamp`
/// off when it committed).
pub async fn database(pool: &PgPool, product_id: i64) -> anyhow::Result<Database> {
    // Plain queries, not sqlx's checked macros: `pg_xact_commit_timestamp(xmin)` is a
    // system column of each row, outside the schema the macros check against.
    let stock: i64 = sqlx::query_scalar("SELECT stock FROM products WHERE id = $1")
        .bind(product_id)
        .fetch_one(pool)
        .await
        .context("reading the product")?;
    let orders: Vec<(i64, i64, i32, Option<Micros>)> = sqlx::query_as(
        "SELECT id, user_id, quantity, (EXTRACT(EPOCH FROM pg_xact_commit_timestamp(xmin)) * 1000000)::BIGINT
         FROM orders WHERE product_id = $1 ORDER BY id",
    )
    .bind(product_id)
    .fetch_all(pool)
    .await
    .context("reading the orders")?;
    // A restock's idempotency key is stored by the same transaction as its ledger row.
    let ledger: Vec<(i64, String, Option<Micros>, Option<String>)> = sqlx::query_as(
        "SELECT s.delta, s.reason,
                (EXTRACT(EPOCH FROM pg_xact_commit_timestamp(s.xmin)) * 1000000)::BIGINT, a.key
         FROM stock_changes s LEFT JOIN admin_requests a ON a.xmin = s.xmin
         WHERE s.product_id = $1 ORDER BY s.id",
    )
    .bind(product_id)
    .fetch_all(pool)
    .await
    .context("reading the stock ledger")?;
    let missing = || anyhow::anyhow!("a row without a commit time: is track_commit_timestamp on?");
    Ok(Database {
        stock,
        orders: orders
            .into_iter()
            .map(|(id, user, quantity, committed)| {
                Ok(DbOrder {
                    id,
                    user,
                    quantity: i64::from(quantity),
                    committed_us: committed.ok_or_else(missing)?,
                })
            })
            .collect::<anyhow::Result<_>>()?,
        ledger: ledger
            .into_iter()
            .map(|(delta, reason, committed, key)| {
                Ok(LedgerEntry {
                    delta,
                    reason,
                    committed_us: committed.ok_or_else(missing)?,
                    key,
                })
            })
            .collect::<anyhow::Result<_>>()?,
    })
}

/// Ask the service for the order of every buyer with an attempt whose outcome was unknown,
/// at random instances, a few at a time, retrying what says neither yes nor no.
pub async fn lookups(
    urls: &Urls,
    product_id: i64,
    attempts: &[Attempt],
) -> anyhow::Result<BTreeMap<i64, Lookup>> {
    let mut users: Vec<i64> = attempts
        .iter()
        .filter(|a| a.answer.outcome_unknown())
        .map(|a| a.user)
        .collect();
    users.sort_unstable();
    users.dedup();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut found = BTreeMap::new();
    for chunk in users.chunks(16) {
        let mut asks = JoinSet::new();
        for &user in chunk {
            let (client, urls) = (client.clone(), urls.clone());
            asks.spawn(async move { (user, look_up(&client, &urls, product_id, user).await) });
        }
        while let Some(done) = asks.join_next().await {
            let (user, lookup) = done?;
            found.insert(user, lookup);
        }
    }
    Ok(found)
}

async fn look_up(client: &reqwest::Client, urls: &Urls, product_id: i64, user: i64) -> Lookup {
    let mut last = String::new();
    for _ in 0..20 {
        let url = {
            let urls = urls.read().unwrap();
            urls[rand::rng().random_range(0..urls.len())].public.clone()
        };
        match client
            .get(format!("{url}/api/products/{product_id}/orders/{user}"))
            .bearer_auth(crate::buyers::token(user))
            .send()
            .await
        {
            Ok(response) if response.status() == 200 => {
                let body: Value = response.json().await.unwrap_or(Value::Null);
                match body["order_id"].as_i64() {
                    Some(id) => return Lookup::Found(id),
                    None => last = format!("200 without an order id: {body}"),
                }
            }
            Ok(response) if response.status() == 404 => return Lookup::NotFound,
            Ok(response) => last = format!("answered {}", response.status()),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Lookup::Failed(last)
}
