//! Private ZooKeeper servers: [`ZooKeeperServer`] (one, standalone) and [`ZooKeeperEnsemble`]
//! (a real quorum), each member a JVM started directly (`QuorumPeerMain`, no `zkServer.sh`,
//! nothing of `/etc/zookeeper` or `/var/lib/zookeeper`) with a generated `zoo.cfg` in a temp
//! dir of its own, killed by its pid when dropped.
//!
//! Assumes Debian's `zookeeper` and `libslf4j-java` packages and a Java runtime (11 or
//! later). A [`Profile`] says how the servers are tuned: short ticks and no fsync for tests,
//! or ZooKeeper's defaults, durable, for the demo's measurements. What answers on a client
//! port is taken to be a member only when its `conf` names the member's data directory.
//!
//! `member.rs` holds one member's files, its JVM and the four-letter words it answers.

mod member;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::process::{Tie, log_tail, reap, send_signal, temp_dir};
use crate::{ATTEMPTS, Error, Result, distinct_free_ports};
use member::{Member, mode, port_taken};
pub use member::{four_letter_word, last_zxid};

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
/// The longest session a [`Profile::Deployed`] server grants: ZooKeeper's default, 20 of
/// its default 2 s ticks. A client must ask for no more, or it is granted less than asked.
pub const DEPLOYED_MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(40);

/// How the servers are tuned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// For tests: a [`TICK_TIME`] tick, sessions from [`MIN_SESSION_TIMEOUT`] to
    /// `max_session_timeout`, a log written but not fsynced, and a small JVM that starts
    /// fast (three share two cores).
    Test { max_session_timeout: Duration },
    /// As deployed: ZooKeeper's default tick (2 s) and sessions (4 s to
    /// [`DEPLOYED_MAX_SESSION_TIMEOUT`]), each write on disk before it is answered, and the
    /// JVM's compiler left as it is: what the demo measures.
    Deployed,
}

impl Profile {
    /// `tickTime`.
    pub fn tick(self) -> Duration {
        match self {
            Profile::Test { .. } => TICK_TIME,
            Profile::Deployed => Duration::from_secs(2),
        }
    }

    /// `minSessionTimeout`: two ticks, ZooKeeper's floor.
    pub fn min_session_timeout(self) -> Duration {
        2 * self.tick()
    }

    /// `maxSessionTimeout`.
    pub fn max_session_timeout(self) -> Duration {
        match self {
            Profile::Test {
                max_session_timeout,
            } => max_session_timeout,
            Profile::Deployed => DEPLOYED_MAX_SESSION_TIMEOUT,
        }
    }
}

