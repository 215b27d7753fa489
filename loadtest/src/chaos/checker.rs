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

use std::collections::{BTreeMap, HashMap};

use super::history::{Attempt, Micros, Restock};

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
    /// When the soak started: times in messages count from it.
    pub started_us: Micros,
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

/// Judge the soak.
pub fn check(e: &Evidence<'_>) -> Verdict {
    let db = e.database;
    let t = |us: Micros| (us - e.started_us) as f64 / 1e6;
    let describe = |a: &Attempt| {
        let order = a
            .answer
            .order_id()
            .map(|id| format!(" (order {id})"))
            .unwrap_or_default();
        format!(
            "user {} at instance {}, sent {:.3} s, answered {:.3} s (+{} ms): {}{order}",
            a.user,
            a.instance,
            t(a.sent_us),
            t(a.answered_us),
            (a.answered_us - a.sent_us) / 1000,
            a.answer.label()
        )
    };
    let mut by_user: HashMap<i64, Vec<&Attempt>> = HashMap::new();
    for a in e.attempts {
        by_user.entry(a.user).or_default().push(a);
    }
    let attempts_of = |user: i64| -> String {
        by_user.get(&user).map_or_else(
            || "no request was sent for this buyer".to_owned(),
            |attempts| {
                attempts
                    .iter()
                    .map(|a| describe(a))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        )
    };
    let mut orders_of: HashMap<i64, Vec<&DbOrder>> = HashMap::new();
    for o in &db.orders {
        orders_of.entry(o.user).or_default().push(o);
    }
    let order_by_id: HashMap<i64, &DbOrder> = db.orders.iter().map(|o| (o.id, o)).collect();
    let whose = |id: i64| match order_by_id.get(&id) {
        Some(o) => format!("in the DB order {id} belongs to user {}", o.user),
        None => format!("in the DB there is no order {id}"),
    };

    let supplied: i64 = db.ledger.iter().map(|l| l.delta).sum();
    let sold: i64 = db.orders.iter().map(|o| o.quantity).sum();
    let applied: Vec<&Restock> = e
        .restocks
        .iter()
        .filter(|r| r.applied_by().is_some())
        .collect();
    let restocked_units: i64 = applied.iter().map(|r| r.units).sum();

    let mut oversell = Vec::new();
    if db.stock < 0 {
        oversell.push(format!("the stock is {}", db.stock));
    }
    if sold > supplied {
        oversell.push(format!("{sold} units sold of {supplied} supplied"));
    }

    let mut lost_update = Vec::new();
    if supplied != db.stock + sold {
        lost_update.push(format!(
            "supplied {supplied} (the ledger) != stock {} + sold {sold}",
            db.stock
        ));
    }
    if supplied != e.initial_stock + restocked_units {
        lost_update.push(format!(
            "supplied {supplied} (the ledger) != initial {} + {restocked_units} units of the {} restocks answered 2xx",
            e.initial_stock,
            applied.len()
        ));
    }
    let ledger_restocks = db.ledger.iter().filter(|l| l.reason == "restock").count();
    if ledger_restocks != applied.len() {
        lost_update.push(format!(
            "the ledger has {ledger_restocks} restocks, {} were answered 2xx",
            applied.len()
        ));
    }
    for r in e.restocks.iter().filter(|r| r.applied_by().is_none()) {
        let answers: Vec<String> = r.attempts.iter().map(|a| a.answer.label()).collect();
        let why = if r.refused() {
            "refused"
        } else {
            "outcome still unknown after its retries"
        };
        lost_update.push(format!(
            "restock {} of {} units {why}: {}",
            r.key,
            r.units,
            answers.join(", ")
        ));
    }

    let mut one_order = Vec::new();
    for (user, orders) in &orders_of {
        if orders.len() > 1 {
            let ids: Vec<String> = orders.iter().map(|o| o.id.to_string()).collect();
            one_order.push(format!(
                "user {user} has {} orders in the DB ({}); answers: {}",
                orders.len(),
                ids.join(", "),
                attempts_of(*user)
            ));
        }
    }
    for (user, attempts) in &by_user {
        let created = attempts.iter().filter(|a| a.is_created()).count();
        if created > 1 {
            one_order.push(format!(
                "user {user} was answered 201 {created} times: {}",
                attempts_of(*user)
            ));
        }
    }
    one_order.sort();

    let mut every_201 = Vec::new();
    for a in e.attempts.iter().filter(|a| a.is_created()) {
        let mine = orders_of.get(&a.user).and_then(|o| o.first());
        match (a.answer.order_id(), mine) {
            (Some(id), Some(o))
                if o.id == id
                    && (o.committed_us < a.sent_us - SLACK_US
                        || o.committed_us > a.answered_us + SLACK_US) =>
            {
                every_201.push(format!(
                    "{}: its order committed at {:.3} s, outside the request ({} ms slack each side)",
                    describe(a),
                    t(o.committed_us),
                    SLACK_US / 1000
                ))
            }
            (Some(id), Some(o)) if o.id == id => {}
            (None, Some(_)) => {}
            (Some(id), Some(o)) => every_201.push(format!(
                "{}: the buyer's order in the DB is {}; {}",
                describe(a),
                o.id,
                whose(id)
            )),
            (Some(id), None) => every_201.push(format!(
                "{}: the buyer has no order in the DB; {}",
                describe(a),
                whose(id)
            )),
            (None, None) => {
                every_201.push(format!("{}: the buyer has no order in the DB", describe(a)))
            }
        }
    }

    let mut every_order = Vec::new();
    let mut reported = std::collections::HashSet::new();
    for o in &db.orders {
        let attempts = by_user.get(&o.user).map(Vec::as_slice).unwrap_or_default();
        let answered = attempts
            .iter()
            .any(|a| a.is_created() && a.answer.order_id().is_none_or(|id| id == o.id));
        if answered {
            continue;
        }
        // An unknown outcome accounts for the order only if it was sent before the commit.
        let unknown = attempts
            .iter()
            .any(|a| a.answer.outcome_unknown() && a.sent_us - SLACK_US <= o.committed_us);
        let problem = match (unknown, e.lookups.get(&o.user)) {
            (true, Some(Lookup::Found(id))) if *id == o.id => continue,
            (true, Some(Lookup::Found(id))) => format!("the lookup found order {id}"),
            (true, Some(Lookup::NotFound)) => "the lookup found no order".to_owned(),
            (true, Some(Lookup::Failed(why))) => format!("the lookup failed: {why}"),
            (true, None) => "it was not looked up".to_owned(),
            (false, _) => {
                "no answer was 201, or left the outcome unknown and was sent before it committed"
                    .to_owned()
            }
        };
        reported.insert(o.user);
        every_order.push(format!(
            "order {} of user {} (committed {:.3} s): {problem}; answers: {}",
            o.id,
            o.user,
            t(o.committed_us),
            attempts_of(o.user)
        ));
    }
    // A lookup must agree with the database, also where the buyer's order was answered.
    for (user, lookup) in e.lookups {
        let mine = orders_of.get(user).and_then(|o| o.first()).map(|o| o.id);
        let disagrees = match lookup {
            Lookup::Found(id) => mine != Some(*id),
            Lookup::NotFound => mine.is_some(),
            Lookup::Failed(_) => false,
        };
        if disagrees && reported.insert(*user) {
            every_order.push(format!(
                "the lookup of user {user} said {lookup:?}, the DB has {}",
                mine.map_or("no order".to_owned(), |m| format!("order {m}")),
            ));
        }
    }

    let mut already = Vec::new();
    for a in e
        .attempts
        .iter()
        .filter(|a| a.answer.status() == Some(409) && a.answer.code() == "already_purchased")
    {
        let mine = orders_of.get(&a.user).and_then(|o| o.first());
        match (a.answer.order_id(), mine) {
            (_, None) => already.push(format!("{}: the buyer has no order in the DB", describe(a))),
            (Some(id), Some(o)) if id != o.id => already.push(format!(
                "{}: the buyer's order is {}; {}",
                describe(a),
                o.id,
                whose(id)
            )),
            _ => {}
        }
    }

    let history = StockHistory::of(db);
    let mut wrong_sold_out = Vec::new();
    let (mut sold_out_answers, mut within_bound) = (0, Vec::new());
    for a in e.attempts.iter().filter(|a| a.is_sold_out()) {
        sold_out_answers += 1;
        let to = a.answered_us + SLACK_US;
        if !history.positive_throughout(a.sent_us - SLACK_US, to) {
            continue;
        }
        let from = a.sent_us - e.sold_out_recheck_us - SLACK_US;
        if history.positive_throughout(from, to) {
            wrong_sold_out.push(format!(
                "{}: the stock was at least {} from {:.3} s to {:.3} s (SOLD_OUT_RECHECK_MS before the send to the answer, {} ms slack each side)",
                describe(a),
                history.min_stock(from, to),
                t(from),
                t(to),
                SLACK_US / 1000
            ));
        } else {
            within_bound.push(a.sent_us);
        }
    }

    let mut server_errors = Vec::new();
    for a in e.attempts {
        if matches!(a.answer.status(), Some(500..=599)) && a.answer.status() != Some(503) {
            server_errors.push(describe(a));
        }
    }
    for r in e.restocks {
        for a in &r.attempts {
            if matches!(a.answer.status(), Some(500..=599)) && a.answer.status() != Some(503) {
                server_errors.push(format!(
                    "restock {} at instance {}, sent {:.3} s: {}",
                    r.key,
                    a.instance,
                    t(a.sent_us),
                    a.answer.label()
                ));
            }
        }
    }

    let other_4xx: Vec<String> = e
        .attempts
        .iter()
        .filter(|a| {
            matches!(a.answer.status(), Some(400..=499))
                && !(a.answer.status() == Some(409)
                    && matches!(a.answer.code(), "sold_out" | "already_purchased"))
        })
        .map(describe)
        .collect();

    let unknown_buyers = by_user
        .values()
        .filter(|attempts| attempts.iter().any(|a| a.answer.outcome_unknown()))
        .count();
    let unknown_found = e
        .lookups
        .values()
        .filter(|l| matches!(l, Lookup::Found(_)))
        .count();

    let checks = vec![
        Check {
            name: NO_OVERSELL,
            rule: "stock >= 0, sold <= supplied",
            violations: oversell,
        },
        Check {
            name: NO_LOST_UPDATE,
            rule: "supplied = stock + sold = initial + the restocks answered 2xx (each resolved)",
            violations: lost_update,
        },
        Check {
            name: ONE_ORDER_PER_BUYER,
            rule: "no buyer with two orders in the DB, nor two 201s",
            violations: one_order,
        },
        Check {
            name: EVERY_201_HAS_ITS_ORDER,
            rule: "a 201's order is in the DB, with its id and its buyer",
            violations: every_201,
        },
        Check {
            name: EVERY_ORDER_ANSWERED,
            rule: "an order in the DB was answered 201, or its outcome was unknown and the lookup finds it",
            violations: every_order,
        },
        Check {
            name: ALREADY_PURCHASED_NAMES_THE_ORDER,
            rule: "already_purchased comes with the buyer's order in the DB",
            violations: already,
        },
        Check {
            name: NO_WRONG_SOLD_OUT,
            rule: "no sold_out while the stock was > 0 from SOLD_OUT_RECHECK_MS before the send to the answer",
            violations: wrong_sold_out,
        },
        Check {
            name: NO_5XX_BUT_503,
            rule: "no 500 or other 5xx, purchases and restocks",
            violations: server_errors,
        },
        Check {
            name: NO_OTHER_4XX,
            rule: "no 4xx but 409 sold_out and already_purchased",
            violations: other_4xx,
        },
        Check {
            name: INSTANCES_STAYED_UP,
            rule: "every instance the nemesis did not kill is still running",
            violations: e.instance_exits.to_vec(),
        },
    ];
    Verdict {
        checks,
        supplied,
        sold,
        stock: db.stock,
        orders: db.orders.len(),
        restocks_applied: applied.len(),
        restocked_units,
        sold_out_answers,
        sold_out_within_the_bound: within_bound,
        unknown_buyers,
        unknown_found,
    }
}

/// The stock over time, from the commit times of the ledger's rows and the orders.
struct StockHistory {
    /// Each change's commit time, in order, and the stock after it.
    times: Vec<Micros>,
    after: Vec<i64>,
    /// The spells when the stock was zero (or below), `[from, to)`; before the product was
    /// created it was zero too.
    zero: Vec<(Micros, Micros)>,
}

impl StockHistory {
    fn of(db: &Database) -> Self {
        let mut changes: Vec<(Micros, i64)> = db
            .ledger
            .iter()
            .map(|l| (l.committed_us, l.delta))
            .chain(db.orders.iter().map(|o| (o.committed_us, -o.quantity)))
            .collect();
        // Within one microsecond, sales first: the stock may have touched zero there.
        changes.sort_unstable();
        let (mut times, mut after, mut zero) = (Vec::new(), Vec::new(), Vec::new());
        let mut stock = 0;
        let mut zero_since = Some(Micros::MIN);
        for (at, delta) in changes {
            stock += delta;
            times.push(at);
            after.push(stock);
            match (stock > 0, zero_since) {
                (true, Some(since)) => {
                    zero.push((since, at));
                    zero_since = None;
                }
                (false, None) => zero_since = Some(at),
                _ => {}
            }
        }
        if let Some(since) = zero_since {
            zero.push((since, Micros::MAX));
        }
        Self { times, after, zero }
    }

    /// Whether the stock was above zero at every moment of `[from, to]`.
    fn positive_throughout(&self, from: Micros, to: Micros) -> bool {
        let first = self.zero.partition_point(|(_, end)| *end <= from);
        self.zero.get(first).is_none_or(|(start, _)| *start > to)
    }

    /// The lowest stock during `[from, to]`.
    fn min_stock(&self, from: Micros, to: Micros) -> i64 {
        let at_from = self.times.partition_point(|t| *t <= from);
        let start = if at_from == 0 {
            0
        } else {
            self.after[at_from - 1]
        };
        let until = self.times.partition_point(|t| *t <= to);
        self.after[at_from..until]
            .iter()
            .copied()
            .fold(start, i64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::{Answer, RestockAttempt};
    use super::*;

    const S: Micros = 1_000_000;
    /// The soak starts at 1000 s; every time below is relative to it.
    const T0: Micros = 1_000 * S;

    fn at(seconds: f64) -> Micros {
        T0 + (seconds * S as f64) as Micros
    }

    fn http(status: u16, code: &str, order_id: Option<i64>) -> Answer {
        Answer::Http {
            status,
            code: code.to_owned(),
            order_id,
        }
    }

    fn attempt(user: i64, sent: f64, answer: Answer) -> Attempt {
        Attempt {
            user,
            instance: (user % 3) as usize,
            sent_us: at(sent),
            answered_us: at(sent + 0.01),
            answer,
        }
    }

    fn order(id: i64, user: i64, committed: f64) -> DbOrder {
        DbOrder {
            id,
            user,
            quantity: 1,
            committed_us: at(committed),
        }
    }

    fn ledger(delta: i64, reason: &str, committed: f64) -> LedgerEntry {
        LedgerEntry {
            delta,
            reason: reason.to_owned(),
            committed_us: at(committed),
        }
    }

    /// A soak that kept its books: 2 units, then a restock of 2 at 10 s. Users 1 and 2 buy
    /// at once; user 3 is told sold_out at 5 s (nothing left since 0.1 s); user 4's answer
    /// is lost but the order committed, found by the lookup; user 5 was told busy, then
    /// bought; user 6 is told sold_out 0.3 s after the restock (within the 1 s bound).
    struct Soak {
        attempts: Vec<Attempt>,
        restocks: Vec<Restock>,
        lookups: BTreeMap<i64, Lookup>,
        database: Database,
        exits: Vec<String>,
    }

    impl Soak {
        fn clean() -> Self {
            let attempts = vec![
                attempt(1, 0.05, http(201, "", Some(101))),
                attempt(2, 0.06, http(201, "", Some(102))),
                attempt(3, 5.0, http(409, "sold_out", None)),
                attempt(4, 10.5, Answer::Lost("connection closed".into())),
                attempt(4, 10.8, http(409, "already_purchased", Some(103))),
                attempt(5, 10.6, http(503, "busy", None)),
                attempt(5, 10.9, http(201, "", Some(104))),
                attempt(6, 10.3, http(409, "sold_out", None)),
            ];
            let restocks = vec![Restock {
                key: "k1".into(),
                units: 2,
                attempts: vec![
                    RestockAttempt {
                        instance: 0,
                        sent_us: at(9.9),
                        answered_us: at(9.95),
                        answer: Answer::Lost("timed out".into()),
                    },
                    RestockAttempt {
                        instance: 1,
                        sent_us: at(10.2),
                        answered_us: at(10.21),
                        answer: http(200, "", None),
                    },
                ],
            }];
            let database = Database {
                stock: 0,
                orders: vec![
                    order(101, 1, 0.055),
                    order(102, 2, 0.065),
                    order(103, 4, 10.505),
                    order(104, 5, 10.905),
                ],
                ledger: vec![ledger(2, "create", 0.0), ledger(2, "restock", 9.92)],
            };
            Self {
                attempts,
                restocks,
                lookups: BTreeMap::from([(4, Lookup::Found(103))]),
                database,
                exits: Vec::new(),
            }
        }

        fn check(&self) -> Verdict {
            check(&Evidence {
                initial_stock: 2,
                attempts: &self.attempts,
                restocks: &self.restocks,
                lookups: &self.lookups,
                database: &self.database,
                instance_exits: &self.exits,
                sold_out_recheck_us: S,
                started_us: T0,
            })
        }
    }

    /// The checks that found something, with their violations.
    fn broken(verdict: &Verdict) -> Vec<(&'static str, Vec<String>)> {
        verdict
            .checks
            .iter()
            .filter(|c| !c.violations.is_empty())
            .map(|c| (c.name, c.violations.clone()))
            .collect()
    }

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

    #[test]
    fn a_sold_out_with_stock_left_all_along_is_caught_and_one_near_a_zero_is_not() {
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

    #[test]
    fn the_stock_history_knows_when_it_was_zero() {
        let db = Database {
            stock: 0,
            orders: vec![order(1, 1, 1.0), order(2, 2, 3.0)],
            ledger: vec![ledger(1, "create", 0.0), ledger(1, "restock", 2.0)],
        };
        let h = StockHistory::of(&db);
        assert!(h.positive_throughout(at(0.1), at(0.9)));
        assert!(!h.positive_throughout(at(0.1), at(1.0)));
        assert!(!h.positive_throughout(at(1.5), at(1.6)));
        assert!(h.positive_throughout(at(2.0), at(2.9)));
        assert!(!h.positive_throughout(at(2.5), at(100.0)));
        assert!(
            !h.positive_throughout(at(-5.0), at(-4.0)),
            "before the product"
        );
        assert_eq!(h.min_stock(at(0.5), at(2.5)), 0);
        assert_eq!(h.min_stock(at(2.1), at(2.5)), 1);
    }
}
