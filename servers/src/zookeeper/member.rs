//! One ZooKeeper member: its files (`zoo.cfg`, `myid`, data, log), the JVM that runs it,
//! and the four-letter words (`srvr`, `conf`, `cons`) that tell whether it serves and is
//! ours.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::Profile;
use crate::process::{Tie, find};
use crate::{Error, Result};

/// Where Debian's `zookeeper` package puts the server; its manifest names the jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The SLF4J API, one of those jars (Debian's `libslf4j-java`): without it the JVM cannot
/// load the server.
const SLF4J_API_JAR: &str = "/usr/share/java/slf4j-api.jar";
/// An SLF4J binding that logs to stderr without a configuration file: without it the
/// server runs but logs nothing, and a failed start would leave no reason in its log.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

const INSTALL_ZOOKEEPER: &str =
    "install it (Debian: apt-get install zookeeper libslf4j-java default-jre-headless)";

/// One member of an ensemble, and where it keeps its files.
pub(super) struct Member {
    /// `myid`: its `server.<id>` line in every member's configuration.
    pub(super) id: usize,
    pub(super) client_port: u16,
    /// `<dir>/zoo.cfg`, `<dir>/data` (with `myid`) and `<dir>/zookeeper.log`.
    pub(super) dir: PathBuf,
    /// `None` while killed.
    pub(super) child: Option<Child>,
}

impl Member {
    /// Write member `id`'s configuration and `myid` in a fresh `dir`; `servers` is the
    /// ensemble's `server.<id>=...` lines (empty for a standalone server).
    pub(super) fn new(
        id: usize,
        client_port: u16,
        dir: PathBuf,
        servers: &str,
        profile: Profile,
    ) -> Result<Self> {
        // A retry on new ports starts from nothing.
        let _ = std::fs::remove_dir_all(&dir);
        let member = Member {
            id,
            client_port,
            dir,
            child: None,
        };
        let data = member.data_dir();
        std::fs::create_dir_all(&data).map_err(crate::io("creating a member's data dir"))?;
        std::fs::write(data.join("myid"), format!("{id}\n")).map_err(crate::io("a myid file"))?;
        let config = zoo_cfg(profile, &data, client_port, servers);
        std::fs::write(member.dir.join("zoo.cfg"), config).map_err(crate::io("a zoo.cfg"))?;
        Ok(member)
    }

    pub(super) fn log(&self) -> PathBuf {
        self.dir.join("zookeeper.log")
    }

    pub(super) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Start the member's JVM, its stdout and stderr into its (new) log.
    pub(super) fn spawn(&self, profile: Profile, tie: Tie) -> Result<Child> {
        let java = java()?;
        let log = File::create(self.log()).map_err(crate::io("a ZooKeeper log file"))?;
        let mut classpath = ZOOKEEPER_JAR.to_owned();
        if Path::new(SLF4J_SIMPLE_JAR).exists() {
            classpath.push(':');
            classpath.push_str(SLF4J_SIMPLE_JAR);
        }
        let mut command = Command::new(java);
        command
            .args(jvm_options(profile))
            .args([
                "-Djava.awt.headless=true",
                "-Dzookeeper.jmx.log4j.disable=true",
            ])
            .args(["-cp", &classpath])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.join("zoo.cfg"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(crate::io("a ZooKeeper log file"))?)
            .stderr(log);
        tie.apply(&mut command);
        command
            .spawn()
            .map_err(crate::io("starting ZooKeeper (java)"))
    }
}

