//! Selling one batch: many buyers of one product, one transaction.
//!
//! 1. Read the stock the strategy's way ([`Step::read`]): claim the row with a fence, lock
//!    it, or just read it.
//! 2. Find which buyers already have an order.
//! 3. Allocate in arrival order ([`allocate`]): each request gets its quantity while stock
//!    lasts; a user who already bought, or who appears twice in the batch, gets
//!    `already_purchased`; the rest get `sold_out`.
//! 4. Insert every order in one statement.
//! 5. Write the stock once, the strategy's way ([`Step::write`]), and commit.
//!
//! Every buyer's answer is decided only by the commit: a batch that fails writes nothing
//! and every buyer in it gets the same error.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;

use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::repository::{self, FenceClaim, SessionBounds, StockSeen};

/// How one strategy reads and writes the stock inside a batch's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `redis`, `redlock`, `pg-lock`: claim the row with this fence (refused if a newer holder
    /// wrote), then write what we computed.
    Fenced(i64),
    /// `pg-row`: `SELECT ... FOR UPDATE`, then write what we computed.
    RowLock,
    /// `pg-optimistic`: read the version, write only if it is unchanged.
    Optimistic,
    /// `pg-atomic`: read without a lock, then take what we sold in one guarded statement.
    Atomic,
    /// `none`: read, then write what we computed, with nothing to stop a concurrent writer.
    Unsafe,
}

/// Why a batch wrote nothing.
#[derive(Debug)]
pub(crate) enum BatchError {
    /// The row holds a higher fence than ours.
    Refused { stored: i64 },
    /// Someone wrote the stock between our read and our write (optimistic, atomic): try
    /// again with a fresh read.
    Conflict,
    /// Anything else: every buyer in the batch gets this.
    Failed(PurchaseError),
}

impl From<sqlx::Error> for BatchError {
    /// A deadlock (40P01) or a serialization failure (40001) means "try again", like a
    /// conflict; anything else fails the batch.
    fn from(error: sqlx::Error) -> Self {
        let retry = error
            .as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|code| matches!(code.as_ref(), "40P01" | "40001"));
        if retry {
            BatchError::Conflict
        } else {
            BatchError::Failed(error.into())
        }
    }
}

/// What the allocation decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Sell,
    AlreadyPurchased,
    SoldOut,
}

/// Decide every request of a batch, in arrival order, against `stock` and the users who
/// `bought_before`.
pub(crate) fn allocate(
    stock: i64,
    requests: &[PurchaseRequest],
    bought_before: &HashSet<i64>,
) -> Vec<Decision> {
    let mut left = stock;
    let mut seen = HashSet::new();
    requests
        .iter()
        .map(|request| {
            let user = request.user_id.get();
            let quantity = i64::from(request.quantity.get());
            if bought_before.contains(&user) || seen.contains(&user) {
                Decision::AlreadyPurchased
            } else if quantity <= left {
                left -= quantity;
                seen.insert(user);
                Decision::Sell
            } else {
                // Not an order: the same user may still buy a smaller quantity later on.
                Decision::SoldOut
            }
        })
        .collect()
}

/// Sell `requests` (all of `product`) in one transaction. `work` is spent inside the
/// transaction, after the read, by the strategies whose lock is the transaction itself.
///
/// # Errors
/// [`BatchError`]; nothing was written.
pub(crate) async fn sell(
    pool: &PgPool,
    bounds: SessionBounds,
    product: ProductId,
    step: Step,
    requests: &[PurchaseRequest],
    work: Duration,
) -> Result<Vec<Result<Bought, PurchaseError>>, BatchError> {
    let mut tx = repository::begin(pool, bounds).await?;
    let (seen, version) = step.read(&mut tx, product).await?;
    if !matches!(step, Step::Fenced(_)) && !work.is_zero() {
        tokio::time::sleep(work).await;
    }
    let users: Vec<i64> = requests.iter().map(|r| r.user_id.get()).collect();
    let bought_before: HashSet<i64> = repository::buyers_among(&mut tx, product, &users)
        .await?
        .into_iter()
        .collect();
    let decisions = allocate(seen.stock, requests, &bought_before);
    // Inserted in user order: two instances' batches (under the lock-free strategies) then
    // take their unique-index locks in the same order and cannot deadlock.
    let mut sales: Vec<(i64, i32)> = requests
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| **d == Decision::Sell)
        .map(|(r, _)| (r.user_id.get(), r.quantity.get()))
        .collect();
    sales.sort_unstable();
    let (selling, quantities): (Vec<i64>, Vec<i32>) = sales.into_iter().unzip();
    let fence = match step {
        Step::Fenced(fence) => Some(fence),
        _ => None,
    };
    // A user can still have bought since we looked (an instance without our lock, under
    // `none` or the lock-free strategies): the insert skips them, and so does the count.
    let order_ids: HashMap<i64, i64> = if selling.is_empty() {
        HashMap::new()
    } else {
        repository::insert_orders(&mut tx, product, &selling, &quantities, fence)
            .await?
            .into_iter()
            .collect()
    };
    let sold: i64 = requests
        .iter()
        .zip(&decisions)
        .filter(|(r, d)| **d == Decision::Sell && order_ids.contains_key(&r.user_id.get()))
        .map(|(r, _)| i64::from(r.quantity.get()))
        .sum();
    let left = StockSeen {
        stock: step
            .write(&mut tx, product, seen.stock, sold, version)
            .await?,
        restock_gen: seen.restock_gen,
    };
    tx.commit().await?;
    Ok(requests
        .iter()
        .zip(decisions)
        .map(|(request, decision)| match decision {
            Decision::Sell => match order_ids.get(&request.user_id.get()) {
                Some(&order_id) => Ok(Bought { order_id, left }),
                None => Err(PurchaseError::AlreadyPurchased(Some(left))),
            },
            Decision::AlreadyPurchased => Err(PurchaseError::AlreadyPurchased(Some(left))),
            Decision::SoldOut => Err(PurchaseError::SoldOut(Some(left))),
        })
        .collect())
}

