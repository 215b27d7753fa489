//! The books, read from PostgreSQL, and the verdict they earn.
//!
//! A PASS must mean that a real sale took place and balanced: it cannot pass with nothing
//! sold, with refused requests, with buyers wrongly told "sold out", or with a flood of
//! `busy` answers. With several products on sale, every check must hold for each product on
//! its own as well as for all of them together: two products whose errors cancel out in the
//! sum do not balance.

use std::fmt::Write as _;

use anyhow::Context;
use sqlx::PgPool;

use crate::attack::{AttackReport, Tally};

/// The largest share of `busy` answers a passing sale may have, among the requests that
/// reached a sale (every request but those answered `sold_out`, which a sold-out product
/// answers from memory in any number): a buyer told "busy" was not served, and retries.
/// Beyond 5 %, the sale was not really served.
pub const BUSY_BOUND: f64 = 0.05;

/// What PostgreSQL says about the product after the attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Books {
    pub stock: i64,
    pub orders: i64,
    /// Sum of order quantities.
    pub sold: i64,
    /// What the stock ledger says the product was supplied with (restocks included).
    pub supplied: i64,
    pub users_with_several_orders: i64,
}

impl Books {
    /// `supplied = stock + sold`, and the stock never below zero.
    pub fn balance(&self) -> bool {
        self.supplied == self.stock + self.sold && self.stock >= 0
    }

    /// Units sold beyond what was supplied.
    pub fn oversold(&self) -> i64 {
        (self.sold - self.supplied).max(0)
    }

    /// Units sold that the stock does not show taken: what lost updates left behind.
    pub fn lost_updates(&self) -> i64 {
        self.sold - (self.supplied - self.stock)
    }

    /// The books of several products added up.
    pub fn sum(all: impl IntoIterator<Item = Books>) -> Books {
        all.into_iter().fold(
            Books {
                stock: 0,
                orders: 0,
                sold: 0,
                supplied: 0,
                users_with_several_orders: 0,
            },
            |a, b| Books {
                stock: a.stock + b.stock,
                orders: a.orders + b.orders,
                sold: a.sold + b.sold,
                supplied: a.supplied + b.supplied,
                users_with_several_orders: a.users_with_several_orders
                    + b.users_with_several_orders,
            },
        )
    }
}

/// Judge the attack `report` made on the instances at `host`: read the books from
/// PostgreSQL, and ask the service which buyers who lost their answer have an order.
///
/// # Errors
/// When PostgreSQL or the service cannot be asked.
pub async fn judge(
    report: &AttackReport,
    host: &str,
    database_url: &str,
) -> anyhow::Result<Verdict> {
    if report.products.len() > 1 {
        return judge_each(report, host, database_url).await;
    }
    let books = read(database_url, report.product_id).await?;
    let committed = crate::attack::orders_of(host, report.product_id, &report.lost_answers).await?;
    Ok(Verdict::judge(report, books, committed))
}

/// [`judge`] for an attack on several products: each product judged on its own books and
/// answers, all of them together on the sum, and the verdicts combined
/// ([`Verdict::combine`]).
async fn judge_each(
    report: &AttackReport,
    host: &str,
    database_url: &str,
) -> anyhow::Result<Verdict> {
    let mut each = Vec::new();
    let mut committed_in_all = 0;
    for index in 0..report.products.len() {
        let part = report.product(index).expect("an index of the products");
        let books = read(database_url, part.product_id).await?;
        let committed = crate::attack::orders_of(host, part.product_id, &part.lost_answers).await?;
        committed_in_all += committed;
        each.push((part.product_id, Verdict::judge(&part, books, committed)));
    }
    let books = Books::sum(each.iter().map(|(_, v)| v.books));
    let total = Verdict::judge(report, books, committed_in_all);
    Ok(Verdict::combine(total, each))
}

pub async fn read(database_url: &str, product_id: i64) -> anyhow::Result<Books> {
    let pool = PgPool::connect(database_url)
        .await
        .context("cannot connect to PostgreSQL to check the books")?;
    let books = read_from(&pool, product_id).await;
    pool.close().await;
    books
}

