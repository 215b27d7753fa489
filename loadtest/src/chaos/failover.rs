//! The `ha` database's faults: its primary killed or paused past Patroni's lease, its
//! synchronous standby killed. Each waits first until the cluster serves (a primary behind
//! HAProxy and a synchronous standby), and is healed once it serves again with every member
//! back, the faulted one as a standby.

use std::time::Duration;

use anyhow::{Context, bail};
use servers::PatroniCluster;
use servers::patroni::{MEMBERS, TTL_SECS};
use tokio::time::Instant;

use super::cluster::Cluster;
use super::schedule::Fault;
use crate::attack::Cancel;

/// TIMING: a failover waits out the 20 s lease and a Patroni loop or two; a returning
/// member rewinds and streams within a few loops. Two minutes hold on a busy machine.
const WITHIN: Duration = Duration::from_secs(120);

/// SIGKILL the primary (Patroni and PostgreSQL); wait for another member to be promoted;
/// keep the dead one down `lasts / 2` more, then start it again and wait until it streams.
pub async fn kill_primary(
    cluster: &mut Cluster,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let patroni = patroni(cluster)?;
    let old = tokio::task::block_in_place(|| serving(patroni))?;
    let killed = Instant::now();
    patroni.kill(old);
    let new = tokio::task::block_in_place(|| patroni.wait_for_primary_other_than(old, WITHIN))?;
    let promoted_after = killed.elapsed();
    cancel.hold(fault.lasts / 2).await;
    patroni.restart(old)?;
    tokio::task::block_in_place(|| back_as_a_standby(patroni, old))?;
    Ok(format!(
        "the primary (member {old}) SIGKILLed; member {new} serving as the primary {} ms later; member {old} back as a standby {} ms after the kill",
        promoted_after.as_millis(),
        killed.elapsed().as_millis()
    ))
}

/// SIGSTOP the primary (Patroni, its postmaster and every backend) for Patroni's lease, two
/// of its loops and `lasts / 2` more: a standby is promoted meanwhile (almost always: a
/// standby that has not yet seen the lease run out when the primary resumes lets the
/// primary renew it). SIGCONT, and wait until the cluster serves with the old primary,
/// demoted by its Patroni, streaming from the new one.
pub async fn pause_primary(
    cluster: &mut Cluster,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let patroni = patroni(cluster)?;
    let old = tokio::task::block_in_place(|| serving(patroni))?;
    let paused = Duration::from_secs(TTL_SECS + 2) + fault.lasts / 2;
    patroni.pause(old);
    cancel.hold(paused).await;
    patroni.resume(old);
    let resumed = Instant::now();
    let now = tokio::task::block_in_place(|| serving(patroni))?;
    if now == old {
        return Ok(format!(
            "the primary (member {old}) SIGSTOPped for {} ms; no standby was promoted (it kept its lease), serving again {} ms after SIGCONT",
            paused.as_millis(),
            resumed.elapsed().as_millis()
        ));
    }
    tokio::task::block_in_place(|| back_as_a_standby(patroni, old))?;
    Ok(format!(
        "the primary (member {old}) SIGSTOPped for {} ms; member {now} the primary; member {old} back as a standby {} ms after SIGCONT",
        paused.as_millis(),
        resumed.elapsed().as_millis()
    ))
}

/// SIGKILL the synchronous standby (commits wait until Patroni names the other one), keep
/// it down `lasts / 2`, start it again and wait until it streams.
pub async fn kill_standby(
    cluster: &mut Cluster,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let patroni = patroni(cluster)?;
    tokio::task::block_in_place(|| serving(patroni))?;
    let standby = patroni
        .sync_standby()
        .context("no synchronous standby to kill")?;
    patroni.kill(standby);
    cancel.hold(fault.lasts / 2).await;
    patroni.restart(standby)?;
    let restarted = Instant::now();
    tokio::task::block_in_place(|| back_as_a_standby(patroni, standby))?;
    Ok(format!(
        "the synchronous standby (member {standby}) SIGKILLed, down {} ms, streaming again {} ms after its restart",
        (fault.lasts / 2).as_millis(),
        restarted.elapsed().as_millis()
    ))
}

fn patroni(cluster: &mut Cluster) -> anyhow::Result<&mut PatroniCluster> {
    cluster
        .patroni_mut()
        .context("a database fault drawn without the ha database")
}

/// Wait until the cluster serves: a primary behind HAProxy and a synchronous standby; the
/// primary. Blocks.
fn serving(patroni: &mut PatroniCluster) -> anyhow::Result<usize> {
    patroni.wait_for_sync_standby(WITHIN)?;
    Ok(patroni.wait_for_primary(WITHIN)?)
}

/// Wait until member `i` streams as a standby (its Patroni answers `/replica`), with a
/// primary and a synchronous standby among the members. Blocks.
fn back_as_a_standby(patroni: &mut PatroniCluster, i: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    while !(patroni.answers(i, "/replica") && patroni.sync_standby().is_some()) {
        if Instant::now() > deadline {
            bail!(
                "member {i} of {MEMBERS} was not back as a standby within {WITHIN:?}: {}",
                patroni.log_tail(i, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    serving(patroni).map(|_| ())
}
