//! `LOCK_STRATEGY=pg-optimistic`: read the row and its version, then write only if the
//! version is unchanged (compare-and-set), retrying a bounded number of times.
//!
//! No lock is held while working, but under a flood most writers lose the race and retry;
//! after [`MAX_ATTEMPTS`] the buyer is told 503 busy rather than spinning forever.

use std::time::Duration;

use rand::Rng;

use super::{Bought, PurchaseError, PurchaseRequest, Sale, record_order};
use crate::repository::{self, StockSeen};

/// Attempts before answering busy.
pub const MAX_ATTEMPTS: u32 = 20;

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let quantity = i64::from(request.quantity.get());
    for attempt in 0..MAX_ATTEMPTS {
        let mut conn = sale.pool.acquire().await?;
        let (seen, version) = repository::read_stock(&mut conn, request.product_id)
            .await?
            .ok_or(PurchaseError::NotFound)?;
        drop(conn);
        if seen.stock < quantity {
            return Err(PurchaseError::SoldOut(Some(seen)));
        }
        sale.work().await;
        let mut tx = sale.pool.begin().await?;
        let left = seen.stock - quantity;
        if !repository::write_stock_if_version(&mut tx, request.product_id, version, left).await? {
            drop(tx); // rolls back
            // Jittered backoff so the losers do not collide again in lock step.
            let cap = 1u64 << attempt.min(6);
            let pause = rand::rng().random_range(0..=cap);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            continue;
        }
        let order_id = record_order(&mut tx, request, None).await?;
        tx.commit().await?;
        return Ok(Bought {
            order_id,
            left: StockSeen {
                stock: left,
                restock_gen: seen.restock_gen,
            },
        });
    }
    Err(PurchaseError::Busy)
}
