//! Test support shared by the workspace's tests (a dev-dependency only).
//!
//! - [`RedisServer`]: a private `redis-server` on a free port, for tests that kill, pause or
//!   restart Redis. It is stopped by the pid it was started with, never by name.
//! - [`RedisCluster`]: a real Redis Cluster of private nodes, joined with `redis-cli`.
//! - [`RedisSentinels`]: Redis as production runs it: a primary, replicas and three
//!   Sentinels (`redis-server --sentinel`) that fail over to a replica.
//! - [`unique_prefix`]: a key prefix no other test or run uses, for tests on the shared Redis,
//!   and [`PrefixCleanup`], which deletes what a test left under it.
//! - [`free_port`].

pub mod etcd;
pub mod proxy;
pub mod zookeeper;

pub use etcd::{EtcdCluster, EtcdServer};
pub use proxy::TcpProxy;
pub use zookeeper::{ZooKeeperEnsemble, ZooKeeperServer};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A key prefix unique to one test run: `<label>:<random>:`.
pub fn unique_prefix(label: &str) -> String {
    format!("test:{label}:{}:", hex::encode(rand::random::<[u8; 6]>()))
}

/// Deletes every key a test left under its prefix in a Redis when dropped: lock fence
/// counters have no TTL by design, so without this each run would leave a few behind.
/// Keys are found with `SCAN`, both `<prefix>*` and `{<prefix>*` (a lock's fence key wraps
/// the lock key in a hash tag).
pub struct PrefixCleanup {
    url: String,
    prefix: String,
}

impl PrefixCleanup {
    /// Clean `prefix` in the Redis at `url` when dropped. An empty prefix cleans nothing.
    pub fn new(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }

    fn clean(&self) -> redis::RedisResult<()> {
        let mut conn = redis::Client::open(self.url.as_str())?.get_connection()?;
        for pattern in [format!("{}*", self.prefix), format!("{{{}*", self.prefix)] {
            let keys: Vec<String> = redis::cmd("SCAN")
                .cursor_arg(0)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .clone()
                .iter(&mut conn)?
                .collect::<redis::RedisResult<_>>()?;
            for chunk in keys.chunks(500) {
                redis::cmd("DEL").arg(chunk).exec(&mut conn)?;
            }
        }
        Ok(())
    }
}

