//! Private ZooKeeper servers: [`ZooKeeperServer`] (one, standalone) and [`ZooKeeperEnsemble`]
//! (a real quorum), each member a JVM started directly (`QuorumPeerMain`, no `zkServer.sh`,
//! nothing of `/etc/zookeeper` or `/var/lib/zookeeper`) with a generated `zoo.cfg` in a temp
//! dir of its own, killed by its pid when dropped.
//!
//! The process helpers at the end (`distinct_free_ports`, `send_signal`, `reap`, `log_tail`,
//! `temp_dir`) are shared with `etcd.rs`.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ATTEMPTS;

/// The servers' tick: the unit of every ZooKeeper timeout.
///
/// TIMING: short, so that tests can use short sessions: a session may be as short as
/// [`MIN_SESSION_TIMEOUT`] (ZooKeeper's floor, 2 ticks).
pub const TICK_TIME: Duration = Duration::from_millis(500);
/// The shortest session the servers grant: shorter requests get this.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(2 * 500);
/// The longest session the servers grant with [`ZooKeeperServer::start`] and
/// [`ZooKeeperEnsemble::start`]: longer requests get this.
pub const DEFAULT_MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a start (or restart) may take to be serving, JVM start and election included.
///
/// TIMING: three JVMs starting at once on a busy 2-core machine take a few seconds each; an
/// election then takes about one more (3.5 s in all on an idle machine).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Where Debian's `zookeeper` package puts the server; its manifest names the jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// An SLF4J binding that logs to stderr without a configuration file: the server's jar
/// brings only the SLF4J API, and without a binding it logs nothing at all.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// One private, standalone ZooKeeper server on a free port, with its data in a temp dir: it
/// survives [`kill`](Self::kill) and [`restart`](Self::restart). Killed by its pid and its dir
/// removed when dropped.
pub struct ZooKeeperServer {
    /// A one-member ensemble, which ZooKeeper runs in standalone mode.
    ensemble: ZooKeeperEnsemble,
}

impl ZooKeeperServer {
    /// Start one and wait until it serves (`srvr` says `Mode: standalone`).
    ///
    /// # Panics
    /// If ZooKeeper is not installed (`apt-get install zookeeper`), or does not serve within
    /// a minute (the panic carries the tail of its log).
    pub fn start() -> Self {
        Self::start_with_max_session_timeout(DEFAULT_MAX_SESSION_TIMEOUT)
    }

    /// [`start`](Self::start), granting sessions of at most `max` (ZooKeeper's
    /// `maxSessionTimeout`).
    pub fn start_with_max_session_timeout(max: Duration) -> Self {
        Self {
            ensemble: ZooKeeperEnsemble::start_with_max_session_timeout(1, max),
        }
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.ensemble.members[0].client_port
    }

    /// `127.0.0.1:<port>`, for a ZooKeeper client.
    pub fn connect_string(&self) -> String {
        self.ensemble.connect_string()
    }

    /// The pid of the running server.
    ///
    /// # Panics
    /// If it was killed and not restarted.
    pub fn pid(&self) -> u32 {
        self.ensemble.pid(0)
    }

    /// Send a signal (`-STOP`, `-CONT`, ...) to the server, by its pid.
    pub fn signal(&self, signal: &str) {
        self.ensemble.signal(0, signal);
    }

    /// SIGKILL the server and reap it; its data stays on disk for [`restart`](Self::restart).
    pub fn kill(&mut self) {
        self.ensemble.kill(0);
    }

    /// Kill the server if it runs, start it again on the same port with the same data, and
    /// wait until it serves.
    pub fn restart(&mut self) {
        self.ensemble.restart(0);
    }

    /// What `srvr` says the server's `Mode` is (`standalone`), `None` if it does not serve.
    pub fn mode(&self) -> Option<String> {
        self.ensemble.mode(0)
    }

