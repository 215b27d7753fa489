//! The purchase path.
//!
//! 1. `catalog`: is the product known to exist, and is it sold out (from memory)? Unknown
//!    products and sold-out answers never reach a desk, a lock or Redis.
//! 2. `desk`: the purchase queues at its product's desk, where one leader task per
//!    instance sells batches of purchases, each in one transaction ([`fenced`] under a
//!    lock of ours, [`batch`] otherwise). Under a lock, the batches of several products
//!    that are ready at once are written by one statement ([`writer`]).
//! 3. The strategy decides how batches of different instances are kept apart ([`exclusion`],
//!    which also connects each lock backend at start-up):
//!
//! | strategy | what keeps two instances' batches apart | write path |
//! |---|---|---|
//! | `redis` | the Redis lock `lock_sale_<id>`, and a fence checked by PostgreSQL | [`fenced`] |
//! | `redlock` | the same lock on a majority of independent Redis masters, same fence | [`fenced`] |
//! | `pg-lock` | the same lock in PostgreSQL's lock table (the seed's database lock), same fence | [`fenced`] |
//! | `zookeeper` | the same lock in ZooKeeper, fenced with the holder node's creation zxid | [`fenced`] |
//! | `etcd` | the same lock in etcd, fenced with the holder key's create revision | [`fenced`] |
//! | `pg-row` | `SELECT ... FOR UPDATE` on the product row | [`batch::Step::RowLock`] |
//! | `pg-optimistic` | a version compare-and-set, retried a bounded number of times | [`batch::Step::Optimistic`] |
//! | `pg-atomic` | one guarded `UPDATE ... WHERE stock >= sold` | [`batch::Step::Atomic`] |
//! | `none` | nothing: unsafe on purpose, to show the lost update | [`batch::Step::Unsafe`] |
//!
//! `restocks` carries restock news between instances; `lost_answers` finds out what a
//! purchase whose commit answer was lost did.

pub mod batch;
pub(crate) mod catalog;
pub(crate) mod desk;
pub mod exclusion;
pub mod fenced;
pub(crate) mod lookups;
mod lost_answers;
pub(crate) mod restocks;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::{Instant, timeout_at};
use tracing::Instrument;

use crate::domain::{ProductId, Quantity, UserId};
use crate::metrics::{Metrics, PurchaseCounters};
use crate::repository::{self, SessionBounds, StockSeen};
use crate::settings::LockStrategy;
use catalog::{Catalog, ForPurchase, Known, Opening};
use desk::{Desk, DeskShared};
pub use exclusion::Exclusion;
use restocks::Restocks;

/// One purchase, checked.
#[derive(Debug, Clone, Copy)]
pub struct PurchaseRequest {
    pub product_id: ProductId,
    pub user_id: UserId,
    pub quantity: Quantity,
}

/// A recorded order, and the stock its batch left.
#[derive(Debug, Clone, Copy)]
pub struct Bought {
    pub order_id: i64,
    pub left: StockSeen,
}

/// Why a purchase did not happen. Cheap to clone: one batch's error goes to every buyer in it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PurchaseError {
    #[error("no such product")]
    NotFound,
    /// Sold out; with the stock the batch saw, when a batch decided it.
    #[error("sold out")]
    SoldOut(Option<StockSeen>),
    /// With the stock the batch saw, when a batch decided it (a sell-out it teaches too).
    #[error("this user already bought this product")]
    AlreadyPurchased(Option<StockSeen>),
    /// The product's sale has not opened yet (`on_sale_at`, on the database's clock).
    #[error("the sale of this product has not opened yet")]
    NotOpen,
    /// The queue is full, or the buyer's turn did not come in time.
    #[error("too many buyers at once; try again")]
    Busy,
    /// Our lease ran out before we could write; the fence turned the write away.
    #[error("the purchase lost its lock before it could write; nothing was recorded")]
    LockLost,
    #[error("redis: {0}")]
    Redis(Arc<redis::RedisError>),
    /// The lock service could not decide (a Redlock majority unreachable).
    #[error("lock service: {0}")]
    LockService(Arc<distlock::Error>),
    #[error("database: {0}")]
    Database(Arc<sqlx::Error>),
    /// The batch's commit may or may not have happened: its answer was lost with the
    /// connection, or the batch ran past its time bound while a statement that could commit
    /// was in flight. The order lookup tells.
    #[error("the purchase may or may not have been recorded")]
    OutcomeUnknown,
    #[error("{0}")]
    Internal(String),
}

