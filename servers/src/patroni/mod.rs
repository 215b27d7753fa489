//! [`PatroniCluster`]: PostgreSQL whose primary fails over, as production runs it. Three
//! members, each a Patroni agent that runs its own PostgreSQL; a private etcd as their store
//! (Patroni's `etcd3` section); and HAProxy in front, which sends each new connection to
//! the member whose Patroni REST API answers `GET /primary` with 200, and cuts the
//! connections of a member that stops answering so.
//!
//! Every member runs in `synchronous_mode_strict`: a commit is acknowledged only once a
//! standby has it, so the standby Patroni promotes holds every commit that was answered;
//! with no standby left, commits wait.
//!
//! Assumes `patroni` on the PATH, newer than Debian bookworm's 3.0 (which loses track of its
//! synchronous standby after a failover, and is refused: `.ci/run` installs 4.1 from PyPI
//! into a virtual environment), Debian's `haproxy` and `etcd-server`, and PostgreSQL's
//! binaries (as [`PostgresServer`](crate::PostgresServer) finds them). As root, Patroni and its
//! PostgreSQL run as the `postgres` account, which initdb needs.
//!
//! A member is Patroni (our child) and the PostgreSQL it starts, which Patroni detaches from
//! itself: a member is killed, paused and resumed by those pids, Patroni's and the one in
//! its data directory's `postmaster.pid` with that postmaster's children. A program killed
//! with SIGKILL leaves the members' PostgreSQL running (the kernel ties only our children to
//! us); its directory, `seckill-patroni-<pid>-*`, names the program.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd::http_request;
use crate::postgres::{as_account, bin_dir, unprivileged_account};
use crate::process::{Tie, alive, children_of, log_tail, reap, signal, temp_dir, wait_gone};
use crate::{ATTEMPTS, Error, EtcdServer, Result, distinct_free_ports};

mod files;

const INSTALL: &str =
    "install it (Debian: apt-get install haproxy etcd-server; Patroni from PyPI, see .ci/run)";

/// The members of every cluster.
pub const MEMBERS: usize = 3;

/// Patroni's leader lease in etcd, in seconds: a primary whose Patroni stops renewing it is
/// replaced once it runs out.
///
/// TIMING: the shortest Patroni takes (it raises a shorter one to 20 s); with `loop_wait` 1 s
/// and `retry_timeout` 4 s, its rule (`loop_wait + 2 × retry_timeout ≤ ttl`) holds with room
/// to spare, and a busy two-core machine does not lose the lease by accident.
pub const TTL_SECS: u64 = 20;

/// How long a start may take until a primary and a synchronous standby serve, and HAProxy
/// sends connections to the primary.
///
/// TIMING: initdb, then two base backups; about 20 s on an idle two-core machine.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// One member: its ports, its files, and its Patroni while it runs.
struct Member {
    name: String,
    pg_port: u16,
    api_port: u16,
    config: PathBuf,
    data: PathBuf,
    log: PathBuf,
    /// `None` while killed.
    patroni: Option<Child>,
}

/// A private Patroni cluster of [`MEMBERS`] PostgreSQL members with HAProxy in front, on
/// free ports, its files in a temporary directory; every process stopped by its pid and
/// the directory removed when dropped.
pub struct PatroniCluster {
    dir: PathBuf,
    etcd: EtcdServer,
    members: Vec<Member>,
    haproxy: Option<Child>,
    haproxy_port: u16,
    bin: PathBuf,
    account: Option<(u32, u32)>,
    tie: Tie,
}

impl PatroniCluster {
    /// Start one and wait until a primary and a synchronous standby serve, and HAProxy
    /// reaches the primary; `settings` are PostgreSQL settings of every member besides the
    /// usual ones (`("track_commit_timestamp", "on")`, say), written into Patroni's dynamic
    /// configuration, which its members share (Patroni overrides a member's own value of
    /// the settings that must agree across a cluster with it).
    ///
    /// # Errors
    /// Patroni, HAProxy, etcd or PostgreSQL not installed (the message says what to
    /// install); or the cluster does not serve within two minutes (the message carries the
    /// end of each member's log).
    pub fn start(settings: &[(&str, &str)], tie: Tie) -> Result<Self> {
        // Patroni runs PostgreSQL's tools beside `initdb` (`pg_controldata`, `pg_rewind`):
        // the directory `initdb` really is in, not a directory of links to a few of them.
        let bin = bin_dir()
            .and_then(|dir| std::fs::canonicalize(dir.join("initdb")).ok())
            .and_then(|initdb| initdb.parent().map(Path::to_path_buf))
            .filter(|dir| dir.join("pg_controldata").is_file() && dir.join("pg_rewind").is_file())
            .ok_or_else(|| {
                Error::NotInstalled(format!(
                    "no PostgreSQL with pg_controldata and pg_rewind beside initdb: {INSTALL} postgresql"
                ))
            })?;
        for program in ["patroni", "haproxy"] {
            if crate::process::find(&[program], &[PathBuf::from("/usr/sbin")]).is_none() {
                return Err(Error::NotInstalled(format!(
                    "no {program} on the PATH: {INSTALL}"
                )));
            }
        }
        refuse_patroni_3_0()?;
        let mut last = None;
        for _ in 0..ATTEMPTS.min(2) {
            match Self::try_start(settings, tie, &bin) {
                Ok(cluster) => return Ok(cluster),
                Err(error) => last = Some(error),
            }
        }
        Err(last.expect("tried at least once"))
    }

