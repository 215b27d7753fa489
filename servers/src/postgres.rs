//! [`PostgresServer`]: a private PostgreSQL, `initdb` into a temporary directory and
//! `postgres` on a free port of 127.0.0.1, for a program that finds no PostgreSQL or needs
//! one it may restart (the soak).
//!
//! Assumes PostgreSQL's `initdb` and `postgres` on the PATH, in the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian) or in `/usr/local/pgsql/bin`. `initdb`
//! refuses to run as root, so as root the server runs as the `postgres` account. The server
//! is ours once its data directory's `postmaster.pid` says `ready` while our child runs:
//! PostgreSQL exits when it cannot bind its only address, so a ready child serves the port.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Tie, find, stop, temp_dir};
use crate::tls::ServerCertificate;
use crate::{ATTEMPTS, Error, Result, free_port};

/// How long a private PostgreSQL may take to accept connections after it was spawned.
///
/// TIMING: a fresh cluster starts in well under a second; 30 s leaves room for a busy machine.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A private PostgreSQL on a port of its own, stopped by its pid (a fast shutdown) and its
/// directory removed when dropped. Its superuser is `postgres`, trusted on 127.0.0.1.
pub struct PostgresServer {
    /// `None` while stopped.
    child: Option<Child>,
    port: u16,
    /// Holds `data` and the server's Unix socket; removed when dropped.
    dir: PathBuf,
    /// The cluster `initdb` made.
    data: PathBuf,
    /// `postgres`, and its arguments: a restart starts it the same way.
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    /// The account it runs as, when not ours (uid, gid).
    account: Option<(u32, u32)>,
    tie: Tie,
}

impl PostgresServer {
    /// Make a cluster and start a server on it, with these settings besides the usual ones
    /// (`("track_commit_timestamp", "on")`, say), tied to this process as `tie` says.
    ///
    /// # Errors
    /// PostgreSQL not installed, or no `postgres` account while running as root (the message
    /// says what to do); `initdb` fails; or the server does not start on any of a few ports.
    pub fn start(settings: &[(&str, &str)], tie: Tie) -> Result<Self> {
        Self::start_with(settings, None, tie)
    }

    /// [`start`](Self::start) a server that takes TCP connections over TLS only, presenting
    /// `certificate` (its Unix socket stays open to everyone, for the superuser's tools). A
    /// client that does not ask for TLS is refused (`no pg_hba.conf entry ... no
    /// encryption`).
    ///
    /// # Errors
    /// As [`start`](Self::start), and the certificate cannot be written.
    pub fn start_tls_only(
        settings: &[(&str, &str)],
        certificate: &ServerCertificate,
        tie: Tie,
    ) -> Result<Self> {
        Self::start_with(settings, Some(certificate), tie)
    }

