//! The nemesis: injects the schedule's faults one at a time, each healed before the next,
//! with a quiet spell of `--fault-every-ms` before each, until the soak's time is up.
//!
//! How long each kind lasts, from the fault's drawn `lasts` (1 to 3 s):
//!
//! `claim` below is how long the lock keeps a silent holder's claim ([`Plan::claim`]):
//! `LOCK_TTL_MS` (Redis, Redlock, PostgreSQL), or the ZooKeeper session, or the etcd lease.
//!
//! | kind | what is done | healed when |
//! |---|---|---|
//! | kill-instance | SIGKILL, down for `lasts / 4` | started again and ready |
//! | pause-instance | SIGSTOP for `claim + lasts / 2` (past its lease) | SIGCONT |
//! | restart-redis | stopped and started empty on the same port (behind Sentinel: the primary, at once, so it stays the primary and its replica resynchronises empty) | it accepts connections (behind Sentinel: the set serves) |
//! | fence-back | the lock's keys read, and written back `lasts` later (on one Redlock master; behind Sentinel, on the primary) | written back |
//! | terminate-backends | the app's sessions ended every 100 ms for `lasts / 2` | the last round |
//! | restart-postgres | fast shutdown, then started on the same data | it accepts sessions |
//! | delay-network | `delay` added each way to the instance's links for `lasts` | passing again |
//! | cut-network | the instance's links dropped and refused for `lasts`; its links to the lock's ensemble (every member; one Redlock master) for `claim + lasts / 2` (past its session or lease) | passing again |
//! | kill-member | SIGKILL the ensemble's leader or another member (a Redlock master; behind Sentinel the primary or the replica), down for `lasts / 2` (a killed primary until the Sentinels have failed over from it) | started again (a Redis node empty), every member serving with one leader (primary) |
//! | pause-member | SIGSTOP the leader or another member (a Redlock master; behind Sentinel the primary, past the Sentinels' 1 s: usually failed over) for `claim + lasts / 2` | SIGCONT, and every member serving with one leader (primary) |
//! | kill-primary (`ha` database) | SIGKILL the primary's Patroni and PostgreSQL; its synchronous standby is promoted; down `lasts / 2` after that | started again, streaming as a standby |
//! | pause-primary (`ha` database) | SIGSTOP the primary's Patroni and PostgreSQL for Patroni's 20 s lease `+ lasts / 2`: a standby is promoted | SIGCONT; demoted by its Patroni, streaming as a standby |
//! | kill-standby (`ha` database) | SIGKILL the synchronous standby, down `lasts / 2` | started again, streaming |
//! | pause-member of the replica behind Sentinel | the replica stopped and its link filled for `lasts / 2` while the load goes on, then the primary SIGKILLed and the replica continued: promoted without the writes it missed (the fence on each, reported) | the old primary started again, empty, and following the new one |
//!
//! A member fault starts from an ensemble that serves (it waits for that first), and picks
//! its member then: "the leader" is whichever leads; behind Sentinel the pick is a role,
//! the primary or the replica.
//!
//! Behind Sentinel the instances reach Redis at the address the Sentinels give, not
//! through their proxies, so the network kinds hit their PostgreSQL link only.

use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use super::cluster::{Cluster, KEY_PREFIX};
use super::failover;
use super::history::{FaultRecord, Micros, now_us};
use super::members::{self, Members};
use super::proxy::Mode;
use super::schedule::{Fault, FaultKind, MemberPick, Schedule};
use crate::attack::Cancel;

/// What the nemesis needs to know besides the cluster.
#[derive(Debug, Clone)]
pub struct Plan {
    /// No fault starts after this.
    pub until: Instant,
    /// The quiet spell before each fault.
    pub fault_every: Duration,
    /// The instances' `LOCK_TTL_MS`, for the record.
    pub lock_ttl: Duration,
    /// How long the lock keeps the claim of a holder it does not hear from: `LOCK_TTL_MS`
    /// for the Redis and PostgreSQL locks, the session under ZooKeeper, the lease under
    /// etcd. A pause, and a cut from the ensemble, outlast it.
    pub claim: Duration,
    /// The product on sale (its lock's keys are set back).
    pub product_id: i64,
    /// When the soak started, for the times printed.
    pub started_us: Micros,
}

