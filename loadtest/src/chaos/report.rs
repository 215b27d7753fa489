//! The soak's table: faults by kind with the time to recover from each, answers by status,
//! orders/s between faults and during them, the books, every check and every violation; and
//! the same as JSON (`--summary`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::checker::Verdict;
use super::history::{Attempt, FaultRecord, Micros, Restock};
use super::schedule::FaultKind;

/// What the soak was, for the table's head.
#[derive(Debug, Clone)]
pub struct Header {
    pub seed: u64,
    /// The command line's settings, as one line.
    pub settings: String,
    pub started_us: Micros,
    /// When the load stopped.
    pub ended_us: Micros,
    /// The instances' `SOLD_OUT_RECHECK_MS`, in µs.
    pub sold_out_recheck_us: Micros,
    /// The kinds of fault the soak's strategy draws: the only ones the report counts.
    pub kinds: Vec<FaultKind>,
}

/// Everything the table shows.
pub struct Report<'a> {
    pub header: &'a Header,
    pub faults: &'a [FaultRecord],
    pub attempts: &'a [Attempt],
    pub restocks: &'a [Restock],
    pub buyers: i64,
    pub verdict: &'a Verdict,
}

/// How soon the sale came back after one kind of fault.
#[derive(Debug, Default)]
struct Recovery {
    injected: usize,
    /// Milliseconds from the heal to the answer of the first 201 sent after it.
    recovered_ms: Vec<i64>,
    /// Faults after which no 201 came before the next fault (or the end).
    not_recovered: usize,
}

