//! Private etcd servers: [`EtcdServer`] (one member) and [`EtcdCluster`] (members joined by
//! a static `--initial-cluster`), each on free client and peer ports with its data in a temp
//! dir, killed by its pid when dropped.
//!
//! Assumes `etcd` on the PATH (Debian's `etcd-server`). Every member
//! keeps etcd's defaults (its log synced to disk, 100 ms heartbeats, 1 s elections). What
//! answers on a client port is taken to be a member only when the member list it gives
//! names the member, a name unique to the cluster.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Tie, find, log_tail, reap, send_signal, temp_dir};
use crate::tls::ServerCertificate;
use crate::{ATTEMPTS, Error, Result, distinct_free_ports};

const INSTALL_ETCD: &str = "install it (Debian: apt-get install etcd-server)";

/// How long a start (or restart) may take until every member is healthy.
///
/// TIMING: etcd starts in well under a second; a cluster then elects a leader within a few
/// of its election timeouts (1 s, etcd's default). A busy 2-core machine can take several
/// times that.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// One private etcd server (a one-member cluster) on a free port, with its data in a temp
/// dir: it survives [`kill`](Self::kill) and [`restart`](Self::restart). Killed by its pid
/// and its dir removed when dropped.
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Start one and wait until `GET /health` says it is healthy.
    ///
    /// # Panics
    /// If etcd is not installed (`apt-get install etcd-server`), or is not healthy within a
    /// minute (the panic carries the tail of its log).
    pub fn start() -> Self {
        Self {
            cluster: EtcdCluster::start(1),
        }
    }

    /// [`start`](Self::start), tied to this process as `tie` says.
    ///
    /// # Errors
    /// etcd not installed (the message says what to install); or it is not healthy within a
    /// minute (the message carries the end of its log).
    pub fn try_start(tie: Tie) -> Result<Self> {
        let cluster = EtcdCluster::try_start_on(1, tie, None, distinct_free_ports)?;
        Ok(Self { cluster })
    }

    /// [`start`](Self::start) one that also takes TLS connections on a client port of its
    /// own ([`tls_endpoint`](Self::tls_endpoint)), presenting `certificate`; clients need
    /// no certificate of their own. Its plain port stays open, for the checks that it is up.
    ///
    /// # Panics
    /// As [`start`](Self::start), or the certificate cannot be written.
    pub fn start_tls(certificate: &ServerCertificate) -> Self {
        let cluster =
            EtcdCluster::try_start_on(1, Tie::Child, Some(certificate), distinct_free_ports);
        Self {
            cluster: cluster.unwrap_or_else(|e| panic!("{e}")),
        }
    }

    /// `https://127.0.0.1:<its TLS port>`.
    ///
    /// # Panics
    /// If it was not started with [`start_tls`](Self::start_tls).
    pub fn tls_endpoint(&self) -> String {
        let port = self.cluster.members[0].tls_port;
        format!(
            "https://127.0.0.1:{}",
            port.expect("started with start_tls")
        )
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.cluster.members[0].client_port
    }

    /// `http://127.0.0.1:<port>`, for an etcd client.
    pub fn endpoint(&self) -> String {
        self.cluster.endpoint(0)
    }

    /// The pid of the running server.
    ///
    /// # Panics
    /// If it was killed and not restarted.
    pub fn pid(&self) -> u32 {
        self.cluster.pid(0)
    }

    /// Send a signal (`-STOP`, `-CONT`, ...) to the server, by its pid.
    pub fn signal(&self, signal: &str) {
        self.cluster.signal(0, signal);
    }

    /// SIGKILL the server and reap it; its data stays on disk for [`restart`](Self::restart).
    pub fn kill(&mut self) {
        self.cluster.kill(0);
    }

    /// Kill the server if it runs, start it again on the same ports with the same data, and
    /// wait until it is healthy.
    pub fn restart(&mut self) {
        self.cluster.restart(0);
    }

    /// Whether `GET /health` says it is healthy now.
    pub fn is_healthy(&self) -> bool {
        self.cluster.is_healthy(0)
    }
}

/// A real etcd cluster of `n` private members on free ports, joined by a static
/// `--initial-cluster`, each with its data in a temp dir. Killed by their pids and the dir
/// removed when dropped.
pub struct EtcdCluster {
    /// Holds every member's data and log.
    dir: PathBuf,
    /// `--initial-cluster-token`, and the start of every member's name: unique to this
    /// cluster, so that a member that answers with one of these names is ours.
    token: String,
    members: Vec<EtcdMember>,
    /// `--initial-cluster`: every member's name and peer URL.
    initial_cluster: String,
    /// The `etcd` binary.
    binary: PathBuf,
    /// How every member's process is tied to this one.
    tie: Tie,
    /// The certificate and key every member presents on its TLS port, if it has one.
    tls: Option<(PathBuf, PathBuf)>,
}

