//! What a purchase whose commit answer was lost did: its order looked up, durably, before
//! its buyer is answered.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::{Instant, timeout_at};

use super::{Bought, PurchaseError, PurchaseRequest};
use crate::metrics::Metrics;
use crate::repository;

/// How often a purchase whose commit answer was lost tries again to look its order up when
/// the look-up fails (the database failing over has no primary for some seconds).
const FIND_OUT_EVERY: Duration = Duration::from_millis(250);

/// The longest a purchase's answer waits for its look-up after the commit's answer was
/// lost (within the purchase's own bound): a buyer is told `outcome_unknown` then rather
/// than held while the database fails over, which takes longer.
const FIND_OUT_FOR: Duration = Duration::from_secs(3);

/// How much older than its purchase's time at the desk a found order may be and still be
/// taken for that purchase's: the order's time is its transaction's start on the database's
/// clock, and across a failover that is another machine's clock.
const SAME_PURCHASE_SLACK: Duration = Duration::from_secs(1);

/// What a purchase whose commit answer was lost did, found out by `until` (and within
/// [`FIND_OUT_FOR`]) if it can be: the buyer's order, read back durable
/// ([`repository::durable_order_of`]), is this purchase's (`Ok`), unless it was written
/// before the purchase reached the desk or for another quantity (then this purchase was
/// refused as [`PurchaseError::AlreadyPurchased`]). No order found, or
/// no answer by `until` (the database failing over, a standby not confirming), leaves
/// [`PurchaseError::OutcomeUnknown`]: a write still in flight on a session the service
/// lost may yet commit. A look-up that fails at once (no primary yet) is tried again
/// every [`FIND_OUT_EVERY`].
pub(super) async fn find_out(
    pool: &PgPool,
    metrics: &Metrics,
    request: PurchaseRequest,
    queued_at: Instant,
    until: Instant,
) -> Result<Bought, PurchaseError> {
    let until = until.min(Instant::now() + FIND_OUT_FOR);
    let answer = loop {
        let asked = Instant::now();
        let look = repository::durable_order_of(pool, request.product_id, request.user_id.get());
        match timeout_at(until, look).await {
            Ok(Ok(Some(found))) => {
                // Written before the purchase queued (with a margin for the clocks of two
                // database machines across a failover), or for another quantity: another
                // purchase's.
                let queued_for = asked.duration_since(queued_at) + SAME_PURCHASE_SLACK;
                let older =
                    found.age_us > i64::try_from(queued_for.as_micros()).unwrap_or(i64::MAX);
                break if older || found.quantity != request.quantity.get() {
                    Err(PurchaseError::AlreadyPurchased(Some(found.left)))
                } else {
                    Ok(Bought {
                        order_id: found.order_id,
                        left: found.left,
                    })
                };
            }
            Ok(Ok(None)) | Err(_) => break Err(PurchaseError::OutcomeUnknown),
            Ok(Err(_)) if Instant::now() + FIND_OUT_EVERY >= until => {
                break Err(PurchaseError::OutcomeUnknown);
            }
            Ok(Err(_)) => tokio::time::sleep(FIND_OUT_EVERY).await,
        }
    };
    let label = match &answer {
        Ok(_) => "created",
        Err(error) => error.outcome(),
    };
    metrics.lost_answers.with_label_values(&[label]).inc();
    answer
}
