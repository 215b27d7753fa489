//! The plan every goose user of one attack shares: the products (each on a shelf of its
//! own, with its buyers and its tally), each buyer's state, and when the sale is decided.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::tally::Tally;
use super::{Extras, Product, split_stock};

/// Buyer states.
pub(super) const UNTRIED: u8 = 0;
pub(super) const TRIED: u8 = 1;
pub(super) const FINAL: u8 = 2;

/// Shared by every goose user of one attack.
pub(super) struct Plan {
    pub(super) hosts: Vec<String>,
    /// Where restocks go (none without it).
    pub(super) operator: Option<super::Operator>,
    /// The products on sale: buyer `b` buys at `shelves[(b - 1) % len]`.
    pub(super) shelves: Vec<Shelf>,
    pub(super) extras: Extras,
    pub(super) users: usize,
    pub(super) started: Instant,
    /// Each buyer's state: untried, tried without a final answer, or answered.
    pub(super) buyers: Vec<AtomicU8>,
    /// 201s per buyer (two would be two orders).
    pub(super) orders: Vec<AtomicU8>,
    /// Hands out buyers, round robin.
    pub(super) next: AtomicU64,
    /// Goose users that have made their first request.
    pub(super) users_started: Mutex<std::collections::HashSet<usize>>,
    pub(super) full_load_at_us: AtomicU64,
    pub(super) decided: AtomicBool,
    /// Every answer, all products together.
    pub(super) tally: Arc<Tally>,
    /// One pooled client for all users: keep-alive connections to every host.
    pub(super) client: reqwest::Client,
}

/// One product's sale within an attack.
pub(super) struct Shelf {
    pub(super) product: Product,
    /// How many buyers buy here.
    pub(super) buyers: u64,
    /// The answers about this product alone (each is in the plan's tally too).
    pub(super) tally: Arc<Tally>,
    pub(super) tried: AtomicU64,
    pub(super) answered: AtomicU64,
    /// When its last restock committed, since the start, in µs (0: none yet).
    pub(super) restocked_at_us: AtomicU64,
    pub(super) restock_started: AtomicBool,
}

impl Plan {
    /// The plan of an attack: `buyers` over `products` (buyer `b` at product
    /// `(b - 1) % products.len()`), every buyer untried, nothing counted yet.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub(super) fn new(
        hosts: &[String],
        operator: Option<&super::Operator>,
        products: &[Product],
        buyers: u64,
        extras: Extras,
        users: usize,
    ) -> anyhow::Result<Self> {
        Ok(Plan {
            hosts: hosts.to_vec(),
            operator: operator.cloned(),
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
            tally: Arc::default(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                // Idle connections are dropped well before the service's keep-alive (5 s)
                // ends them: a request sent on a connection the server is closing at that
                // moment gets no answer, which the books would count as a lost one.
                .pool_idle_timeout(Duration::from_secs(2))
                .build()?,
        })
    }

    pub(super) fn since_start_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Units of every product at the start.
    pub(super) fn initial_stock(&self) -> i64 {
        self.shelves.iter().map(|s| s.product.stock).sum()
    }

    /// Where buyer `buyer` (from 1) buys.
    pub(super) fn shelf_of(&self, buyer: u64) -> &Shelf {
        &self.shelves[((buyer - 1) % self.shelves.len() as u64) as usize]
    }

    /// The next buyer without a final answer, or `None` when every buyer has one.
    pub(super) fn next_buyer(&self) -> Option<u64> {
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
    pub(super) fn user_started(&self, index: usize) {
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
    pub(super) fn check_decided(&self) {
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
    pub(super) async fn maybe_restock(&self, shelf: &Shelf) {
        let half = (shelf.product.stock / 2).max(1) as u64;
        if self.extras.restock <= 0
            || shelf.tally.count(&shelf.tally.created) < half
            || shelf.restock_started.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let Some(operator) = &self.operator else {
            return;
        };
        let answer = self
            .client
            .post(format!(
                "{}/api/products/{}/restock",
                operator.url, shelf.product.id
            ))
            .bearer_auth(&operator.token)
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

/// While it runs, on a terminal only: sold/stock, orders per second, answers by kind.
pub(super) fn show_progress(plan: Arc<Plan>) -> Option<tokio::task::JoinHandle<()>> {
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
