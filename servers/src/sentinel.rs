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

use crate::process::{reap, temp_dir};
use crate::redis::{RedisServer, answering, server_info_section};
use crate::{ATTEMPTS, free_port};

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
        let dir = temp_dir("redis-sentinels").unwrap_or_else(|e| panic!("{e}"));
        // Each node keeps its files (a replica's received snapshot) in a directory of
        // its own, not in the test's working directory.
        let node_dir = |i: usize| {
            let d = dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&d).expect("a temp dir");
            d.to_str().expect("a UTF-8 temp dir").to_owned()
        };
        let primary = RedisServer::start_with(&["--dir".into(), node_dir(0)]);
        let mut nodes = vec![primary];
        for i in 0..replicas {
            let of = nodes[0].port().to_string();
            nodes.push(RedisServer::start_with(&[
                "--dir".into(),
                node_dir(i + 1),
                "--replicaof".into(),
                "127.0.0.1".into(),
                of,
            ]));
        }
        let mut set = Self {
            nodes,
            sentinels: Vec::new(),
            dir,
        };
        set.wait_until_replicas_synced(Duration::from_secs(20));
        for i in 0..3 {
            let child = (0..ATTEMPTS)
                .find_map(|_| {
                    let port = free_port();
                    spawn_sentinel(&set.dir, i, port, set.nodes[0].port(), down_after)
                        .map(|c| (c, port))
                })
                .expect("a Sentinel on a free port");
            set.sentinels.push(child);
        }
        set.wait_until_sentinels_know(replicas, Duration::from_secs(20));
        set
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

    /// The port of the node the Sentinels name as primary now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .find_map(|(_, port)| master_by_sentinel(*port))
    }

    /// The index in [`nodes`](Self::nodes) of the primary the Sentinels name now.
    pub fn primary(&self) -> usize {
        let port = self.primary_port().expect("a Sentinel names a primary");
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("the primary is one of ours")
    }

    /// Wait until every Sentinel names a primary other than the node on `old_port`, and
    /// that node answers as a master; the index of the new primary.
    pub fn wait_for_failover_from(&self, old_port: u16, within: Duration) -> usize {
        let deadline = std::time::Instant::now() + within;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|(_, port)| master_by_sentinel(*port))
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old_port
                && named.iter().all(|n| *n == Some(*new))
                && server_info_section(*new, "replication")
                    .is_some_and(|info| info.contains("role:master"))
            {
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == *new)
                    .expect("the new primary is one of ours");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no failover from port {old_port} within {within:?}: Sentinels name {named:?}\n{}",
                self.sentinel_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
    pub fn wait_until_replicas_synced(&self, within: Duration) {
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
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the replicas did not sync within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Make replica `replica` (an index into [`nodes`](Self::nodes)) miss the writes that
    /// come next, deterministically: SIGSTOP it, then fill the replication link with 40 MiB
    /// of junk (keys `testkit:junk:*`) so that the next writes stay in the primary's output
    /// buffer, behind the junk, instead of in the stopped replica's socket. If the primary
    /// dies now, those writes die with it. [`resume`](Self::resume) the replica after.
    pub fn stall_replication(&self, replica: usize) {
        self.nodes[replica].signal("-STOP");
        let primary = self.nodes[self.primary()].port();
        let mut stream = TcpStream::connect(("127.0.0.1", primary)).expect("the primary answers");
        let value = vec![b'x'; 1 << 20];
        for i in 0..40 {
            let mut command = format!(
                "*3\r\n$3\r\nSET\r\n$16\r\ntestkit:junk:{i:03}\r\n${}\r\n",
                value.len()
            )
            .into_bytes();
            command.extend_from_slice(&value);
            command.extend_from_slice(b"\r\n");
            stream
                .write_all(&command)
                .expect("the primary takes the junk");
            let mut reply = [0; 5];
            stream
                .read_exact(&mut reply)
                .expect("the primary answers +OK");
        }
    }

    /// SIGCONT a replica stopped by [`stall_replication`](Self::stall_replication).
    pub fn resume(&self, replica: usize) {
        self.nodes[replica].signal("-CONT");
    }

    /// Wait until each Sentinel knows `replicas` replicas and the two other Sentinels.
    fn wait_until_sentinels_know(&self, replicas: usize, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let ok = self.sentinels.iter().all(|(_, port)| {
                sentinel_master_info(*port).is_some_and(|fields| {
                    field(&fields, "num-slaves") == Some(replicas.to_string())
                        && field(&fields, "num-other-sentinels") == Some("2".into())
                })
            });
            if ok {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the Sentinels did not learn of each other and the replicas within {within:?}"
            );
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

/// Start Sentinel number `i` on `port`, watching the primary on `primary` and failing it over
/// after `down_after` without an answer, with its (rewritable) configuration in `dir`; `None`
/// if it did not come up.
fn spawn_sentinel(
    dir: &std::path::Path,
    i: usize,
    port: u16,
    primary: u16,
    down_after: Duration,
) -> Option<Child> {
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
    .expect("a Sentinel configuration file");
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH");
    answering(child, port)
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
