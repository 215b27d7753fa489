//! `loadtest chaos`: a fault soak in the manner of Jepsen. A sale with restocks runs on
//! instances of its own while a nemesis injects a fault every few seconds, drawn from a
//! seeded schedule; every answer is recorded; at the end the load stops, the books settle,
//! every unknown outcome is looked up, and a checker judges the whole history against
//! PostgreSQL.
//!
//! - `schedule`: the seeded fault sequence (pure).
//! - `history`: what was recorded: attempts, restocks, faults.
//! - `proxy`: the TCP proxy in front of each of an instance's links.
//! - `members`: the lock's own ensemble, under `zookeeper`, `etcd`, `redlock` and Sentinel.
//! - `cluster`: the private servers, the proxies and the instances.
//! - `nemesis`: injects and heals each fault; `failover` the `ha` database's.
//! - `load`: the buyers and the restocks.
//! - `evidence`: the rows and the lookups gathered after the load.
//! - `checker`: the rules and their violations (pure).
//! - `report`: the table and the JSON summary.
//!
//! Dependencies point one way, with no cycle: `schedule` and `history` are the vocabulary;
//! `checker` knows only `history`; `report` knows `history`, `schedule` and the checker's
//! verdict; `proxy` and `members` know nothing of the soak; `cluster` uses them (and the
//! crate's `servers` and `instances`); `nemesis` uses `cluster`; `load` and `evidence` use the
//! cluster's addresses; only this module uses them all.

pub mod checker;
pub mod cluster;
pub mod evidence;
pub mod failover;
pub mod history;
pub mod load;
pub mod members;
pub mod nemesis;
pub mod proxy;
pub mod report;
pub mod schedule;

use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::attack::{self, Cancel};
use crate::cli::{ChaosArgs, ChaosDatabase};
use cluster::{ADMIN_TOKEN, Cluster, ClusterConfig};
use history::now_us;
use schedule::{FaultKind, Schedule};

