//! Small histories for the checker's tests: a soak that kept its books, which each test
//! breaks in one way, and the builders of its attempts, orders and ledger rows.

use std::collections::BTreeMap;

use super::super::history::{Answer, Attempt, Micros, Restock, RestockAttempt};
use super::facts::Facts;
use super::{Database, DbOrder, Evidence, LedgerEntry, Lookup, Pause, Verdict, check};

pub const S: Micros = 1_000_000;
/// The soak starts at 1000 s; every time below is relative to it.
pub const T0: Micros = 1_000 * S;

pub fn at(seconds: f64) -> Micros {
    T0 + (seconds * S as f64) as Micros
}

pub fn http(status: u16, code: &str, order_id: Option<i64>) -> Answer {
    Answer::Http {
        status,
        code: code.to_owned(),
        order_id,
    }
}

pub fn attempt(user: i64, sent: f64, answer: Answer) -> Attempt {
    Attempt {
        user,
        instance: (user % 3) as usize,
        sent_us: at(sent),
        answered_us: at(sent + 0.01),
        answer,
    }
}

pub fn order(id: i64, user: i64, committed: f64) -> DbOrder {
    DbOrder {
        id,
        user,
        quantity: 1,
        committed_us: at(committed),
    }
}

pub fn ledger(delta: i64, reason: &str, committed: f64) -> LedgerEntry {
    LedgerEntry {
        delta,
        reason: reason.to_owned(),
        committed_us: at(committed),
        key: None,
    }
}

/// A soak that kept its books: 2 units, then a restock of 2 at 10 s. Users 1 and 2 buy
/// at once; user 3 is told sold_out at 5 s (nothing left since 0.1 s); user 4's answer
/// is lost but the order committed, found by the lookup; user 5 was told busy, then
/// bought; user 6 is told sold_out 0.3 s after the restock (within the 1 s bound).
pub struct Soak {
    pub attempts: Vec<Attempt>,
    pub restocks: Vec<Restock>,
    pub lookups: BTreeMap<i64, Lookup>,
    pub database: Database,
    pub exits: Vec<String>,
    pub pauses: Vec<Pause>,
}

impl Soak {
    pub fn clean() -> Self {
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
            pauses: Vec::new(),
        }
    }

    /// What the checker is handed for this soak.
    pub fn evidence(&self) -> Evidence<'_> {
        Evidence {
            initial_stock: 2,
            attempts: &self.attempts,
            restocks: &self.restocks,
            lookups: &self.lookups,
            database: &self.database,
            instance_exits: &self.exits,
            sold_out_recheck_us: S,
            pauses: &self.pauses,
            request_timeout_us: 5_000_000,
            started_us: T0,
            commits_wait_for_a_standby: false,
        }
    }

    /// The whole verdict.
    pub fn check(&self) -> Verdict {
        check(&self.evidence())
    }

    /// What one rule alone finds in this soak.
    pub fn violations_of(&self, rule: fn(&Facts<'_>) -> Vec<String>) -> Vec<String> {
        rule(&Facts::of(&self.evidence()))
    }
}

/// The checks that found something, with their violations.
pub fn broken(verdict: &Verdict) -> Vec<(&'static str, Vec<String>)> {
    verdict
        .checks
        .iter()
        .filter(|c| !c.violations.is_empty())
        .map(|c| (c.name, c.violations.clone()))
        .collect()
}