pub async fn read_from(pool: &PgPool, product_id: i64) -> anyhow::Result<Books> {
    // Checked against the service's schema at compile time, like the service's own SQL:
    // a judge that misread a column would pass anything.
    let stock = sqlx::query_scalar!("SELECT stock FROM products WHERE id = $1", product_id)
        .fetch_one(pool)
        .await
        .context("reading the product")?;
    let totals = sqlx::query!(
        r#"SELECT COUNT(*) AS "orders!", COALESCE(SUM(quantity), 0)::BIGINT AS "sold!"
           FROM orders WHERE product_id = $1"#,
        product_id
    )
    .fetch_one(pool)
    .await?;
    let (orders, sold) = (totals.orders, totals.sold);
    let supplied = sqlx::query_scalar!(
        r#"SELECT COALESCE(SUM(delta), 0)::BIGINT AS "supplied!"
           FROM stock_changes WHERE product_id = $1"#,
        product_id
    )
    .fetch_one(pool)
    .await?;
    let users_with_several_orders = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "users!" FROM (SELECT user_id FROM orders WHERE product_id = $1
           GROUP BY user_id HAVING COUNT(*) > 1) AS several"#,
        product_id
    )
    .fetch_one(pool)
    .await?;
    Ok(Books {
        stock,
        orders,
        sold,
        supplied,
        users_with_several_orders,
    })
}

/// One line of the verdict.
#[derive(Debug)]
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

#[derive(Debug)]
pub struct Verdict {
    pub checks: Vec<Check>,
    /// All products together.
    pub books: Books,
    /// Each product's books, by id.
    pub products: Vec<(i64, Books)>,
}

/// Names of the checks, for callers that look for one.
pub const SALE_HAPPENED: &str = "sale happened";
pub const NO_OVERSELL: &str = "no oversell";
pub const NO_LOST_UPDATE: &str = "no lost update";
pub const ONE_ORDER_PER_USER: &str = "one order per user";
pub const NO_REFUSED_REQUEST: &str = "no other 4xx";
pub const NO_WRONG_SOLD_OUT: &str = "no sold_out with stock";
pub const BUSY_SHARE: &str = "busy share";
pub const NO_SERVER_ERROR: &str = "no 5xx but busy";
pub const GOOSE: &str = "goose thresholds";

impl Verdict {
    /// Judge an attack by its answers and the books. `lost_but_committed`: of the buyers
    /// whose answer was lost, how many have an order after all.
    pub fn judge(report: &AttackReport, books: Books, lost_but_committed: u64) -> Self {
        let mut checks = vec![
            sale_happened(report, &books),
            no_oversell(&books),
            no_lost_update(report, &books, lost_but_committed),
            one_order_per_user(report, &books),
            no_refused_request(report),
            no_wrong_sold_out(report, &books),
            busy_share(report),
            no_server_error(report, lost_but_committed),
        ];
        if let Some(error) = &report.goose_error {
            checks.push(Check {
                name: GOOSE,
                pass: false,
                detail: error.clone(),
            });
        }
        Self {
            checks,
            books,
            products: vec![(report.product_id, books)],
        }
    }

