//! The lock's own servers: under `zookeeper` and `etcd` three members that elect a leader,
//! under `redlock` three Redis masters that stand each alone, under `redis --sentinel` a
//! primary and a replica watched by three Sentinels (the "leader" is the primary). The
//! nemesis kills, restarts and pauses them (the other strategies lock in Redis or
//! PostgreSQL, which the cluster always runs).
//!
//! Each instance reaches every ZooKeeper, etcd or Redlock member through a proxy of its own
//! (see the cluster), so the nemesis can also cut one instance off from them (from all of
//! an electing ensemble, past its session or lease; from one of Redlock's masters, which
//! the quorum outvotes), or slow its links to them. Behind Sentinel it cannot: the
//! Sentinels hand out the primary's own address, so the instances reach the nodes
//! directly.

use std::time::Duration;

use ::servers::zookeeper::{DEFAULT_MAX_SESSION_TIMEOUT, Profile};
use ::servers::{EtcdCluster, RedisSentinels, RedisServer, Tie, ZooKeeperEnsemble};
use anyhow::Context;

use super::schedule::{Ensemble, EnsembleKind, MemberPick};

/// The shortest `LOCK_TTL_MS` the etcd lock takes with three members: its renewal must have
/// time for two request timeouts of 1 s (one member that does not answer, then the next),
/// and it renews a third of the way into the lease (`distlock::etcd`).
pub const ETCD_MIN_LOCK_TTL: Duration = Duration::from_secs(3);

/// The longest `LOCK_TTL_MS` the soak takes under ZooKeeper: the instances ask for sessions
/// of twice it, and its servers grant at most [`DEFAULT_MAX_SESSION_TIMEOUT`].
pub fn zookeeper_max_lock_ttl() -> Duration {
    DEFAULT_MAX_SESSION_TIMEOUT / 2
}

/// How long a Sentinel-watched primary may not answer before the Sentinels fail it over:
/// quick, so that a paused or killed primary is failed over well within a fault.
pub const SENTINEL_DOWN_AFTER: Duration = RedisSentinels::DOWN_AFTER;

/// How long the nemesis waits for the members to serve again after a fault.
const WITHIN: Duration = Duration::from_secs(60);

/// The running ensemble, of any kind.
pub enum Members {
    ZooKeeper(ZooKeeperEnsemble),
    Etcd(EtcdCluster),
    /// Redis masters keeping nothing on disk.
    Redlock(Vec<RedisServer>),
    /// A primary and a replica keeping nothing on disk, and three Sentinels.
    Sentinel(RedisSentinels),
}

