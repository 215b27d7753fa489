//! Restock news between instances: a committed restock is published on a Redis channel
//! (`<REDIS_KEY_PREFIX>seckill:restocks:<deployment id>`, message
//! `<product id>:<restock generation>`), and every instance reopens the product in its
//! [`Catalog`] when the message arrives. A moved opening goes the same way
//! (`<product id>:opening`): every instance reads the product's opening again before its next
//! purchase. The deployment id is the database's own
//! ([`crate::repository::deployment_id`]): instances of another deployment that share the
//! Redis, even with the same prefix, publish and listen on another channel, so their news
//! (a large generation for an id that is also ours) cannot switch our sold-out memory off.
//!
//! Messages are a fast path, not the truth: one lost to a reconnect or to Redis being down
//! costs at most `SOLD_OUT_RECHECK_MS`, after which an instance asks PostgreSQL again anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};

use super::catalog::Catalog;
use crate::domain::ProductId;
use crate::redis_link::{self, RedisLink, RedisSource};

/// How often the subscription is checked (a PING): a connection lost while nothing is sent
/// on it is noticed, reconnected and resubscribed within this long.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Unanswered PINGs in a row after which, through Sentinel, the subscription is made again
/// on the primary the Sentinels name now.
const MISSED_BEFORE_LOOKUP: u32 = 2;

/// Publishes this instance's restocks and listens for the others'.
pub(crate) struct Restocks {
    channel: String,
    publisher: RedisLink,
    /// Whether the subscription is up now; its keeper task ends when this is dropped.
    listening: Arc<AtomicBool>,
}

impl Restocks {
    /// Publish on `publisher`, and listen on a connection of its own to `source`, kept
    /// up by a task of its own (retrying until Redis answers, and after every outage), on
    /// the channel of `deployment` under `key_prefix`.
    pub(crate) fn start(
        source: RedisSource,
        key_prefix: &str,
        deployment: &str,
        publisher: RedisLink,
        catalog: Weak<Catalog>,
    ) -> Self {
        let channel = format!("{key_prefix}seckill:restocks:{deployment}");
        let listening = Arc::new(AtomicBool::new(false));
        let keeper = Keeper {
            source,
            channel: channel.clone(),
            catalog,
            listening: Arc::downgrade(&listening),
        };
        tokio::spawn(keeper.run());
        Self {
            channel,
            publisher,
            listening,
        }
    }

    /// Whether restock news from other instances is being heard (for readiness reports).
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::SeqCst)
    }

    /// Tell the other instances, in the background (the restock has committed; a lost message
    /// costs at most `SOLD_OUT_RECHECK_MS`).
    pub(crate) fn publish(&self, id: ProductId, generation: i64) {
        self.send(id, generation.to_string(), "SOLD_OUT_RECHECK_MS");
    }

    /// Tell the other instances that the opening of `id` moved (a lost message costs an
    /// opening brought forward up to `OPENING_RECHECK`).
    pub(crate) fn publish_opening(&self, id: ProductId) {
        self.send(id, OPENING.to_owned(), "a second");
    }

    /// Publish `<id>:<news>` in the background; `within`: when the other instances learn it
    /// anyway, for the warning when it cannot be sent.
    fn send(&self, id: ProductId, news: String, within: &'static str) {
        let Some(mut conn) = self.publisher.get() else {
            tracing::warn!(product_id = %id, "redis is not connected; other instances see the change within {within}");
            return;
        };
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let message = format!("{id}:{news}");
            // A connection idle since Redis restarted fails its first command and reconnects:
            // so one more try.
            for attempt in 0..2 {
                let sent = redis::cmd("PUBLISH")
                    .arg(&channel)
                    .arg(&message)
                    .exec_async(&mut conn)
                    .await;
                match sent {
                    Ok(()) => return,
                    Err(error) if attempt == 1 => {
                        tracing::warn!(%error, product_id = %id, "could not announce the change; other instances see it within {within}");
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }
}

/// Keeps the subscription up. A connection lost while nothing is sent on it reconnects only
/// when something is sent, so the keeper PINGs it every [`CHECK_EVERY`]; the connection then
/// reconnects and resubscribes by itself.
struct Keeper {
    source: RedisSource,
    channel: String,
    catalog: Weak<Catalog>,
    /// Ends the task once the `Restocks` is gone.
    listening: Weak<AtomicBool>,
}

impl Keeper {
    async fn run(self) {
        loop {
            let mut conn = loop {
                if self.listening.strong_count() == 0 {
                    return;
                }
                match self.subscribe().await {
                    Ok(conn) => break conn,
                    Err(error) => {
                        tracing::debug!(%error, "cannot subscribe to restock news yet; retrying");
                        tokio::time::sleep(CHECK_EVERY).await;
                    }
                }
            };
            self.set(true);
            let mut missed = 0;
            // A connection reconnects to the server it was made for. Through Sentinel that
            // server may be gone for good after a failover, so after a few unanswered PINGs
            // the keeper asks the Sentinels again and subscribes where they point.
            while !(self.follows_failovers() && missed >= MISSED_BEFORE_LOOKUP) {
                tokio::time::sleep(CHECK_EVERY).await;
                let Some(listening) = self.listening.upgrade() else {
                    return;
                };
                let ping = redis::cmd("PING");
                let answered = tokio::time::timeout(CHECK_EVERY, ping.query_async::<()>(&mut conn))
                    .await
                    .is_ok_and(|answer| answer.is_ok());
                listening.store(answered, Ordering::SeqCst);
                missed = if answered { 0 } else { missed + 1 };
            }
        }
    }

    fn follows_failovers(&self) -> bool {
        matches!(self.source, RedisSource::Sentinels { .. })
    }

    fn set(&self, up: bool) {
        if let Some(listening) = self.listening.upgrade() {
            listening.store(up, Ordering::SeqCst);
        }
    }

    /// A RESP3 connection subscribed to the channel, resubscribing by itself after a
    /// reconnect; a lost connection marks the news as not heard until the next PING answers.
    async fn subscribe(&self) -> anyhow::Result<redis::aio::ConnectionManager> {
        let client = self.source.client().await?;
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let (catalog, listening) = (self.catalog.clone(), self.listening.clone());
        let config: ConnectionManagerConfig = redis_link::config()
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection
                    && let Some(listening) = listening.upgrade()
                {
                    listening.store(false, Ordering::SeqCst);
                }
                hear(&catalog, push);
                Ok::<(), redis::aio::SendError>(())
            })
            .set_automatic_resubscription();
        let mut conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
        conn.subscribe(&self.channel).await?;
        Ok(conn)
    }
}

/// The news of a moved opening, after the product's id.
const OPENING: &str = "opening";

/// A restock message: reopen the product; or an opening message: read its opening again.
fn hear(catalog: &Weak<Catalog>, push: PushInfo) {
    if push.kind != PushKind::Message {
        return;
    }
    let Some(Value::BulkString(payload)) = push.data.get(1) else {
        return;
    };
    let Some((id, news)) = std::str::from_utf8(payload)
        .ok()
        .and_then(|p| p.split_once(':'))
    else {
        return;
    };
    let (Ok(id), Some(catalog)) = (ProductId::parse(id), catalog.upgrade()) else {
        return;
    };
    if news == OPENING {
        catalog.forget_opening(id);
    } else if let Ok(generation) = news.parse() {
        catalog.reopen(id, generation);
    }
}