/// Run the soak; `Ok(true)` when it ran to its end with no violation.
///
/// # Errors
/// When the cluster cannot be started, a fault cannot be healed (an instance that does not
/// start again), or PostgreSQL cannot be read at the end. Everything started is removed
/// before this returns, whatever happened.
pub async fn run(args: ChaosArgs, cancel: Cancel) -> anyhow::Result<bool> {
    refuse_what_the_servers_would_not_take(&args)?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let settings = format!(
        "--minutes {} --seed {seed} --instances {} --strategy {}{} --database {} --fault-every-ms {} --stock {} --restock-every-ms {} --restock-units {} --buyers-per-sec {} --concurrency {} --lock-ttl-ms {} --sold-out-recheck-ms {}",
        args.minutes,
        args.instances,
        args.strategy.name(),
        if args.sentinel { " --sentinel" } else { "" },
        args.database.name(),
        args.fault_every_ms,
        args.stock,
        args.restock_every_ms,
        args.restock_units,
        args.buyers_per_sec,
        args.concurrency,
        args.lock_ttl_ms,
        args.sold_out_recheck_ms,
    );
    println!(
        "chaos: seed {seed} (the same --seed replays the same faults, and each buyer's choice of instance)"
    );
    println!("chaos: {settings}");
    let mut cluster = Cluster::start(ClusterConfig {
        instances: usize::from(args.instances),
        strategy: args.strategy,
        sentinel: args.sentinel,
        lock_ttl_ms: args.lock_ttl_ms,
        sold_out_recheck_ms: args.sold_out_recheck_ms,
        ha: args.database == ChaosDatabase::Ha,
    })
    .await?;
    println!(
        "chaos: a private {}, {} instances: {}",
        servers_started(&cluster, args.database == ChaosDatabase::Ha),
        cluster.instances(),
        cluster
            .urls()
            .read()
            .unwrap()
            .iter()
            .map(|endpoints| endpoints.public.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let outcome = soak(&args, seed, settings, &mut cluster, &cancel).await;
    match &outcome {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            let logs: Vec<String> = cluster
                .keep_logs()
                .iter()
                .map(|log| log.display().to_string())
                .collect();
            println!("the instances' logs are kept: {}", logs.join(" "));
        }
    }
    // The instances, the proxies and the servers go here.
    drop(cluster);
    println!("chaos: everything it started is stopped and removed");
    if cancel.is_set() {
        println!("stopped early by Ctrl-C: the soak did not run its full length");
        return outcome.map(|_| false);
    }
    outcome
}

/// Refuse, before anything starts, the options the soak's own servers would not take.
fn refuse_what_the_servers_would_not_take(args: &ChaosArgs) -> anyhow::Result<()> {
    let lock_ttl = Duration::from_millis(args.lock_ttl_ms);
    if args.sentinel && args.strategy != seckill::LockStrategy::Redis {
        anyhow::bail!(
            "--sentinel puts the `redis` lock behind Sentinel: it goes with --strategy redis only, not {}",
            args.strategy.name()
        );
    }
    if args.strategy == seckill::LockStrategy::Etcd && lock_ttl < members::ETCD_MIN_LOCK_TTL {
        anyhow::bail!(
            "--strategy etcd needs --lock-ttl-ms of at least {} (the etcd lock renews a third of the way into its lease, and the renewal must have time for two request timeouts of 1 s with three members)",
            members::ETCD_MIN_LOCK_TTL.as_millis()
        );
    }
    if args.strategy == seckill::LockStrategy::ZooKeeper
        && lock_ttl > members::zookeeper_max_lock_ttl()
    {
        anyhow::bail!(
            "--strategy zookeeper takes --lock-ttl-ms of at most {} (the instances' sessions are twice it, and the soak's ZooKeeper grants at most {} ms)",
            members::zookeeper_max_lock_ttl().as_millis(),
            2 * members::zookeeper_max_lock_ttl().as_millis()
        );
    }
    Ok(())
}

/// The servers the soak started, for its first lines.
fn servers_started(cluster: &Cluster, ha: bool) -> String {
    let postgres = if ha {
        "PostgreSQL of three members under Patroni (etcd, HAProxy in front)"
    } else {
        "PostgreSQL"
    };
    let servers = match cluster.members() {
        Some(members) if members.behind_sentinel() => format!(
            "PostgreSQL and {} Redis nodes behind three Sentinels (the instances' REDIS_URL stands idle)",
            members.count()
        ),
        Some(members) => format!(
            "PostgreSQL and Redis, {} {} members",
            members.count(),
            members.name()
        ),
        None => "PostgreSQL and Redis".to_owned(),
    };
    servers.replacen("PostgreSQL", postgres, 1)
}

/// The soak in phases: a product, the load under the nemesis's faults, the evidence once
/// the books settle, the checker's verdict, the report.
async fn soak(
    args: &ChaosArgs,
    seed: u64,
    settings: String,
    cluster: &mut Cluster,
    cancel: &Cancel,
) -> anyhow::Result<bool> {
    let urls = cluster.urls();
    let first = urls.read().unwrap()[0].ops.clone();
    let product_id = attack::create_product(&first, ADMIN_TOKEN, args.stock).await?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&cluster.database_url)
        .await
        .context("connecting to the soak's PostgreSQL")?;
    let soaked = load_under_faults(args, seed, product_id, cluster, cancel).await?;

    // TIMING: a batch in flight when the load stopped ends within the service's own bounds
    // (LOCK_WAIT_MS, the statement time-out): 60 s is only the upper bound.
    evidence::settle(&pool, product_id, Duration::from_secs(60)).await?;
    let lookups = evidence::lookups(&urls, product_id, &soaked.recorded.attempts).await?;
    let database = evidence::database(&pool, product_id).await?;
    pool.close().await;
    let exits = cluster.exited_by_themselves();
    let pauses: Vec<checker::Pause> = soaked
        .faults
        .iter()
        .filter(|fault| fault.kind == FaultKind::PauseInstance)
        .filter_map(|fault| {
            Some(checker::Pause {
                instance: fault.instance?,
                from_us: fault.injected_us,
                to_us: fault.healed_us,
            })
        })
        .collect();
    let verdict = checker::check(&checker::Evidence {
        initial_stock: args.stock,
        attempts: &soaked.recorded.attempts,
        restocks: &soaked.recorded.restocks,
        lookups: &lookups,
        database: &database,
        instance_exits: &exits,
        sold_out_recheck_us: (args.sold_out_recheck_ms * 1000) as i64,
        pauses: &pauses,
        request_timeout_us: (cluster::REQUEST_TIMEOUT_MS * 1000) as i64,
        started_us: soaked.started_us,
        commits_wait_for_a_standby: args.database == ChaosDatabase::Ha,
    });
    write_report(args, seed, settings, &soaked, &verdict)?;
    Ok(verdict.passed())
}

