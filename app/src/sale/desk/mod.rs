//! The sale desk: one queue and one leader task per product in each instance.
//!
//! Purchases of a product queue at its desk ([`Desk::submit`]); a bounded queue, so a flood
//! beyond `QUEUE_MAX` gets an immediate 503 instead of a slow one. The leader is the only
//! task of this instance that sells the product. It takes everything waiting, up to
//! `BATCH_MAX` purchases, sells it in one transaction (under a lock strategy, usually one
//! statement: [`super::fenced`]; otherwise four round trips: [`super::batch`]) and answers
//! each buyer. There is no timer: a batch is whatever queued while the previous one was sold, so
//! nothing is added to latency at low load.
//!
//! Under a lock strategy the leader takes the product's lock once and keeps it while buyers
//! keep coming, up to `HOLD_MS`; while other instances want the product too (one of its
//! acquisitions found the lock held, or timed out, within the last second), it sells one
//! batch per hold.
//! Then it releases the lock and, if buyers are still waiting and others want it, pauses
//! briefly so another instance's leader can have its turn. Buyers queue in memory,
//! not on Redis or on the connection pool: only the leaders contend for the lock.
//!
//! A buyer who disconnected before their batch was taken is skipped; one already taken is
//! decided with the batch's attempt under way (their order, if any, can be looked up
//! afterwards); the transactional strategies leave them out of a retry (under a lock, the
//! holder retries its one statement as it was). A buyer still waiting at their deadline
//! (`LOCK_WAIT_MS` after arriving) gets 503 `busy`. A transactional batch, its retries
//! included, takes at most one batch time-out (`WORK_MS`, a demonstration setting, comes on
//! top).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, timeout_at};

use super::batch::{self, BatchError, Step};
use super::exclusion::Exclusion;
use super::{Bought, PurchaseError, PurchaseRequest};
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::SessionBounds;

mod locked;

/// A buyer's answer.
pub(crate) type Answer = Result<Bought, PurchaseError>;

/// What every desk of an instance shares.
pub(crate) struct DeskShared {
    pub(crate) pool: PgPool,
    /// Where a lock holder's batches run: its sessions keep a generic plan of the one
    /// statement, which never scans a table (see `startup::holder_sessions`).
    pub(crate) holders_pool: PgPool,
    /// Writes the lock holders' batches, several products' in one statement.
    pub(crate) writer: super::writer::HolderWriter,
    pub(crate) bounds: SessionBounds,
    pub(crate) exclusion: Exclusion,
    /// `REDIS_KEY_PREFIX`, before the lock key.
    pub(crate) key_prefix: String,
    /// `BATCH_MAX`.
    pub(crate) batch_max: usize,
    /// `QUEUE_MAX`.
    pub(crate) queue_max: usize,
    /// `HOLD_MS`.
    pub(crate) hold: Duration,
    /// `WORK_MS`, spent once per batch.
    pub(crate) work: Duration,
    /// The longest a batch may take, all statements and the pool's wait included: a
    /// PostgreSQL that stops answering at the network level (which `statement_timeout`, a
    /// server-side bound, cannot catch) fails the batch instead of holding its buyers.
    pub(crate) batch_timeout: Duration,
    /// Where leaders run: the service's main runtime, not whichever HTTP worker first saw
    /// the product.
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) metrics: Metrics,
}

/// A purchase waiting at a desk.
struct Order {
    request: PurchaseRequest,
    reply: oneshot::Sender<Answer>,
    /// When it reached the desk (for the queue phase's metric).
    arrived: Instant,
    /// When the buyer stops waiting: answered `busy` if still queued then.
    deadline: Instant,
}

/// A handle on one product's desk; cheap to clone. The leader ends when every handle is gone.
#[derive(Clone)]
pub(crate) struct Desk {
    queue: mpsc::UnboundedSender<Order>,
    /// Purchases queued and not yet taken into a batch or answered; at most `QUEUE_MAX`.
    depth: Arc<AtomicUsize>,
}

/// A batch that conflicts with a concurrent writer (see `BatchError::Conflict`) is tried at
/// most this often, and only while its one batch time-out lasts, before its buyers are told
/// busy.
const MAX_ATTEMPTS: u32 = 20;