    fn try_start(settings: &[(&str, &str)], tie: Tie, bin: &Path) -> Result<Self> {
        let etcd = EtcdServer::try_start(tie)?;
        let dir = temp_dir("patroni")?;
        let account = unprivileged_account(&dir)?;
        let ports = distinct_free_ports(2 * MEMBERS + 1);
        let members = (0..MEMBERS)
            .map(|i| {
                let home = dir.join(format!("m{i}"));
                Member {
                    name: format!("m{i}"),
                    pg_port: ports[2 * i],
                    api_port: ports[2 * i + 1],
                    config: home.join("patroni.yml"),
                    data: home.join("data"),
                    log: home.join("patroni.log"),
                    patroni: None,
                }
            })
            .collect();
        let mut cluster = Self {
            haproxy_port: ports[2 * MEMBERS],
            dir,
            etcd,
            members,
            haproxy: None,
            bin: bin.to_path_buf(),
            account,
            tie,
        };
        cluster.write_files(settings)?;
        for i in 0..MEMBERS {
            cluster.spawn_patroni(i)?;
            // The first member bootstraps the cluster; the others then copy it.
            if i == 0 {
                cluster.wait(READY_WITHIN, "a primary", |c| c.primary().is_some())?;
            }
        }
        cluster.spawn_haproxy()?;
        cluster.wait(READY_WITHIN, "a synchronous standby and HAProxy", |c| {
            c.sync_standby().is_some() && c.routes_to_a_primary()
        })?;
        Ok(cluster)
    }

