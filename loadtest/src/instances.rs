//! seckill instances as child processes of this binary (`loadtest serve`), so the demo needs
//! nothing built by hand.
//!
//! - Each binds port 0 for both its listeners and reports the ports it got (`listening on
//!   <address>` and `operations on <address>` on stdout), so no other process can take a
//!   port between our choosing it and the instance binding it.
//! - Each runs in a process group of its own, so a Ctrl-C at the terminal reaches the demo
//!   only (which then stops everything in order), and with a parent-death signal, so no
//!   instance outlives a demo that is killed.
//! - Each is stopped by the pid it was started with. Its log has a name of its own and is
//!   kept when the instance failed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

/// What every instance of one run shares.
#[derive(Debug, Clone)]
pub struct InstanceConfig<'a> {
    pub database_url: &'a str,
    pub redis_url: &'a str,
    pub redis_key_prefix: &'a str,
    pub admin_token: &'a str,
    pub strategy: seckill::LockStrategy,
    pub work_ms: u64,
    /// `LOCK_WAIT_MS`.
    pub lock_wait_ms: u64,
    /// `LOCK_TTL_MS`.
    pub lock_ttl_ms: u64,
    /// `REDLOCK_URLS` (comma-separated), for `LOCK_STRATEGY=redlock`; empty otherwise.
    pub redlock_urls: &'a str,
    /// Any other settings, as environment variables (`BATCH_MAX`, `PG_LOCK_TIMEOUT_MS`, ...).
    pub extra: Vec<(&'static str, String)>,
}

/// One running instance, killed when dropped.
pub struct Instance {
    child: Child,
    /// The buyers' listener (`BIND_ADDR`), as `http://host:port`.
    pub url: String,
    /// The operators' listener (`OPS_BIND_ADDR`): admin writes, `/metrics`, `/readyz`.
    pub ops_url: String,
    pub log: PathBuf,
    /// Keep the log when the instance is dropped (it failed, or someone wants to read it).
    keep_log: bool,
    /// Killed by [`kill`](Self::kill): its exit is no failure of its own.
    killed: bool,
}

impl Instance {
    /// Start `<loadtest> serve` on a port of its own and wait until `/readyz` says yes.
    /// `loadtest` is the path of this binary (the demo passes its own).
    ///
    /// # Errors
    /// When the instance cannot start, exits, or is not ready within 60 s; the message
    /// names its log, which is kept.
    pub async fn start(
        loadtest: &Path,
        config: &InstanceConfig<'_>,
        name: &str,
    ) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!(
            "seckill-{}-{name}-{:08x}.log",
            std::process::id(),
            rand::random::<u32>()
        ));
        let log_file = std::fs::File::create(&log).context("creating the instance's log file")?;
        let mut command = Command::new(loadtest);
        command
            .arg("serve")
            .env("DATABASE_URL", config.database_url)
            .env("REDIS_URL", config.redis_url)
            .env("REDIS_KEY_PREFIX", config.redis_key_prefix)
            .env("BIND_ADDR", "127.0.0.1:0")
            .env("OPS_BIND_ADDR", "127.0.0.1:0")
            .env("ADMIN_TOKEN", config.admin_token)
            // Buyers' tokens are signed by this tool (`buyers`); every buyer of a load test
            // comes from this machine's one address, so the per-address limit is off (the
            // per-buyer limit stays at its default).
            .env("BUYER_JWT_SECRET", crate::buyers::secret())
            .env("ADDRESS_RATE", "0")
            .env("LOCK_STRATEGY", config.strategy.name())
            .env("WORK_MS", config.work_ms.to_string())
            .env("LOCK_WAIT_MS", config.lock_wait_ms.to_string())
            .env("LOCK_TTL_MS", config.lock_ttl_ms.to_string())
            .env("REDLOCK_URLS", config.redlock_urls)
            .env("RUST_LOG", "warn")
            .envs(config.extra.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file.try_clone()?);
        ::servers::Tie::OwnGroupDiesWithSpawner.apply(&mut command);
        let mut child = command.spawn().context("starting a seckill instance")?;
        let stdout = child.stdout.take().expect("piped");
        let mut instance = Self {
            child,
            url: String::new(),
            ops_url: String::new(),
            log,
            keep_log: true,
            killed: false,
        };
        let (address, ops_address) = match read_addresses(stdout, log_file).await {
            Ok(addresses) => addresses,
            Err(error) => bail!("{error:#}; see {}", instance.log.display()),
        };
        instance.url = format!("http://{address}");
        instance.ops_url = format!("http://{ops_address}");
        instance.wait_ready().await?;
        instance.keep_log = false;
        Ok(instance)
    }

    /// The child's process id, for fault injection (SIGSTOP, SIGKILL) by pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Keep the log after the instance is gone (to read it, or because something failed).
    pub fn keep_log(&mut self) {
        self.keep_log = true;
    }

    /// SIGKILL the instance now and reap it. One that had already exited by itself is
    /// left as it ended: [`exited_by_itself`](Self::exited_by_itself) still says so.
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.killed = true;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// How the instance ended, if it exited by itself (not by [`kill`](Self::kill)).
    pub fn exited_by_itself(&mut self) -> Option<std::process::ExitStatus> {
        match self.child.try_wait() {
            Ok(Some(status)) if !self.killed => Some(status),
            _ => None,
        }
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("instance exited with {status}; see {}", self.log.display());
            }
            if let Ok(response) = client.get(format!("{}/readyz", self.ops_url)).send().await
                && response.status() == 200
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "instance at {} not ready after 60 s; see {}",
            self.url,
            self.log.display()
        )
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // An instance that had already exited by itself when it was dropped failed: keep its
        // log.
        if let Some(status) = self.exited_by_itself() {
            eprintln!(
                "the instance at {} had exited ({status}); its log is kept: {}",
                self.url,
                self.log.display()
            );
            self.keep_log = true;
        }
        self.kill();
        if !self.keep_log {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Read the instance's stdout until it says where it listens, for buyers and for
/// operators; copy every line to its log (the rest too, in a thread, for as long as the
/// instance writes).
async fn read_addresses(
    stdout: std::process::ChildStdout,
    mut log: std::fs::File,
) -> anyhow::Result<(String, String)> {
    let (found, addresses) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let (mut found, mut public) = (Some(found), None);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(log, "{line}");
            if let Some(address) = line.strip_prefix("listening on ") {
                public = Some(address.trim().to_owned());
            } else if let Some(ops) = line.strip_prefix("operations on ")
                && let Some(public) = public.take()
                && let Some(found) = found.take()
            {
                let _ = found.send((public, ops.trim().to_owned()));
            }
        }
    });
    match tokio::time::timeout(Duration::from_secs(60), addresses).await {
        Ok(Ok(addresses)) => Ok(addresses),
        Ok(Err(_)) => bail!("the instance stopped before it said where it listens"),
        Err(_) => bail!("the instance did not say where it listens within 60 s"),
    }
}
