//! The lock's own servers: under `zookeeper` and `etcd` three members that elect a leader,
//! under `redlock` three Redis masters that stand each alone. The nemesis kills, restarts
//! and pauses them (the other strategies lock in Redis or PostgreSQL, which the cluster
//! always runs).
//!
//! Each instance reaches every member through a proxy of its own (see the cluster), so the
//! nemesis can also cut one instance off from them (from all of an electing ensemble, past
//! its session or lease; from one of Redlock's masters, which the quorum outvotes), or slow
//! its links to them.

use std::time::Duration;

use ::servers::zookeeper::{DEFAULT_MAX_SESSION_TIMEOUT, Profile};
use ::servers::{EtcdCluster, RedisServer, Tie, ZooKeeperEnsemble};
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

/// The running ensemble, of any kind.
pub enum Members {
    ZooKeeper(ZooKeeperEnsemble),
    Etcd(EtcdCluster),
    /// Redis masters keeping nothing on disk.
    Redlock(Vec<RedisServer>),
}

impl Members {
    /// The ensemble `strategy` locks in, started and serving with a leader; `None` for the
    /// strategies whose lock is in Redis or PostgreSQL.
    ///
    /// # Errors
    /// When it is not installed, or does not form within a minute.
    pub fn start(strategy: seckill::LockStrategy) -> anyhow::Result<Option<Self>> {
        let Some(Ensemble { members, .. }) = Ensemble::of(strategy) else {
            return Ok(None);
        };
        // The soak spawns from the thread that runs it to its end (the nemesis's), so a
        // member dies with the soak even if the soak is killed.
        let tie = Tie::OwnGroupDiesWithSpawner;
        Ok(match strategy {
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
        }
    }

    /// Redlock master `i`'s URL, reached directly (not through a proxy); `None` for an
    /// ensemble of another kind.
    pub fn redis_url(&self, i: usize) -> Option<String> {
        match self {
            Self::Redlock(masters) => Some(masters[i].url()),
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
            Self::Redlock(_) => lock_ttl,
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
        }
    }

    /// Member `i`'s pid.
    pub fn pid(&self, i: usize) -> u32 {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.pid(i),
            Self::Etcd(cluster) => cluster.pid(i),
            Self::Redlock(masters) => masters[i].pid(),
        }
    }

    /// Send `signal` (`-STOP`, `-CONT`) to member `i`, by its pid.
    pub fn signal(&self, i: usize, signal: &str) {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.signal(i, signal),
            Self::Etcd(cluster) => cluster.signal(i, signal),
            Self::Redlock(masters) => masters[i].signal(signal),
        }
    }

    /// SIGKILL member `i`; a ZooKeeper or etcd member's data stays for
    /// [`restart`](Self::restart), a Redis master's is gone.
    pub fn kill(&mut self, i: usize) {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.kill(i),
            Self::Etcd(cluster) => cluster.kill(i),
            Self::Redlock(masters) => masters[i].kill(),
        }
    }

    /// Wait until every running member serves, with one leader (after a pause, the
    /// election it may have caused). Blocks.
    ///
    /// # Errors
    /// When they do not, within a minute.
    pub fn wait_until_serving(&mut self) -> anyhow::Result<()> {
        let within = Duration::from_secs(60);
        match self {
            Self::ZooKeeper(ensemble) => ensemble.try_wait_for_quorum(within)?,
            Self::Etcd(cluster) => cluster.try_wait_until_healthy(within)?,
            // Each master serves once it runs: a continued one at once.
            Self::Redlock(_) => {}
        }
        Ok(())
    }

    /// Start member `i` again (on its data; a Redis master empty), and wait until every
    /// member serves (with one leader, where they elect one). Blocks.
    ///
    /// # Errors
    /// When it does not, within a minute.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        match self {
            Self::ZooKeeper(ensemble) => ensemble.try_restart(i)?,
            Self::Etcd(cluster) => cluster.try_restart(i)?,
            Self::Redlock(masters) => masters[i].try_restart_empty()?,
        }
        Ok(())
    }
}
