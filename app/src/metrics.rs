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
    /// Purchases per batch of one product (its own transaction, or under a lock its share of
    /// the writer's statement).
    pub batch_size: Histogram,
    /// Batches sold per lock hold.
    pub batches_per_hold: Histogram,
    /// Statements the lock holders' writer sent, each one or more products' batches.
    pub holder_statements: IntCounter,
    /// Where a batch's time goes, phase by phase (`batch_phase_seconds{phase}`).
    pub phases: BatchPhases,
    /// Purchases whose commit answer was lost, by what looking their order up answered
    /// (`created`, `already_purchased`, or still `outcome_unknown`).
    pub lost_answers: IntCounterVec,
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

/// Latency buckets, from half a millisecond to ten seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Count buckets (purchases per batch, batches per hold).
const COUNT_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// A batch phase's buckets, from ten microseconds to five seconds.
const PHASE_BUCKETS: [f64; 15] = [
    0.000_01, 0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5,
    1.0, 5.0,
];

/// Makes each metric family and registers it, in one call.
struct Families(Registry);

impl Families {
    fn register<C: prometheus::core::Collector + Clone + 'static>(&self, collector: C) -> C {
        self.0
            .register(Box::new(collector.clone()))
            .expect("unique metric names");
        collector
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("valid metric"))
    }

    fn counter_vec(&self, name: &str, help: &str, label: &str) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("valid metric"))
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(Histogram::with_opts(opts).expect("valid metric"))
    }

    fn histogram_vec(&self, name: &str, help: &str, buckets: &[f64], label: &str) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(HistogramVec::new(opts, &[label]).expect("valid metric"))
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("seckill".into()), None).expect("valid prefix");
        let families = Families(registry.clone());
        let phase_seconds = families.histogram_vec(
            "batch_phase_seconds",
            "Where a batch's time goes: queue (per purchase, arrival to batch), write (the batch's database work, under a lock with its wait for the holders' writer), answer (answering its buyers)",
            &PHASE_BUCKETS,
            "phase",
        );
        Self {
            purchases: families.counter_vec("purchases_total", "Purchases by outcome", "outcome"),
            purchase_seconds: families.histogram_vec(
                "purchase_duration_seconds",
                "Purchase latency",
                &LATENCY_BUCKETS,
                "strategy",
            ),
            lock_wait_seconds: families.histogram(
                "lock_wait_seconds",
                "A desk leader's wait for the lock",
                &LATENCY_BUCKETS,
            ),
            lock_acquisitions: families
                .counter("lock_acquisitions_total", "Locks taken by desk leaders"),
            lock_timeouts: families.counter(
                "lock_timeouts_total",
                "Purchases that waited LOCK_WAIT_MS without their turn (answered busy)",
            ),
            lock_renewals: families.counter(
                "lock_renewals_total",
                "Lease renewals by the watchdog, counted when each hold ends",
            ),
            locks_lost: families.counter(
                "locks_lost_total",
                "Lock holds that ended with the lock lost",
            ),
            fence_resyncs: families.counter(
                "fence_resyncs_total",
                "Fence counters raised past a larger stored fence while the lock was held",
            ),
            sold_out_fast_path: families.counter(
                "sold_out_fast_path_total",
                "Sold-out answers given from memory, without queue, lock or database",
            ),
            orders: families.counter("orders_total", "Orders this instance sold"),
            queued: families.gauge(
                "queued_purchases",
                "Purchases waiting at this instance's desks",
            ),
            queue_full: families.counter(
                "queue_full_total",
                "Purchases refused at once because their desk's queue was full",
            ),
            buyers_gone: families.counter(
                "buyers_gone_total",
                "Purchases skipped because their buyer disconnected while queued",
            ),
            batch_size: families.histogram(
                "batch_size",
                "Purchases in one batch of one product",
                &COUNT_BUCKETS,
            ),
            batches_per_hold: families.histogram(
                "batches_per_hold",
                "Batches sold per lock hold",
                &COUNT_BUCKETS,
            ),
            holder_statements: families.counter(
                "holder_statements_total",
                "Statements the lock holders' writer sent, each one or more products' batches",
            ),
            lost_answers: lost_answers(&families),
            phases: BatchPhases {
                queue: phase_seconds.with_label_values(&["queue"]),
                write: phase_seconds.with_label_values(&["write"]),
                answer: phase_seconds.with_label_values(&["answer"]),
            },
            registry,
        }
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

/// `lost_answers_total`, with each answer's series at 0 from the start (a series appears
/// only once it has a label, and a dashboard wants the zero).
fn lost_answers(families: &Families) -> IntCounterVec {
    let counters = families.counter_vec(
        "lost_answers_total",
        "Purchases whose commit answer was lost, by what looking the order up found (created, already_purchased, or still outcome_unknown)",
        "answer",
    );
    for answer in ["created", "already_purchased", "outcome_unknown"] {
        counters.with_label_values(&[answer]);
    }
    counters
}

/// The purchase counters by outcome, and the latency histogram of one strategy, looked up
/// once: the sold-out answer from memory is the hot path, and a label lookup hashes.
pub struct PurchaseCounters {
    outcomes: Vec<(&'static str, IntCounter)>,
    pub latency: Histogram,
}

impl PurchaseCounters {
    /// Every outcome a purchase can have (`PurchaseError::outcome`, and `created`).
    const OUTCOMES: [&'static str; 11] = [
        "created",
        "sold_out",
        "not_open",
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

    /// The counter of `label`, one of `Self::OUTCOMES`.
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
