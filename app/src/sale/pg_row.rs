//! `LOCK_STRATEGY=pg-row`: the product row itself is the lock (`SELECT ... FOR UPDATE`).
//!
//! Every buyer holds a database connection while it waits for the row, so the flood lands
//! on PostgreSQL's lock manager and the pool: correct, but the pool is the queue.

use super::{Bought, PurchaseError, PurchaseRequest, Sale, finish};
use crate::repository;

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let mut tx = sale.pool.begin().await?;
    let seen = repository::lock_stock(&mut tx, request.product_id)
        .await?
        .ok_or(PurchaseError::NotFound)?;
    sale.work().await;
    finish(tx, request, seen, None).await
}
