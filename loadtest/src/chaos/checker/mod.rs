//! The checker: judges the whole history after the soak, from the answers and from
//! PostgreSQL, as Jepsen's checkers do. Pure code: it is handed what was recorded and what
//! the database holds, and says which rules were broken, each violation with its evidence.
//!
//! An unknown outcome (no answer, a 503 `outcome_unknown`, a 5xx that is not a 503) is never
//! taken as a success or a failure: such a buyer's order, if there is one, must be what the
//! order lookup finds.
//!
//! **The stock's history** is rebuilt from the rows: every ledger row (the creation, each
//! restock) and every order carries its transaction's commit time (PostgreSQL's
//! `track_commit_timestamp`), on the clock the answers' times were read from. A `sold_out`
//! answer is wrong when the stock was above zero all along from `SOLD_OUT_RECHECK_MS` before
//! the request was sent until its answer came: the service promises that a restock reaches
//! every instance within that bound (an instance that missed the restock's message trusts
//! its memory that long), and no longer; its messages are a fast path, not a promise. The
//! answers within the bound are counted apart, by the fault they came near (the report).
//! [`SLACK_US`] widens every interval at both ends (a commit is stamped before it is flushed
//! and seen), so a violation is certain.
//!
//! **Orders and the answers that promise nothing was written.** A 503 other than
//! `outcome_unknown` says nothing was recorded. An order is accounted for by a 201 that named
//! it, committed between that request's send and its answer, or by an unknown outcome sent
//! before it committed (and found by the lookup); an order that committed before every such
//! request was sent came from one whose answer said nothing was written.
//!
//! **Layout.** Each rule is a function of its own, with its own tests: `books` (no oversell,
//! no lost update, each restock applied once), `orders` (one per buyer, every 201 committed
//! inside its request, every order accounted for, `already_purchased`), `answers` (`sold_out`
//! within its bound, no 5xx but 503, no other 4xx, no instance exit). `facts` indexes the
//! evidence once for all of them, `stock` rebuilds the stock's history, and [`check`] runs
//! them in the order of `RULES`, the report's order.

mod answers;
mod books;
mod facts;
#[cfg(test)]
mod fixtures;
mod orders;
mod stock;

use std::collections::BTreeMap;

use super::history::{Attempt, Micros, Restock};
use facts::Facts;

/// Widens every interval the checker compares with commit times, at both ends: a commit's
/// timestamp is taken before its WAL is flushed and others see it, which on a loaded machine
/// can take tens of milliseconds.
pub const SLACK_US: Micros = 250_000;

/// What PostgreSQL holds for the product after the soak.
#[derive(Debug, Clone, Default)]
pub struct Database {
    pub stock: i64,
    pub orders: Vec<DbOrder>,
    pub ledger: Vec<LedgerEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbOrder {
    pub id: i64,
    pub user: i64,
    pub quantity: i64,
    pub committed_us: Micros,
}

/// A row of the stock ledger (`stock_changes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub delta: i64,
    /// `create`, `restock` or `set`.
    pub reason: String,
    pub committed_us: Micros,
    /// The `Idempotency-Key` of the admin write that made it (the key stored in the same
    /// transaction), if it had one.
    pub key: Option<String>,
}

/// What the order lookup (`GET /api/products/{id}/orders/{user_id}`) said about a buyer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(i64),
    NotFound,
    /// No answer that says either (after retries).
    Failed(String),
}

/// Everything the checker judges.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    pub initial_stock: i64,
    pub attempts: &'a [Attempt],
    pub restocks: &'a [Restock],
    /// The lookups of the buyers with an unknown outcome.
    pub lookups: &'a BTreeMap<i64, Lookup>,
    pub database: &'a Database,
    /// Instances that exited by themselves, described.
    pub instance_exits: &'a [String],
    /// The instances' `SOLD_OUT_RECHECK_MS`, in µs.
    pub sold_out_recheck_us: Micros,
    /// The instances the nemesis stopped, and when.
    pub pauses: &'a [Pause],
    /// The instances' `HTTP_REQUEST_TIMEOUT_MS`, in µs.
    pub request_timeout_us: Micros,
    /// When the soak started: times in messages count from it.
    pub started_us: Micros,
    /// Whether a commit may stay invisible for seconds after its stamp (synchronous
    /// replication, which waits for a standby): then a restock counts from its first 2xx
    /// answer, not its stamp (see `stock.rs`).
    pub commits_wait_for_a_standby: bool,
}

