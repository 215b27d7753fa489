//! The books, read from PostgreSQL, and the verdict they earn.

use std::fmt::Write as _;

use anyhow::Context;
use sqlx::PgPool;

use crate::attack::AttackReport;

/// What PostgreSQL says about the product after the attack.
#[derive(Debug, Clone, Copy)]
pub struct Books {
    pub stock: i64,
    pub orders: i64,
    /// Sum of order quantities.
    pub sold: i64,
    pub users_with_several_orders: i64,
}

pub async fn read(database_url: &str, product_id: i64) -> anyhow::Result<Books> {
    let pool = PgPool::connect(database_url)
        .await
        .context("cannot connect to PostgreSQL to check the books")?;
    let stock: i64 = sqlx::query_scalar("SELECT stock FROM products WHERE id = $1")
        .bind(product_id)
        .fetch_one(&pool)
        .await
        .context("reading the product")?;
    let (orders, sold): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COALESCE(SUM(quantity), 0)::BIGINT FROM orders WHERE product_id = $1",
    )
    .bind(product_id)
    .fetch_one(&pool)
    .await?;
    let users_with_several_orders: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE product_id = $1
         GROUP BY user_id HAVING COUNT(*) > 1) AS several",
    )
    .bind(product_id)
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(Books {
        stock,
        orders,
        sold,
        users_with_several_orders,
    })
}

/// One line of the verdict.
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

pub struct Verdict {
    pub checks: Vec<Check>,
    pub books: Books,
}

impl Verdict {
    pub fn judge(report: &AttackReport, books: Books) -> Self {
        let tally = &report.tally;
        let initial = report.initial_stock;
        let answered = tally.count(&tally.created_quantity) as i64;
        let other_5xx = tally.count(&tally.other_5xx);
        let no_answer = tally.count(&tally.transport_errors);
        let checks = vec![
            Check {
                name: "no oversell",
                pass: books.sold <= initial && books.stock >= 0,
                detail: format!("sold {} of {initial}, stock {}", books.sold, books.stock),
            },
            Check {
                name: "no lost update",
                pass: initial - books.stock == books.sold && books.sold == answered,
                detail: format!(
                    "initial - final = {}, orders sum = {}, 201 answers = {answered}",
                    initial - books.stock,
                    books.sold
                ),
            },
            Check {
                name: "one order per user",
                pass: books.users_with_several_orders == 0,
                detail: format!(
                    "{} users with several orders",
                    books.users_with_several_orders
                ),
            },
            Check {
                name: "no 5xx but 503 busy",
                pass: other_5xx == 0 && no_answer == 0,
                detail: format!("{other_5xx} other 5xx, {no_answer} unanswered"),
            },
        ];
        Self { checks, books }
    }

    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }

    /// The table, then the last line `VERDICT PASS ...` or `VERDICT FAIL ...`.
    pub fn render(&self, report: &AttackReport) -> String {
        let t = &report.tally;
        let mut out = String::new();
        let _ = writeln!(out, "\n=== BOOKS (product {}) ===", report.product_id);
        let _ = writeln!(
            out,
            "answers: {} requests, {} created, {} sold out, {} already purchased, {} busy, {} other 4xx, {} other 5xx, {} unanswered",
            t.requests(),
            t.count(&t.created),
            t.count(&t.sold_out),
            t.count(&t.already_purchased),
            t.count(&t.busy),
            t.count(&t.other_4xx),
            t.count(&t.other_5xx),
            t.count(&t.transport_errors),
        );
        let _ = writeln!(
            out,
            "rate: {:.0} orders/s until sell-out; latency of all attempts p50 {:?}, p99 {:?}; of 201s p50 {:?}, p99 {:?}",
            report.orders_per_sec(),
            t.latency(0.50),
            t.latency(0.99),
            t.created_latency(0.50),
            t.created_latency(0.99),
        );
        let _ = writeln!(out, "{:<22} {:<6} detail", "check", "result");
        for check in &self.checks {
            let result = if check.pass { "PASS" } else { "FAIL" };
            let _ = writeln!(out, "{:<22} {:<6} {}", check.name, result, check.detail);
        }
        let b = self.books;
        let _ = write!(
            out,
            "VERDICT {} initial={} final={} orders={} sold={} created_answers={} busy={} other_5xx={}",
            if self.passed() { "PASS" } else { "FAIL" },
            report.initial_stock,
            b.stock,
            b.orders,
            b.sold,
            t.count(&t.created_quantity),
            t.count(&t.busy),
            t.count(&t.other_5xx),
        );
        out
    }
}
