//! The compose stack's router, [`deploy/haproxy/router.cfg`](../../deploy/haproxy/router.cfg),
//! run by a real HAProxy (Debian's `haproxy`) on this machine, in front of instances of this
//! machine: for `bench-http`'s run through the router and the router's tests. The committed
//! file is used as it is, but for its addresses.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::instances::Instance;

/// Where the committed configuration is, in the checkout this binary was built from.
pub const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/haproxy/router.cfg");

/// An instance behind the router: its buyers' port and its operators' port (for `/readyz`),
/// both on 127.0.0.1.
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    pub buyers: u16,
    pub ops: u16,
}

impl Backend {
    /// A local instance's two listeners.
    pub fn of(instance: &Instance) -> anyhow::Result<Self> {
        let port = |url: &str| {
            reqwest::Url::parse(url)
                .ok()
                .and_then(|url| url.port_or_known_default())
                .with_context(|| format!("no port in {url}"))
        };
        Ok(Self {
            buyers: port(&instance.url)?,
            ops: port(&instance.ops_url)?,
        })
    }
}

/// `committed` with its `server` lines, in order, pointed at `backends`, its buyers'
/// frontend on 127.0.0.1:`front` and its health monitor on 127.0.0.1:`health`. `quiet`
/// leaves out the log line of every request (a cost on the path being measured).
pub fn config(
    committed: &str,
    backends: &[Backend],
    front: u16,
    health: u16,
    quiet: bool,
) -> anyhow::Result<String> {
    let mut servers = backends.iter();
    let mut out = String::new();
    let mut binds = 0;
    for line in committed.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let line = match words.as_slice() {
            ["server", name, _, "check", "port", _] => {
                let Some(backend) = servers.next() else {
                    bail!(
                        "router.cfg has more servers than the {} given",
                        backends.len()
                    );
                };
                let indent = &line[..line.len() - line.trim_start().len()];
                format!(
                    "{indent}server {name} 127.0.0.1:{} check port {}",
                    backend.buyers, backend.ops
                )
            }
            ["bind", ":8080"] => {
                binds += 1;
                line.replace(":8080", &format!("127.0.0.1:{front}"))
            }
            ["bind", ":8404"] => {
                binds += 1;
                line.replace(":8404", &format!("127.0.0.1:{health}"))
            }
            ["log", ..] | ["option", "httplog"] if quiet => continue,
            _ => line.to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    if servers.next().is_some() {
        bail!(
            "router.cfg has fewer servers than the {} given",
            backends.len()
        );
    }
    if binds != 2 {
        bail!("router.cfg's binds are not :8080 and :8404 as expected");
    }
    Ok(out)
}

/// Where HAProxy is (on the PATH, or in /usr/sbin where Debian puts it), or why not.
pub fn haproxy() -> anyhow::Result<PathBuf> {
    servers::find_program(&["haproxy"], &[PathBuf::from("/usr/sbin")])
        .context("haproxy is not installed: install it (Debian: apt-get install haproxy)")
}

/// HAProxy running the committed router configuration, stopped (by the pid started) and
/// its files removed when dropped; killed by the kernel if this program dies first.
pub struct Router {
    child: Child,
    dir: PathBuf,
    /// The buyers' address: `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Router {
    /// Start HAProxy in front of `backends`, and wait until its monitor says an instance
    /// is in.
    pub async fn start(backends: &[Backend], quiet: bool) -> anyhow::Result<Self> {
        let committed = std::fs::read_to_string(COMMITTED)
            .with_context(|| format!("reading the router's configuration, {COMMITTED}"))?;
        let haproxy = haproxy()?;
        let [front, health] = servers::distinct_free_ports(2)[..] else {
            bail!("no two free ports");
        };
        let config = config(&committed, backends, front, health, quiet)?;
        let dir =
            std::env::temp_dir().join(format!("seckill-router-{}-{front}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, config)?;
        let log = dir.join("haproxy.log");
        let mut command = Command::new(haproxy);
        command
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        servers::Tie::OwnGroupDiesWithSpawner.apply(&mut command);
        let child = command.spawn().context("starting haproxy")?;
        let mut router = Self {
            child,
            dir,
            url: format!("http://127.0.0.1:{front}"),
        };
        // HAProxy counts a server in until its first check fails: the monitor answering
        // is HAProxy listening, not the instances being ready.
        let monitor = format!("http://127.0.0.1:{health}/healthz");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(answer) = reqwest::get(&monitor).await
                && answer.status().is_success()
            {
                return Ok(router);
            }
            let said = || std::fs::read_to_string(&log).unwrap_or_default();
            if let Ok(Some(status)) = router.child.try_wait() {
                bail!("haproxy exited ({status}): {}", said());
            }
            if Instant::now() > deadline {
                bail!(
                    "the router's monitor ({monitor}) never answered: {}",
                    said()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKENDS: [Backend; 3] = [
        Backend {
            buyers: 1001,
            ops: 2001,
        },
        Backend {
            buyers: 1002,
            ops: 2002,
        },
        Backend {
            buyers: 1003,
            ops: 2003,
        },
    ];

    #[test]
    fn the_committed_file_gets_the_addresses_given_and_nothing_else_changes() {
        let committed = std::fs::read_to_string(COMMITTED).unwrap();
        let out = config(&committed, &BACKENDS, 7000, 7001, false).unwrap();
        assert!(
            out.contains("server app1 127.0.0.1:1001 check port 2001"),
            "{out}"
        );
        assert!(
            out.contains("server app3 127.0.0.1:1003 check port 2003"),
            "{out}"
        );
        assert!(out.contains("bind 127.0.0.1:7000") && out.contains("bind 127.0.0.1:7001"));
        let changed = |line: &str| line.contains("server ") || line.contains("bind ");
        let kept: Vec<&str> = committed.lines().filter(|l| !changed(l)).collect();
        let left: Vec<&str> = out.lines().filter(|l| !changed(l)).collect();
        assert_eq!(kept, left);
    }

    #[test]
    fn quiet_leaves_out_every_log_line() {
        let committed = std::fs::read_to_string(COMMITTED).unwrap();
        let out = config(&committed, &BACKENDS, 7000, 7001, true).unwrap();
        assert!(committed.lines().any(|l| l.trim().starts_with("log ")));
        assert!(
            !out.lines()
                .any(|l| l.trim().starts_with("log ") || l.contains("httplog")),
            "{out}"
        );
        assert!(out.contains("balance uri path-only depth 3"));
    }

    #[test]
    fn a_file_that_does_not_match_the_instances_given_is_refused() {
        let committed = std::fs::read_to_string(COMMITTED).unwrap();
        assert!(config(&committed, &BACKENDS[..2], 7000, 7001, false).is_err());
        let four = [BACKENDS[0], BACKENDS[1], BACKENDS[2], BACKENDS[0]];
        assert!(config(&committed, &four, 7000, 7001, false).is_err());
        let moved = committed.replace("bind :8080", "bind :9999");
        assert!(config(&moved, &BACKENDS, 7000, 7001, false).is_err());
    }
}