/// An instance the nemesis stopped (SIGSTOP), from when until it was continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    pub instance: usize,
    pub from_us: Micros,
    pub to_us: Micros,
}

/// The checks, in the order they are shown.
pub const NO_OVERSELL: &str = "no oversell";
pub const NO_LOST_UPDATE: &str = "no lost update";
pub const ONE_ORDER_PER_BUYER: &str = "one order per buyer";
pub const EVERY_201_HAS_ITS_ORDER: &str = "every 201 has its order";
pub const EVERY_ORDER_ANSWERED: &str = "every order was answered";
pub const ALREADY_PURCHASED_NAMES_THE_ORDER: &str = "already_purchased names the order";
pub const NO_WRONG_SOLD_OUT: &str = "no sold_out with stock left";
pub const NO_5XX_BUT_503: &str = "no 5xx but 503";
pub const NO_OTHER_4XX: &str = "no other 4xx";
pub const INSTANCES_STAYED_UP: &str = "no instance died by itself";

/// One rule and what broke it.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    /// What the rule says, for the table.
    pub rule: &'static str,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Verdict {
    pub checks: Vec<Check>,
    /// Units supplied (the ledger's sum), sold (the orders' quantities), and left.
    pub supplied: i64,
    pub sold: i64,
    pub stock: i64,
    pub orders: usize,
    /// Restocks applied, and their units.
    pub restocks_applied: usize,
    pub restocked_units: i64,
    pub sold_out_answers: usize,
    /// `sold_out` answers given while the stock was above zero all along from the send to
    /// the answer, but within `SOLD_OUT_RECHECK_MS` of it being zero: what the service's
    /// bound allows (an instance that missed a restock's message), not a violation. When
    /// each was sent.
    pub sold_out_within_the_bound: Vec<Micros>,
    /// 408 answers an instance gave as it woke from a pause (its clock ran on while it was
    /// stopped, and a new connection's request-head timer due within the pause ran out as it
    /// woke, before the request that came meanwhile was read; nothing was done): not
    /// violations.
    pub timed_out_by_a_pause: usize,
    /// Buyers whose outcome was unknown, and of them those the lookup found an order for.
    pub unknown_buyers: usize,
    pub unknown_found: usize,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.checks.iter().map(|c| c.violations.len()).sum()
    }

    pub fn passed(&self) -> bool {
        self.violations() == 0
    }

    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// A rule's name, what it says (for the table), and the function that finds what broke it.
