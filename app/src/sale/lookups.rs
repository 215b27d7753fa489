//! Finding a product this instance does not know yet, for its first purchase here: one
//! PostgreSQL look-up per product at a time, on connections of its own.
//!
//! A sale's opening sends thousands of first purchases of one product to every instance at
//! once; each instance reads the product once, and every purchase that comes while that read
//! runs waits for it. The read has its own small pool: a flood of public reads (order
//! look-ups, a product's books) waits on the reads' pool and cannot make a new product's
//! first buyers wait behind it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::domain::ProductId;
use crate::repository::{self, ForSale};

/// What a look-up found, and when it started (the opening it reads is measured from then).
pub(crate) type Found = (Instant, Result<Option<ForSale>, Arc<sqlx::Error>>);

/// A look-up, and whether its read has ended (whether or not anyone took the answer).
type Running = (Shared<BoxFuture<'static, Found>>, Arc<AtomicBool>);

pub(crate) struct Lookups {
    pool: PgPool,
    running: Mutex<HashMap<ProductId, Running>>,
}

impl Lookups {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            running: Mutex::new(HashMap::new()),
        }
    }

    /// Product `id` as PostgreSQL has it now: the look-up already running for it, or a new
    /// one. The read runs in a task of its own: buyers who go away (a disconnect drops
    /// their handler) cannot leave it half done holding a connection, and a look-up that
    /// finished with nobody left to take its answer is not handed to a later buyer.
    pub(crate) async fn find(&self, id: ProductId) -> Found {
        let running = {
            let mut all = self.running();
            match all.get(&id) {
                Some((running, ended)) if !ended.load(Ordering::Acquire) => running.clone(),
                _ => {
                    let (pool, ended) = (self.pool.clone(), Arc::new(AtomicBool::new(false)));
                    let done = Arc::clone(&ended);
                    let task = tokio::spawn(async move {
                        let found = read(&pool, id).await;
                        done.store(true, Ordering::Release);
                        found
                    });
                    let running = task
                        .map(|ended| match ended {
                            Ok(found) => found,
                            // The task panicked, or the runtime is shutting down.
                            Err(_) => (Instant::now(), Err(Arc::new(sqlx::Error::WorkerCrashed))),
                        })
                        .boxed()
                        .shared();
                    all.insert(id, (running.clone(), ended));
                    running
                }
            }
        };
        let found = running.clone().await;
        // Done: the next caller reads again (unless another look-up took this one's place).
        let mut all = self.running();
        if all.get(&id).is_some_and(|(now, _)| now.ptr_eq(&running)) {
            all.remove(&id);
        }
        found
    }

    /// Product `id` read now, not shared with a look-up that may have started before
    /// something changed (an opening moved: the caller's claim says the read must be newer).
    /// Owns what it needs, so the caller can run it in a task of its own.
    pub(crate) fn read_now(&self, id: ProductId) -> impl Future<Output = Found> + 'static {
        let pool = self.pool.clone();
        async move { read(&pool, id).await }
    }

    /// The look-ups running now (for tests).
    #[cfg(test)]
    fn running_now(&self) -> usize {
        self.running().len()
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<ProductId, Running>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One read of product `id`, and when it started.
async fn read(pool: &PgPool, id: ProductId) -> Found {
    let started = Instant::now();
    (
        started,
        repository::find_product(pool, id).await.map_err(Arc::new),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn buyers_who_come_while_a_product_is_looked_up_share_that_look_up(pool: PgPool) {
        // Arrange: a product, and a session that holds its row so the look-up waits.
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO products (name, stock) VALUES ('Phone', 1) RETURNING id",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let id = ProductId::parse(&id.to_string()).unwrap();
        let mut held = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE products IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *held)
            .await
            .unwrap();
        let lookups = Arc::new(Lookups::new(pool.clone()));

        // Act: ten buyers ask while the first look-up waits.
        let mut asks = Vec::new();
        for _ in 0..10 {
            let lookups = Arc::clone(&lookups);
            asks.push(tokio::spawn(async move { lookups.find(id).await }));
        }
        // TIMING: the look-up waits on the lock within seconds on any machine; then the
        // other buyers have had another second to come (and start a look-up of their own, if
        // they did not share).
        let waiting = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        };
        for _ in 0..300 {
            if waiting().await > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let waited = waiting().await;
        held.rollback().await.unwrap();

        // Assert: one session waited, and every buyer got the one answer.
        assert_eq!(waited, 1);
        for ask in asks {
            let (_, found) = ask.await.unwrap();
            assert_eq!(found.unwrap().unwrap().restock_gen, 0);
        }
        assert_eq!(lookups.running_now(), 0);
    }
}

#[cfg(test)]
mod gone {
    use super::*;

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn a_look_up_whose_buyers_all_left_ends_and_is_not_handed_on(pool: PgPool) {
        // Arrange: a look-up that waits on a held table; its only buyer leaves.
        let mut held = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE products IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *held)
            .await
            .unwrap();
        let lookups = Arc::new(Lookups::new(pool.clone()));
        let id = ProductId::parse("1").unwrap();
        let asked = {
            let lookups = Arc::clone(&lookups);
            tokio::spawn(async move { lookups.find(id).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        asked.abort();
        held.rollback().await.unwrap();
        // TIMING: the abandoned look-up ends (finding nothing) as soon as the lock goes; two
        // seconds are plenty. Only then is the product made.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        sqlx::query("INSERT INTO products (id, name, stock) VALUES (1, 'Late', 1)")
            .execute(&pool)
            .await
            .unwrap();

        // Act
        let (_, found) = lookups.find(id).await;

        // Assert: the next buyer got a read of their own, which sees the product (the
        // abandoned look-up, left half done, would have been resumed and answered "missing").
        assert!(found.unwrap().is_some());
    }
}
