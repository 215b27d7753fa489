//! The tally: every answer of an attack counted as it came, with the latencies, when each
//! order came, and the buyers whose answer was lost.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Every answer the attack got, counted as it came.
#[derive(Debug, Default)]
pub struct Tally {
    pub created: AtomicU64,
    pub sold_out: AtomicU64,
    /// `sold_out` answers to requests sent after the last restock had committed.
    pub sold_out_after_restock: AtomicU64,
    pub already_purchased: AtomicU64,
    /// `already_purchased` answers to one of a twin pair (a buyer asking two instances).
    pub twin_already_purchased: AtomicU64,
    /// Twin pairs sent.
    pub twins: AtomicU64,
    pub busy: AtomicU64,
    pub other_4xx: AtomicU64,
    /// 5xx answers other than 503 busy.
    pub other_5xx: AtomicU64,
    /// Requests that got no HTTP answer at all.
    pub transport_errors: AtomicU64,
    /// Units restocked during the attack.
    pub restocked: AtomicU64,
    /// Latency of each purchase attempt, in µs.
    pub(crate) latencies_us: Mutex<Vec<u64>>,
    /// Latency of each successful (201) purchase, in µs.
    pub(crate) created_latencies_us: Mutex<Vec<u64>>,
    /// When each 201 came, since the attack started, in µs (orders over time).
    pub(crate) created_at_us: Mutex<Vec<u64>>,
    /// Buyers whose answer was lost (no answer, or a 5xx other than busy): their order, if
    /// any, is looked up after the attack.
    pub(crate) lost_answers: Mutex<Vec<u64>>,
}

impl Tally {
    pub fn count(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The `p`-th percentile (0.0..=1.0) of all purchase attempts' latency.
    pub fn latency(&self, p: f64) -> Duration {
        percentile(&self.latencies_us, p)
    }

    /// The `p`-th percentile (0.0..=1.0) of successful purchases' latency.
    pub fn created_latency(&self, p: f64) -> Duration {
        percentile(&self.created_latencies_us, p)
    }

    pub fn requests(&self) -> usize {
        self.latencies_us.lock().unwrap().len()
    }

    /// When each order was answered, since the attack started, sorted.
    pub fn created_at(&self) -> Vec<Duration> {
        let mut at = self.created_at_us.lock().unwrap().clone();
        at.sort_unstable();
        at.into_iter().map(Duration::from_micros).collect()
    }

    /// The share of `busy` answers among the requests that reached a sale: every request
    /// but those answered `sold_out` (a sold-out product answers from memory, in any number).
    pub fn busy_share(&self) -> f64 {
        let to_the_sale = (self.requests() as u64).saturating_sub(self.count(&self.sold_out));
        self.count(&self.busy) as f64 / to_the_sale.max(1) as f64
    }

    /// Buyers whose answer was lost, without repeats.
    pub fn lost_answers(&self) -> Vec<u64> {
        let mut lost = self.lost_answers.lock().unwrap().clone();
        lost.sort_unstable();
        lost.dedup();
        lost
    }
}

fn percentile(samples: &Mutex<Vec<u64>>, p: f64) -> Duration {
    let mut all = samples.lock().unwrap().clone();
    if all.is_empty() {
        return Duration::ZERO;
    }
    all.sort_unstable();
    Duration::from_micros(all[((all.len() - 1) as f64 * p).round() as usize])
}
