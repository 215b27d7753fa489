//! The demo's servers: the ones given, the ones already running at the default addresses,
//! or private throwaway ones started for the demo (and the soak, and the bench) and removed
//! after it.
//!
//! The private servers are the `servers` crate's, the same launchers the tests use: a
//! PostgreSQL `initdb` into a temporary directory, a `redis-server` keeping nothing on disk,
//! a ZooKeeper tuned as deployed ([`Profile::Deployed`]: the runs compare what each strategy
//! costs as deployed) and a one-member etcd, each on free ports. Each is a child in its own
//! process group with a parent-death signal ([`Tie::OwnGroupDiesWithSpawner`]: it assumes it
//! is started from a thread that lives as long as the run, such as a tokio worker), and is
//! stopped by its pid, and its directory removed, when dropped.
//!
//! Besides: [`forget_keys`] deletes a run's keys from a Redis, and [`ThrowawayDatabase`] is
//! a database of a run's own.

use std::net::TcpStream;
use std::time::Duration;

use ::servers::zookeeper::{DEPLOYED_MAX_SESSION_TIMEOUT, Profile};
use ::servers::{EtcdServer, PatroniCluster, PostgresServer, RedisServer, Tie, ZooKeeperServer};
use anyhow::Context;
use reqwest::Url;
use sqlx::{Connection, PgConnection};

/// Where the demo looks when no URL is given: without TLS, as the figures of
/// docs/performance.md were measured (the service's TLS is for links across a network;
/// sqlx's default, `prefer`, would encrypt on loopback wherever the server has `ssl=on`).
pub const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable";
pub const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";
/// Where the demo looks for ZooKeeper when no address is given (ZOOKEEPER_CONNECT's default).
pub const DEFAULT_ZOOKEEPER: &str = "127.0.0.1:2181";
/// Where the demo looks for etcd when no endpoint is given (ETCD_ENDPOINTS' default).
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";

/// The longest session the private ZooKeeper grants (ZooKeeper's default, 20 ticks of 2 s):
/// the demo's ZOOKEEPER_SESSION_TIMEOUT_MS must fit under it, or the server grants less than
/// asked and the instances refuse to start (a lock must not outlive its session).
pub const ZOOKEEPER_MAX_SESSION_TIMEOUT_MS: u64 = DEPLOYED_MAX_SESSION_TIMEOUT.as_millis() as u64;

/// How the private servers are tied to this process.
const TIE: Tie = Tie::OwnGroupDiesWithSpawner;

/// A server the demo uses: its URL, and the private process behind it, if any.
pub struct Server {
    pub url: String,
    /// `Some` for a private server; stopped when the `Server` is dropped.
    private: Option<Private>,
}

/// A private server, of whichever kind.
enum Private {
    Postgres(PostgresServer),
    Redis(RedisServer),
    ZooKeeper(ZooKeeperServer),
    Etcd(EtcdServer),
    Patroni(PatroniCluster),
}

impl Server {
    /// A server someone else runs, at `url`.
    fn given(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            private: None,
        }
    }

    fn private(url: String, private: Private) -> Self {
        Self {
            url,
            private: Some(private),
        }
    }

    /// Whether the demo started this server itself.
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }

    /// Stop a private server and start it again on the same port, PostgreSQL on the same
    /// data directory: what `pg_ctl restart -m fast` does (SIGINT is its fast shutdown), but
    /// the server stays a child of this process, tied as it was. A private Redis comes back
    /// empty: it keeps nothing on disk. Blocks until it serves again.
    ///
    /// # Errors
    /// A server the demo did not start; or it does not come back.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        match &mut self.private {
            None => anyhow::bail!("only a private server can be restarted"),
            Some(Private::Postgres(server)) => server.restart()?,
            Some(Private::Redis(server)) => server.try_restart_empty()?,
            Some(Private::ZooKeeper(server)) => server.restart(),
            Some(Private::Etcd(server)) => server.restart(),
            Some(Private::Patroni(_)) => {
                anyhow::bail!("a Patroni cluster is failed over, not restarted")
            }
        }
        Ok(())
    }

    /// The process id of a private server now (a restart changes it).
    pub fn pid(&self) -> Option<u32> {
        match self.private.as_ref()? {
            Private::Postgres(server) => server.pid(),
            Private::Redis(server) => Some(server.pid()),
            Private::ZooKeeper(server) => Some(server.pid()),
            Private::Etcd(server) => Some(server.pid()),
            Private::Patroni(cluster) => cluster.primary().and_then(|p| cluster.postmaster(p)),
        }
    }

    /// The private Patroni cluster behind this server, if it is one (to fail it over).
    pub fn patroni_mut(&mut self) -> Option<&mut PatroniCluster> {
        match self.private.as_mut()? {
            Private::Patroni(cluster) => Some(cluster),
            _ => None,
        }
    }
}

/// PostgreSQL for the demo: `given` if any (it must answer); else the default address if
/// something answers there; else a private one.
///
/// # Errors
/// Nothing at the default address and PostgreSQL not installed (the message says what to
/// install or pass); or the private server does not start.
pub async fn postgres(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(url) = given {
        return Ok(Server::given(url));
    }
    if sqlx::PgPool::connect(DEFAULT_POSTGRES).await.is_ok() {
        return Ok(Server::given(DEFAULT_POSTGRES));
    }
    start_postgres_with(&[]).await.context(
        "nothing answers at 127.0.0.1:5432 (pass --database-url to use another PostgreSQL), \
         and the demo cannot start a private one",
    )
}

