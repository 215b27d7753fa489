//! The watchdog that keeps a held lock alive, and the timetable that starts it only for a
//! hold that lasts.
//!
//! A watchdog is a tokio task for each hold that lasts until shortly before its first
//! renewal: it renews by token every `every` (a third of the ttl by default), so it can never
//! extend a lock another owner holds, and it is aborted before the release is sent (a renewal
//! already on its way may land after the release, and then finds the key gone or another
//! token in it, and changes nothing). It is the same task for every [`Backend`];
//! [`Watchdog`] is what it needs.
//!
//! Most holds end long before their first renewal is due, and a task spawned, timed and
//! aborted for each of them was an eighth of the client's work on a short uncontended hold
//! (docs/performance.md). So a hold does not spawn its watchdog: it puts it in its locker's
//! [`Timetable`] for this runtime, and its release takes it out again. One task per
//! timetable sleeps until the next watchdog is to start, a sixteenth of its interval before
//! its first renewal is due ([`head_start`]), and spawns the ones whose time has come; each
//! then sleeps until its renewal is due, as it did when spawned with the hold, so the
//! renewals come at the same times. The head start lets a hold whose renewal falls just
//! after the task's next wake-up leave the task asleep (holds come out of order by a few
//! microseconds all the time), at the price of spawning the watchdogs of holds that end
//! within that last sixteenth.
//!
//! A locker keeps a timetable per tokio runtime it takes holds on, so that a hold's watchdog
//! runs on the runtime the hold was taken on, and ends with it, as a task spawned there
//! would. A timetable whose runtime has shut down is dropped the next time the locker takes
//! a hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::{self, Handle};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::backend::{Backend, Renewal};
use crate::lease::{Lease, renew};
use crate::token::Token;

/// What the watchdog needs to renew one lock.
pub(crate) struct Watchdog<B> {
    pub(crate) backend: Arc<B>,
    pub(crate) key: String,
    pub(crate) token: Token,
    pub(crate) every: Duration,
    /// How many replicas each renewal waits for, and how long (`LockOptions::wait_for_replicas`).
    pub(crate) replicas: Option<(u32, Duration)>,
    /// When the acquire command was sent: the first renewal is due `every` after it.
    pub(crate) first_sent: Instant,
    pub(crate) lease: Arc<Lease>,
}

/// A failed renewal is retried this often until the lease runs out.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

/// How long before its first renewal is due a watchdog is started: a sixteenth of its
/// interval. See the module doc.
fn head_start(every: Duration) -> Duration {
    every / 16
}

impl<B: Backend> Watchdog<B> {
    /// When the first renewal is due.
    fn due(&self) -> Instant {
        self.first_sent + self.every
    }

    /// When the timetable starts this watchdog.
    fn start_at(&self) -> Instant {
        self.due() - head_start(self.every)
    }

    async fn run(self) {
        let mut last_sent = self.first_sent;
        loop {
            // TIMING: renewing every `ttl / 3` leaves two thirds of a lease for a renewal to
            // reach the backend, for the runtime to schedule this task, and for retries after
            // an error. Renewals are due `every` after the previous one was *sent* (the
            // lease counts from then), however long its answer took. A process paused for
            // longer (GC-like stall, SIGSTOP) loses the lock; fencing, not this task,
            // protects the data then.
            sleep_until(last_sent + self.every).await;
            loop {
                if !self.lease.is_held() {
                    return;
                }
                let _renewing = self.lease.renewing.lock().await;
                let sent = Instant::now();
                last_sent = sent;
                let left = self.lease.until().saturating_duration_since(sent);
                match timeout(
                    left,
                    renew(
                        &*self.backend,
                        &self.key,
                        &self.token,
                        &self.lease,
                        sent,
                        self.replicas,
                    ),
                )
                .await
                {
                    Ok(Ok(Renewal::Renewed)) => break,
                    Ok(Ok(_gone_or_taken)) => return,
                    Ok(Err(error)) => {
                        drop(_renewing);
                        tracing::warn!(key = %self.key, %error, "lock renewal failed; retrying");
                        let left = self.lease.until().saturating_duration_since(Instant::now());
                        sleep(RETRY_AFTER_ERROR.min(left)).await;
                    }
                    // The lease ran out while the renewal was in flight; the next turn of
                    // the loop records it.
                    Err(_elapsed) => {}
                }
            }
        }
    }
}

/// A locker's timetables, one per tokio runtime it has taken holds on; shared by the
/// locker's clones.
pub(crate) struct Watchdogs<B> {
    timetables: Mutex<Vec<Arc<Timetable<B>>>>,
}

