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
//! One statement is in flight at a time while it is quick: a batch that comes meanwhile
//! waits for it to end, and goes with every other batch that came meanwhile (a statement of
//! its own for each would make statements of one or two batches: two writers taking turns
//! carried 2.5 batches each with sixteen products, docs/performance.md). Only a statement
//! in flight for longer than [`STALLED`] (a row lock waited for, a database failing) lets a
//! second start beside it, up to [`WRITERS`], each on its own connection of the holders'
//! pool; with no statement in flight a batch goes at once, so nothing waits for company at
//! low load. A statement's batches are sorted by product, so that every such
//! statement takes its rows' locks in one order. Each statement, with the writes of its
//! batches one by one when it was refused, is bounded by the batch time-out (a database that
//! stops answering at the network level cannot hold a writer): past it every batch of the
//! statement is answered `OutcomeUnknown`. A holder that stops waiting (its batch timed out)
//! has its batch dropped if no statement has taken it yet, so nothing is written for buyers
//! it already answered; one taken may still commit, as when a holder writes alone.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Mutex, Notify, mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use super::PurchaseError;
use crate::domain::ProductId;
use crate::metrics::Metrics;
use crate::repository::{self, HolderBatch, HolderWrite};

/// Statements in flight at once, at most (each on a connection of its own).
pub(crate) const WRITERS: usize = 2;

/// How long a statement may be in flight before another may start beside it. Under load a
/// statement of sixteen products' batches takes a few ms (docs/performance.md); past this it
/// is waiting for something (a row lock, a database failing over), and the batches of other
/// products need not wait with it.
pub(crate) const STALLED: Duration = Duration::from_millis(20);

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
        let in_flight = Arc::new(InFlight::new(WRITERS));
        for writer in 0..WRITERS {
            tokio::spawn(write_batches(
                Writing {
                    writer,
                    waiting: Arc::clone(&waiting),
                    in_flight: Arc::clone(&in_flight),
                },
                pool.clone(),
                batch_timeout,
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

/// When each writer's statement was sent, while it is in flight, and word when one ends.
struct InFlight {
    /// By writer: `None` while it has no statement in flight.
    since: std::sync::Mutex<Vec<Option<Instant>>>,
    ended: Notify,
}

impl InFlight {
    fn new(writers: usize) -> Self {
        Self {
            since: std::sync::Mutex::new(vec![None; writers]),
            ended: Notify::new(),
        }
    }

    fn set(&self, writer: usize, since: Option<Instant>) {
        self.since.lock().unwrap_or_else(PoisonError::into_inner)[writer] = since;
    }

    /// `writer` sends a statement now.
    fn begin(&self, writer: usize) {
        self.set(writer, Some(Instant::now()));
    }

    /// `writer`'s statement has its answer.
    fn end(&self, writer: usize) {
        self.set(writer, None);
        self.ended.notify_waiters();
    }

    /// Wait while a statement in flight has been so for less than [`STALLED`]: until it
    /// ends, or stalls.
    async fn wait_while_one_is_quick(&self) {
        loop {
            let ended = self.ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before the look below, so that an end right after it is not missed.
            ended.as_mut().enable();
            let youngest = self
                .since
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .flatten()
                .max()
                .copied();
            let Some(stalls_at) = youngest.map(|since| since + STALLED) else {
                return;
            };
            if Instant::now() >= stalls_at {
                return;
            }
            tokio::select! {
                () = ended => {}
                () = sleep_until(stalls_at) => return,
            }
        }
    }
}

/// What one writing task shares with the others: the batches waiting, and the statements in
/// flight (its own is `in_flight`'s `writer`).
struct Writing {
    writer: usize,
    waiting: Arc<Mutex<Waiting>>,
    in_flight: Arc<InFlight>,
}

/// One writing task: take what is ready, write it, answer each holder; until every handle
/// on the writer is gone.
async fn write_batches(writing: Writing, pool: PgPool, batch_timeout: Duration, metrics: Metrics) {
    while let Some((jobs, sent)) = next_statement(&writing).await {
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
        // Before the answers: a holder answered sends its next batch at once, which need not
        // wait for this statement.
        drop(sent);
        for (job, write) in jobs.into_iter().zip(written) {
            let _ = job.reply.send(write);
        }
    }
}

/// A statement of `Writing`'s writer in flight, until dropped: its time in flight ends then,
/// in a panic's unwinding too (a start left set would read as a stall for ever, and no batch
/// would wait again).
struct Sent<'a>(&'a Writing);

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        self.0.in_flight.end(self.0.writer);
    }
}

