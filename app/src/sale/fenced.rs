//! Selling under a lock with a fence: the write path of `redis`, `redlock`, `pg-lock`,
//! `zookeeper` and `etcd`.
//!
//! While the leader holds the product's lock, no other instance's batch can write the row:
//! the row stays as this leader last left it, unless an admin restocks it (or a stale holder
//! writes before its fence is refused). So the leader ([`Holder`]) does not read the row
//! before a batch: it sells the batch with one statement that is its own transaction
//! ([`repository::sell_as_holder`]), one round trip and one commit, against four for a batch
//! without a lock of ours; the batches of several products that are ready at once share
//! one statement ([`super::writer`]). Buyers who have an order already are left out (one probe of the
//! unique index each); one guarded `UPDATE` takes exactly what the others ask and stores
//! our fence, only if the row holds no fence above ours and its stock covers those orders;
//! then their orders are inserted (an order of one of them committed meanwhile by an
//! overlapping writer, a holder whose lease ran out, undoes the whole statement). Otherwise
//! it writes nothing, and one read of the row (with which of the batch's buyers have an
//! order) tells the leader why.
//!
//! The leader allocates as if the stock were plenty (every buyer gets what they ask) unless
//! the row it last saw says otherwise; then it allocates exactly against that row, in
//! arrival order, and the write also requires the row's version to be unchanged and none of
//! the buyers it sells to to have an order, so that the `sold_out` answers it gives stand.
//! At most one statement of a batch writes, and every answer of the batch is decided by it.
//! A batch that an exact allocation sells nothing to writes nothing: one read confirms that
//! the row did not change (a restock) before its buyers are told `sold_out`.
//!
//! A stored fence above ours means one of two things, told apart by
//! [`FencedGuard::advance_fence`]: either we are stale (our lease ran out and a newer
//! holder wrote: every buyer of the batch gets 503 `lock_lost`, and nothing of theirs is
//! written), or the counter went back below the stored fence (a counter reset by hand: we
//! still hold the lock, so we take a fence above the stored one and go on). A Redis that
//! lost its counter in a restart needs no such repair: its new counter starts above the
//! clock.
//!
//! ZooKeeper and etcd assign their fences themselves (a zxid, a revision), and cannot be
//! asked for one above a number of our choosing. A stored fence above a holder's own then
//! cannot have come from the same ensemble or cluster while we hold the lock: it was left by
//! another lock backend (`LOCK_STRATEGY` changed on this database; Redis's fences, for
//! one, are clock-based and far above a zxid). Such a batch writes nothing, and the
//! operator is told what to do (`fence_from_another_backend`).

use std::collections::{HashMap, HashSet};

use distlock::{Error as LockError, Fence, FencedGuard};
use sqlx::PgPool;

use super::batch::{Decision, allocate, sales};
use super::writer::{HolderWriter, write_alone};
use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::{self, HeldRow, HolderBatch, HolderWrite};

/// The lock key of a product, as the documents this project grew from name it
/// (`lock_sale_<id>`), after `REDIS_KEY_PREFIX`.
pub fn lock_key(prefix: &str, id: ProductId) -> String {
    format!("{prefix}lock_sale_{id}")
}

/// The lock `/readyz` and start-up read (nobody takes it) to see that the lock service
/// answers, after `REDIS_KEY_PREFIX`.
pub fn probe_key(prefix: &str) -> String {
    format!("{prefix}lock_probe")
}

/// A refused fence is resynced at most this often in one batch before giving up.
const MAX_RESYNCS: usize = 3;

/// Attempts one batch may make (each a write, or a read, or a fence resync) before its
/// buyers are told busy: usually one write; a refused write and its read when the stock is
/// short, or (for an exact allocation) a buyer turns out to have an order already; one more
/// when a restock moves the row in between.
const MAX_ATTEMPTS: usize = 4;

/// Map a lock error to the purchase's answer.
pub(crate) fn lock_failed(error: LockError) -> PurchaseError {
    if let LockError::Timeout { .. } = error {
        return PurchaseError::Busy;
    }
    let error = match error.into_backend_source::<redis::RedisError>() {
        Ok(redis) => return PurchaseError::Redis(redis.into()),
        Err(other) => other,
    };
    match error.into_backend_source::<sqlx::Error>() {
        Ok(database) => PurchaseError::Database(database.into()),
        Err(other) => PurchaseError::LockService(other.into()),
    }
}

