//! One attack: create a product, flood the instances through goose, tally the answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Every answer the attack got, counted as it came.
#[derive(Debug, Default)]
pub struct Tally {
    pub created: AtomicU64,
    /// Units in the 201 answers.
    pub created_quantity: AtomicU64,
    pub sold_out: AtomicU64,
    pub already_purchased: AtomicU64,
    pub busy: AtomicU64,
    pub other_4xx: AtomicU64,
    /// 5xx answers other than 503 busy: each one fails the verdict.
    pub other_5xx: AtomicU64,
    /// Requests that got no HTTP answer at all.
    pub transport_errors: AtomicU64,
    /// Latency of each purchase attempt, in µs.
    latencies_us: Mutex<Vec<u64>>,
    /// Latency of each successful (201) purchase, in µs: what a buyer who got the item waited.
    created_latencies_us: Mutex<Vec<u64>>,
    /// When the last 201 came, for the sell rate.
    last_created: Mutex<Option<Instant>>,
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
}

fn percentile(samples: &Mutex<Vec<u64>>, p: f64) -> Duration {
    let mut all = samples.lock().unwrap().clone();
    if all.is_empty() {
        return Duration::ZERO;
    }
    all.sort_unstable();
    Duration::from_micros(all[((all.len() - 1) as f64 * p).round() as usize])
}

/// What one attack did.
pub struct AttackReport {
    pub product_id: i64,
    pub initial_stock: i64,
    pub tally: Arc<Tally>,
    pub started: Instant,
    pub elapsed: Duration,
    last_created: Option<Instant>,
}

impl AttackReport {
    /// Orders per second, from the start until the last order (the sell-out).
    pub fn orders_per_sec(&self) -> f64 {
        let created = self.tally.count(&self.tally.created) as f64;
        let until = self
            .last_created
            .map_or(self.elapsed, |t| t.duration_since(self.started));
        if until.is_zero() {
            0.0
        } else {
            created / until.as_secs_f64()
        }
    }
}

/// Shared by every goose user of one attack.
struct Plan {
    hosts: Vec<String>,
    product_id: i64,
    buyers: u64,
    /// Hands out attempts: attempt n buys as user (n % buyers) + 1 through host n % hosts.
    next: AtomicU64,
    tally: Arc<Tally>,
    /// One pooled client for all users: keep-alive connections to every host.
    client: reqwest::Client,
}

/// Create the product through the first host's admin API.
pub async fn create_product(host: &str, admin_token: &str, stock: i64) -> anyhow::Result<i64> {
    let response = reqwest::Client::new()
        .post(format!("{host}/api/products"))
        .bearer_auth(admin_token)
        .json(&json!({"name": format!("loadtest {}", std::process::id()), "stock": stock}))
        .send()
        .await
        .with_context(|| format!("cannot reach {host} to create the product"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status != 201 {
        bail!("creating the product failed: {status} {body}");
    }
    body["id"].as_i64().context("no id in the created product")
}

/// Run goose against `hosts` with `config`, buying product `product_id`.
pub async fn run(
    config: GooseConfiguration,
    hosts: &[String],
    product_id: i64,
    initial_stock: i64,
    buyers: u64,
) -> anyhow::Result<AttackReport> {
    let tally = Arc::new(Tally::default());
    let plan = Arc::new(Plan {
        hosts: hosts.to_vec(),
        product_id,
        buyers,
        next: AtomicU64::new(0),
        tally: Arc::clone(&tally),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?,
    });
    let buy: TransactionFunction = Arc::new(move |user| {
        let plan = Arc::clone(&plan);
        Box::pin(async move { purchase(user, &plan).await })
    });
    let started = Instant::now();
    GooseAttack::initialize_with_config(config)?
        .register_scenario(
            scenario!("Buyers").register_transaction(Transaction::new(buy).set_name("purchase")),
        )
        .set_default(GooseDefault::Host, hosts[0].as_str())?
        // The controllers listen on fixed ports; several attacks (the demo) would collide.
        .set_default(GooseDefault::NoTelnet, true)?
        .set_default(GooseDefault::NoWebSocket, true)?
        // The books cover the whole sale, ramp-up included; so do the figures.
        .set_default(GooseDefault::NoResetMetrics, true)?
        .execute()
        .await?;
    let last_created = *tally.last_created.lock().unwrap();
    Ok(AttackReport {
        product_id,
        initial_stock,
        tally,
        started,
        elapsed: started.elapsed(),
        last_created,
    })
}

/// One purchase attempt, classified and recorded in goose's metrics.
///
/// 409 sold out / already purchased are expected outcomes of a flash sale, not errors. A
/// request made through goose's HTTP helpers is counted as an error for any non-2xx
/// answer, and goose 0.19 keeps it in its errors table even after `set_success`; so the
/// request is sent here and recorded with `record_custom_request_duration`, which takes
/// our own judgement of success. Only 503s and worse appear as errors in goose's reports.
async fn purchase(user: &mut GooseUser, plan: &Plan) -> TransactionResult {
    let n = plan.next.fetch_add(1, Ordering::Relaxed);
    let buyer = n % plan.buyers + 1;
    let host = &plan.hosts[(n % plan.hosts.len() as u64) as usize];
    let url = format!("{host}/api/products/{}/purchase", plan.product_id);
    let sent = Instant::now();
    let answer = plan
        .client
        .post(&url)
        .json(&json!({"user_id": buyer, "quantity": 1}))
        .send()
        .await;
    let (status, code) = match answer {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.json::<Value>().await.unwrap_or(Value::Null);
            (
                Some(status),
                body["error"].as_str().unwrap_or_default().to_owned(),
            )
        }
        Err(error) => (None, error.to_string()),
    };
    let elapsed = sent.elapsed();
    let tally = &plan.tally;
    tally
        .latencies_us
        .lock()
        .unwrap()
        .push(elapsed.as_micros() as u64);
    let error = match (status, code.as_str()) {
        (Some(201), _) => {
            tally.created.fetch_add(1, Ordering::Relaxed);
            tally.created_quantity.fetch_add(1, Ordering::Relaxed);
            tally
                .created_latencies_us
                .lock()
                .unwrap()
                .push(elapsed.as_micros() as u64);
            *tally.last_created.lock().unwrap() = Some(Instant::now());
            None
        }
        (Some(409), "sold_out") => {
            tally.sold_out.fetch_add(1, Ordering::Relaxed);
            None
        }
        (Some(409), "already_purchased") => {
            tally.already_purchased.fetch_add(1, Ordering::Relaxed);
            None
        }
        (Some(503), "busy") => {
            tally.busy.fetch_add(1, Ordering::Relaxed);
            Some("503 busy".to_owned())
        }
        (Some(status @ 500..=599), code) => {
            tally.other_5xx.fetch_add(1, Ordering::Relaxed);
            Some(format!("{status} {code}"))
        }
        (Some(status), code) => {
            tally.other_4xx.fetch_add(1, Ordering::Relaxed);
            Some(format!("{status} {code}"))
        }
        (None, reason) => {
            tally.transport_errors.fetch_add(1, Ordering::Relaxed);
            Some(format!("no answer: {reason}"))
        }
    };
    user.record_custom_request_duration(
        "POST",
        "/api/products/{id}/purchase",
        elapsed,
        error.is_none(),
        status,
        error.as_deref(),
    )
    .await
}
