//! Selling under a lock with a fence: the write path of `redis`, `redlock` and `pg-lock`.
//!
//! While the leader holds the product's lock, no other instance's batch can write the row:
//! the row stays as this leader last left it, unless an admin restocks it (or a stale holder
//! writes before its fence is refused). So the leader ([`Holder`]) keeps the row in memory
//! and allocates each batch against it, without reading, and sells the batch in one
//! statement that is its own transaction ([`repository::sell_as_holder`]): one round trip
//! and one commit per batch, against four for a batch without a lock of ours. The statement
//! locks the row and writes only if the row is exactly what the allocation assumed and
//! holds no fence above ours; otherwise it writes nothing and returns the row as it is, and
//! the leader allocates again. A batch whose allocation sells nothing writes nothing: one
//! read confirms that the row did not change (a restock) before its buyers are told
//! `sold_out`.
//!
//! A stored fence above ours means one of two things, told apart by
//! [`FencedGuard::advance_fence`]: either we are stale (our lease ran out and a newer
//! holder wrote: every buyer still undecided gets 503 `lock_lost`, and nothing of theirs is
//! written), or the counter went back below the stored fence (a counter reset by hand: we
//! still hold the lock, so we take a fence above the stored one and go on). A Redis that
//! lost its counter in a restart needs no such repair: its new counter starts above the
//! clock.

use std::collections::{HashMap, HashSet};

use distlock::{Error as LockError, Fence, FencedGuard};
use sqlx::PgPool;

use super::batch::{Decision, allocate};
use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::{self, HeldRow, HolderWrite};

/// The lock key of a product, as the documents this project grew from name it
/// (`lock_sale_<id>`), after `REDIS_KEY_PREFIX`.
pub fn lock_key(prefix: &str, id: ProductId) -> String {
    format!("{prefix}lock_sale_{id}")
}

/// A refused fence is resynced at most this often in one batch before giving up.
const MAX_RESYNCS: usize = 3;

/// A batch whose row moved under it (restocks) is allocated again at most this often before
/// its buyers are told busy.
const MAX_ATTEMPTS: usize = 20;

/// Map a lock error to the purchase's answer.
pub(crate) fn lock_failed(error: LockError) -> PurchaseError {
    match error {
        LockError::Timeout { .. } => PurchaseError::Busy,
        LockError::Redis(error) => PurchaseError::Redis(error.into()),
        LockError::Postgres(error) => PurchaseError::Database(error.into()),
        other => PurchaseError::LockService(other.into()),
    }
}

/// The leader of a product for one hold of its lock: sells batches under `guard` and keeps
/// the row, as it last read or wrote it, between them. Public so that tests can drive a
/// stale guard through the real write path.
pub struct Holder<'a, G> {
    pool: &'a PgPool,
    metrics: &'a Metrics,
    guard: &'a G,
    product: ProductId,
    /// The row as this holder last saw it; `None` until the first batch reads it, and after
    /// an error that leaves it unknown. A stale value costs one statement that writes
    /// nothing, never a wrong answer: every write checks it.
    row: Option<HeldRow>,
}

impl<'a, G: FencedGuard> Holder<'a, G> {
    pub fn new(pool: &'a PgPool, metrics: &'a Metrics, guard: &'a G, product: ProductId) -> Self {
        Self {
            pool,
            metrics,
            guard,
            product,
            row: None,
        }
    }