/// Inject faults from `schedule` until `plan.until` or Ctrl-C; every fault is healed before
/// this returns.
///
/// # Errors
/// When a fault cannot be injected or healed (an instance that does not start again, a
/// server that does not come back): the soak cannot go on.
pub async fn run(
    cluster: &mut Cluster,
    schedule: Schedule,
    plan: &Plan,
    cancel: &Cancel,
) -> anyhow::Result<Vec<FaultRecord>> {
    let mut records = Vec::new();
    for fault in schedule {
        let left = plan.until.saturating_duration_since(Instant::now());
        cancel.hold(plan.fault_every.min(left)).await;
        if Instant::now() >= plan.until || cancel.is_set() {
            break;
        }
        let injected_us = now_us();
        let detail = inject(cluster, &fault, plan, cancel)
            .await
            .with_context(|| format!("fault {} ({})", fault.index, fault.kind.name()))?;
        let healed_us = now_us();
        println!(
            "[{:>7.1} s] fault {}: {} {detail}; healed after {:.1} s",
            (injected_us - plan.started_us) as f64 / 1e6,
            fault.index,
            fault.kind.name(),
            (healed_us - injected_us) as f64 / 1e6,
        );
        records.push(FaultRecord {
            index: fault.index,
            kind: fault.kind,
            instance: fault
                .kind
                .targets_an_instance()
                .then_some(fault.instance % cluster.instances()),
            detail,
            injected_us,
            healed_us,
        });
    }
    Ok(records)
}

/// Inject one fault and heal it; what was done.
async fn inject(
    cluster: &mut Cluster,
    fault: &Fault,
    plan: &Plan,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let slot = fault.instance % cluster.instances();
    Ok(match fault.kind {
        FaultKind::KillInstance => kill_instance(cluster, slot, fault, cancel).await?,
        FaultKind::PauseInstance => pause_instance(cluster, slot, fault, plan, cancel).await,
        FaultKind::RestartRedis => cluster.restart_redis()?,
        FaultKind::FenceBack => fence_back(cluster, fault, plan, cancel).await?,
        FaultKind::TerminateBackends => terminate_backends(cluster, fault, cancel).await?,
        FaultKind::RestartPostgres => {
            cluster.restart_postgres().await?;
            "PostgreSQL restarted (fast shutdown)".to_owned()
        }
        FaultKind::DelayNetwork => {
            cluster.set_links(slot, fault.links, fault.member, Mode::Delay(fault.delay));
            cancel.hold(fault.lasts).await;
            cluster.set_links(slot, fault.links, fault.member, Mode::Pass);
            format!(
                "instance {slot}'s {} delayed {} ms each way for {} ms",
                links_name(cluster, fault),
                fault.delay.as_millis(),
                fault.lasts.as_millis()
            )
        }
        FaultKind::CutNetwork => {
            // Cut off from the ensemble past its session or lease: another instance may
            // take the lock while this one still thinks it holds it.
            let lasts = if fault.links.members() {
                plan.claim + fault.lasts / 2
            } else {
                fault.lasts
            };
            cluster.set_links(slot, fault.links, fault.member, Mode::Cut);
            cancel.hold(lasts).await;
            cluster.set_links(slot, fault.links, fault.member, Mode::Pass);
            format!(
                "instance {slot}'s {} cut for {} ms",
                links_name(cluster, fault),
                lasts.as_millis()
            )
        }
        FaultKind::KillMember => kill_member(cluster, fault, cancel).await?,
        FaultKind::PauseMember => pause_member(cluster, fault, plan, cancel).await?,
        FaultKind::KillPrimary => failover::kill_primary(cluster, fault, cancel).await?,
        FaultKind::PausePrimary => failover::pause_primary(cluster, fault, cancel).await?,
        FaultKind::KillStandby => failover::kill_standby(cluster, fault, cancel).await?,
    })
}