impl From<sqlx::Error> for PurchaseError {
    /// The database's refusal of orders before the opening (SQLSTATE `SK409`, raised by the
    /// `orders_only_once_on_sale` trigger) is [`PurchaseError::NotOpen`]; the rest are
    /// database errors.
    fn from(error: sqlx::Error) -> Self {
        if repository::is_not_open(&error) {
            PurchaseError::NotOpen
        } else {
            PurchaseError::Database(Arc::new(error))
        }
    }
}

impl PurchaseError {
    /// The label used in metrics and logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            PurchaseError::NotFound => "not_found",
            PurchaseError::SoldOut(_) => "sold_out",
            PurchaseError::NotOpen => "not_open",
            PurchaseError::AlreadyPurchased(_) => "already_purchased",
            PurchaseError::Busy => "busy",
            PurchaseError::LockLost => "lock_lost",
            PurchaseError::Redis(_) | PurchaseError::LockService(_) => "redis_unavailable",
            PurchaseError::Database(_) => "database_error",
            PurchaseError::OutcomeUnknown => "outcome_unknown",
            PurchaseError::Internal(_) => "internal",
        }
    }
}

/// Everything a purchase needs; built once at start-up and shared by all workers.
pub struct Sale {
    pub pool: PgPool,
    /// Admin writes, on connections of their own ([`SaleParts::admin_pool`]).
    pub admin_pool: PgPool,
    /// Public reads, on connections of their own.
    pub reads: crate::reads::Reads,
    /// `MAX_QUANTITY`: the largest quantity one purchase may ask for.
    pub max_quantity: u32,
    /// Limits on every transaction the service opens.
    pub bounds: SessionBounds,
    pub strategy: LockStrategy,
    pub metrics: Metrics,
    catalog: Arc<Catalog>,
    /// First look-ups of products this instance does not know yet.
    lookups: lookups::Lookups,
    /// See [`SaleParts::answers_pool`].
    answers_pool: PgPool,
    desks: Arc<DeskShared>,
    restocks: Restocks,
    /// `LOCK_WAIT_MS`: how long a buyer may wait at the desk.
    wait: Duration,
    /// The purchase metrics, resolved once (a label lookup per request costs a hash).
    counted: PurchaseCounters,
}

/// How a [`Sale`] is put together (see [`crate::startup`]).
pub struct SaleParts {
    pub pool: PgPool,
    /// For public reads (`DATABASE_READ_CONNECTIONS`): never the sale's connections.
    pub reads_pool: PgPool,
    /// For admin writes (a few connections): an admin tool that retries in a loop, or twins
    /// queued on an idempotency key's lock, wait for these and never take a connection the
    /// sale needs.
    pub admin_pool: PgPool,
    /// For reading a product this instance does not know yet (its first purchase here), and
    /// its opening (a few connections): never behind a flood of public reads.
    pub lookups_pool: PgPool,
    /// For reading a restock's generation after news of it (one connection): forged news
    /// can make it busy, and nothing else waits on it.
    pub restock_reads_pool: PgPool,
    /// For lock holders' batches: sessions that keep one generic plan per statement, on
    /// the indexes ([`crate::startup`]).
    pub holders_pool: PgPool,
    /// For finding out what a purchase whose commit answer was lost did (a few
    /// connections): never behind the sale's own.
    pub answers_pool: PgPool,
    pub strategy: LockStrategy,
    pub exclusion: Exclusion,
    pub metrics: Metrics,
    pub redis_source: crate::redis_link::RedisSource,
    pub redis: crate::redis_link::RedisLink,
    pub key_prefix: String,
    /// The database's deployment id, which names the restock channel.
    pub deployment: String,
    pub batch_max: usize,
    pub queue_max: usize,
    pub hold: Duration,
    pub work: Duration,
    pub wait: Duration,
    pub sold_out_recheck: Duration,
    pub bounds: SessionBounds,
    pub max_quantity: u32,
    /// The longest a batch may take (see the desk).
    pub batch_timeout: Duration,
}