/// One member of a cluster, and where it keeps its files.
struct EtcdMember {
    /// `--name`.
    name: String,
    client_port: u16,
    peer_port: u16,
    /// A second client port, over TLS.
    tls_port: Option<u16>,
    /// `<dir>/data` and `<dir>/etcd.log`.
    dir: PathBuf,
    /// `None` while killed.
    child: Option<Child>,
}

impl EtcdMember {
    fn log(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }
}

/// Why a start did not become ready.
enum NotReady {
    /// A member could not bind one of its ports (another process took it since it was
    /// picked): worth another try on new ports.
    PortTaken,
    /// Anything else: the message says what, with the members' logs.
    Failed(String),
}

impl EtcdCluster {
    /// Start `n` members (3 for a cluster that survives one loss) and wait until every one
    /// answers `GET /health` with `{"health":"true"}`. A port taken by another process
    /// between its pick and its bind costs a retry of the whole cluster on new ports.
    ///
    /// # Panics
    /// If etcd is not installed (`apt-get install etcd-server`), or the cluster is not
    /// healthy within a minute (the panic carries the tail of every member's log).
    pub fn start(n: usize) -> Self {
        Self::start_on(n, distinct_free_ports)
    }

    /// [`start`](Self::start) on the ports `pick(2 * n)` gives for each try: each member's
    /// client and peer port.
    fn start_on(n: usize, pick: impl FnMut(usize) -> Vec<u16>) -> Self {
        Self::try_start_on(n, Tie::Child, None, pick).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start `n` members tied as `tie` says, for a program (the fault soak) that reports an
    /// error rather than panics.
    ///
    /// # Errors
    /// As [`start`](Self::start) panics.
    pub fn try_start(n: usize, tie: Tie) -> Result<Self> {
        Self::try_start_on(n, tie, None, distinct_free_ports)
    }

    /// Start `n` members tied as `tie` says, on the ports `pick(2 * n)` gives for each try
    /// (`pick(3 * n)` with a `certificate`: each member's TLS port third).
    fn try_start_on(
        n: usize,
        tie: Tie,
        certificate: Option<&ServerCertificate>,
        mut pick: impl FnMut(usize) -> Vec<u16>,
    ) -> Result<Self> {
        assert!(n >= 1, "a cluster has at least one member");
        let binary = find(&["etcd"], &[]).ok_or_else(|| {
            Error::NotInstalled(format!(
                "etcd is not installed (no etcd on the PATH): {INSTALL_ETCD}"
            ))
        })?;
        let dir = temp_dir("etcd")?;
        let token = dir
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a UTF-8 temp dir")
            .to_owned();
        // Built first, so that an error below still kills what was started and removes the
        // dir.
        let mut cluster = Self {
            dir,
            token,
            members: Vec::new(),
            initial_cluster: String::new(),
            binary,
            tie,
            tls: None,
        };
        if let Some(certificate) = certificate {
            cluster.tls = Some(certificate.write_to(&cluster.dir, None)?);
        }
        let ports_each = if certificate.is_some() { 3 } else { 2 };
        for _ in 0..ATTEMPTS {
            cluster.members = cluster.new_members(&pick(ports_each * n), ports_each)?;
            cluster.initial_cluster = cluster
                .members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
                .collect::<Vec<_>>()
                .join(",");
            for i in 0..n {
                cluster.members[i].child = Some(cluster.spawn(i)?);
            }
            match cluster.wait_until_ready(READY_WITHIN) {
                Ok(()) => return Ok(cluster),
                Err(NotReady::PortTaken) => cluster.kill_all(),
                Err(NotReady::Failed(why)) => {
                    return Err(Error::NotServing(format!("etcd did not start: {why}")));
                }
            }
        }
        Err(Error::NotServing(format!(
            "etcd did not start on any of {ATTEMPTS} sets of free ports"
        )))
    }

    /// A member for each (client, peer) pair of `ports` (each, with TLS: client, peer,
    /// TLS), each in a fresh dir.
    fn new_members(&self, ports: &[u16], each: usize) -> Result<Vec<EtcdMember>> {
        (0..ports.len() / each)
            .map(|i| {
                let member_dir = self.dir.join(format!("member-{i}"));
                // A retry on new ports starts from nothing.
                let _ = std::fs::remove_dir_all(&member_dir);
                std::fs::create_dir_all(&member_dir)
                    .map_err(crate::io("creating an etcd member's dir"))?;
                Ok(EtcdMember {
                    name: format!("{}-{i}", self.token),
                    client_port: ports[each * i],
                    peer_port: ports[each * i + 1],
                    tls_port: (each == 3).then(|| ports[each * i + 2]),
                    dir: member_dir,
                    child: None,
                })
            })
            .collect()
    }

    /// Start member `i`'s etcd, its output into its (new) log. With its data dir already
    /// there (a restart), etcd ignores the `--initial-cluster*` flags and rejoins.
    fn spawn(&self, i: usize) -> Result<Child> {
        let member = &self.members[i];
        let log = File::create(member.log()).map_err(crate::io("an etcd log file"))?;
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let listen = match member.tls_port {
            Some(port) => format!("{client},https://127.0.0.1:{port}"),
            None => client.clone(),
        };
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        // Heartbeat and election timeouts are etcd's defaults (100 ms, 1 s).
        let mut command = Command::new(&self.binary);
        command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(member.dir.join("data"))
            .args(["--listen-client-urls", &listen])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(self.tls.iter().flat_map(|(cert, key)| {
                [
                    "--cert-file".into(),
                    cert.clone().into_os_string(),
                    "--key-file".into(),
                    key.clone().into_os_string(),
                ]
            }))
            .current_dir(&member.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(crate::io("an etcd log file"))?)
            .stderr(log);
        self.tie.apply(&mut command);
        command.spawn().map_err(crate::io("starting etcd"))
    }

    /// `http://127.0.0.1:<port>` of every member, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// `http://127.0.0.1:<port>` of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client port, in member order.
    pub fn member_ports(&self) -> Vec<u16> {
        self.members.iter().map(|m| m.client_port).collect()
    }

    /// The pid of member `i`.
    ///
    /// # Panics
    /// If it was killed and not restarted.
    pub fn pid(&self, i: usize) -> u32 {
        self.members[i]
            .child
            .as_ref()
            .expect("the member is running")
            .id()
    }

    /// Send a signal (`-STOP`, `-CONT`, ...) to member `i`, by its pid.
    pub fn signal(&self, i: usize, signal: &str) {
        send_signal(self.pid(i), signal);
    }

    /// SIGKILL member `i` and reap it; its data stays on disk for [`restart`](Self::restart).
    /// The others go on (healthy while a majority is left).
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            reap(child);
        }
    }

    /// Kill member `i` if it runs, start it again on the same ports with the same data, and
    /// wait until every running member is healthy.
    ///
    /// # Panics
    /// If they are not, within a minute (say, another process took one of its ports).
    pub fn restart(&mut self, i: usize) {
        self.try_restart(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`restart`](Self::restart).
    ///
    /// # Errors
    /// As [`restart`](Self::restart) panics.
    pub fn try_restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        for _ in 0..ATTEMPTS {
            self.members[i].child = Some(self.spawn(i)?);
            match self.wait_until_ready(READY_WITHIN) {
                Ok(()) => return Ok(()),
                Err(NotReady::PortTaken) => {
                    // Its peer URL is in every member's configuration: it can only wait.
                    self.kill(i);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(NotReady::Failed(why)) => {
                    return Err(Error::NotServing(format!(
                        "etcd member {i} did not restart: {why}"
                    )));
                }
            }
        }
        Err(Error::NotServing(format!(
            "etcd member {i} did not restart: its ports are taken\n{}",
            self.logs()
        )))
    }

    /// Whether member `i` answers `GET /health` with `{"health":"true"...}` now.
    pub fn is_healthy(&self, i: usize) -> bool {
        health(self.members[i].client_port)
    }

    /// The index of the member the running members name as their leader, if they agree on
    /// one (`/v3/maintenance/status` of each).
    pub fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let status = http_request(member.client_port, "POST", "/v3/maintenance/status", "{}")?;
            ids.push(json_string(&status, "member_id")?);
            leaders.push(json_string(&status, "leader")?);
        }
        let leader = leaders.first()?;
        if leaders.iter().any(|l| l != leader) {
            return None;
        }
        let index = ids.iter().position(|id| id == leader)?;
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .collect();
        Some(running[index])
    }

    /// Wait until every running member is healthy: after a [`kill`](Self::kill), the
    /// survivors' election. A member stopped with SIGSTOP counts as running: continue it
    /// first.
    ///
    /// # Panics
    /// If they are not within `within`; the message carries every member's log.
    pub fn wait_until_healthy(&mut self, within: Duration) {
        self.try_wait_until_healthy(within)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`wait_until_healthy`](Self::wait_until_healthy).
    ///
    /// # Errors
    /// As [`wait_until_healthy`](Self::wait_until_healthy) panics.
    pub fn try_wait_until_healthy(&mut self, within: Duration) -> Result<()> {
        match self.wait_until_ready(within) {
            Ok(()) => Ok(()),
            Err(NotReady::Failed(why)) => {
                Err(Error::NotServing(format!("etcd not healthy: {why}")))
            }
            Err(NotReady::PortTaken) => Err(Error::NotServing(format!(
                "an etcd member lost a port\n{}",
                self.logs()
            ))),
        }
    }

    /// Wait until every running member is this cluster's (the member list it gives has its
    /// name) and healthy.
    fn wait_until_ready(&mut self, within: Duration) -> Result<(), NotReady> {
        let deadline = Instant::now() + within;
        loop {
            let mut exited = None;
            for (i, member) in self.members.iter_mut().enumerate() {
                let Some(child) = member.child.as_mut() else {
                    continue;
                };
                let status = child.try_wait().ok().flatten();
                if port_taken(&member.log()) {
                    return Err(NotReady::PortTaken);
                }
                if let Some(status) = status {
                    exited = Some((i, status));
                }
            }
            if let Some((i, status)) = exited {
                let why = format!("member {i} exited ({status})\n{}", self.logs());
                return Err(NotReady::Failed(why));
            }
            let unhealthy: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].child.is_some())
                .filter(|&i| !(self.is_ours(i) && self.is_healthy(i)))
                .collect();
            if unhealthy.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(format!(
                    "members {unhealthy:?} not healthy within {within:?}\n{}",
                    self.logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether what answers on member `i`'s port is it, not some other process that took
    /// the port first: the member list it gives names member `i`.
    fn is_ours(&self, i: usize) -> bool {
        let member = &self.members[i];
        http_request(member.client_port, "POST", "/v3/cluster/member/list", "{}")
            .is_some_and(|list| list.contains(&format!("\"name\":\"{}\"", member.name)))
    }

    fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// The last lines of every member's log, for a failure message.
    fn logs(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("--- member {i} ---\n{}", log_tail(&m.log(), 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // SIGKILL ends a member even while a test has it stopped (SIGSTOP).
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether a log says a port could not be bound: etcd then exits at once.
fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("address already in use"))
}

/// Whether the etcd on `port` answers `GET /health` with `{"health":"true"...}`.
fn health(port: u16) -> bool {
    http_request(port, "GET", "/health", "").is_some_and(|body| body.contains(r#""health":"true""#))
}

/// The body of a `200 OK` answer to `method path` with `body`, from the etcd on `port`,
/// within a few seconds; `None` for anything else. (etcd's JSON gateway takes the
/// `/v3/...` gRPC calls as POSTs of JSON.)
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    // HTTP/1.0: the server closes the connection after its answer, so the answer ends at
    // the end of the stream.
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    status
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code == "200")
        .then(|| body.to_owned())
}

/// The first string value of `"key":"..."` in `json` (enough for etcd's flat answers, whose
/// ids are strings).
fn json_string(json: &str, key: &str) -> Option<String> {
    let start = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let end = json[start..].find('"')?;
    Some(json[start..start + end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Start a cluster of three whose first try is on ports of which the one at `taken` is
    /// held by another listener: it must come up on the second try, on new ports.
    fn starts_despite_a_taken_port(taken: usize) {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let held = holder.local_addr().unwrap().port();
        let mut tries = 0;
        let cluster = EtcdCluster::start_on(3, |count| {
            tries += 1;
            let mut ports = distinct_free_ports(count);
            if tries == 1 {
                ports[taken] = held;
            }
            ports
        });
        assert_eq!(tries, 2, "the taken port cost one retry");
        assert!((0..3).all(|i| cluster.is_healthy(i)));
        assert!(!cluster.member_ports().contains(&held));
    }

    #[test]
    fn a_cluster_whose_client_port_is_taken_starts_on_new_ports() {
        starts_despite_a_taken_port(2);
    }

    #[test]
    fn a_cluster_whose_peer_port_is_taken_starts_on_new_ports() {
        starts_despite_a_taken_port(3);
    }

    #[test]
    fn a_server_is_not_ready_while_another_etcd_answers_on_its_port() {
        let other = EtcdServer::start();
        let mut tries = 0;
        let server = EtcdCluster::start_on(1, |count| {
            tries += 1;
            let mut ports = distinct_free_ports(count);
            if tries == 1 {
                ports[0] = other.port();
            }
            ports
        });
        assert_eq!(tries, 2, "the other etcd's port cost one retry");
        assert_ne!(server.member_ports()[0], other.port());
    }
}
