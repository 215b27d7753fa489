//! Test support shared by the workspace's tests (a dev-dependency only).
//!
//! - [`RedisServer`]: a private `redis-server` on a free port, for tests that kill, pause or
//!   restart Redis. It is stopped by the pid it was started with, never by name.
//! - [`RedisCluster`]: a real Redis Cluster of private nodes, joined with `redis-cli`.
//! - [`unique_prefix`]: a key prefix no other test or run uses, for tests on the shared Redis,
//!   and [`PrefixCleanup`], which deletes what a test left under it.
//! - [`free_port`].

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
    /// Start one on a free port and wait until it accepts connections.
    pub fn start() -> Self {
        Self::start_on(free_port())
    }

    /// Start one on `port` (to restart a killed server where its clients expect it).
    pub fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let server = Self {
            child: Some(child),
            port,
        };
        server.wait_ready();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        wait_for_port(self.port);
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
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        for &port in &ports {
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server on the PATH");
            nodes.push(child);
        }
        let cluster = Self { nodes, ports, dir };
        for &port in &cluster.ports {
            wait_for_port(port);
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

fn wait_for_port(port: u16) {
    for _ in 0..400 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("redis-server on port {port} did not start");
}
