//! The rules on orders: one per buyer, every 201 committed inside its request with the id it
//! named, every order in the database accounted for by an answer or a lookup, and
//! `already_purchased` naming the buyer's order.

use std::collections::HashSet;

use super::super::history::Attempt;
use super::facts::Facts;
use super::{DbOrder, Lookup, SLACK_US};

/// No buyer has two orders in the database, nor was answered 201 twice.
pub(super) fn one_order_per_buyer(f: &Facts<'_>) -> Vec<String> {
    let mut violations = Vec::new();
    for (user, orders) in &f.orders_of {
        if orders.len() > 1 {
            let ids: Vec<String> = orders.iter().map(|o| o.id.to_string()).collect();
            violations.push(format!(
                "user {user} has {} orders in the DB ({}); answers: {}",
                orders.len(),
                ids.join(", "),
                f.attempts_of(*user)
            ));
        }
    }
    for (user, attempts) in &f.by_user {
        let created = attempts.iter().filter(|a| a.is_created()).count();
        if created > 1 {
            violations.push(format!(
                "user {user} was answered 201 {created} times: {}",
                f.attempts_of(*user)
            ));
        }
    }
    violations.sort();
    violations
}

/// A 201's order is in the database, with the id it named, for its buyer, committed between
/// the request's send and its answer.
pub(super) fn every_201_has_its_order(f: &Facts<'_>) -> Vec<String> {
    f.evidence
        .attempts
        .iter()
        .filter(|a| a.is_created())
        .filter_map(|a| a_201_without_its_order(f, a))
        .collect()
}

fn a_201_without_its_order(f: &Facts<'_>, a: &Attempt) -> Option<String> {
    let described = f.describe(a);
    match (a.answer.order_id(), f.order_of(a.user)) {
        (Some(id), Some(o)) if o.id == id && !committed_inside(o, a) => Some(format!(
            "{described}: its order committed at {:.3} s, outside the request ({} ms slack each side)",
            f.t(o.committed_us),
            SLACK_US / 1000
        )),
        (Some(id), Some(o)) if o.id == id => None,
        (None, Some(_)) => None,
        (Some(id), Some(o)) => Some(format!(
            "{described}: the buyer's order in the DB is {}; {}",
            o.id,
            f.whose(id)
        )),
        (Some(id), None) => Some(format!(
            "{described}: the buyer has no order in the DB; {}",
            f.whose(id)
        )),
        (None, None) => Some(format!("{described}: the buyer has no order in the DB")),
    }
}

/// Whether the order committed between the attempt's send and its answer (with the slack).
fn committed_inside(o: &DbOrder, a: &Attempt) -> bool {
    o.committed_us >= a.sent_us - SLACK_US && o.committed_us <= a.answered_us + SLACK_US
}

/// An order in the database was answered 201, or an attempt sent before it committed left
/// the outcome unknown and the lookup finds it; and every lookup agrees with the database.
pub(super) fn every_order_answered(f: &Facts<'_>) -> Vec<String> {
    let mut reported = HashSet::new();
    let mut violations = Vec::new();
    for o in &f.evidence.database.orders {
        if let Some(problem) = why_unaccounted(f, o) {
            reported.insert(o.user);
            violations.push(format!(
                "order {} of user {} (committed {:.3} s): {problem}; answers: {}",
                o.id,
                o.user,
                f.t(o.committed_us),
                f.attempts_of(o.user)
            ));
        }
    }
    violations.extend(lookups_that_disagree(f, &mut reported));
    violations
}

/// Why nothing accounts for this order, or `None` when something does.
fn why_unaccounted(f: &Facts<'_>, o: &DbOrder) -> Option<String> {
    let attempts = f.attempts(o.user);
    let answered = attempts
        .iter()
        .any(|a| a.is_created() && a.answer.order_id().is_none_or(|id| id == o.id));
    if answered {
        return None;
    }
    // An unknown outcome accounts for the order only if it was sent before the commit.
    let unknown = attempts
        .iter()
        .any(|a| a.answer.outcome_unknown() && a.sent_us - SLACK_US <= o.committed_us);
    Some(match (unknown, f.evidence.lookups.get(&o.user)) {
        (true, Some(Lookup::Found(id))) if *id == o.id => return None,
        (true, Some(Lookup::Found(id))) => format!("the lookup found order {id}"),
        (true, Some(Lookup::NotFound)) => "the lookup found no order".to_owned(),
        (true, Some(Lookup::Failed(why))) => format!("the lookup failed: {why}"),
        (true, None) => "it was not looked up".to_owned(),
        (false, _) => {
            "no answer was 201, or left the outcome unknown and was sent before it committed"
                .to_owned()
        }
    })
}

/// A lookup must agree with the database, also where the buyer's order was answered; a
/// buyer already reported is not reported again.
fn lookups_that_disagree(f: &Facts<'_>, reported: &mut HashSet<i64>) -> Vec<String> {
    let mut violations = Vec::new();
    for (user, lookup) in f.evidence.lookups {
        let mine = f.order_of(*user).map(|o| o.id);
        let disagrees = match lookup {
            Lookup::Found(id) => mine != Some(*id),
            Lookup::NotFound => mine.is_some(),
            Lookup::Failed(_) => false,
        };
        if disagrees && reported.insert(*user) {
            violations.push(format!(
                "the lookup of user {user} said {lookup:?}, the DB has {}",
                mine.map_or("no order".to_owned(), |m| format!("order {m}")),
            ));
        }
    }
    violations
}

