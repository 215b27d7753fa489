//! seckill instances as child processes of this binary (`loadtest serve`), so the demo needs
//! nothing built by hand. Each is stopped by the pid it was started with.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

/// What every instance of one run shares.
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
}

/// One running instance, killed when dropped.
pub struct Instance {
    child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Instance {
    /// Start `<loadtest> serve` on a free port and wait until `/readyz` says yes.
    /// `loadtest` is the path of this binary (the demo passes its own).
    pub async fn start(
        loadtest: &Path,
        config: &InstanceConfig<'_>,
        name: &str,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let log = std::env::temp_dir().join(format!("seckill-{}-{name}.log", std::process::id()));
        let log_file = std::fs::File::create(&log).context("creating the instance's log file")?;
        let child = Command::new(loadtest)
            .arg("serve")
            .env("DATABASE_URL", config.database_url)
            .env("REDIS_URL", config.redis_url)
            .env("REDIS_KEY_PREFIX", config.redis_key_prefix)
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("ADMIN_TOKEN", config.admin_token)
            .env("LOCK_STRATEGY", config.strategy.name())
            .env("WORK_MS", config.work_ms.to_string())
            .env("LOCK_WAIT_MS", config.lock_wait_ms.to_string())
            .env("LOCK_TTL_MS", config.lock_ttl_ms.to_string())
            .env("REDLOCK_URLS", config.redlock_urls)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting a seckill instance")?;
        let mut instance = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        instance.wait_ready().await?;
        Ok(instance)
    }

    /// The child's process id, for fault injection (SIGSTOP, SIGKILL) by pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL the instance now and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("instance exited with {status}; see {}", self.log.display());
            }
            if let Ok(response) = client.get(format!("{}/readyz", self.url)).send().await
                && response.status() == 200
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
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
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