/// The links a network fault hits, named.
fn links_name(cluster: &Cluster, fault: &Fault) -> String {
    match (cluster.members(), fault.member) {
        (Some(members), MemberPick::Index(i))
            if fault.links.members() && !members.elect_a_leader() =>
        {
            format!("link to {} master {i}", members.name())
        }
        (Some(members), _) if fault.links.members() => {
            format!("links to every {} member", members.name())
        }
        _ => format!("{} link(s)", fault.links.name()),
    }
}

/// Wait until the ensemble serves (after the quiet spell it does, unless something happened
/// meanwhile: a Sentinel failover of its own on a busy machine), then the member `pick`
/// names, how to name it, and the leader: all three from what the wait found (a second
/// read of the Sentinels could find one slow to answer and name no primary, or find a
/// failover of their own since). Blocks.
fn serving_then_pick(
    members: &mut Members,
    pick: MemberPick,
) -> anyhow::Result<(usize, String, Option<usize>)> {
    let leader = members.wait_until_serving()?;
    let i = members.pick_from(pick, leader)?;
    Ok((i, members.describe(i, leader), leader))
}

/// What leads after a member fault (`after`, as the wait for the members to serve found
/// it), if that changed ("; now leading: ...").
fn leader_change(members: &Members, before: Option<usize>, after: Option<usize>) -> String {
    match after {
        Some(now) if before != Some(now) => {
            format!("; now leading: {}", members.describe(now, after))
        }
        _ => String::new(),
    }
}

/// SIGKILL a member of the lock's ensemble, keep it down half the fault, start it again and
/// wait until every member serves with one leader (behind Sentinel, a killed primary only
/// once the Sentinels have failed over from it).
async fn kill_member(
    cluster: &mut Cluster,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let members = cluster
        .members_mut()
        .context("kill-member drawn without an ensemble")?;
    let (i, named, before) =
        tokio::task::block_in_place(|| serving_then_pick(members, fault.member))?;
    let pid = members.pid(i);
    let down = fault.lasts / 2;
    members.kill(i);
    cancel.hold(down).await;
    let started = Instant::now();
    // Blocks until the ensemble serves again; the load goes on on the other worker.
    let after = tokio::task::block_in_place(|| members.restart(i))?;
    Ok(format!(
        "{named} (pid {pid}) SIGKILLed, down {} ms (a primary until every Sentinel named another), every member serving again {} ms after that{}",
        down.as_millis(),
        started.elapsed().as_millis(),
        leader_change(members, before, after)
    ))
}

/// SIGSTOP a member of the lock's ensemble past a session or lease, then SIGCONT it and
/// wait until every member serves with one leader (a paused leader may have been voted out;
/// a paused primary failed over). Behind Sentinel, the replica is stalled and promoted
/// instead ([`stale_replica_promoted`]).
async fn pause_member(
    cluster: &mut Cluster,
    fault: &Fault,
    plan: &Plan,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let members = cluster
        .members_mut()
        .context("pause-member drawn without an ensemble")?;
    if members.behind_sentinel() && fault.member == MemberPick::Replica {
        return stale_replica_promoted(cluster, fault, plan, cancel).await;
    }
    let (i, named, before) =
        tokio::task::block_in_place(|| serving_then_pick(members, fault.member))?;
    let paused = plan.claim + fault.lasts / 2;
    members.signal(i, "-STOP");
    // TIMING: the pause outlasts a session or lease by at least 500 ms: the clients
    // connected to it move to another member, or lose what they held.
    cancel.hold(paused).await;
    members.signal(i, "-CONT");
    let continued = Instant::now();
    let after = tokio::task::block_in_place(|| members.wait_until_serving())?;
    Ok(format!(
        "{named} (pid {}) SIGSTOPped for {} ms, every member serving {} ms after{}",
        members.pid(i),
        paused.as_millis(),
        continued.elapsed().as_millis(),
        leader_change(members, before, after)
    ))
}

