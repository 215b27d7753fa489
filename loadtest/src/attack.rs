//! One attack: create a product, flood the instances through goose until the sale is
//! decided, tally every answer.
//!
//! **Buyers.** User ids `1..=buyers`. Goose users take the next buyer who has no final answer
//! yet (a 201, a 409, any other 4xx); a buyer told 503 `busy`, or who got no answer, is
//! tried again later. With several products on sale, buyer `b` buys product `(b - 1) % N`
//! only, so consecutive buyers spread over the products and each product's books can be
//! checked on their own. One buyer in ten (`user_id % 10 == 0`) makes their first purchase
//! twice at the same moment, on two different instances, while the stock lasts: at most one
//! of the two may get an order.
//!
//! **When it stops.** As soon as the sale is decided, product by product: every buyer of it
//! has a final answer, or every buyer of it has tried and a `sold_out` for it came after its
//! last restock. `--run-time` is only the upper bound.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Set by the first Ctrl-C: stop after the current attack (which goose stops at once).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Catch Ctrl-C for the whole process: the first stops the attack under way and asks
    /// everything to wind down; later ones only say that cleaning up is under way.
    ///
    /// # Errors
    /// When a handler is installed already.
    pub fn on_ctrl_c() -> anyhow::Result<Self> {
        let cancel = Self::default();
        let flag = Arc::clone(&cancel.0);
        ctrlc::set_handler(move || {
            if flag.swap(true, Ordering::SeqCst) {
                eprintln!("\nstill cleaning up; one moment");
            } else {
                eprintln!("\nCtrl-C: stopping, then cleaning up");
                goose::trigger_killswitch("Ctrl-C");
            }
        })
        .context("installing the Ctrl-C handler")?;
        Ok(cancel)
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the attack does besides buying.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Units to add to each product once half its stock is sold (0: no restock).
    pub restock: i64,
    /// Ctrl-C, for an attack that must stop even if it came before goose started.
    pub cancel: Option<Cancel>,
}

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

/// A product on sale in an attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    pub id: i64,
    /// Units it was created with.
    pub stock: i64,
}

/// What one attack did, all products together; `products` has each product's part.
pub struct AttackReport {
    /// The first product's id (the only one's, in an attack on one product).
    pub product_id: i64,
    /// Units of every product together.
    pub initial_stock: i64,
    pub buyers: u64,
    /// Concurrent goose users.
    pub users: usize,
    pub tally: Arc<Tally>,
    pub elapsed: Duration,
    /// When every goose user was running, since the start; `None` if the sale ended first.
    pub full_load_at: Option<Duration>,
    /// Buyers without a final answer when the attack ended.
    pub unanswered_buyers: u64,
    /// Buyers who got two orders (two 201s).
    pub buyers_with_two_201s: u64,
    /// Buyers whose answer was lost (no answer, or a 5xx other than busy) and who never got
    /// a 201: whether they have an order is asked of the service after the attack.
    pub lost_answers: Vec<u64>,
    /// Why goose stopped early, if it refused to finish (a failed `--threshold`).
    pub goose_error: Option<String>,
    /// Whether the sale was decided (every buyer answered, or all tried and sold out) before
    /// the attack ended; `false` when `--run-time` ended it first, or a threshold or Ctrl-C
    /// stopped it.
    pub decided: bool,
    /// Each product's part of the attack, in the order given.
    pub products: Vec<ProductReport>,
}

/// One product's part of an attack: its buyers and their answers.
#[derive(Debug, Clone)]
pub struct ProductReport {
    pub product_id: i64,
    pub initial_stock: i64,
    /// Its buyers: those `b` with `(b - 1) % products` its index.
    pub buyers: u64,
    /// The answers about it alone.
    pub tally: Arc<Tally>,
    pub unanswered_buyers: u64,
    pub buyers_with_two_201s: u64,
    pub lost_answers: Vec<u64>,
}

impl AttackReport {
    /// The attack as seen by product `index` alone, to judge its books on their own: its
    /// buyers, answers and stock; the load (users, timing, goose's error) shared.
    pub fn product(&self, index: usize) -> Option<AttackReport> {
        let part = self.products.get(index)?;
        Some(AttackReport {
            product_id: part.product_id,
            initial_stock: part.initial_stock,
            buyers: part.buyers,
            users: self.users,
            tally: Arc::clone(&part.tally),
            elapsed: self.elapsed,
            full_load_at: self.full_load_at,
            unanswered_buyers: part.unanswered_buyers,
            buyers_with_two_201s: part.buyers_with_two_201s,
            lost_answers: part.lost_answers.clone(),
            goose_error: self.goose_error.clone(),
            decided: self.decided,
            products: vec![part.clone()],
        })
    }

