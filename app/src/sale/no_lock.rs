//! `LOCK_STRATEGY=none`: read the stock, work, write back what we computed. No lock.
//!
//! UNSAFE ON PURPOSE. Two buyers that read the same stock both write "stock - 1": one
//! decrement is lost, and when the stock read was the last unit both get an order, so orders
//! can exceed the initial stock. The `CHECK (stock >= 0)` still stops the column itself from
//! going negative. This strategy exists to show, in the load test, the race the others
//! prevent; the service logs a warning when it starts with it.

use super::{Bought, PurchaseError, PurchaseRequest, Sale, finish};
use crate::repository;

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let mut tx = sale.pool.begin().await?;
    let (seen, _version) = repository::read_stock(&mut tx, request.product_id)
        .await?
        .ok_or(PurchaseError::NotFound)?;
    sale.work().await;
    finish(tx, request, seen, None).await
}
