//! A row of the demo's comparison: what one run measured, and what it shows (its verdict).

use std::time::Duration;

use seckill::LockStrategy;

use crate::attack::AttackReport;
use crate::books::{NO_LOST_UPDATE, NO_OVERSELL, NO_SERVER_ERROR, SALE_HAPPENED, Verdict};
use crate::chart;

/// One row of the comparison.
pub struct Row {
    pub strategy: LockStrategy,
    pub batch_max: u32,
    /// Units put on sale.
    pub stock: i64,
    pub outcome: Result<Figures, String>,
}

/// What one strategy's run measured.
pub struct Figures {
    pub orders_per_sec: f64,
    /// Latency of every purchase attempt.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency of the purchases that got an order.
    pub created_p50_ms: f64,
    pub created_p99_ms: f64,
    pub oversold: i64,
    pub lost_updates: i64,
    pub busy_share: f64,
    /// Orders sold by each instance (from their `/metrics`).
    pub split: Vec<u64>,
    pub verdict: Verdict,
    pub orders_over_time: Vec<u64>,
    /// The attack ran into `--max-seconds` before the sale was decided.
    pub time_bound: bool,
}

/// What a row shows, for the table and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowVerdict {
    /// A safe strategy sold out (or answered every buyer) and kept its books.
    Pass,
    /// `none` broke the books (oversold or lost updates), as it must, and nothing else.
    FailedAsExpected,
    /// A safe strategy kept its books but reached the time bound with stock left: `sold` of
    /// `supplied` units were sold. Its figures are from a partial sale.
    Incomplete { sold: i64, supplied: i64 },
    /// A check failed: these.
    Fail(Vec<&'static str>),
    /// `none` did not show the race; with the checks that failed, if any.
    RaceNotShown(Vec<&'static str>),
    /// The run could not be made or judged.
    Error(String),
}

impl RowVerdict {
    /// Whether this row makes the demo exit non-zero: anything but a pass, `none` failing
    /// as it must, or a run stopped by the time bound with its books intact.
    pub fn fails_the_demo(&self) -> bool {
        !matches!(
            self,
            RowVerdict::Pass | RowVerdict::FailedAsExpected | RowVerdict::Incomplete { .. }
        )
    }
}

impl std::fmt::Display for RowVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RowVerdict::Pass => write!(f, "PASS"),
            RowVerdict::FailedAsExpected => write!(f, "FAIL (expected: no lock)"),
            RowVerdict::Incomplete { sold, supplied } => {
                write!(f, "INCOMPLETE: time bound, {sold} of {supplied} sold")
            }
            RowVerdict::Fail(failed) => write!(f, "FAIL ({})", failed.join(", ")),
            RowVerdict::RaceNotShown(failed) if failed.is_empty() => {
                write!(f, "UNEXPECTED: no oversell or lost update shown")
            }
            RowVerdict::RaceNotShown(failed) => write!(
                f,
                "UNEXPECTED: no oversell or lost update shown; failed: {}",
                failed.join(", ")
            ),
            RowVerdict::Error(why) => write!(f, "ERROR: {why}"),
        }
    }
}

impl Row {
    pub fn label(&self) -> String {
        if self.batch_max == 1 {
            format!("{}/1", self.strategy.name())
        } else {
            self.strategy.name().to_owned()
        }
    }