impl Desk {
    /// Open the desk of `product` and start its leader.
    pub(crate) fn open(product: ProductId, shared: Arc<DeskShared>) -> Self {
        let (queue, orders) = mpsc::unbounded_channel();
        let depth = Arc::new(AtomicUsize::new(0));
        let leader = Leader {
            product,
            orders,
            waiting: VecDeque::new(),
            depth: Arc::clone(&depth),
            shared,
        };
        let runtime = leader.shared.runtime.clone();
        runtime.spawn(leader.run());
        Self { queue, depth }
    }

    /// A desk whose leader is gone, for tests of what holds desks.
    #[cfg(test)]
    pub(crate) fn closed() -> Self {
        let (queue, _orders) = mpsc::unbounded_channel();
        Self {
            queue,
            depth: Arc::default(),
        }
    }

    /// A desk whose leader never answers but stays, for tests of what holds desks.
    #[cfg(test)]
    pub(crate) fn parked() -> Self {
        let (queue, orders) = mpsc::unbounded_channel();
        // The receiver lives as long as the test process: the desk stays open.
        std::mem::forget(orders);
        Self {
            queue,
            depth: Arc::default(),
        }
    }

    /// Whether the desk's leader still runs. It ends only by a panic (a bug), and then takes
    /// the queue with it.
    pub(crate) fn is_open(&self) -> bool {
        !self.queue.is_closed()
    }

    /// Queue a purchase; the receiver gets its answer.
    ///
    /// # Errors
    /// [`PurchaseError::Busy`] at once when the queue is full.
    pub(crate) fn submit(
        &self,
        request: PurchaseRequest,
        deadline: Instant,
        queue_max: usize,
        metrics: &Metrics,
    ) -> Result<oneshot::Receiver<Answer>, PurchaseError> {
        if self.depth.fetch_add(1, Ordering::AcqRel) >= queue_max {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            metrics.queue_full.inc();
            return Err(PurchaseError::Busy);
        }
        let (reply, answer) = oneshot::channel();
        let order = Order {
            request,
            reply,
            arrived: Instant::now(),
            deadline,
        };
        if self.queue.send(order).is_err() {
            self.depth.fetch_sub(1, Ordering::AcqRel);
            return Err(PurchaseError::Internal(
                "the product's desk has stopped".into(),
            ));
        }
        metrics.queued.inc();
        Ok(answer)
    }
}

/// The task that sells one product for this instance.
struct Leader {
    product: ProductId,
    orders: mpsc::UnboundedReceiver<Order>,
    /// Orders taken off the channel and not yet answered.
    waiting: VecDeque<Order>,
    /// Shared with the desk's handles: how many orders are queued or waiting.
    depth: Arc<AtomicUsize>,
    shared: Arc<DeskShared>,
}

