//! The load: buyers arriving at a steady rate, each with an id of their own, buying one unit
//! at a random instance, with at most `concurrency` requests open at once; and restocks
//! through the admin API now and then. Every answer is recorded ([`super::history`]).
//!
//! Every choice of instance (and every pause before a retry) is drawn from the seed: each
//! buyer and each restock has a generator of its own ([`choices`]), so a seed replays which
//! instance a buyer's n-th attempt goes to, however the tasks interleave. (When each attempt
//! is sent, and what the faults make of it, is the machine's.)
//!
//! - **A buyer** tries up to [`ATTEMPTS`] times, each at a random instance, until an answer
//!   is final (a 2xx or a 4xx); a 5xx or a lost answer is tried again after a short pause,
//!   as a client would, without looking the order up first (so a retry after a lost commit
//!   must get `already_purchased`, never a second order).
//! - **A restock** carries an `Idempotency-Key` and is tried again with the same key until
//!   an answer says whether it was applied; one still open when the load stops is tried
//!   again after it (see `resolve`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::cluster::{ADMIN_TOKEN, Endpoints, Urls};
use super::history::{Answer, Attempt, Restock, RestockAttempt, now_us};

/// Purchase attempts per buyer at most.
pub const ATTEMPTS: usize = 3;

/// How long a request may take before its answer counts as lost.
// TIMING: longer than anything the service waits for itself (LOCK_WAIT_MS 2 s, the pool's
// 2 s, a 5 s statement) plus a paused instance's stop, so a lost answer is a lost answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a restock is tried before it is left to [`resolve`].
const RESTOCK_TRIES_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub product_id: i64,
    pub buyers_per_sec: u32,
    pub concurrency: usize,
    pub restock_every: Duration,
    pub restock_units: i64,
    /// Makes the restocks' keys unique to the run, and draws every choice of instance.
    pub seed: u64,
}

/// Everything the load recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    pub attempts: Vec<Attempt>,
    pub restocks: Vec<Restock>,
    /// Buyers who started (ids `1..=buyers`).
    pub buyers: i64,
}

struct Shared {
    config: LoadConfig,
    urls: Urls,
    client: reqwest::Client,
    attempts: Mutex<Vec<Attempt>>,
    stop: watch::Receiver<bool>,
}

/// Run the load until `stop` turns true; then wait for every buyer's last attempt and try
/// the open restocks again; everything recorded.
///
/// # Errors
/// When no HTTP client can be built.
pub async fn run(
    config: LoadConfig,
    urls: Urls,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Recorded> {
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        // Idle connections are dropped before the service's keep-alive (5 s) ends them: a
        // request sent on a connection the server is closing gets no answer.
        .pool_idle_timeout(Duration::from_secs(2))
        .build()?;
    let shared = Arc::new(Shared {
        config: config.clone(),
        urls,
        client,
        attempts: Mutex::new(Vec::new()),
        stop,
    });
    let restocks = tokio::spawn(restock_loop(Arc::clone(&shared)));
    let buyers = arrivals(&shared).await;
    let mut restocks = restocks.await.unwrap_or_default();
    resolve(&shared, &mut restocks).await;
    let attempts = std::mem::take(&mut *shared.attempts.lock().unwrap());
    Ok(Recorded {
        attempts,
        restocks,
        buyers,
    })
}

/// Start buyers at the configured rate until told to stop; wait for every one of them.
/// How many there were.
async fn arrivals(shared: &Arc<Shared>) -> i64 {
    let slots = Arc::new(Semaphore::new(shared.config.concurrency));
    let tick = Duration::from_millis(10);
    let per_tick = f64::from(shared.config.buyers_per_sec) * tick.as_secs_f64();
    let mut owed = 0.0;
    let mut next_user = 0i64;
    let mut ticker = tokio::time::interval(tick);
    // Arrivals the load could not start while every slot was busy are not made up later.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !*shared.stop.borrow() {
        ticker.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                break;
            };
            next_user += 1;
            let (shared, user) = (Arc::clone(shared), next_user);
            tokio::spawn(async move {
                buyer(&shared, user).await;
                drop(slot);
            });
        }
    }
    // Every buyer has finished when every slot is free again.
    let _all = slots
        .acquire_many(shared.config.concurrency as u32)
        .await
        .ok();
    next_user
}

