//! The purchase path: the sold-out fast path, then one of five strategies, all sharing the
//! repository code and answering with the same [`Bought`] or [`PurchaseError`].
//!
//! | strategy | module | what keeps two purchases of one product apart |
//! |---|---|---|
//! | `redis` | [`redis_lock`] | the Redis lock `lock_sale_<id>`, plus a fence checked by PostgreSQL ([`fenced`]) |
//! | `redlock` | [`redlock`] | the same lock on a majority of independent Redis masters, same fence |
//! | `pg-row` | [`pg_row`] | `SELECT ... FOR UPDATE` on the product row |
//! | `pg-optimistic` | [`pg_optimistic`] | a version compare-and-set, retried a bounded number of times |
//! | `pg-atomic` | [`pg_atomic`] | one guarded `UPDATE ... WHERE stock >= quantity` |
//! | `none` | [`no_lock`] | nothing: unsafe on purpose, to show the lost update |

pub mod fenced;
pub mod no_lock;
pub mod pg_atomic;
pub mod pg_optimistic;
pub mod pg_row;
pub mod redis_lock;
pub mod redlock;
pub mod sold_out;

use std::time::Duration;

use distlock::{Locker, Redlock};
use redis::aio::ConnectionManager;
use sqlx::{PgPool, Postgres, Transaction};
use tokio::time::Instant;

use crate::domain::{ProductId, Quantity, UserId};
use crate::metrics::Metrics;
use crate::repository::{self, StockSeen};
use crate::settings::LockStrategy;

/// One purchase, checked.
#[derive(Debug, Clone, Copy)]
pub struct PurchaseRequest {
    pub product_id: ProductId,
    pub user_id: UserId,
    pub quantity: Quantity,
}

/// A recorded order, and the stock it left.
#[derive(Debug, Clone, Copy)]
pub struct Bought {
    pub order_id: i64,
    pub left: StockSeen,
}

/// Why a purchase did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PurchaseError {
    #[error("no such product")]
    NotFound,
    #[error("sold out")]
    SoldOut(Option<StockSeen>),
    #[error("this user already bought this product")]
    AlreadyPurchased,
    /// The lock (or, for `pg-optimistic`, a winning write) did not come in time.
    #[error("too many buyers at once; try again")]
    Busy,
    /// Our lease ran out before we could write; the fence turned the write away.
    #[error("the purchase lost its lock before it could write; nothing was recorded")]
    LockLost,
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The lock service could not decide (a Redlock majority unreachable).
    #[error("lock service: {0}")]
    LockService(distlock::Error),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl PurchaseError {
    /// The label used in metrics and logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            PurchaseError::NotFound => "not_found",
            PurchaseError::SoldOut(_) => "sold_out",
            PurchaseError::AlreadyPurchased => "already_purchased",
            PurchaseError::Busy => "busy",
            PurchaseError::LockLost => "lock_lost",
            PurchaseError::Redis(_) | PurchaseError::LockService(_) => "redis_unavailable",
            PurchaseError::Database(_) => "database_error",
        }
    }
}

/// Everything a purchase needs; built once at start-up and shared by all workers.
#[derive(Clone)]
pub struct Sale {
    pub pool: PgPool,
    /// For the sold-out marks (and, through `locker`, the lock).
    pub redis: ConnectionManager,
    pub locker: Locker<ConnectionManager>,
    /// The masters of `REDLOCK_URLS`, for `LOCK_STRATEGY=redlock`.
    pub redlock: Option<Locker<Redlock<ConnectionManager>>>,
    /// `REDIS_KEY_PREFIX`, put before every Redis key.
    pub key_prefix: String,
    pub strategy: LockStrategy,
    /// `WORK_MS`: time spent inside the critical section.
    pub work: Duration,
    pub metrics: Metrics,
}

impl Sale {
    /// Sell `request.quantity` units to `request.user_id`, or say why not.
    ///
    /// # Errors
    /// Every [`PurchaseError`]. None leaves anything written, with one exception no server can
    /// rule out: a commit that PostgreSQL carried out but whose answer was lost with the
    /// connection is reported as a database error (the order and its decrement are then both
    /// there, never one without the other).
    #[tracing::instrument(name = "purchase", skip_all, fields(
        product_id = %request.product_id,
        user_id = request.user_id.get(),
        strategy = self.strategy.name(),
        fence = tracing::field::Empty,
    ))]
    pub async fn purchase(&self, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
        let started = Instant::now();
        let outcome = self.purchase_uncounted(request).await;
        let label = match &outcome {
            Ok(_) => "created",
            Err(error) => error.outcome(),
        };
        self.metrics.purchases.with_label_values(&[label]).inc();
        self.metrics
            .purchase_seconds
            .with_label_values(&[self.strategy.name()])
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    async fn purchase_uncounted(&self, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
        if sold_out::is_marked(self, request.product_id).await {
            self.metrics.sold_out_fast_path.inc();
            return Err(PurchaseError::SoldOut(None));
        }
        let outcome = match self.strategy {
            LockStrategy::Redis => redis_lock::purchase(self, request).await,
            LockStrategy::Redlock => redlock::purchase(self, request).await,
            LockStrategy::PgRow => pg_row::purchase(self, request).await,
            LockStrategy::PgOptimistic => pg_optimistic::purchase(self, request).await,
            LockStrategy::PgAtomic => pg_atomic::purchase(self, request).await,
            LockStrategy::None => no_lock::purchase(self, request).await,
        };
        let seen = match &outcome {
            Ok(bought) => Some(bought.left),
            Err(PurchaseError::SoldOut(seen)) => *seen,
            Err(_) => None,
        };
        if let Some(seen) = seen.filter(|seen| seen.stock == 0)
            && let Err(error) =
                sold_out::mark_sold(self, request.product_id, seen.restock_gen).await
        {
            tracing::warn!(%error, "could not mark the product sold out; the fast path stays off");
        }
        outcome
    }

    /// `WORK_MS` of pretend work inside the critical section.
    pub(crate) async fn work(&self) {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
    }
}

/// The common end of a purchase, once the caller has read `seen` under whatever keeps other
/// purchases away: check the stock, record the order, write the new stock, commit.
pub(crate) async fn finish(
    mut tx: Transaction<'_, Postgres>,
    request: PurchaseRequest,
    seen: StockSeen,
    fence: Option<i64>,
) -> Result<Bought, PurchaseError> {
    let quantity = i64::from(request.quantity.get());
    if seen.stock < quantity {
        return Err(PurchaseError::SoldOut(Some(seen)));
    }
    let order_id = record_order(&mut tx, request, fence).await?;
    let left = StockSeen {
        stock: seen.stock - quantity,
        restock_gen: seen.restock_gen,
    };
    repository::write_stock(&mut tx, request.product_id, left.stock).await?;
    tx.commit().await?;
    Ok(Bought { order_id, left })
}

/// Insert the order; [`PurchaseError::AlreadyPurchased`] when this user already has one.
pub(crate) async fn record_order(
    tx: &mut Transaction<'_, Postgres>,
    request: PurchaseRequest,
    fence: Option<i64>,
) -> Result<i64, PurchaseError> {
    repository::insert_order(
        tx,
        request.product_id,
        request.user_id,
        request.quantity,
        fence,
    )
    .await?
    .ok_or(PurchaseError::AlreadyPurchased)
}
