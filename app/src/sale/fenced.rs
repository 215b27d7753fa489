//! The fenced write path shared by `LOCK_STRATEGY=redis` and `redlock`, once the lock is held.
//!
//! 1. `WORK_MS` of work, outside any transaction: a holder that stalls here holds no row
//!    lock, so it cannot block the next holder once its lease has run out.
//! 2. One transaction: claim the row with our fence (`UPDATE ... SET fence = ours WHERE
//!    fence < ours RETURNING stock`), check the stock, insert the order, write the stock,
//!    commit.
//! 3. Release, by the caller's lock.
//!
//! The claim comes *before* the read so that the stock we check is the one after every write
//! with a lower fence; a holder whose fence is refused writes nothing. A refusal means one
//! of two things, told apart by [`FencedGuard::advance_fence`]: we are stale (our lease ran
//! out and a newer holder wrote: answer 503 `lock_lost`), or Redis restarted and lost the
//! counter (it now issues fences below the stored one: we still hold the key, so we take a
//! fence above the stored one and claim again). Without that second branch, every purchase
//! after a Redis restart would be refused forever.

use distlock::{Error as LockError, Fence, FencedGuard};
use tokio::time::Instant;

use super::{Bought, PurchaseError, PurchaseRequest, Sale, finish};
use crate::domain::ProductId;
use crate::repository::{self, FenceClaim};

/// The lock key of a product, as the documents this project grew from name it
/// (`lock_sale_<id>`), after `REDIS_KEY_PREFIX`.
pub fn lock_key(sale: &Sale, id: ProductId) -> String {
    format!("{}lock_sale_{id}", sale.key_prefix)
}

/// A refused claim is resynced at most this often before giving up; more than once only if
/// Redis loses its counter again within the same purchase.
const MAX_RESYNCS: usize = 3;

/// Map a failed acquisition to the purchase's answer.
pub(crate) fn acquire_failed(sale: &Sale, error: LockError) -> PurchaseError {
    match error {
        LockError::Timeout { .. } => {
            sale.metrics.lock_timeouts.inc();
            PurchaseError::Busy
        }
        LockError::Redis(error) => PurchaseError::Redis(error),
        other => PurchaseError::LockService(other),
    }
}

/// Record the acquisition, run the purchase under `guard`, release.
pub(crate) async fn purchase_locked<G: FencedGuard>(
    sale: &Sale,
    asked: Instant,
    guard: G,
    request: PurchaseRequest,
) -> Result<Bought, PurchaseError> {
    sale.metrics
        .lock_wait_seconds
        .observe(asked.elapsed().as_secs_f64());
    sale.metrics.lock_acquisitions.inc();
    tracing::Span::current().record("fence", guard.fence().get());

    let outcome = purchase_holding(sale, &guard, request).await;

    sale.metrics.lock_renewals.inc_by(guard.renewals());
    match guard.release().await {
        Ok(true) => {}
        Ok(false) => {
            sale.metrics.locks_lost.inc();
            tracing::warn!("the lease ran out during the purchase; the fence kept the data safe");
        }
        Err(error) => tracing::warn!(%error, "could not release the lock; its lease will free it"),
    }
    outcome
}

/// Steps 1 and 2, for a caller that already holds `guard`. Public so that tests can drive a
/// stale guard through the real write path.
///
/// # Errors
/// [`PurchaseError::LockLost`] when the fence is refused and the guard no longer holds the
/// lock: nothing is written.
pub async fn purchase_holding<G: FencedGuard>(
    sale: &Sale,
    guard: &G,
    request: PurchaseRequest,
) -> Result<Bought, PurchaseError> {
    sale.work().await;
    let mut tx = sale.pool.begin().await?;
    let mut fence = guard.fence();
    for resync in 0..=MAX_RESYNCS {
        let stored =
            match repository::claim_fence(&mut tx, request.product_id, fence.get() as i64).await? {
                FenceClaim::Claimed(seen) => {
                    return finish(tx, request, seen, Some(fence.get() as i64)).await;
                }
                FenceClaim::NoSuchProduct => return Err(PurchaseError::NotFound),
                FenceClaim::Refused { stored } => stored,
            };
        if resync == MAX_RESYNCS {
            break;
        }
        fence = match guard.advance_fence(Fence(stored as u64)).await {
            Ok(fence) => fence,
            Err(LockError::NotHeld { .. }) => {
                sale.metrics.locks_lost.inc();
                tracing::warn!(ours = %guard.fence(), stored, "fence refused: this holder is stale; nothing written");
                return Err(PurchaseError::LockLost);
            }
            Err(error) => return Err(acquire_failed(sale, error)),
        };
        sale.metrics.fence_resyncs.inc();
        tracing::warn!(stored, new = %fence, "the fence counter was behind the database (Redis lost it); resynced");
        tracing::Span::current().record("fence", fence.get());
    }
    Err(PurchaseError::LockLost)
}