    fn start_with(
        settings: &[(&str, &str)],
        certificate: Option<&ServerCertificate>,
        tie: Tie,
    ) -> Result<Self> {
        let bin = bin_dir().ok_or_else(|| {
            Error::NotInstalled(
                "PostgreSQL is not installed (no initdb on the PATH or in \
                 /usr/lib/postgresql/*/bin): install PostgreSQL (Debian: apt-get install \
                 postgresql)"
                    .into(),
            )
        })?;
        let dir = temp_dir("pg")?;
        let mut server = Self {
            child: None,
            port: 0,
            data: dir.join("data"),
            dir,
            program: bin.join("postgres"),
            args: Vec::new(),
            account: None,
            tie,
        };
        server.account = unprivileged_account(&server.dir)?;
        server.initdb(&bin)?;
        let mut settings: Vec<(String, String)> = settings
            .iter()
            .map(|&(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        if let Some(certificate) = certificate {
            settings.extend(server.tls_only(certificate)?);
        }
        for _ in 0..ATTEMPTS {
            server.port = free_port();
            server.args = server.arguments(&settings);
            server.spawn()?;
            if server.wait_until_ready() {
                return Ok(server);
            }
            server.stop();
        }
        Err(Error::NotServing(format!(
            "a private PostgreSQL did not start on any of {ATTEMPTS} free ports"
        )))
    }

    /// `initdb` the cluster, its superuser `postgres` trusted.
    fn initdb(&self, bin: &Path) -> Result<()> {
        let output = as_account(Command::new(bin.join("initdb")), self.account)
            .arg("-D")
            .arg(&self.data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(crate::io("running initdb"))?;
        if !output.status.success() {
            return Err(Error::NotServing(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    /// Write `certificate` beside the cluster and let TCP clients in over TLS only: the
    /// settings that turn TLS on with it.
    fn tls_only(&self, certificate: &ServerCertificate) -> Result<Vec<(String, String)>> {
        let (cert, key) = certificate.write_to(&self.dir, self.account)?;
        let rules = "local all all trust\nhostssl all all 127.0.0.1/32 trust\n";
        std::fs::write(self.data.join("pg_hba.conf"), rules)
            .map_err(crate::io("writing the private PostgreSQL's pg_hba.conf"))?;
        Ok(vec![
            ("ssl".to_owned(), "on".to_owned()),
            ("ssl_cert_file".to_owned(), cert.display().to_string()),
            ("ssl_key_file".to_owned(), key.display().to_string()),
        ])
    }

    /// `postgres`'s arguments: the data directory, this port, and `settings`.
    fn arguments(&self, settings: &[(String, String)]) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["-D".into(), self.data.clone().into()];
        let usual = [
            format!("port={}", self.port),
            "listen_addresses=127.0.0.1".to_owned(),
            format!("unix_socket_directories={}", self.dir.display()),
            "max_connections=200".to_owned(),
        ];
        let given = settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"));
        for setting in usual.into_iter().chain(given) {
            args.extend(["-c".into(), setting.into()]);
        }
        args
    }

    fn spawn(&mut self) -> Result<()> {
        let mut command = as_account(Command::new(&self.program), self.account);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.tie.apply(&mut command);
        self.child = Some(command.spawn().map_err(crate::io("starting postgres"))?);
        Ok(())
    }

    /// Wait until the server accepts connections: its `postmaster.pid` says `ready` while
    /// our child runs. `false` if it exits (its port was taken) or is not ready in time.
    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let Some(child) = self.child.as_mut() else {
                return false;
            };
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid"));
            // Line 1 is the postmaster's pid, line 4 its port, line 8 its status.
            let lines: Vec<String> = pid_file
                .unwrap_or_default()
                .lines()
                .map(|l| l.trim().to_owned())
                .collect();
            let ours = lines.first() == Some(&child.id().to_string())
                && lines.get(3) == Some(&self.port.to_string());
            if ours && lines.get(7).is_some_and(|status| status == "ready") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Stop the server with a fast shutdown (SIGINT, then SIGKILL after 5 s); its data
    /// stays for [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop(child);
        }
    }

    /// Stop the server and start it again on the same port and data: what `pg_ctl restart
    /// -m fast` does, but the server stays a child of this process, tied as it was.
    ///
    /// # Errors
    /// It does not come back within a few tries.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        // The old server's socket may linger a moment after it exited: try a few times.
        for _ in 0..ATTEMPTS {
            self.spawn()?;
            if self.wait_until_ready() {
                return Ok(());
            }
            self.stop();
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(Error::NotServing(format!(
            "the private PostgreSQL did not come back on port {}",
            self.port
        )))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pid of the running server (a restart changes it); `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// As root, the `postgres` account (which then owns `dir`); otherwise ourselves (`None`).
pub(crate) fn unprivileged_account(dir: &Path) -> Result<Option<(u32, u32)>> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: a valid C string; the result is read before any other getpw* call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err(Error::NotInstalled(
            "running as root, and initdb refuses root: create a `postgres` account (Debian's \
             postgresql package does)"
                .into(),
        ));
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(crate::io(
        "giving the private PostgreSQL's directory to the postgres account",
    ))?;
    Ok(Some((uid, gid)))
}

pub(crate) fn as_account(mut command: Command, account: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = account {
        command.uid(uid).gid(gid);
    }
    command
}

/// The directory holding `initdb` and `postgres`: on the PATH, or the newest
/// `/usr/lib/postgresql/<version>/bin`.
pub(crate) fn bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .collect();
    versions.sort_by_key(|path| {
        path.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    let mut extra: Vec<PathBuf> = versions.into_iter().rev().collect();
    extra.push(PathBuf::from("/usr/local/pgsql/bin"));
    find(&["initdb", "postgres"], &extra).and_then(|initdb| initdb.parent().map(Path::to_path_buf))
}
