//! The soak's cluster: a private PostgreSQL and a private Redis, the lock's own ensemble
//! under `zookeeper`, `etcd`, `redlock` and `redis --sentinel` ([`super::members`]), and N
//! seckill instances, each reaching every server through proxies of its own
//! ([`super::proxy`]; behind Sentinel, PostgreSQL only). Everything is stopped when the
//! cluster is dropped: the instances (by pid), the proxies, the servers (and their data
//! directories).
//!
//! Under the `ha` database PostgreSQL is a Patroni cluster with HAProxy in front: the
//! instances' proxies lead to HAProxy, which leads to the primary.
//!
//! The private PostgreSQL keeps commit timestamps (`track_commit_timestamp`), so that the
//! checker can rebuild the stock's history from the rows themselves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::Url;
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

use super::members::Members;
use super::proxy::{Mode, Proxy};
use super::schedule::{Ensemble, Links, MemberPick};
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, Server, ThrowawayDatabase};

/// The admin token of the soak's instances.
pub const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789";

/// The Redis key prefix of the soak's instances.
pub const KEY_PREFIX: &str = "chaos:";

/// `HTTP_REQUEST_TIMEOUT_MS` of the soak's instances (the service's default), which the
/// checker needs to know: an instance paused while a connection's first request head timer
/// of this length fell due answers that request 408 as it wakes.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// How the instances run.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub instances: usize,
    pub strategy: seckill::LockStrategy,
    /// Under `redis`: Redis behind Sentinel (a primary and a replica) instead of one server.
    pub sentinel: bool,
    pub lock_ttl_ms: u64,
    pub sold_out_recheck_ms: u64,
    /// PostgreSQL that fails over (Patroni, HAProxy in front) instead of one server.
    pub ha: bool,
}

/// The instances' addresses, by slot, shared with the load (a restarted instance listens on
/// other ports).
pub type Urls = Arc<RwLock<Vec<Endpoints>>>;

/// One instance's two listeners.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The buyers' (`BIND_ADDR`).
    pub public: String,
    /// The operators' (`OPS_BIND_ADDR`): restocks go there.
    pub ops: String,
}

impl Endpoints {
    fn of(instance: &Instance) -> Self {
        Self {
            public: instance.url.clone(),
            ops: instance.ops_url.clone(),
        }
    }
}

/// Fields drop in order: the instances and their proxies first, the servers last.
pub struct Cluster {
    config: ClusterConfig,
    slots: Vec<Slot>,
    /// Instances killed by the nemesis, kept until the end so that their logs can be kept
    /// when the soak fails.
    retired: Vec<Instance>,
    urls: Urls,
    /// The app's database, reached directly (not through a proxy).
    pub database_url: String,
    /// The `postgres` database of the private server, for the nemesis's own sessions.
    admin_url: String,
    database: String,
    redis_url: String,
    loadtest: PathBuf,
    /// The lock's ensemble, under `zookeeper`, `etcd`, `redlock` and Sentinel.
    members: Option<Members>,
    redis: Server,
    postgres: Server,
}

struct Slot {
    name: String,
    postgres: Proxy,
    redis: Proxy,
    /// One proxy per member of the lock's ensemble, in member order (none without one, or
    /// behind Sentinel).
    members: Vec<Proxy>,
    instance: Instance,
    /// How many times it was started (its logs are named after it).
    starts: u32,
}

impl Cluster {
    /// Start the servers, the proxies and the instances (one after the other: the first runs
    /// the migrations).
    ///
    /// # Errors
    /// When a server or an instance does not start.
    pub async fn start(config: ClusterConfig) -> anyhow::Result<Self> {
        let keep_commit_times = [("track_commit_timestamp", "on")];
        let postgres = if config.ha {
            servers::start_patroni_with(&keep_commit_times)
                .await
                .context("starting the soak's own Patroni cluster")?
        } else {
            servers::start_postgres_with(&keep_commit_times)
                .await
                .context("starting the soak's own PostgreSQL")?
        };
        let redis = servers::start_redis().context("starting the soak's own Redis")?;
        let members =
            tokio::task::block_in_place(|| Members::start(config.strategy, config.sentinel))?;
        let admin_url = postgres.url.clone();
        let database = "seckill_chaos".to_owned();
        let database_url = ThrowawayDatabase::create(&admin_url, database.clone())
            .await?
            .url;
        let loadtest = std::env::current_exe().context("finding this binary to start instances")?;
        let postgres_at = socket_addr(&admin_url)?;
        let redis_at = socket_addr(&redis.url)?;
        let mut cluster = Self {
            config: config.clone(),
            slots: Vec::new(),
            retired: Vec::new(),
            urls: Arc::new(RwLock::new(Vec::new())),
            database_url,
            admin_url,
            database,
            redis_url: redis.url.clone(),
            loadtest,
            members,
            redis,
            postgres,
        };
        // Behind Sentinel the instances reach the nodes at the addresses the Sentinels give,
        // so proxies of theirs would stand idle.
        let proxied = Ensemble::of(config.strategy, config.sentinel).is_some_and(Ensemble::proxied);
        let member_ports = cluster
            .members
            .as_ref()
            .filter(|_| proxied)
            .map(Members::ports);
        for i in 0..config.instances {
            let postgres = Proxy::start(postgres_at).await?;
            let redis = Proxy::start(redis_at).await?;
            let mut members = Vec::new();
            for port in member_ports.iter().flatten() {
                members.push(Proxy::start(SocketAddr::from(([127, 0, 0, 1], *port))).await?);
            }
            let name = format!("chaos-{i}-start1");
            let instance = cluster
                .start_instance(&postgres, &redis, &members, &name)
                .await?;
            cluster.urls.write().unwrap().push(Endpoints::of(&instance));
            cluster.slots.push(Slot {
                name: format!("chaos-{i}"),
                postgres,
                redis,
                members,
                instance,
                starts: 1,
            });
        }
        Ok(cluster)
    }

