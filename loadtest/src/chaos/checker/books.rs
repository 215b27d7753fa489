//! The rules on the product's books: nothing oversold, every unit accounted for, every
//! restock applied exactly once when it was answered 2xx.

use super::facts::Facts;

/// The stock never went below zero, and no more was sold than supplied.
pub(super) fn no_oversell(f: &Facts<'_>) -> Vec<String> {
    let mut violations = Vec::new();
    let stock = f.evidence.database.stock;
    if stock < 0 {
        violations.push(format!("the stock is {stock}"));
    }
    if f.sold > f.supplied {
        violations.push(format!("{} units sold of {} supplied", f.sold, f.supplied));
    }
    violations
}

/// No update was lost: the ledger balances, and every restock was applied exactly once.
pub(super) fn no_lost_update(f: &Facts<'_>) -> Vec<String> {
    let mut violations = the_ledger_balances(f);
    violations.extend(each_restock_applied_once(f));
    violations
}

/// What the ledger supplied is what is left plus what was sold, and what the soak put in
/// (the initial stock and the restocks answered 2xx).
fn the_ledger_balances(f: &Facts<'_>) -> Vec<String> {
    let (supplied, sold, stock) = (f.supplied, f.sold, f.evidence.database.stock);
    let mut violations = Vec::new();
    if supplied != stock + sold {
        violations.push(format!(
            "supplied {supplied} (the ledger) != stock {stock} + sold {sold}"
        ));
    }
    if supplied != f.evidence.initial_stock + f.restocked_units {
        violations.push(format!(
            "supplied {supplied} (the ledger) != initial {} + {} units of the {} restocks answered 2xx",
            f.evidence.initial_stock,
            f.restocked_units,
            f.applied.len()
        ));
    }
    violations
}

/// The ledger has one row per restock answered 2xx, and every restock's outcome is known.
fn each_restock_applied_once(f: &Facts<'_>) -> Vec<String> {
    let mut violations = Vec::new();
    let db = f.evidence.database;
    let ledger_restocks = db.ledger.iter().filter(|l| l.reason == "restock").count();
    if ledger_restocks != f.applied.len() {
        violations.push(format!(
            "the ledger has {ledger_restocks} restocks, {} were answered 2xx",
            f.applied.len()
        ));
    }
    for r in f
        .evidence
        .restocks
        .iter()
        .filter(|r| r.applied_by().is_none())
    {
        let answers: Vec<String> = r.attempts.iter().map(|a| a.answer.label()).collect();
        let why = if r.refused() {
            "refused"
        } else {
            "outcome still unknown after its retries"
        };
        violations.push(format!(
            "restock {} of {} units {why}: {}",
            r.key,
            r.units,
            answers.join(", ")
        ));
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::super::history::{Answer, Restock, RestockAttempt};
    use super::super::fixtures::{Soak, at, attempt, http, ledger, order};
    use super::*;

    fn restock(key: &str, units: i64, answer: Answer) -> Restock {
        Restock {
            key: key.into(),
            units,
            attempts: vec![RestockAttempt {
                instance: 0,
                sent_us: at(12.0),
                answered_us: at(12.01),
                answer,
            }],
        }
    }

    #[test]
    fn books_that_balance_break_none_of_these_rules() {
        let soak = Soak::clean();
        assert!(soak.violations_of(no_oversell).is_empty());
        assert!(soak.violations_of(the_ledger_balances).is_empty());
        assert!(soak.violations_of(each_restock_applied_once).is_empty());
    }

    #[test]
    fn a_negative_stock_is_an_oversell() {
        let mut soak = Soak::clean();
        soak.database.stock = -1;
        assert_eq!(soak.violations_of(no_oversell), ["the stock is -1"]);
    }

    #[test]
    fn selling_more_than_was_supplied_is_an_oversell() {
        let mut soak = Soak::clean();
        soak.database.orders.push(order(105, 7, 10.95));
        soak.attempts
            .push(attempt(7, 10.94, http(201, "", Some(105))));
        assert_eq!(
            soak.violations_of(no_oversell),
            ["5 units sold of 4 supplied"]
        );
    }

    #[test]
    fn a_stock_that_lost_a_decrement_does_not_balance() {
        let mut soak = Soak::clean();
        soak.database.stock = 1;
        assert_eq!(
            soak.violations_of(the_ledger_balances),
            ["supplied 4 (the ledger) != stock 1 + sold 4"]
        );
    }

    #[test]
    fn a_ledger_with_more_than_the_answered_restocks_does_not_balance() {
        let mut soak = Soak::clean();
        soak.database.ledger[1].delta = 3;
        soak.database.stock = 1;
        assert_eq!(
            soak.violations_of(the_ledger_balances),
            ["supplied 5 (the ledger) != initial 2 + 2 units of the 1 restocks answered 2xx"]
        );
    }

    #[test]
    fn a_restock_in_the_ledger_twice_is_caught() {
        let mut soak = Soak::clean();
        soak.database.ledger.push(ledger(2, "restock", 10.3));
        assert_eq!(
            soak.violations_of(each_restock_applied_once),
            ["the ledger has 2 restocks, 1 were answered 2xx"]
        );
    }

    #[test]
    fn a_restock_refused_or_never_resolved_is_caught() {
        let mut soak = Soak::clean();
        soak.restocks.extend([
            restock("k2", 5, http(409, "conflict", None)),
            restock("k3", 6, Answer::Lost("connection refused".into())),
        ]);
        assert_eq!(
            soak.violations_of(each_restock_applied_once),
            [
                "restock k2 of 5 units refused: 409 conflict",
                "restock k3 of 6 units outcome still unknown after its retries: unknown (no answer)"
            ]
        );
    }
}
