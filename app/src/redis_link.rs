//! The service's Redis connections, which may come up after the service does.
//!
//! Under `redis` and `redlock` the lock needs Redis, so start-up connects and fails fast.
//! The other strategies only use Redis for restock messages: they start without it and
//! connect in the background, retrying, while they sell.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// How often a background connection is retried.
const RETRY: Duration = Duration::from_secs(1);

/// A connection that may not exist yet; cheap to clone.
#[derive(Clone, Default)]
pub struct RedisLink(Arc<OnceLock<ConnectionManager>>);

impl RedisLink {
    /// Connect now.
    ///
    /// # Errors
    /// A message naming `setting` when the URL is invalid or Redis does not answer.
    pub async fn connect_now(url: &str, setting: &str) -> anyhow::Result<Self> {
        let conn = connect(url, config())
            .await
            .with_context(|| format!("cannot connect to Redis ({setting})"))?;
        let link = Self::default();
        let _ = link.0.set(conn);
        Ok(link)
    }

    /// Connect in a background task, retrying until Redis answers.
    ///
    /// # Errors
    /// An invalid URL, at once.
    pub fn connect_in_background(url: &str, setting: &str) -> anyhow::Result<Self> {
        redis::Client::open(url).with_context(|| format!("invalid {setting}"))?;
        let link = Self::default();
        let slot = Arc::clone(&link.0);
        let url = url.to_owned();
        tokio::spawn(async move {
            loop {
                match connect(&url, config()).await {
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
    pub fn get(&self) -> Option<ConnectionManager> {
        self.0.get().cloned()
    }
}

/// One multiplexed, self-reconnecting connection.
pub async fn connect(
    url: &str,
    config: ConnectionManagerConfig,
) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).context("invalid Redis URL")?;
    Ok(ConnectionManager::new_with_config(client, config).await?)
}

/// Short timeouts: a Redis that does not answer must not hold a purchase for long.
pub fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}
