//! The runs of a round: the ceiling, a sale through a deployment's instances under wrk, and
//! plain requests/s of one path; each sale's figures read from PostgreSQL and the CPU time
//! around it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::FEW;
use super::ceiling::{self, Ceiling};
use super::cpu;
use super::deployment::{Deployment, sold};
use super::desks::Desks;
use super::report::{Round, Row};
use super::wrk;
use crate::cli::BenchArgs;
use crate::instances::Instance;

/// Where a round's runs go, and what they are charged to.
pub(super) struct Bench<'a> {
    pub args: &'a BenchArgs,
    pub buy: PathBuf,
    /// PostgreSQL's postmaster and Redis, if they run on this machine (for their CPU time).
    pub postmaster: Option<u32>,
    pub redis: Option<u32>,
}

/// One line of a round's figures, as it goes.
pub(super) fn summary(row: &Row, round: &Round) -> String {
    let mut line = format!("{:.0} orders/s", round.orders_per_sec);
    if let Some(p99) = round.p99_ms {
        line.push_str(&format!(", p99 {p99:.1} ms"));
    }
    if let Some(failed) = round.failed_share {
        line.push_str(&format!(", {:.2} % failed", failed * 100.0));
    }
    let per_order = |seconds: Option<f64>| {
        seconds.filter(|_| round.orders > 0.0).map_or_else(
            || "n/a".to_owned(),
            |s| format!("{:.1}", s * 1e6 / round.orders),
        )
    };
    let instances = if row.has_instances {
        per_order(round.cpu.instances)
    } else {
        "-".to_owned()
    };
    line.push_str(&format!(
        "; CPU µs/order: seckill {instances}, PostgreSQL {}, Redis {}, load generator {}, other {}, machine {}",
        per_order(round.cpu.postgres),
        per_order(round.cpu.redis),
        per_order(round.cpu.load),
        per_order(round.cpu.other()),
        per_order(round.cpu.machine),
    ));
    if let Some(desks) = &round.desks {
        line.push_str("; ");
        line.push_str(&desks.summary(round.orders, round.wall_seconds));
    }
    line
}

/// `total` connections over `parts` wrk processes, the first ones taking the remainder
/// (1,000 over three: 334, 333, 333).
pub(super) fn split(total: u32, parts: usize) -> Vec<u32> {
    let parts = parts as u32;
    (0..parts)
        .map(|i| total / parts + u32::from(i < total % parts))
        .collect()
}