impl Sale {
    /// Put the sale together; starts listening for restock news in the background.
    pub fn new(parts: SaleParts) -> Self {
        let catalog = Arc::new(Catalog::new(parts.sold_out_recheck));
        let restocks = Restocks::start(
            parts.redis_source,
            &parts.key_prefix,
            &parts.deployment,
            parts.redis,
            Arc::downgrade(&catalog),
            parts.restock_reads_pool,
        );
        let desks = Arc::new(DeskShared {
            pool: parts.pool.clone(),
            writer: writer::HolderWriter::start(
                parts.holders_pool.clone(),
                parts.batch_timeout,
                parts.metrics.clone(),
            ),
            holders_pool: parts.holders_pool,
            bounds: parts.bounds,
            exclusion: parts.exclusion,
            key_prefix: parts.key_prefix,
            batch_max: parts.batch_max,
            queue_max: parts.queue_max,
            hold: parts.hold,
            work: parts.work,
            batch_timeout: parts.batch_timeout,
            runtime: tokio::runtime::Handle::current(),
            metrics: parts.metrics.clone(),
        });
        let counted = PurchaseCounters::new(&parts.metrics, parts.strategy);
        Self {
            counted,
            max_quantity: parts.max_quantity,
            reads: crate::reads::Reads::new(parts.reads_pool),
            pool: parts.pool,
            admin_pool: parts.admin_pool,
            bounds: parts.bounds,
            strategy: parts.strategy,
            metrics: parts.metrics,
            catalog,
            lookups: lookups::Lookups::new(parts.lookups_pool),
            answers_pool: parts.answers_pool,
            desks,
            restocks,
            wait: parts.wait,
        }
    }

    /// How batches are kept apart (for readiness checks of the lock service).
    pub fn exclusion(&self) -> &Exclusion {
        &self.desks.exclusion
    }

    /// Whether restock news from other instances is being heard.
    pub fn hears_restocks(&self) -> bool {
        self.restocks.listening()
    }

    /// Whether `product_id` is known to be sold out, so that a purchase of it can be
    /// answered from memory before its body is parsed (then count it with
    /// [`Self::answered_sold_out`]). `false` says nothing: [`Self::purchase`] decides.
    pub fn known_sold_out(&self, product_id: ProductId) -> bool {
        self.catalog.known_sold_out(product_id)
    }

    /// Count a purchase answered `sold_out` from memory (see [`Self::known_sold_out`]),
    /// decided in `took`, as [`Self::purchase`] counts its own answers (neither counts the
    /// time the body took to arrive).
    pub fn answered_sold_out(&self, took: Duration) {
        self.metrics.sold_out_fast_path.inc();
        self.count_answer("sold_out", took);
    }

    /// One purchase answered with `outcome`, in `took`.
    fn count_answer(&self, outcome: &str, took: Duration) {
        self.counted.outcome(outcome).inc();
        self.counted.latency.observe(took.as_secs_f64());
    }