/// The generator of one buyer's choices (`stream`: the buyer's id), or with
/// [`RESTOCK_STREAMS`] set, one restock's: stream `stream` of the seed. The fault schedule
/// is stream 0.
pub fn choices(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// The streams of the restocks' choices: this bit and the restock's number.
const RESTOCK_STREAMS: u64 = 1 << 63;

/// One buyer's attempts.
async fn buyer(shared: &Shared, user: i64) {
    let mut rng = choices(shared.config.seed, user.unsigned_abs());
    for attempt in 0..ATTEMPTS {
        let (instance, endpoints) = pick(&shared.urls, &mut rng);
        let url = endpoints.public;
        let sent_us = now_us();
        let answer = send(
            shared
                .client
                .post(format!(
                    "{url}/api/products/{}/purchase",
                    shared.config.product_id
                ))
                .bearer_auth(crate::buyers::token(user))
                .json(&json!({"user_id": user, "quantity": 1})),
        )
        .await;
        let answered_us = now_us();
        let last = answer.is_final() || attempt + 1 == ATTEMPTS || *shared.stop.borrow();
        shared.attempts.lock().unwrap().push(Attempt {
            user,
            instance,
            sent_us,
            answered_us,
            answer,
        });
        if last {
            return;
        }
        let pause = rng.random_range(100..300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// An instance drawn by `rng`: its slot and its address now.
fn pick(urls: &Urls, rng: &mut ChaCha8Rng) -> (usize, Endpoints) {
    let urls = urls.read().unwrap();
    let slot = rng.random_range(0..urls.len());
    (slot, urls[slot].clone())
}

/// Send a request and read its answer, whatever happens.
async fn send(request: reqwest::RequestBuilder) -> Answer {
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            // A body cut off after the status arrived still leaves the status the service
            // chose; the code and order id are then unknown.
            let body = response.json::<Value>().await.unwrap_or(Value::Null);
            Answer::Http {
                status,
                code: body["error"].as_str().unwrap_or_default().to_owned(),
                order_id: body["order_id"].as_i64(),
            }
        }
        Err(error) => Answer::Lost(error_chain(&error)),
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A restock every `restock_every` until told to stop, each tried until resolved or for
/// [`RESTOCK_TRIES_FOR`].
async fn restock_loop(shared: Arc<Shared>) -> Vec<Restock> {
    let mut restocks = Vec::new();
    let mut stop = shared.stop.clone();
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.config.restock_every) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
        let mut restock = Restock {
            key: format!(
                "chaos-{}-{}-{}",
                shared.config.seed,
                std::process::id(),
                restocks.len() + 1
            ),
            units: shared.config.restock_units,
            attempts: Vec::new(),
        };
        let number = restocks.len() + 1;
        try_restock(&shared, &mut restock, number, RESTOCK_TRIES_FOR).await;
        restocks.push(restock);
    }
    restocks
}

/// Try `restock` (again) until an answer resolves it or `within` runs out.
///
/// `number` is the restock's place among the run's restocks, from 1: its attempt `n` goes
/// where stream `RESTOCK_STREAMS | number << 16 | n` of the seed says, whenever it is made.
async fn try_restock(shared: &Shared, restock: &mut Restock, number: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while !restock.resolved() && Instant::now() < deadline {
        if !restock.attempts.is_empty() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let stream = RESTOCK_STREAMS | (number as u64) << 16 | restock.attempts.len() as u64;
        let (instance, endpoints) = pick(&shared.urls, &mut choices(shared.config.seed, stream));
        let url = endpoints.ops;
        let sent_us = now_us();
        let answer = send(
            shared
                .client
                .post(format!(
                    "{url}/api/products/{}/restock",
                    shared.config.product_id
                ))
                .bearer_auth(ADMIN_TOKEN)
                .header("Idempotency-Key", &restock.key)
                .json(&json!({"add": restock.units})),
        )
        .await;
        restock.attempts.push(RestockAttempt {
            instance,
            sent_us,
            answered_us: now_us(),
            answer,
        });
    }
}

/// After the load: try every restock whose outcome is still open again, with its key, for
/// up to a minute each (every fault is healed by now).
async fn resolve(shared: &Shared, restocks: &mut [Restock]) {
    for (i, restock) in restocks.iter_mut().enumerate() {
        if !restock.resolved() {
            try_restock(shared, restock, i + 1, Duration::from_secs(60)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instances a generator picks among three, `n` times.
    fn slots(mut rng: ChaCha8Rng, n: usize) -> Vec<usize> {
        (0..n).map(|_| rng.random_range(0..3)).collect()
    }

    #[test]
    fn a_seed_replays_each_buyers_choices_and_another_seed_or_buyer_draws_others() {
        let buyer_7 = slots(choices(42, 7), 20);

        assert_eq!(
            slots(choices(42, 7), 20),
            buyer_7,
            "the same seed and buyer"
        );
        assert_ne!(slots(choices(43, 7), 20), buyer_7, "another seed");
        assert_ne!(slots(choices(42, 8), 20), buyer_7, "another buyer");
        assert_ne!(
            slots(choices(42, RESTOCK_STREAMS | 7), 20),
            buyer_7,
            "a restock is not a buyer"
        );
        let mut schedule = ChaCha8Rng::seed_from_u64(42);
        let schedule: Vec<usize> = (0..20).map(|_| schedule.random_range(0..3)).collect();
        assert_ne!(
            schedule,
            slots(choices(42, 1), 20),
            "buyer 1 is not the schedule"
        );
    }
}
