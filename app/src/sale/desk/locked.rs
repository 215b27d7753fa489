//! A desk's leader under a lock strategy: take the product's lock, sell batches while
//! buyers keep coming (up to `HOLD_MS`, or one batch while other instances want the
//! product), give the lock back, and pause briefly when others are waiting for it.

use std::sync::Arc;
use std::time::Duration;

use distlock::{Backend, Error as LockError, LockGuard, Locker, ReleaseOutcome};
use tokio::time::{Instant, sleep, timeout, timeout_at};

use super::{Leader, Order};
use crate::sale::fenced::{Holder, lock_failed, lock_key};
use crate::sale::{PurchaseError, PurchaseRequest};

/// After giving up the lock with buyers still waiting, a leader waits this long before asking
/// for it again, so that a leader of another instance, woken by the release, gets it. It
/// pauses only if, within `CONTENTION_MEMORY`, one of its own acquisitions found the lock
/// held or timed out waiting for it: another instance wants the product too. (A leader that
/// has only ever found the lock free learns of the others when it first loses the race
/// between two holds: under `redis` a fair race, the others being woken by the release
/// message; under `redlock` and `pg-lock`, whose waiters poll, one it can win many times,
/// so their buyers may wait several holds at the start of contention. Under `zookeeper` and
/// `etcd` there is no race: the lock goes to the waiters in the order they asked, so a
/// leader asking again stands behind those already waiting.)
const HANDOFF_PAUSE: Duration = Duration::from_millis(2);

/// How long a leader goes on pausing after a hold since it last found the lock held: other
/// instances' leaders often find it free in the moment between two holds.
const CONTENTION_MEMORY: Duration = Duration::from_secs(1);

/// Whether another instance wanted the lock lately: an acquisition of ours found it held, or
/// timed out, at `last_contended`, within `CONTENTION_MEMORY`.
fn wanted_elsewhere(last_contended: Option<Instant>) -> bool {
    last_contended.is_some_and(|at| at.elapsed() < CONTENTION_MEMORY)
}

impl Leader {
    /// Take the lock, sell batches while buyers keep coming (up to the hold budget),
    /// release, and start again.
    pub(super) async fn lead_locked<B: Backend>(&mut self, locker: &Locker<B>) {
        let key = lock_key(&self.shared.key_prefix, self.product);
        // When an acquisition last found the lock held by another instance.
        let mut last_contended: Option<Instant> = None;
        while self.wait_for_work().await {
            let Some(guard) = self.take_lock(locker, &key, &mut last_contended).await else {
                continue;
            };
            let still_waiting = self.sell_while_held(&guard, last_contended).await;
            self.give_back(guard).await;
            // With BATCH_MAX=1 (the per-request baseline) the leader asks again at once, as
            // every buyer used to; and so does a leader that has found the lock free for a
            // while (one instance alone, or the others idle): nobody else is waiting.
            if still_waiting && wanted_elsewhere(last_contended) && self.shared.batch_max > 1 {
                sleep(HANDOFF_PAUSE).await;
            }
        }
    }

    /// Wait for the lock until the first waiting buyer's deadline, after answering the
    /// buyers whose time is up. `None`: no lock this time (the wait ran out, and the buyers
    /// whose time is up are answered on the next call; or the lock service failed, and every
    /// waiting buyer is answered with its error).
    pub(super) async fn take_lock<B: Backend>(
        &mut self,
        locker: &Locker<B>,
        key: &str,
        last_contended: &mut Option<Instant>,
    ) -> Option<LockGuard<B>> {
        self.take_queued();
        self.answer_overdue();
        let until = self.waiting.iter().map(|o| o.deadline).min()?;
        let asked = Instant::now();
        let guard = match timeout_at(until, locker.acquire(key)).await {
            Ok(Ok(guard)) => guard,
            Err(_) | Ok(Err(LockError::Timeout { .. })) => {
                *last_contended = Some(Instant::now());
                return None;
            }
            Ok(Err(error)) => {
                let error = lock_failed(error);
                tracing::warn!(%error, product_id = %self.product, "cannot take the lock");
                self.answer_all_waiting(error);
                return None;
            }
        };
        let metrics = &self.shared.metrics;
        metrics
            .lock_wait_seconds
            .observe(asked.elapsed().as_secs_f64());
        metrics.lock_acquisitions.inc();
        if guard.was_contended() {
            *last_contended = Some(Instant::now());
        }
        Some(guard)
    }

    /// Sell batches under `guard` while buyers keep coming and the hold lasts; whether
    /// buyers are still waiting when it ends.
    pub(super) async fn sell_while_held<B: Backend>(
        &mut self,
        guard: &LockGuard<B>,
        last_contended: Option<Instant>,
    ) -> bool {
        let held_since = Instant::now();
        let shared = Arc::clone(&self.shared);
        let mut holder = Holder::new(&shared.holders_pool, &shared.metrics, guard, self.product)
            .writing_through(&shared.writer);
        let mut batches = 0;
        let still_waiting = loop {
            let batch = self.take_batch();
            if batch.is_empty() {
                break false;
            }
            batches += 1;
            let lost = self.sell_held_batch(&mut holder, batch).await;
            // While other instances want the product, one batch per hold: their queues
            // fill meanwhile, and each of their batches carries more buyers than a second
            // batch of ours would (the buyers who came while ours was sold).
            if lost
                || shared.batch_max == 1
                || wanted_elsewhere(last_contended)
                || held_since.elapsed() >= shared.hold
                || !guard.is_held()
            {
                break self.has_work();
            }
        };
        shared.metrics.batches_per_hold.observe(f64::from(batches));
        still_waiting
    }

    /// Sell one batch through `holder` and answer its buyers; whether the lock was found
    /// lost.
    pub(super) async fn sell_held_batch<B: Backend>(
        &self,
        holder: &mut Holder<'_, LockGuard<B>>,
        batch: Vec<Order>,
    ) -> bool {
        if !self.shared.work.is_zero() {
            // Outside any transaction: a holder that stalls here holds no row lock.
            sleep(self.shared.work).await;
        }
        let requests: Vec<PurchaseRequest> = batch.iter().map(|o| o.request).collect();
        let selling = holder.sell(&requests);
        let writing = Instant::now();
        let answers = timeout(self.shared.batch_timeout, selling)
            .await
            // Cut short with its statement in flight: it may still commit.
            .unwrap_or_else(|_| vec![Err(PurchaseError::OutcomeUnknown); requests.len()]);
        self.shared
            .metrics
            .phases
            .write
            .observe(writing.elapsed().as_secs_f64());
        let lost = answers
            .iter()
            .any(|a| matches!(a, Err(PurchaseError::LockLost)));
        self.answer(batch, answers);
        lost
    }

    /// Count the hold's renewals and give the lock back; a lock found lost is counted.
    pub(super) async fn give_back<B: Backend>(&self, guard: LockGuard<B>) {
        let metrics = &self.shared.metrics;
        metrics.lock_renewals.inc_by(guard.renewals());
        match guard.release().await {
            Ok(ReleaseOutcome::Released) => {}
            Ok(lost) => {
                metrics.locks_lost.inc();
                tracing::warn!(product_id = %self.product, %lost, "the lock was lost while selling; the fence kept the data safe");
            }
            Err(error) => {
                tracing::warn!(%error, "could not release the lock; its lease will free it")
            }
        }
    }
}
