//! Wake-on-release: waiters sleep until a release is announced instead of polling.
//!
//! The release script publishes on the lock's channel ([`release_channel`]). A process keeps
//! one subscription connection ([`ReleaseSignals`]) shared by all its waiters; a waiter
//! subscribes first, then tries the lock, then sleeps until a release message or a backstop
//! timer, whichever comes first, and tries again.
//!
//! Messages can be lost: to a reconnect, to a Redis restart, to a lock that simply expired
//! (nobody releases it). The backstop bounds what a lost message costs: it is the options'
//! largest retry delay, and never longer than what the holder's lease has left. When the
//! subscription connection drops, every waiter is woken at once and tries again, and the
//! connection resubscribes as it reconnects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use crate::error::Result;

/// A channel nobody watched for this long is unsubscribed (at the next subscription change).
const IDLE_UNSUBSCRIBE: Duration = Duration::from_secs(10);

/// One pub/sub subscription per process, shared by the waiters of every
/// [`Locker`](crate::Locker) given it with [`Locker::with_release_signals`](crate::Locker::with_release_signals).
///
/// Cheap to clone. Works with the single-Redis backend on a standalone Redis, whose release
/// script publishes. [`Redlock`](crate::Redlock), Redis Cluster connections and
/// [`PgLockTable`](crate::PgLockTable) waiters keep polling with backoff: pub/sub there would
/// mean a subscription per master or per shard, or `LISTEN` on PostgreSQL.
#[derive(Clone)]
pub struct ReleaseSignals {
    inner: Arc<Inner>,
}

struct Inner {
    /// The subscription connection: RESP3, so messages arrive as pushes beside replies;
    /// it resubscribes by itself after a reconnect.
    conn: ConnectionManager,
    /// Shared with the push handler, which wakes the watchers of a channel.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Subscribe and unsubscribe one at a time, so an unsubscribe can never land after a
    /// later subscribe to the same channel.
    changes: tokio::sync::Mutex<()>,
}

struct Channel {
    notify: Arc<Notify>,
    watchers: usize,
    /// Set when the last watcher leaves.
    idle_since: Option<Instant>,
}

impl ReleaseSignals {
    /// Open the subscription connection to the Redis `client` points at (its URL's
    /// protocol is replaced with RESP3, which subscriptions need here).
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when Redis cannot be reached.
    pub async fn connect(client: &redis::Client) -> Result<Self> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let channels: Arc<Mutex<HashMap<String, Channel>>> = Arc::default();
        let handler = Arc::downgrade(&channels);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_push_sender(move |push: PushInfo| {
                dispatch(&handler, push);
                Ok::<(), redis::aio::SendError>(())
            })
            .set_automatic_resubscription();
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                channels,
                changes: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Watch `channel` until the returned [`Watch`] is dropped; subscribes if needed. The
    /// caller bounds the wait (a subscription connection that is reconnecting can take a
    /// while), and falls back to polling.
    pub(crate) async fn watch(&self, channel: &str) -> Result<Watch> {
        if let Some(watch) = self.join(channel) {
            return Ok(watch);
        }
        let _change = self.inner.changes.lock().await;
        if let Some(watch) = self.join(channel) {
            return Ok(watch);
        }
        self.inner.conn.clone().subscribe(channel).await?;
        self.unsubscribe_idle_in_background();
        let notify = Arc::new(Notify::new());
        self.channels().insert(
            channel.to_owned(),
            Channel {
                notify: Arc::clone(&notify),
                watchers: 1,
                idle_since: None,
            },
        );
        Ok(Watch {
            signals: Arc::downgrade(&self.inner),
            channel: channel.to_owned(),
            notify,
        })
    }

    /// Join a channel that is already subscribed.
    fn join(&self, channel: &str) -> Option<Watch> {
        let mut channels = self.channels();
        let entry = channels.get_mut(channel)?;
        entry.watchers += 1;
        entry.idle_since = None;
        Some(Watch {
            signals: Arc::downgrade(&self.inner),
            channel: channel.to_owned(),
            notify: Arc::clone(&entry.notify),
        })
    }

    /// Drop subscriptions nobody has watched for a while, so a process that locks many
    /// different keys does not stay subscribed to all of them. In a task of its own: no
    /// waiter waits on it.
    fn unsubscribe_idle_in_background(&self) {
        let signals = self.clone();
        tokio::spawn(async move {
            let _change = signals.inner.changes.lock().await;
            let idle: Vec<String> = {
                let mut channels = signals.channels();
                let idle: Vec<String> = channels
                    .iter()
                    .filter(|(_, c)| c.idle_since.is_some_and(|t| t.elapsed() > IDLE_UNSUBSCRIBE))
                    .map(|(name, _)| name.clone())
                    .collect();
                for name in &idle {
                    channels.remove(name);
                }
                idle
            };
            if !idle.is_empty()
                && let Err(error) = signals.inner.conn.clone().unsubscribe(&idle).await
            {
                tracing::debug!(%error, "could not unsubscribe idle release channels");
            }
        });
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for ReleaseSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseSignals").finish_non_exhaustive()
    }
}

/// The push handler: a message wakes its channel's watchers; a lost connection wakes
/// everyone, since messages may have been missed while it was down.
fn dispatch(channels: &Weak<Mutex<HashMap<String, Channel>>>, push: PushInfo) {
    let Some(channels) = channels.upgrade() else {
        return;
    };
    let channels = channels.lock().unwrap_or_else(PoisonError::into_inner);
    match push.kind {
        PushKind::Message => {
            if let Some(Value::BulkString(name)) = push.data.first()
                && let Some(channel) = std::str::from_utf8(name)
                    .ok()
                    .and_then(|name| channels.get(name))
            {
                channel.notify.notify_waiters();
            }
        }
        PushKind::Disconnection => {
            for channel in channels.values() {
                channel.notify.notify_waiters();
            }
        }
        _ => {}
    }
}

/// A waiter's interest in one channel.
pub(crate) struct Watch {
    signals: Weak<Inner>,
    channel: String,
    notify: Arc<Notify>,
}

impl Watch {
    /// A future that resolves at the next message. Call `enable` on it (pinned) before the
    /// attempt it follows, so a release between the attempt and the wait is not missed.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(inner) = self.signals.upgrade() else {
            return;
        };
        let mut channels = inner
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = channels.get_mut(&self.channel) {
            entry.watchers -= 1;
            if entry.watchers == 0 {
                entry.idle_since = Some(Instant::now());
            }
        }
    }
}