impl<B: Backend> Watchdogs<B> {
    pub(crate) fn new() -> Self {
        Self {
            timetables: Mutex::new(Vec::new()),
        }
    }

    /// Put `watchdog` in the timetable of `runtime`, to start shortly before its first
    /// renewal is due, unless the returned ticket is cancelled (or dropped) first.
    pub(crate) fn schedule(&self, runtime: &Handle, watchdog: Watchdog<B>) -> Ticket<B> {
        let id = runtime.id();
        let timetable = {
            let mut timetables = lock(&self.timetables);
            // A runtime that has shut down took its timetable's task with it.
            timetables.retain(|t| t.alive.load(Ordering::Acquire));
            match timetables.iter().find(|t| t.runtime == id) {
                Some(timetable) => Arc::clone(timetable),
                None => {
                    let timetable = Timetable::start(runtime);
                    timetables.push(Arc::clone(&timetable));
                    timetable
                }
            }
        };
        timetable.add(watchdog)
    }
}

/// The watchdogs of one runtime's holds, waiting to start or running; and the task that
/// starts each when its time comes.
pub(crate) struct Timetable<B> {
    runtime: runtime::Id,
    table: Mutex<Table<B>>,
    /// Wakes the task: a watchdog's first renewal is due before the task would wake, or the
    /// timetable is gone.
    wake: Arc<Notify>,
    /// Cleared when the task is dropped (its runtime shut down).
    alive: AtomicBool,
}

struct Table<B> {
    /// Waiting to start, by when they start (and a number, for ties).
    waiting: BTreeMap<(Instant, u64), Watchdog<B>>,
    /// Started, by number: aborted at the release.
    running: HashMap<u64, JoinHandle<()>>,
    next: u64,
    /// When the task will wake: the first start in `waiting` when it last looked, or an
    /// earlier one `add` put here as it woke the task; `None` while the task waits for a
    /// watchdog to come (or has not run yet).
    wakes_at: Option<Instant>,
}

impl<B: Backend> Timetable<B> {
    /// A timetable for `runtime`, its task spawned there.
    fn start(runtime: &Handle) -> Arc<Self> {
        let timetable = Arc::new(Self {
            runtime: runtime.id(),
            table: Mutex::new(Table {
                waiting: BTreeMap::new(),
                running: HashMap::new(),
                next: 0,
                wakes_at: None,
            }),
            wake: Arc::new(Notify::new()),
            alive: AtomicBool::new(true),
        });
        // Dropped with the task, even one dropped before it first ran (a runtime shutting
        // down): the timetable is then left out on the locker's next hold.
        let on_drop = ClearAlive(Arc::downgrade(&timetable));
        let (weak, wake) = (Arc::downgrade(&timetable), Arc::clone(&timetable.wake));
        runtime.spawn(async move {
            let _on_drop = on_drop;
            start_watchdogs(weak, wake).await;
        });
        timetable
    }

    fn add(self: &Arc<Self>, watchdog: Watchdog<B>) -> Ticket<B> {
        let (start_at, due) = (watchdog.start_at(), watchdog.due());
        let mut table = lock(&self.table);
        let number = table.next;
        table.next += 1;
        table.waiting.insert((start_at, number), watchdog);
        // The task wakes in time for this one unless it would wake after its renewal is due.
        let must_wake = table.wakes_at.is_none_or(|wakes_at| due < wakes_at);
        if must_wake {
            table.wakes_at = Some(start_at);
            self.wake.notify_one();
        }
        drop(table);
        Ticket {
            timetable: Arc::clone(self),
            start_at,
            number,
            cancelled: AtomicBool::new(false),
        }
    }

    /// Spawn every watchdog whose time has come, on the runtime this is called on (the
    /// task's); when the next one's comes.
    fn start_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut table = lock(&self.table);
        while let Some(first) = table.waiting.first_entry() {
            let (start_at, number) = *first.key();
            if start_at > now {
                table.wakes_at = Some(start_at);
                return Some(start_at);
            }
            let watchdog = first.remove();
            table.running.insert(number, tokio::spawn(watchdog.run()));
        }
        table.wakes_at = None;
        None
    }
}

impl<B> Drop for Timetable<B> {
    fn drop(&mut self) {
        // Its task, asleep, ends on waking.
        self.wake.notify_one();
    }
}

