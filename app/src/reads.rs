//! Public reads, kept off the sale's connections: the product's books (`GET
//! /api/products/{id}`) and order look-ups run on a pool of their own
//! (`DATABASE_READ_CONNECTIONS`), and the books of a product are served from memory for up
//! to [`BOOKS_FOR`] after they were read, one read at a time per product (who comes during a
//! read waits for it). A flood of reads then costs PostgreSQL one read per product per
//! [`BOOKS_FOR`] and per instance, and never takes a connection a batch needs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use crate::domain::ProductId;
use crate::repository::{self, Order, ProductSales};

/// How long the books of a product, as last read, are served without asking again: the
/// books a reader sees are at most this old.
pub const BOOKS_FOR: Duration = Duration::from_secs(1);

/// The most products whose books are remembered; beyond it the memory starts again.
const MAX_BOOKS: usize = 10_000;

/// The read side of the API.
pub struct Reads {
    pool: PgPool,
    /// Books by product, with when they were read, and the product's turn to read them.
    books: Mutex<HashMap<ProductId, Books>>,
    /// Reads of the books made in PostgreSQL.
    reads_made: AtomicU64,
}

/// What is remembered of one product's books.
#[derive(Default)]
struct Books {
    /// When they were read, and what was found (`None`: no such product).
    read: Option<(Instant, Option<ProductSales>)>,
    /// Held while they are read: whoever else wants them then waits for that read.
    reading: Arc<tokio::sync::Mutex<()>>,
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
            books: Mutex::new(HashMap::new()),
            reads_made: AtomicU64::new(0),
        }
    }

    /// The product and its books, at most [`BOOKS_FOR`] old; `None` for no such product.
    /// One read of a product's books is made at a time: readers who come while it runs wait
    /// for it, and are answered with what it read.
    ///
    /// # Errors
    /// The read's database error.
    pub async fn books(&self, id: ProductId) -> sqlx::Result<Option<ProductSales>> {
        let reading = {
            let mut memory = self.books.lock().expect("books poisoned");
            if let Some(books) = memory.get(&id).and_then(Books::fresh) {
                return Ok(books);
            }
            if memory.len() >= MAX_BOOKS && !memory.contains_key(&id) {
                memory.clear();
            }
            Arc::clone(&memory.entry(id).or_default().reading)
        };
        let _turn = reading.lock().await;
        if let Some(books) = self.remembered(id) {
            return Ok(books);
        }
        let read_at = Instant::now();
        self.reads_made.fetch_add(1, Ordering::Relaxed);
        let books = repository::product_sales(&self.pool, id).await?;
        let mut memory = self.books.lock().expect("books poisoned");
        memory.entry(id).or_default().read = Some((read_at, books.clone()));
        Ok(books)
    }

    fn remembered(&self, id: ProductId) -> Option<Option<ProductSales>> {
        let memory = self.books.lock().expect("books poisoned");
        memory.get(&id).and_then(Books::fresh)
    }

    /// Forget what was read of `id` (it was created here just now: a miss read before must
    /// not be served).
    pub fn forget(&self, id: ProductId) {
        let mut memory = self.books.lock().expect("books poisoned");
        if let Some(books) = memory.get_mut(&id) {
            books.read = None;
        }
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