    /// Orders per second at full load: the orders answered from the moment every user was
    /// running to the last order, over that window. Before full load (a sale over during the
    /// ramp-up), from the first order to the last.
    pub fn orders_per_sec(&self) -> f64 {
        let at = self.tally.created_at();
        let from = self
            .full_load_at
            .unwrap_or_else(|| at.first().copied().unwrap_or_default());
        let in_window: Vec<&Duration> = at.iter().filter(|t| **t >= from).collect();
        match in_window.last() {
            Some(last) if **last > from => in_window.len() as f64 / (**last - from).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Orders answered in each `bin` since the start (for the chart).
    pub fn orders_over_time(&self, bin: Duration) -> Vec<u64> {
        let at = self.tally.created_at();
        let Some(last) = at.last() else {
            return Vec::new();
        };
        let bins = (last.as_secs_f64() / bin.as_secs_f64()) as usize + 1;
        let mut counts = vec![0; bins];
        for t in at {
            counts[(t.as_secs_f64() / bin.as_secs_f64()) as usize] += 1;
        }
        counts
    }
}

/// Buyer states.
const UNTRIED: u8 = 0;
const TRIED: u8 = 1;
const FINAL: u8 = 2;

/// Shared by every goose user of one attack.
struct Plan {
    hosts: Vec<String>,
    admin_token: Option<String>,
    /// The products on sale: buyer `b` buys at `shelves[(b - 1) % len]`.
    shelves: Vec<Shelf>,
    extras: Extras,
    users: usize,
    started: Instant,
    /// Each buyer's state: untried, tried without a final answer, or answered.
    buyers: Vec<AtomicU8>,
    /// 201s per buyer (two would be two orders).
    orders: Vec<AtomicU8>,
    /// Hands out buyers, round robin.
    next: AtomicU64,
    /// Goose users that have made their first request.
    users_started: Mutex<std::collections::HashSet<usize>>,
    full_load_at_us: AtomicU64,
    decided: AtomicBool,
    /// Every answer, all products together.
    tally: Arc<Tally>,
    /// One pooled client for all users: keep-alive connections to every host.
    client: reqwest::Client,
}

/// One product's sale within an attack.
struct Shelf {
    product: Product,
    /// How many buyers buy here.
    buyers: u64,
    /// The answers about this product alone (each is in the plan's tally too).
    tally: Arc<Tally>,
    tried: AtomicU64,
    answered: AtomicU64,
    /// When its last restock committed, since the start, in µs (0: none yet).
    restocked_at_us: AtomicU64,
    restock_started: AtomicBool,
}

/// `stock` units over `products` products, the first ones taking the remainder; each
/// product gets at least one unit only if `stock >= products`.
pub fn split_stock(stock: i64, products: u64) -> Vec<i64> {
    let n = products.max(1) as i64;
    (0..n)
        .map(|i| stock / n + i64::from(i < stock % n))
        .collect()
}

/// Create `count` products selling `stock` units between them ([`split_stock`]), through
/// the first host's admin API.
///
/// # Errors
/// As [`create_product`].
pub async fn create_products(
    host: &str,
    admin_token: &str,
    stock: i64,
    count: u64,
) -> anyhow::Result<Vec<Product>> {
    let mut products = Vec::new();
    for stock in split_stock(stock, count) {
        let id = create_product(host, admin_token, stock).await?;
        products.push(Product { id, stock });
    }
    Ok(products)
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

/// Goose options that this attack's requests would not honour: refused rather than ignored.
///
/// # Errors
/// A message naming the option and what to use instead.
pub fn refuse_ignored_options(config: &GooseConfiguration) -> anyhow::Result<()> {
    if config.host.as_deref().is_some_and(|h| !h.is_empty()) {
        bail!("--host is not used: give the instances to attack with --hosts");
    }
    if config.throttle_requests.is_some_and(|t| t > 0) {
        bail!(
            "--throttle-requests is not supported: purchases are sent by this tool's own client; lower --users instead"
        );
    }
    if config.timeout.is_some() {
        bail!(
            "--timeout is not supported: purchases wait up to 30 s, as the service bounds its own waits (LOCK_WAIT_MS)"
        );
    }
    Ok(())
}

/// Run goose against `hosts` with `config`, buying `products` as buyers `1..=buyers` (buyer
/// `b` buys product `(b - 1) % products.len()`), until the sale is decided or `--run-time`
/// (default 60 s) ends it.
///
/// # Errors
/// Goose options this attack would ignore; no product, or fewer buyers than products;
/// goose failing to start.
pub async fn run(
    mut config: GooseConfiguration,
    hosts: &[String],
    admin_token: Option<&str>,
    products: &[Product],
    buyers: u64,
    extras: Extras,
) -> anyhow::Result<AttackReport> {
    refuse_ignored_options(&config)?;
    if products.is_empty() || buyers < products.len() as u64 {
        bail!(
            "an attack needs a product and at least one buyer per product ({} products, {buyers} buyers)",
            products.len()
        );
    }
    if config.run_time.is_none() {
        config.run_time = Some("60".into());
    }
    // What goose will run: --users, or else one per CPU (goose's own default).
    let users = config
        .users
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let tally = Arc::new(Tally::default());
    let plan = Arc::new(Plan {
        hosts: hosts.to_vec(),
        admin_token: admin_token.map(str::to_owned),
        shelves: split_stock(buyers as i64, products.len() as u64)
            .into_iter()
            .zip(products)
            .map(|(buyers, product)| Shelf {
                product: *product,
                buyers: buyers as u64,
                tally: Arc::default(),
                tried: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                restocked_at_us: AtomicU64::new(0),
                restock_started: AtomicBool::new(false),
            })
            .collect(),
        extras,
        users,
        started: Instant::now(),
        buyers: (0..buyers).map(|_| AtomicU8::new(UNTRIED)).collect(),
        orders: (0..buyers).map(|_| AtomicU8::new(0)).collect(),
        next: AtomicU64::new(0),
        users_started: Mutex::new(Default::default()),
        full_load_at_us: AtomicU64::new(0),
        decided: AtomicBool::new(false),
        tally: Arc::clone(&tally),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            // Idle connections are dropped well before the service's keep-alive (5 s) ends
            // them: a request sent on a connection the server is closing at that moment gets
            // no answer, which the books would count as a lost one.
            .pool_idle_timeout(Duration::from_secs(2))
            .build()?,
    });
    let progress = show_progress(Arc::clone(&plan));
    let buy: TransactionFunction = {
        let plan = Arc::clone(&plan);
        Arc::new(move |user| {
            let plan = Arc::clone(&plan);
            Box::pin(async move { purchase(user, &plan).await })
        })
    };
    let goose = GooseAttack::initialize_with_config(config)?
        .register_scenario(
            scenario!("Buyers").register_transaction(Transaction::new(buy).set_name("purchase")),
        )
        .set_default(GooseDefault::Host, hosts[0].as_str())?
        // The telnet controller listens on a fixed port; several attacks (the demo) would
        // collide.
        .set_default(GooseDefault::NoTelnet, true)?
        // The books cover the whole sale, ramp-up included; so do the figures.
        .set_default(GooseDefault::NoResetMetrics, true)?
        .execute()
        .await;
    // Set only by `check_decided` until now: whoever else stopped goose left it unset.
    let decided = plan.decided.swap(true, Ordering::SeqCst);
    if let Some(progress) = progress {
        let _ = progress.await;
    }
    let goose_error = goose.err().map(|error| error.to_string());
    let full_load = plan.full_load_at_us.load(Ordering::SeqCst);
    let parts: Vec<ProductReport> = plan
        .shelves
        .iter()
        .enumerate()
        .map(|(index, shelf)| ProductReport {
            product_id: shelf.product.id,
            initial_stock: shelf.product.stock,
            buyers: shelf.buyers,
            tally: Arc::clone(&shelf.tally),
            unanswered_buyers: shelf
                .buyers
                .saturating_sub(shelf.answered.load(Ordering::SeqCst)),
            buyers_with_two_201s: plan
                .orders
                .iter()
                .skip(index)
                .step_by(plan.shelves.len())
                .filter(|o| o.load(Ordering::SeqCst) > 1)
                .count() as u64,
            // A buyer whose answer was lost but who got a 201 on a later try is not a lost
            // answer: their order is counted among the 201s already.
            lost_answers: without_201(shelf.tally.lost_answers(), &plan.orders),
        })
        .collect();
    Ok(AttackReport {
        product_id: products[0].id,
        initial_stock: products.iter().map(|p| p.stock).sum(),
        buyers,
        users,
        elapsed: plan.started.elapsed(),
        full_load_at: (full_load > 0).then(|| Duration::from_micros(full_load)),
        unanswered_buyers: parts.iter().map(|p| p.unanswered_buyers).sum(),
        buyers_with_two_201s: parts.iter().map(|p| p.buyers_with_two_201s).sum(),
        lost_answers: without_201(tally.lost_answers(), &plan.orders),
        tally,
        goose_error,
        decided,
        products: parts,
    })
}

/// While it runs, on a terminal only: sold/stock, orders per second, answers by kind.
fn show_progress(plan: Arc<Plan>) -> Option<tokio::task::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut last = 0;
        while !plan.decided.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let t = &plan.tally;
            let created = t.count(&t.created);
            let stock = plan.initial_stock() + t.count(&t.restocked) as i64;
            eprint!(
                "\r\x1b[Ksold {created}/{stock}, {} orders/s | 201 {created}, 409 sold out {}, 409 already {}, 503 busy {}, other 4xx {}, other 5xx {}, no answer {}",
                created - last,
                t.count(&t.sold_out),
                t.count(&t.already_purchased),
                t.count(&t.busy),
                t.count(&t.other_4xx),
                t.count(&t.other_5xx),
                t.count(&t.transport_errors),
            );
            last = created;
        }
        eprintln!();
    }))
}

