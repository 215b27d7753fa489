//! The demo's ZooKeeper and etcd, for its `zookeeper` and `etcd` runs: the one given, the one
//! at the default address if something answers there, or a private one.
//!
//! A private ZooKeeper is a JVM running `QuorumPeerMain` standalone from Debian's jars (no
//! `zkServer.sh`, nothing of `/etc/zookeeper` or `/var/lib/zookeeper`) with a `zoo.cfg` of
//! its own; a private etcd is a one-member cluster on a client and a peer port. Each keeps its
//! data and its log in a temporary directory, removed with it, and syncs its log to disk as it
//! would in production: the demo's PostgreSQL commits are durable too, and the runs compare
//! what each strategy costs as deployed.
//!
//! What answers on the port is checked to be ours before it is used (ZooKeeper's `conf` names
//! our data directory, etcd's member list our member), since another process may take a free
//! port between our pick and the server's bind; a server that could not bind is started again
//! on another port. The test crate `testkit` starts the tests' servers the same way; the demo
//! may not depend on it, so this is its own copy of that knowledge.

use std::future::Future;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::{Launch, Private, Server, find, free_port};

/// Where the demo looks for ZooKeeper when no address is given (ZOOKEEPER_CONNECT's default).
pub const DEFAULT_ZOOKEEPER: &str = "127.0.0.1:2181";
/// Where the demo looks for etcd when no endpoint is given (ETCD_ENDPOINTS' default).
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";

/// Where Debian's `zookeeper` package puts the server; its manifest names the jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The SLF4J API, one of those jars (Debian's `libslf4j-java`): without it the JVM cannot
/// load the server.
const SLF4J_API_JAR: &str = "/usr/share/java/slf4j-api.jar";
/// An SLF4J binding that logs to stderr without a configuration file (also
/// `libslf4j-java`): without it the server runs but logs nothing, and a failed start would
/// leave no reason in its log.
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";

const INSTALL_ZOOKEEPER: &str =
    "install it (Debian: apt-get install zookeeper libslf4j-java default-jre-headless)";
const INSTALL_ETCD: &str = "install it (Debian: apt-get install etcd-server)";

/// The private ZooKeeper's tick, the unit of its timeouts: ZooKeeper's default.
const ZOOKEEPER_TICK_MS: u64 = 2_000;
/// The shortest session the private ZooKeeper grants (ZooKeeper's default, 2 ticks).
const ZOOKEEPER_MIN_SESSION_TIMEOUT_MS: u64 = 2 * ZOOKEEPER_TICK_MS;
/// The longest session the private ZooKeeper grants (ZooKeeper's default, 20 ticks), written
/// out in its `zoo.cfg`: the demo's ZOOKEEPER_SESSION_TIMEOUT_MS must fit under it, or the
/// server grants less than asked and the instances refuse to start (a lock must not outlive
/// its session).
pub const ZOOKEEPER_MAX_SESSION_TIMEOUT_MS: u64 = 20 * ZOOKEEPER_TICK_MS;

/// How long a private server may take to serve.
///
/// TIMING: a JVM starts in a few seconds on a busy two-core machine, etcd in well under one;
/// a minute leaves room for a machine busy with other work.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// How many ports a private server is tried on before the start is given up: a port is only
/// lost to a race with another process, so one retry is almost always enough.
const ATTEMPTS: usize = 5;

/// ZooKeeper for the demo: `given` if any (a connect string, not checked here: the instances
/// say at their start whether it serves); else [`DEFAULT_ZOOKEEPER`] if something answers
/// there; else a private one.
///
/// # Errors
/// Nothing at the default address and ZooKeeper (or Java) not installed, the message saying
/// what to install; or the private server does not start.
pub async fn zookeeper(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(connect) = given {
        return Ok(Server {
            url: connect.to_owned(),
            private: None,
        });
    }
    if TcpStream::connect(("127.0.0.1", 2181)).is_ok() {
        return Ok(Server {
            url: DEFAULT_ZOOKEEPER.to_owned(),
            private: None,
        });
    }
    start_zookeeper().await.context(
        "nothing answers at 127.0.0.1:2181 (pass --zookeeper-connect to use another ZooKeeper), \
         and the demo cannot start a private one",
    )
}

/// etcd for the demo, chosen as [`zookeeper`] chooses.
///
/// # Errors
/// As [`zookeeper`].
pub async fn etcd(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(endpoints) = given {
        return Ok(Server {
            url: endpoints.to_owned(),
            private: None,
        });
    }
    if TcpStream::connect(("127.0.0.1", 2379)).is_ok() {
        return Ok(Server {
            url: DEFAULT_ETCD.to_owned(),
            private: None,
        });
    }
    start_etcd().await.context(
        "nothing answers at 127.0.0.1:2379 (pass --etcd-endpoints to use another etcd), and the \
         demo cannot start a private one",
    )
}

