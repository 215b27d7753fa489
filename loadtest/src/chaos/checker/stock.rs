//! The stock over time, rebuilt from the commit times of the ledger's rows and the orders:
//! when it was zero, and how low it went in a span.

use super::super::history::Micros;
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
    pub(super) fn of(db: &Database) -> Self {
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
    use super::super::fixtures::{at, ledger, order};
    use super::*;

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