/// A member's configuration.
fn zoo_cfg(profile: Profile, data: &Path, client_port: u16, servers: &str) -> String {
    // TIMING: initLimit and syncLimit are in ticks: with a test's tick, a follower has 10 s
    // to sync with a new leader, and a member that does not answer for 5 s (a SIGSTOP, or a
    // machine too busy to schedule it) is dropped from the quorum. A SIGKILL closes its
    // sockets, so its peers notice that at once.
    //
    // Test: forceSync=no, the transaction log is written but not fsynced. Tests kill
    // processes, not machines, so nothing written is lost, and a busy disk cannot stall a
    // member for seconds at an fsync and so lose it its quorum. Deployed: forceSync is left
    // at its default (yes), each write on disk before it is answered.
    //
    // maxClientCnxns=0: no cap on connections from one address (the default caps
    // 127.0.0.1, and so all of a test's or a demo's clients, at 60).
    let sync = match profile {
        Profile::Test { .. } => "forceSync=no\n",
        Profile::Deployed => "",
    };
    format!(
        "tickTime={tick}\ninitLimit=20\nsyncLimit=10\n\
         minSessionTimeout={min}\nmaxSessionTimeout={max}\n\
         dataDir={data}\nclientPort={client_port}\nclientPortAddress=127.0.0.1\n\
         maxClientCnxns=0\n{sync}\
         admin.enableServer=false\n4lw.commands.whitelist=*\n{servers}",
        tick = profile.tick().as_millis(),
        min = profile.min_session_timeout().as_millis(),
        max = profile.max_session_timeout().as_millis(),
        data = data.display(),
    )
}

/// The JVM's options besides the class path.
fn jvm_options(profile: Profile) -> &'static [&'static str] {
    match profile {
        // A small heap and the serial collector: a test server holds a few znodes, and three
        // JVMs share two cores. C1 only (TieredStopAtLevel=1) starts faster and costs less
        // CPU. Empty container nodes are left alone for a day, not deleted at the next
        // minute's check: the server then writes only what clients ask it to, and a test can
        // see that nothing wrote (`ZooKeeperServer::last_zxid`).
        Profile::Test { .. } => &[
            "-Xmx128m",
            "-Xms16m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dznode.container.checkIntervalMs=86400000",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
        ],
        // A small heap (the server holds a few nodes per run); the JIT is left as it is: the
        // demo measures the server.
        Profile::Deployed => &["-Xms32m", "-Xmx256m"],
    }
}

/// The Java runtime, once ZooKeeper and its SLF4J jars are known to be installed.
pub(super) fn java() -> Result<PathBuf> {
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        return Err(Error::NotInstalled(format!(
            "ZooKeeper is not installed (no {ZOOKEEPER_JAR}): {INSTALL_ZOOKEEPER}"
        )));
    }
    if !Path::new(SLF4J_API_JAR).is_file() {
        return Err(Error::NotInstalled(format!(
            "ZooKeeper needs the SLF4J jars, which are not installed (no {SLF4J_API_JAR}): \
             install them (Debian: apt-get install libslf4j-java)"
        )));
    }
    find(&["java"], &[PathBuf::from("/usr/lib/jvm/default-java/bin")]).ok_or_else(|| {
        Error::NotInstalled(
            "ZooKeeper is installed, but no Java runtime (no `java` on the PATH): install one, \
             Java 11 or later (Debian: apt-get install default-jre-headless)"
                .into(),
        )
    })
}

/// Whether a log says a port could not be bound (`java.net.BindException: Address already
/// in use`): a client port taken ends the JVM, an election port taken ends it after three
/// tries, and a quorum port taken only fails a would-be leader, again and again.
pub(super) fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("Address already in use"))
}

/// The `Mode` that `srvr` reports on `port`, `None` if nothing serves there.
pub(super) fn mode(port: u16) -> Option<String> {
    let srvr = four_letter_word(port, "srvr")?;
    srvr.lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_owned())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's server grants what a stock ZooKeeper grants: 2 to 20 ticks of 2 s.
    #[test]
    fn a_deployed_server_grants_sessions_of_two_to_twenty_ticks() {
        let config = zoo_cfg(Profile::Deployed, Path::new("/tmp/zk/data"), 2181, "");
        assert!(config.contains("tickTime=2000\n"), "{config}");
        assert!(config.contains("minSessionTimeout=4000\n"), "{config}");
        assert!(config.contains("maxSessionTimeout=40000\n"), "{config}");
        assert!(config.contains("clientPort=2181\n"), "{config}");
        assert!(config.contains("dataDir=/tmp/zk/data\n"), "{config}");
        assert!(!config.contains("forceSync"), "{config}");
    }
}