/// A private, standalone ZooKeeper on a free port of 127.0.0.1; its [`Server::url`] is the
/// connect string.
///
/// # Errors
/// ZooKeeper, its SLF4J jars or Java not installed (the message says what to install); or it
/// does not serve within a minute (the message carries the end of its log).
pub async fn start_zookeeper() -> anyhow::Result<Server> {
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        bail!("ZooKeeper is not installed (no {ZOOKEEPER_JAR}): {INSTALL_ZOOKEEPER}");
    }
    if !Path::new(SLF4J_API_JAR).is_file() {
        bail!(
            "ZooKeeper needs the SLF4J jars, which are not installed (no {SLF4J_API_JAR}): install \
             them (Debian: apt-get install libslf4j-java)"
        );
    }
    let java = find(&["java"], &[PathBuf::from("/usr/lib/jvm/default-java/bin")]).context(
        "ZooKeeper is installed, but no Java runtime (no `java` on the PATH): install one, Java \
         11 or later (Debian: apt-get install default-jre-headless)",
    )?;
    let mut classpath = ZOOKEEPER_JAR.to_owned();
    if Path::new(SLF4J_SIMPLE_JAR).is_file() {
        classpath.push(':');
        classpath.push_str(SLF4J_SIMPLE_JAR);
    }
    let dir = private_dir("zk")?;
    let data = dir.join("data");
    let log = dir.join("zookeeper.log");
    for _ in 0..ATTEMPTS {
        let port = free_port()?;
        let config = dir.join("zoo.cfg");
        std::fs::write(&config, zoo_cfg(port, &data)).context("writing the zoo.cfg")?;
        // A small heap: the server holds a few nodes per run. The JIT is left as it is: the
        // demo measures the server.
        let launch = Launch {
            program: java.clone(),
            args: [
                "-Xms32m",
                "-Xmx256m",
                "-Djava.awt.headless=true",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-cp",
                &classpath,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ]
            .into_iter()
            .map(Into::into)
            .chain([config.into_os_string()])
            .collect(),
            account: None,
            port,
            log: Some(log.clone()),
        };
        let child = launch.spawn().context("starting ZooKeeper (java)")?;
        let mut private = Private {
            child,
            dir: Some(dir.clone()),
            launch,
        };
        match wait_until_serving(&mut private, &log, || zookeeper_serves(port, &data)).await {
            Start::Serving => {
                return Ok(Server {
                    url: format!("127.0.0.1:{port}"),
                    private: Some(private),
                });
            }
            // Stopped when dropped at the end of this turn; the directory is kept for the
            // next try.
            Start::PortTaken => private.dir = None,
            // Dropped on return: stopped, and its directory removed.
            Start::Failed(why) => bail!("a private ZooKeeper did not start: {why}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    bail!("a private ZooKeeper did not start: its port was taken on each of {ATTEMPTS} tries")
}

/// The private ZooKeeper's configuration.
fn zoo_cfg(port: u16, data: &Path) -> String {
    // forceSync is left at its default (yes): each write is on disk before it is answered.
    // Four-letter words: `srvr` and `conf` tell that the server on the port serves, and is
    // ours.
    format!(
        "tickTime={ZOOKEEPER_TICK_MS}\n\
         minSessionTimeout={ZOOKEEPER_MIN_SESSION_TIMEOUT_MS}\n\
         maxSessionTimeout={ZOOKEEPER_MAX_SESSION_TIMEOUT_MS}\n\
         dataDir={data}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,conf\n",
        data = data.display(),
    )
}

/// Whether the ZooKeeper on `port` serves (`srvr` says `Mode: standalone`) and is the one
/// whose data is in `data` (`conf` says so).
async fn zookeeper_serves(port: u16, data: &Path) -> bool {
    let ours = four_letter_word(port, "conf")
        .await
        .is_some_and(|conf| conf.contains(&format!("dataDir={}", data.display())));
    ours && four_letter_word(port, "srvr")
        .await
        .is_some_and(|srvr| srvr.lines().any(|line| line == "Mode: standalone"))
}

/// Send a four-letter word to the ZooKeeper on `port` and read its answer; `None` if nothing
/// answers within a few seconds.
async fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream.write_all(word.as_bytes()).await.ok()?;
        let mut answer = String::new();
        // The server closes the connection after its answer.
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(Duration::from_secs(3), exchange)
        .await
        .ok()
        .flatten()
}

/// A private, one-member etcd on free ports of 127.0.0.1; its [`Server::url`] is the client
/// endpoint.
///
/// # Errors
/// etcd not installed (the message says what to install); or it is not healthy within a
/// minute (the message carries the end of its log).
pub async fn start_etcd() -> anyhow::Result<Server> {
    let binary = find(&["etcd"], &[])
        .with_context(|| format!("etcd is not installed (no etcd on the PATH): {INSTALL_ETCD}"))?;
    let dir = private_dir("etcd")?;
    // Unique to this server: a member that answers with it is ours.
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("a temporary directory with a UTF-8 name")?
        .to_owned();
    let data = dir.join("data");
    let log = dir.join("etcd.log");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()?;
    for _ in 0..ATTEMPTS {
        // A new cluster each try: a data directory would make etcd ignore the new peer URL.
        let _ = std::fs::remove_dir_all(&data);
        let (client_port, peer_port) = two_free_ports()?;
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let launch = Launch {
            program: binary.clone(),
            args: [
                "--name",
                &name,
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &format!("{name}={peer}"),
                "--initial-cluster-token",
                &name,
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
            ]
            .into_iter()
            .map(Into::into)
            .chain(["--data-dir".into(), data.clone().into_os_string()])
            .collect(),
            account: None,
            port: client_port,
            log: Some(log.clone()),
        };
        let child = launch.spawn().context("starting etcd")?;
        let mut private = Private {
            child,
            dir: Some(dir.clone()),
            launch,
        };
        let serves = || etcd_serves(&http, &client, &name);
        match wait_until_serving(&mut private, &log, serves).await {
            Start::Serving => {
                return Ok(Server {
                    url: client,
                    private: Some(private),
                });
            }
            Start::PortTaken => private.dir = None,
            Start::Failed(why) => bail!("a private etcd did not start: {why}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    bail!("a private etcd did not start: its ports were taken on each of {ATTEMPTS} tries")
}

/// Whether the etcd at `endpoint` is healthy and is the member called `name`.
async fn etcd_serves(http: &reqwest::Client, endpoint: &str, name: &str) -> bool {
    let text = |request: reqwest::RequestBuilder| async move {
        let response = request.send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    };
    // etcd's JSON gateway takes the gRPC calls as POSTs of JSON.
    let members = text(
        http.post(format!("{endpoint}/v3/cluster/member/list"))
            .body("{}"),
    )
    .await;
    if !members.is_some_and(|list| list.contains(&format!("\"name\":\"{name}\""))) {
        return false;
    }
    text(http.get(format!("{endpoint}/health")))
        .await
        .is_some_and(|health| health.contains(r#""health":"true""#))
}

/// How a private server's start ended.
enum Start {
    Serving,
    /// It could not bind its port (another process took it since it was picked): worth
    /// another try on another port.
    PortTaken,
    /// Anything else: what, with the end of its log.
    Failed(String),
}

/// Wait until `serves` says the server serves, it exits, or [`READY_WITHIN`] passes.
async fn wait_until_serving<F, Fut>(private: &mut Private, log: &Path, serves: F) -> Start
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if serves().await {
            return Start::Serving;
        }
        if let Ok(Some(status)) = private.child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            // ZooKeeper (a Java exception) and etcd (a Go error) say it in different cases.
            if text.to_lowercase().contains("address already in use") {
                return Start::PortTaken;
            }
            return Start::Failed(format!(
                "it exited ({status}); the end of its log:\n{}",
                tail(&text, 20)
            ));
        }
        if Instant::now() >= deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Start::Failed(format!(
                "not serving after {} s; the end of its log:\n{}",
                READY_WITHIN.as_secs(),
                tail(&text, 20)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A new directory for a private server, `seckill-demo-<label>-<pid>-<random>` in the
/// system's temporary directory.
fn private_dir(label: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "seckill-demo-{label}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the private server's directory {}", dir.display()))?;
    Ok(dir)
}

/// Two distinct ports nobody listens on now: both held while picked, so that they differ.
fn two_free_ports() -> anyhow::Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_zookeeper_grants_sessions_between_two_and_twenty_ticks() {
        let config = zoo_cfg(2181, Path::new("/tmp/zk/data"));
        assert!(config.contains("tickTime=2000\n"), "{config}");
        assert!(config.contains("minSessionTimeout=4000\n"), "{config}");
        assert!(config.contains("maxSessionTimeout=40000\n"), "{config}");
        assert!(config.contains("clientPort=2181\n"), "{config}");
        assert!(config.contains("dataDir=/tmp/zk/data\n"), "{config}");
    }

    #[test]
    fn a_tail_is_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }
}
