//! [`RedisServer`]: a private `redis-server` on a free port, keeping nothing on disk, for
//! tests that kill, pause or restart Redis and for programs that need a Redis of their own;
//! and [`RedisCluster`], a real Redis Cluster of private nodes joined with `redis-cli`.
//!
//! Assumes `redis-server` (and, for a cluster, `redis-cli`) on the PATH. What answers on the
//! port is taken to be ours only when its `INFO server` gives our child's `process_id`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{Tie, find, reap, send_signal, temp_dir};
use crate::tls::ServerCertificate;
use crate::{ATTEMPTS, Error, Result, free_port};

/// A private `redis-server` (no persistence) on a port of its own, killed by its pid when
/// dropped.
pub struct RedisServer {
    /// `None` while killed.
    child: Option<Child>,
    port: u16,
    /// How it was started: a restart starts it the same way.
    binary: PathBuf,
    extra: Vec<String>,
    tie: Tie,
    /// Started with [`start_tls`](Self::start_tls): its TLS port, and the directory that
    /// holds its certificate (removed when dropped).
    tls: Option<(u16, PathBuf)>,
}

impl RedisServer {
    /// Start one on a free port and wait until it accepts connections. A port taken by
    /// another process between the pick and the bind costs a retry on a new port.
    ///
    /// # Panics
    /// If `redis-server` is not installed or does not start.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start one on a free port with `extra` arguments (`--replicaof host port`, say).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with(extra: &[String]) -> Self {
        Self::try_start_with(extra, Tie::Child).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start), tied to this process as `tie` says.
    ///
    /// # Errors
    /// `redis-server` is not installed, or does not start on any of a few free ports.
    pub fn try_start(tie: Tie) -> Result<Self> {
        Self::try_start_with(&[], tie)
    }

    /// Start one that also takes TLS connections on a port of its own
    /// ([`tls_url`](Self::tls_url)), presenting `certificate`; clients need no certificate
    /// of their own. Its plain port stays open, for the checks that it is up.
    ///
    /// # Panics
    /// As [`start`](Self::start), or the certificate cannot be written.
    pub fn start_tls(certificate: &ServerCertificate) -> Self {
        let started = temp_dir("redis-tls").and_then(|dir| {
            let (cert, key) = certificate.write_to(&dir, None).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&dir);
            })?;
            let mut last = None;
            // A TLS port taken in between ends the server at once: try again on a new one.
            for _ in 0..ATTEMPTS {
                let tls_port = free_port();
                let extra = [
                    "--tls-port".to_owned(),
                    tls_port.to_string(),
                    "--tls-cert-file".to_owned(),
                    cert.display().to_string(),
                    "--tls-key-file".to_owned(),
                    key.display().to_string(),
                    "--tls-auth-clients".to_owned(),
                    "no".to_owned(),
                ];
                match Self::try_start_with(&extra, Tie::Child) {
                    Ok(mut server) => {
                        server.tls = Some((tls_port, dir));
                        return Ok(server);
                    }
                    Err(error) => last = Some(error),
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            Err(last.expect("at least one attempt"))
        });
        started.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start_with`](Self::start_with), tied to this process as `tie` says.
    pub(crate) fn try_start_with(extra: &[String], tie: Tie) -> Result<Self> {
        let mut server = Self {
            child: None,
            port: 0,
            binary: binary()?,
            extra: extra.to_vec(),
            tie,
            tls: None,
        };
        for _ in 0..ATTEMPTS {
            server.port = free_port();
            server.child = server.spawn()?;
            if server.child.is_some() {
                return Ok(server);
            }
        }
        Err(Error::NotServing(format!(
            "redis-server did not start on any of {ATTEMPTS} free ports"
        )))
    }

    /// Start one on `port` (to restart a killed server where its clients expect it).
    ///
    /// # Panics
    /// If it does not start there (the port is taken).
    pub fn start_on(port: u16) -> Self {
        let mut server = Self {
            child: None,
            port,
            binary: binary().unwrap_or_else(|e| panic!("{e}")),
            extra: Vec::new(),
            tie: Tie::Child,
            tls: None,
        };
        server.restart_empty();
        server
    }

    /// Start `redis-server` on this server's port, `None` if it did not come up there.
    fn spawn(&self) -> Result<Option<Child>> {
        launch(&self.binary, self.port, &self.extra, self.tie)
    }

    /// The pid of the running server.
    ///
    /// # Panics
    /// If it was killed and not restarted.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether it runs (it was not [`kill`](Self::kill)ed, or was started again).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<its TLS port>`.
    ///
    /// # Panics
    /// If it was not started with [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// Send a signal (`-STOP`, `-CONT`, ...) to the server, by its pid.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }

    /// SIGKILL the server (its data is gone: it keeps nothing on disk) and reap it.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            reap(child);
        }
    }

    /// Kill it and start an empty one on the same port, the same way (a snapshot in its
    /// `--dir`, one it received as a replica, is deleted first).
    ///
    /// # Panics
    /// If it does not start there.
    pub fn restart_empty(&mut self) {
        self.try_restart_empty().unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`restart_empty`](Self::restart_empty).
    ///
    /// # Errors
    /// It does not start again on its port within a few tries (another process took it).
    pub fn try_restart_empty(&mut self) -> Result<()> {
        self.kill();
        // Empty: a snapshot in its directory (one it received as a replica) is not loaded.
        if let Some(dir) = self.extra.iter().skip_while(|arg| *arg != "--dir").nth(1) {
            let _ = std::fs::remove_file(Path::new(dir).join("dump.rdb"));
        }
        // The old server's socket may linger a moment after it exited: try a few times.
        for _ in 0..ATTEMPTS {
            self.child = self.spawn()?;
            if self.child.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(Error::NotServing(format!(
            "redis-server did not start on port {}: is it taken?",
            self.port
        )))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends the server even while a test has it stopped (SIGSTOP).
        self.kill();
        if let Some((_, dir)) = &self.tls {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A real Redis Cluster of `n` masters (no replicas) on free ports, joined with
/// `redis-cli --cluster create`; every node is killed by its pid when dropped, and its
/// working directory removed.
pub struct RedisCluster {
    nodes: Vec<Child>,
    ports: Vec<u16>,
    dir: PathBuf,
}

impl RedisCluster {
    /// # Panics
    /// If a node does not start, or the cluster does not form.
    pub fn start(n: usize) -> Self {
        let mut cluster = Self {
            nodes: Vec::new(),
            ports: Vec::new(),
            dir: temp_dir("redis-cluster").unwrap_or_else(|e| panic!("{e}")),
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
        for child in self.nodes.drain(..) {
            reap(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `redis-server` is.
fn binary() -> Result<PathBuf> {
    find(&["redis-server"], &[]).ok_or_else(|| {
        Error::NotInstalled(
            "redis-server is not installed (not on the PATH): install Redis (Debian: apt-get \
             install redis-server)"
                .into(),
        )
    })
}

/// Start `binary` (a `redis-server`) on `port`, keeping nothing on disk, with `extra`
/// arguments, and wait until the server that answers there is it; `None` if it exited (the
/// port was taken), or never answered and was killed.
fn launch(binary: &Path, port: u16, extra: &[String], tie: Tie) -> Result<Option<Child>> {
    let mut command = Command::new(binary);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    tie.apply(&mut command);
    let child = command
        .spawn()
        .map_err(crate::io("starting redis-server"))?;
    Ok(answering(child, port))
}

/// [`launch`] a plain child `redis-server` from the PATH.
///
/// # Panics
/// If `redis-server` is not on the PATH.
fn spawn_redis(port: u16, extra: &[String]) -> Option<Child> {
    launch(Path::new("redis-server"), port, extra, Tie::Child).unwrap_or_else(|e| panic!("{e}"))
}

/// Delete every key of `prefix` in the Redis at `url`: `<prefix>*`, and `{<prefix>*` (a
/// lock's fence key wraps the lock key in a hash tag). Found with `SCAN`, deleted in chunks.
///
/// # Errors
/// Redis unreachable, or a command failed.
pub fn forget_prefix(url: &str, prefix: &str) -> redis::RedisResult<()> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    for pattern in [format!("{prefix}*"), format!("{{{prefix}*")] {
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

/// `child`, once the server that answers on `port` is it (its `process_id`), not some other
/// process that took the port first; `None` if it exited (the port was taken), or never
/// answered within 10 s and was killed.
pub(crate) fn answering(mut child: Child, port: u16) -> Option<Child> {
    let ours = format!("process_id:{}", child.id());
    for _ in 0..400 {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if server_info_section(port, "server")
            .is_some_and(|info| info.lines().any(|line| line.trim_end() == ours))
        {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    reap(child);
    None
}

/// `INFO <section>` from whatever answers on `port`, within a second; `None` if nothing
/// does.
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
fn cluster_args(bus: Option<u16>, dir: &Path, port: u16) -> Vec<String> {
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
    use std::net::TcpListener;

    /// A free port above 55535, where a cluster node's default bus port (port + 10,000)
    /// does not exist.
    fn free_high_port() -> u16 {
        (55_600..65_000)
            .step_by(7)
            .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
            .expect("a free port above 55535")
    }

    /// redis-server refuses a cluster node above port 55535 with the default bus port
    /// (port + 10,000), so the cluster gives each node its bus port.
    #[test]
    fn a_cluster_node_above_port_55535_needs_its_bus_port_given() {
        let dir = temp_dir("high").unwrap();
        let port = free_high_port();
        if let Some(node) = spawn_redis(port, &cluster_args(None, &dir, port)) {
            reap(node);
            panic!("redis-server started a cluster node on {port} with the default bus port");
        }
        let mut node = spawn_redis(port, &cluster_args(Some(free_port()), &dir, port))
            .expect("a cluster node with an explicit bus port");
        node.kill().unwrap();
        node.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A redis-server that could not bind its port is not taken for the other process that
    /// answers there.
    #[test]
    fn a_server_is_not_ready_while_another_process_holds_its_port() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        if let Some(server) = spawn_redis(port, &[]) {
            reap(server);
            panic!("a redis-server on a taken port was taken for ready");
        }
        drop(taken);
        let server = RedisServer::start();
        assert_ne!(server.port(), 0);
    }

    #[test]
    fn a_server_restarted_empty_does_not_load_a_snapshot_left_in_its_directory() {
        // Arrange: a server with a directory of its own, where a snapshot holding a key is
        // left (as a Sentinel set's replica keeps the one it received).
        let dir = crate::process::temp_dir("redis-restart").unwrap();
        let args = ["--dir".to_owned(), dir.display().to_string()];
        let mut server = RedisServer::try_start_with(&args, Tie::Child).unwrap();
        let mut conn = redis::Client::open(server.url())
            .and_then(|client| client.get_connection())
            .unwrap();
        redis::cmd("SET").arg("k").arg("v").exec(&mut conn).unwrap();
        redis::cmd("SAVE").exec(&mut conn).unwrap();
        assert!(dir.join("dump.rdb").exists());

        // Act
        server.try_restart_empty().unwrap();

        // Assert: it came back with nothing.
        let keys: i64 = redis::Client::open(server.url())
            .and_then(|client| client.get_connection())
            .and_then(|mut conn| redis::cmd("DBSIZE").query(&mut conn))
            .unwrap();
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(keys, 0, "the restarted server loaded the snapshot");
    }
}