impl Plan {
    fn since_start_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Units of every product at the start.
    fn initial_stock(&self) -> i64 {
        self.shelves.iter().map(|s| s.product.stock).sum()
    }

    /// Where buyer `buyer` (from 1) buys.
    fn shelf_of(&self, buyer: u64) -> &Shelf {
        &self.shelves[((buyer - 1) % self.shelves.len() as u64) as usize]
    }

    /// The next buyer without a final answer, or `None` when every buyer has one.
    fn next_buyer(&self) -> Option<u64> {
        let n = self.buyers.len() as u64;
        for _ in 0..n {
            let buyer = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if self.buyers[buyer as usize].load(Ordering::SeqCst) != FINAL {
                return Some(buyer + 1);
            }
        }
        None
    }

    /// Record that goose user `index` is running; note when they all are, if the sale is
    /// still on then (a user who starts after the sell-out adds no load to the sale).
    fn user_started(&self, index: usize) {
        if self.full_load_at_us.load(Ordering::Relaxed) > 0
            || self.tally.count(&self.tally.sold_out) > 0
        {
            return;
        }
        let mut started = self.users_started.lock().unwrap();
        if started.insert(index) && started.len() >= self.users {
            self.full_load_at_us
                .store(self.since_start_us().max(1), Ordering::SeqCst);
        }
    }

