//! One run of the demo: a throwaway database, the instances, the attack and its books,
//! cleaned up whatever happens.

use anyhow::Context;
use goose::config::GooseConfiguration;
use seckill::LockStrategy;

use super::row::{Figures, figures};
use super::{ADMIN_TOKEN, LOCK_TTL_MS, Run, ZOOKEEPER_SESSION_TIMEOUT_MS};
use crate::attack::{self, Cancel, Extras};
use crate::books;
use crate::cli::DemoArgs;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, ThrowawayDatabase};

/// Where the runs go.
pub(super) struct Setup<'a> {
    pub(super) args: &'a DemoArgs,
    pub(super) cancel: &'a Cancel,
    pub(super) database_url: &'a str,
    pub(super) redis_url: &'a str,
    pub(super) redlock_urls: &'a [String],
    /// The connect string of the `zookeeper` runs' ZooKeeper, if any run is of `zookeeper`.
    pub(super) zookeeper_connect: Option<&'a str>,
    /// The endpoints of the `etcd` runs' etcd, if any run is of `etcd`.
    pub(super) etcd_endpoints: Option<&'a str>,
}

impl Setup<'_> {
    /// One run, cleaned up whatever happens.
    pub(super) async fn run_one(&self, run: &Run) -> Result<Figures, String> {
        let (strategy, batch_max) = (run.strategy, run.batch_max);
        let prefix = format!(
            "demo:{}:{}:{}:",
            std::process::id(),
            strategy.name(),
            batch_max
        );
        let name = format!(
            "seckill_demo_{}_{}_{batch_max}",
            std::process::id(),
            strategy.name().replace('-', "_")
        );
        let database = ThrowawayDatabase::create(self.database_url, name)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let outcome = self.attack(run, &database.url, &prefix).await;
        let mut cleanup = Vec::new();
        if let Err(error) = database.remove().await {
            cleanup.push(format!("dropping the database: {error:#}"));
        }
        for url in
            std::iter::once(self.redis_url).chain(self.redlock_urls.iter().map(String::as_str))
        {
            if let Err(error) = servers::forget_keys(url, &prefix).await {
                cleanup.push(format!("deleting the keys on {url}: {error:#}"));
            }
        }
        if !cleanup.is_empty() {
            println!("cleanup: {}", cleanup.join("; "));
        }
        outcome.map_err(|e| format!("{e:#}"))
    }

    async fn attack(&self, run: &Run, database_url: &str, prefix: &str) -> anyhow::Result<Figures> {
        let (strategy, batch_max) = (run.strategy, run.batch_max);
        let args = self.args;
        let redlock_urls = self.redlock_urls.join(",");
        let mut extra = vec![
            ("BATCH_MAX", batch_max.to_string()),
            ("DATABASE_MAX_CONNECTIONS", "20".into()),
        ];
        extra.extend(consensus_settings(
            strategy,
            self.zookeeper_connect,
            self.etcd_endpoints,
        ));
        let config = InstanceConfig {
            database_url,
            redis_url: self.redis_url,
            redis_key_prefix: prefix,
            admin_token: ADMIN_TOKEN,
            strategy,
            work_ms: args.work_ms,
            lock_wait_ms: 10_000,
            lock_ttl_ms: LOCK_TTL_MS,
            redlock_urls: &redlock_urls,
            extra,
        };
        let me = std::env::current_exe().context("finding this binary to start instances")?;
        let mut instances = Vec::new();
        for i in 0..args.instances {
            let name = format!("{}-{batch_max}-{i}", strategy.name());
            instances.push(Instance::start(&me, &config, &name).await?);
        }
        let hosts: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
        println!("instances: {}", hosts.join(" "));
        let operator = attack::Operator::new(&instances[0].ops_url, ADMIN_TOKEN);
        let ops_hosts: Vec<String> = instances.iter().map(|i| i.ops_url.clone()).collect();
        let figures = self
            .attack_instances(run, &hosts, &ops_hosts, &operator, database_url)
            .await;
        if figures.is_err() {
            // Whatever failed, the instances' logs may say why: keep them, and say where.
            for instance in &mut instances {
                instance.keep_log();
            }
            let logs: Vec<String> = instances
                .iter()
                .map(|i| i.log.display().to_string())
                .collect();
            return figures.with_context(|| format!("instance logs kept: {}", logs.join(" ")));
        }
        figures
    }

    /// Attack running instances and judge the books.
    async fn attack_instances(
        &self,
        run: &Run,
        hosts: &[String],
        ops_hosts: &[String],
        operator: &attack::Operator,
        database_url: &str,
    ) -> anyhow::Result<Figures> {
        let args = self.args;
        let products =
            attack::create_products(&operator.url, &operator.token, run.stock, args.products)
                .await?;
        let mut goose = GooseConfiguration::default();
        goose.users = Some(args.users as usize);
        goose.increase_rate = Some(args.users.to_string());
        goose.run_time = Some(args.max_seconds.to_string());
        goose.quiet = 1;
        goose.no_print_metrics = true;
        let report = attack::run(
            goose,
            hosts,
            Some(operator),
            &products,
            run.buyers,
            Extras {
                restock: 0,
                cancel: Some(self.cancel.clone()),
            },
        )
        .await?;
        let verdict = books::judge(&report, &hosts[0], database_url).await?;
        println!("{}", verdict.render(&report));
        let mut split = Vec::new();
        for ops_host in ops_hosts {
            split.push(orders_sold_by(ops_host).await.unwrap_or(0));
        }
        Ok(figures(&report, verdict, split))
    }
}

