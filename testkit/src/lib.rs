//! Test support shared by the workspace's tests (a dev-dependency only).
//!
//! - [`RedisServer`]: a private `redis-server` on a free port, for tests that kill, pause or
//!   restart Redis. It is stopped by the pid it was started with, never by name.
//! - [`RedisCluster`]: a real Redis Cluster of private nodes, joined with `redis-cli`.
//! - [`unique_prefix`]: a key prefix no other test or run uses, for tests on the shared Redis,
//!   and [`PrefixCleanup`], which deletes what a test left under it.
//! - [`free_port`].

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

/// How many ports a server start tries before giving up.
const ATTEMPTS: usize = 5;

/// Start `redis-server` on `port` with `extra` arguments, and wait until the server that
/// answers there is this child (its `process_id`), not some other process that took the
/// port first. `None`: it exited (the port was taken), or never answered and was killed.
fn spawn_redis(port: u16, extra: &[String]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH");
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
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
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
