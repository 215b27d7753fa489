//! Selling under a lock with a fence: the write path of `redis`, `redlock` and `pg-lock`.
//!
//! The leader holds the product's lock; for each batch, inside the batch's transaction, it
//! locks the row (`SELECT ... FOR UPDATE`, which waits for any other writer's commit, so
//! the stock read is the latest) and checks the fence stored there: the batch goes on only
//! if it is not above ours, and its write stores ours. A stored fence above ours refuses the
//! batch, which writes nothing. It means one of two things, told apart by
//! [`FencedGuard::advance_fence`]: either we are stale (our lease ran out and a newer
//! holder wrote: every buyer in the batch gets 503 `lock_lost`), or the counter went back
//! below the stored fence (a counter reset by hand: we still hold the lock, so we take a
//! fence above the stored one and try again). A Redis that lost its counter in a restart
//! needs no such repair: its new counter starts above the clock.

use std::time::Duration;

use distlock::{Error as LockError, Fence, FencedGuard};
use sqlx::PgPool;

use super::batch::{self, BatchError, Step};
use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::SessionBounds;

/// The lock key of a product, as the documents this project grew from name it
/// (`lock_sale_<id>`), after `REDIS_KEY_PREFIX`.
pub fn lock_key(prefix: &str, id: ProductId) -> String {
    format!("{prefix}lock_sale_{id}")
}

/// A refused claim is resynced at most this often before giving up.
const MAX_RESYNCS: usize = 3;

/// Map a lock error to the purchase's answer.
pub(crate) fn lock_failed(error: LockError) -> PurchaseError {
    match error {
        LockError::Timeout { .. } => PurchaseError::Busy,
        LockError::Redis(error) => PurchaseError::Redis(error.into()),
        LockError::Postgres(error) => PurchaseError::Database(error.into()),
        other => PurchaseError::LockService(other.into()),
    }
}

/// Sell one batch of `product` under `guard`, in one transaction. Every answer is decided
/// by the commit: all of them are 503 `lock_lost` when the fence is refused and we no longer
/// hold the lock, and nothing is written then. Public so that tests can drive a stale guard
/// through the real write path.
pub async fn sell_holding<G: FencedGuard>(
    pool: &PgPool,
    bounds: SessionBounds,
    metrics: &Metrics,
    guard: &G,
    product: ProductId,
    requests: &[PurchaseRequest],
) -> Vec<Result<Bought, PurchaseError>> {
    let all = |error: PurchaseError| vec![Err(error); requests.len()];
    for resync in 0..=MAX_RESYNCS {
        let fence = guard.fence();
        let step = Step::Fenced(fence.as_i64());
        let sold = batch::sell(pool, bounds, product, step, requests, Duration::ZERO).await;
        let stored = match sold {
            Ok(answers) => return answers,
            Err(BatchError::Refused { stored }) => stored,
            Err(BatchError::Failed(error)) => return all(error),
            // Under the lock only an overlapping (stale) holder or a deadlock can cause a
            // conflict: rare enough to answer busy (the buyers retry) rather than retry here.
            Err(BatchError::Conflict) => return all(PurchaseError::Busy),
        };
        if resync == MAX_RESYNCS {
            break;
        }
        match guard.advance_fence(Fence(stored as u64)).await {
            Ok(new) => {
                metrics.fence_resyncs.inc();
                tracing::warn!(stored, %new, "the fence counter was behind the database; resynced");
                tracing::Span::current().record("fence", new.get());
            }
            Err(LockError::NotHeld { .. }) => {
                // Counted as a lost lock when the leader's release says so.
                tracing::warn!(ours = %fence, stored, "fence refused: this holder is stale; the batch wrote nothing");
                return all(PurchaseError::LockLost);
            }
            Err(error) => return all(lock_failed(error)),
        }
    }
    all(PurchaseError::LockLost)
}