    /// The sale is decided when it is for every product: every buyer of it answered, or all
    /// of them tried and its stock ran out since its last restock.
    fn check_decided(&self) {
        let decided = self.shelves.iter().all(|shelf| {
            let all_answered = shelf.answered.load(Ordering::SeqCst) >= shelf.buyers;
            let all_tried = shelf.tried.load(Ordering::SeqCst) >= shelf.buyers;
            let restock_pending =
                self.extras.restock > 0 && shelf.restocked_at_us.load(Ordering::SeqCst) == 0;
            let sold_out = shelf.tally.count(&shelf.tally.sold_out_after_restock) > 0;
            all_answered || (all_tried && sold_out && !restock_pending)
        });
        if decided && !self.decided.swap(true, Ordering::SeqCst) {
            goose::trigger_killswitch("the sale is decided");
        }
    }

    /// Restock `shelf`'s product once, when half its stock is sold.
    async fn maybe_restock(&self, shelf: &Shelf) {
        let half = (shelf.product.stock / 2).max(1) as u64;
        if self.extras.restock <= 0
            || shelf.tally.count(&shelf.tally.created) < half
            || shelf.restock_started.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let Some(token) = &self.admin_token else {
            return;
        };
        let host = &self.hosts[0];
        let answer = self
            .client
            .post(format!("{host}/api/products/{}/restock", shelf.product.id))
            .bearer_auth(token)
            .json(&json!({"add": self.extras.restock}))
            .send()
            .await;
        match answer {
            Ok(response) if response.status() == 200 => {
                for tally in [&self.tally, &shelf.tally] {
                    tally
                        .restocked
                        .fetch_add(self.extras.restock as u64, Ordering::SeqCst);
                }
                shelf
                    .restocked_at_us
                    .store(self.since_start_us().max(1), Ordering::SeqCst);
            }
            other => eprintln!("the restock failed: {other:?}"),
        }
    }
}