/// A 409 `already_purchased` comes with the buyer's order in the database, and the id it
/// names (when it names one) is that order.
pub(super) fn already_purchased_names_the_order(f: &Facts<'_>) -> Vec<String> {
    let mut violations = Vec::new();
    for a in f
        .evidence
        .attempts
        .iter()
        .filter(|a| a.answer.status() == Some(409) && a.answer.code() == "already_purchased")
    {
        match (a.answer.order_id(), f.order_of(a.user)) {
            (_, None) => violations.push(format!(
                "{}: the buyer has no order in the DB",
                f.describe(a)
            )),
            (Some(id), Some(o)) if id != o.id => violations.push(format!(
                "{}: the buyer's order is {}; {}",
                f.describe(a),
                o.id,
                f.whose(id)
            )),
            _ => {}
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::super::super::history::Answer;
    use super::super::fixtures::{Soak, at, attempt, http, order};
    use super::*;

    #[test]
    fn a_clean_soak_breaks_none_of_the_order_rules() {
        let soak = Soak::clean();
        assert!(soak.violations_of(one_order_per_buyer).is_empty());
        assert!(soak.violations_of(every_201_has_its_order).is_empty());
        assert!(soak.violations_of(every_order_answered).is_empty());
        assert!(
            soak.violations_of(already_purchased_names_the_order)
                .is_empty()
        );
    }

    #[test]
    fn a_buyer_with_two_orders_in_the_database_is_caught() {
        let mut soak = Soak::clean();
        soak.database.orders.push(order(105, 1, 0.057));
        let violations = soak.violations_of(one_order_per_buyer);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("user 1 has 2 orders in the DB (101, 105); answers: user 1 "),
            "{violations:?}"
        );
    }

    #[test]
    fn a_buyer_answered_201_twice_is_caught() {
        let mut soak = Soak::clean();
        soak.attempts
            .push(attempt(1, 0.2, http(201, "", Some(101))));
        let violations = soak.violations_of(one_order_per_buyer);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("user 1 was answered 201 2 times: "),
            "{violations:?}"
        );
    }

    #[test]
    fn a_201_whose_order_committed_before_its_send_is_caught() {
        let mut soak = Soak::clean();
        soak.database.orders[0].committed_us = at(-0.5);
        let violations = soak.violations_of(every_201_has_its_order);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].contains("user 1 at instance 1")
                && violations[0].contains("its order committed at -0.500 s, outside the request"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_201_whose_order_is_missing_or_another_is_caught() {
        let mut soak = Soak::clean();
        // User 2's order is gone; user 5's answer names user 1's order.
        soak.database.orders.retain(|o| o.user != 2);
        soak.attempts[6].answer = http(201, "", Some(101));
        let violations = soak.violations_of(every_201_has_its_order);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(
            violations[0].starts_with("user 2 ")
                && violations[0]
                    .ends_with("the buyer has no order in the DB; in the DB there is no order 102"),
            "{violations:?}"
        );
        assert!(
            violations[1].starts_with("user 5 ")
                && violations[1].ends_with(
                    "the buyer's order in the DB is 104; in the DB order 101 belongs to user 1"
                ),
            "{violations:?}"
        );
    }

    #[test]
    fn an_order_no_201_or_earlier_unknown_explains_is_caught() {
        // User 7 is told busy, then an order commits; the lost attempt came after it.
        let mut soak = Soak::clean();
        soak.attempts.extend([
            attempt(7, 11.0, http(503, "busy", None)),
            attempt(7, 12.0, Answer::Lost("connection reset".into())),
        ]);
        soak.database.orders.push(order(105, 7, 11.2));
        soak.lookups.insert(7, Lookup::Found(105));
        let violations = soak.violations_of(every_order_answered);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0]
                .starts_with("order 105 of user 7 (committed 11.200 s): no answer was 201"),
            "{violations:?}"
        );
    }

    #[test]
    fn an_unknown_outcome_the_lookup_does_not_confirm_is_caught() {
        let mut soak = Soak::clean();
        soak.lookups.insert(4, Lookup::NotFound);
        let violations = soak.violations_of(every_order_answered);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("order 103 of user 4")
                && violations[0].contains("the lookup found no order"),
            "{violations:?}"
        );
        soak.lookups.remove(&4);
        let violations = soak.violations_of(every_order_answered);
        assert!(
            violations[0].contains("it was not looked up"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_lookup_that_disagrees_with_an_answered_order_is_caught() {
        let mut soak = Soak::clean();
        soak.lookups.insert(1, Lookup::NotFound);
        assert_eq!(
            soak.violations_of(every_order_answered),
            ["the lookup of user 1 said NotFound, the DB has order 101"]
        );
    }

    #[test]
    fn already_purchased_without_the_buyers_order_is_caught() {
        let mut soak = Soak::clean();
        // User 3 is told already_purchased with no order; user 4 is named user 1's order.
        soak.attempts[2].answer = http(409, "already_purchased", None);
        soak.attempts[4].answer = http(409, "already_purchased", Some(101));
        let violations = soak.violations_of(already_purchased_names_the_order);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(
            violations[0].starts_with("user 3 ")
                && violations[0].ends_with("the buyer has no order in the DB"),
            "{violations:?}"
        );
        assert!(
            violations[1].starts_with("user 4 ")
                && violations[1]
                    .ends_with("the buyer's order is 103; in the DB order 101 belongs to user 1"),
            "{violations:?}"
        );
    }
}
