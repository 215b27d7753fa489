//! `LOCK_STRATEGY=redis`: the single-Redis lock `lock_sale_<id>` (watchdog on), then the
//! fenced transaction of [`super::fenced`].

use tokio::time::Instant;

use super::fenced::{acquire_failed, lock_key, purchase_locked};
use super::{Bought, PurchaseError, PurchaseRequest, Sale};

pub async fn purchase(sale: &Sale, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
    let asked = Instant::now();
    let guard = sale
        .locker
        .acquire(&lock_key(sale, request.product_id))
        .await
        .map_err(|error| acquire_failed(sale, error))?;
    purchase_locked(sale, asked, guard, request).await
}
