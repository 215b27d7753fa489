//! Prometheus metrics, served at `/metrics`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The service's metrics; cheap to clone (every field is a handle on shared state).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Purchases by outcome (`created`, `sold_out`, `already_purchased`, `busy`, ...).
    pub purchases: IntCounterVec,
    /// Time from request to answer, by strategy.
    pub purchase_seconds: HistogramVec,
    /// Time spent waiting for the Redis lock.
    pub lock_wait_seconds: Histogram,
    pub lock_acquisitions: IntCounter,
    pub lock_timeouts: IntCounter,
    /// Lease renewals done by the watchdog, counted when each lock hold ends.
    pub lock_renewals: IntCounter,
    /// Lock holds whose release found the lock lost (lease ran out, another holder).
    pub locks_lost: IntCounter,
    /// Fence counters raised past a larger fence found stored in PostgreSQL while the
    /// holder still held the lock (a counter that went back, beyond what the clock covers).
    pub fence_resyncs: IntCounter,
    /// Purchases answered `sold_out` from memory, without queue, lock or database.
    pub sold_out_fast_path: IntCounter,
    /// Orders this instance sold (the split across instances, scraped from each).
    pub orders: IntCounter,
    /// Purchases waiting at this instance's desks.
    pub queued: IntGauge,
    /// Purchases refused at once because their desk's queue was full.
    pub queue_full: IntCounter,
    /// Purchases whose buyer disconnected before their batch was taken (skipped).
    pub buyers_gone: IntCounter,
    /// Purchases per batch (one transaction).
    pub batch_size: Histogram,
    /// Batches sold per lock hold.
    pub batches_per_hold: Histogram,
    /// Where a batch's time goes, phase by phase (`batch_phase_seconds{phase}`).
    pub phases: BatchPhases,
}

