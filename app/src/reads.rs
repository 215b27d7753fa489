//! Public reads, kept off the sale's connections: the product's books (`GET
//! /api/products/{id}`) and order look-ups run on a pool of their own
//! (`DATABASE_READ_CONNECTIONS`), and the books of a product are served from memory for up
//! to [`BOOKS_FOR`] after a read ended, one read at a time per product (who comes during a
//! read gets what it read). A flood of reads then costs PostgreSQL one read per product per
//! [`BOOKS_FOR`] and per instance, and never takes a connection a batch needs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::domain::ProductId;
use crate::repository::{self, Order, ProductSales};

/// How long the books of a product, as last read, are served without asking again: the
/// books a reader sees were read at most this long ago (plus the read's own time).
pub const BOOKS_FOR: Duration = Duration::from_secs(1);

/// The most products whose books are remembered; beyond it the memory starts again.
const MAX_BOOKS: usize = 10_000;

/// The read side of the API.
pub struct Reads {
    pool: PgPool,
    /// Books by product: what was last read, and the read under way.
    books: Arc<Mutex<HashMap<ProductId, Books>>>,
    /// Reads of the books made in PostgreSQL.
    reads_made: Arc<AtomicU64>,
}

/// A read of one product's books, shared by everyone who asked while it ran. It runs in a
/// task of its own, to the end, whoever still waits for it.
type Read = Shared<BoxFuture<'static, Result<Option<ProductSales>, Arc<sqlx::Error>>>>;

/// What is remembered of one product's books.
#[derive(Default)]
struct Books {
    /// When the last read ended, and what it found (`None`: no such product).
    read: Option<(Instant, Option<ProductSales>)>,
    /// The read under way, if any, with its number.
    reading: Option<(u64, Read)>,
}

impl Books {
    fn fresh(&self) -> Option<Option<ProductSales>> {
        self.read
            .as_ref()
            .filter(|(at, _)| at.elapsed() < BOOKS_FOR)
            .map(|(_, books)| books.clone())
    }
}