    /// Sell `request.quantity` units to `request.user_id`, or say why not.
    ///
    /// # Errors
    /// Every [`PurchaseError`]. None leaves anything written, with one exception no server can
    /// rule out: a commit that PostgreSQL may have carried out but whose answer was lost (with
    /// the connection, or past the batch's time bound) is [`PurchaseError::OutcomeUnknown`]
    /// (the orders and their decrement are then all there or all absent, never one without
    /// the other; `GET /api/products/{id}/orders/{user}` tells).
    ///
    /// Its span is at `debug` (`RUST_LOG=seckill=debug`): at the default `info` level the
    /// flood does not pay for formatting three fields on every purchase.
    #[tracing::instrument(name = "purchase", level = "debug", skip_all, fields(
        product_id = %request.product_id,
        user_id = request.user_id.get(),
        strategy = self.strategy.name(),
    ))]
    pub async fn purchase(&self, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
        let started = Instant::now();
        let outcome = self.purchase_uncounted(request).await;
        let label = match &outcome {
            Ok(_) => "created",
            Err(error) => error.outcome(),
        };
        self.count_answer(label, started.elapsed());
        outcome
    }

    async fn purchase_uncounted(&self, request: PurchaseRequest) -> Result<Bought, PurchaseError> {
        let product = match self.catalog.for_purchase(request.product_id) {
            // Answered from memory (most such purchases never get here: the sold-out lane
            // answers them before the router).
            Some(ForPurchase::SoldOut) => {
                self.metrics.sold_out_fast_path.inc();
                return Err(PurchaseError::SoldOut(None));
            }
            Some(ForPurchase::Open(product)) => product,
            None => self.look_up(request.product_id).await?,
        };
        let opening = self.check_open(request.product_id, &product).await?;
        let deadline = Instant::now() + self.wait;
        let answer = match product.desk.submit(
            request,
            deadline,
            self.desks.queue_max,
            &self.metrics,
        ) {
            Err(PurchaseError::Internal(why)) => {
                // The desk's leader is gone (it should never end): open a new desk next time.
                tracing::error!(product_id = %request.product_id, %why, "reopening the product's desk");
                self.catalog.forget(request.product_id, &product);
                return Err(PurchaseError::Internal(why));
            }
            other => other?,
        };
        // The leader answers every buyer by its deadline; the extra bound covers a leader that
        // is stuck in a batch PostgreSQL does not answer.
        let outcome = match timeout_at(deadline + self.desks.batch_timeout, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => {
                // The leader died with the purchase (a bug): its batch may have committed.
                // The next purchase gets a new desk (`Catalog::for_purchase`).
                tracing::error!(product_id = %request.product_id, "the desk dropped a purchase");
                Err(PurchaseError::OutcomeUnknown)
            }
            // The leader is stuck in a batch that may still commit.
            Err(_) => Err(PurchaseError::OutcomeUnknown),
        };
        let outcome = match outcome {
            Err(PurchaseError::OutcomeUnknown) => {
                let queued_at = deadline - self.wait;
                let until = deadline + self.desks.batch_timeout;
                lost_answers::find_out(&self.answers_pool, &self.metrics, request, queued_at, until)
                    .await
            }
            other => other,
        };
        let seen = match &outcome {
            Ok(bought) => Some(bought.left),
            Err(PurchaseError::SoldOut(seen) | PurchaseError::AlreadyPurchased(seen)) => *seen,
            Err(_) => None,
        };
        if let Some(seen) = seen.filter(|seen| seen.stock == 0) {
            product.mark_sold_out(seen.restock_gen);
        }
        if let Err(PurchaseError::NotOpen) = outcome
            && opening == Opening::Open
        {
            // The database refused what this instance thought open (an admin moved the
            // opening later): read it again before the next purchase goes to the desk. (A
            // purchase that went on with the opening unknown leaves it to the read under way.)
            product.forget_opening();
        }
        outcome
    }

    /// Refuse a purchase that comes before the product's opening as this instance knows it,
    /// without a queue, a lock or a key; an opening not read for [`catalog::OPENING_RECHECK`]
    /// is read again first. The database decides at the write: this instance's estimate errs
    /// early by at most the round trip of the read it came from, never late, so no purchase
    /// after the opening is refused here. Nor is one while the opening is unknown here (another
    /// purchase's read of it is under way, or failed): it goes on, and the database decides.
    ///
    /// Returns what the purchase went on by: [`Opening::Open`] or [`Opening::Unknown`].
    async fn check_open(
        &self,
        id: ProductId,
        product: &Arc<Known>,
    ) -> Result<Opening, PurchaseError> {
        if product.opening() == Opening::Open {
            return Ok(Opening::Open);
        }
        if let Some(generation) = product.claim_opening_read() {
            // A read of its own: one already running may be from before the change that
            // made this claim (one claim per generation: one read at a time per product).
            // It runs and is stored in a task of its own: a buyer who goes away (a
            // disconnect drops this future) leaves the read to finish, not a claim held
            // with the opening unknown.
            let read = self.lookups.read_now(id);
            let known = Arc::clone(product);
            let found = tokio::spawn(
                async move {
                    let (read_at, found) = read.await;
                    if let Ok(Some(found)) = &found {
                        known.set_opening(read_at, found.opens_in_us, generation);
                    }
                    found
                }
                .instrument(tracing::Span::current()),
            )
            .await
            // The task panicked, or the runtime is shutting down.
            .unwrap_or_else(|_| Err(Arc::new(sqlx::Error::WorkerCrashed)));
            let Some(found) = found.map_err(PurchaseError::Database)? else {
                return Err(PurchaseError::NotFound);
            };
            // A read that found it open lets this purchase go on, stored or not. One that
            // found it closed refuses only if it was stored: news of a change that came while
            // it ran (this instance's own included) keeps it from being stored, and leaves
            // the opening unknown.
            if found.opens_in_us <= 0 {
                return Ok(Opening::Open);
            }
        }
        match product.opening() {
            Opening::NotYet => Err(PurchaseError::NotOpen),
            known => Ok(known),
        }
    }

    /// A product this instance does not know yet, if it exists: one look-up in PostgreSQL
    /// per product at a time, on connections of its own ([`lookups`]). An id found missing is
    /// remembered so for a moment ([`catalog::MISSING_FOR`]): a flood of unknown ids costs a
    /// look-up per id per moment.
    async fn look_up(&self, id: ProductId) -> Result<Arc<Known>, PurchaseError> {
        if self.catalog.known_missing(id) {
            return Err(PurchaseError::NotFound);
        }
        let (read_at, found) = self.lookups.find(id).await;
        let Some(found) = found.map_err(PurchaseError::Database)? else {
            self.catalog.remember_missing(id);
            return Err(PurchaseError::NotFound);
        };
        let known = self.catalog.remember(id, found.restock_gen, || {
            Desk::open(id, Arc::clone(&self.desks))
        });
        // The look-up may have begun before an admin moved the opening (news of a move is
        // dropped for a product not known yet): a closed opening is read again within
        // `OPENING_RECHECK`, an open one at the database's refusal.
        if let Some(generation) = known.claim_opening_read() {
            known.set_opening(read_at, found.opens_in_us, generation);
        }
        Ok(known)
    }

    /// A product was created here: purchases and reads of its id here need not wait out a
    /// miss remembered before (other instances may, for up to a second).
    pub fn created(&self, id: ProductId) {
        self.catalog.forget_missing(id);
        self.reads.forget(id);
    }

    /// An admin moved the opening of `id`: read it again before its next purchase here, and
    /// tell the other instances to (by the restock channel; without it they read it again
    /// within [`catalog::OPENING_RECHECK`] while they think it closed, and at the database's
    /// refusal while they think it open).
    pub fn opening_changed(&self, id: ProductId) {
        self.catalog.forget_opening(id);
        self.restocks.publish_opening(id);
        self.reads.forget(id);
    }

    /// A restock of `id` committed, starting restock generation `generation`: reopen it here
    /// at once, and tell the other instances.
    pub fn restocked(&self, id: ProductId, generation: i64) {
        self.catalog.reopen(id, generation);
        self.restocks.publish(id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::PurchaseError;
    use crate::metrics::{Metrics, PurchaseCounters};
    use crate::settings::LockStrategy;

    /// The purchase path counts each outcome on a counter resolved at start-up: a label
    /// missing from `PurchaseCounters` would panic there.
    #[test]
    fn every_outcome_has_its_counter() {
        let counters = PurchaseCounters::new(&Metrics::new(), LockStrategy::Redis);
        let redis = redis::RedisError::from(std::io::Error::other("down"));
        let errors = [
            PurchaseError::NotFound,
            PurchaseError::SoldOut(None),
            PurchaseError::NotOpen,
            PurchaseError::AlreadyPurchased(None),
            PurchaseError::Busy,
            PurchaseError::LockLost,
            PurchaseError::Redis(Arc::new(redis)),
            PurchaseError::LockService(Arc::new(distlock::Error::InvalidOptions("x".into()))),
            PurchaseError::Database(Arc::new(sqlx::Error::PoolTimedOut)),
            PurchaseError::OutcomeUnknown,
            PurchaseError::Internal("bug".into()),
        ];
        for error in &errors {
            // An exhaustive match: a new variant must be added to the list above.
            match error {
                PurchaseError::NotFound
                | PurchaseError::SoldOut(_)
                | PurchaseError::NotOpen
                | PurchaseError::AlreadyPurchased(_)
                | PurchaseError::Busy
                | PurchaseError::LockLost
                | PurchaseError::Redis(_)
                | PurchaseError::LockService(_)
                | PurchaseError::Database(_)
                | PurchaseError::OutcomeUnknown
                | PurchaseError::Internal(_) => {}
            }
            counters.outcome(error.outcome()).inc();
        }
        counters.outcome("created").inc();
    }
}