/// How long a start (or restart) may take to be serving, JVM start and election included.
///
/// TIMING: three JVMs starting at once on a busy 2-core machine take a few seconds each; an
/// election then takes about one more (3.5 s in all on an idle machine).
const READY_WITHIN: Duration = Duration::from_secs(60);

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

    /// Start one tuned as `profile` says and tied to this process as `tie` says, and wait
    /// until it serves.
    ///
    /// # Errors
    /// ZooKeeper, its SLF4J jars or Java not installed (the message says what to install);
    /// or it does not serve within a minute (the message carries the end of its log).
    pub fn try_start(profile: Profile, tie: Tie) -> Result<Self> {
        let ensemble = ZooKeeperEnsemble::try_start_on(1, profile, tie, distinct_free_ports)?;
        Ok(Self { ensemble })
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

/// A real ZooKeeper ensemble of `n` private members on free ports (client, quorum and
/// election port each), each with its own `myid` and data in a temp dir. Killed by their pids
/// and the dir removed when dropped.
pub struct ZooKeeperEnsemble {
    /// Holds every member's configuration, data and log.
    dir: PathBuf,
    members: Vec<Member>,
    /// How every member is tuned.
    profile: Profile,
    /// How every member's process is tied to this one.
    tie: Tie,
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
    fn start_on(n: usize, max: Duration, pick: impl FnMut(usize) -> Vec<u16>) -> Self {
        assert!(
            max >= MIN_SESSION_TIMEOUT,
            "maxSessionTimeout below minSessionTimeout ({MIN_SESSION_TIMEOUT:?})"
        );
        let profile = Profile::Test {
            max_session_timeout: max,
        };
        Self::try_start_on(n, profile, Tie::Child, pick).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start `n` members tuned as `profile` says and tied as `tie` says, for a program (the
    /// fault soak) that reports an error rather than panics.
    ///
    /// # Errors
    /// As [`start`](Self::start) panics.
    pub fn try_start(n: usize, profile: Profile, tie: Tie) -> Result<Self> {
        Self::try_start_on(n, profile, tie, distinct_free_ports)
    }

    /// Start `n` members tuned as `profile` says, on the ports `pick(3 * n)` gives for each
    /// try.
    fn try_start_on(
        n: usize,
        profile: Profile,
        tie: Tie,
        mut pick: impl FnMut(usize) -> Vec<u16>,
    ) -> Result<Self> {
        assert!(n >= 1, "an ensemble has at least one member");
        member::java()?;
        // Built first, so that an error below still kills what was started and removes the
        // dir.
        let mut ensemble = Self {
            dir: temp_dir("zk")?,
            members: Vec::new(),
            profile,
            tie,
        };
        for _ in 0..ATTEMPTS {
            let ports = pick(3 * n);
            let servers: String = (0..n)
                .map(|i| {
                    let (quorum, election) = (ports[n + 2 * i], ports[n + 2 * i + 1]);
                    format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
                })
                .collect();
            let servers = if n > 1 { servers.as_str() } else { "" };
            ensemble.members = (0..n)
                .map(|i| {
                    let dir = ensemble.dir.join(format!("member-{}", i + 1));
                    Member::new(i + 1, ports[i], dir, servers, profile)
                })
                .collect::<Result<_>>()?;
            for member in &mut ensemble.members {
                member.child = Some(member.spawn(profile, tie)?);
            }
            match ensemble.wait_until_ready(READY_WITHIN) {
                Ok(()) => return Ok(ensemble),
                Err(NotReady::PortTaken) => ensemble.kill_all(),
                Err(NotReady::Failed(why)) => {
                    return Err(Error::NotServing(format!("ZooKeeper did not start: {why}")));
                }
            }
        }
        Err(Error::NotServing(format!(
            "ZooKeeper did not start on any of {ATTEMPTS} sets of free ports"
        )))
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
        self.try_restart(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`restart`](Self::restart).
    ///
    /// # Errors
    /// As [`restart`](Self::restart) panics.
    pub fn try_restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        for _ in 0..ATTEMPTS {
            let member = &self.members[i];
            self.members[i].child = Some(member.spawn(self.profile, self.tie)?);
            match self.wait_until_ready(READY_WITHIN) {
                Ok(()) => return Ok(()),
                Err(NotReady::PortTaken) => {
                    // Its ports are in every member's configuration: it can only wait for them.
                    self.kill(i);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(NotReady::Failed(why)) => {
                    return Err(Error::NotServing(format!(
                        "ZooKeeper member {i} did not restart: {why}"
                    )));
                }
            }
        }
        Err(Error::NotServing(format!(
            "ZooKeeper member {i} did not restart: its ports are taken\n{}",
            self.logs()
        )))
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
        self.try_wait_for_quorum(within)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`wait_for_quorum`](Self::wait_for_quorum).
    ///
    /// # Errors
    /// As [`wait_for_quorum`](Self::wait_for_quorum) panics.
    pub fn try_wait_for_quorum(&mut self, within: Duration) -> Result<()> {
        match self.wait_until_ready(within) {
            Ok(()) => Ok(()),
            Err(NotReady::Failed(why)) => {
                Err(Error::NotServing(format!("no ZooKeeper quorum: {why}")))
            }
            Err(NotReady::PortTaken) => Err(Error::NotServing(format!(
                "a ZooKeeper member lost a port\n{}",
                self.logs()
            ))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

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
    fn an_ensemble_whose_leaders_quorum_port_is_taken_starts_on_new_ports() {
        // Member 3 (index 2) has the highest myid, so it wins the first election of members
        // with equal (empty) histories, and only a leader binds its quorum port.
        starts_despite_a_taken_port(quorum_port(2));
    }

    #[test]
    fn a_server_is_not_ready_while_another_zookeeper_answers_on_its_port() {
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