type Rule = (&'static str, &'static str, fn(&Facts<'_>) -> Vec<String>);

/// The rules, in the order they are shown.
const RULES: [Rule; 10] = [
    (
        NO_OVERSELL,
        "stock >= 0, sold <= supplied",
        books::no_oversell,
    ),
    (
        NO_LOST_UPDATE,
        "supplied = stock + sold = initial + the restocks answered 2xx (each resolved)",
        books::no_lost_update,
    ),
    (
        ONE_ORDER_PER_BUYER,
        "no buyer with two orders in the DB, nor two 201s",
        orders::one_order_per_buyer,
    ),
    (
        EVERY_201_HAS_ITS_ORDER,
        "a 201's order is in the DB, with its id and its buyer",
        orders::every_201_has_its_order,
    ),
    (
        EVERY_ORDER_ANSWERED,
        "an order in the DB was answered 201, or its outcome was unknown and the lookup finds it",
        orders::every_order_answered,
    ),
    (
        ALREADY_PURCHASED_NAMES_THE_ORDER,
        "already_purchased comes with the buyer's order in the DB",
        orders::already_purchased_names_the_order,
    ),
    (
        NO_WRONG_SOLD_OUT,
        "no sold_out while the stock was > 0 from SOLD_OUT_RECHECK_MS before the send to the answer",
        answers::no_wrong_sold_out,
    ),
    (
        NO_5XX_BUT_503,
        "no 500 or other 5xx, purchases and restocks",
        answers::no_5xx_but_503,
    ),
    (
        NO_OTHER_4XX,
        "no 4xx but 409 sold_out and already_purchased",
        answers::no_other_4xx,
    ),
    (
        INSTANCES_STAYED_UP,
        "every instance the nemesis did not kill is still running",
        answers::instances_stayed_up,
    ),
];

/// Judge the soak: every rule on the whole history, and the books' figures.
pub fn check(e: &Evidence<'_>) -> Verdict {
    let f = Facts::of(e);
    let checks = RULES
        .iter()
        .map(|&(name, rule, find)| Check {
            name,
            rule,
            violations: find(&f),
        })
        .collect();
    let unknown_buyers = f
        .by_user
        .values()
        .filter(|attempts| attempts.iter().any(|a| a.answer.outcome_unknown()))
        .count();
    let unknown_found = e
        .lookups
        .values()
        .filter(|l| matches!(l, Lookup::Found(_)))
        .count();
    Verdict {
        checks,
        supplied: f.supplied,
        sold: f.sold,
        stock: e.database.stock,
        orders: e.database.orders.len(),
        restocks_applied: f.applied.len(),
        restocked_units: f.restocked_units,
        sold_out_answers: e.attempts.iter().filter(|a| a.is_sold_out()).count(),
        sold_out_within_the_bound: answers::sold_out_within_the_bound(&f),
        timed_out_by_a_pause: e
            .attempts
            .iter()
            .filter(|a| answers::timed_out_by_a_pause(&f, a))
            .count(),
        unknown_buyers,
        unknown_found,
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::{Answer, Restock, RestockAttempt};
    use super::fixtures::{Soak, at, attempt, broken, http, ledger, order};
    use super::*;

    #[test]
    fn a_soak_that_kept_its_books_passes() {
        let verdict = Soak::clean().check();
        assert!(verdict.passed(), "{:?}", broken(&verdict));
        assert_eq!((verdict.supplied, verdict.sold, verdict.stock), (4, 4, 0));
        assert_eq!(verdict.sold_out_answers, 2);
        assert_eq!(verdict.sold_out_within_the_bound, [at(10.3)]);
        assert_eq!((verdict.unknown_buyers, verdict.unknown_found), (1, 1));
    }

    #[test]
    fn a_201_without_its_order_is_caught_with_whose_order_that_id_is() {
        let mut soak = Soak::clean();
        // User 2's order was lost; the id the answer named is user 1's.
        soak.database.orders.retain(|o| o.user != 2);
        soak.database.stock = 1;
        soak.attempts[1].answer = http(201, "", Some(101));
        let verdict = soak.check();
        let check = verdict.check(EVERY_201_HAS_ITS_ORDER).unwrap();
        assert_eq!(check.violations.len(), 1, "{:?}", broken(&verdict));
        let violation = &check.violations[0];
        assert!(violation.contains("user 2 at instance 2"), "{violation}");
        assert!(
            violation.contains("order 101 belongs to user 1"),
            "{violation}"
        );
    }

    #[test]
    fn an_oversell_is_caught() {
        let mut soak = Soak::clean();
        soak.database.orders.push(order(105, 7, 10.95));
        soak.attempts
            .push(attempt(7, 10.94, http(201, "", Some(105))));
        soak.database.stock = -1;
        let verdict = soak.check();
        assert_eq!(
            verdict.check(NO_OVERSELL).unwrap().violations,
            ["the stock is -1", "5 units sold of 4 supplied"]
        );
    }

    #[test]
    fn a_lost_update_is_caught() {
        let mut soak = Soak::clean();
        // Two sales wrote the same stock: one decrement lost.
        soak.database.stock = 1;
        let verdict = soak.check();
        let violations = &verdict.check(NO_LOST_UPDATE).unwrap().violations;
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].contains("!= stock 1 + sold 4"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_restock_applied_twice_or_never_resolved_is_caught() {
        let mut soak = Soak::clean();
        soak.database.ledger.push(ledger(2, "restock", 10.3));
        soak.database.stock = 2;
        soak.restocks.push(Restock {
            key: "k2".into(),
            units: 5,
            attempts: vec![RestockAttempt {
                instance: 0,
                sent_us: at(12.0),
                answered_us: at(12.01),
                answer: Answer::Lost("connection refused".into()),
            }],
        });
        let verdict = soak.check();
        let violations = &verdict.check(NO_LOST_UPDATE).unwrap().violations;
        assert_eq!(violations.len(), 3, "{violations:?}");
        assert!(
            violations[0].contains("!= initial 2 + 2 units"),
            "{violations:?}"
        );
        assert!(
            violations[1].contains("the ledger has 2 restocks, 1 were"),
            "{violations:?}"
        );
        assert!(
            violations[2].contains("restock k2 of 5 units outcome still unknown"),
            "{violations:?}"
        );
    }

    /// A sold_out with stock left all along is caught, and one near a zero is not.
    #[test]
    fn sold_out_with_stock_all_along_is_caught_and_near_a_zero_is_not() {
        let mut soak = Soak::clean();
        // User 8 is told sold_out at 10.8 s; the last unit went at 10.905 s, within the
        // slack of the answer: no wrong answer.
        soak.attempts
            .push(attempt(8, 10.8, http(409, "sold_out", None)));
        assert!(soak.check().passed());
        // With a bigger restock, the stock stays up; user 9, told sold_out at 12 s, was
        // wronged: the stock had been above zero since 9.92 s.
        soak.database.ledger[1].delta = 10;
        soak.restocks[0].units = 10;
        soak.database.stock = 8;
        soak.attempts
            .push(attempt(9, 12.0, http(409, "sold_out", None)));
        let verdict = soak.check();
        let violations = &verdict.check(NO_WRONG_SOLD_OUT).unwrap().violations;
        assert_eq!(violations.len(), 1, "{:?}", broken(&verdict));
        assert!(violations[0].starts_with("user 9 "), "{violations:?}");
        assert!(violations[0].contains("at least 8"), "{violations:?}");
        assert_eq!(verdict.violations(), 1, "{:?}", broken(&verdict));
    }

    #[test]
    fn an_order_committed_before_every_unknown_attempt_was_sent_is_caught() {
        // User 7 is told busy at 11 s, yet an order commits at 11.2 s; the next attempt, at
        // 12 s, is lost; the lookup finds the order. The lost attempt cannot have made it.
        let mut soak = Soak::clean();
        soak.database.ledger[1].delta = 3;
        soak.restocks[0].units = 3;
        soak.attempts.extend([
            attempt(7, 11.0, http(503, "busy", None)),
            attempt(7, 12.0, Answer::Lost("connection reset".into())),
        ]);
        soak.database.orders.push(order(105, 7, 11.2));
        soak.lookups.insert(7, Lookup::Found(105));
        let verdict = soak.check();
        let violations = &verdict.check(EVERY_ORDER_ANSWERED).unwrap().violations;
        assert_eq!(violations.len(), 1, "{:?}", broken(&verdict));
        assert!(
            violations[0].contains("order 105 of user 7"),
            "{violations:?}"
        );
        // A 201 whose order committed before it was sent is caught too.
        let mut soak = Soak::clean();
        soak.database.orders[0].committed_us = at(0.5);
        let verdict = soak.check();
        let violations = &verdict.check(EVERY_201_HAS_ITS_ORDER).unwrap().violations;
        assert_eq!(violations.len(), 1, "{:?}", broken(&verdict));
        assert!(
            violations[0].contains("outside the request"),
            "{violations:?}"
        );
    }

    #[test]
    fn an_order_behind_a_busy_answer_or_a_wrong_lookup_is_caught() {
        let mut soak = Soak::clean();
        // User 5's busy hid a commit: the order is there, and the retry got
        // already_purchased rather than a 201.
        soak.attempts[6].answer = http(409, "already_purchased", Some(104));
        // User 4's lookup named another buyer's order.
        soak.lookups.insert(4, Lookup::Found(101));
        let verdict = soak.check();
        let violations = &verdict.check(EVERY_ORDER_ANSWERED).unwrap().violations;
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(
            violations[0].contains("order 103 of user 4")
                && violations[0].contains("the lookup found order 101"),
            "{violations:?}"
        );
        assert!(
            violations[1].contains("order 104 of user 5")
                && violations[1].contains("no answer was 201"),
            "{violations:?}"
        );
        // A lookup that disagrees where the order was answered 201 is caught too.
        let mut soak = Soak::clean();
        soak.lookups.insert(1, Lookup::NotFound);
        let violations = soak
            .check()
            .check(EVERY_ORDER_ANSWERED)
            .unwrap()
            .violations
            .clone();
        assert_eq!(
            violations,
            ["the lookup of user 1 said NotFound, the DB has order 101"]
        );
    }

    #[test]
    fn two_orders_for_one_buyer_a_500_and_a_404_are_caught() {
        let mut soak = Soak::clean();
        soak.attempts
            .push(attempt(1, 0.2, http(201, "", Some(101))));
        soak.attempts
            .push(attempt(10, 11.0, http(500, "internal", None)));
        soak.attempts
            .push(attempt(11, 11.0, http(404, "not_found", None)));
        soak.exits
            .push("instance 1 exited by itself (signal 6)".into());
        let verdict = soak.check();
        let names: Vec<&str> = broken(&verdict).into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            [
                ONE_ORDER_PER_BUYER,
                NO_5XX_BUT_503,
                NO_OTHER_4XX,
                INSTANCES_STAYED_UP
            ]
        );
    }
}