impl Members {
    /// The ensemble `strategy` locks in (`sentinel`: Redis behind Sentinel, under
    /// `redis`), started and serving with a leader; `None` for the strategies whose lock is
    /// in the soak's one Redis or in PostgreSQL.
    ///
    /// # Errors
    /// When it is not installed, or does not form within a minute.
    pub fn start(strategy: seckill::LockStrategy, sentinel: bool) -> anyhow::Result<Option<Self>> {
        let Some(Ensemble { members, .. }) = Ensemble::of(strategy, sentinel) else {
            return Ok(None);
        };
        // The soak spawns from the thread that runs it to its end (the nemesis's), so a
        // member dies with the soak even if the soak is killed.
        let tie = Tie::OwnGroupDiesWithSpawner;
        Ok(match strategy {
            seckill::LockStrategy::Redis => {
                let set = RedisSentinels::try_start(members - 1, SENTINEL_DOWN_AFTER, tie)
                    .context("starting the soak's own Redis behind Sentinel")?;
                Some(Self::Sentinel(set))
            }
            seckill::LockStrategy::ZooKeeper => {
                // Tuned for tests (a short tick, no fsync): sessions as short as the soak
                // asks, and three JVMs that start in seconds on two cores.
                let profile = Profile::Test {
                    max_session_timeout: DEFAULT_MAX_SESSION_TIMEOUT,
                };
                let ensemble = ZooKeeperEnsemble::try_start(members, profile, tie)
                    .context("starting the soak's own ZooKeeper ensemble")?;
                Some(Self::ZooKeeper(ensemble))
            }
            seckill::LockStrategy::Etcd => {
                let cluster = EtcdCluster::try_start(members, tie)
                    .context("starting the soak's own etcd cluster")?;
                Some(Self::Etcd(cluster))
            }
            _ => {
                let masters = (0..members)
                    .map(|_| RedisServer::try_start(tie))
                    .collect::<Result<Vec<_>, _>>()
                    .context("starting the soak's own Redlock masters")?;
                Some(Self::Redlock(masters))
            }
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::ZooKeeper(_) => "ZooKeeper",
            Self::Etcd(_) => "etcd",
            Self::Redlock(_) => "Redlock",
            Self::Sentinel(_) => "Sentinel-watched Redis",
        }
    }

    /// Member `i` as a fault's record names it, `leader` leading: its kind, its number, and
    /// its role ("ZooKeeper member 1 (the leader)", "Redis node 0 (the primary)").
    pub fn describe(&self, i: usize, leader: Option<usize>) -> String {
        let leads = leader == Some(i);
        match self {
            Self::Sentinel(_) => {
                format!(
                    "Redis node {i} (the {})",
                    if leads { "primary" } else { "replica" }
                )
            }
            Self::Redlock(_) => format!("Redlock master {i}"),
            _ if leads => format!("{} member {i} (the leader)", self.name()),
            _ => format!("{} member {i}", self.name()),
        }
    }

    /// The member `pick` names now: the leader (member 0 if the members agree on none),
    /// behind Sentinel the primary or the replica, or the one by number.
    ///
    /// # Errors
    /// Behind Sentinel, when the Sentinels agree on no primary that answers.
    pub fn pick(&self, pick: MemberPick) -> anyhow::Result<usize> {
        self.pick_from(pick, self.leader())
    }

    /// The member `pick` names when `leader` leads, as [`pick`](Self::pick) says.
    ///
    /// # Errors
    /// Behind Sentinel, when `leader` is `None`.
    pub fn pick_from(&self, pick: MemberPick, leader: Option<usize>) -> anyhow::Result<usize> {
        if self.behind_sentinel() {
            let primary = leader.context("the Sentinels agree on no primary that answers")?;
            return Ok(match pick {
                MemberPick::Leader => primary,
                _ => other_node(primary),
            });
        }
        Ok(match pick {
            MemberPick::Leader | MemberPick::Replica => leader.unwrap_or(0),
            MemberPick::Index(i) => i,
        })
    }

    /// How the members stand to each other ([`Ensemble::of`] gives the same).
    pub fn kind(&self) -> EnsembleKind {
        match self {
            Self::ZooKeeper(_) | Self::Etcd(_) => EnsembleKind::Electing,
            Self::Redlock(_) => EnsembleKind::Masters,
            Self::Sentinel(_) => EnsembleKind::PrimaryAndReplica,
        }
    }

    /// Whether this is Redis behind Sentinel, whose faults differ by role.
    pub fn behind_sentinel(&self) -> bool {
        self.kind() == EnsembleKind::PrimaryAndReplica
    }

    /// How many members there are.
    pub fn count(&self) -> usize {
        self.ports().len()
    }

    /// Whether the members elect a leader (Redlock's masters do not; behind Sentinel the
    /// primary counts as one).
    pub fn elect_a_leader(&self) -> bool {
        self.kind() != EnsembleKind::Masters
    }

    /// Every member's client port, in member order.
    pub fn ports(&self) -> Vec<u16> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.member_ports(),
            Self::Etcd(cluster) => cluster.member_ports(),
            Self::Redlock(masters) => masters.iter().map(RedisServer::port).collect(),
            Self::Sentinel(set) => (0..set.node_count()).map(|i| set.node(i).port()).collect(),
        }
    }

    /// The URL of Redis node or master `i`, reached directly (not through a proxy);
    /// `None` for an ensemble of another kind.
    pub fn redis_url(&self, i: usize) -> Option<String> {
        match self {
            Self::Redlock(masters) => Some(masters[i].url()),
            Self::Sentinel(set) => Some(set.node(i).url()),
            _ => None,
        }
    }

    /// The settings that point an instance at the members through `ports` (its proxies, in
    /// member order), with a lock that lasts `lock_ttl`.
    pub fn settings(&self, ports: &[u16], lock_ttl: Duration) -> Vec<(&'static str, String)> {
        let addresses = |scheme: &str| {
            ports
                .iter()
                .map(|port| format!("{scheme}127.0.0.1:{port}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Self::ZooKeeper(_) => vec![
                ("ZOOKEEPER_CONNECT", addresses("")),
                (
                    "ZOOKEEPER_SESSION_TIMEOUT_MS",
                    Self::zookeeper_session(lock_ttl).as_millis().to_string(),
                ),
            ],
            Self::Etcd(_) => vec![("ETCD_ENDPOINTS", addresses("http://"))],
            Self::Redlock(_) => vec![("REDLOCK_URLS", addresses("redis://"))],
            // The Sentinels, directly: the instances ignore REDIS_URL then (its Redis and
            // their proxies to it stand idle, and no fault is drawn against them).
            Self::Sentinel(set) => vec![
                ("REDIS_SENTINELS", set.sentinel_urls().join(",")),
                ("REDIS_SENTINEL_MASTER", RedisSentinels::MASTER.to_owned()),
            ],
        }
    }

    /// How long the lock service keeps a holder's claim after it last heard from it: the
    /// session under ZooKeeper, the lease under etcd. A pause or a cut longer than this
    /// lets another instance take the lock while the first still thinks it holds it.
    pub fn claim(&self, lock_ttl: Duration) -> Duration {
        match self {
            Self::ZooKeeper(_) => Self::zookeeper_session(lock_ttl),
            // etcd grants whole seconds, never less than asked (`distlock::etcd`).
            Self::Etcd(_) => Duration::from_secs(lock_ttl.as_millis().div_ceil(1_000) as u64),
            Self::Redlock(_) | Self::Sentinel(_) => lock_ttl,
        }
    }

    /// `ZOOKEEPER_SESSION_TIMEOUT_MS`: twice the lock's lease, the shortest the service
    /// allows (the ensemble may end a session 0.6 of its timeout after the holder last
    /// proved it alive).
    fn zookeeper_session(lock_ttl: Duration) -> Duration {
        2 * lock_ttl
    }

    /// The member that leads now, if the members agree on one.
    pub fn leader(&self) -> Option<usize> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.leader(),
            Self::Etcd(cluster) => cluster.leader(),
            Self::Redlock(_) => None,
            Self::Sentinel(set) => set.try_agreed_primary(),
        }
    }

    /// Member `i`'s pid.
    pub fn pid(&self, i: usize) -> u32 {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.pid(i),
            Self::Etcd(cluster) => cluster.pid(i),
            Self::Redlock(masters) => masters[i].pid(),
            Self::Sentinel(set) => set.node(i).pid(),
        }
    }

    /// Send `signal` (`-STOP`, `-CONT`) to member `i`, by its pid.
    pub fn signal(&self, i: usize, signal: &str) {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.signal(i, signal),
            Self::Etcd(cluster) => cluster.signal(i, signal),
            Self::Redlock(masters) => masters[i].signal(signal),
            Self::Sentinel(set) => set.node(i).signal(signal),
        }
    }

    /// SIGKILL member `i`; a ZooKeeper or etcd member's data stays for
    /// [`restart`](Self::restart), a Redis node's is gone.
    pub fn kill(&mut self, i: usize) {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.kill(i),
            Self::Etcd(cluster) => cluster.kill(i),
            Self::Redlock(masters) => masters[i].kill(),
            Self::Sentinel(set) => set.nodes()[i].kill(),
        }
    }

    /// Wait until every running member serves, with one leader (after a pause, the
    /// election it may have caused); the leader then, where they elect one. Blocks.
    ///
    /// # Errors
    /// When they do not, within a minute.
    pub fn wait_until_serving(&mut self) -> anyhow::Result<Option<usize>> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.try_wait_for_quorum(WITHIN)?,
            Self::Etcd(cluster) => cluster.try_wait_until_healthy(WITHIN)?,
            // Each master serves once it runs: a continued one at once.
            Self::Redlock(_) => {}
            // A primary continued after a failover is a second primary until the Sentinels
            // turn it into a replica, some 8 s after they see it again. The primary the
            // wait found serving is the leader: asking the Sentinels again, once, could
            // find one of them slow to answer on a busy machine and name none.
            Self::Sentinel(set) => return Ok(Some(set.try_wait_until_serving(WITHIN)?)),
        }
        Ok(self.leader())
    }

    /// Start member `i` again (on its data; a Redis node empty), and wait until every
    /// member serves (with one leader, where they elect one). Behind Sentinel a node is
    /// started only once every Sentinel names another as the primary: a killed primary
    /// started before the failover would stay the primary, empty
    /// ([`restart_primary_empty`] is that fault). The leader then, as
    /// [`wait_until_serving`](Self::wait_until_serving) says. Blocks.
    ///
    /// [`restart_primary_empty`]: Self::restart_primary_empty
    ///
    /// # Errors
    /// When it does not, within a minute.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<Option<usize>> {
        match self {
            // Each waits until every member serves again, with one leader.
            Self::ZooKeeper(ensemble) => ensemble.try_restart(i)?,
            Self::Etcd(cluster) => cluster.try_restart(i)?,
            Self::Redlock(masters) => masters[i].try_restart_empty()?,
            Self::Sentinel(set) => {
                set.try_wait_for_failover_from(set.node(i).port(), WITHIN)?;
                set.nodes()[i].try_restart_empty()?;
                return Ok(Some(set.try_wait_until_serving(WITHIN)?));
            }
        }
        Ok(self.leader())
    }

    /// Behind Sentinel, restart the primary empty on its port at once, before the
    /// Sentinels count it down: it stays the primary, and its replica resynchronises from
    /// it, so every lock and fence counter is lost (as `restart-redis` does to the one
    /// Redis of the other strategies); then wait until the set serves. The node restarted,
    /// and the primary once the set serves: another if the Sentinels failed over after
    /// all. Blocks.
    ///
    /// # Errors
    /// When this is not a Sentinel set, or it does not serve within a minute (before or
    /// after).
    pub fn restart_primary_empty(&mut self) -> anyhow::Result<(usize, usize)> {
        let Self::Sentinel(set) = self else {
            anyhow::bail!("only the primary behind Sentinel is restarted this way");
        };
        let primary = set.try_wait_until_serving(WITHIN)?;
        set.nodes()[primary].try_restart_empty()?;
        Ok((primary, set.try_wait_until_serving(WITHIN)?))
    }

    /// Behind Sentinel, stall the replica's replication so that it misses the writes that
    /// come next: it is stopped, and the primary's link to it filled with junk. Follow with
    /// [`kill_the_primary`](Self::kill_the_primary), or
    /// [`resume_the_replica`](Self::resume_the_replica). The replica's index. Blocks.
    ///
    /// # Errors
    /// When this is not a Sentinel set, the set does not serve within a minute, or the
    /// primary does not take the junk (the replica is continued then).
    pub fn stall_the_replica(&mut self) -> anyhow::Result<usize> {
        let Self::Sentinel(set) = self else {
            anyhow::bail!("only a Sentinel-watched set has a replica to stall");
        };
        let replica = other_node(set.try_wait_until_serving(WITHIN)?);
        if let Err(error) = set.try_stall_replication(replica) {
            set.resume(replica);
            return Err(error.into());
        }
        Ok(replica)
    }

    /// Behind Sentinel, SIGCONT the replica stalled by
    /// [`stall_the_replica`](Self::stall_the_replica) (the fault given up), and wait until
    /// the set serves. Blocks.
    ///
    /// # Errors
    /// When it does not serve within a minute.
    pub fn resume_the_replica(&mut self, replica: usize) -> anyhow::Result<()> {
        if let Self::Sentinel(set) = self {
            set.resume(replica);
            set.try_wait_until_serving(WITHIN)?;
        }
        Ok(())
    }

    /// Behind Sentinel, after [`stall_the_replica`](Self::stall_the_replica): SIGKILL the
    /// primary and continue the replica, whose link to it is gone with what it had not
    /// received. Follow with [`wait_for_the_promotion`](Self::wait_for_the_promotion). The
    /// old primary's index.
    ///
    /// # Errors
    /// When this is not a Sentinel set.
    pub fn kill_the_primary(&mut self, replica: usize) -> anyhow::Result<usize> {
        let Self::Sentinel(set) = self else {
            anyhow::bail!("only a Sentinel-watched set has a primary to kill");
        };
        let primary = other_node(replica);
        set.nodes()[primary].kill();
        set.resume(replica);
        Ok(primary)
    }

    /// Behind Sentinel, after [`kill_the_primary`](Self::kill_the_primary): once every
    /// Sentinel names the replica, start the old primary again, empty, and wait until it
    /// follows. Blocks.
    ///
    /// # Errors
    /// When this is not a Sentinel set, or the failover or the old primary's return does
    /// not happen within a minute.
    pub fn wait_for_the_promotion(&mut self, old_primary: usize) -> anyhow::Result<()> {
        let Self::Sentinel(set) = self else {
            anyhow::bail!("only a Sentinel-watched set promotes a replica");
        };
        set.try_wait_for_failover_from(set.node(old_primary).port(), WITHIN)?;
        set.nodes()[old_primary].try_restart_empty()?;
        set.try_wait_until_serving(WITHIN)?;
        Ok(())
    }
}

/// The other node of the Sentinel-watched set, which has two: a primary and one replica
/// ([`Ensemble::of`]).
pub fn other_node(node: usize) -> usize {
    debug_assert!(node < 2, "the set has two nodes");
    1 - node
}