/// The batches of the next statement, and its mark in flight: at least one batch (waiting
/// for it), and, once no other statement is quickly in flight, whatever else has come, one
/// per product, at most [`MOST_PRODUCTS`]. Batches whose holder stopped waiting are dropped
/// unwritten. `None` once every handle is gone and nothing is left.
async fn next_statement(writing: &Writing) -> Option<(Vec<Job>, Sent<'_>)> {
    let mut waiting = writing.waiting.lock().await;
    let Waiting { jobs, deferred } = &mut *waiting;
    let mut statement = Statement::default();
    for job in std::mem::take(deferred) {
        statement.consider(job);
    }
    loop {
        while statement.taken.is_empty() {
            let job = jobs.recv().await?;
            statement.consider(job);
        }
        // The statement in flight ends before this one is sent: what comes meanwhile goes
        // in this one.
        writing.in_flight.wait_while_one_is_quick().await;
        while let Ok(job) = jobs.try_recv() {
            statement.consider(job);
        }
        // A holder may have stopped waiting during the wait.
        statement.forget_abandoned();
        if !statement.taken.is_empty() {
            break;
        }
    }
    *deferred = statement.later;
    writing.in_flight.begin(writing.writer);
    let sent = Sent(writing);
    let mut taken = statement.taken;
    taken.sort_by_key(|job| job.product.get());
    Some((taken, sent))
}

/// A statement being filled: its batches, one per product, and those left for a later one.
#[derive(Default)]
struct Statement {
    taken: Vec<Job>,
    later: VecDeque<Job>,
}

impl Statement {
    /// Take `job` if its product has no batch here yet and there is room, else leave it for
    /// later; drop it if its holder stopped waiting.
    fn consider(&mut self, job: Job) {
        if job.reply.is_closed() {
            return;
        }
        let room = self.taken.len() < MOST_PRODUCTS;
        if room && self.taken.iter().all(|taken| taken.product != job.product) {
            self.taken.push(job);
        } else {
            self.later.push_back(job);
        }
    }

    /// Drop the batches whose holder stopped waiting, and take in their place any left for
    /// later of the same product.
    fn forget_abandoned(&mut self) {
        let before = self.taken.len();
        self.taken.retain(|job| !job.reply.is_closed());
        if self.taken.len() < before {
            for job in std::mem::take(&mut self.later) {
                self.consider(job);
            }
        }
    }
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

    /// Writer 0's share of a writer whose queue has a batch of each of `products` sent to
    /// it, in order: its sender, the writer, and each batch's answer.
    fn queue_of(
        products: impl IntoIterator<Item = String>,
    ) -> (
        mpsc::UnboundedSender<Job>,
        Writing,
        Vec<oneshot::Receiver<Written>>,
    ) {
        let (sender, jobs) = mpsc::unbounded_channel();
        let writing = Writing {
            writer: 0,
            waiting: Arc::new(Mutex::new(Waiting {
                jobs,
                deferred: VecDeque::new(),
            })),
            in_flight: Arc::new(InFlight::new(WRITERS)),
        };
        let answers = products
            .into_iter()
            .map(|product| send(&sender, &product))
            .collect();
        (sender, writing, answers)
    }

    fn send(sender: &mpsc::UnboundedSender<Job>, product: &str) -> oneshot::Receiver<Written> {
        let (job, answer) = job(product);
        sender.send(job).unwrap();
        answer
    }

    /// `future`'s output, or a panic if it has not come within ten stall times (time is
    /// paused in these tests: a wait that never ends fails instead of hanging).
    async fn within<F: std::future::Future>(future: F) -> F::Output {
        tokio::time::timeout(STALLED * 10, future)
            .await
            .expect("no answer within ten stall times")
    }

    /// Writer `writer`, sharing `writing`'s queue and statements in flight.
    fn sharing(writing: &Writing, writer: usize) -> Writing {
        Writing {
            writer,
            waiting: Arc::clone(&writing.waiting),
            in_flight: Arc::clone(&writing.in_flight),
        }
    }

    /// The writer that is not `writing`'s (writer 0's), sharing its queue and its
    /// statements in flight.
    fn other(writing: &Writing) -> Writing {
        sharing(writing, 1)
    }

    /// The products of `writing`'s next statement, taken in a task of its own (its mark in
    /// flight dropped at once).
    fn spawn_next(writing: Writing) -> tokio::task::JoinHandle<Option<Vec<i64>>> {
        tokio::spawn(async move {
            next_statement(&writing)
                .await
                .map(|(jobs, _)| products(&jobs))
        })
    }

    /// A statement takes what is ready, one batch per product (a second batch of a product
    /// waits for the next statement), sorted by product, and never a batch whose holder
    /// stopped waiting.
    #[tokio::test]
    async fn a_statement_takes_one_batch_per_product_and_none_nobody_waits_for() {
        let (sender, writing, mut answers) = queue_of(["2", "1", "2", "3"].map(String::from));
        // The holder of product 3's batch stopped waiting.
        drop(answers.pop());

        let (first, sent) = next_statement(&writing).await.unwrap();
        assert_eq!(products(&first), [1, 2]);
        drop(sent);
        let _answer = send(&sender, "4");
        let (second, sent) = next_statement(&writing).await.unwrap();
        assert_eq!(products(&second), [2, 4]);
        drop(sent);

        drop(sender);
        assert!(
            next_statement(&writing).await.is_none(),
            "every handle gone"
        );
    }

