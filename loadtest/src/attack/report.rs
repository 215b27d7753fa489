//! What an attack did, all products together and each product's part: the figures the
//! books and the demo judge.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use super::Product;
use super::plan::{Plan, Shelf};
use super::tally::Tally;

/// What one attack did, all products together; `products` has each product's part.
pub struct AttackReport {
    /// The first product's id (the only one's, in an attack on one product).
    pub product_id: i64,
    /// Units of every product together.
    pub initial_stock: i64,
    pub buyers: u64,
    /// Concurrent goose users.
    pub users: usize,
    pub tally: Arc<Tally>,
    pub elapsed: Duration,
    /// When every goose user was running, since the start; `None` if the sale ended first.
    pub full_load_at: Option<Duration>,
    /// Buyers without a final answer when the attack ended.
    pub unanswered_buyers: u64,
    /// Buyers who got two orders (two 201s).
    pub buyers_with_two_201s: u64,
    /// Buyers whose answer was lost (no answer, or a 5xx other than busy) and who never got
    /// a 201: whether they have an order is asked of the service after the attack.
    pub lost_answers: Vec<u64>,
    /// Why goose stopped early, if it refused to finish (a failed `--threshold`).
    pub goose_error: Option<String>,
    /// Whether the sale was decided (every buyer answered, or all tried and sold out) before
    /// the attack ended; `false` when `--run-time` ended it first, or a threshold or Ctrl-C
    /// stopped it.
    pub decided: bool,
    /// Each product's part of the attack, in the order given.
    pub products: Vec<ProductReport>,
}

/// One product's part of an attack: its buyers and their answers.
#[derive(Debug, Clone)]
pub struct ProductReport {
    pub product_id: i64,
    pub initial_stock: i64,
    /// Its buyers: those `b` with `(b - 1) % products` its index.
    pub buyers: u64,
    /// The answers about it alone.
    pub tally: Arc<Tally>,
    pub unanswered_buyers: u64,
    pub buyers_with_two_201s: u64,
    pub lost_answers: Vec<u64>,
}

impl ProductReport {
    /// The part of the attack of `shelf`, the `index`-th product.
    fn of(plan: &Plan, index: usize, shelf: &Shelf) -> Self {
        ProductReport {
            product_id: shelf.product.id,
            initial_stock: shelf.product.stock,
            buyers: shelf.buyers,
            tally: Arc::clone(&shelf.tally),
            unanswered_buyers: shelf
                .buyers
                .saturating_sub(shelf.answered.load(Ordering::SeqCst)),
            buyers_with_two_201s: plan
                .orders
                .iter()
                .skip(index)
                .step_by(plan.shelves.len())
                .filter(|o| o.load(Ordering::SeqCst) > 1)
                .count() as u64,
            // A buyer whose answer was lost but who got a 201 on a later try is not a lost
            // answer: their order is counted among the 201s already.
            lost_answers: without_201(shelf.tally.lost_answers(), &plan.orders),
        }
    }
}

impl AttackReport {
    /// What the attack of `plan` on `products` did, once goose has stopped (with
    /// `goose_error` if it refused to finish); `decided` whether the sale was.
    pub(super) fn of(
        plan: &Plan,
        products: &[Product],
        goose_error: Option<String>,
        decided: bool,
    ) -> Self {
        let full_load = plan.full_load_at_us.load(Ordering::SeqCst);
        let parts: Vec<ProductReport> = plan
            .shelves
            .iter()
            .enumerate()
            .map(|(index, shelf)| ProductReport::of(plan, index, shelf))
            .collect();
        AttackReport {
            product_id: products[0].id,
            initial_stock: products.iter().map(|p| p.stock).sum(),
            buyers: plan.buyers.len() as u64,
            users: plan.users,
            elapsed: plan.started.elapsed(),
            full_load_at: (full_load > 0).then(|| Duration::from_micros(full_load)),
            unanswered_buyers: parts.iter().map(|p| p.unanswered_buyers).sum(),
            buyers_with_two_201s: parts.iter().map(|p| p.buyers_with_two_201s).sum(),
            lost_answers: without_201(plan.tally.lost_answers(), &plan.orders),
            tally: Arc::clone(&plan.tally),
            goose_error,
            decided,
            products: parts,
        }
    }

    /// The attack as seen by product `index` alone, to judge its books on their own: its
    /// buyers, answers and stock; the load (users, timing, goose's error) shared.
    pub fn product(&self, index: usize) -> Option<AttackReport> {
        let part = self.products.get(index)?;
        Some(AttackReport {
            product_id: part.product_id,
            initial_stock: part.initial_stock,
            buyers: part.buyers,
            users: self.users,
            tally: Arc::clone(&part.tally),
            elapsed: self.elapsed,
            full_load_at: self.full_load_at,
            unanswered_buyers: part.unanswered_buyers,
            buyers_with_two_201s: part.buyers_with_two_201s,
            lost_answers: part.lost_answers.clone(),
            goose_error: self.goose_error.clone(),
            decided: self.decided,
            products: vec![part.clone()],
        })
    }

    /// Orders per second at full load: the orders answered from the moment every user was
    /// running to the last order, over that window. Before full load (a sale over during the
    /// ramp-up), from the first order to the last.
    pub fn orders_per_sec(&self) -> f64 {
        let at = self.tally.created_at();
        let from = self
            .full_load_at
            .unwrap_or_else(|| at.first().copied().unwrap_or_default());
        let in_window: Vec<&Duration> = at.iter().filter(|t| **t >= from).collect();
        match in_window.last() {
            Some(last) if **last > from => in_window.len() as f64 / (**last - from).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Orders answered in each `bin` since the start (for the chart).
    pub fn orders_over_time(&self, bin: Duration) -> Vec<u64> {
        let at = self.tally.created_at();
        let Some(last) = at.last() else {
            return Vec::new();
        };
        let bins = (last.as_secs_f64() / bin.as_secs_f64()) as usize + 1;
        let mut counts = vec![0; bins];
        for t in at {
            counts[(t.as_secs_f64() / bin.as_secs_f64()) as usize] += 1;
        }
        counts
    }
}

/// Of the buyers whose answer was lost, those who never got a 201 (`orders[b - 1]` counts
/// buyer `b`'s 201s).
fn without_201(lost: Vec<u64>, orders: &[AtomicU8]) -> Vec<u64> {
    lost.into_iter()
        .filter(|buyer| orders[(buyer - 1) as usize].load(Ordering::SeqCst) == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buyer_who_lost_an_answer_then_got_a_201_is_not_a_lost_answer() {
        // Buyers 1..=3: 1 lost an answer and then bought; 2 lost one and has no 201; 3 bought.
        let orders: Vec<AtomicU8> = [1, 0, 1].into_iter().map(AtomicU8::new).collect();
        assert_eq!(without_201(vec![1, 2], &orders), [2]);
    }
}