impl Report<'_> {
    fn recoveries(&self) -> BTreeMap<FaultKind, Recovery> {
        let mut created: Vec<(Micros, Micros)> = self
            .attempts
            .iter()
            .filter(|a| a.is_created())
            .map(|a| (a.sent_us, a.answered_us))
            .collect();
        created.sort_unstable();
        let mut by_kind: BTreeMap<FaultKind, Recovery> = self
            .header
            .kinds
            .iter()
            .map(|k| (*k, Recovery::default()))
            .collect();
        for (i, fault) in self.faults.iter().enumerate() {
            let next = self
                .faults
                .get(i + 1)
                .map_or(self.header.ended_us, |f| f.injected_us);
            let recovery = by_kind.get_mut(&fault.kind).expect("every kind");
            recovery.injected += 1;
            let first = created[created.partition_point(|(sent, _)| *sent < fault.healed_us)..]
                .iter()
                .map(|(_, answered)| *answered)
                .filter(|answered| *answered <= next)
                .min();
            match first {
                Some(answered) => recovery
                    .recovered_ms
                    .push((answered - fault.healed_us) / 1000),
                None => recovery.not_recovered += 1,
            }
        }
        by_kind
    }

    /// Orders per second answered between faults (quiet spells) and during them.
    fn orders_per_sec(&self) -> (f64, f64) {
        let mut created: Vec<Micros> = self
            .attempts
            .iter()
            .filter(|a| a.is_created())
            .map(|a| a.answered_us)
            .collect();
        created.sort_unstable();
        let count = |from: Micros, to: Micros| {
            (created.partition_point(|t| *t < to) - created.partition_point(|t| *t < from)) as f64
        };
        let (mut quiet, mut quiet_us, mut faulty, mut faulty_us) = (0.0, 0, 0.0, 0);
        let mut from = self.header.started_us;
        for fault in self.faults {
            quiet += count(from, fault.injected_us);
            quiet_us += fault.injected_us - from;
            faulty += count(fault.injected_us, fault.healed_us);
            faulty_us += fault.healed_us - fault.injected_us;
            from = fault.healed_us;
        }
        quiet += count(from, self.header.ended_us);
        quiet_us += self.header.ended_us - from;
        let rate = |n: f64, us: Micros| if us > 0 { n * 1e6 / us as f64 } else { 0.0 };
        (rate(quiet, quiet_us), rate(faulty, faulty_us))
    }

    fn answers(&self) -> Vec<(String, usize)> {
        let mut by_label: BTreeMap<String, usize> = BTreeMap::new();
        for a in self.attempts {
            *by_label.entry(a.answer.label()).or_default() += 1;
        }
        let mut answers: Vec<(String, usize)> = by_label.into_iter().collect();
        answers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        answers
    }

    /// The `sold_out` answers the service's bound allowed, by the fault they came during or
    /// within `SOLD_OUT_RECHECK_MS` after (`None`: no fault near).
    fn stale_sold_out_by_fault(&self) -> BTreeMap<Option<FaultKind>, usize> {
        let mut by_fault = BTreeMap::new();
        for sent in &self.verdict.sold_out_within_the_bound {
            let near = self
                .faults
                .iter()
                .rev()
                .find(|f| f.injected_us <= *sent)
                .filter(|f| *sent <= f.healed_us + self.header.sold_out_recheck_us)
                .map(|f| f.kind);
            *by_fault.entry(near).or_default() += 1;
        }
        by_fault
    }

    /// The answers to the purchases sent during `[from, to)`, by status and code.
    fn answers_sent(&self, from: Micros, to: Micros) -> BTreeMap<String, usize> {
        let mut by_label = BTreeMap::new();
        for a in self
            .attempts
            .iter()
            .filter(|a| (from..to).contains(&a.sent_us))
        {
            *by_label.entry(a.answer.label()).or_default() += 1;
        }
        by_label
    }

    /// The table: the faults and their recoveries, the answers, the books, the checks and
    /// their violations, and the verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write_faults(&mut out);
        self.write_answers(&mut out);
        self.write_books(&mut out);
        self.write_checks(&mut out);
        out
    }

    /// The head line and each kind of fault, with how soon the sale recovered from it.
    fn write_faults(&self, out: &mut String) {
        let h = self.header;
        let seconds = (h.ended_us - h.started_us) as f64 / 1e6;
        let _ = writeln!(
            out,
            "\nchaos soak, seed {}: {} faults in {seconds:.0} s ({})\n",
            h.seed,
            self.faults.len(),
            h.settings
        );
        let _ = writeln!(
            out,
            "| fault | injected | recovery p50 ms | recovery max ms | no 201 before the next fault |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (kind, r) in self.recoveries() {
            let mut ms = r.recovered_ms.clone();
            ms.sort_unstable();
            let (p50, max) = match (ms.get(ms.len().saturating_sub(1) / 2), ms.last()) {
                (Some(p50), Some(max)) => (p50.to_string(), max.to_string()),
                _ => ("-".to_owned(), "-".to_owned()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {p50} | {max} | {} |",
                kind.name(),
                r.injected,
                r.not_recovered
            );
        }
    }

    /// The requests, and the answers by status and code.
    fn write_answers(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n{} buyers made {} purchase requests; {} restocks ({} requests):\n",
            self.buyers,
            self.attempts.len(),
            self.restocks.len(),
            self.restocks
                .iter()
                .map(|r| r.attempts.len())
                .sum::<usize>()
        );
        let _ = writeln!(out, "| answer | count |");
        let _ = writeln!(out, "|---|---:|");
        for (label, count) in self.answers() {
            let _ = writeln!(out, "| {label} | {count} |");
        }
    }

    /// The rates, the books, the unknown outcomes and the `sold_out` answers.
    fn write_books(&self, out: &mut String) {
        let v = self.verdict;
        let (quiet, faulty) = self.orders_per_sec();
        let _ = writeln!(
            out,
            "\norders/s between faults: {quiet:.0}; during faults: {faulty:.0} (restocks cap the rate: a sold-out product sells nothing)"
        );
        let _ = writeln!(
            out,
            "books: supplied {} (initial + {} restocks of {} units), sold {} in {} orders, stock {}",
            v.supplied, v.restocks_applied, v.restocked_units, v.sold, v.orders, v.stock
        );
        let near: Vec<String> = self
            .stale_sold_out_by_fault()
            .into_iter()
            .map(|(kind, n)| format!("{n} {}", kind.map_or("with no fault near", FaultKind::name)))
            .collect();
        let _ = writeln!(
            out,
            "unknown outcomes: {} buyers, of whom the lookup found {} with an order; sold_out answers: {}, of which {} came while units were there but within SOLD_OUT_RECHECK_MS of the stock being zero (the bound the service promises, so not violations; by the fault they came during or within SOLD_OUT_RECHECK_MS after: {})\n",
            v.unknown_buyers,
            v.unknown_found,
            v.sold_out_answers,
            v.sold_out_within_the_bound.len(),
            if near.is_empty() {
                "none".to_owned()
            } else {
                near.join(", ")
            }
        );
        if v.timed_out_by_a_pause > 0 {
            let _ = writeln!(
                out,
                "408 answers from instances as they woke from a pause: {} (a stopped instance's clock runs on, and a new connection's request-head timer (HTTP_REQUEST_TIMEOUT_MS) due within the pause runs out as it wakes, refusing a request that came meanwhile, nothing done: not violations)\n",
                v.timed_out_by_a_pause
            );
        }
    }

    /// Every check with its count of violations, each violation, and the verdict.
    fn write_checks(&self, out: &mut String) {
        let v = self.verdict;
        let _ = writeln!(out, "| check | rule | violations |");
        let _ = writeln!(out, "|---|---|---:|");
        for check in &v.checks {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                check.name,
                check.rule,
                check.violations.len()
            );
        }
        for check in v.checks.iter().filter(|c| !c.violations.is_empty()) {
            let _ = writeln!(out, "\nviolations of \"{}\":", check.name);
            for violation in &check.violations {
                let _ = writeln!(out, "- {violation}");
            }
        }
        let _ = writeln!(
            out,
            "\nVERDICT {}: {} violations (seed {})",
            if v.passed() { "PASS" } else { "FAIL" },
            v.violations(),
            self.header.seed
        );
    }

    pub fn json(&self) -> Value {
        let (quiet, faulty) = self.orders_per_sec();
        let recoveries: BTreeMap<&str, Value> = self
            .recoveries()
            .into_iter()
            .map(|(kind, r)| {
                (
                    kind.name(),
                    json!({
                        "injected": r.injected,
                        "recovered_ms": r.recovered_ms,
                        "not_recovered": r.not_recovered,
                    }),
                )
            })
            .collect();
        let v = self.verdict;
        json!({
            "seed": self.header.seed,
            "settings": self.header.settings,
            "seconds": (self.header.ended_us - self.header.started_us) as f64 / 1e6,
            "faults": recoveries,
            "fault_log": self.faults.iter().map(|f| json!({
                "index": f.index,
                "kind": f.kind.name(),
                "detail": f.detail,
                "injected_s": (f.injected_us - self.header.started_us) as f64 / 1e6,
                "healed_s": (f.healed_us - self.header.started_us) as f64 / 1e6,
                "answers_sent_until_1s_after_the_heal": self.answers_sent(f.injected_us, f.healed_us + 1_000_000),
            })).collect::<Vec<_>>(),
            "buyers": self.buyers,
            "answers": self.answers().into_iter().collect::<BTreeMap<_, _>>(),
            "orders_per_sec_between_faults": quiet,
            "orders_per_sec_during_faults": faulty,
            "supplied": v.supplied,
            "sold": v.sold,
            "stock": v.stock,
            "orders": v.orders,
            "restocks_applied": v.restocks_applied,
            "sold_out_answers": v.sold_out_answers,
            "sold_out_within_the_bound": v.sold_out_within_the_bound.len(),
            "timed_out_by_a_pause": v.timed_out_by_a_pause,
            "sold_out_within_the_bound_by_fault": self
                .stale_sold_out_by_fault()
                .into_iter()
                .map(|(kind, n)| (kind.map_or("none", FaultKind::name), n))
                .collect::<BTreeMap<_, _>>(),
            "unknown_buyers": v.unknown_buyers,
            "unknown_found": v.unknown_found,
            "checks": v.checks.iter().map(|c| json!({
                "name": c.name,
                "violations": c.violations,
            })).collect::<Vec<_>>(),
            "violations": v.violations(),
            "passed": v.passed(),
        })
    }
}