/// What the load recorded while the nemesis ran its faults, and when the load ran.
struct Soaked {
    recorded: load::Recorded,
    faults: Vec<history::FaultRecord>,
    started_us: history::Micros,
    ended_us: history::Micros,
}

/// Run the load on `product_id` while the nemesis injects and heals its faults; stop the
/// load when the nemesis is done, and wait for its last answers.
async fn load_under_faults(
    args: &ChaosArgs,
    seed: u64,
    product_id: i64,
    cluster: &mut Cluster,
    cancel: &Cancel,
) -> anyhow::Result<Soaked> {
    let (stop, stopped) = watch::channel(false);
    let started_us = now_us();
    let load = tokio::spawn(load::run(
        load::LoadConfig {
            product_id,
            buyers_per_sec: args.buyers_per_sec,
            concurrency: args.concurrency as usize,
            restock_every: Duration::from_millis(args.restock_every_ms),
            restock_units: args.restock_units,
            seed,
        },
        cluster.urls(),
        stopped,
    ));
    let lock_ttl = Duration::from_millis(args.lock_ttl_ms);
    let plan = nemesis::Plan {
        until: Instant::now() + Duration::from_secs_f64(args.minutes * 60.0),
        fault_every: Duration::from_millis(args.fault_every_ms),
        lock_ttl,
        claim: cluster
            .members()
            .map_or(lock_ttl, |members| members.claim(lock_ttl)),
        product_id,
        started_us,
    };
    let kinds = FaultKind::applicable(
        args.strategy,
        args.sentinel,
        args.database == ChaosDatabase::Ha,
    );
    let ensemble = schedule::Ensemble::of(args.strategy, args.sentinel);
    let schedule = Schedule::new(seed, cluster.instances(), ensemble, &kinds);
    let faults = nemesis::run(cluster, schedule, &plan, cancel).await;
    // Every fault is healed by now (or the nemesis failed): stop the load either way.
    let ended_us = now_us();
    let _ = stop.send(true);
    println!("chaos: load stopped; waiting for the last answers and restocks");
    let recorded = load.await.context("the load task failed")??;
    Ok(Soaked {
        recorded,
        faults: faults?,
        started_us,
        ended_us,
    })
}

/// Print the soak's table, and write its JSON summary where `--summary` says.
fn write_report(
    args: &ChaosArgs,
    seed: u64,
    settings: String,
    soaked: &Soaked,
    verdict: &checker::Verdict,
) -> anyhow::Result<()> {
    let header = report::Header {
        seed,
        settings,
        started_us: soaked.started_us,
        ended_us: soaked.ended_us,
        sold_out_recheck_us: (args.sold_out_recheck_ms * 1000) as i64,
        kinds: FaultKind::applicable(
            args.strategy,
            args.sentinel,
            args.database == ChaosDatabase::Ha,
        ),
    };
    let report = report::Report {
        header: &header,
        faults: &soaked.faults,
        attempts: &soaked.recorded.attempts,
        restocks: &soaked.recorded.restocks,
        buyers: soaked.recorded.buyers,
        verdict,
    };
    print!("{}", report.render());
    if let Some(path) = &args.summary {
        std::fs::write(path, serde_json::to_string_pretty(&report.json())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