/// Behind Sentinel: the replica misses writes, then is promoted. Its replication stalls,
/// the load goes on for half the fault, the lock's keys are read on the primary, the
/// primary is SIGKILLed and the replica continued, and the keys are read on the replica
/// before it is promoted: what the failover loses shows as a fence further back on the
/// replica (when the lock was taken during the stall). Then the Sentinels promote it, and
/// the old primary, started again empty, follows it.
async fn stale_replica_promoted(
    cluster: &mut Cluster,
    fault: &Fault,
    plan: &Plan,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let keys = LockKeys::of(plan.product_id)?;
    let stalled = fault.lasts / 2;
    let started = Instant::now();
    let members = cluster.members_mut().context("no ensemble")?;
    let replica = tokio::task::block_in_place(|| members.stall_the_replica())?;
    cancel.hold(stalled).await;
    if cancel.is_set() {
        tokio::task::block_in_place(|| members.resume_the_replica(replica))?;
        return Ok(format!(
            "Redis node {replica} (the replica) stalled, then continued: stopped by Ctrl-C"
        ));
    }
    // Read on the primary before it dies; the replica is continued whatever this gives.
    let on_the_primary = read_lock_keys(cluster, &keys, members::other_node(replica)).await;
    let members = cluster.members_mut().context("no ensemble")?;
    let old = members.kill_the_primary(replica)?;
    let on_the_replica = read_lock_keys(cluster, &keys, replica).await;
    let members = cluster.members_mut().context("no ensemble")?;
    tokio::task::block_in_place(|| members.wait_for_the_promotion(old))?;
    Ok(format!(
        "Redis node {replica} (the replica) stalled for {} ms, then node {old} (the primary, fence {}) SIGKILLed: node {replica} promoted with fence {}, node {old} following it empty {} ms after the fault began",
        stalled.as_millis(),
        fence_or_why(&on_the_primary),
        fence_or_why(&on_the_replica),
        started.elapsed().as_millis()
    ))
}

/// The fence a read of the lock's keys found, or why there is none (the read only feeds the
/// record, so its failure does not stop the soak).
fn fence_or_why(read: &anyhow::Result<LockState>) -> String {
    match read {
        Ok(state) => state.fence.clone().unwrap_or_else(|| "(none)".to_owned()),
        Err(error) => format!("(unread: {error})"),
    }
}

/// The lock's keys as Redis node `node` (behind Sentinel) holds them.
async fn read_lock_keys(
    cluster: &Cluster,
    keys: &LockKeys,
    node: usize,
) -> anyhow::Result<LockState> {
    let mut conn = cluster.lock_redis(MemberPick::Index(node)).await?;
    keys.read(&mut conn).await
}

/// SIGKILL instance `slot`, keep it down a quarter of the fault, start it again.
async fn kill_instance(
    cluster: &mut Cluster,
    slot: usize,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let pid = cluster.pid(slot);
    let down = fault.lasts / 4;
    cluster.kill(slot);
    cancel.hold(down).await;
    let started = Instant::now();
    cluster.restart(slot).await?;
    Ok(format!(
        "instance {slot} (pid {pid}) SIGKILLed, down {} ms, ready again {} ms after its start",
        down.as_millis(),
        started.elapsed().as_millis()
    ))
}

/// SIGSTOP instance `slot` for longer than its lease, then SIGCONT it.
async fn pause_instance(
    cluster: &Cluster,
    slot: usize,
    fault: &Fault,
    plan: &Plan,
    cancel: &Cancel,
) -> String {
    let paused = plan.claim + fault.lasts / 2;
    cluster.signal(slot, libc::SIGSTOP);
    // TIMING: the pause outlasts the lock's claim (LOCK_TTL_MS, the session or the lease)
    // by at least 500 ms, so another instance can take the lock while this one still
    // thinks it holds it.
    cancel.hold(paused).await;
    cluster.signal(slot, libc::SIGCONT);
    format!(
        "instance {slot} (pid {}) SIGSTOPped for {} ms (the lock's claim: {} ms; LOCK_TTL_MS {})",
        cluster.pid(slot),
        paused.as_millis(),
        plan.claim.as_millis(),
        plan.lock_ttl.as_millis()
    )
}