impl Reads {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            books: Arc::default(),
            reads_made: Arc::default(),
        }
    }

    /// The product and its books, read at most [`BOOKS_FOR`] ago; `None` for no such
    /// product. One read of a product's books runs at a time: who asks while it runs gets
    /// what it read, or its error.
    ///
    /// # Errors
    /// The read's database error.
    pub async fn books(&self, id: ProductId) -> Result<Option<ProductSales>, Arc<sqlx::Error>> {
        let read = {
            let mut memory = self.books.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(books) = memory.get(&id).and_then(Books::fresh) {
                return Ok(books);
            }
            if memory.len() >= MAX_BOOKS && !memory.contains_key(&id) {
                memory.clear();
            }
            let books = memory.entry(id).or_default();
            match &books.reading {
                Some((_, read)) => read.clone(),
                None => {
                    let (number, read) = self.read(id);
                    books.reading = Some((number, read.clone()));
                    read
                }
            }
        };
        read.await
    }

    /// Start a read of `id`'s books, and its number. When it ends, what it found is
    /// remembered and it is no longer under way, unless the product was forgotten meanwhile
    /// (the entry is another read's now, or gone). The caller holds the memory's lock, so the
    /// read cannot end before the caller has written it down.
    fn read(&self, id: ProductId) -> (u64, Read) {
        let (pool, memory) = (self.pool.clone(), Arc::clone(&self.books));
        let number = self.reads_made.fetch_add(1, Ordering::Relaxed);
        let task = tokio::spawn(async move {
            let outcome = repository::product_sales(&pool, id).await.map_err(Arc::new);
            let mut memory = memory.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(books) = memory.get_mut(&id)
                && books.reading.as_ref().is_some_and(|(n, _)| *n == number)
            {
                books.reading = None;
                if let Ok(found) = &outcome {
                    books.read = Some((Instant::now(), found.clone()));
                }
            }
            outcome
        });
        let memory = Arc::clone(&self.books);
        let read = async move {
            task.await.unwrap_or_else(|_| {
                // The task panicked or was cancelled before it could say the read is over:
                // say it here, so the next reader reads again instead of getting this error.
                let mut memory = memory.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(books) = memory.get_mut(&id)
                    && books.reading.as_ref().is_some_and(|(n, _)| *n == number)
                {
                    books.reading = None;
                }
                Err(Arc::new(sqlx::Error::WorkerCrashed))
            })
        };
        (number, read.boxed().shared())
    }

    /// Forget what was read of `id` (it was created here just now: a miss read before must
    /// not be served). A read under way is left to end, and is not remembered.
    pub fn forget(&self, id: ProductId) {
        self.books
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// How many reads of the books were made in PostgreSQL.
    pub fn reads_made(&self) -> u64 {
        self.reads_made.load(Ordering::Relaxed)
    }

    /// The read connections.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The buyer's order of the product, read now.
    ///
    /// # Errors
    /// The read's database error.
    pub async fn order_of(&self, product: ProductId, user: i64) -> sqlx::Result<Option<Order>> {
        repository::order_of(&self.pool, product, user).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn readers_who_come_while_the_books_are_read_wait_for_that_read(pool: PgPool) {
        // Arrange: a product whose books take a scan of 200,000 orders.
        let id: i64 =
            sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 1) RETURNING id")
                .fetch_one(&pool)
                .await
                .unwrap();
        sqlx::query(
            "INSERT INTO orders (product_id, user_id, quantity) \
             SELECT $1, u, 1 FROM generate_series(1, 200000) AS u",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
        let reads = Arc::new(Reads::new(pool));
        let product = ProductId::parse(&id.to_string()).unwrap();

        // Act: 50 readers at once.
        let readers: Vec<_> = (0..50)
            .map(|_| {
                let reads = Arc::clone(&reads);
                tokio::spawn(async move { reads.books(product).await })
            })
            .collect();
        for reader in readers {
            let books = reader.await.unwrap().unwrap().expect("the product exists");
            assert_eq!(books.sold, 200_000);
        }

        // Assert: one read served them all (two if the machine was so slow that the first
        // one's answer was past BOOKS_FOR when the last reader got its turn).
        assert!(reads.reads_made() <= 2, "{} reads", reads.reads_made());
    }

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn a_read_slower_than_the_memory_lasts_is_still_shared_and_so_is_its_error(pool: PgPool) {
        // Arrange: a product, and its orders locked by the test, so that a read of its books
        // waits 1.5 s (longer than BOOKS_FOR).
        let id: i64 =
            sqlx::query_scalar("INSERT INTO products (name, stock) VALUES ('p', 1) RETURNING id")
                .fetch_one(&pool)
                .await
                .unwrap();
        let product = ProductId::parse(&id.to_string()).unwrap();
        let reads = Arc::new(Reads::new(pool.clone()));
        let mut lock = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *lock)
            .await
            .unwrap();

        // Act: 10 readers while the read waits; then the lock goes.
        let readers: Vec<_> = (0..10)
            .map(|_| {
                let reads = Arc::clone(&reads);
                tokio::spawn(async move { reads.books(product).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        lock.commit().await.unwrap();
        for reader in readers {
            assert!(reader.await.unwrap().unwrap().is_some());
        }

        // Assert: one read answered all ten.
        assert_eq!(reads.reads_made(), 1);

        // And a read that fails fails for everyone who waited for it, at once: a pool of one
        // connection, held by the test, that gives up after 300 ms.
        let one = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(300))
            .connect_with(pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        let held = one.acquire().await.unwrap();
        let reads = Arc::new(Reads::new(one.clone()));
        let started = Instant::now();
        let readers: Vec<_> = (0..10)
            .map(|_| {
                let reads = Arc::clone(&reads);
                tokio::spawn(async move { reads.books(product).await })
            })
            .collect();
        for reader in readers {
            assert!(reader.await.unwrap().is_err());
        }
        // TIMING: one acquire time-out (300 ms) for all; ten in a row would take 3 s.
        assert!(
            started.elapsed() < Duration::from_millis(2_000),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(reads.reads_made(), 1);
        drop(held);
    }

    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn a_product_created_after_its_id_was_read_missing_is_found_once_forgotten(pool: PgPool) {
        // Arrange: the next id is read, and found missing.
        let reads = Reads::new(pool.clone());
        let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) + 1 FROM products")
            .fetch_one(&pool)
            .await
            .unwrap();
        let product = ProductId::parse(&next.to_string()).unwrap();
        assert!(reads.books(product).await.unwrap().is_none());

        // Act: the product is created with that id, and the creating instance forgets.
        sqlx::query("INSERT INTO products (id, name, stock) VALUES ($1, 'p', 1)")
            .bind(next)
            .execute(&pool)
            .await
            .unwrap();
        reads.forget(product);

        // Assert: found at once.
        assert!(reads.books(product).await.unwrap().is_some());
    }
}