    /// One verdict for an attack on several products: `total` (all of them together), each
    /// check failing where it failed for any product too, its detail then naming those
    /// products and what the first of them showed; each product's books kept.
    pub fn combine(mut total: Verdict, each: Vec<(i64, Verdict)>) -> Verdict {
        for check in &mut total.checks {
            let failed: Vec<(i64, &Check)> = each
                .iter()
                .filter_map(|(id, verdict)| {
                    let own = verdict.checks.iter().find(|c| c.name == check.name)?;
                    (!own.pass).then_some((*id, own))
                })
                .collect();
            if let Some((_, first)) = failed.first() {
                let ids: Vec<String> = failed.iter().map(|(id, _)| id.to_string()).collect();
                check.pass = false;
                check.detail = format!(
                    "{}; failed for product(s) {}, the first: {}",
                    check.detail,
                    ids.join(", "),
                    first.detail
                );
            }
        }
        total.products = each.iter().map(|(id, v)| (*id, v.books)).collect();
        total
    }

    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }

    /// Whether the check called `name` passed.
    pub fn check(&self, name: &str) -> Option<bool> {
        self.checks.iter().find(|c| c.name == name).map(|c| c.pass)
    }

    /// The table, then the last line `VERDICT PASS ...` or `VERDICT FAIL ...`.
    pub fn render(&self, report: &AttackReport) -> String {
        let mut out = String::new();
        let ids: Vec<String> = self.products.iter().map(|(id, _)| id.to_string()).collect();
        match ids.as_slice() {
            [_, _, ..] => {
                let _ = writeln!(out, "\n=== BOOKS (products {}) ===", ids.join(", "));
            }
            _ => {
                let _ = writeln!(out, "\n=== BOOKS (product {}) ===", report.product_id);
            }
        }
        write_answers(&mut out, report);
        self.write_products(&mut out);
        let _ = writeln!(out, "{:<24} {:<6} detail", "check", "result");
        for check in &self.checks {
            let result = if check.pass { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "{:<24} {:<6} {}", check.name, result, check.detail);
        }
        self.write_verdict_line(&mut out, &report.tally);
        out
    }

    /// Each product's books, when there are several.
    fn write_products(&self, out: &mut String) {
        if self.products.len() > 1 {
            for (id, b) in &self.products {
                let _ = writeln!(
                    out,
                    "product {id}: supplied {} = stock {} + sold {}? {}; {} orders",
                    b.supplied,
                    b.stock,
                    b.sold,
                    if b.balance() { "yes" } else { "NO" },
                    b.orders
                );
            }
        }
    }

    /// `VERDICT PASS ...` or `VERDICT FAIL ...`, with the books and the failed checks.
    fn write_verdict_line(&self, out: &mut String, t: &Tally) {
        let b = self.books;
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| c.name)
            .collect();
        let _ = write!(
            out,
            "VERDICT {} supplied={} final={} orders={} sold={} created_answers={} busy={} other_5xx={}{}",
            if self.passed() { "PASS" } else { "FAIL" },
            b.supplied,
            b.stock,
            b.orders,
            b.sold,
            t.count(&t.created),
            t.count(&t.busy),
            t.count(&t.other_5xx),
            if failed.is_empty() {
                String::new()
            } else {
                format!(" failed=[{}]", failed.join(", "))
            },
        );
    }
}

/// The answers by kind, and the rate and latencies.
fn write_answers(out: &mut String, report: &AttackReport) {
    let t = &report.tally;
    let _ = writeln!(
        out,
        "answers: {} requests, {} created, {} sold out, {} already purchased, {} busy, {} other 4xx, {} other 5xx, {} unanswered; {} restocked",
        t.requests(),
        t.count(&t.created),
        t.count(&t.sold_out),
        t.count(&t.already_purchased),
        t.count(&t.busy),
        t.count(&t.other_4xx),
        t.count(&t.other_5xx),
        t.count(&t.transport_errors),
        t.count(&t.restocked),
    );
    let load = match report.full_load_at {
        Some(at) => format!(
            "from full load ({} users, at {:.1} s)",
            report.users,
            at.as_secs_f64()
        ),
        None => format!(
            "from the first order (the sale ended before all {} users ran)",
            report.users
        ),
    };
    let _ = writeln!(
        out,
        "rate: {:.0} orders/s {load}; latency of all attempts p50 {:?}, p99 {:?}; of 201s p50 {:?}, p99 {:?}; {:.1} s in all",
        report.orders_per_sec(),
        t.latency(0.50),
        t.latency(0.99),
        t.created_latency(0.50),
        t.created_latency(0.99),
        report.elapsed.as_secs_f64(),
    );
}

/// Something was sold, and the sale ended: sold out, or every buyer answered.
fn sale_happened(report: &AttackReport, books: &Books) -> Check {
    Check {
        name: SALE_HAPPENED,
        pass: books.sold > 0 && (books.stock == 0 || report.unanswered_buyers == 0),
        detail: format!(
            "sold {} of {}; {} of {} buyers without a final answer",
            books.sold, books.supplied, report.unanswered_buyers, report.buyers
        ),
    }
}