/// What one request got back.
struct Answer {
    status: Option<u16>,
    code: String,
    elapsed: Duration,
    /// When the request was sent, since the attack started, in µs.
    sent_us: u64,
}

async fn send(plan: &Plan, host: &str, product: i64, buyer: u64) -> Answer {
    let url = format!("{host}/api/products/{product}/purchase");
    let sent_us = plan.since_start_us();
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
            let code = body["error"].as_str().unwrap_or_default().to_owned();
            (Some(status), code)
        }
        Err(error) => (None, error.to_string()),
    };
    Answer {
        status,
        code,
        elapsed: sent.elapsed(),
        sent_us,
    }
}

/// One turn of a goose user: the next buyer's purchase (two at once for a twin), classified
/// and recorded in goose's metrics.
///
/// 409 sold out / already purchased are expected outcomes of a flash sale, not errors. A
/// request made through goose's HTTP helpers is counted as an error for any non-2xx
/// answer, and goose 0.19 keeps it in its errors table even after `set_success`; so the
/// request is sent here and recorded with `record_custom_request_duration`, which takes
/// our own judgement of success. Only 503s and worse appear as errors in goose's reports.
async fn purchase(user: &mut GooseUser, plan: &Plan) -> TransactionResult {
    if plan.extras.cancel.as_ref().is_some_and(Cancel::is_set) {
        goose::trigger_killswitch("Ctrl-C");
        // Yield until goose stops this user: a transaction that returns at once would spin.
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    }
    plan.user_started(user.weighted_users_index);
    let Some(buyer) = plan
        .next_buyer()
        .filter(|_| !plan.decided.load(Ordering::SeqCst))
    else {
        plan.check_decided();
        // Nothing left to do until goose stops this user.
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    };
    let index = (buyer - 1) as usize;
    // Only an untried buyer becomes tried: a buyer another user has just finished stays
    // final (two users can work on one buyer at the tail, when fewer buyers are open than
    // users).
    let first = plan.buyers[index]
        .compare_exchange(UNTRIED, TRIED, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    let shelf = plan.shelf_of(buyer);
    let product = shelf.product.id;
    if first {
        shelf.tried.fetch_add(1, Ordering::SeqCst);
    }
    let hosts = plan.hosts.len() as u64;
    let host = &plan.hosts[(buyer % hosts) as usize];
    let twin = first && buyer % 10 == 0 && shelf.tally.count(&shelf.tally.sold_out) == 0;
    let answers = if twin {
        for tally in [&plan.tally, &shelf.tally] {
            tally.twins.fetch_add(1, Ordering::Relaxed);
        }
        let other = &plan.hosts[((buyer + 1) % hosts) as usize];
        let (a, b) = tokio::join!(
            send(plan, host, product, buyer),
            send(plan, other, product, buyer)
        );
        vec![a, b]
    } else {
        vec![send(plan, host, product, buyer).await]
    };
    let mut final_answer = false;
    for answer in &answers {
        final_answer |= record(plan, shelf, buyer, twin, answer);
        let error = error_of(answer);
        user.record_custom_request_duration(
            "POST",
            "/api/products/{id}/purchase",
            answer.elapsed,
            error.is_none(),
            answer.status,
            error.as_deref(),
        )
        .await?;
    }
    if final_answer && plan.buyers[index].swap(FINAL, Ordering::SeqCst) != FINAL {
        shelf.answered.fetch_add(1, Ordering::SeqCst);
    }
    plan.maybe_restock(shelf).await;
    plan.check_decided();
    Ok(())
}

/// Count one answer, in the attack's tally and in its product's; `true` when it is final
/// for the buyer.
fn record(plan: &Plan, shelf: &Shelf, buyer: u64, twin: bool, answer: &Answer) -> bool {
    let now_us = plan.since_start_us();
    let restocked_at = shelf.restocked_at_us.load(Ordering::SeqCst);
    if answer.status == Some(201) {
        plan.orders[(buyer - 1) as usize].fetch_add(1, Ordering::SeqCst);
    }
    let mut final_answer = false;
    for tally in [&plan.tally, &shelf.tally] {
        final_answer = count(tally, buyer, twin, answer, restocked_at, now_us);
    }
    final_answer
}

/// Count one answer in `tally`, given when the buyer's product was last restocked and when
/// the answer came (µs since the start); `true` when it is final for the buyer.
fn count(
    tally: &Tally,
    buyer: u64,
    twin: bool,
    answer: &Answer,
    restocked_at_us: u64,
    now_us: u64,
) -> bool {
    let micros = answer.elapsed.as_micros() as u64;
    tally.latencies_us.lock().unwrap().push(micros);
    let lost = || tally.lost_answers.lock().unwrap().push(buyer);
    match (answer.status, answer.code.as_str()) {
        (Some(201), _) => {
            tally.created.fetch_add(1, Ordering::Relaxed);
            tally.created_latencies_us.lock().unwrap().push(micros);
            tally.created_at_us.lock().unwrap().push(now_us);
            true
        }
        (Some(409), "sold_out") => {
            tally.sold_out.fetch_add(1, Ordering::Relaxed);
            if answer.sent_us >= restocked_at_us {
                tally.sold_out_after_restock.fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        (Some(409), "already_purchased") => {
            tally.already_purchased.fetch_add(1, Ordering::Relaxed);
            if twin {
                tally.twin_already_purchased.fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        (Some(503), "busy") => {
            tally.busy.fetch_add(1, Ordering::Relaxed);
            false
        }
        (Some(500..=599), _) => {
            tally.other_5xx.fetch_add(1, Ordering::Relaxed);
            lost();
            false
        }
        (Some(_), _) => {
            tally.other_4xx.fetch_add(1, Ordering::Relaxed);
            true
        }
        (None, _) => {
            tally.transport_errors.fetch_add(1, Ordering::Relaxed);
            lost();
            false
        }
    }
}

/// Of the buyers whose answer was lost, those who never got a 201 (`orders[b - 1]` counts
/// buyer `b`'s 201s).
fn without_201(lost: Vec<u64>, orders: &[AtomicU8]) -> Vec<u64> {
    lost.into_iter()
        .filter(|buyer| orders[(buyer - 1) as usize].load(Ordering::SeqCst) == 0)
        .collect()
}

/// How goose's report shows an answer: `None` for the expected ones.
fn error_of(answer: &Answer) -> Option<String> {
    match (answer.status, answer.code.as_str()) {
        (Some(201), _) | (Some(409), "sold_out" | "already_purchased") => None,
        (Some(status), code) => Some(format!("{status} {code}")),
        (None, reason) => Some(format!("no answer: {reason}")),
    }
}

/// Which of `buyers` have an order after all (their answer was lost): asked of the service.
///
/// # Errors
/// When the service cannot be asked.
pub async fn orders_of(host: &str, product_id: i64, buyers: &[u64]) -> anyhow::Result<u64> {
    let client = reqwest::Client::new();
    let mut found = 0;
    for buyer in buyers {
        let response = client
            .get(format!("{host}/api/products/{product_id}/orders/{buyer}"))
            .send()
            .await
            .with_context(|| format!("cannot ask {host} for buyer {buyer}'s order"))?;
        match response.status().as_u16() {
            200 => found += 1,
            404 => {}
            other => bail!("looking up buyer {buyer}'s order answered {other}"),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stock_is_split_over_the_products_the_first_ones_taking_the_remainder() {
        assert_eq!(split_stock(25_000, 1), [25_000]);
        assert_eq!(split_stock(10, 4), [3, 3, 2, 2]);
        assert_eq!(split_stock(10, 4).iter().sum::<i64>(), 10);
    }

    #[test]
    fn a_buyer_who_lost_an_answer_then_got_a_201_is_not_a_lost_answer() {
        // Buyers 1..=3: 1 lost an answer and then bought; 2 lost one and has no 201; 3 bought.
        let orders: Vec<AtomicU8> = [1, 0, 1].into_iter().map(AtomicU8::new).collect();
        assert_eq!(without_201(vec![1, 2], &orders), [2]);
    }
}
