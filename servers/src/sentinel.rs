//! [`RedisSentinels`]: Redis as production runs it, a primary, replicas and three
//! Sentinels (`redis-server --sentinel`) that fail over to a replica, all private processes
//! on free ports, for tests of failovers.
//!
//! Assumes `redis-server` on the PATH. The Sentinels are quick to act, and each node and
//! Sentinel keeps its files in a temporary directory of the set's, removed with it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{Tie, reap, temp_dir};
use crate::redis::{RedisServer, answering, server_info_section};
use crate::{ATTEMPTS, Error, Result, free_port};

/// Redis the way production runs it: one primary, `replicas` replicas, and three Sentinels
/// watching them under the master name [`RedisSentinels::MASTER`], all private processes on
/// free ports, killed by their pids when dropped.
///
/// The Sentinels are quick to act, for tests: a primary that does not answer for
/// [`RedisSentinels::DOWN_AFTER`] (or the time given to
/// [`start_with_down_after`](RedisSentinels::start_with_down_after)) is failed over.
pub struct RedisSentinels {
    /// The data nodes; which one is the primary changes with failovers ([`Self::primary`]).
    nodes: Vec<RedisServer>,
    sentinels: Vec<(Child, u16)>,
    dir: std::path::PathBuf,
}

impl RedisSentinels {
    /// The name the Sentinels monitor the primary under.
    pub const MASTER: &'static str = "seckill-test";
    /// How long a primary may not answer before the Sentinels fail it over, with
    /// [`start`](Self::start): short, for tests of failovers.
    pub const DOWN_AFTER: Duration = Duration::from_millis(1_000);

    /// Start a primary, `replicas` replicas (synchronised before this returns) and three
    /// Sentinels (each aware of every node before this returns), which fail a primary over
    /// once it has not answered for [`DOWN_AFTER`](Self::DOWN_AFTER).
    pub fn start(replicas: usize) -> Self {
        Self::start_with_down_after(replicas, Self::DOWN_AFTER)
    }

    /// [`start`](Self::start), with Sentinels that fail a primary over once it has not
    /// answered for `down_after`.
    ///
    /// TIMING: a primary on a busy machine can miss the Sentinels' pings for a second; tests
    /// that want no failover use a longer `down_after` than [`DOWN_AFTER`](Self::DOWN_AFTER),
    /// so that a slow moment is not taken for a dead primary.
    pub fn start_with_down_after(replicas: usize, down_after: Duration) -> Self {
        Self::try_start(replicas, down_after, Tie::Child).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start_with_down_after`](Self::start_with_down_after), every process tied to this
    /// one as `tie` says. Every node starts as a primary and the replicas are then told
    /// whom to follow (`REPLICAOF`), so a node restarted empty comes back as a primary.
    /// What the Sentinels then do with it:
    /// - a primary they have failed over from, or a replica, they turn into a replica of
    ///   the primary they name, but only some 8 s after they see it (until then it is an
    ///   empty primary that takes writes, and a replica in that state can even be elected
    ///   if the primary dies then): restart a node, then [`try_wait_until_serving`]
    ///   before the next fault;
    /// - a primary restarted before they failed over from it stays the primary, empty, and
    ///   its replicas resynchronise from it, losing everything: restart a primary after
    ///   [`try_wait_for_failover_from`] unless that loss is the point.
    ///
    /// [`try_wait_until_serving`]: Self::try_wait_until_serving
    /// [`try_wait_for_failover_from`]: Self::try_wait_for_failover_from
    ///
    /// # Errors
    /// `redis-server` is not installed, a node or a Sentinel does not start, or the set
    /// does not form (replicas synchronised, then Sentinels aware of each other, each
    /// within 20 s).
    pub fn try_start(replicas: usize, down_after: Duration, tie: Tie) -> Result<Self> {
        let mut set = Self {
            nodes: Vec::new(),
            sentinels: Vec::new(),
            dir: temp_dir("redis-sentinels")?,
        };
        for i in 0..=replicas {
            // Each node keeps its files in a directory of its own, not in the working
            // directory. A replica receives its primary's snapshot there, which
            // `try_restart_empty` deletes, so that a node restarted comes back empty. A
            // primary sends a snapshot at once, not after 5 s of waiting for more replicas
            // (`repl-diskless-sync-delay`).
            let dir = set.dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&dir).map_err(crate::io("creating a node's directory"))?;
            let args = [
                "--dir",
                &dir.display().to_string(),
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from);
            set.nodes.push(RedisServer::try_start_with(&args, tie)?);
        }
        let primary = set.nodes[0].port();
        for replica in &set.nodes[1..] {
            follow(replica.port(), primary)?;
        }
        set.try_wait_until_replicas_synced(Duration::from_secs(20))?;
        for i in 0..3 {
            let mut started = None;
            for _ in 0..ATTEMPTS {
                let port = free_port();
                if let Some(child) = spawn_sentinel(&set.dir, i, port, primary, down_after, tie)? {
                    started = Some((child, port));
                    break;
                }
            }
            let sentinel = started.ok_or_else(|| {
                Error::NotServing(format!(
                    "Sentinel {i} did not start on any of {ATTEMPTS} free ports"
                ))
            })?;
            set.sentinels.push(sentinel);
        }
        set.wait_until_sentinels_know(replicas, Duration::from_secs(20))?;
        Ok(set)
    }

    /// `redis://127.0.0.1:<port>` of every Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(_, port)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// Every data node, primary and replicas (in the order they were started).
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Data node `i` (an index into [`nodes`](Self::nodes)).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// How many data nodes there are (primary and replicas).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The port of the node the Sentinels name as primary now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .find_map(|(_, port)| master_by_sentinel(*port))
    }

