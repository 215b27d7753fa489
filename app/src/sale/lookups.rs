//! Finding a product this instance does not know yet, for its first purchase here: one
//! PostgreSQL look-up per product at a time, on connections of its own.
//!
//! A sale's opening sends thousands of first purchases of one product to every instance at
//! once; each instance reads the product once, and every purchase that comes while that read
//! runs waits for it. The read has its own small pool: a flood of public reads (order
//! look-ups, a product's books) waits on the reads' pool and cannot make a new product's
//! first buyers wait behind it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::domain::ProductId;
use crate::repository::{self, ForSale};

/// What a look-up found, and when it started (the opening it reads is measured from then).
pub(crate) type Found = (Instant, Result<Option<ForSale>, Arc<sqlx::Error>>);

type Running = Shared<BoxFuture<'static, Found>>;

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
    /// one. A caller that goes away leaves the look-up to the others (or to the next caller,
    /// who takes it over where it stands).
    pub(crate) async fn find(&self, id: ProductId) -> Found {
        let running = self
            .running()
            .entry(id)
            .or_insert_with(|| {
                let pool = self.pool.clone();
                async move {
                    let started = Instant::now();
                    (
                        started,
                        repository::find_product(&pool, id).await.map_err(Arc::new),
                    )
                }
                .boxed()
                .shared()
            })
            .clone();
        let found = running.clone().await;
        // Done: the next caller reads again (unless another look-up took this one's place).
        let mut all = self.running();
        if all.get(&id).is_some_and(|now| now.ptr_eq(&running)) {
            all.remove(&id);
        }
        found
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
        // TIMING: the ten reach `find` well within this on any machine.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        held.rollback().await.unwrap();

        // Assert: one session waited, and every buyer got the one answer.
        assert_eq!(waiting, 1);
        for ask in asks {
            let (_, found) = ask.await.unwrap();
            assert_eq!(found.unwrap().unwrap().restock_gen, 0);
        }
        assert_eq!(lookups.running_now(), 0);
    }
}