    async fn start_instance(
        &self,
        postgres: &Proxy,
        redis: &Proxy,
        members: &[Proxy],
        name: &str,
    ) -> anyhow::Result<Instance> {
        let mut database_url = Url::parse(&self.database_url)?;
        database_url
            .set_port(Some(postgres.port()))
            .map_err(|()| anyhow::anyhow!("cannot set the port of {database_url}"))?;
        let redis_url = format!("redis://127.0.0.1:{}", redis.port());
        let lock_ttl = Duration::from_millis(self.config.lock_ttl_ms);
        let ports: Vec<u16> = members.iter().map(Proxy::port).collect();
        let lock_servers = self
            .members
            .as_ref()
            .map(|m| m.settings(&ports, lock_ttl))
            .unwrap_or_default();
        let config = InstanceConfig {
            database_url: database_url.as_str(),
            redis_url: &redis_url,
            redis_key_prefix: KEY_PREFIX,
            admin_token: ADMIN_TOKEN,
            strategy: self.config.strategy,
            work_ms: 0,
            lock_wait_ms: 2_000,
            lock_ttl_ms: self.config.lock_ttl_ms,
            redlock_urls: "",
            extra: vec![
                (
                    "SOLD_OUT_RECHECK_MS",
                    self.config.sold_out_recheck_ms.to_string(),
                ),
                ("DATABASE_MAX_CONNECTIONS", "10".into()),
                ("HTTP_REQUEST_TIMEOUT_MS", REQUEST_TIMEOUT_MS.to_string()),
            ]
            .into_iter()
            .chain(lock_servers)
            .collect(),
        };
        Instance::start(&self.loadtest, &config, name).await
    }

    pub fn urls(&self) -> Urls {
        Arc::clone(&self.urls)
    }

    pub fn instances(&self) -> usize {
        self.slots.len()
    }

    pub fn pid(&self, slot: usize) -> u32 {
        self.slots[slot].instance.pid()
    }

    /// SIGKILL the instance in `slot` and reap it.
    pub fn kill(&mut self, slot: usize) {
        self.slots[slot].instance.kill();
    }