/// The settings that point a `zookeeper` or `etcd` run's instances at their server (none for
/// the other strategies).
fn consensus_settings(
    strategy: LockStrategy,
    zookeeper_connect: Option<&str>,
    etcd_endpoints: Option<&str>,
) -> Vec<(&'static str, String)> {
    match (strategy, zookeeper_connect, etcd_endpoints) {
        (LockStrategy::ZooKeeper, Some(connect), _) => vec![
            ("ZOOKEEPER_CONNECT", connect.to_owned()),
            (
                "ZOOKEEPER_SESSION_TIMEOUT_MS",
                ZOOKEEPER_SESSION_TIMEOUT_MS.to_string(),
            ),
        ],
        (LockStrategy::Etcd, _, Some(endpoints)) => {
            vec![("ETCD_ENDPOINTS", endpoints.to_owned())]
        }
        _ => Vec::new(),
    }
}

/// `seckill_orders_total` of one instance, from its operators' listener.
async fn orders_sold_by(ops_host: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{ops_host}/metrics"))
        .await?
        .text()
        .await?;
    text.lines()
        .find_map(|line| line.strip_prefix("seckill_orders_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map(|n| n as u64)
        .context("no seckill_orders_total")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The zookeeper runs' settings are accepted by the service, and the session they ask for is
    /// granted by the server.
    #[test]
    fn zookeeper_run_settings_are_accepted_and_granted_by_the_server() {
        use clap::{CommandFactory, Parser};
        let mut line: Vec<String> = ["seckill", "--database-url", "postgres://x"]
            .map(String::from)
            .to_vec();
        let env = [
            ("LOCK_STRATEGY", "zookeeper".to_owned()),
            ("LOCK_TTL_MS", LOCK_TTL_MS.to_string()),
            // As every instance this tool starts gets it (`instances.rs`).
            ("BUYER_JWT_SECRET", crate::buyers::secret().to_owned()),
        ]
        .into_iter()
        .chain(consensus_settings(
            LockStrategy::ZooKeeper,
            Some("127.0.0.1:2181"),
            None,
        ));
        // Each as its flag, so that a renamed setting fails here rather than at the demo.
        let command = seckill::Settings::command();
        for (name, value) in env {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == name))
                .unwrap_or_else(|| panic!("{name} is not a seckill setting"));
            line.push(format!("--{}", arg.get_long().unwrap()));
            line.push(value);
        }
        let settings = seckill::Settings::try_parse_from(&line).unwrap();

        assert_eq!(settings.lock.zookeeper_connect, "127.0.0.1:2181");
        assert_eq!(settings.check(), Ok(()));
        // What the private ZooKeeper grants: the service refuses a shorter session.
        let asked = settings.lock.zookeeper_session_timeout;
        assert!(
            asked.as_millis() <= u128::from(servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS),
            "the private ZooKeeper would grant {} ms, less than the {} ms asked",
            servers::ZOOKEEPER_MAX_SESSION_TIMEOUT_MS,
            asked.as_millis()
        );
        assert!(asked >= 2 * settings.lock.ttl);
    }

    #[test]
    fn only_the_consensus_runs_are_pointed_at_a_consensus_server() {
        let zk = Some("127.0.0.1:1");
        let etcd = Some("http://127.0.0.1:2");
        let names = |strategy| -> Vec<&str> {
            consensus_settings(strategy, zk, etcd)
                .into_iter()
                .map(|(name, _)| name)
                .collect()
        };
        assert_eq!(
            consensus_settings(LockStrategy::Etcd, zk, etcd),
            vec![("ETCD_ENDPOINTS", "http://127.0.0.1:2".to_owned())]
        );
        assert_eq!(
            names(LockStrategy::ZooKeeper),
            ["ZOOKEEPER_CONNECT", "ZOOKEEPER_SESSION_TIMEOUT_MS"]
        );
        assert!(names(LockStrategy::Redis).is_empty());
    }
}
