//! One writer for the lock holders of every product of an instance: the batches that are
//! ready at the same moment, one per product, go to PostgreSQL as one statement
//! ([`repository::sell_many_as_holder`]): one round trip and one commit for all of them,
//! where a statement per product cost PostgreSQL about 2.4 times the CPU per order with
//! sixteen products (docs/performance.md). A batch that finds nothing else ready is sent
//! alone, as [`repository::sell_as_holder`], at once: nothing waits for company.
//!
//! Each product's batch is still decided by its own row (its fence, stock and version) and
//! answered to its own holder; only a product's own holder sends its batches, one at a time,
//! and a statement never carries two batches of one product. The lock stays per product: a
//! statement writes only the products whose holders sent a batch.
//!
//! [`WRITERS`] statements may be in flight at once, each on its own connection of the
//! holders' pool, so a batch goes at once when a writer is idle and otherwise waits for the
//! first to finish. A statement's batches are sorted by product, so that every such
//! statement takes its rows' locks in one order. Each statement, with the writes of its
//! batches one by one when it was refused, is bounded by the batch time-out (a database that
//! stops answering at the network level cannot hold a writer): past it every batch of the
//! statement is answered `OutcomeUnknown`. A holder that stops waiting (its batch timed out)
//! has its batch dropped if no statement has taken it yet, so nothing is written for buyers
//! it already answered; one taken may still commit, as when a holder writes alone.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::PurchaseError;
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::{self, HolderBatch, HolderWrite};

/// Statements in flight at once (each on a connection of its own).
pub(crate) const WRITERS: usize = 2;

/// The most products one statement carries.
const MOST_PRODUCTS: usize = 64;

/// What a holder's batch came to: written or not (as [`repository::sell_as_holder`] says),
/// or the error every buyer of the batch gets (`OutcomeUnknown` when the statement may have
/// committed).
pub(crate) type Written = Result<HolderWrite, PurchaseError>;

/// The instance's writer of holders' batches; cheap to clone. Its tasks end when every
/// handle is gone.
#[derive(Clone)]
pub struct HolderWriter {
    jobs: mpsc::UnboundedSender<Job>,
}

/// One holder's batch, waiting for a statement.
struct Job {
    product: ProductId,
    users: Vec<i64>,
    quantities: Vec<i32>,
    fence: i64,
    exact: Option<i64>,
    refused: Vec<i64>,
    reply: oneshot::Sender<Written>,
}

impl Job {
    fn batch(&self) -> HolderBatch<'_> {
        HolderBatch {
            users: &self.users,
            quantities: &self.quantities,
            fence: self.fence,
            exact: self.exact,
            refused: &self.refused,
        }
    }
}

/// The batches not yet taken: those that came, and those a statement left for the next
/// because it already carried their product.
struct Waiting {
    jobs: mpsc::UnboundedReceiver<Job>,
    deferred: VecDeque<Job>,
}

impl HolderWriter {
    /// Start [`WRITERS`] writing tasks on the current tokio runtime, writing on `pool` (the
    /// holders' pool), each statement bounded by `batch_timeout`, and counting their
    /// statements in `metrics`.
    pub fn start(pool: PgPool, batch_timeout: Duration, metrics: Metrics) -> Self {
        let (sender, jobs) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(Waiting {
            jobs,
            deferred: VecDeque::new(),
        }));
        for _ in 0..WRITERS {
            tokio::spawn(write_batches(
                pool.clone(),
                batch_timeout,
                Arc::clone(&waiting),
                metrics.clone(),
            ));
        }
        Self { jobs: sender }
    }

    /// Write `product`'s `batch`, with whatever other products' batches are ready.
    pub(crate) async fn write(&self, product: ProductId, batch: HolderBatch<'_>) -> Written {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            product,
            users: batch.users.to_vec(),
            quantities: batch.quantities.to_vec(),
            fence: batch.fence,
            exact: batch.exact,
            refused: batch.refused.to_vec(),
            reply,
        };
        if self.jobs.send(job).is_err() {
            // Nothing was sent.
            return Err(PurchaseError::Internal(
                "the batch writer has stopped".into(),
            ));
        }
        // A writer that stopped without an answer (the runtime shutting down) may have sent
        // the statement.
        answer.await.unwrap_or(Err(PurchaseError::OutcomeUnknown))
    }
}

