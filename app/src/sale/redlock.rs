//! `LOCK_STRATEGY=redlock`: the same lock key taken on a majority of the independent Redis
//! masters in `REDLOCK_URLS`, then the fenced transaction of [`super::fenced`]. With one
//! master of three down, sales go on; with a majority down, purchases answer 503 and
//! nothing is written.

use tokio::time::Instant;

use super::fenced::{acquire_failed, lock_key, purchase_locked};
use super::{Bought, PurchaseError, PurchaseRequest, Sale};

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let redlock = sale
        .redlock
        .as_ref()
        .expect("start-up refuses LOCK_STRATEGY=redlock without REDLOCK_URLS");
    let asked = Instant::now();
    let guard = redlock
        .acquire(&lock_key(sale, request.product_id))
        .await
        .map_err(|error| acquire_failed(sale, error))?;
    purchase_locked(sale, asked, guard, request).await
}