impl Bench<'_> {
    fn watch(&self, instances: &[Instance]) -> cpu::Watch {
        cpu::Watch {
            instances: instances.iter().map(Instance::pid).collect(),
            postmaster: self.postmaster,
            redis: self.redis,
        }
    }

    pub(super) async fn ceiling(&self, ceiling: &Ceiling) -> anyhow::Result<Round> {
        let watch = self.watch(&[]);
        let before = watch.sample();
        let started = Instant::now();
        let run = ceiling.run(self.args.seconds).await?;
        let wall_seconds = started.elapsed().as_secs_f64();
        let after = watch.sample();
        let orders_per_sec = run.tps * ceiling::ORDERS_PER_COMMIT as f64;
        Ok(Round {
            orders_per_sec,
            per_product: vec![orders_per_sec],
            p99_ms: None,
            failed_share: None,
            orders: run.orders as f64,
            cpu: cpu::spent(&before, &after),
            wall_seconds,
            desks: None,
        })
    }

    /// Sell `products` through the first `connections.len()` instances of `deployment`,
    /// one wrk process each with its share of the connections, all at once.
    pub(super) async fn sell(
        &self,
        deployment: &Deployment,
        connections: &[u32],
        products: &[i64],
    ) -> anyhow::Result<Round> {
        let targets: Vec<(&str, u32)> = deployment
            .instances
            .iter()
            .zip(connections)
            .map(|(instance, connections)| (instance.url.as_str(), *connections))
            .collect();
        self.sell_through(deployment, &targets, products).await
    }

    /// Sell `products` of `deployment` with one wrk process per target (a URL and its
    /// connections: an instance, or a router in front of the instances), all at once.
    pub(super) async fn sell_through(
        &self,
        deployment: &Deployment,
        targets: &[(&str, u32)],
        products: &[i64],
    ) -> anyhow::Result<Round> {
        let connections: Vec<u32> = targets.iter().map(|(_, c)| *c).collect();
        let seconds = self.args.seconds;
        let paths: Vec<String> = products
            .iter()
            .map(|p| format!("/api/products/{p}/purchase"))
            .collect();
        // One product: the URL's path is enough.
        let extra: &[String] = if paths.len() > 1 { &paths } else { &[] };
        let threads = wrk_threads(paths.len(), &connections);
        let mut before = Vec::new();
        for product in products {
            before.push(sold(&deployment.pool, *product).await?);
        }
        let desks_before = Desks::read(&deployment.instances).await;
        let watch = self.watch(&deployment.instances);
        let at_start = watch.sample();
        let started = Instant::now();
        let loads = targets.iter().map(|(url, connections)| {
            wrk::run(wrk::Load {
                url,
                path: &paths[0],
                script: &self.buy,
                threads,
                connections: *connections,
                seconds,
                paths: extra,
            })
        });
        let reports = futures::future::try_join_all(loads).await?;
        let wall_seconds = started.elapsed().as_secs_f64();
        let at_end = watch.sample();
        let desks_after = Desks::read(&deployment.instances).await;
        let mut per_product = Vec::new();
        let mut orders = 0;
        for (product, before) in products.iter().zip(before) {
            let sold = sold(&deployment.pool, *product).await? - before;
            orders += sold;
            per_product.push(sold as f64 / seconds as f64);
        }
        let requests: f64 = reports.iter().map(|r| r.requests).sum();
        let failed: f64 = reports.iter().map(|r| r.failed).sum();
        Ok(Round {
            orders_per_sec: orders as f64 / seconds as f64,
            per_product,
            p99_ms: reports.iter().filter_map(|r| r.p99_ms).reduce(f64::max),
            failed_share: Some(failed / requests.max(1.0)),
            orders: orders as f64,
            cpu: cpu::spent(&at_start, &at_end),
            wall_seconds,
            desks: desks_after
                .zip(desks_before)
                .map(|(after, before)| after.since(before)),
        })
    }

    /// Requests/s of `path` under `script`, 64 connections.
    pub(super) async fn requests(
        &self,
        url: &str,
        path: &str,
        script: &Path,
    ) -> anyhow::Result<f64> {
        let report = wrk::run(wrk::Load {
            url,
            path,
            script,
            threads: 2,
            connections: FEW,
            seconds: self.args.seconds,
            paths: &[],
        })
        .await?;
        Ok(report.per_sec)
    }
}

/// wrk's threads per process, for `products` sold through one process per target with
/// `connections` each. One process: two threads, whatever the products (each thread's
/// requests take its share of the products in turn, see `wrk::buy_script`), so that (e) and
/// (g) differ from (b) in what they buy, not in how wrk runs (sixteen threads cost wrk, and
/// the instance, more CPU per order than two: docs/performance.md). Several processes (three
/// instances): one product, one thread each (as many threads in all as one process of two);
/// several products, a thread per product (up to a process's connections), so that each
/// product has connections of its own and (d)'s slowest product shows.
fn wrk_threads(products: usize, connections: &[u32]) -> u32 {
    match (products, connections.len()) {
        (_, 1) => 2,
        (1, _) => 1,
        (products, _) => {
            let fewest = connections.iter().copied().min().unwrap_or(1);
            u32::try_from(products).unwrap_or(u32::MAX).min(fewest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_wrk_process_runs_two_threads_and_three_a_thread_per_product() {
        assert_eq!(wrk_threads(1, &[1_000]), 2, "(b)");
        assert_eq!(wrk_threads(16, &[1_000]), 2, "(e), (g)");
        assert_eq!(wrk_threads(1, &[334, 333, 333]), 1, "(c)");
        assert_eq!(wrk_threads(16, &[334, 333, 333]), 16, "(d)");
        assert_eq!(
            wrk_threads(500, &[334, 333, 333]),
            333,
            "no more threads than connections"
        );
    }

    #[test]
    fn a_thousand_connections_over_three_instances_are_334_333_333() {
        assert_eq!(split(1_000, 3), [334, 333, 333]);
        assert_eq!(split(64, 1), [64]);
        assert_eq!(split(1_000, 3).iter().sum::<u32>(), 1_000);
    }
}
