//! The demo's servers: the ones given, the ones already running at the default addresses,
//! or private throwaway ones started for the demo and removed after it.
//!
//! A private PostgreSQL is `initdb` into a temporary directory and `postgres` on a free
//! port; a private Redis is `redis-server` on a free port, keeping nothing on disk; a private
//! ZooKeeper or etcd ([`consensus`]) keeps its data in a temporary directory. All are
//! children in their own process group with a parent-death signal (see [`crate::instances`]),
//! and are stopped, and their directory removed, when dropped. `initdb` refuses to run as
//! root, so as root the private PostgreSQL runs as the `postgres` account.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::Url;
use sqlx::{Connection, PgConnection};

use crate::instances::own_process_group_and_die_with_parent;

mod consensus;
pub use consensus::{DEFAULT_ETCD, DEFAULT_ZOOKEEPER, ZOOKEEPER_MAX_SESSION_TIMEOUT_MS};
pub use consensus::{etcd, start_etcd, start_zookeeper, zookeeper};

/// Where the demo looks when no URL is given.
pub const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

/// A server the demo uses: its URL, and the private process behind it, if any.
pub struct Server {
    pub url: String,
    /// `Some` for a private server; stopped when the `Server` is dropped.
    private: Option<Private>,
}

impl Server {
    /// Whether the demo started this server itself.
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }
}

struct Private {
    child: Child,
    /// Removed when the server is stopped.
    dir: Option<PathBuf>,
    /// How it was started: [`Server::restart`] starts it again the same way.
    launch: Launch,
}

/// A private server's command line and the account it runs as.
struct Launch {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    account: Option<(u32, u32)>,
    /// The port it listens on, which a restart keeps (clients and proxies point at it).
    port: u16,
    /// Where its output goes (appended), for a server whose failure to start only its log
    /// explains (a JVM); `None` discards it.
    log: Option<PathBuf>,
}