/// Redis for the demo, chosen as [`postgres`] chooses: the default address only if a Redis
/// there answers without a password (the compose stack's asks for one).
///
/// # Errors
/// As [`postgres`].
pub async fn redis(given: Option<&str>) -> anyhow::Result<Server> {
    redis_or_private(given, DEFAULT_REDIS)
}

/// [`redis`] with `default` for the default address.
fn redis_or_private(given: Option<&str>, default: &str) -> anyhow::Result<Server> {
    if let Some(url) = given {
        return Ok(Server::given(url));
    }
    // A Redis that asks for a password refuses `INFO`: no pid.
    if redis_pid(default).is_some() {
        return Ok(Server::given(default));
    }
    start_redis().with_context(|| {
        format!(
            "no Redis at {default} answers without a password (pass --redis-url to use \
             another Redis, with its password), and the demo cannot start a private one"
        )
    })
}

/// ZooKeeper for the demo: `given` if any (a connect string, not checked here: the instances
/// say at their start whether it serves); else [`DEFAULT_ZOOKEEPER`] if something answers
/// there; else a private one.
///
/// # Errors
/// As [`postgres`].
pub async fn zookeeper(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(connect) = given {
        return Ok(Server::given(connect));
    }
    if TcpStream::connect(("127.0.0.1", 2181)).is_ok() {
        return Ok(Server::given(DEFAULT_ZOOKEEPER));
    }
    start_zookeeper().await.context(
        "nothing answers at 127.0.0.1:2181 (pass --zookeeper-connect to use another ZooKeeper), \
         and the demo cannot start a private one",
    )
}

/// etcd for the demo, chosen as [`zookeeper`] chooses.
///
/// # Errors
/// As [`postgres`].
pub async fn etcd(given: Option<&str>) -> anyhow::Result<Server> {
    if let Some(endpoints) = given {
        return Ok(Server::given(endpoints));
    }
    if TcpStream::connect(("127.0.0.1", 2379)).is_ok() {
        return Ok(Server::given(DEFAULT_ETCD));
    }
    start_etcd().await.context(
        "nothing answers at 127.0.0.1:2379 (pass --etcd-endpoints to use another etcd), and the \
         demo cannot start a private one",
    )
}

/// A private `redis-server`, keeping nothing on disk.
///
/// # Errors
/// `redis-server` not installed, or it does not start.
pub fn start_redis() -> anyhow::Result<Server> {
    let server = RedisServer::try_start(TIE)?;
    Ok(Server::private(server.url(), Private::Redis(server)))
}

/// A private PostgreSQL (`initdb` into a temporary directory, removed when the server is
/// dropped), with these settings besides the usual ones (`("track_commit_timestamp",
/// "on")`, say).
///
/// # Errors
/// PostgreSQL not installed, `initdb` fails, or the server does not start.
pub async fn start_postgres_with(settings: &[(&str, &str)]) -> anyhow::Result<Server> {
    let server = PostgresServer::start(settings, TIE)?;
    Ok(Server::private(server.url(), Private::Postgres(server)))
}

/// A private PostgreSQL that fails over: three members run by Patroni in
/// `synchronous_mode_strict`, HAProxy in front of the primary ([`PatroniCluster`]); its
/// [`Server::url`] is HAProxy's. `settings` as for [`start_postgres_with`].
///
/// # Errors
/// Patroni, HAProxy, etcd or PostgreSQL not installed (the message says what to install),
/// or the cluster does not serve within two minutes.
pub async fn start_patroni_with(settings: &[(&str, &str)]) -> anyhow::Result<Server> {
    let cluster = tokio::task::block_in_place(|| PatroniCluster::start(settings, TIE))?;
    Ok(Server::private(cluster.url(), Private::Patroni(cluster)))
}

/// A private, standalone ZooKeeper tuned as deployed; its [`Server::url`] is the connect
/// string.
///
/// # Errors
/// ZooKeeper, its SLF4J jars or Java not installed (the message says what to install); or it
/// does not serve within a minute (the message carries the end of its log).
pub async fn start_zookeeper() -> anyhow::Result<Server> {
    let server = ZooKeeperServer::try_start(Profile::Deployed, TIE)?;
    Ok(Server::private(
        server.connect_string(),
        Private::ZooKeeper(server),
    ))
}

/// A private, one-member etcd; its [`Server::url`] is the client endpoint.
///
/// # Errors
/// etcd not installed (the message says what to install); or it is not healthy within a
/// minute (the message carries the end of its log).
pub async fn start_etcd() -> anyhow::Result<Server> {
    let server = EtcdServer::try_start(TIE)?;
    Ok(Server::private(server.endpoint(), Private::Etcd(server)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A Redis at the default address that asks for a password (the compose stack's) is not
    /// the demo's: it starts a private one, which answers.
    #[test]
    fn a_redis_that_asks_for_a_password_is_passed_over_for_a_private_one() {
        let locked = RedisServer::start();
        let open_url = locked.url();
        assert!(
            redis_pid(&open_url).is_some(),
            "a Redis without a password answers"
        );
        let mut conn = redis::Client::open(open_url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("pw")
            .exec(&mut conn)
            .unwrap();

        let chosen = redis_or_private(None, &open_url).unwrap();
        assert!(chosen.is_private(), "{} was chosen", chosen.url);
        assert_ne!(chosen.url, open_url);
        assert!(redis_pid(&chosen.url).is_some());
        let given = redis_or_private(Some("redis://:pw@127.0.0.1:1"), &open_url).unwrap();
        assert_eq!(given.url, "redis://:pw@127.0.0.1:1");
    }
}