/// The timetable's task: start the watchdogs as their time comes, until the timetable is
/// gone (its locker and every hold it scheduled dropped).
async fn start_watchdogs<B: Backend>(timetable: Weak<Timetable<B>>, wake: Arc<Notify>) {
    loop {
        let Some(next) = timetable.upgrade().map(|t| t.start_due()) else {
            return;
        };
        // A watchdog whose first renewal is due before `next`, added since `start_due`
        // looked, has stored a wake-up, which ends this wait at once.
        match next {
            Some(start_at) => {
                tokio::select! {
                    () = sleep_until(start_at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// Clears the timetable's `alive` when its task is dropped.
struct ClearAlive<B>(Weak<Timetable<B>>);

impl<B> Drop for ClearAlive<B> {
    fn drop(&mut self) {
        if let Some(timetable) = self.0.upgrade() {
            timetable.alive.store(false, Ordering::Release);
        }
    }
}

/// A hold's place in its timetable: [`cancel`](Self::cancel), or dropping it, stops its
/// watchdog, started or not.
pub(crate) struct Ticket<B> {
    timetable: Arc<Timetable<B>>,
    start_at: Instant,
    number: u64,
    /// Set by the first `cancel`: the release cancels, and so does the hold's drop after it.
    cancelled: AtomicBool,
}

impl<B> Ticket<B> {
    /// Take the watchdog out before it starts, or abort it if it has. Idempotent.
    pub(crate) fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut table = lock(&self.timetable.table);
        if table
            .waiting
            .remove(&(self.start_at, self.number))
            .is_none()
            && let Some(running) = table.running.remove(&self.number)
        {
            running.abort();
        }
    }
}

impl<B> Drop for Ticket<B> {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// A poisoned lock's data is still whole here: nothing under these locks panics between
/// two changes that belong together.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::backend::{Attempt, Unlock};
    use crate::error::Result;
    use crate::fence::Fence;

    /// Counts renewals; every renewal succeeds. (The timetable is what is tested here: the
    /// renewals themselves are the property suite's, on every real backend.)
    #[derive(Default)]
    struct Counting {
        renewals: AtomicU64,
    }

    impl Backend for Counting {
        fn check_key(&self, _key: &str) -> Result<()> {
            Ok(())
        }

        async fn try_lock(&self, _key: &str, _token: &Token, _ttl: Duration) -> Result<Attempt> {
            Ok(Attempt::Acquired(Fence(1)))
        }

        async fn renew(&self, _key: &str, _token: &Token, _ttl: Duration) -> Result<Renewal> {
            self.renewals.fetch_add(1, Ordering::Relaxed);
            Ok(Renewal::Renewed)
        }

        async fn unlock(&self, _key: &str, _token: &Token) -> Result<Unlock> {
            Ok(Unlock::Released)
        }

        async fn advance_fence(
            &self,
            _key: &str,
            _token: &Token,
            _seen: Fence,
        ) -> Result<Option<Fence>> {
            Ok(None)
        }
    }

    const EVERY: Duration = Duration::from_millis(100);
    const TTL: Duration = Duration::from_millis(300);

    /// A watchdog for a hold taken now, renewing every `EVERY`.
    fn watchdog(backend: &Arc<Counting>) -> Watchdog<Counting> {
        let now = Instant::now();
        Watchdog {
            backend: Arc::clone(backend),
            key: "k".to_owned(),
            token: Token::new(),
            every: EVERY,
            replicas: None,
            first_sent: now,
            lease: Arc::new(Lease::new(now, TTL, true)),
        }
    }

    fn sizes(watchdogs: &Watchdogs<Counting>) -> Vec<(usize, usize)> {
        lock(&watchdogs.timetables)
            .iter()
            .map(|t| {
                let table = lock(&t.table);
                (table.waiting.len(), table.running.len())
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_released_before_its_first_renewal_starts_no_watchdog_and_leaves_nothing() {
        let backend = Arc::new(Counting::default());
        let watchdogs = Watchdogs::new();
        let runtime = Handle::current();

        // Act: a thousand short holds, each cancelled before its first renewal is due.
        for _ in 0..1_000 {
            let ticket = watchdogs.schedule(&runtime, watchdog(&backend));
            tokio::time::advance(EVERY / 10).await;
            // Assert: no watchdog task was spawned; the timetable's is the only one.
            assert_eq!(sizes(&watchdogs), [(1, 0)]);
            assert_eq!(runtime.metrics().num_alive_tasks(), 1);
            ticket.cancel();
        }
        tokio::time::advance(TTL * 3).await;

        // Assert: none renewed, and the timetable is empty.
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 0);
        assert_eq!(sizes(&watchdogs), [(0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_lasts_is_renewed_on_time_until_its_ticket_is_cancelled() {
        // Arrange: two holds a little apart, the later one scheduled first, and the
        // timetable's task asleep until it before the earlier one comes.
        let backend = Arc::new(Counting::default());
        let watchdogs = Watchdogs::new();
        let runtime = Handle::current();
        let mut later = watchdog(&backend);
        later.first_sent += EVERY / 2;
        let later = watchdogs.schedule(&runtime, later);
        tokio::task::yield_now().await;
        let earlier = watchdogs.schedule(&runtime, watchdog(&backend));

        // Act + Assert: the earlier hold's first renewal comes at EVERY, the later's half a
        // period after; then one each a period.
        tokio::time::sleep(EVERY - Duration::from_millis(1)).await;
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 0, "renewed early");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 1, "the earlier");
        tokio::time::sleep(EVERY / 2).await;
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 2, "the later");
        tokio::time::sleep(EVERY * 2).await;
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 6);
        assert_eq!(sizes(&watchdogs), [(0, 2)]);

        // Cancelled, each stops renewing, and leaves nothing behind.
        earlier.cancel();
        later.cancel();
        earlier.cancel();
        tokio::time::sleep(EVERY * 5).await;
        assert_eq!(
            backend.renewals.load(Ordering::Relaxed),
            6,
            "renewed after cancel"
        );
        assert_eq!(sizes(&watchdogs), [(0, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_due_just_after_the_next_wake_up_leaves_the_task_asleep_and_renews_on_time() {
        // Arrange: the task asleep until a first hold's watchdog starts, a sixteenth of
        // EVERY before its renewal is due at EVERY.
        let backend = Arc::new(Counting::default());
        let watchdogs = Watchdogs::new();
        let runtime = Handle::current();
        let _first = watchdogs.schedule(&runtime, watchdog(&backend));
        tokio::task::yield_now().await;
        let wakes_at = || lock(&lock(&watchdogs.timetables)[0].table).wakes_at;
        let asleep_until = Instant::now() + EVERY - head_start(EVERY);
        assert_eq!(wakes_at(), Some(asleep_until));

        // Act: a hold due two milliseconds before the first (sent before, answered after),
        // after the task's wake-up.
        let mut earlier = watchdog(&backend);
        earlier.first_sent -= Duration::from_millis(2);
        let _earlier = watchdogs.schedule(&runtime, earlier);

        // Assert: the task was left asleep, and each hold is renewed when it is due, at 98
        // and 100 ms. (Tokio's timers tick in whole milliseconds: each check is a tick away
        // from a renewal.)
        assert_eq!(wakes_at(), Some(asleep_until));
        let renewals = || backend.renewals.load(Ordering::Relaxed);
        tokio::time::sleep(EVERY - Duration::from_millis(3)).await;
        assert_eq!(renewals(), 0, "renewed early");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(renewals(), 1, "the earlier one, at its due");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(renewals(), 2, "the first one, at its due");
    }

    #[test]
    fn a_runtime_that_shut_down_takes_its_timetable_and_the_next_one_gets_its_own() {
        let backend = Arc::new(Counting::default());
        let watchdogs = Watchdogs::new();
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };

        // Arrange: a hold scheduled on a first runtime, which then shuts down.
        let first = paused();
        let _left =
            first.block_on(async { watchdogs.schedule(&Handle::current(), watchdog(&backend)) });
        drop(first);

        // Act: a hold on a second runtime lasts three renewals.
        let second = paused();
        second.block_on(async {
            let ticket = watchdogs.schedule(&Handle::current(), watchdog(&backend));
            tokio::time::sleep(EVERY * 3 + EVERY / 2).await;
            ticket.cancel();
        });

        // Assert: renewed on the second runtime; the first one's timetable is gone.
        assert_eq!(backend.renewals.load(Ordering::Relaxed), 3);
        assert_eq!(lock(&watchdogs.timetables).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timetables_task_ends_when_its_locker_and_holds_are_gone() {
        let backend = Arc::new(Counting::default());
        let watchdogs = Watchdogs::new();
        let ticket = watchdogs.schedule(&Handle::current(), watchdog(&backend));
        let timetable = Arc::downgrade(&ticket.timetable);
        let alive = || {
            timetable
                .upgrade()
                .is_some_and(|t| t.alive.load(Ordering::Acquire))
        };
        tokio::task::yield_now().await;
        assert!(alive());

        drop(watchdogs);
        tokio::task::yield_now().await;
        assert!(alive(), "a hold still needs it");
        ticket.cancel();
        drop(ticket);
        tokio::task::yield_now().await;

        assert!(timetable.upgrade().is_none());
        assert_eq!(
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
            0,
            "the timetable's task is still alive"
        );
    }
}