impl Launch {
    fn spawn(&self) -> std::io::Result<Child> {
        let mut command = as_account(Command::new(&self.program), self.account);
        let (stdout, stderr) = match &self.log {
            Some(path) => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                (Stdio::from(log.try_clone()?), Stdio::from(log))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        own_process_group_and_die_with_parent(&mut command);
        command.spawn()
    }
}

impl Private {
    /// SIGINT (PostgreSQL's fast shutdown; Redis stops, keeping nothing), then SIGKILL after
    /// 5 s; the child is reaped.
    fn stop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to our own child by its pid.
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Server {
    /// Stop a private server and start it again on the same port, PostgreSQL on the same
    /// data directory: what `pg_ctl restart -m fast` does (SIGINT is its fast shutdown), but
    /// the server stays a child of this process, in its own process group and with a
    /// parent-death signal. A private Redis comes back empty: it keeps nothing on disk.
    /// Blocks until the port accepts connections again (PostgreSQL may still be starting
    /// up behind it for a moment: connect with retries).
    ///
    /// # Errors
    /// A server the demo did not start; or it does not come back within 30 s.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let Some(private) = &mut self.private else {
            bail!("only a private server can be restarted");
        };
        private.stop();
        let port = private.launch.port;
        // The old server's socket may linger a moment after it exited: try a few times.
        for _ in 0..5 {
            private.child = private
                .launch
                .spawn()
                .context("starting the private server again")?;
            if wait_for_port(port, &mut private.child, Duration::from_secs(30)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("the private server did not come back on port {port}")
    }

    /// The process id of a private server now (a restart changes it).
    pub fn pid(&self) -> Option<u32> {
        self.private.as_ref().map(|p| p.child.id())
    }
}

/// PostgreSQL for the demo: `given` if any (it must answer); else the default address if
/// something answers there; else a private one.
///
/// # Errors
/// A given URL that does not answer; or nothing at the default address and PostgreSQL not
/// installed (the message says what to install or pass).
pub async fn postgres(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(url) = given {
        return Ok(Server {
            url: url.to_owned(),
            private: None,
        });
    }
    if sqlx::PgPool::connect(DEFAULT_POSTGRES).await.is_ok() {
        return Ok(Server {
            url: DEFAULT_POSTGRES.to_owned(),
            private: None,
        });
    }
    let private = start_postgres().await?;
    Ok(private)
}

/// Redis for the demo, chosen as [`postgres`] chooses.
///
/// # Errors
/// As [`postgres`].
pub async fn redis(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(url) = given {
        return Ok(Server {
            url: url.to_owned(),
            private: None,
        });
    }
    if TcpStream::connect(("127.0.0.1", 6379)).is_ok() {
        return Ok(Server {
            url: DEFAULT_REDIS.to_owned(),
            private: None,
        });
    }
    start_redis()
}

/// A private `redis-server`, keeping nothing on disk.
///
/// # Errors
/// `redis-server` not installed, or it does not start.
pub fn start_redis() -> anyhow::Result<Server> {
    let binary = find(&["redis-server"], &[]).context(
        "nothing answers at 127.0.0.1:6379 and redis-server is not installed: install Redis \
         (Debian: apt-get install redis-server) or pass --redis-url",
    )?;
    for _ in 0..5 {
        let port = free_port()?;
        let launch = Launch {
            program: binary.clone(),
            args: ["--port", &port.to_string(), "--bind", "127.0.0.1"]
                .into_iter()
                .chain(["--save", "", "--appendonly", "no"])
                .map(Into::into)
                .collect(),
            account: None,
            port,
            log: None,
        };
        let child = launch.spawn().context("starting redis-server")?;
        let mut private = Private {
            child,
            dir: None,
            launch,
        };
        let url = format!("redis://127.0.0.1:{port}");
        if wait_for_port(port, &mut private.child, Duration::from_secs(10))
            && redis_pid(&url) == Some(private.child.id())
        {
            return Ok(Server {
                url,
                private: Some(private),
            });
        }
        // The port was taken between our look and its bind (something else answers there,
        // or our server exited): try another.
    }
    bail!("a private redis-server did not start")
}

async fn start_postgres() -> anyhow::Result<Server> {
    start_postgres_with(&[]).await
}

/// A private PostgreSQL (`initdb` into a temporary directory, removed when the server is
/// dropped), with these settings besides the usual ones (`("track_commit_timestamp",
/// "on")`, say).
///
/// # Errors
/// PostgreSQL not installed, `initdb` fails, or the server does not start.
pub async fn start_postgres_with(settings: &[(&str, &str)]) -> anyhow::Result<Server> {
    let bin = postgres_bin_dir().context(
        "nothing answers at 127.0.0.1:5432 and PostgreSQL is not installed (no initdb on the \
         PATH or in /usr/lib/postgresql/*/bin): install PostgreSQL (Debian: apt-get install \
         postgresql) or pass --database-url",
    )?;
    let dir = std::env::temp_dir().join(format!(
        "seckill-demo-pg-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).context("creating the private PostgreSQL's directory")?;
    let account = unprivileged_account(&dir)?;
    let data = dir.join("data");
    let initdb = as_account(Command::new(bin.join("initdb")), account)
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running initdb")?;
    if !initdb.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        bail!("initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
    }
    for _ in 0..5 {
        let port = free_port()?;
        let mut args: Vec<std::ffi::OsString> = vec!["-D".into(), data.clone().into()];
        for setting in [
            format!("port={port}"),
            "listen_addresses=127.0.0.1".to_owned(),
            format!("unix_socket_directories={}", dir.display()),
            "max_connections=200".to_owned(),
        ]
        .into_iter()
        .chain(
            settings
                .iter()
                .map(|(name, value)| format!("{name}={value}")),
        ) {
            args.extend(["-c".into(), setting.into()]);
        }
        let launch = Launch {
            program: bin.join("postgres"),
            args,
            account,
            port,
            log: None,
        };
        let child = launch.spawn().context("starting postgres")?;
        let mut private = Private {
            child,
            dir: Some(dir.clone()),
            launch,
        };
        if wait_for_port(port, &mut private.child, Duration::from_secs(30)) {
            let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            // The port opens a moment before connections are accepted. The server that
            // answers must be ours (its data directory), not one that took the port first.
            for _ in 0..100 {
                if let Ok(pool) = sqlx::PgPool::connect(&url).await {
                    let serves: Option<String> =
                        sqlx::query_scalar("SELECT current_setting('data_directory')")
                            .fetch_one(&pool)
                            .await
                            .ok();
                    pool.close().await;
                    if serves.is_some_and(|d| Path::new(&d) == data) {
                        return Ok(Server {
                            url,
                            private: Some(private),
                        });
                    }
                    break;
                }
                if matches!(private.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // `private` is dropped here: the server stopped, but keep the directory for the
        // next try.
        private.dir = None;
    }
    let _ = std::fs::remove_dir_all(&dir);
    bail!("a private PostgreSQL did not start")
}

/// As root, the `postgres` account (which then owns `dir`); otherwise ourselves (`None`).
fn unprivileged_account(dir: &Path) -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: a valid C string; the result is read before any other getpw* call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        bail!(
            "running as root, and initdb refuses root: create a `postgres` account (Debian's \
             postgresql package does) or pass --database-url"
        );
    }
    // SAFETY: checked non-null above.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .context("giving the private PostgreSQL's directory to the postgres account")?;
    Ok(Some((uid, gid)))
}

fn as_account(mut command: Command, account: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = account {
        command.uid(uid).gid(gid);
    }
    command
}

/// The directory holding `initdb` and `postgres`: on the PATH, or the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn postgres_bin_dir() -> Option<PathBuf> {
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

/// The first directory of the PATH, then of `extra`, that holds every one of `names`;
/// returns the path of the first name there.
fn find(names: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().cloned())
        .find(|dir| names.iter().all(|name| dir.join(name).is_file()))
        .map(|dir| dir.join(names[0]))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The `process_id` of the Redis server at `url`, if one answers within a second.
pub(crate) fn redis_pid(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// Wait until something accepts connections on `port`; `false` if `child` exits or time runs out.
fn wait_for_port(port: u16, child: &mut Child, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Delete the run's keys from a Redis: the lock's fence counters have no TTL by design.
pub async fn forget_keys(redis_url: &str, prefix: &str) -> anyhow::Result<()> {
    let mut conn = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await
        .context("cannot reach Redis to clean up the keys")?;
    // The fence key wraps the lock key in a hash tag: `{<prefix>lock_sale_1}:fence`.
    for pattern in [format!("{prefix}*"), format!("{{{prefix}*")] {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                redis::cmd("DEL")
                    .arg(&keys)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}

/// A database of its own for one run, on the server `admin_url` points at (its user,
/// password, host and parameters kept), removed with [`remove`](Self::remove).
pub struct ThrowawayDatabase {
    admin_url: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

impl ThrowawayDatabase {
    /// Create database `name`.
    ///
    /// # Errors
    /// When PostgreSQL cannot be reached or refuses.
    pub async fn create(admin_url: &str, name: String) -> anyhow::Result<Self> {
        let mut admin = PgConnection::connect(admin_url)
            .await
            .context("cannot connect to PostgreSQL to create a throwaway database")?;
        sqlx::query(&format!(r#"CREATE DATABASE "{name}""#))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        let mut url = Url::parse(admin_url).context("invalid PostgreSQL URL")?;
        url.set_path(&format!("/{name}"));
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url: url.to_string(),
        })
    }

    /// Drop the database, closing whatever is still connected to it.
    ///
    /// # Errors
    /// When PostgreSQL cannot be reached or refuses.
    pub async fn remove(self) -> anyhow::Result<()> {
        let mut admin = PgConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, self.name))
            .execute(&mut admin)
            .await?;
        Ok(())
    }
}