/// Set the lock's keys back to what they held `fault.lasts` ago: the fence goes backwards.
async fn fence_back(
    cluster: &mut Cluster,
    fault: &Fault,
    plan: &Plan,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let keys = LockKeys::of(plan.product_id)?;
    if let Some(members) = cluster
        .members_mut()
        .filter(|members| members.behind_sentinel())
    {
        // On the primary of a set that serves, not one a failover is taking away.
        tokio::task::block_in_place(|| members.wait_until_serving())?;
    }
    let mut conn = cluster.lock_redis(fault.member).await?;
    let then = keys.read(&mut conn).await?;
    cancel.hold(fault.lasts).await;
    // Again to the Redis that keeps the lock now (behind Sentinel, after a failover of its
    // own meanwhile, the new primary).
    let mut conn = cluster.lock_redis(fault.member).await?;
    let now = keys.read(&mut conn).await?;
    keys.write(&mut conn, &then).await?;
    let on = match (cluster.members(), fault.member) {
        (Some(members), _) if members.behind_sentinel() => "the primary: ".to_owned(),
        (Some(members), MemberPick::Index(i)) => format!("{} master {i}: ", members.name()),
        _ => String::new(),
    };
    Ok(format!(
        "{on}fence {} set back to {} and lock {} to {} ({} ms old)",
        now.fence.as_deref().unwrap_or("(none)"),
        then.fence.as_deref().unwrap_or("(none)"),
        now.holder_label(),
        then.holder_label(),
        fault.lasts.as_millis()
    ))
}

/// End the app's PostgreSQL sessions every 100 ms for half the fault.
async fn terminate_backends(
    cluster: &Cluster,
    fault: &Fault,
    cancel: &Cancel,
) -> anyhow::Result<String> {
    let until = Instant::now() + fault.lasts / 2;
    let (mut ended, mut rounds) = (0, 0);
    loop {
        ended += cluster.terminate_backends().await?;
        rounds += 1;
        if Instant::now() >= until || cancel.is_set() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(format!(
        "{ended} sessions of the app ended in {rounds} rounds"
    ))
}

/// The Redis keys of the product's lock: the lock and its fence counter
/// (`distlock::redis`).
struct LockKeys {
    lock: String,
    fence: String,
}

/// What the lock's keys held at one moment.
struct LockState {
    /// The holder's token and the lease left, in ms.
    holder: Option<(String, i64)>,
    fence: Option<String>,
}

impl LockState {
    fn holder_label(&self) -> String {
        match &self.holder {
            Some((_, ttl)) => format!("held ({ttl} ms left)"),
            None => "free".to_owned(),
        }
    }
}

impl LockKeys {
    fn of(product_id: i64) -> anyhow::Result<Self> {
        // The service's lock key: `<REDIS_KEY_PREFIX>lock_sale_<id>`.
        let lock = format!("{KEY_PREFIX}lock_sale_{product_id}");
        let fence = distlock::redis::fence_key(&lock)?;
        Ok(Self { lock, fence })
    }

    async fn read(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> anyhow::Result<LockState> {
        let (token, ttl, fence): (Option<String>, i64, Option<String>) = redis::pipe()
            .get(&self.lock)
            .pttl(&self.lock)
            .get(&self.fence)
            .query_async(conn)
            .await?;
        Ok(LockState {
            holder: token.filter(|_| ttl > 0).map(|token| (token, ttl)),
            fence,
        })
    }

    /// Write `state` back, as a replica that saw nothing since would have it.
    async fn write(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        state: &LockState,
    ) -> anyhow::Result<()> {
        let mut pipe = redis::pipe();
        match &state.fence {
            Some(fence) => pipe.set(&self.fence, fence),
            None => pipe.del(&self.fence),
        };
        match &state.holder {
            Some((token, ttl)) => pipe.pset_ex(&self.lock, token, *ttl as u64),
            None => pipe.del(&self.lock),
        };
        pipe.query_async::<()>(conn).await?;
        Ok(())
    }
}