/// The leader of a product for one hold of its lock: sells batches under `guard` and keeps
/// the row, as it last read or wrote it, between them. Public so that tests can drive a
/// stale guard through the real write path.
pub struct Holder<'a, G> {
    pool: &'a PgPool,
    /// The instance's writer, which sends the batches of several products' holders as one
    /// statement; `None`: this holder writes alone, on `pool`.
    writer: Option<&'a HolderWriter>,
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
            writer: None,
            metrics,
            guard,
            product,
            row: None,
        }
    }

    /// Send the writes through `writer`, with other products' batches (reads stay on the
    /// pool).
    pub fn writing_through(mut self, writer: &'a HolderWriter) -> Self {
        self.writer = Some(writer);
        self
    }

    /// Sell one batch of `product`; one answer per request, in order. At most one statement
    /// of the batch writes, and every answer is decided by it; or, for a batch that sells
    /// nothing, by a read of the unchanged row. A batch that fails writes nothing, and every
    /// buyer in it gets the same error.
    pub async fn sell(
        &mut self,
        requests: &[PurchaseRequest],
    ) -> Vec<Result<Bought, PurchaseError>> {
        // Buyers a statement of this batch found with an order already.
        let mut bought_before = HashSet::new();
        let mut resyncs = 0;
        for _ in 0..MAX_ATTEMPTS {
            let fence = self.guard.fence();
            if let Some(row) = self.row
                && row.fence > fence.as_i64()
            {
                if resyncs == MAX_RESYNCS {
                    return all(requests, PurchaseError::LockLost);
                }
                resyncs += 1;
                if let Err(error) = self.resync(fence, row.fence).await {
                    return all(requests, error);
                }
                continue;
            }
            let plan = self.plan(requests, &bought_before);
            let attempt = if plan.users.is_empty() {
                self.confirm_nothing_sold(requests, &plan).await
            } else {
                self.write(requests, &plan, fence).await
            };
            match attempt {
                Attempt::Answered(answers) => return answers,
                Attempt::Again { bought } => bought_before.extend(bought),
            }
        }
        // The row kept moving under us (restocks): the buyers may try again.
        all(requests, PurchaseError::Busy)
    }

    /// Allocate the batch: first as if the stock were plenty (the write then needs only that
    /// it is: no read first, whatever other instances sold since we last saw the row); if
    /// the row as we saw it has not enough for everyone, exactly against it (and the write
    /// then happens only if the row is still so).
    fn plan(&self, requests: &[PurchaseRequest], bought_before: &HashSet<i64>) -> Plan {
        let decisions = allocate(i64::MAX, requests, bought_before);
        let (users, quantities) = sales(requests, &decisions);
        if let Some(row) = self.row
            && row.stock < quantities.iter().map(|&q| i64::from(q)).sum::<i64>()
        {
            let decisions = allocate(row.stock, requests, bought_before);
            let (users, quantities) = sales(requests, &decisions);
            return Plan {
                decisions,
                users,
                quantities,
                exact: Some(row),
            };
        }
        Plan {
            decisions,
            users,
            quantities,
            exact: None,
        }
    }

    /// A plan that sells to nobody writes nothing: answer from the row we know, or confirm
    /// by a read that the row is still what we allocated against.
    async fn confirm_nothing_sold(&mut self, requests: &[PurchaseRequest], plan: &Plan) -> Attempt {
        if let (None, Some(left)) = (plan.exact, self.row) {
            // As if the stock were plenty, only buyers found with an order by a statement
            // of this batch (which told us the row) get nothing: that statement decided
            // their answers.
            let found = Found {
                left,
                orders: HashMap::new(),
                bought: HashSet::new(),
            };
            return Attempt::Answered(found.answers(requests, &plan.decisions));
        }
        match self.look(requests).await {
            Ok((now, bought)) if Some(now) == plan.exact => {
                let found = Found {
                    left: now,
                    orders: HashMap::new(),
                    bought: bought.into_iter().collect(),
                };
                Attempt::Answered(found.answers(requests, &plan.decisions))
            }
            Ok((_, bought)) => Attempt::Again { bought },
            Err(error) => Attempt::Answered(all(requests, error)),
        }
    }

    /// The batch's one writing statement, under `fence`; when it writes nothing, a read
    /// tells why.
    async fn write(&mut self, requests: &[PurchaseRequest], plan: &Plan, fence: Fence) -> Attempt {
        let refused: Vec<i64> = requests
            .iter()
            .zip(&plan.decisions)
            .filter(|(_, d)| **d == Decision::SoldOut)
            .map(|(r, _)| r.user_id.get())
            .collect();
        let batch = HolderBatch {
            users: &plan.users,
            quantities: &plan.quantities,
            fence: fence.as_i64(),
            exact: plan.exact.map(|row| row.version),
            refused: &refused,
        };
        // Either way a connection comes first: failing to get one (none in time, or each
        // closed as it was made) answers before the statement is sent.
        let written = match self.writer {
            Some(writer) => writer.write(self.product, batch).await,
            None => write_alone(self.pool, self.product, batch).await,
        };
        match written {
            Ok(HolderWrite::Committed {
                row: left,
                orders,
                bought,
            }) => {
                self.row = Some(left);
                let found = Found {
                    left,
                    orders: orders.into_iter().collect(),
                    bought: bought.into_iter().collect(),
                };
                Attempt::Answered(found.answers(requests, &plan.decisions))
            }
            // Learn why: the row as it is, and which of the buyers have an order.
            Ok(HolderWrite::NotWritten) => match self.look(requests).await {
                Ok((_, bought)) => Attempt::Again { bought },
                Err(error) => Attempt::Answered(all(requests, error)),
            },
            Err(error) => {
                // The commit may have happened (`OutcomeUnknown`): read the row again next
                // time.
                self.row = None;
                Attempt::Answered(all(requests, error))
            }
        }
    }

    /// Read the row (remembered from now on) and which of the buyers of `requests` have an
    /// order.
    async fn look(
        &mut self,
        requests: &[PurchaseRequest],
    ) -> Result<(HeldRow, Vec<i64>), PurchaseError> {
        let everyone: Vec<i64> = requests.iter().map(|r| r.user_id.get()).collect();
        let (row, bought) = repository::held_row(self.pool, self.product, &everyone)
            .await?
            .ok_or(PurchaseError::NotFound)?;
        self.row = Some(row);
        Ok((row, bought))
    }

    /// The row holds `stored`, a fence above ours: take a fence above it if we still hold
    /// the lock (the counter went back), or say that we are stale.
    async fn resync(&self, ours: Fence, stored: i64) -> Result<(), PurchaseError> {
        match self.guard.advance_fence(Fence::new(stored as u64)).await {
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
            Err(LockError::FenceOutOfReach { seen, next }) => {
                Err(fence_from_another_backend(self.product, seen, next))
            }
            Err(error) => Err(lock_failed(error)),
        }
    }
}