    /// Start the instance in `slot` again (after [`kill`](Self::kill)), with the same
    /// proxies; it listens on a new port, which [`urls`](Self::urls) then gives.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn restart(&mut self, slot: usize) -> anyhow::Result<()> {
        let starts = self.slots[slot].starts + 1;
        let name = format!("{}-start{starts}", self.slots[slot].name);
        let instance = {
            let s = &self.slots[slot];
            self.start_instance(&s.postgres, &s.redis, &s.members, &name)
                .await?
        };
        self.urls.write().unwrap()[slot] = Endpoints::of(&instance);
        let old = std::mem::replace(&mut self.slots[slot].instance, instance);
        self.slots[slot].starts = starts;
        self.retired.push(old);
        Ok(())
    }

    /// Send `signal` (SIGSTOP, SIGCONT) to the instance in `slot`, by its pid.
    pub fn signal(&self, slot: usize, signal: libc::c_int) {
        // SAFETY: a signal to our own child, by the pid it was started with (reaped only by
        // `kill`, which the nemesis never calls on a paused instance before SIGCONT).
        unsafe {
            libc::kill(self.pid(slot) as libc::pid_t, signal);
        }
    }

    /// Put `slot`'s links in `mode`: its links to the lock's ensemble are to every member
    /// of one that elects a leader, or to `member` alone among Redlock's masters.
    pub fn set_links(&self, slot: usize, links: Links, member: MemberPick, mode: Mode) {
        let s = &self.slots[slot];
        if links.postgres() {
            s.postgres.set(mode);
        }
        if links.redis() {
            s.redis.set(mode);
        }
        if links.members() {
            match (self.members.as_ref(), member) {
                (Some(members), MemberPick::Index(i)) if !members.elect_a_leader() => {
                    s.members[i].set(mode);
                }
                _ => s.members.iter().for_each(|proxy| proxy.set(mode)),
            }
        }
    }

    /// The lock's ensemble, under `zookeeper`, `etcd`, `redlock` and Sentinel.
    pub fn members(&self) -> Option<&Members> {
        self.members.as_ref()
    }

    /// [`members`](Self::members), to kill and restart one.
    pub fn members_mut(&mut self) -> Option<&mut Members> {
        self.members.as_mut()
    }

    /// Restart Redis empty, on the same port: the soak's one Redis, or behind Sentinel the
    /// primary (before the Sentinels see it gone, so it stays the primary, and then until
    /// the set serves again). What was restarted.
    ///
    /// # Errors
    /// When it does not come back.
    pub fn restart_redis(&mut self) -> anyhow::Result<String> {
        // The restart blocks (it waits for the port); the load goes on on the other worker.
        tokio::task::block_in_place(|| match self.members.as_mut() {
            Some(members) if members.behind_sentinel() => {
                let (restarted, primary) = members.restart_primary_empty()?;
                Ok(if primary == restarted {
                    format!(
                        "the primary (Redis node {restarted}) restarted empty, still the primary, its replica resynchronised from it"
                    )
                } else {
                    format!(
                        "the primary (Redis node {restarted}) restarted empty, but the Sentinels failed over to node {primary} meanwhile, which kept the data"
                    )
                })
            }
            _ => {
                self.redis.restart()?;
                Ok("Redis restarted empty".to_owned())
            }
        })
    }

    /// Restart PostgreSQL (fast shutdown, then start), and wait until it accepts sessions.
    ///
    /// # Errors
    /// When it does not come back within 60 s.
    pub async fn restart_postgres(&mut self) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.postgres.restart())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match PgConnection::connect(&self.admin_url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(error) if Instant::now() > deadline => {
                    bail!("PostgreSQL did not accept sessions after its restart: {error}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The Patroni cluster, under the `ha` database (to fail it over).
    pub fn patroni_mut(&mut self) -> Option<&mut ::servers::PatroniCluster> {
        self.postgres.patroni_mut()
    }

    /// `pg_terminate_backend` every session of the app's database; how many were ended.
    ///
    /// # Errors
    /// When PostgreSQL cannot be asked.
    pub async fn terminate_backends(&self) -> anyhow::Result<i64> {
        let mut admin = PgConnection::connect(&self.admin_url).await?;
        let ended: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        .bind(&self.database)
        .fetch_one(&mut admin)
        .await?;
        let _ = admin.close().await;
        Ok(ended)
    }

    /// A connection, directly (not through a proxy), to the Redis that keeps the lock:
    /// the soak's Redis under `redis`, Redlock's master `member` under `redlock`; behind
    /// Sentinel the primary, or node `member` when it names one by number.
    ///
    /// # Errors
    /// When it cannot be reached.
    pub async fn lock_redis(
        &self,
        member: MemberPick,
    ) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let url = match (self.members.as_ref(), member) {
            (Some(members), MemberPick::Index(i)) => members
                .redis_url(i)
                .context("the lock's ensemble is not Redis")?,
            (Some(members), _) if members.behind_sentinel() => {
                let primary = members.pick(MemberPick::Leader)?;
                members.redis_url(primary).context("no such node")?
            }
            _ => self.redis_url.clone(),
        };
        Ok(redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?)
    }

    /// The instances that exited by themselves (not killed by the nemesis), with how.
    pub fn exited_by_themselves(&mut self) -> Vec<String> {
        let mut exits = Vec::new();
        for (slot, s) in self.slots.iter_mut().enumerate() {
            if let Some(status) = s.instance.exited_by_itself() {
                exits.push(format!(
                    "instance {slot} exited by itself ({status}); log: {}",
                    s.instance.log.display()
                ));
            }
        }
        // An instance the nemesis replaced may have died by itself before it was killed.
        for old in &mut self.retired {
            if let Some(status) = old.exited_by_itself() {
                exits.push(format!(
                    "a replaced instance had exited by itself ({status}); log: {}",
                    old.log.display()
                ));
            }
        }
        exits
    }

    /// Keep every instance's log (the soak failed); their paths.
    pub fn keep_logs(&mut self) -> Vec<PathBuf> {
        let mut logs = Vec::new();
        for instance in self
            .retired
            .iter_mut()
            .chain(self.slots.iter_mut().map(|s| &mut s.instance))
        {
            instance.keep_log();
            logs.push(instance.log.clone());
        }
        logs
    }
}

/// The host and port of a server's URL.
fn socket_addr(url: &str) -> anyhow::Result<SocketAddr> {
    let url = Url::parse(url)?;
    let host = url.host_str().context("a server URL without a host")?;
    let port = url.port().context("a server URL without a port")?;
    format!("{host}:{port}")
        .parse()
        .with_context(|| format!("{host}:{port} is not an address"))
}
