//! `LOCK_STRATEGY=pg-atomic`: the baseline. One guarded `UPDATE ... SET stock = stock - q
//! WHERE stock >= q` and the order insert, in one transaction. No external lock: the
//! statement is its own check-and-write, and the row lock lasts only until commit.
//!
//! This is what a lock is measured against: it cannot oversell or lose an update. What a
//! lock adds is the power to guard logic that cannot be one statement.

use super::{Bought, PurchaseError, PurchaseRequest, Sale, record_order};
use crate::repository;

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let mut tx = sale.pool.begin().await?;
    let Some(left) = repository::take_stock(&mut tx, request.product_id, request.quantity).await?
    else {
        let (seen, _) = repository::read_stock(&mut tx, request.product_id)
            .await?
            .ok_or(PurchaseError::NotFound)?;
        return Err(PurchaseError::SoldOut(Some(seen)));
    };
    sale.work().await;
    let order_id = record_order(&mut tx, request, None).await?;
    tx.commit().await?;
    Ok(Bought { order_id, left })
}