    /// At most `MOST_PRODUCTS` batches go in one statement; the rest wait for the next.
    #[tokio::test]
    async fn a_statement_carries_at_most_its_share_of_products() {
        let (_sender, writing, _answers) = queue_of((1..=MOST_PRODUCTS + 3).map(|p| p.to_string()));
        let (first, sent) = next_statement(&writing).await.unwrap();
        assert_eq!(first.len(), MOST_PRODUCTS);
        drop(sent);
        assert_eq!(next_statement(&writing).await.unwrap().0.len(), 3);
    }

    /// With a statement quickly in flight, the next waits for it to end and then carries
    /// every batch that came meanwhile, not only the first.
    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_for_the_statement_in_flight_and_goes_with_what_came_meanwhile() {
        let (sender, writing, _answers) = queue_of(["1"].map(String::from));
        let (first, sent) = next_statement(&writing).await.unwrap();
        assert_eq!(products(&first), [1]);

        let _two = send(&sender, "2");
        let next = spawn_next(other(&writing));
        tokio::time::sleep(STALLED / 2).await;
        assert!(!next.is_finished(), "sent beside a quick statement");
        let _three = send(&sender, "3");
        let _one_again = send(&sender, "1");
        drop(sent);
        let ended = Instant::now();
        assert_eq!(within(next).await.unwrap().unwrap(), [1, 2, 3]);
        assert_eq!(
            ended.elapsed(),
            Duration::ZERO,
            "woken by the end, not by the stall"
        );
    }

    /// A statement in flight for longer than `STALLED` does not hold the next: it goes
    /// beside it, with what is ready, once the first has been in flight that long.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_statement_does_not_hold_the_next() {
        let (sender, writing, _answers) = queue_of(["1"].map(String::from));
        let _first = next_statement(&writing).await.unwrap();
        let sent = Instant::now();

        let _two = send(&sender, "2");
        let second = other(&writing);
        let (next, _sent) = within(next_statement(&second)).await.unwrap();
        assert_eq!(products(&next), [2]);
        assert_eq!(
            sent.elapsed(),
            STALLED,
            "went when the first stalled, not before or later"
        );
    }

    /// A statement's time in flight ends when what `next_statement` returned is dropped, by
    /// a task that panics with it too: the batch waiting for it is woken then, not at the
    /// stall, and no start is left set to read as a stall for ever.
    #[tokio::test(start_paused = true)]
    async fn a_statement_cut_short_by_a_panic_still_ends_its_time_in_flight() {
        let (sender, writing, _answers) = queue_of(["1"].map(String::from));
        let first = sharing(&writing, 0);
        let (taken, took) = oneshot::channel();
        let panicking = tokio::spawn(async move {
            let (_jobs, _sent) = next_statement(&first).await.unwrap();
            taken.send(Instant::now()).unwrap();
            tokio::time::sleep(STALLED / 2).await;
            panic!("the statement's code panics (this panic is the test's)");
        });
        let sent = took.await.unwrap();
        let _two = send(&sender, "2");
        let next = spawn_next(other(&writing));

        assert_eq!(within(next).await.unwrap().unwrap(), [2]);
        assert!(panicking.await.unwrap_err().is_panic());
        assert_eq!(
            sent.elapsed(),
            STALLED / 2,
            "woken when the panicking task dropped its statement, not at the stall"
        );
        assert_eq!(writing.in_flight.since.lock().unwrap()[0], None);
    }

    /// With nothing in flight a batch goes at once; a batch whose holder stops waiting
    /// while it waits for company is not sent, and another of its product takes its place.
    #[tokio::test(start_paused = true)]
    async fn a_batch_goes_at_once_when_nothing_is_in_flight_and_abandoned_ones_stay_behind() {
        let (sender, writing, mut answers) = queue_of(["5"].map(String::from));
        let sent = Instant::now();
        let (first, in_flight) = next_statement(&writing).await.unwrap();
        assert_eq!(products(&first), [5]);
        assert_eq!(sent.elapsed(), Duration::ZERO, "nothing to wait for");

        let second = other(&writing);
        answers.push(send(&sender, "6"));
        let next = tokio::spawn(async move {
            next_statement(&second).await.map(|(jobs, _)| {
                jobs.iter()
                    .map(|job| (job.product.get(), job.users.len()))
                    .collect::<Vec<_>>()
            })
        });
        tokio::time::sleep(STALLED / 4).await;
        // Product 6's holder gives up; a second batch of 6 comes, with two buyers.
        drop(answers.pop());
        let (mut again, _answer) = job("6");
        again.users = vec![1, 2];
        sender.send(again).unwrap();
        drop(in_flight);
        let ended = Instant::now();
        assert_eq!(within(next).await.unwrap().unwrap(), [(6, 2)]);
        assert_eq!(
            ended.elapsed(),
            Duration::ZERO,
            "woken by the end, not by the stall"
        );
    }
}