/// The answer, and the operator's explanation, when the lock backend cannot issue a fence
/// above `stored`, the fence in `product`'s row (`ours` is the best it can give). This holder
/// does hold the lock (a stale one is told `NotHeld`), so the number came from elsewhere:
/// another lock backend wrote the row under its own fences (the service ran with another
/// `LOCK_STRATEGY` on this database), or this backend's servers were rebuilt from empty or
/// restored from an older backup (ZooKeeper's zxids and etcd's revisions started over), and
/// no holder of this backend as it is could ever write it. Nothing is written (a 500:
/// retrying cannot help until an operator acts).
pub(crate) fn fence_from_another_backend(
    product: ProductId,
    stored: u64,
    ours: u64,
) -> PurchaseError {
    tracing::error!(
        product_id = %product,
        stored_fence = stored,
        our_fence = ours,
        "product {product} cannot be sold under this lock: its stored fence ({stored}) is above \
         every fence this lock backend can hand out ({ours}). Either another lock backend wrote \
         it (switching LOCK_STRATEGY on a database keeps the old backend's fences), or this \
         backend's servers were rebuilt from empty or restored from an older backup (their \
         numbering started over). Nothing was written. To go on, stop every instance that \
         still runs another LOCK_STRATEGY, then reset the fences: UPDATE products SET fence = 0 \
         (a holder of the old backend that writes after that would no longer be refused)"
    );
    PurchaseError::Internal(format!(
        "product {product}'s stored fence ({stored}) is above every fence this lock backend can \
         hand out: another LOCK_STRATEGY wrote it, or the lock's servers were rebuilt or restored; \
         with every instance of another strategy stopped, reset it: UPDATE products SET fence = 0"
    ))
}

/// A batch's allocation, and the write it makes.
struct Plan {
    /// Each buyer's decision, in the order of the requests.
    decisions: Vec<Decision>,
    /// The buyers sold to, and what each buys.
    users: Vec<i64>,
    quantities: Vec<i32>,
    /// The row allocated against, when the stock was short: the write then requires it
    /// unchanged. `None`: allocated as if the stock were plenty.
    exact: Option<HeldRow>,
}

/// What one attempt of a batch came to.
enum Attempt {
    /// Every buyer has their answer.
    Answered(Vec<Result<Bought, PurchaseError>>),
    /// Nothing was decided: try again, knowing these buyers have an order already.
    Again { bought: Vec<i64> },
}

/// What the statement that decided a batch found: a write, or a read of the unchanged row
/// when nothing was to be sold.
struct Found {
    /// The row after it.
    left: HeldRow,
    /// The orders it inserted, by user.
    orders: HashMap<i64, i64>,
    /// Of the buyers allocated nothing, those who had an order before it.
    bought: HashSet<i64>,
}

impl Found {
    /// The answer to each request, as `decisions` (made against the row before the statement)
    /// and what the statement found say.
    fn answers(
        &self,
        requests: &[PurchaseRequest],
        decisions: &[Decision],
    ) -> Vec<Result<Bought, PurchaseError>> {
        let left = self.left.seen();
        requests
            .iter()
            .zip(decisions)
            .map(|(request, decision)| {
                let user = request.user_id.get();
                match decision {
                    Decision::Sell => match self.orders.get(&user) {
                        Some(&order_id) => Ok(Bought { order_id, left }),
                        // Skipped by the insert: they had bought already.
                        None => Err(PurchaseError::AlreadyPurchased(Some(left))),
                    },
                    Decision::SoldOut if self.bought.contains(&user) => {
                        Err(PurchaseError::AlreadyPurchased(Some(left)))
                    }
                    Decision::SoldOut => Err(PurchaseError::SoldOut(Some(left))),
                    Decision::AlreadyPurchased => Err(PurchaseError::AlreadyPurchased(Some(left))),
                }
            })
            .collect()
    }
}

/// The same error for every request.
fn all(requests: &[PurchaseRequest], error: PurchaseError) -> Vec<Result<Bought, PurchaseError>> {
    vec![Err(error); requests.len()]
}