    /// The id of the last transaction the server applied (`srvr`'s `Zxid`), `None` if it
    /// does not serve: every write (a create, a delete, a check transaction, a session
    /// opened or closed) moves it on.
    pub fn last_zxid(&self) -> Option<u64> {
        last_zxid(self.port())
    }
}

/// The id of the last transaction the server on `port` applied (`srvr`'s `Zxid`), `None`
/// if nothing serves there.
pub fn last_zxid(port: u16) -> Option<u64> {
    let srvr = four_letter_word(port, "srvr")?;
    let hex = srvr
        .lines()
        .find_map(|line| line.strip_prefix("Zxid: 0x"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// A real ZooKeeper ensemble of `n` private members on free ports (client, quorum and
/// election port each), each with its own `myid` and data in a temp dir. Killed by their pids
/// and the dir removed when dropped.
pub struct ZooKeeperEnsemble {
    /// Holds every member's configuration, data and log.
    dir: PathBuf,
    members: Vec<Member>,
    /// Written into each member's `zoo.cfg`.
    max_session_timeout: Duration,
}

/// One member of an ensemble, and where it keeps its files.
struct Member {
    /// `myid`: its `server.<id>` line in every member's configuration.
    id: usize,
    client_port: u16,
    /// `<dir>/zoo.cfg`, `<dir>/data` (with `myid`) and `<dir>/zookeeper.log`.
    dir: PathBuf,
    /// `None` while killed.
    child: Option<Child>,
}

impl Member {
    fn log(&self) -> PathBuf {
        self.dir.join("zookeeper.log")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
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

impl ZooKeeperEnsemble {
    /// Start `n` members (3 for a quorum that survives one loss; 1 runs standalone) and wait
    /// until they have formed a quorum: every member answers `srvr` as `leader` or
    /// `follower`, and one of them is the leader. A port taken by another process between its
    /// pick and its bind costs a retry of the whole ensemble on new ports.
    ///
    /// # Panics
    /// If ZooKeeper is not installed (`apt-get install zookeeper`), or the ensemble does not
    /// form within a minute (the panic carries the tail of every member's log).
    pub fn start(n: usize) -> Self {
        Self::start_with_max_session_timeout(n, DEFAULT_MAX_SESSION_TIMEOUT)
    }

    /// [`start`](Self::start), granting sessions of at most `max` (ZooKeeper's
    /// `maxSessionTimeout`).
    pub fn start_with_max_session_timeout(n: usize, max: Duration) -> Self {
        Self::start_on(n, max, distinct_free_ports)
    }

    /// [`start_with_max_session_timeout`](Self::start_with_max_session_timeout) on the ports
    /// `pick(3 * n)` gives for each try: the client ports, then each member's quorum and
    /// election ports.
    fn start_on(n: usize, max: Duration, mut pick: impl FnMut(usize) -> Vec<u16>) -> Self {
        assert!(n >= 1, "an ensemble has at least one member");
        assert!(
            max >= MIN_SESSION_TIMEOUT,
            "maxSessionTimeout below minSessionTimeout ({MIN_SESSION_TIMEOUT:?})"
        );
        check_installed();
        // Built first, so that a panic below still kills what was started and removes the dir.
        let mut ensemble = Self {
            dir: temp_dir("zookeeper"),
            members: Vec::new(),
            max_session_timeout: max,
        };
        for _ in 0..ATTEMPTS {
            let ports = pick(3 * n);
            let servers: String = (0..n)
                .map(|i| {
                    let (quorum, election) = (ports[n + 2 * i], ports[n + 2 * i + 1]);
                    format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
                })
                .collect();
            ensemble.members = (0..n)
                .map(|i| ensemble.new_member(i + 1, ports[i], if n > 1 { &servers } else { "" }))
                .collect();
            for member in &mut ensemble.members {
                member.child = Some(spawn(member));
            }
            match ensemble.wait_until_ready(READY_WITHIN) {
                Ok(()) => return ensemble,
                Err(NotReady::PortTaken) => ensemble.kill_all(),
                Err(NotReady::Failed(why)) => panic!("ZooKeeper did not start: {why}"),
            }
        }
        panic!("ZooKeeper did not start on any of {ATTEMPTS} sets of free ports");
    }

    /// Write member `id`'s configuration and `myid` in a fresh dir of its own.
    fn new_member(&self, id: usize, client_port: u16, servers: &str) -> Member {
        let dir = self.dir.join(format!("member-{id}"));
        // A retry on new ports starts from nothing.
        let _ = std::fs::remove_dir_all(&dir);
        let member = Member {
            id,
            client_port,
            dir,
            child: None,
        };
        let data = member.data_dir();
        std::fs::create_dir_all(&data).expect("a temp dir");
        std::fs::write(data.join("myid"), format!("{id}\n")).expect("a myid file");
        // TIMING: initLimit and syncLimit are in ticks: a follower has 10 s to sync with a new
        // leader, and a member that does not answer for 5 s (a SIGSTOP, or a machine too busy
        // to schedule it) is dropped from the quorum. A SIGKILL closes its sockets, so its
        // peers notice that at once.
        //
        // forceSync=no: the transaction log is written but not fsynced. Tests kill processes,
        // not machines, so nothing written is lost, and a busy disk cannot stall a member for
        // seconds at an fsync and so lose it its quorum.
        //
        // maxClientCnxns=0: no cap on connections from one address (the default caps
        // 127.0.0.1, and so all of a test's clients, at 60).
        let config = format!(
            "tickTime={tick}\ninitLimit=20\nsyncLimit=10\n\
             minSessionTimeout={min}\nmaxSessionTimeout={max}\n\
             dataDir={data}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n\
             maxClientCnxns=0\nforceSync=no\n\
             admin.enableServer=false\n4lw.commands.whitelist=*\n{servers}",
            tick = TICK_TIME.as_millis(),
            min = MIN_SESSION_TIMEOUT.as_millis(),
            max = self.max_session_timeout.as_millis(),
            data = data.display(),
        );
        std::fs::write(member.dir.join("zoo.cfg"), config).expect("a zoo.cfg");
        member
    }

    /// `127.0.0.1:<p1>,127.0.0.1:<p2>,...`: every member's client address, for a client.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every member's client port, in member order (member `i` has `myid` `i + 1`).
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
    /// The others go on (with a quorum while a majority is left).
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            reap(child);
        }
    }

    /// Kill member `i` if it runs, start it again on the same ports with the same data, and
    /// wait until every running member serves again with one leader.
    ///
    /// # Panics
    /// If it does not, within a minute (say, another process took one of its ports).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        for _ in 0..ATTEMPTS {
            self.members[i].child = Some(spawn(&self.members[i]));
            match self.wait_until_ready(READY_WITHIN) {
                Ok(()) => return,
                Err(NotReady::PortTaken) => {
                    // Its ports are in every member's configuration: it can only wait for them.
                    self.kill(i);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(NotReady::Failed(why)) => panic!("ZooKeeper member {i} did not restart: {why}"),
            }
        }
        panic!(
            "ZooKeeper member {i} did not restart: its ports are taken\n{}",
            self.logs()
        );
    }

    /// What `srvr` says member `i`'s `Mode` is (`leader`, `follower`, `standalone`), `None`
    /// if it does not serve (killed, stopped, or without a quorum).
    pub fn mode(&self, i: usize) -> Option<String> {
        mode(self.members[i].client_port)
    }

    /// The index of the member a client's session `session_id` is connected to: the one
    /// whose `cons` lists a connection with that `sid`. `None` if no running member that
    /// answers does (a member stopped with SIGSTOP does not answer).
    pub fn member_with_session(&self, session_id: i64) -> Option<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .find(|&i| self.has_session(i, session_id))
    }

    /// Whether member `i`'s `cons` lists a connection of session `session_id` now.
    pub fn has_session(&self, i: usize, session_id: i64) -> bool {
        let sid = format!("sid={session_id:#x},");
        four_letter_word(self.members[i].client_port, "cons")
            .is_some_and(|cons| cons.contains(&sid))
    }

    /// The index of the member that says it leads, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// Wait until every running member serves (`leader`, `follower` or `standalone`) and one
    /// of them leads (unless standalone): after a [`kill`](Self::kill), the survivors'
    /// election. A member stopped with SIGSTOP counts as running: continue it first.
    ///
    /// # Panics
    /// If they do not within `within`; the message carries every member's log.
    pub fn wait_for_quorum(&mut self, within: Duration) {
        match self.wait_until_ready(within) {
            Ok(()) => {}
            Err(NotReady::Failed(why)) => panic!("no ZooKeeper quorum: {why}"),
            Err(NotReady::PortTaken) => panic!("a ZooKeeper member lost a port\n{}", self.logs()),
        }
    }

    /// Wait until every running member is this ensemble's (its `conf` names its data dir)
    /// and serves, with one leader.
    fn wait_until_ready(&mut self, within: Duration) -> Result<(), NotReady> {
        let deadline = Instant::now() + within;
        loop {
            let mut exited = None;
            for member in &mut self.members {
                let Some(child) = member.child.as_mut() else {
                    continue;
                };
                let status = child.try_wait().ok().flatten();
                if port_taken(&member.log()) {
                    return Err(NotReady::PortTaken);
                }
                if let Some(status) = status {
                    exited = Some((member.id - 1, status));
                }
            }
            if let Some((i, status)) = exited {
                let why = format!("member {i} exited ({status})\n{}", self.logs());
                return Err(NotReady::Failed(why));
            }
            let running: Vec<&Member> = self.members.iter().filter(|m| m.child.is_some()).collect();
            let modes: Vec<Option<String>> = running
                .iter()
                .map(|m| {
                    let ours = four_letter_word(m.client_port, "conf").is_some_and(|conf| {
                        conf.contains(&format!("dataDir={}", m.data_dir().display()))
                    });
                    if ours { mode(m.client_port) } else { None }
                })
                .collect();
            let serving = modes
                .iter()
                .all(|m| matches!(m.as_deref(), Some("leader" | "follower" | "standalone")));
            let leaders = modes
                .iter()
                .filter(|m| m.as_deref() == Some("leader"))
                .count();
            if serving && (leaders == 1 || self.members.len() == 1) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(format!(
                    "not serving within {within:?}: modes {modes:?}\n{}",
                    self.logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
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
            .map(|m| format!("--- member {} ---\n{}", m.id - 1, log_tail(&m.log(), 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        // SIGKILL ends a member even while a test has it stopped (SIGSTOP).
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Panic with what to install if ZooKeeper or Java is missing.
fn check_installed() {
    assert!(
        Path::new(ZOOKEEPER_JAR).exists(),
        "ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing): apt-get install zookeeper"
    );
}

/// Start `member`'s JVM, its stdout and stderr into its (new) log.
fn spawn(member: &Member) -> Child {
    let log = File::create(member.log()).expect("a log file");
    let mut classpath = ZOOKEEPER_JAR.to_owned();
    if Path::new(SLF4J_SIMPLE_JAR).exists() {
        classpath.push(':');
        classpath.push_str(SLF4J_SIMPLE_JAR);
    }
    // A small heap and the serial collector: a test server holds a few znodes, and three
    // JVMs share two cores. C1 only (TieredStopAtLevel=1) starts faster and costs less CPU.
    Command::new("java")
        .args([
            "-Xmx128m",
            "-Xms16m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            "-Dzookeeper.jmx.log4j.disable=true",
            // Empty container nodes are left alone for a day, not deleted at the next
            // minute's check: the server then writes only what clients ask it to, and a test
            // can see that nothing wrote (`ZooKeeperServer::last_zxid`).
            "-Dznode.container.checkIntervalMs=86400000",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-cp",
            &classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        ])
        .arg(member.dir.join("zoo.cfg"))
        .current_dir(&member.dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("a log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("could not run java ({e}): apt-get install zookeeper (it brings a JRE)")
        })
}

/// Whether a log says a port could not be bound (`java.net.BindException: Address already
/// in use`): a client port taken ends the JVM, an election port taken ends it after three
/// tries, and a quorum port taken only fails a would-be leader, again and again.
fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("Address already in use"))
}

/// The `Mode` that `srvr` reports on `port`, `None` if nothing serves there.
fn mode(port: u16) -> Option<String> {
    let srvr = four_letter_word(port, "srvr")?;
    srvr.lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_owned())
}

/// Send a four-letter word (`ruok`, `srvr`, `conf`, `mntr`, ...) to the ZooKeeper on `port`
/// and read its answer, within a few seconds; `None` if nothing answers.
pub fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = String::new();
    // The server closes the connection after its answer.
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// `n` distinct ports nobody listens on right now: all held at once while picked, so that
/// none is picked twice.
pub(crate) fn distinct_free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// Send `signal` (`-STOP`, `-CONT`, ...) to `pid` with `kill`.
pub(crate) fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill on the PATH");
    assert!(status.success(), "kill {signal} {pid}");
}

/// SIGKILL `child` and wait for it, so that no zombie is left.
pub(crate) fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `lines` lines of the file at `path` (empty if there is none).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A new, empty dir in the system's temp dir, named `<label>-<random>`.
pub(crate) fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "{label}-{}",
        crate::unique_prefix("t").replace(':', "-")
    ));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Start an ensemble of three whose first try is on ports of which the one at `taken`
    /// is held by another listener: it must come up on the second try, on new ports.
    fn starts_despite_a_taken_port(taken: usize) {
        let holder = TcpListener::bind("127.0.0.1:0").unwrap();
        let held = holder.local_addr().unwrap().port();
        let mut tries = 0;
        let ensemble = ZooKeeperEnsemble::start_on(3, DEFAULT_MAX_SESSION_TIMEOUT, |count| {
            tries += 1;
            let mut ports = distinct_free_ports(count);
            if tries == 1 {
                ports[taken] = held;
            }
            ports
        });
        assert_eq!(tries, 2, "the taken port cost one retry");
        assert!(ensemble.leader().is_some());
        assert!(!ensemble.member_ports().contains(&held));
    }

    /// Where member `i`'s quorum port is among the ports of an ensemble of three: after the
    /// three client ports, a (quorum, election) pair per member.
    fn quorum_port(i: usize) -> usize {
        3 + 2 * i
    }

    fn election_port(i: usize) -> usize {
        quorum_port(i) + 1
    }

    #[test]
    fn an_ensemble_whose_client_port_is_taken_starts_on_new_ports() {
        starts_despite_a_taken_port(0);
    }

    #[test]
    fn an_ensemble_whose_election_port_is_taken_starts_on_new_ports() {
        starts_despite_a_taken_port(election_port(1));
    }

    #[test]
    fn an_ensemble_whose_leader_cannot_bind_its_quorum_port_starts_on_new_ports() {
        // Member 3 (index 2) has the highest myid, so it wins the first election of members
        // with equal (empty) histories, and only a leader binds its quorum port.
        starts_despite_a_taken_port(quorum_port(2));
    }

    #[test]
    fn a_server_is_not_taken_for_ready_when_another_zookeeper_answers_on_its_port() {
        let other = ZooKeeperServer::start();
        let mut tries = 0;
        let server = ZooKeeperEnsemble::start_on(1, DEFAULT_MAX_SESSION_TIMEOUT, |count| {
            tries += 1;
            let mut ports = distinct_free_ports(count);
            if tries == 1 {
                ports[0] = other.port();
            }
            ports
        });
        assert_eq!(tries, 2, "the other server's port cost one retry");
        assert_ne!(server.member_ports()[0], other.port());
    }
}