impl Leader {
    async fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        match &shared.exclusion {
            Exclusion::Redis(locker) => self.lead_locked(locker).await,
            Exclusion::Redlock(locker) => self.lead_locked(locker).await,
            Exclusion::PgLock(locker) => self.lead_locked(locker).await,
            Exclusion::ZooKeeper(locker) => self.lead_locked(locker).await,
            Exclusion::Etcd(locker) => self.lead_locked(locker).await,
            Exclusion::Transaction(step) => self.lead(*step).await,
        }
    }

    /// Sell batches back to back; the transaction is the only guard.
    async fn lead(&mut self, step: Step) {
        while self.wait_for_work().await {
            let batch = self.take_batch();
            if batch.is_empty() {
                continue;
            }
            let mut batch = batch;
            let writing = Instant::now();
            let answers = self.sell_retrying(step, &mut batch).await;
            self.shared
                .metrics
                .phases
                .write
                .observe(writing.elapsed().as_secs_f64());
            self.answer(batch, answers);
        }
    }

    /// Sell `batch`, again after each conflict, all attempts within one `batch_timeout` from
    /// the first: a buyer's answer never waits on more than one batch's worth of time, and
    /// nothing commits after the buyer was answered. Before each retry, buyers who left are
    /// taken out of `batch` (nothing is sold to them); the answers are for what is left.
    async fn sell_retrying(&self, step: Step, batch: &mut Vec<Order>) -> Vec<Answer> {
        let deadline = Instant::now() + self.shared.batch_timeout;
        let mut attempt = 0;
        loop {
            let requests: Vec<PurchaseRequest> = batch.iter().map(|o| o.request).collect();
            let all = |error: PurchaseError| vec![Err(error); requests.len()];
            let selling = batch::sell(
                &self.shared.pool,
                self.shared.bounds,
                self.product,
                step,
                &requests,
                self.shared.work,
            );
            let Ok(sold) = timeout_at(deadline, selling).await else {
                // Cut short with a statement in flight, which may have been the commit.
                return all(PurchaseError::OutcomeUnknown);
            };
            match sold {
                Ok(answers) => return answers,
                Err(BatchError::Failed(error)) => return all(error),
                Err(BatchError::Conflict) => {}
            }
            attempt += 1;
            // Jittered backoff so two instances do not collide again in lock step.
            let cap = 1u64 << attempt.min(6);
            let pause = Duration::from_millis(rand::rng().random_range(0..=cap));
            if attempt == MAX_ATTEMPTS || Instant::now() + pause >= deadline {
                return all(PurchaseError::Busy);
            }
            sleep(pause).await;
            self.forget_gone(batch);
            if batch.is_empty() {
                return Vec::new();
            }
        }
    }

    /// Take the buyers who left out of `batch`.
    fn forget_gone(&self, batch: &mut Vec<Order>) {
        let before = batch.len();
        batch.retain(|order| !order.reply.is_closed());
        let gone = before - batch.len();
        self.shared.metrics.buyers_gone.inc_by(gone as u64);
    }

    /// Wait until there is something to sell. `false` when every handle is gone.
    async fn wait_for_work(&mut self) -> bool {
        if !self.waiting.is_empty() {
            return true;
        }
        match self.orders.recv().await {
            Some(order) => {
                self.waiting.push_back(order);
                true
            }
            None => false,
        }
    }

    /// One order left the queue (taken into a batch, or answered without one).
    fn dequeued(&self) {
        self.depth.fetch_sub(1, Ordering::AcqRel);
        self.shared.metrics.queued.dec();
    }

    fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.orders.is_empty()
    }

    /// Move everything queued on the channel into `waiting`.
    fn take_queued(&mut self) {
        while let Ok(order) = self.orders.try_recv() {
            self.waiting.push_back(order);
        }
    }

    /// Up to `BATCH_MAX` live orders, in arrival order. Buyers who left are skipped; buyers
    /// past their deadline are told busy.
    fn take_batch(&mut self) -> Vec<Order> {
        let now = Instant::now();
        let mut batch = Vec::new();
        while batch.len() < self.shared.batch_max {
            let Some(order) = self
                .waiting
                .pop_front()
                .or_else(|| self.orders.try_recv().ok())
            else {
                break;
            };
            self.dequeued();
            if let Some(order) = self.still_live(order, now) {
                self.shared
                    .metrics
                    .phases
                    .queue
                    .observe(now.saturating_duration_since(order.arrived).as_secs_f64());
                batch.push(order);
            }
        }
        batch
    }

    /// `Some(order)` while its buyer waits and its deadline is ahead. Otherwise the order is
    /// done with: a buyer who left is forgotten, one whose time is up is told busy.
    fn still_live(&self, order: Order, now: Instant) -> Option<Order> {
        if order.reply.is_closed() {
            self.shared.metrics.buyers_gone.inc();
            None
        } else if order.deadline <= now {
            self.shared.metrics.lock_timeouts.inc();
            let _ = order.reply.send(Err(PurchaseError::Busy));
            None
        } else {
            Some(order)
        }
    }

    /// Tell buyers past their deadline that they waited too long; forget buyers who left.
    fn answer_overdue(&mut self) {
        let now = Instant::now();
        let mut live = VecDeque::with_capacity(self.waiting.len());
        for order in std::mem::take(&mut self.waiting) {
            match self.still_live(order, now) {
                Some(order) => live.push_back(order),
                None => self.dequeued(),
            }
        }
        self.waiting = live;
    }

    /// Give every waiting buyer the same error (the lock service is down: waiting would not help).
    fn answer_all_waiting(&mut self, error: PurchaseError) {
        self.take_queued();
        for order in std::mem::take(&mut self.waiting) {
            self.dequeued();
            let _ = order.reply.send(Err(error.clone()));
        }
    }

    fn answer(&self, batch: Vec<Order>, answers: Vec<Answer>) {
        let metrics = &self.shared.metrics;
        let answering = Instant::now();
        metrics.batch_size.observe(batch.len() as f64);
        for (order, answer) in batch.into_iter().zip(answers) {
            if answer.is_ok() {
                metrics.orders.inc();
            }
            // A buyer who left after the batch was taken still has their order, if any.
            let _ = order.reply.send(answer);
        }
        metrics
            .phases
            .answer
            .observe(answering.elapsed().as_secs_f64());
    }
}