impl Step {
    /// The stock (and, for the optimistic write, the version) as this strategy reads it.
    async fn read(
        self,
        tx: &mut sqlx::PgConnection,
        product: ProductId,
    ) -> Result<(StockSeen, i64), BatchError> {
        let not_found = || BatchError::Failed(PurchaseError::NotFound);
        match self {
            Step::Fenced(fence) => match repository::claim_fence(tx, product, fence).await? {
                FenceClaim::Claimed(seen) => Ok((seen, 0)),
                FenceClaim::Refused { stored } => Err(BatchError::Refused { stored }),
                FenceClaim::NoSuchProduct => Err(not_found()),
            },
            Step::RowLock => repository::lock_stock(tx, product)
                .await?
                .map(|seen| (seen, 0))
                .ok_or_else(not_found),
            Step::Optimistic | Step::Atomic | Step::Unsafe => repository::read_stock(tx, product)
                .await?
                .ok_or_else(not_found),
        }
    }

    /// Write the stock after selling `sold` of the `stock` read; returns what is left.
    async fn write(
        self,
        tx: &mut sqlx::PgConnection,
        product: ProductId,
        stock: i64,
        sold: i64,
        version: i64,
    ) -> Result<i64, BatchError> {
        if sold == 0 {
            return Ok(stock);
        }
        match self {
            Step::Fenced(_) | Step::RowLock | Step::Unsafe => {
                repository::write_stock(tx, product, stock - sold).await?;
                Ok(stock - sold)
            }
            Step::Optimistic => {
                if repository::write_stock_if_version(tx, product, version, stock - sold).await? {
                    Ok(stock - sold)
                } else {
                    Err(BatchError::Conflict)
                }
            }
            Step::Atomic => repository::take_stock(tx, product, sold)
                .await?
                .ok_or(BatchError::Conflict),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Quantity, UserId};

    fn request(user: i64, quantity: i64) -> PurchaseRequest {
        PurchaseRequest {
            product_id: ProductId::parse("1").unwrap(),
            user_id: UserId::parse(user).unwrap(),
            quantity: Quantity::parse(quantity, 10).unwrap(),
        }
    }

    #[test]
    fn a_batch_is_allocated_in_arrival_order_while_stock_lasts() {
        use Decision::*;
        // Stock 4: user 1 takes 2; user 2 takes 1 and then repeats inside the batch; user 3
        // bought before; user 4 wants 3 (only 1 left); user 5 takes the last; 6 and 7 find
        // nothing.
        let requests = [
            request(1, 2),
            request(2, 1),
            request(2, 1),
            request(3, 1),
            request(4, 3),
            request(5, 1),
            request(6, 1),
            request(7, 1),
        ];
        let bought_before = HashSet::from([3]);

        let decisions = allocate(4, &requests, &bought_before);

        assert_eq!(
            decisions,
            [
                Sell,
                Sell,
                AlreadyPurchased,
                AlreadyPurchased,
                SoldOut,
                Sell,
                SoldOut,
                SoldOut
            ]
        );
    }

    #[test]
    fn a_user_refused_a_large_quantity_may_still_buy_a_smaller_one_in_the_same_batch() {
        use Decision::*;
        let decisions = allocate(
            1,
            &[request(1, 3), request(1, 1), request(1, 1)],
            &HashSet::new(),
        );
        assert_eq!(decisions, [SoldOut, Sell, AlreadyPurchased]);
    }

    #[test]
    fn nothing_is_sold_from_an_empty_stock() {
        let decisions = allocate(0, &[request(1, 1), request(2, 1)], &HashSet::new());
        assert!(decisions.iter().all(|d| *d == Decision::SoldOut));
    }
}