impl Drop for PrefixCleanup {
    fn drop(&mut self) {
        if self.prefix.is_empty() {
            return;
        }
        if let Err(error) = self.clean() {
            eprintln!("could not clean keys under {:?}: {error}", self.prefix);
        }
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A private `redis-server` (no persistence) on a port of its own, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    /// Start one on a free port and wait until it accepts connections. A port taken by
    /// another process between the pick and the bind costs a retry on a new port.
    pub fn start() -> Self {
        for _ in 0..ATTEMPTS {
            let port = free_port();
            if let Some(child) = spawn_redis(port, &[]) {
                return Self {
                    child: Some(child),
                    port,
                };
            }
        }
        panic!("redis-server did not start on any of {ATTEMPTS} free ports");
    }

    /// Start one on a free port with `extra` arguments (`--replicaof host port`, say).
    pub fn start_with(extra: &[String]) -> Self {
        for _ in 0..ATTEMPTS {
            let port = free_port();
            if let Some(child) = spawn_redis(port, extra) {
                return Self {
                    child: Some(child),
                    port,
                };
            }
        }
        panic!("redis-server did not start on any of {ATTEMPTS} free ports");
    }

    /// The pid of the running server.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Start one on `port` (to restart a killed server where its clients expect it).
    pub fn start_on(port: u16) -> Self {
        for _ in 0..ATTEMPTS {
            if let Some(child) = spawn_redis(port, &[]) {
                return Self {
                    child: Some(child),
                    port,
                };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not start on port {port}: is it taken?");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Send a signal (`-STOP`, `-CONT`, ...) to the server, by its pid.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill on the PATH");
        assert!(status.success(), "kill {signal} {}", child.id());
    }

    /// SIGKILL the server (its data is gone: it keeps nothing on disk) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill it and start an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        *self = Self::start_on(self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends the server even while a test has it stopped (SIGSTOP).
        self.kill();
    }
}

/// A real Redis Cluster of `n` masters (no replicas) on free ports, joined with
/// `redis-cli --cluster create`; every node is killed by its pid when dropped, and its
/// working directory removed.
pub struct RedisCluster {
    nodes: Vec<Child>,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub fn start(n: usize) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "redis-cluster-{}",
            unique_prefix("c").replace(':', "-")
        ));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let mut cluster = Self {
            nodes: Vec::new(),
            ports: Vec::new(),
            dir,
        };
        while cluster.nodes.len() < n {
            // The bus port is given explicitly: the default (port + 10,000) is refused
            // above port 55535 ("Redis port number too high"), and may be taken.
            let started = (0..ATTEMPTS).find_map(|_| {
                let (port, bus) = (free_port(), free_port());
                spawn_redis(port, &cluster_args(Some(bus), &cluster.dir, port))
                    .map(|child| (child, port))
            });
            let (child, port) = started.expect("a cluster node on a free port");
            cluster.nodes.push(child);
            cluster.ports.push(port);
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli on the PATH");
        assert!(created.success(), "redis-cli --cluster create failed");
        cluster.wait_ok();
        cluster
    }

    /// `redis://127.0.0.1:<port>` for every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// Wait until every node reports `cluster_state:ok`.
    fn wait_ok(&self) {
        for _ in 0..400 {
            let all_ok = self.ports.iter().all(|port| {
                Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .map(|out| String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
            if all_ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not reach cluster_state:ok");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
        let dir = std::env::temp_dir().join(format!(
            "redis-sentinels-{}",
            unique_prefix("s").replace(':', "-")
        ));
        std::fs::create_dir_all(&dir).expect("a temp dir");
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
        for (child, _) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
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

/// How many ports a server start tries before giving up.
const ATTEMPTS: usize = 5;

/// Start `redis-server` on `port` with `extra` arguments, and wait until the server that
/// answers there is this child (its `process_id`), not some other process that took the
/// port first. `None`: it exited (the port was taken), or never answered and was killed.
fn spawn_redis(port: u16, extra: &[String]) -> Option<Child> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH");
    answering(child, port)
}

/// `child`, once the server that answers on `port` is it (its `process_id`), not some other
/// process that took the port first; `None` if it exited (the port was taken), or never
/// answered and was killed.
fn answering(mut child: Child, port: u16) -> Option<Child> {
    let ours = format!("process_id:{}", child.id());
    for _ in 0..400 {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if server_info(port).is_some_and(|info| info.contains(&ours)) {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// `INFO server` from whatever answers on `port`, within a second; `None` if nothing does.
fn server_info(port: u16) -> Option<String> {
    server_info_section(port, "server")
}

/// `INFO <section>` from whatever answers on `port`, within a second.
pub fn server_info_section(port: u16, section: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .write_all(format!("INFO {section}\r\n").as_bytes())
        .ok()?;
    let mut reply = Vec::new();
    let mut buffer = [0; 4096];
    // A bulk string: `$<len>\r\n<len bytes>\r\n`. Read until all of it is here.
    loop {
        let read = stream.read(&mut buffer).ok()?;
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&reply);
        if let Some((header, body)) = text.strip_prefix('$').and_then(|t| t.split_once("\r\n")) {
            if body.len() >= header.parse::<usize>().ok()? {
                return Some(body.to_owned());
            }
        } else if !text.starts_with('$') {
            return None;
        }
    }
    None
}

/// The arguments of cluster node `port` keeping its files in `dir`, with its bus port
/// `bus` (`None`: redis-server's default, port + 10,000).
fn cluster_args(bus: Option<u16>, dir: &std::path::Path, port: u16) -> Vec<String> {
    let mut args = vec!["--cluster-enabled".to_owned(), "yes".to_owned()];
    if let Some(bus) = bus {
        args.extend(["--cluster-port".to_owned(), bus.to_string()]);
    }
    args.extend([
        "--cluster-config-file".to_owned(),
        format!("nodes-{port}.conf"),
        "--dir".to_owned(),
        dir.to_str().expect("a UTF-8 temp dir").to_owned(),
    ]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free port above 55535, where a cluster node's default bus port (port + 10,000)
    /// does not exist.
    fn free_high_port() -> u16 {
        (55_600..65_000)
            .step_by(7)
            .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
            .expect("a free port above 55535")
    }

    #[test]
    fn a_cluster_node_above_port_55535_needs_its_bus_port_given() {
        let dir = std::env::temp_dir().join(unique_prefix("high").replace(':', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_high_port();
        if let Some(mut node) = spawn_redis(port, &cluster_args(None, &dir, port)) {
            let _ = node.kill();
            let _ = node.wait();
            panic!("redis-server started a cluster node on {port} with the default bus port");
        }
        let mut node = spawn_redis(port, &cluster_args(Some(free_port()), &dir, port))
            .expect("a cluster node with an explicit bus port");
        node.kill().unwrap();
        node.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_server_is_not_taken_for_ready_when_another_process_holds_its_port() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        if let Some(mut server) = spawn_redis(port, &[]) {
            let _ = server.kill();
            let _ = server.wait();
            panic!("a redis-server on a taken port was taken for ready");
        }
        drop(taken);
        let server = RedisServer::start();
        assert_ne!(server.port(), 0);
    }
}
