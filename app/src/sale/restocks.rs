//! Restock news between instances: a committed restock is published on a Redis channel
//! (`<REDIS_KEY_PREFIX>seckill:restocks`, message `<product id>:<restock generation>`), and
//! every instance reopens the product in its [`Catalog`] when the message arrives.
//!
//! Messages are a fast path, not the truth: one lost to a reconnect or to Redis being down
//! costs at most `SOLD_OUT_RECHECK_MS`, after which an instance asks PostgreSQL again anyway.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};

use super::catalog::Catalog;
use crate::domain::ProductId;
use crate::redis_link::{self, RedisLink};

/// Publishes this instance's restocks and listens for the others'.
pub(crate) struct Restocks {
    channel: String,
    publisher: RedisLink,
    /// The subscription connection, once it is up; held so that it lives as long as we do.
    subscription: Arc<OnceLock<redis::aio::ConnectionManager>>,
}

impl Restocks {
    /// Publish on `publisher`, and listen on a connection of its own to `redis_url`, made in
    /// the background (retrying until Redis answers).
    pub(crate) fn start(
        redis_url: &str,
        key_prefix: &str,
        publisher: RedisLink,
        catalog: Weak<Catalog>,
    ) -> Self {
        let channel = format!("{key_prefix}seckill:restocks");
        let subscription = Arc::new(OnceLock::new());
        let slot = Arc::clone(&subscription);
        let (url, listen_to) = (redis_url.to_owned(), channel.clone());
        tokio::spawn(async move {
            loop {
                match subscribe(&url, &listen_to, catalog.clone()).await {
                    Ok(conn) => {
                        let _ = slot.set(conn);
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cannot subscribe to restock news yet; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Self {
            channel,
            publisher,
            subscription,
        }
    }

    /// Whether the subscription is up (for readiness reports).
    pub(crate) fn listening(&self) -> bool {
        self.subscription.get().is_some()
    }

    /// Tell the other instances, in the background (the restock has committed; a lost message
    /// costs at most `SOLD_OUT_RECHECK_MS`).
    pub(crate) fn publish(&self, id: ProductId, generation: i64) {
        let Some(mut conn) = self.publisher.get() else {
            tracing::warn!(product_id = %id, "redis is not connected; other instances see the restock within SOLD_OUT_RECHECK_MS");
            return;
        };
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let sent = redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(format!("{id}:{generation}"))
                .exec_async(&mut conn)
                .await;
            if let Err(error) = sent {
                tracing::warn!(%error, product_id = %id, "could not announce the restock; other instances see it within SOLD_OUT_RECHECK_MS");
            }
        });
    }
}

/// A RESP3 connection subscribed to `channel`, resubscribing by itself after a reconnect.
async fn subscribe(
    url: &str,
    channel: &str,
    catalog: Weak<Catalog>,
) -> anyhow::Result<redis::aio::ConnectionManager> {
    let client = redis::Client::open(url)?;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let config: ConnectionManagerConfig = redis_link::config()
        .set_push_sender(move |push: PushInfo| {
            hear(&catalog, push);
            Ok::<(), redis::aio::SendError>(())
        })
        .set_automatic_resubscription();
    let mut conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
    conn.subscribe(channel).await?;
    Ok(conn)
}

/// A restock message: reopen the product.
fn hear(catalog: &Weak<Catalog>, push: PushInfo) {
    if push.kind != PushKind::Message {
        return;
    }
    let Some(Value::BulkString(payload)) = push.data.get(1) else {
        return;
    };
    let Some((id, generation)) = std::str::from_utf8(payload)
        .ok()
        .and_then(|p| p.split_once(':'))
    else {
        return;
    };
    if let (Ok(id), Ok(generation), Some(catalog)) =
        (ProductId::parse(id), generation.parse(), catalog.upgrade())
    {
        catalog.reopen(id, generation);
    }
}
