//! What bench-http measured, round by round, and the tables it prints at the end.
//!
//! Every ratio is taken within each round (both runs of a round minutes apart at most, so a
//! mood of the machine falls on both) and the figure shown is the median of those per-round
//! ratios; every other figure is the median of its rounds. The per-round figures are shown
//! beside each.

use std::fmt::Write as _;

use seckill::LockStrategy;

use super::cpu::Spent;
use super::desks::Desks;
use crate::chart::thousands;

/// Which run a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// PostgreSQL alone: pgbench, one client, 64 orders per commit.
    Ceiling,
    /// (a) `redis`, one instance, one product, 64 connections.
    OneAt64,
    /// (b) the same at 1,000 connections.
    OneAt1000,
    /// (c) three instances, one product, 1,000 connections in all.
    ThreeAt1000,
    /// (d) three instances, `--products` products at once, 1,000 connections in all.
    ThreeManyProducts,
    /// (e) one instance, `--products` products at once, 1,000 connections.
    OneManyProducts,
    /// (f) as (b), on an instance with `BUYER_IDENTITY=off`.
    OneIdentityOff,
    /// (g) the products of (d) on the instances of (d), through the router (HAProxy, one
    /// instance per product) instead of round robin.
    ThreeRouted,
    /// Another strategy on one instance, one product, 64 connections; `batch`: BATCH_MAX if
    /// set, else the service's default.
    Strategy {
        strategy: LockStrategy,
        batch: Option<u32>,
    },
}

/// What one run measured in one round.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Round {
    /// Orders counted in PostgreSQL over the run's seconds (the ceiling: pgbench's tps × 64).
    pub orders_per_sec: f64,
    /// Orders per second of each product, for a run over several.
    pub per_product: Vec<f64>,
    /// The 99th percentile of every answer's latency; with several wrk processes, the
    /// highest of theirs. `None` for the ceiling.
    pub p99_ms: Option<f64>,
    /// Failed purchases (non-2xx answers and socket errors) over all requests.
    pub failed_share: Option<f64>,
    /// Orders in the run, to divide the CPU time by.
    pub orders: f64,
    /// CPU seconds spent during the run, by part.
    pub cpu: Spent,
    /// The run's wall-clock seconds (the CPU window).
    pub wall_seconds: f64,
    /// What the instances' desks did (`None` for the ceiling, or an instance that did not
    /// answer for its metrics).
    pub desks: Option<Desks>,
}

/// One run, every round of it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub kind: Kind,
    pub label: String,
    /// Whether seckill instances take part (not in the ceiling): their CPU column is "-"
    /// otherwise.
    pub has_instances: bool,
    pub rounds: Vec<Round>,
}

/// Everything measured, and how.
#[derive(Debug, Clone, Default)]
pub(crate) struct Report {
    /// Lines above the tables: when, where, how, the server's settings.
    pub header: Vec<String>,
    pub rounds: u64,
    pub seconds: u64,
    /// Cores of the machine, for its busy share.
    pub cores: usize,
    pub products: usize,
    pub rows: Vec<Row>,
    /// Per round: requests/s of `GET /healthz` and of a sold-out purchase.
    pub health: Vec<(f64, f64)>,
}

/// The median (the upper one of an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The median of the known values, `None` if none is known.
fn median_known(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let known: Vec<f64> = values.into_iter().flatten().collect();
    (!known.is_empty()).then(|| median(&known))
}

