//! The service's Redis connections, which may come up after the service does.
//!
//! Under `redis` and `redlock` the lock needs Redis, so start-up connects and fails fast.
//! The other strategies only use Redis for restock messages: they start without it and
//! connect in the background, retrying, while they sell.
//!
//! Redis is reached one of two ways ([`RedisSource`]): at one URL (`REDIS_URL`), or at
//! whichever node a set of Sentinels names the primary (`REDIS_SENTINELS`), following their
//! failovers. A `rediss://` URL is reached over TLS, the server's certificate checked
//! against `REDIS_CA_FILE` or the system's trusted authorities ([`client`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use distlock::SentinelConnection;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::Sentinel;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::redact::redacted;
use crate::settings::CaFile;

/// How often a background connection is retried.
const RETRY: Duration = Duration::from_secs(1);

/// Where Redis is.
#[derive(Clone)]
pub enum RedisSource {
    /// One server (`REDIS_URL`), and the authorities its certificate must be signed by
    /// (`REDIS_CA_FILE`) when it is reached over TLS.
    Url { url: String, ca: Option<CaFile> },
    /// The primary that these Sentinels name for `master` (`REDIS_SENTINELS`,
    /// `REDIS_SENTINEL_MASTER`).
    Sentinels { urls: Vec<String>, master: String },
}

impl RedisSource {
    /// The setting to name in messages, without passwords.
    pub fn describe(&self) -> String {
        match self {
            RedisSource::Url { url, .. } => format!("REDIS_URL: {}", redacted(url)),
            RedisSource::Sentinels { urls, master } => {
                let urls: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
                format!(
                    "REDIS_SENTINELS: {}, REDIS_SENTINEL_MASTER: {master}",
                    urls.join(",")
                )
            }
        }
    }

    /// A client for the server to use now: the URL's, or the primary the Sentinels name
    /// at this moment (a later failover is not followed by this client: ask again).
    ///
    /// # Errors
    /// An invalid URL, or no Sentinel that answers and knows the master.
    pub async fn client(&self) -> anyhow::Result<redis::Client> {
        match self {
            RedisSource::Url { url, ca } => client(url, ca.as_ref()),
            RedisSource::Sentinels { urls, master } => {
                let mut sentinel =
                    Sentinel::build(urls.iter().map(String::as_str).collect::<Vec<_>>())
                        .context("invalid REDIS_SENTINELS")?;
                Ok(sentinel.async_master_for(master, None).await?)
            }
        }
    }

    /// Check the addresses without connecting.
    fn check(&self) -> anyhow::Result<()> {
        match self {
            RedisSource::Url { url, ca } => {
                client(url, ca.as_ref())?;
            }
            RedisSource::Sentinels { urls, .. } => {
                for url in urls {
                    redis::Client::open(url.as_str())
                        .with_context(|| format!("invalid Sentinel URL {}", redacted(url)))?;
                }
            }
        }
        Ok(())
    }

    async fn connect(&self) -> anyhow::Result<RedisConn> {
        Ok(match self {
            RedisSource::Url { url, ca } => {
                RedisConn::Direct(connect(url, ca.as_ref(), config()).await?)
            }
            RedisSource::Sentinels { urls, master } => RedisConn::Sentinel(
                SentinelConnection::builder(urls.clone(), master)?
                    .connection_timeout(Duration::from_secs(1))
                    .response_timeout(Duration::from_secs(2))
                    .connect()
                    .await?,
            ),
        })
    }
}

/// A connection to Redis: multiplexed, cheap to clone, reconnecting by itself (to the same
/// server, or to the primary the Sentinels name after a failover).
#[derive(Clone)]
pub enum RedisConn {
    Direct(ConnectionManager),
    Sentinel(SentinelConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Direct(conn) => conn.req_packed_command(cmd),
            RedisConn::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Direct(conn) => conn.req_packed_commands(cmd, offset, count),
            RedisConn::Sentinel(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Direct(conn) => conn.get_db(),
            RedisConn::Sentinel(conn) => conn.get_db(),
        }
    }
}

/// A connection that may not exist yet; cheap to clone.
#[derive(Clone, Default)]
pub struct RedisLink(Arc<OnceLock<RedisConn>>);

impl RedisLink {
    /// Connect now.
    ///
    /// # Errors
    /// A message naming the setting when an address is invalid or Redis does not answer.
    pub async fn connect_now(source: &RedisSource) -> anyhow::Result<Self> {
        let conn = source
            .connect()
            .await
            .with_context(|| format!("cannot connect to Redis ({})", source.describe()))?;
        let link = Self::default();
        let _ = link.0.set(conn);
        Ok(link)
    }

    /// Connect in a background task, retrying until Redis answers.
    ///
    /// # Errors
    /// An invalid address, at once.
    pub fn connect_in_background(source: &RedisSource) -> anyhow::Result<Self> {
        source
            .check()
            .with_context(|| format!("invalid {}", source.describe()))?;
        let link = Self::default();
        let slot = Arc::clone(&link.0);
        let source = source.clone();
        tokio::spawn(async move {
            loop {
                match source.connect().await {
                    Ok(conn) => {
                        let _ = slot.set(conn);
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "redis not reachable yet; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        });
        Ok(link)
    }

    /// The connection, once there is one.
    pub fn get(&self) -> Option<RedisConn> {
        self.0.get().cloned()
    }
}

/// A client for the Redis at `url`. Over TLS (`rediss://`), the server's certificate must
/// be signed by one of the authorities in `ca`, or without one by an authority the system
/// trusts.
///
/// # Errors
/// An invalid URL, or a `ca` with no usable certificate.
pub fn client(url: &str, ca: Option<&CaFile>) -> anyhow::Result<redis::Client> {
    match ca {
        Some(ca) => {
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.pem.to_vec()),
            };
            redis::Client::build_with_tls(url, certificates).with_context(|| {
                format!(
                    "invalid Redis URL, or no usable certificate in {}",
                    ca.path.display()
                )
            })
        }
        None => redis::Client::open(url).context("invalid Redis URL"),
    }
}

/// One multiplexed, self-reconnecting connection to the Redis at `url` ([`client`]).
pub async fn connect(
    url: &str,
    ca: Option<&CaFile>,
    config: ConnectionManagerConfig,
) -> anyhow::Result<ConnectionManager> {
    Ok(ConnectionManager::new_with_config(client(url, ca)?, config).await?)
}

/// Short timeouts: a Redis that does not answer must not hold a purchase for long.
pub fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}
