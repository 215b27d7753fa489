//! What the instances' desks did during a run, from their `/metrics` read before and after
//! it: how many batches (each one transaction, one commit), how many buyers they carried,
//! how many lock holds they took, and how long their writes took.

use crate::instances::Instance;

/// Counters of the desks of some instances, summed; the difference of two readings is a
/// run's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Desks {
    /// Batches sold (`seckill_batch_size_count`).
    pub batches: f64,
    /// Purchases in those batches (`seckill_batch_size_sum`).
    pub buyers: f64,
    /// Locks taken by desk leaders (`seckill_lock_acquisitions_total`).
    pub holds: f64,
    /// Statements the lock holders' writer sent (`seckill_holder_statements_total`).
    pub statements: f64,
    /// Seconds spent in batches' database work (`seckill_batch_phase_seconds_sum` of the
    /// `write` phase).
    pub write_seconds: f64,
}

impl Desks {
    /// The counters of `instances`, summed; `None` if one of them does not answer.
    pub(crate) async fn read(instances: &[Instance]) -> Option<Self> {
        let client = reqwest::Client::new();
        let mut sum = Self::default();
        for instance in instances {
            let text = client
                .get(format!("{}/metrics", instance.ops_url))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            sum = sum.plus(Self::parse(&text));
        }
        Some(sum)
    }

    /// The counters in one instance's `/metrics` text (0 for a family it has not shown yet).
    fn parse(text: &str) -> Self {
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Self {
            batches: value("seckill_batch_size_count"),
            buyers: value("seckill_batch_size_sum"),
            holds: value("seckill_lock_acquisitions_total"),
            statements: value("seckill_holder_statements_total"),
            write_seconds: value("seckill_batch_phase_seconds_sum{phase=\"write\"}"),
        }
    }

    fn plus(self, other: Self) -> Self {
        Self {
            batches: self.batches + other.batches,
            buyers: self.buyers + other.buyers,
            holds: self.holds + other.holds,
            statements: self.statements + other.statements,
            write_seconds: self.write_seconds + other.write_seconds,
        }
    }

    /// What happened between `before` and `self`.
    pub(crate) fn since(self, before: Self) -> Self {
        Self {
            batches: self.batches - before.batches,
            buyers: self.buyers - before.buyers,
            holds: self.holds - before.holds,
            statements: self.statements - before.statements,
            write_seconds: self.write_seconds - before.write_seconds,
        }
    }

    /// One line: batches per second and their mean size, lock holds per 1,000 orders, the
    /// mean write of a batch, and (under a lock) batches per statement; `orders` sold over
    /// `seconds`.
    pub(crate) fn summary(&self, orders: f64, seconds: f64) -> String {
        let per = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let mut line = format!(
            "desks: {:.0} batches/s of {:.1} buyers, {:.1} lock holds per 1,000 orders, {:.2} ms per batch's write (the wait for the writer included)",
            per(self.batches, seconds),
            per(self.buyers, self.batches),
            per(self.holds * 1000.0, orders),
            per(self.write_seconds * 1000.0, self.batches),
        );
        if self.statements > 0.0 {
            line.push_str(&format!(
                ", {:.1} batches per statement",
                per(self.batches, self.statements)
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters are read from the exposition format as the service writes it, and a
    /// run's are the difference of two readings.
    #[test]
    fn a_runs_desk_figures_come_from_two_readings_of_the_metrics() {
        let before = Desks::parse(
            "# HELP seckill_batch_size Purchases in one batch of one product\n\
             seckill_batch_size_bucket{le=\"1\"} 3\n\
             seckill_batch_size_sum 40\n\
             seckill_batch_size_count 4\n\
             seckill_batch_phase_seconds_sum{phase=\"queue\"} 9\n\
             seckill_batch_phase_seconds_sum{phase=\"write\"} 0.5\n\
             seckill_lock_acquisitions_total 2\n\
             seckill_holder_statements_total 3\n",
        );
        let after = Desks::parse(
            "seckill_batch_size_sum 1040\n\
             seckill_batch_size_count 24\n\
             seckill_batch_phase_seconds_sum{phase=\"write\"} 0.7\n\
             seckill_lock_acquisitions_total 12\n\
             seckill_holder_statements_total 8\n",
        );
        let run = after.since(before);
        assert_eq!(run.batches, 20.0);
        assert_eq!(run.buyers, 1000.0);
        assert_eq!(run.holds, 10.0);
        assert!((run.write_seconds - 0.2).abs() < 1e-9);
        assert_eq!(
            run.summary(1000.0, 2.0),
            "desks: 10 batches/s of 50.0 buyers, 10.0 lock holds per 1,000 orders, 10.00 ms per batch's write (the wait for the writer included), 4.0 batches per statement"
        );
        assert_eq!(Desks::parse("").batches, 0.0);
    }
}