/// Rates as whole numbers with separators, as in the median's column; ratios to `digits`.
fn per_round(values: &[f64], digits: usize) -> String {
    values
        .iter()
        .map(|v| {
            if digits == 0 {
                rate(*v)
            } else {
                format!("{v:.digits$}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn rate(value: f64) -> String {
    thousands(value.round().max(0.0) as u64)
}

fn or_na(value: Option<f64>, show: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "n/a".to_owned(), show)
}

/// A failed share that is not about zero: p99 then covers failed answers too.
const FAILED_NOTE_ABOVE: f64 = 0.001;

impl Row {
    fn orders(&self) -> Vec<f64> {
        self.rounds.iter().map(|r| r.orders_per_sec).collect()
    }
}

impl Report {
    fn row(&self, kind: Kind) -> Option<&Row> {
        self.rows.iter().find(|r| r.kind == kind)
    }

    /// `a`'s orders/s over `b`'s, round by round.
    fn ratios(&self, a: Kind, b: Kind) -> Option<Vec<f64>> {
        let (a, b) = (self.row(a)?, self.row(b)?);
        Some(
            a.rounds
                .iter()
                .zip(&b.rounds)
                .map(|(a, b)| a.orders_per_sec / b.orders_per_sec)
                .collect(),
        )
    }

    /// Per round: the slowest product's orders/s over the fastest's in (d).
    fn spread(&self) -> Option<Vec<f64>> {
        let row = self.row(Kind::ThreeManyProducts)?;
        Some(
            row.rounds
                .iter()
                .map(|r| {
                    let slowest = r.per_product.iter().copied().fold(f64::INFINITY, f64::min);
                    let fastest = r.per_product.iter().copied().fold(0.0, f64::max);
                    if fastest > 0.0 {
                        slowest / fastest
                    } else {
                        0.0
                    }
                })
                .collect(),
        )
    }

    /// The report: every table, in markdown.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n=== bench-http: each figure the median of {} round(s) of {} s, the runs alternating round by round; each ratio the median of the rounds' ratios ===",
            self.rounds, self.seconds
        );
        for line in &self.header {
            let _ = writeln!(out, "{line}");
        }
        self.orders_table(&mut out);
        self.products_table(&mut out);
        self.ratios_table(&mut out);
        self.health_table(&mut out);
        self.cpu_table(&mut out);
        out
    }

    fn orders_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n=== orders/s against the ceiling (orders counted in PostgreSQL; every request a new buyer) ==="
        );
        let _ = writeln!(
            out,
            "| run | orders/s | × ceiling | p99 ms | failed purchases | orders/s per round | × ceiling per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---|---|");
        let mut notes = Vec::new();
        for row in &self.rows {
            let orders = row.orders();
            let against = self.ratios(row.kind, Kind::Ceiling).unwrap_or_default();
            let p99 = median_known(row.rounds.iter().map(|r| r.p99_ms));
            let failed = median_known(row.rounds.iter().map(|r| r.failed_share));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.label,
                rate(median(&orders)),
                if against.is_empty() {
                    "n/a".to_owned()
                } else {
                    format!("{:.3}", median(&against))
                },
                p99.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
                failed.map_or_else(|| "-".to_owned(), |f| format!("{:.2} %", f * 100.0)),
                per_round(&orders, 0),
                per_round(&against, 3),
            );
            if failed.is_some_and(|f| f > FAILED_NOTE_ABOVE) {
                notes.push(format!(
                    "{}: {:.2} % of purchases failed; its p99 covers every answer, the failed ones included",
                    row.label,
                    failed.unwrap_or_default() * 100.0
                ));
            }
        }
        let _ = writeln!(
            out,
            "p99: of every answer wrk got (wrk --latency); with three wrk processes, the highest of their three."
        );
        for note in notes {
            let _ = writeln!(out, "note: {note}");
        }
    }

    fn products_table(&self, out: &mut String) {
        let Some(row) = self.row(Kind::ThreeManyProducts) else {
            return;
        };
        let _ = writeln!(
            out,
            "\n=== (d) per product: {} products sold at once, three instances, 1,000 connections in all ===",
            self.products
        );
        let _ = writeln!(out, "| product | orders/s | orders/s per round |");
        let _ = writeln!(out, "|---:|---:|---|");
        for product in 0..self.products {
            let figures: Vec<f64> = row
                .rounds
                .iter()
                .map(|r| r.per_product.get(product).copied().unwrap_or(0.0))
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                product + 1,
                rate(median(&figures)),
                per_round(&figures, 0)
            );
        }
        let orders = row.orders();
        let _ = writeln!(
            out,
            "| all | {} | {} |",
            rate(median(&orders)),
            per_round(&orders, 0)
        );
    }

    fn ratios_table(&self, out: &mut String) {
        let _ = writeln!(out, "\n=== ratios ===");
        let _ = writeln!(out, "| ratio | median | per round |");
        let _ = writeln!(out, "|---|---:|---|");
        let batched_pg_atomic = Kind::Strategy {
            strategy: LockStrategy::PgAtomic,
            batch: None,
        };
        let per_request_pg_atomic = Kind::Strategy {
            strategy: LockStrategy::PgAtomic,
            batch: Some(1),
        };
        let health: Vec<f64> = self.health.iter().map(|(h, so)| so / h).collect();
        let lines = [
            (
                "(c) / (b): three instances against one, 1,000 connections".to_owned(),
                self.ratios(Kind::ThreeAt1000, Kind::OneAt1000),
            ),
            (
                format!(
                    "(d) / (c): {} products against one, three instances",
                    self.products
                ),
                self.ratios(Kind::ThreeManyProducts, Kind::ThreeAt1000),
            ),
            (
                format!(
                    "(g) / (d): {} products through the router against round robin, three instances",
                    self.products
                ),
                self.ratios(Kind::ThreeRouted, Kind::ThreeManyProducts),
            ),
            (
                format!(
                    "(e) / (b): {} products against one, one instance",
                    self.products
                ),
                self.ratios(Kind::OneManyProducts, Kind::OneAt1000),
            ),
            (
                "(b) / (f): buyers' tokens checked against identity off, one instance".to_owned(),
                self.ratios(Kind::OneAt1000, Kind::OneIdentityOff),
            ),
            (
                "(d): the slowest product's orders/s over the fastest's".to_owned(),
                self.spread(),
            ),
            (
                "(b) / (a): 1,000 connections against 64, one instance".to_owned(),
                self.ratios(Kind::OneAt1000, Kind::OneAt64),
            ),
            (
                "batched redis (a) / batched pg-atomic, one instance, 64 connections".to_owned(),
                self.ratios(Kind::OneAt64, batched_pg_atomic),
            ),
            (
                "batched redis (a) / per-request pg-atomic (BATCH_MAX=1)".to_owned(),
                self.ratios(Kind::OneAt64, per_request_pg_atomic),
            ),
            (
                "sold-out answer / GET /healthz, requests/s".to_owned(),
                (!health.is_empty()).then_some(health),
            ),
        ];
        for (name, ratios) in lines {
            match ratios {
                Some(r) if !r.is_empty() => {
                    let _ = writeln!(out, "| {name} | {:.3} | {} |", median(&r), per_round(&r, 3));
                }
                _ => {
                    let _ = writeln!(out, "| {name} | n/a | |");
                }
            }
        }
    }

    fn health_table(&self, out: &mut String) {
        if self.health.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n=== the sold-out answer against /healthz: one instance (that of (a)), 64 connections ==="
        );
        let _ = writeln!(out, "| path | requests/s | per round |");
        let _ = writeln!(out, "|---|---:|---|");
        let health: Vec<f64> = self.health.iter().map(|(h, _)| *h).collect();
        let sold_out: Vec<f64> = self.health.iter().map(|(_, so)| *so).collect();
        let _ = writeln!(
            out,
            "| GET /healthz | {} | {} |",
            rate(median(&health)),
            per_round(&health, 0)
        );
        let _ = writeln!(
            out,
            "| POST purchase of a sold-out product | {} | {} |",
            rate(median(&sold_out)),
            per_round(&sold_out, 0)
        );
    }

    fn cpu_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n=== CPU per order, by where it is spent (µs of CPU per order sold; median of the rounds, column by column, so a row need not add up exactly) ==="
        );
        let _ = writeln!(
            out,
            "| run | orders/s | machine busy | seckill | PostgreSQL | Redis | load generator | other | machine |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let micros = |seconds: Option<f64>, orders: f64| -> Option<f64> {
            seconds.filter(|_| orders > 0.0).map(|s| s * 1e6 / orders)
        };
        for row in &self.rows {
            let column = |part: fn(&Spent) -> Option<f64>| -> Option<f64> {
                median_known(row.rounds.iter().map(|r| micros(part(&r.cpu), r.orders)))
            };
            let busy = median_known(row.rounds.iter().map(|r| {
                let capacity = self.cores as f64 * r.wall_seconds;
                r.cpu
                    .machine
                    .filter(|_| capacity > 0.0)
                    .map(|m| m / capacity)
            }));
            let us = |v: Option<f64>| or_na(v, |v| format!("{v:.1}"));
            let instances = if row.has_instances {
                us(column(|c| c.instances))
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {instances} | {} | {} | {} | {} | {} |",
                row.label,
                rate(median(&row.orders())),
                or_na(busy, |b| format!("{:.0} %", b * 100.0)),
                us(column(|c| c.postgres)),
                us(column(|c| c.redis)),
                us(column(|c| c.load)),
                us(column(Spent::other)),
                us(column(|c| c.machine)),
            );
        }
        let _ = writeln!(
            out,
            "seckill: the run's instances (utime + stime); PostgreSQL: the postmaster and its children, backends that ended included; \
             Redis: its process; load generator: wrk or pgbench (getrusage of this process's children); \
             machine: /proc/stat, all CPUs busy; other: the machine less the rest (other processes, this one included); \
             machine busy: the machine's CPU time over cores × the run's seconds. n/a: could not be read (a process gone, a server not on this machine). \
             The kernel counts each part in clock ticks (10 ms at the usual 100 Hz), so a small \"other\" may come out a little below zero."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(orders_per_sec: f64) -> Round {
        Round {
            orders_per_sec,
            orders: orders_per_sec * 2.0,
            wall_seconds: 2.0,
            cpu: Spent {
                instances: Some(1.0),
                postgres: Some(0.5),
                redis: None,
                load: Some(0.25),
                machine: Some(3.0),
            },
            ..Round::default()
        }
    }

    fn row(kind: Kind, label: &str, figures: &[f64]) -> Row {
        Row {
            kind,
            label: label.to_owned(),
            has_instances: kind != Kind::Ceiling,
            rounds: figures.iter().map(|f| round(*f)).collect(),
        }
    }

    #[test]
    fn ratios_are_the_median_of_each_rounds_ratio() {
        // Round 2 ran on a slow machine: both figures fell, their ratio held.
        let report = Report {
            rounds: 3,
            seconds: 2,
            cores: 2,
            products: 2,
            rows: vec![
                row(Kind::Ceiling, "ceiling", &[1_000.0, 500.0, 1_000.0]),
                row(Kind::OneAt64, "(a)", &[400.0, 200.0, 300.0]),
            ],
            ..Report::default()
        };

        assert_eq!(
            report.ratios(Kind::OneAt64, Kind::Ceiling),
            Some(vec![0.4, 0.4, 0.3])
        );
        let text = report.render();
        assert!(
            text.contains("| (a) | 300 | 0.400 | - | - | 400, 200, 300 | 0.400, 0.400, 0.300 |"),
            "{text}"
        );
    }

    #[test]
    fn every_table_is_printed_and_a_part_that_could_not_be_read_is_na() {
        let mut many = row(Kind::ThreeManyProducts, "(d)", &[900.0]);
        many.rounds[0].per_product = vec![500.0, 400.0];
        let report = Report {
            rounds: 1,
            seconds: 2,
            cores: 2,
            products: 2,
            rows: vec![
                row(Kind::Ceiling, "ceiling", &[1_000.0]),
                row(Kind::OneAt64, "(a)", &[400.0]),
                row(Kind::OneAt1000, "(b)", &[420.0]),
                row(Kind::ThreeAt1000, "(c)", &[600.0]),
                many,
                row(Kind::OneManyProducts, "(e)", &[378.0]),
            ],
            health: vec![(100.0, 95.0)],
            ..Report::default()
        };

        let text = report.render();

        for heading in [
            "=== orders/s against the ceiling",
            "=== (d) per product",
            "=== ratios ===",
            "=== the sold-out answer against /healthz",
            "=== CPU per order",
        ] {
            assert!(text.contains(heading), "{heading} missing from\n{text}");
        }
        assert!(
            text.contains(
                "| (d): the slowest product's orders/s over the fastest's | 0.800 | 0.800 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| (c) / (b): three instances against one, 1,000 connections | 1.429 |"),
            "{text}"
        );
        assert!(
            text.contains("| (e) / (b): 2 products against one, one instance | 0.900 |"),
            "{text}"
        );
        // Ceiling: no instances; 2,000 orders; Redis unknown, so "other" too.
        assert!(
            text.contains("| ceiling | 1,000 | 75 % | - | 250.0 | n/a | 125.0 | n/a | 1500.0 |"),
            "{text}"
        );
        // A ratio whose rows were not measured says so.
        assert!(text.contains(
            "| batched redis (a) / batched pg-atomic, one instance, 64 connections | n/a | |"
        ));
    }
}
