//! Public reads, kept off the sale's connections: the product's books (`GET
//! /api/products/{id}`) and order look-ups run on a pool of their own
//! (`DATABASE_READ_CONNECTIONS`), and the books of a product are served from memory for up
//! to [`BOOKS_FOR`] after they were read. A flood of reads then costs PostgreSQL one read per
//! product per [`BOOKS_FOR`] and per instance, and never takes a connection a batch needs.

use std::collections::HashMap;
use std::sync::Mutex;
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
    /// Books by product, with when they were read (`None`: no such product).
    books: Mutex<HashMap<ProductId, (Instant, Option<ProductSales>)>>,
}

impl Reads {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            books: Mutex::new(HashMap::new()),
        }
    }

    /// The product and its books, at most [`BOOKS_FOR`] old; `None` for no such product.
    ///
    /// # Errors
    /// The read's database error.
    pub async fn books(&self, id: ProductId) -> sqlx::Result<Option<ProductSales>> {
        if let Some((at, books)) = self.books.lock().expect("books poisoned").get(&id)
            && at.elapsed() < BOOKS_FOR
        {
            return Ok(books.clone());
        }
        let read_at = Instant::now();
        let books = repository::product_sales(&self.pool, id).await?;
        let mut memory = self.books.lock().expect("books poisoned");
        if memory.len() >= MAX_BOOKS {
            memory.clear();
        }
        memory.insert(id, (read_at, books.clone()));
        Ok(books)
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