    /// Sell one batch of `product`; one answer per request, in order, each decided by a
    /// commit (or by a read of the unchanged row, for a `sold_out` in a batch that sells
    /// nothing). A buyer told `sold_out` in a batch where someone turned out to have bought
    /// already (their units were not taken) is decided again against the stock left.
    pub async fn sell(
        &mut self,
        requests: &[PurchaseRequest],
    ) -> Vec<Result<Bought, PurchaseError>> {
        let mut answers: Vec<Option<Result<Bought, PurchaseError>>> = vec![None; requests.len()];
        // Indexes of the requests not yet decided.
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        let mut resyncs = 0;
        let mut attempts = 0;
        let failed = loop {
            attempts += 1;
            if attempts > MAX_ATTEMPTS {
                break PurchaseError::Busy;
            }
            let fence = self.guard.fence();
            if let Some(row) = self.row
                && row.fence > fence.as_i64()
            {
                if resyncs == MAX_RESYNCS {
                    break PurchaseError::LockLost;
                }
                resyncs += 1;
                if let Err(error) = self.resync(fence, row.fence).await {
                    break error;
                }
                continue;
            }
            let batch: Vec<PurchaseRequest> = pending.iter().map(|&i| requests[i]).collect();
            // First as if the stock were plenty: the write then needs only that it is (no
            // read first, whatever other instances sold since we last saw the row).
            let mut decisions = allocate(i64::MAX, &batch, &HashSet::new());
            let mut expected = None;
            if let Some(row) = self.row
                && row.stock < demand(&batch, &decisions)
            {
                // Not enough for everyone, as far as we know: allocate against the row as
                // we saw it, and write only if it is still so.
                decisions = allocate(row.stock, &batch, &HashSet::new());
                expected = Some(row);
            }
            // Sorted by user, like every batch: two writers' unique-index locks are then taken
            // in the same order.
            let mut sales: Vec<(i64, i32)> = batch
                .iter()
                .zip(&decisions)
                .filter(|(_, d)| **d == Decision::Sell)
                .map(|(r, _)| (r.user_id.get(), r.quantity.get()))
                .collect();
            sales.sort_unstable();
            // Those told sold_out: the statement says which of them had bought already.
            let refused: Vec<i64> = batch
                .iter()
                .zip(&decisions)
                .filter(|(_, d)| **d == Decision::SoldOut)
                .map(|(r, _)| r.user_id.get())
                .collect();
            if let Some(row) = expected
                && sales.is_empty()
            {
                // Nothing to write: confirm that the stock is still what we allocated against.
                match repository::held_row(self.pool, self.product, &refused).await {
                    Ok(Some((now, bought))) if now == row => {
                        let bought = bought.into_iter().collect();
                        let no_orders = HashMap::new();
                        let done = Done {
                            left: row,
                            orders: &no_orders,
                            bought: &bought,
                        };
                        done.answer(&mut answers, requests, &pending, &decisions);
                        return finish(answers);
                    }
                    Ok(Some((now, _))) => {
                        self.row = Some(now);
                        continue;
                    }
                    Ok(None) => break PurchaseError::NotFound,
                    Err(error) => {
                        self.row = None;
                        break error.into();
                    }
                }
            }
            let (users, quantities): (Vec<i64>, Vec<i32>) = sales.iter().copied().unzip();
            let written = repository::sell_as_holder(
                self.pool,
                self.product,
                &users,
                &quantities,
                fence.as_i64(),
                expected.map(|row| row.version),
                &refused,
            )
            .await;
            match written {
                Ok(Some(HolderWrite::Committed {
                    row: left,
                    orders,
                    bought,
                })) => {
                    self.row = Some(left);
                    let orders: HashMap<i64, i64> = orders.into_iter().collect();
                    let bought: HashSet<i64> = bought.into_iter().collect();
                    let done = Done {
                        left,
                        orders: &orders,
                        bought: &bought,
                    };
                    let sold_out = done.answer(&mut answers, requests, &pending, &decisions);
                    if orders.len() == sales.len() || sold_out.is_empty() {
                        return finish(answers);
                    }
                    // Someone we meant to sell to had bought already, and their units are
                    // still in stock: the buyers told sold_out may have them.
                    pending = sold_out;
                }
                Ok(Some(HolderWrite::Moved(now))) => self.row = Some(now),
                Ok(None) => break PurchaseError::NotFound,
                Err(error) => {
                    // The commit may or may not have happened: read the row again next time.
                    self.row = None;
                    break error.into();
                }
            }
        };
        for i in pending {
            answers[i] = Some(Err(failed.clone()));
        }
        finish(answers)
    }

    /// The row holds `stored`, a fence above ours: take a fence above it if we still hold
    /// the lock (the counter went back), or say that we are stale.
    async fn resync(&self, ours: Fence, stored: i64) -> Result<(), PurchaseError> {
        match self.guard.advance_fence(Fence(stored as u64)).await {
            Ok(new) => {
                self.metrics.fence_resyncs.inc();
                tracing::warn!(stored, %new, "the fence counter was behind the database; resynced");
                tracing::Span::current().record("fence", new.get());
                Ok(())
            }
            Err(LockError::NotHeld { .. }) => {
                // Counted as a lost lock when the leader's release says so.
                tracing::warn!(%ours, stored, "fence refused: this holder is stale; the batch wrote nothing");
                Err(PurchaseError::LockLost)
            }
            Err(error) => Err(lock_failed(error)),
        }
    }
}

/// What a write (or, when nothing was to be sold, a read of the unchanged row) found.
struct Done<'a> {
    /// The row after it.
    left: HeldRow,
    /// The orders it inserted, by user.
    orders: &'a HashMap<i64, i64>,
    /// Of the buyers allocated nothing, those who had bought already.
    bought: &'a HashSet<i64>,
}

impl Done<'_> {
    /// Answer the `pending` requests as `decisions` (made against the row before the
    /// write) and what the write found say. Returns the requests told `sold_out`, which the
    /// caller decides again if someone's units were not taken.
    fn answer(
        &self,
        answers: &mut [Option<Result<Bought, PurchaseError>>],
        requests: &[PurchaseRequest],
        pending: &[usize],
        decisions: &[Decision],
    ) -> Vec<usize> {
        let left = self.left.seen();
        let mut sold_out = Vec::new();
        for (&i, decision) in pending.iter().zip(decisions) {
            let user = requests[i].user_id.get();
            answers[i] = Some(match decision {
                Decision::Sell => match self.orders.get(&user) {
                    Some(&order_id) => Ok(Bought { order_id, left }),
                    // Skipped by the insert: they had bought already.
                    None => Err(PurchaseError::AlreadyPurchased(Some(left))),
                },
                Decision::SoldOut if self.bought.contains(&user) => {
                    Err(PurchaseError::AlreadyPurchased(Some(left)))
                }
                Decision::AlreadyPurchased => Err(PurchaseError::AlreadyPurchased(Some(left))),
                Decision::SoldOut => {
                    sold_out.push(i);
                    Err(PurchaseError::SoldOut(Some(left)))
                }
            });
        }
        sold_out
    }
}

/// The units the requests `decisions` sells ask for.
fn demand(batch: &[PurchaseRequest], decisions: &[Decision]) -> i64 {
    batch
        .iter()
        .zip(decisions)
        .filter(|(_, d)| **d == Decision::Sell)
        .map(|(r, _)| i64::from(r.quantity.get()))
        .sum()
}

/// Every request has its answer by now.
fn finish(
    answers: Vec<Option<Result<Bought, PurchaseError>>>,
) -> Vec<Result<Bought, PurchaseError>> {
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| {
                Err(PurchaseError::Internal(
                    "a purchase was left undecided".into(),
                ))
            })
        })
        .collect()
}