fn no_oversell(books: &Books) -> Check {
    Check {
        name: NO_OVERSELL,
        pass: books.sold <= books.supplied && books.stock >= 0,
        detail: format!(
            "sold {} of {} supplied, stock {}",
            books.sold, books.supplied, books.stock
        ),
    }
}

/// The books balance, and every order sold was answered 201 or its answer was lost.
fn no_lost_update(report: &AttackReport, books: &Books, lost_but_committed: u64) -> Check {
    let t = &report.tally;
    let answered_units = t.count(&t.created) as i64;
    Check {
        name: NO_LOST_UPDATE,
        pass: books.balance() && books.sold == answered_units + lost_but_committed as i64,
        detail: format!(
            "supplied {} = stock {} + sold {}? orders {}; 201 answers {}, lost answers whose order committed {}",
            books.supplied,
            books.stock,
            books.sold,
            books.orders,
            answered_units,
            lost_but_committed
        ),
    }
}

fn one_order_per_user(report: &AttackReport, books: &Books) -> Check {
    let t = &report.tally;
    Check {
        name: ONE_ORDER_PER_USER,
        pass: books.users_with_several_orders == 0 && report.buyers_with_two_201s == 0,
        detail: format!(
            "{} users with several orders, {} with two 201s; {} twin pairs (one buyer on two instances at once), {} told already_purchased",
            books.users_with_several_orders,
            report.buyers_with_two_201s,
            t.count(&t.twins),
            t.count(&t.twin_already_purchased)
        ),
    }
}

fn no_refused_request(report: &AttackReport) -> Check {
    let t = &report.tally;
    Check {
        name: NO_REFUSED_REQUEST,
        pass: t.count(&t.other_4xx) == 0,
        detail: format!("{} 4xx answers other than 409", t.count(&t.other_4xx)),
    }
}

/// No `sold_out` after the last restock while stock was left and every buyer answered.
fn no_wrong_sold_out(report: &AttackReport, books: &Books) -> Check {
    let t = &report.tally;
    let wrong_sold_out =
        books.stock > 0 && report.unanswered_buyers == 0 && t.count(&t.sold_out_after_restock) > 0;
    Check {
        name: NO_WRONG_SOLD_OUT,
        pass: !wrong_sold_out,
        detail: format!(
            "{} sold_out answers after the last restock, stock left {}",
            t.count(&t.sold_out_after_restock),
            books.stock
        ),
    }
}

fn busy_share(report: &AttackReport) -> Check {
    let t = &report.tally;
    let to_the_sale = (t.requests() as u64).saturating_sub(t.count(&t.sold_out));
    let busy_share = t.busy_share();
    Check {
        name: BUSY_SHARE,
        pass: busy_share <= BUSY_BOUND,
        detail: format!(
            "{} busy of {} requests not answered sold_out ({:.2} %, bound {:.0} %)",
            t.count(&t.busy),
            to_the_sale,
            busy_share * 100.0,
            BUSY_BOUND * 100.0
        ),
    }
}

