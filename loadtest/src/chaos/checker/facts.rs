//! What every rule reads: the evidence, indexed by buyer and by order id, the books' totals,
//! the stock over time, and how a message describes an attempt. Built once per check.

use std::collections::HashMap;

use super::super::history::{Attempt, Micros, Restock};
use super::stock::StockHistory;
use super::{DbOrder, Evidence};

pub(super) struct Facts<'a> {
    /// What the checker was handed.
    pub evidence: &'a Evidence<'a>,
    /// Each buyer's attempts, in the order they were recorded.
    pub by_user: HashMap<i64, Vec<&'a Attempt>>,
    /// Each buyer's orders in the database.
    pub orders_of: HashMap<i64, Vec<&'a DbOrder>>,
    pub order_by_id: HashMap<i64, &'a DbOrder>,
    /// Units supplied (the ledger's sum) and sold (the orders' quantities).
    pub supplied: i64,
    pub sold: i64,
    /// The restocks an answer said were applied, and their units.
    pub applied: Vec<&'a Restock>,
    pub restocked_units: i64,
    pub stock: StockHistory,
}

impl<'a> Facts<'a> {
    pub fn of(e: &'a Evidence<'a>) -> Self {
        let db = e.database;
        let mut by_user: HashMap<i64, Vec<&Attempt>> = HashMap::new();
        for a in e.attempts {
            by_user.entry(a.user).or_default().push(a);
        }
        let mut orders_of: HashMap<i64, Vec<&DbOrder>> = HashMap::new();
        for o in &db.orders {
            orders_of.entry(o.user).or_default().push(o);
        }
        let applied: Vec<&Restock> = e
            .restocks
            .iter()
            .filter(|r| r.applied_by().is_some())
            .collect();
        Self {
            evidence: e,
            by_user,
            orders_of,
            order_by_id: db.orders.iter().map(|o| (o.id, o)).collect(),
            supplied: db.ledger.iter().map(|l| l.delta).sum(),
            sold: db.orders.iter().map(|o| o.quantity).sum(),
            restocked_units: applied.iter().map(|r| r.units).sum(),
            applied,
            stock: if e.commits_wait_for_a_standby {
                StockHistory::of(db, e.restocks)
            } else {
                StockHistory::of(db, &[])
            },
        }
    }

    /// Seconds since the soak started, for messages.
    pub fn t(&self, us: Micros) -> f64 {
        (us - self.evidence.started_us) as f64 / 1e6
    }

    /// One attempt, as a message names it.
    pub fn describe(&self, a: &Attempt) -> String {
        let order = a
            .answer
            .order_id()
            .map(|id| format!(" (order {id})"))
            .unwrap_or_default();
        format!(
            "user {} at instance {}, sent {:.3} s, answered {:.3} s (+{} ms): {}{order}",
            a.user,
            a.instance,
            self.t(a.sent_us),
            self.t(a.answered_us),
            (a.answered_us - a.sent_us) / 1000,
            a.answer.label()
        )
    }

    /// Every attempt of a buyer, described, or that there was none.
    pub fn attempts_of(&self, user: i64) -> String {
        self.by_user.get(&user).map_or_else(
            || "no request was sent for this buyer".to_owned(),
            |attempts| {
                attempts
                    .iter()
                    .map(|a| self.describe(a))
                    .collect::<Vec<_>>()
                    .join("; ")
            },
        )
    }

    /// Whose order an id is, in the database.
    pub fn whose(&self, id: i64) -> String {
        match self.order_by_id.get(&id) {
            Some(o) => format!("in the DB order {id} belongs to user {}", o.user),
            None => format!("in the DB there is no order {id}"),
        }
    }

    /// The buyer's (first) order in the database.
    pub fn order_of(&self, user: i64) -> Option<&'a DbOrder> {
        self.orders_of.get(&user).and_then(|o| o.first()).copied()
    }

    /// The buyer's attempts (none when no request was sent for them).
    pub fn attempts(&self, user: i64) -> &[&'a Attempt] {
        self.by_user
            .get(&user)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}
