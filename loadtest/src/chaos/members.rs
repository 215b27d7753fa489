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

use super::schedule::Ensemble;

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

    /// What the member that leads is called: the leader, or behind Sentinel the primary.
    pub fn leader_role(&self) -> &'static str {
        match self {
            Self::Sentinel(_) => "the primary",
            _ => "the leader",
        }
    }

    /// Whether each instance reaches the members through proxies of its own (not behind
    /// Sentinel, whose Sentinels hand out the primary's own address).
    pub fn proxied(&self) -> bool {
        !matches!(self, Self::Sentinel(_))
    }

    /// The Sentinel-watched set, under `redis --sentinel`.
    pub fn sentinels(&self) -> Option<&RedisSentinels> {
        match self {
            Self::Sentinel(set) => Some(set),
            _ => None,
        }
    }

    /// How many members there are.
    pub fn count(&self) -> usize {
        self.ports().len()
    }

    /// Whether the members elect a leader (Redlock's masters do not).
    pub fn elect_a_leader(&self) -> bool {
        !matches!(self, Self::Redlock(_))
    }

    /// Every member's client port, in member order.
    pub fn ports(&self) -> Vec<u16> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.member_ports(),
            Self::Etcd(cluster) => cluster.member_ports(),
            Self::Redlock(masters) => masters.iter().map(RedisServer::port).collect(),
            Self::Sentinel(set) => (0..2).map(|i| set.node(i).port()).collect(),
        }
    }

    /// The URL of the Redis that keeps the lock, reached directly (not through a proxy):
    /// Redlock's master `i`, or the primary behind Sentinel (whatever `i`); `None` for an
    /// ensemble of another kind, or when the Sentinels name no primary.
    pub fn redis_url(&self, i: usize) -> Option<String> {
        match self {
            Self::Redlock(masters) => Some(masters[i].url()),
            Self::Sentinel(set) => set.try_primary().map(|p| set.node(p).url()),
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
            // The Sentinels, directly (the instances take REDIS_URL no more).
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
            Self::Sentinel(set) => set.try_primary(),
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
    /// election it may have caused). Blocks.
    ///
    /// # Errors
    /// When they do not, within a minute.
    pub fn wait_until_serving(&mut self) -> anyhow::Result<()> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.try_wait_for_quorum(WITHIN)?,
            Self::Etcd(cluster) => cluster.try_wait_until_healthy(WITHIN)?,
            // Each master serves once it runs: a continued one at once.
            Self::Redlock(_) => {}
            // A primary continued after a failover is a second primary until the Sentinels
            // turn it into a replica, some 8 s after they see it again.
            Self::Sentinel(set) => {
                set.try_wait_until_serving(WITHIN)?;
            }
        }
        Ok(())
    }

    /// Start member `i` again (on its data; a Redis node empty), and wait until every
    /// member serves (with one leader, where they elect one). Behind Sentinel a killed
    /// primary is started only once the Sentinels have failed over from it: started
    /// before, it would stay the primary, empty ([`restart_primary_empty`] is that fault).
    /// Blocks.
    ///
    /// [`restart_primary_empty`]: Self::restart_primary_empty
    ///
    /// # Errors
    /// When it does not, within a minute.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.try_restart(i)?,
            Self::Etcd(cluster) => cluster.try_restart(i)?,
            Self::Redlock(masters) => masters[i].try_restart_empty()?,
            Self::Sentinel(set) => {
                let port = set.node(i).port();
                if set.primary_port() == Some(port) {
                    set.try_wait_for_failover_from(port, WITHIN)?;
                }
                set.nodes()[i].try_restart_empty()?;
                set.try_wait_until_serving(WITHIN)?;
            }
        }
        Ok(())
    }

    /// Behind Sentinel, restart the primary empty on its port at once, before the
    /// Sentinels see it gone: it stays the primary, and its replica resynchronises from
    /// it, so every lock and fence counter is lost (as `restart-redis` does to the one
    /// Redis of the other strategies); then wait until the set serves. The primary's
    /// index, `None` for an ensemble of another kind. Blocks.
    ///
    /// # Errors
    /// When the Sentinels name no primary, or the set does not serve within a minute.
    pub fn restart_primary_empty(&mut self) -> anyhow::Result<Option<usize>> {
        let Self::Sentinel(set) = self else {
            return Ok(None);
        };
        let primary = set
            .try_primary()
            .context("the Sentinels name no primary to restart")?;
        set.nodes()[primary].try_restart_empty()?;
        set.try_wait_until_serving(WITHIN)?;
        Ok(Some(primary))
    }

    /// Behind Sentinel, make the replica `replica` miss writes and then be promoted: its
    /// replication stalls (it is stopped, and the primary's link to it filled), the load
    /// goes on for `stalled`, the primary is SIGKILLed, the replica continued, and once the
    /// Sentinels have failed over to it the old primary is started again, empty. The old
    /// primary's index. Blocks.
    ///
    /// # Errors
    /// When this is not a Sentinel set, `replica` is the primary, or a step does not
    /// happen within a minute (the replica is continued whatever happens).
    pub fn fail_over_to_a_stale_replica(
        &mut self,
        replica: usize,
        stalled: Duration,
    ) -> anyhow::Result<usize> {
        let Self::Sentinel(set) = self else {
            anyhow::bail!("only a Sentinel-watched set has a replica to stall");
        };
        let primary = set.try_primary().context("the Sentinels name no primary")?;
        anyhow::ensure!(primary != replica, "node {replica} is the primary");
        let old_port = set.node(primary).port();
        let stalled_then_killed = set.try_stall_replication(replica).map(|()| {
            std::thread::sleep(stalled);
            set.nodes()[primary].kill();
        });
        set.resume(replica);
        stalled_then_killed?;
        set.try_wait_for_failover_from(old_port, WITHIN)?;
        set.nodes()[primary].try_restart_empty()?;
        set.try_wait_until_serving(WITHIN)?;
        Ok(primary)
    }
}