    /// Each member's `patroni.yml` (owned by the account it runs as), and HAProxy's file
    /// ([`files`]).
    fn write_files(&self, settings: &[(&str, &str)]) -> Result<()> {
        for member in &self.members {
            let home = member.config.parent().expect("in its member's directory");
            std::fs::create_dir_all(home).map_err(crate::io("making a member's directory"))?;
            let config = files::patroni_yml(&files::MemberFile {
                name: &member.name,
                api_port: member.api_port,
                etcd_port: self.etcd.port(),
                pg_port: member.pg_port,
                data: &member.data,
                bin: &self.bin,
                home,
                settings,
            });
            std::fs::write(&member.config, config)
                .map_err(crate::io("writing a member's patroni.yml"))?;
            if let Some((uid, gid)) = self.account {
                std::os::unix::fs::chown(home, Some(uid), Some(gid))
                    .and_then(|()| std::os::unix::fs::chown(&member.config, Some(uid), Some(gid)))
                    .map_err(crate::io(
                        "giving a member's directory to the postgres account",
                    ))?;
            }
        }
        let servers: Vec<(&str, u16, u16)> = self
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.pg_port, m.api_port))
            .collect();
        std::fs::write(
            self.dir.join("haproxy.cfg"),
            files::haproxy_cfg(self.haproxy_port, &servers),
        )
        .map_err(crate::io("writing haproxy.cfg"))
    }

    fn spawn_patroni(&mut self, i: usize) -> Result<()> {
        let member = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .map_err(crate::io("opening a member's log"))?;
        let err = log
            .try_clone()
            .map_err(crate::io("opening a member's log"))?;
        let mut command = as_account(Command::new("patroni"), self.account);
        command
            .arg(&member.config)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        self.tie.apply(&mut command);
        let child = command.spawn().map_err(crate::io("starting patroni"))?;
        self.members[i].patroni = Some(child);
        Ok(())
    }

    fn spawn_haproxy(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.dir.join("haproxy.log"))
            .map_err(crate::io("opening haproxy's log"))?;
        let err = log
            .try_clone()
            .map_err(crate::io("opening haproxy's log"))?;
        let haproxy = crate::process::find(&["haproxy"], &[PathBuf::from("/usr/sbin")])
            .ok_or_else(|| Error::NotInstalled(format!("no haproxy: {INSTALL}")))?;
        let mut command = Command::new(haproxy);
        command
            .arg("-db")
            .arg("-f")
            .arg(self.dir.join("haproxy.cfg"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        self.tie.apply(&mut command);
        self.haproxy = Some(command.spawn().map_err(crate::io("starting haproxy"))?);
        Ok(())
    }

    /// Poll `ready` until it holds; else an error naming `what`, with each log's end.
    fn wait(&mut self, within: Duration, what: &str, ready: impl Fn(&Self) -> bool) -> Result<()> {
        let deadline = Instant::now() + within;
        let mut exited = None;
        while Instant::now() < deadline && exited.is_none() {
            if ready(self) {
                return Ok(());
            }
            exited = self.members.iter_mut().find_map(|m| {
                let child = m.patroni.as_mut()?;
                matches!(child.try_wait(), Ok(Some(_))).then(|| m.name.clone())
            });
            std::thread::sleep(Duration::from_millis(200));
        }
        let logs: String = self
            .members
            .iter()
            .map(|m| format!("\n--- {} ---\n{}", m.name, log_tail(&m.log, 40)))
            .collect();
        let why = match exited {
            Some(name) => format!("{name}'s Patroni exited"),
            None => format!("none within {within:?}"),
        };
        Err(Error::NotServing(format!(
            "the Patroni cluster had no {what} ({why}):{logs}"
        )))
    }

    /// `postgres://postgres@127.0.0.1:<HAProxy's port>/postgres`: the primary, whichever
    /// member it is.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.haproxy_port
        )
    }

    /// HAProxy's port.
    pub fn port(&self) -> u16 {
        self.haproxy_port
    }

    /// Member `i`'s own PostgreSQL, not through HAProxy.
    pub fn member_url(&self, i: usize) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.members[i].pg_port
        )
    }

    /// Member `i`'s Patroni REST API, `http://127.0.0.1:<port>`.
    pub fn api_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].api_port)
    }

    /// The member whose Patroni says it is the primary (`GET /primary` 200: it holds the
    /// leader lease), if one does.
    pub fn primary(&self) -> Option<usize> {
        (0..MEMBERS).find(|&i| self.answers(i, "/primary"))
    }

    /// The member whose Patroni says it is the synchronous standby, if one does.
    pub fn sync_standby(&self) -> Option<usize> {
        (0..MEMBERS).find(|&i| self.answers(i, "/sync"))
    }

    /// Whether member `i`'s Patroni answers `GET path` with 200.
    pub fn answers(&self, i: usize, path: &str) -> bool {
        self.members[i].patroni.is_some()
            && http_request(self.members[i].api_port, "GET", path, "").is_some()
    }

    /// Whether a connection through HAProxy reaches a PostgreSQL that takes writes.
    pub fn routes_to_a_primary(&self) -> bool {
        let Some(psql) = Some(self.bin.join("psql")).filter(|p| p.is_file()) else {
            return false;
        };
        Command::new(psql)
            .arg("-X")
            .args(["-h", "127.0.0.1", "-p", &self.haproxy_port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-Atqc"])
            .arg("select not pg_is_in_recovery()")
            .env("PGCONNECT_TIMEOUT", "2")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success() && out.stdout.starts_with(b"t"))
    }

    /// Wait until a member is the primary and HAProxy sends connections to it; its index.
    ///
    /// # Errors
    /// None within `within` (with the end of each member's log).
    pub fn wait_for_primary(&mut self, within: Duration) -> Result<usize> {
        self.wait(within, "primary behind HAProxy", |c| {
            c.primary().is_some() && c.routes_to_a_primary()
        })?;
        self.primary()
            .ok_or_else(|| Error::NotServing("the primary stepped down at once".into()))
    }

    /// Wait until a member other than `old` is the primary and HAProxy sends connections
    /// to it (after `old` was killed or paused); its index.
    ///
    /// # Errors
    /// None within `within` (with the end of each member's log).
    pub fn wait_for_primary_other_than(&mut self, old: usize, within: Duration) -> Result<usize> {
        let promoted = |c: &Self| c.primary().filter(|&p| p != old);
        self.wait(within, "new primary behind HAProxy", |c| {
            promoted(c).is_some() && c.routes_to_a_primary()
        })?;
        promoted(self)
            .ok_or_else(|| Error::NotServing("the new primary stepped down at once".into()))
    }

    /// Wait until a member is the synchronous standby; its index.
    ///
    /// # Errors
    /// None within `within`.
    pub fn wait_for_sync_standby(&mut self, within: Duration) -> Result<usize> {
        self.wait(within, "synchronous standby", |c| {
            c.sync_standby().is_some()
        })?;
        self.sync_standby()
            .ok_or_else(|| Error::NotServing("the synchronous standby went at once".into()))
    }

    /// The pids of member `i`: its Patroni, its postmaster and the postmaster's children
    /// (empty while killed).
    pub fn pids(&self, i: usize) -> Vec<u32> {
        let member = &self.members[i];
        let Some(patroni) = &member.patroni else {
            return Vec::new();
        };
        let mut pids = vec![patroni.id()];
        if let Some(postmaster) = postmaster_pid(&member.data) {
            pids.push(postmaster);
            pids.extend(children_of(postmaster));
        }
        pids
    }

    /// The pid of member `i`'s postmaster, from its `postmaster.pid`, if it runs.
    pub fn postmaster(&self, i: usize) -> Option<u32> {
        postmaster_pid(&self.members[i].data)
    }

    /// Kill member `i` as its machine would die: SIGKILL to its Patroni and its PostgreSQL.
    /// Its data stays, for [`restart`](Self::restart).
    pub fn kill(&mut self, i: usize) {
        let postmaster = postmaster_pid(&self.members[i].data);
        let children = postmaster.map(children_of).unwrap_or_default();
        if let Some(patroni) = self.members[i].patroni.take() {
            reap(patroni);
        }
        for pid in postmaster.into_iter().chain(children) {
            signal(pid, libc::SIGKILL);
        }
        if let Some(postmaster) = postmaster {
            wait_gone(postmaster);
        }
    }

    /// Pause member `i` as a whole (`SIGSTOP` to its Patroni, its postmaster and the
    /// postmaster's children), as a machine that freezes.
    pub fn pause(&self, i: usize) {
        for pid in self.pids(i) {
            signal(pid, libc::SIGSTOP);
        }
    }

    /// Resume member `i` after [`pause`](Self::pause) (`SIGCONT`).
    pub fn resume(&self, i: usize) {
        for pid in self.pids(i) {
            signal(pid, libc::SIGCONT);
        }
    }

    /// Start member `i`'s Patroni again on its data (after [`kill`](Self::kill)): it rejoins
    /// the cluster, rewinding its data if it was a primary that lost commits nobody was
    /// answered for.
    ///
    /// # Errors
    /// Patroni cannot be spawned.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.members[i].patroni.is_none() {
            self.spawn_patroni(i)?;
        }
        Ok(())
    }

    /// The etcd Patroni keeps its leader lease in (to kill it and see what Patroni does).
    pub fn etcd(&mut self) -> &mut EtcdServer {
        &mut self.etcd
    }

    /// The end of member `i`'s Patroni log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        log_tail(&self.members[i].log, lines)
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        if let Some(haproxy) = self.haproxy.take() {
            reap(haproxy);
        }
        for i in 0..MEMBERS {
            // A paused member takes SIGKILL too.
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Patroni 3.0 (Debian bookworm's package) keeps a stale copy of etcd's keys after a
/// failover and then fails every update of the synchronous standby's key ("Synchronous
/// replication key updated by someone else", patroni#2779, fixed in a later release): the
/// cluster serves without a synchronous standby until its Patroni restarts. Anything older
/// than 4 (4.1.5 is what runs here) is refused, with how to install it.
fn refuse_patroni_3_0() -> Result<()> {
    let output = Command::new("patroni")
        .arg("--version")
        .output()
        .map_err(crate::io("running patroni --version"))?;
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let major: Option<u32> = version
        .strip_prefix("patroni ")
        .and_then(|v| v.split('.').next()?.parse().ok());
    if major.is_none_or(|major| major < 4) {
        return Err(Error::NotInstalled(format!(
            "{version:?} on the PATH: Patroni 3.0 (Debian bookworm's) loses track of its \
             synchronous standby after a failover (patroni#2779), and 4.1 is what runs here: \
             install it (python3 -m venv /opt/patroni-venv && /opt/patroni-venv/bin/pip \
             install 'patroni[etcd3,psycopg3]' 'psycopg[binary]' && ln -s \
             /opt/patroni-venv/bin/patroni /usr/local/bin/patroni)"
        )));
    }
    Ok(())
}

/// The postmaster's pid, from the first line of `data/postmaster.pid`, if that process runs
/// and is the postmaster of `data` (its command line names the directory): a file left by a
/// killed postmaster may name a pid the system has since given to another process.
fn postmaster_pid(data: &Path) -> Option<u32> {
    let file = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: u32 = file.lines().next()?.trim().parse().ok()?;
    let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let ours = String::from_utf8_lossy(&command_line).contains(&*data.to_string_lossy());
    (ours && alive(pid)).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `postmaster.pid` left by a killed postmaster may name a pid now given to another
    /// process: that process (here, this test's) is not taken for the postmaster, so it is
    /// never signalled.
    #[test]
    fn a_pid_file_naming_another_process_is_not_taken_for_the_postmaster() {
        let data = temp_dir("patroni-pid-file").unwrap();
        std::fs::write(
            data.join("postmaster.pid"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        let found = postmaster_pid(&data);
        std::fs::remove_dir_all(&data).unwrap();
        assert_eq!(found, None);
    }
}