/// One writing task: take what is ready, write it, answer each holder; until every handle
/// on the writer is gone.
async fn write_batches(
    pool: PgPool,
    batch_timeout: Duration,
    waiting: Arc<Mutex<Waiting>>,
    metrics: Metrics,
) {
    while let Some(jobs) = next_statement(&waiting).await {
        metrics.holder_statements.inc();
        let batches: Vec<(ProductId, HolderBatch<'_>)> =
            jobs.iter().map(|job| (job.product, job.batch())).collect();
        let still_wanted = |i: usize| !jobs[i].reply.is_closed();
        let written =
            tokio::time::timeout(batch_timeout, write_together(&pool, &batches, still_wanted))
                .await
                // Cut short with a statement in flight: it may still commit.
                .unwrap_or_else(|_| vec![Err(PurchaseError::OutcomeUnknown); batches.len()]);
        drop(batches);
        for (job, write) in jobs.into_iter().zip(written) {
            let _ = job.reply.send(write);
        }
    }
}

/// The batches of the next statement: at least one (waiting for it), then whatever else is
/// ready, one per product, at most [`MOST_PRODUCTS`]. Batches whose holder stopped waiting
/// are dropped unwritten. `None` once every handle is gone and nothing is left.
async fn next_statement(waiting: &Mutex<Waiting>) -> Option<Vec<Job>> {
    let mut waiting = waiting.lock().await;
    let Waiting { jobs, deferred } = &mut *waiting;
    let mut taken: Vec<Job> = Vec::new();
    let mut products = HashSet::new();
    let mut still_deferred = VecDeque::new();
    let mut consider = |job: Job, taken: &mut Vec<Job>, later: &mut VecDeque<Job>| {
        if job.reply.is_closed() {
            return;
        }
        if taken.len() < MOST_PRODUCTS && products.insert(job.product) {
            taken.push(job);
        } else {
            later.push_back(job);
        }
    };
    while let Some(job) = deferred.pop_front() {
        consider(job, &mut taken, &mut still_deferred);
    }
    while taken.is_empty() {
        let job = jobs.recv().await?;
        consider(job, &mut taken, &mut still_deferred);
    }
    while let Ok(job) = jobs.try_recv() {
        consider(job, &mut taken, &mut still_deferred);
    }
    *deferred = still_deferred;
    taken.sort_by_key(|job| job.product.get());
    Some(taken)
}

/// Write `batches` (one per product, sorted by product) as one statement, or one alone as
/// [`repository::sell_as_holder`]; one answer per batch, in order. A connection first, so
/// that failing to get one answers before anything is sent. When the statement is refused
/// for one product's reason and its batches go one by one, those whose holder stopped
/// waiting (`still_wanted(i)` false) are not sent.
async fn write_together(
    pool: &PgPool,
    batches: &[(ProductId, HolderBatch<'_>)],
    still_wanted: impl Fn(usize) -> bool,
) -> Vec<Written> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(error) => return vec![Err(error.into()); batches.len()],
    };
    match batches {
        [(product, batch)] => vec![
            repository::sell_as_holder(&mut conn, *product, *batch)
                .await
                .map_err(answer),
        ],
        _ => match repository::sell_many_as_holder(&mut conn, batches, still_wanted).await {
            Ok(writes) => writes
                .into_iter()
                .map(|w| match w {
                    Some(written) => written.map_err(answer),
                    // Not sent: its holder answered its buyers already and reads no answer.
                    None => Err(PurchaseError::OutcomeUnknown),
                })
                .collect(),
            Err(error) => vec![Err(answer(error)); batches.len()],
        },
    }
}

/// What a batch's buyers are told of a statement's error: `OutcomeUnknown` when it may have
/// committed, else the error's own answer.
fn answer(error: sqlx::Error) -> PurchaseError {
    if repository::may_have_committed(&error) {
        PurchaseError::OutcomeUnknown
    } else {
        error.into()
    }
}

/// A holder's batch written alone on `pool`, without a writer (tests drive a holder so).
pub(crate) async fn write_alone(
    pool: &PgPool,
    product: ProductId,
    batch: HolderBatch<'_>,
) -> Written {
    let mut written = write_together(pool, &[(product, batch)], |_| true).await;
    written.remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(product: &str) -> (Job, oneshot::Receiver<Written>) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            product: ProductId::parse(product).unwrap(),
            users: vec![1],
            quantities: vec![1],
            fence: 1,
            exact: None,
            refused: Vec::new(),
            reply,
        };
        (job, answer)
    }

    fn products(jobs: &[Job]) -> Vec<i64> {
        jobs.iter().map(|j| j.product.get()).collect()
    }

    /// A writer's queue with a batch of each of `products` sent to it, in order: its sender,
    /// the queue, and each batch's answer.
    fn queue_of(
        products: impl IntoIterator<Item = String>,
    ) -> (
        mpsc::UnboundedSender<Job>,
        Mutex<Waiting>,
        Vec<oneshot::Receiver<Written>>,
    ) {
        let (sender, jobs) = mpsc::unbounded_channel();
        let waiting = Mutex::new(Waiting {
            jobs,
            deferred: VecDeque::new(),
        });
        let answers = products
            .into_iter()
            .map(|product| {
                let (job, answer) = job(&product);
                sender.send(job).unwrap();
                answer
            })
            .collect();
        (sender, waiting, answers)
    }

    /// A statement takes what is ready, one batch per product (a second batch of a product
    /// waits for the next statement), sorted by product, and never a batch whose holder
    /// stopped waiting.
    #[tokio::test]
    async fn a_statement_takes_one_batch_per_product_and_none_nobody_waits_for() {
        let (sender, waiting, mut answers) = queue_of(["2", "1", "2", "3"].map(String::from));
        // The holder of product 3's batch stopped waiting.
        drop(answers.pop());

        let first = next_statement(&waiting).await.unwrap();
        assert_eq!(products(&first), [1, 2]);
        let (job_four, _answer) = job("4");
        sender.send(job_four).unwrap();
        let second = next_statement(&waiting).await.unwrap();
        assert_eq!(products(&second), [2, 4]);

        drop(sender);
        assert!(
            next_statement(&waiting).await.is_none(),
            "every handle gone"
        );
    }

    /// At most `MOST_PRODUCTS` batches go in one statement; the rest wait for the next.
    #[tokio::test]
    async fn a_statement_carries_at_most_its_share_of_products() {
        let (_sender, waiting, _answers) = queue_of((1..=MOST_PRODUCTS + 3).map(|p| p.to_string()));
        assert_eq!(next_statement(&waiting).await.unwrap().len(), MOST_PRODUCTS);
        assert_eq!(next_statement(&waiting).await.unwrap().len(), 3);
    }
}
