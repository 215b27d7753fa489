//! Selling one batch without a lock of ours: many buyers of one product, one transaction,
//! four round trips. (The lock strategies sell their batches in [`super::fenced`].)
//!
//! 1. `BEGIN` with the session bounds.
//! 2. Read the row the strategy's way (`Step::locks`): locked (`FOR UPDATE`) or not; and,
//!    in the same statement, which buyers already have an order.
//! 3. Allocate in arrival order (`allocate`): each request gets its quantity while stock
//!    lasts; a user who already bought, or who appears twice in the batch, gets
//!    `already_purchased`; the rest get `sold_out`. Then insert every order and write the
//!    stock, the strategy's way (`Step::write`), in one statement.
//! 4. Commit.
//!
//! Every buyer's answer is decided only by the commit: a batch that fails writes nothing
//! and every buyer in it gets the same error.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;

use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::repository::{self, SessionBounds, StockSeen, StockWrite};

/// How one strategy reads and writes the stock inside a batch's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
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
    /// Someone wrote between our read and our write (the stock, under optimistic or atomic;
    /// an order our read missed, under any strategy; or a deadlock): try again with a fresh
    /// read.
    Conflict,
    /// Anything else: every buyer in the batch gets this.
    Failed(PurchaseError),
}

impl From<sqlx::Error> for BatchError {
    /// A deadlock (40P01) or a serialization failure (40001) means "try again", like a
    /// conflict; anything else fails the batch.
    fn from(error: sqlx::Error) -> Self {
        if repository::is_lost_race(&error) {
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

/// The orders `decisions` make of `requests`: the users sold to and what each gets, in user
/// order, so that two writers' batches take their unique-index locks in the same order and
/// cannot deadlock.
pub(crate) fn sales(requests: &[PurchaseRequest], decisions: &[Decision]) -> (Vec<i64>, Vec<i32>) {
    let mut sales: Vec<(i64, i32)> = requests
        .iter()
        .zip(decisions)
        .filter(|(_, d)| **d == Decision::Sell)
        .map(|(r, _)| (r.user_id.get(), r.quantity.get()))
        .collect();
    sales.sort_unstable();
    sales.into_iter().unzip()
}

/// Sell `requests` (all of `product`) in one transaction. `work` is spent inside the
/// transaction, after the read: the transaction is the lock.
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
    let users: Vec<i64> = requests.iter().map(|r| r.user_id.get()).collect();
    let snapshot = repository::batch_snapshot(&mut tx, product, &users, step.locks())
        .await?
        .ok_or(BatchError::Failed(PurchaseError::NotFound))?;
    if !work.is_zero() {
        tokio::time::sleep(work).await;
    }
    let seen = snapshot.seen();
    let bought_before: HashSet<i64> = snapshot.bought.iter().copied().collect();
    let decisions = allocate(seen.stock, requests, &bought_before);
    let (selling, quantities) = sales(requests, &decisions);
    // A user can still have bought since we looked (under `none` and the lock-free
    // strategies; or, under a row lock, while we waited for it: the row is read again then,
    // the orders are not): the insert skips them, and takes nothing for them.
    let (left, order_ids) = if selling.is_empty() {
        if decisions.contains(&Decision::SoldOut) && step.reads_unlocked() {
            // No write, so nothing noticed a restock since the read (a row lock would have
            // kept it out; a write checks the version or the generation): look, or a buyer
            // is told sold_out with units there.
            if repository::restock_gen(&mut tx, product).await? != Some(seen.restock_gen) {
                return Err(BatchError::Conflict);
            }
        }
        (seen, HashMap::new())
    } else {
        let sold = repository::sell_orders(
            &mut tx,
            product,
            &selling,
            &quantities,
            step.write(&snapshot, decisions.contains(&Decision::SoldOut)),
        )
        .await?
        .ok_or(BatchError::Conflict)?;
        if sold.orders.len() < selling.len() && decisions.contains(&Decision::SoldOut) {
            // Someone we meant to sell to bought after our read saw their orders (an order
            // committed while we waited for the row lock: the row is re-read then, the orders
            // are not; or a lock-free strategy). Their units were not taken, and a buyer told
            // sold_out could have had them: read again.
            return Err(BatchError::Conflict);
        }
        let left = StockSeen {
            stock: sold.left,
            restock_gen: seen.restock_gen,
        };
        (left, sold.orders.into_iter().collect())
    };
    if let Err(error) = tx.commit().await {
        return Err(if repository::may_have_committed(&error) {
            BatchError::Failed(PurchaseError::OutcomeUnknown)
        } else {
            error.into()
        });
    }
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
    /// Whether this strategy reads the row locked (until the transaction ends).
    fn locks(self) -> bool {
        matches!(self, Step::RowLock)
    }

    /// Whether this is a safe strategy that reads without locking the row, so a restock can
    /// commit between its read and its answers (`none` promises nothing).
    fn reads_unlocked(self) -> bool {
        matches!(self, Step::Optimistic | Step::Atomic)
    }

    /// How this strategy writes the stock after reading `snapshot`, for a batch that told
    /// some buyer `sold_out` or not. (A row lock and a version check already fail on a
    /// restock since the read; the atomic take checks the restock generation for that.)
    fn write(self, snapshot: &repository::BatchSnapshot, told_sold_out: bool) -> StockWrite {
        let read = snapshot.stock;
        match self {
            Step::RowLock | Step::Unsafe => StockWrite::Set { read },
            Step::Optimistic => StockWrite::IfVersion {
                read,
                version: snapshot.version,
            },
            Step::Atomic => StockWrite::Take {
                restock_gen: told_sold_out.then_some(snapshot.restock_gen),
            },
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

    /// Wait (up to 10 s) until a session of this test's database matches `condition`, a
    /// predicate on `pg_stat_activity`.
    async fn wait_for_a_session(pool: &PgPool, condition: &str, never: &str) {
        let query = format!(
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND {condition}"
        );
        let started = tokio::time::Instant::now();
        while sqlx::query_scalar::<_, i64>(&query)
            .fetch_one(pool)
            .await
            .unwrap()
            == 0
        {
            assert!(started.elapsed() < Duration::from_secs(10), "{never}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn a_batch_that_waited_for_the_row_sees_the_orders_committed_meanwhile(pool: PgPool) {
        // Arrange: stock 2; another session holds the row, sells one unit to user 7...
        let bounds = SessionBounds {
            statement_timeout_ms: 10_000,
            lock_timeout_ms: 10_000,
            idle_in_transaction_timeout_ms: 10_000,
        };
        let id: i64 =
            sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 2) RETURNING id")
                .fetch_one(&pool)
                .await
                .unwrap();
        let product = ProductId::parse(&id.to_string()).unwrap();
        let mut other = pool.begin().await.unwrap();
        sqlx::query("SELECT stock FROM products WHERE id = $1 FOR UPDATE")
            .bind(id)
            .execute(&mut *other)
            .await
            .unwrap();
        sqlx::query("INSERT INTO orders (product_id, user_id, quantity) VALUES ($1, 7, 1)")
            .bind(id)
            .execute(&mut *other)
            .await
            .unwrap();
        sqlx::query("UPDATE products SET stock = 1 WHERE id = $1")
            .bind(id)
            .execute(&mut *other)
            .await
            .unwrap();
        // ... while a pg-row batch of users 7 and 8 waits for the row, then it commits.
        let requests = [request(7, 1), request(8, 1)];
        let batch = {
            let pool = pool.clone();
            tokio::spawn(async move {
                sell(
                    &pool,
                    bounds,
                    product,
                    Step::RowLock,
                    &requests,
                    Duration::ZERO,
                )
                .await
            })
        };
        wait_for_a_session(&pool, "wait_event_type = 'Lock'", "the batch never waited").await;
        other.commit().await.unwrap();

        // Act: the batch, and the retry a conflict asks for.
        let answers = match batch.await.unwrap() {
            Ok(answers) => answers,
            Err(BatchError::Conflict) => sell(
                &pool,
                bounds,
                product,
                Step::RowLock,
                &requests,
                Duration::ZERO,
            )
            .await
            .unwrap(),
            Err(other) => panic!("the batch failed: {other:?}"),
        };

        // Assert: 7 has their order already; 8 gets the unit that is left.
        assert!(matches!(
            answers[0],
            Err(PurchaseError::AlreadyPurchased(_))
        ));
        assert!(
            answers[1].is_ok(),
            "user 8 was answered {:?} with a unit left",
            answers[1]
        );
    }

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn a_pg_atomic_batch_tells_nobody_sold_out_past_a_restock_that_came_in_between(
        pool: PgPool,
    ) {
        // Arrange, act: stock 1; users 1 and 2 (1 sells, 2 would be sold out); a restock of
        // 10 commits between the batch's read and its write.
        let answers =
            answers_past_a_restock(&pool, Step::Atomic, 1, &[request(1, 1), request(2, 1)]).await;

        // Assert: with 10 units restocked before the batch wrote, user 2 gets one too.
        assert!(answers[0].is_ok(), "user 1: {:?}", answers[0]);
        assert!(
            answers[1].is_ok(),
            "user 2 was answered {:?} with 10 units restocked",
            answers[1]
        );
    }

    /// A lock-free batch that sells nothing tells nobody sold out past a restock that came in
    /// between.
    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn empty_batch_hides_no_restock_that_came_in_between(pool: PgPool) {
        for step in [Step::Atomic, Step::Optimistic] {
            // Arrange, act: stock 0, one buyer (the batch writes nothing); a restock of 10
            // commits between its read and its answer.
            let answers = answers_past_a_restock(&pool, step, 0, &[request(1, 1)]).await;

            // Assert: the buyer gets one of the 10.
            assert!(
                answers[0].is_ok(),
                "{step:?}: user 1 was answered {:?} with 10 units restocked",
                answers[0]
            );
        }
    }

    /// A new product of `stock`; a batch of `requests` under the lock-free `step` reads it and
    /// spends 3 s of work inside its transaction, while a restock of 10 commits. Its answers,
    /// after the one retry a conflict asks for.
    async fn answers_past_a_restock(
        pool: &PgPool,
        step: Step,
        stock: i64,
        requests: &[PurchaseRequest],
    ) -> Vec<Result<Bought, PurchaseError>> {
        let bounds = SessionBounds {
            statement_timeout_ms: 10_000,
            lock_timeout_ms: 10_000,
            idle_in_transaction_timeout_ms: 30_000,
        };
        let id: i64 =
            sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', $1) RETURNING id")
                .bind(stock)
                .fetch_one(pool)
                .await
                .unwrap();
        let product = ProductId::parse(&id.to_string()).unwrap();
        let requests: Vec<PurchaseRequest> = requests
            .iter()
            .map(|r| PurchaseRequest {
                product_id: product,
                ..*r
            })
            .collect();
        let batch = {
            let (pool, requests) = (pool.clone(), requests.clone());
            tokio::spawn(async move {
                sell(
                    &pool,
                    bounds,
                    product,
                    step,
                    &requests,
                    Duration::from_secs(3),
                )
                .await
            })
        };
        wait_for_a_session(
            pool,
            "state = 'idle in transaction'",
            "the batch never read",
        )
        .await;
        sqlx::query(
            "UPDATE products SET stock = stock + 10, restock_gen = restock_gen + 1, \
             version = version + 1 WHERE id = $1",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
        match batch.await.unwrap() {
            Ok(answers) => answers,
            Err(BatchError::Conflict) => {
                sell(pool, bounds, product, step, &requests, Duration::ZERO)
                    .await
                    .unwrap()
            }
            Err(other) => panic!("{step:?}: the batch failed: {other:?}"),
        }
    }

    #[test]
    fn nothing_is_sold_from_an_empty_stock() {
        let decisions = allocate(0, &[request(1, 1), request(2, 1)], &HashSet::new());
        assert!(decisions.iter().all(|d| *d == Decision::SoldOut));
    }
}