fn no_server_error(report: &AttackReport, lost_but_committed: u64) -> Check {
    let t = &report.tally;
    let lost = report.lost_answers.len() as u64;
    let (other_5xx, no_answer) = (t.count(&t.other_5xx), t.count(&t.transport_errors));
    Check {
        name: NO_SERVER_ERROR,
        pass: other_5xx == 0 && no_answer == 0,
        detail: format!(
            "{other_5xx} other 5xx, {no_answer} unanswered; {lost} buyers lost an answer, of whom {lost_but_committed} have their order (committed, answer lost) and {} have none",
            lost - lost_but_committed.min(lost)
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;
    use crate::attack::Tally;

    /// An attack on 100 units by 200 buyers, with `tune` applied to its tally.
    fn report(tune: impl FnOnce(&Tally), unanswered: u64) -> AttackReport {
        let tally = Tally::default();
        tune(&tally);
        AttackReport {
            product_id: 1,
            initial_stock: 100,
            buyers: 200,
            users: 10,
            elapsed: Duration::from_secs(3),
            full_load_at: None,
            unanswered_buyers: unanswered,
            buyers_with_two_201s: 0,
            lost_answers: tally.lost_answers(),
            goose_error: None,
            decided: unanswered == 0,
            tally: Arc::new(tally),
            products: Vec::new(),
        }
    }

    fn answers(tally: &Tally, created: u64, sold_out: u64) {
        tally.created.store(created, Ordering::SeqCst);
        tally.sold_out.store(sold_out, Ordering::SeqCst);
        tally
            .sold_out_after_restock
            .store(sold_out, Ordering::SeqCst);
        let requests = vec![1_000; (created + sold_out) as usize];
        tally.latencies_us.lock().unwrap().extend(requests);
    }

    fn sold_out_books() -> Books {
        Books {
            stock: 0,
            orders: 100,
            sold: 100,
            supplied: 100,
            users_with_several_orders: 0,
        }
    }

    fn failed(verdict: &Verdict) -> Vec<&'static str> {
        verdict
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn a_balanced_sell_out_passes() {
        let verdict = Verdict::judge(&report(|t| answers(t, 100, 100), 0), sold_out_books(), 0);
        assert!(verdict.passed(), "{verdict:?}");
    }

    #[test]
    fn nothing_sold_fails_even_if_every_answer_was_an_expected_one() {
        let nothing = Books {
            stock: 100,
            orders: 0,
            sold: 0,
            supplied: 100,
            users_with_several_orders: 0,
        };
        let verdict = Verdict::judge(&report(|t| answers(t, 0, 0), 200), nothing, 0);
        assert!(failed(&verdict).contains(&SALE_HAPPENED), "{verdict:?}");
    }

    #[test]
    fn any_other_4xx_fails() {
        let report = report(
            |t| {
                answers(t, 100, 99);
                t.other_4xx.store(1, Ordering::SeqCst);
            },
            0,
        );
        let verdict = Verdict::judge(&report, sold_out_books(), 0);
        assert_eq!(failed(&verdict), [NO_REFUSED_REQUEST]);
    }

    #[test]
    fn sold_out_answers_while_stock_is_left_fail_once_everyone_was_answered() {
        // Every buyer answered, 10 units left, and buyers were told "sold out": a stale mark.
        let left = Books {
            stock: 10,
            orders: 90,
            sold: 90,
            supplied: 100,
            users_with_several_orders: 0,
        };
        let verdict = Verdict::judge(&report(|t| answers(t, 90, 110), 0), left, 0);
        assert_eq!(failed(&verdict), [NO_WRONG_SOLD_OUT]);
        // With buyers still unanswered (the attack ran out of time), it is not judged so.
        let verdict = Verdict::judge(&report(|t| answers(t, 90, 60), 50), left, 0);
        assert!(
            !failed(&verdict).contains(&NO_WRONG_SOLD_OUT),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_flood_of_busy_answers_fails() {
        let report = report(
            |t| {
                answers(t, 100, 100);
                t.busy.store(50, Ordering::SeqCst);
            },
            0,
        );
        let verdict = Verdict::judge(&report, sold_out_books(), 0);
        assert_eq!(failed(&verdict), [BUSY_SHARE]);
    }

    #[test]
    fn busy_answers_are_not_diluted_by_sold_out_answers_after_the_sale() {
        // 100 sold, 8 buyers told busy, then 10,000 fast sold_out answers.
        let report = report(
            |t| {
                answers(t, 100, 10_000);
                t.busy.store(8, Ordering::SeqCst);
                t.latencies_us.lock().unwrap().extend([1_000; 8]);
            },
            0,
        );
        let verdict = Verdict::judge(&report, sold_out_books(), 0);
        assert_eq!(failed(&verdict), [BUSY_SHARE]);
    }

    #[test]
    fn a_lost_answer_whose_order_committed_is_not_a_lost_update() {
        // 99 buyers got 201; one timed out, but their order is there.
        let report = report(
            |t| {
                answers(t, 99, 100);
                t.transport_errors.store(1, Ordering::SeqCst);
                t.lost_answers.lock().unwrap().push(42);
            },
            0,
        );
        let verdict = Verdict::judge(&report, sold_out_books(), 1);
        assert_eq!(verdict.check(NO_LOST_UPDATE), Some(true), "{verdict:?}");
        assert_eq!(failed(&verdict), [NO_SERVER_ERROR]);
        let detail = &verdict
            .checks
            .iter()
            .find(|c| c.name == NO_SERVER_ERROR)
            .unwrap()
            .detail;
        assert!(detail.contains("1 have their order"), "{detail}");
    }

    #[test]
    fn a_restock_counts_in_what_was_supplied() {
        let restocked = Books {
            stock: 0,
            orders: 150,
            sold: 150,
            supplied: 150,
            users_with_several_orders: 0,
        };
        let verdict = Verdict::judge(&report(|t| answers(t, 150, 50), 0), restocked, 0);
        assert!(verdict.passed(), "{verdict:?}");
        // The same answers against books that lost the restocked units fail.
        let lost = Books {
            stock: 0,
            orders: 150,
            sold: 150,
            supplied: 100,
            ..restocked
        };
        let verdict = Verdict::judge(&report(|t| answers(t, 150, 50), 0), lost, 0);
        assert!(failed(&verdict).contains(&NO_LOST_UPDATE), "{verdict:?}");
        assert!(failed(&verdict).contains(&NO_OVERSELL), "{verdict:?}");
    }

    #[test]
    fn an_oversold_sale_fails_on_oversell_and_lost_update_only() {
        let oversold = Books {
            stock: 0,
            orders: 130,
            sold: 130,
            supplied: 100,
            users_with_several_orders: 0,
        };
        let verdict = Verdict::judge(&report(|t| answers(t, 130, 70), 0), oversold, 0);
        assert_eq!(failed(&verdict), [NO_OVERSELL, NO_LOST_UPDATE]);
    }

    /// Two products whose errors cancel out in the sum fail on their own books.
    #[test]
    fn products_whose_errors_cancel_out_in_the_sum_fail_on_their_own() {
        // Product 1 sold 50 but its stock shows 49 taken; product 2 sold 49 and shows 50 taken.
        // Together: supplied 100 = stock 1 + sold 99, and 99 orders answered.
        let one = Books {
            stock: 1,
            orders: 50,
            sold: 50,
            supplied: 50,
            users_with_several_orders: 0,
        };
        let two = Books {
            stock: 0,
            orders: 49,
            sold: 49,
            supplied: 50,
            users_with_several_orders: 0,
        };
        let total = Verdict::judge(&report(|t| answers(t, 99, 0), 0), Books::sum([one, two]), 0);
        assert!(total.passed(), "{total:?}");
        let each = vec![
            (1, Verdict::judge(&report(|t| answers(t, 50, 0), 0), one, 0)),
            (2, Verdict::judge(&report(|t| answers(t, 49, 0), 0), two, 0)),
        ];

        let verdict = Verdict::combine(total, each);

        assert_eq!(failed(&verdict), [NO_LOST_UPDATE]);
        let detail = &verdict
            .checks
            .iter()
            .find(|c| c.name == NO_LOST_UPDATE)
            .unwrap()
            .detail;
        assert!(detail.contains("failed for product(s) 1, 2"), "{detail}");
        assert_eq!(verdict.products, [(1, one), (2, two)]);
    }

    #[test]
    fn a_failed_goose_threshold_is_its_own_failed_line() {
        let mut report = report(|t| answers(t, 100, 100), 0);
        report.goose_error = Some("one or more thresholds failed".into());
        let verdict = Verdict::judge(&report, sold_out_books(), 0);
        assert_eq!(failed(&verdict), [GOOSE]);
        assert!(
            verdict
                .render(&report)
                .lines()
                .last()
                .unwrap()
                .starts_with("VERDICT FAIL")
        );
    }
}
