//! Restock news between instances: a committed restock is published on a Redis channel
//! (`<REDIS_KEY_PREFIX>seckill:restocks:<deployment id>`, message
//! `<product id>:restocked`), and every instance that knows the product reads its restock
//! generation from PostgreSQL and reopens it in its [`Catalog`] at what it read. A moved
//! opening goes the same way (`<product id>:opening`): every instance reads the product's
//! opening again before its next purchase. The deployment id is the database's own
//! ([`crate::repository::deployment_id`]): instances of another deployment that share the
//! Redis, even with the same prefix, publish and listen on another channel.
//!
//! A message is news that something changed, never a fact to believe: whoever can publish on
//! the channel (a neighbour on a shared Redis, an attacker with its address) can make
//! instances read again, one read per product at a time, but cannot switch the sold-out
//! memory off or reopen a product that has no new stock. (A message that carried the new
//! generation, believed, could: `<id>:9223372036854775807` would have outranked every later
//! sold-out mark until a restart.)
//!
//! Messages are a fast path, not the truth: one lost to a reconnect or to Redis being down
//! costs at most `SOLD_OUT_RECHECK_MS`, after which an instance asks PostgreSQL again anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};

use sqlx::PgPool;

use super::catalog::Catalog;
use crate::domain::ProductId;
use crate::redis_link::{self, RedisLink, RedisSource};
use crate::repository;

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
    /// the channel of `deployment` under `key_prefix`; what news asks to read again is read
    /// on `reads`.
    pub(crate) fn start(
        source: RedisSource,
        key_prefix: &str,
        deployment: &str,
        publisher: RedisLink,
        catalog: Weak<Catalog>,
        reads: PgPool,
    ) -> Self {
        let channel = format!("{key_prefix}seckill:restocks:{deployment}");
        let listening = Arc::new(AtomicBool::new(false));
        let keeper = Keeper {
            source,
            channel: channel.clone(),
            catalog,
            reads,
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

    /// Tell the other instances that `id` was restocked, in the background (the restock has
    /// committed, so their read of it finds it; a lost message costs at most
    /// `SOLD_OUT_RECHECK_MS`).
    pub(crate) fn publish(&self, id: ProductId) {
        self.send(id, RESTOCKED, "SOLD_OUT_RECHECK_MS");
    }

    /// Tell the other instances that the opening of `id` moved (a lost message costs an
    /// opening brought forward up to `OPENING_RECHECK`).
    pub(crate) fn publish_opening(&self, id: ProductId) {
        self.send(id, OPENING, "a second");
    }

    /// Publish `<id>:<news>` in the background; `within`: when the other instances learn it
    /// anyway, for the warning when it cannot be sent.
    fn send(&self, id: ProductId, news: &'static str, within: &'static str) {
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
    /// Where a product's restock generation is read when news asks.
    reads: PgPool,
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
        let reads = self.reads.clone();
        let config: ConnectionManagerConfig = redis_link::config()
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection
                    && let Some(listening) = listening.upgrade()
                {
                    listening.store(false, Ordering::SeqCst);
                }
                hear(&catalog, &reads, push);
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

/// The news of a restock, after the product's id. Any news but [`OPENING`] is taken for it
/// (instances of an earlier version send the generation's number: it is not read).
const RESTOCKED: &str = "restocked";

/// A restock message: read the product's restock generation again; or an opening message:
/// read its opening again.
fn hear(catalog: &Weak<Catalog>, reads: &PgPool, push: PushInfo) {
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
    } else {
        look_again(&catalog, reads.clone(), id);
    }
}

/// Read the restock generation of `id` from PostgreSQL, and reopen the product at it if a
/// restock came after its sold-out mark; in the background, one read per product at a time
/// (news during a read asks for one more after it). A product this instance has not seen is
/// left alone: its first purchase reads it anyway.
fn look_again(catalog: &Arc<Catalog>, reads: PgPool, id: ProductId) {
    let Some(known) = catalog.get(id) else {
        return;
    };
    if !known.claim_restock_read() {
        return;
    }
    let catalog = Arc::downgrade(catalog);
    tokio::spawn(async move {
        loop {
            match repository::find_product(&reads, id).await {
                Ok(Some(found)) => {
                    if let Some(catalog) = catalog.upgrade() {
                        catalog.reopen(id, found.restock_gen);
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, product_id = %id, "could not read a restocked product; this instance sees the restock within SOLD_OUT_RECHECK_MS");
                }
            }
            if !known.read_restock_again() {
                return;
            }
        }
    });
}
