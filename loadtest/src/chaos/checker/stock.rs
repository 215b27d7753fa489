//! The stock over time, rebuilt from the commit times of the ledger's rows and the orders:
//! when it was zero, and how low it went in a span.
//!
//! A commit is stamped before it becomes visible, and under synchronous replication it
//! stays invisible until a standby confirms it, which takes seconds when the standby is
//! away (a database failing over): a restock stamped at 12 s may be seen by nobody until
//! 13 s. So on such a database (the soak's `ha`), a change that raises the stock counts
//! from the moment it was surely visible: the first 2xx answer to its admin write (found by
//! its idempotency key), when there was one; a change that lowers it counts from its
//! commit's stamp, the earliest it could be seen. The stock is then above zero in this
//! history only when it was surely so. On one server a commit is visible within moments of
//! its stamp, and every change counts from its stamp (the caller passes no restocks).

use super::super::history::{Micros, Restock};
use super::Database;

/// The stock over time, from the commit times of the ledger's rows and the orders.
pub(super) struct StockHistory {
    /// Each change's commit time, in order, and the stock after it.
    times: Vec<Micros>,
    after: Vec<i64>,
    /// The spells when the stock was zero (or below), `[from, to)`; before the product was
    /// created it was zero too.
    zero: Vec<(Micros, Micros)>,
}

impl StockHistory {
    pub(super) fn of(db: &Database, restocks: &[Restock]) -> Self {
        let answered = |key: &Option<String>| {
            let key = key.as_deref()?;
            restocks.iter().find(|r| r.key == key)?.applied_by()
        };
        let mut changes: Vec<(Micros, i64)> = db
            .ledger
            .iter()
            .map(|l| match answered(&l.key) {
                Some(by) if l.delta > 0 => (by.max(l.committed_us), l.delta),
                _ => (l.committed_us, l.delta),
            })
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
    pub(super) fn positive_throughout(&self, from: Micros, to: Micros) -> bool {
        let first = self.zero.partition_point(|(_, end)| *end <= from);
        self.zero.get(first).is_none_or(|(start, _)| *start > to)
    }

    /// The lowest stock during `[from, to]`.
    pub(super) fn min_stock(&self, from: Micros, to: Micros) -> i64 {
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
    use super::super::super::history::RestockAttempt;
    use super::super::fixtures::{at, http, ledger, order};
    use super::*;

    /// A restock stamped at 2 s and first answered 2xx at 3 s (its commit waited for a
    /// standby): the stock is surely above zero from 3 s only; an order counts from its stamp.
    #[test]
    fn a_restock_counts_from_its_answer_and_an_order_from_its_stamp() {
        let mut restock = ledger(5, "restock", 2.0);
        restock.key = Some("k".into());
        let db = Database {
            stock: 4,
            orders: vec![order(1, 1, 3.5)],
            ledger: vec![ledger(0, "create", 0.0), restock],
        };
        let answered = Restock {
            key: "k".into(),
            units: 5,
            attempts: vec![RestockAttempt {
                instance: 0,
                sent_us: at(1.9),
                answered_us: at(3.0),
                answer: http(200, "", None),
            }],
        };
        let h = StockHistory::of(&db, std::slice::from_ref(&answered));
        assert!(
            !h.positive_throughout(at(2.1), at(2.9)),
            "stamped, not yet seen"
        );
        assert!(h.positive_throughout(at(3.0), at(4.0)));
        assert_eq!(h.min_stock(at(3.6), at(4.0)), 4);
        let by_stamp = StockHistory::of(&db, &[]);
        assert!(
            by_stamp.positive_throughout(at(2.1), at(2.9)),
            "without its answer: its stamp"
        );
    }

    #[test]
    fn the_stock_history_knows_when_it_was_zero() {
        let db = Database {
            stock: 0,
            orders: vec![order(1, 1, 1.0), order(2, 2, 3.0)],
            ledger: vec![ledger(1, "create", 0.0), ledger(1, "restock", 2.0)],
        };
        let h = StockHistory::of(&db, &[]);
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
