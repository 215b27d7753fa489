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
//!
//! **Layout.** [`run`] settles goose's options, builds the `plan` the goose users share,
//! runs goose (each turn is `buyer::purchase`) and gathers the [`AttackReport`] (`report`)
//! from the plan's [`Tally`] (`tally`) and its shelves.

mod buyer;
mod plan;
mod report;
mod tally;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use serde_json::{Value, json};

use plan::Plan;
pub use report::{AttackReport, ProductReport};
pub use tally::Tally;

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

    /// Sleep `duration`, or less if Ctrl-C comes.
    pub async fn hold(&self, duration: std::time::Duration) {
        let until = tokio::time::Instant::now() + duration;
        while tokio::time::Instant::now() < until && !self.is_set() {
            let left = until - tokio::time::Instant::now();
            tokio::time::sleep(left.min(std::time::Duration::from_millis(50))).await;
        }
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

/// A product on sale in an attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    pub id: i64,
    /// Units it was created with.
    pub stock: i64,
}

/// `stock` units over `products` products, the first ones taking the remainder; each
/// product gets at least one unit only if `stock >= products`.
pub fn split_stock(stock: i64, products: u64) -> Vec<i64> {
    let n = products.max(1) as i64;
    (0..n)
        .map(|i| stock / n + i64::from(i < stock % n))
        .collect()
}

/// Where an attack creates and restocks its products: an instance's operators' listener
/// (`OPS_BIND_ADDR`), with the admin token.
#[derive(Debug, Clone)]
pub struct Operator {
    /// `http://host:port` of the operators' listener.
    pub url: String,
    pub token: String,
}

impl Operator {
    pub fn new(url: &str, token: &str) -> Self {
        Self {
            url: url.to_owned(),
            token: token.to_owned(),
        }
    }
}

/// Create `count` products selling `stock` units between them ([`split_stock`]), through
/// the operators' listener `ops_url`.
///
/// # Errors
/// As [`create_product`].
pub async fn create_products(
    ops_url: &str,
    admin_token: &str,
    stock: i64,
    count: u64,
) -> anyhow::Result<Vec<Product>> {
    let mut products = Vec::new();
    for stock in split_stock(stock, count) {
        let id = create_product(ops_url, admin_token, stock).await?;
        products.push(Product { id, stock });
    }
    Ok(products)
}

/// Create a product through the admin API of the operators' listener `ops_url`.
pub async fn create_product(ops_url: &str, admin_token: &str, stock: i64) -> anyhow::Result<i64> {
    let response = reqwest::Client::new()
        .post(format!("{ops_url}/api/products"))
        .bearer_auth(admin_token)
        .json(&json!({"name": format!("loadtest {}", std::process::id()), "stock": stock}))
        .send()
        .await
        .with_context(|| format!("cannot reach {ops_url} to create the product"))?;
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
    operator: Option<&Operator>,
    products: &[Product],
    buyers: u64,
    extras: Extras,
) -> anyhow::Result<AttackReport> {
    let users = settle_config(&mut config, products, buyers)?;
    let plan = Arc::new(Plan::new(hosts, operator, products, buyers, extras, users)?);
    let progress = plan::show_progress(Arc::clone(&plan));
    let goose_error = run_goose(config, &hosts[0], &plan).await?;
    // Set only by `check_decided` until now: whoever else stopped goose left it unset.
    let decided = plan.decided.swap(true, Ordering::SeqCst);
    if let Some(progress) = progress {
        let _ = progress.await;
    }
    Ok(AttackReport::of(&plan, products, goose_error, decided))
}

/// Refuse what the attack cannot do, default `--run-time` to 60 s, and say how many goose
/// users will run: `--users`, or else one per CPU (goose's own default).
fn settle_config(
    config: &mut GooseConfiguration,
    products: &[Product],
    buyers: u64,
) -> anyhow::Result<usize> {
    refuse_ignored_options(config)?;
    if products.is_empty() || buyers < products.len() as u64 {
        bail!(
            "an attack needs a product and at least one buyer per product ({} products, {buyers} buyers)",
            products.len()
        );
    }
    if config.run_time.is_none() {
        config.run_time = Some("60".into());
    }
    Ok(config
        .users
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1))
}

/// Run goose's buyers on `plan` until goose stops; the error it stopped with, if any.
///
/// # Errors
/// Goose failing to start.
async fn run_goose(
    config: GooseConfiguration,
    host: &str,
    plan: &Arc<Plan>,
) -> anyhow::Result<Option<String>> {
    let buy: TransactionFunction = {
        let plan = Arc::clone(plan);
        Arc::new(move |user| {
            let plan = Arc::clone(&plan);
            Box::pin(async move { buyer::purchase(user, &plan).await })
        })
    };
    let goose = GooseAttack::initialize_with_config(config)?
        .register_scenario(
            scenario!("Buyers").register_transaction(Transaction::new(buy).set_name("purchase")),
        )
        .set_default(GooseDefault::Host, host)?
        // The telnet controller listens on a fixed port; several attacks (the demo) would
        // collide.
        .set_default(GooseDefault::NoTelnet, true)?
        // The books cover the whole sale, ramp-up included; so do the figures.
        .set_default(GooseDefault::NoResetMetrics, true)?
        .execute()
        .await;
    Ok(goose.err().map(|error| error.to_string()))
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
            .bearer_auth(crate::buyers::token(*buyer as i64))
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

    /// The stock is split over the products, the first ones taking the remainder.
    #[test]
    fn the_stock_is_split_over_the_products_the_first_taking_the_rest() {
        assert_eq!(split_stock(25_000, 1), [25_000]);
        assert_eq!(split_stock(10, 4), [3, 3, 2, 2]);
        assert_eq!(split_stock(10, 4).iter().sum::<i64>(), 10);
    }
}