    /// `none` must fail on oversell or lost update, and on nothing that would mean the
    /// service broke (a 5xx); every other strategy must pass, or keep its books until the
    /// time bound stopped it.
    pub fn verdict(&self) -> RowVerdict {
        let figures = match &self.outcome {
            Ok(figures) => figures,
            Err(why) => return RowVerdict::Error(why.clone()),
        };
        let verdict = &figures.verdict;
        let failed: Vec<&'static str> = verdict
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| c.name)
            .collect();
        if self.strategy == LockStrategy::None {
            let race_shown = verdict.check(NO_OVERSELL) == Some(false)
                || verdict.check(NO_LOST_UPDATE) == Some(false);
            return match (race_shown, verdict.check(NO_SERVER_ERROR)) {
                (true, Some(true)) => RowVerdict::FailedAsExpected,
                (true, _) => RowVerdict::Fail(vec![NO_SERVER_ERROR]),
                (false, _) => RowVerdict::RaceNotShown(failed),
            };
        }
        let books = verdict.books;
        match failed.as_slice() {
            [] => RowVerdict::Pass,
            // Only the time bound kept the sale from its end: what was sold balanced, and
            // something was, of every product (a service that sells nothing, or nothing of
            // one product, in the bound is broken, not slow).
            [SALE_HAPPENED]
                if figures.time_bound
                    && books.stock > 0
                    && verdict.products.iter().all(|(_, product)| product.sold > 0) =>
            {
                RowVerdict::Incomplete {
                    sold: books.sold,
                    supplied: books.supplied,
                }
            }
            _ => RowVerdict::Fail(failed),
        }
    }
}