/// The phases of a batch, each a histogram of `batch_phase_seconds` resolved once.
#[derive(Clone)]
pub struct BatchPhases {
    /// Per purchase: from its arrival at the desk until a batch took it (the lock's wait,
    /// and the batches before it, included).
    pub queue: Histogram,
    /// Per batch: its database work (under a lock, the one statement and its commit, and
    /// any read or resync before it; otherwise the transaction, retries included).
    pub write: Histogram,
    /// Per batch: handing every buyer their answer.
    pub answer: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("seckill".into()), None).expect("valid prefix");
        let purchases = IntCounterVec::new(
            Opts::new("purchases_total", "Purchases by outcome"),
            &["outcome"],
        )
        .expect("valid metric");
        let latency_buckets = vec![
            0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
        ];
        let purchase_seconds = HistogramVec::new(
            HistogramOpts::new("purchase_duration_seconds", "Purchase latency")
                .buckets(latency_buckets.clone()),
            &["strategy"],
        )
        .expect("valid metric");
        let lock_wait_seconds = Histogram::with_opts(
            HistogramOpts::new("lock_wait_seconds", "A desk leader's wait for the lock")
                .buckets(latency_buckets),
        )
        .expect("valid metric");
        let counts = vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
        let batch_size = Histogram::with_opts(
            HistogramOpts::new("batch_size", "Purchases sold in one transaction")
                .buckets(counts.clone()),
        )
        .expect("valid metric");
        let batches_per_hold = Histogram::with_opts(
            HistogramOpts::new("batches_per_hold", "Batches sold per lock hold").buckets(counts),
        )
        .expect("valid metric");
        let phase_seconds = HistogramVec::new(
            HistogramOpts::new(
                "batch_phase_seconds",
                "Where a batch's time goes: queue (per purchase, arrival to batch), write (the batch's database work), answer (answering its buyers)",
            )
            .buckets(vec![
                0.000_01, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02,
                0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            &["phase"],
        )
        .expect("valid metric");
        let phases = BatchPhases {
            queue: phase_seconds.with_label_values(&["queue"]),
            write: phase_seconds.with_label_values(&["write"]),
            answer: phase_seconds.with_label_values(&["answer"]),
        };
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        let metrics = Self {
            purchases,
            purchase_seconds,
            lock_wait_seconds,
            lock_acquisitions: counter("lock_acquisitions_total", "Locks taken by desk leaders"),
            lock_timeouts: counter(
                "lock_timeouts_total",
                "Purchases that waited LOCK_WAIT_MS without their turn (answered busy)",
            ),
            lock_renewals: counter(
                "lock_renewals_total",
                "Lease renewals by the watchdog, counted when each hold ends",
            ),
            locks_lost: counter(
                "locks_lost_total",
                "Lock holds that ended with the lock lost",
            ),
            fence_resyncs: counter(
                "fence_resyncs_total",
                "Fence counters raised past a larger stored fence while the lock was held",
            ),
            sold_out_fast_path: counter(
                "sold_out_fast_path_total",
                "Sold-out answers given from memory, without queue, lock or database",
            ),
            orders: counter("orders_total", "Orders this instance sold"),
            queued: IntGauge::new(
                "queued_purchases",
                "Purchases waiting at this instance's desks",
            )
            .expect("valid metric"),
            queue_full: counter(
                "queue_full_total",
                "Purchases refused at once because their desk's queue was full",
            ),
            buyers_gone: counter(
                "buyers_gone_total",
                "Purchases skipped because their buyer disconnected while queued",
            ),
            batch_size,
            batches_per_hold,
            phases,
            registry,
        };
        let collectors: [Box<dyn prometheus::core::Collector>; 16] = [
            Box::new(metrics.purchases.clone()),
            Box::new(metrics.purchase_seconds.clone()),
            Box::new(metrics.lock_wait_seconds.clone()),
            Box::new(metrics.lock_acquisitions.clone()),
            Box::new(metrics.lock_timeouts.clone()),
            Box::new(metrics.lock_renewals.clone()),
            Box::new(metrics.locks_lost.clone()),
            Box::new(metrics.fence_resyncs.clone()),
            Box::new(metrics.sold_out_fast_path.clone()),
            Box::new(metrics.orders.clone()),
            Box::new(metrics.queued.clone()),
            Box::new(metrics.queue_full.clone()),
            Box::new(metrics.buyers_gone.clone()),
            Box::new(metrics.batch_size.clone()),
            Box::new(metrics.batches_per_hold.clone()),
            Box::new(phase_seconds),
        ];
        for collector in collectors {
            metrics
                .registry
                .register(collector)
                .expect("unique metric names");
        }
        metrics
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding to a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// The purchase counters by outcome, and the latency histogram of one strategy, looked up
/// once: the sold-out answer from memory is the hot path, and a label lookup hashes.
pub struct PurchaseCounters {
    outcomes: Vec<(&'static str, IntCounter)>,
    pub latency: Histogram,
}

impl PurchaseCounters {
    /// Every outcome a purchase can have (`PurchaseError::outcome`, and `created`).
    const OUTCOMES: [&'static str; 10] = [
        "created",
        "sold_out",
        "already_purchased",
        "not_found",
        "busy",
        "lock_lost",
        "redis_unavailable",
        "database_error",
        "outcome_unknown",
        "internal",
    ];

    pub fn new(metrics: &Metrics, strategy: crate::settings::LockStrategy) -> Self {
        Self {
            outcomes: Self::OUTCOMES
                .iter()
                .map(|&label| (label, metrics.purchases.with_label_values(&[label])))
                .collect(),
            latency: metrics
                .purchase_seconds
                .with_label_values(&[strategy.name()]),
        }
    }

    /// The counter of `label`, one of [`Self::OUTCOMES`].
    pub fn outcome(&self, label: &str) -> &IntCounter {
        &self
            .outcomes
            .iter()
            .find(|(known, _)| *known == label)
            .expect("every outcome label is listed in PurchaseCounters::OUTCOMES")
            .1
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