    /// The index in [`nodes`](Self::nodes) of the primary the Sentinels name now.
    ///
    /// # Panics
    /// If no Sentinel answers with one of the nodes.
    pub fn primary(&self) -> usize {
        self.try_primary()
            .expect("a Sentinel names one of our nodes")
    }

    /// [`primary`](Self::primary), `None` if the first Sentinel that answers names no node
    /// of the set.
    pub fn try_primary(&self) -> Option<usize> {
        let port = self.primary_port()?;
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The index of the primary every Sentinel names, if they agree and it answers as a
    /// primary (a failover may still be under way: [`try_wait_until_serving`] waits for
    /// its end).
    ///
    /// [`try_wait_until_serving`]: Self::try_wait_until_serving
    pub fn try_agreed_primary(&self) -> Option<usize> {
        self.agreed_primary().1
    }

    /// Wait until the set serves: every Sentinel names the same primary, which answers as
    /// one, sees it up and is not failing it over (its flags are `master` alone, no
    /// `s_down`, `o_down` or `failover_in_progress`), and every other running node follows
    /// it with its link up (after a failover, the old primary turned into a replica; after
    /// a restart, the node resynchronised). The index of the primary. A node counts as running unless it was
    /// [`kill`](RedisServer::kill)ed through [`nodes`](Self::nodes): one stopped (SIGSTOP)
    /// or crashed makes this wait to its end.
    ///
    /// # Errors
    /// When it does not, `within`.
    pub fn try_wait_until_serving(&self, within: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let (named, agreed) = self.agreed_primary();
            let serving = agreed.filter(|&primary| {
                let settled = self.sentinels.iter().all(|(_, port)| {
                    sentinel_master_info(*port)
                        .is_some_and(|fields| field(&fields, "flags").as_deref() == Some("master"))
                });
                let port = self.nodes[primary].port();
                settled
                    && self
                        .nodes
                        .iter()
                        .enumerate()
                        .filter(|(i, node)| *i != primary && node.is_running())
                        .all(|(_, node)| {
                            server_info_section(node.port(), "replication").is_some_and(|info| {
                                info.contains("role:slave")
                                    && info.contains(&format!("master_port:{port}\r"))
                                    && info.contains("master_link_status:up")
                            })
                        })
            });
            if let Some(primary) = serving {
                return Ok(primary);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::NotServing(format!(
                    "the Sentinels' set did not serve within {within:?}: Sentinels name {named:?}\n{}",
                    self.sentinel_logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until every Sentinel names a primary other than the node on `old_port`, and
    /// that node answers as a master; the index of the new primary.
    ///
    /// # Panics
    /// If it does not happen `within`.
    pub fn wait_for_failover_from(&self, old_port: u16, within: Duration) -> usize {
        self.try_wait_for_failover_from(old_port, within)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`wait_for_failover_from`](Self::wait_for_failover_from).
    ///
    /// # Errors
    /// When it does not happen `within`.
    pub fn try_wait_for_failover_from(&self, old_port: u16, within: Duration) -> Result<usize> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let (named, agreed) = self.agreed_primary();
            if let Some(new) = agreed.filter(|&i| self.nodes[i].port() != old_port) {
                return Ok(new);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::NotServing(format!(
                    "no failover from port {old_port} within {within:?}: Sentinels name {named:?}\n{}",
                    self.sentinel_logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The primary port each Sentinel names (`None` for one that does not answer), and the
    /// node they all name if they agree and it answers as a primary.
    fn agreed_primary(&self) -> (Vec<Option<u16>>, Option<usize>) {
        let named: Vec<Option<u16>> = self
            .sentinels
            .iter()
            .map(|(_, port)| master_by_sentinel(*port))
            .collect();
        let agreed = match named.first() {
            Some(Some(port)) if named.iter().all(|n| n == &Some(*port)) => Some(*port),
            _ => None,
        };
        let primary = agreed
            .filter(|port| {
                server_info_section(*port, "replication")
                    .is_some_and(|info| info.contains("role:master"))
            })
            .and_then(|port| self.nodes.iter().position(|n| n.port() == port));
        (named, primary)
    }

    /// The last lines of every Sentinel's log, for a failure message.
    fn sentinel_logs(&self) -> String {
        (0..self.sentinels.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("sentinel-{i}.log")))
                    .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(25)..].join("\n");
                format!("--- sentinel {i} ---\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Wait until the first node (the primary at start) reports every replica connected
    /// and `online`.
    ///
    /// # Panics
    /// If they are not, `within`.
    pub fn wait_until_replicas_synced(&self, within: Duration) {
        self.try_wait_until_replicas_synced(within)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_wait_until_replicas_synced(&self, within: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + within;
        let primary = self.nodes[0].port();
        let replicas = self.nodes.len() - 1;
        loop {
            let ok = server_info_section(primary, "replication").is_some_and(|info| {
                info.contains(&format!("connected_slaves:{replicas}"))
                    && (0..replicas).all(|i| {
                        info.contains(&format!("slave{i}:")) && {
                            let line = info
                                .lines()
                                .find(|l| l.starts_with(&format!("slave{i}:")))
                                .unwrap_or_default();
                            line.contains("state=online")
                        }
                    })
            });
            if ok {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::NotServing(format!(
                    "the replicas did not sync within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Make replica `replica` (an index into [`nodes`](Self::nodes)) miss the writes that
    /// come next, deterministically: SIGSTOP it, then fill the replication link with 40 MiB
    /// of junk (keys `testkit:junk:*`) so that the next writes stay in the primary's output
    /// buffer, behind the junk, instead of in the stopped replica's socket. If the primary
    /// dies now, those writes die with it. [`resume`](Self::resume) the replica after.
    ///
    /// # Panics
    /// If the primary cannot be found or does not take the junk.
    pub fn stall_replication(&self, replica: usize) {
        self.try_stall_replication(replica)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`stall_replication`](Self::stall_replication).
    ///
    /// # Errors
    /// When the first Sentinel that answers names no node of the set (the replica is not
    /// stopped), or the primary does not take the junk (the replica is left stopped:
    /// [`resume`](Self::resume) it).
    pub fn try_stall_replication(&self, replica: usize) -> Result<()> {
        let primary = self.try_primary().ok_or_else(|| {
            Error::NotServing("the Sentinels name no node of the set as primary".into())
        })?;
        let primary = self.nodes[primary].port();
        self.nodes[replica].signal("-STOP");
        let junk = crate::io("filling the replication link with junk");
        let mut stream = TcpStream::connect(("127.0.0.1", primary)).map_err(junk)?;
        // A primary that stalls too fails this, instead of blocking with the replica stopped.
        let stalled = Some(Duration::from_secs(10));
        stream
            .set_read_timeout(stalled)
            .and_then(|()| stream.set_write_timeout(stalled))
            .map_err(crate::io("filling the replication link with junk"))?;
        let value = vec![b'x'; 1 << 20];
        for i in 0..40 {
            let mut command = format!(
                "*3\r\n$3\r\nSET\r\n$16\r\ntestkit:junk:{i:03}\r\n${}\r\n",
                value.len()
            )
            .into_bytes();
            command.extend_from_slice(&value);
            command.extend_from_slice(b"\r\n");
            let mut reply = [0; 5];
            stream
                .write_all(&command)
                .and_then(|()| stream.read_exact(&mut reply))
                .map_err(crate::io("filling the replication link with junk"))?;
        }
        Ok(())
    }

    /// SIGCONT a replica stopped by [`stall_replication`](Self::stall_replication).
    pub fn resume(&self, replica: usize) {
        self.nodes[replica].signal("-CONT");
    }

    /// Wait until each Sentinel knows `replicas` replicas and the two other Sentinels.
    fn wait_until_sentinels_know(&self, replicas: usize, within: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let ok = self.sentinels.iter().all(|(_, port)| {
                sentinel_master_info(*port).is_some_and(|fields| {
                    field(&fields, "num-slaves") == Some(replicas.to_string())
                        && field(&fields, "num-other-sentinels") == Some("2".into())
                })
            });
            if ok {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::NotServing(format!(
                    "the Sentinels did not learn of each other and the replicas within {within:?}\n{}",
                    self.sentinel_logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for (child, _) in self.sentinels.drain(..) {
            reap(child);
        }
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Make the node on `replica` follow the one on `primary` (`REPLICAOF`).
fn follow(replica: u16, primary: u16) -> Result<()> {
    let failed = |e: redis::RedisError| {
        Error::NotServing(format!(
            "the node on port {replica} did not take REPLICAOF: {e}"
        ))
    };
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{replica}"))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
        .map_err(failed)?;
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary)
        .exec(&mut conn)
        .map_err(failed)
}

/// Start Sentinel number `i` on `port`, tied as `tie` says, watching the primary on
/// `primary` and failing it over after `down_after` without an answer, with its
/// (rewritable) configuration in `dir`; `None` if it did not come up.
fn spawn_sentinel(
    dir: &std::path::Path,
    i: usize,
    port: u16,
    primary: u16,
    down_after: Duration,
    tie: Tie,
) -> Result<Option<Child>> {
    let conf = dir.join(format!("sentinel-{i}.conf"));
    let name = RedisSentinels::MASTER;
    let down = down_after.as_millis();
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {name} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} 3000\n\
             sentinel parallel-syncs {name} 1\n\
             logfile {log}\n",
            dir = dir.display(),
            log = dir.join(format!("sentinel-{i}.log")).display()
        ),
    )
    .map_err(crate::io("writing a Sentinel's configuration"))?;
    let mut command = Command::new("redis-server");
    command
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    tie.apply(&mut command);
    let child = command
        .spawn()
        .map_err(crate::io("starting redis-server --sentinel"))?;
    Ok(answering(child, port))
}

/// The port of the primary the Sentinel on `port` names (`SENTINEL get-master-addr-by-name`).
fn master_by_sentinel(port: u16) -> Option<u16> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    let (_, master_port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(RedisSentinels::MASTER)
        .query(&mut conn)
        .ok()?;
    Some(master_port)
}

/// `SENTINEL master <name>` of the Sentinel on `port`, as its field/value pairs.
fn sentinel_master_info(port: u16) -> Option<Vec<(String, String)>> {
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    let flat: Vec<String> = redis::cmd("SENTINEL")
        .arg("master")
        .arg(RedisSentinels::MASTER)
        .query(&mut conn)
        .ok()?;
    Some(
        flat.chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
    )
}

fn field(fields: &[(String, String)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}