/// A run's figures, from its attack, its books and each instance's orders (`split`).
pub(super) fn figures(report: &AttackReport, verdict: Verdict, split: Vec<u64>) -> Figures {
    let t = &report.tally;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Figures {
        orders_per_sec: report.orders_per_sec(),
        p50_ms: ms(t.latency(0.50)),
        p99_ms: ms(t.latency(0.99)),
        created_p50_ms: ms(t.created_latency(0.50)),
        created_p99_ms: ms(t.created_latency(0.99)),
        // Product by product: one product's oversell is not made good by another's unsold
        // units.
        oversold: verdict.products.iter().map(|(_, b)| b.oversold()).sum(),
        lost_updates: verdict.products.iter().map(|(_, b)| b.lost_updates()).sum(),
        busy_share: t.busy_share(),
        split,
        verdict,
        orders_over_time: report.orders_over_time(chart::BIN),
        time_bound: !report.decided && report.goose_error.is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::books::{BUSY_SHARE, Books, Check, NO_WRONG_SOLD_OUT, ONE_ORDER_PER_USER};

    /// Every check of the verdict, those named in `failed` failing.
    fn verdict(failed: &[&'static str], books: Books) -> Verdict {
        let names = [
            SALE_HAPPENED,
            NO_OVERSELL,
            NO_LOST_UPDATE,
            ONE_ORDER_PER_USER,
            NO_WRONG_SOLD_OUT,
            BUSY_SHARE,
            NO_SERVER_ERROR,
        ];
        Verdict {
            products: vec![(1, books)],
            checks: names
                .into_iter()
                .map(|name| Check {
                    name,
                    pass: !failed.contains(&name),
                    detail: String::new(),
                })
                .collect(),
            books,
        }
    }

    fn sold(sold: i64, supplied: i64) -> Books {
        Books {
            stock: supplied - sold,
            orders: sold,
            sold,
            supplied,
            users_with_several_orders: 0,
        }
    }

    fn row(strategy: LockStrategy, verdict: Verdict, time_bound: bool) -> Row {
        Row {
            strategy,
            batch_max: 1,
            stock: verdict.books.supplied,
            outcome: Ok(Figures {
                orders_per_sec: 300.0,
                p50_ms: 1.0,
                p99_ms: 2.0,
                created_p50_ms: 1.0,
                created_p99_ms: 2.0,
                oversold: (verdict.books.sold - verdict.books.supplied).max(0),
                lost_updates: 0,
                busy_share: 0.0,
                split: vec![],
                verdict,
                orders_over_time: vec![],
                time_bound,
            }),
        }
    }

    /// A safe run that kept its books until the time bound is incomplete, not failed.
    #[test]
    fn safe_run_with_books_kept_to_the_time_bound_is_incomplete_not_failed() {
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(36_717, 50_000)),
            true,
        );

        let verdict = row.verdict();

        assert_eq!(
            verdict,
            RowVerdict::Incomplete {
                sold: 36_717,
                supplied: 50_000
            }
        );
        assert_eq!(
            verdict.to_string(),
            "INCOMPLETE: time bound, 36717 of 50000 sold"
        );
        assert!(!verdict.fails_the_demo());
    }

    #[test]
    fn a_run_that_sold_nothing_of_one_product_by_the_time_bound_fails() {
        let mut figures = verdict(&[SALE_HAPPENED], sold(36_717, 50_000));
        figures.products = vec![(1, sold(36_717, 25_000)), (2, sold(0, 25_000))];
        let row = row(LockStrategy::Redis, figures, true);

        assert_eq!(row.verdict(), RowVerdict::Fail(vec![SALE_HAPPENED]));
        assert!(row.verdict().fails_the_demo());
    }

    #[test]
    fn a_broken_invariant_fails_the_demo_even_when_the_time_bound_was_reached() {
        for broken in [
            NO_OVERSELL,
            NO_LOST_UPDATE,
            ONE_ORDER_PER_USER,
            NO_SERVER_ERROR,
            BUSY_SHARE,
        ] {
            let row = row(
                LockStrategy::PgAtomic,
                verdict(&[SALE_HAPPENED, broken], sold(1_000, 5_000)),
                true,
            );

            let verdict = row.verdict();

            assert_eq!(verdict, RowVerdict::Fail(vec![SALE_HAPPENED, broken]));
            assert!(verdict.fails_the_demo(), "{broken}");
        }
    }

    #[test]
    fn an_unfinished_sale_that_did_not_reach_the_time_bound_fails() {
        // Stopped by something else (a goose threshold): not the time bound.
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(100, 5_000)),
            false,
        );
        assert_eq!(row.verdict(), RowVerdict::Fail(vec![SALE_HAPPENED]));
        assert!(row.verdict().fails_the_demo());
    }

    #[test]
    fn a_run_that_sold_nothing_within_the_time_bound_fails() {
        let row = row(
            LockStrategy::Redis,
            verdict(&[SALE_HAPPENED], sold(0, 5_000)),
            true,
        );
        assert!(row.verdict().fails_the_demo(), "{}", row.verdict());
    }

    #[test]
    fn a_safe_run_that_sold_out_and_kept_its_books_passes() {
        let row = row(LockStrategy::PgRow, verdict(&[], sold(5_000, 5_000)), false);
        assert_eq!(row.verdict(), RowVerdict::Pass);
        assert_eq!(row.verdict().to_string(), "PASS");
    }

    #[test]
    fn none_must_break_the_books_and_nothing_else() {
        let oversold = row(
            LockStrategy::None,
            verdict(&[NO_OVERSELL, NO_LOST_UPDATE], sold(7_500, 5_000)),
            false,
        );
        assert_eq!(oversold.verdict(), RowVerdict::FailedAsExpected);
        assert!(!oversold.verdict().fails_the_demo());

        let race_hidden = row(LockStrategy::None, verdict(&[], sold(5_000, 5_000)), false);
        assert!(race_hidden.verdict().fails_the_demo());
        assert!(race_hidden.verdict().to_string().starts_with("UNEXPECTED"));

        let with_errors = row(
            LockStrategy::None,
            verdict(&[NO_OVERSELL, NO_SERVER_ERROR], sold(7_500, 5_000)),
            false,
        );
        assert_eq!(
            with_errors.verdict(),
            RowVerdict::Fail(vec![NO_SERVER_ERROR])
        );
    }

    #[test]
    fn a_run_that_could_not_be_made_fails_the_demo() {
        let row = Row {
            strategy: LockStrategy::Redlock,
            batch_max: 64,
            stock: 100,
            outcome: Err("no master answered".into()),
        };
        assert_eq!(row.verdict().to_string(), "ERROR: no master answered");
        assert!(row.verdict().fails_the_demo());
    }
}
