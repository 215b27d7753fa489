//! The session: opened with the connection timeout derived from the session *granted*,
//! replaced (never mended) when it ends, and every request on it bounded by the request
//! timeout. The ttl a lock may have follows from the granted session too.

use std::time::Duration;

use tokio::time::timeout;
use zookeeper_client as zk;

use super::ZkLock;
use crate::error::{Error, Result};

/// How long a waiter, or the reaper, waits before trying again after the ensemble could not
/// be reached.
pub(super) const RETRY_AFTER: Duration = Duration::from_millis(200);

/// A session: its client, and the connection timeout it was opened with.
pub(super) struct Session {
    pub(super) client: zk::Client,
    pub(super) connection_timeout: Duration,
}

impl Session {
    /// Open a session asking for `asked`. Unless `connection_timeout` is given, it is a
    /// tenth of the smaller of the session asked for and the one the server *granted*.
    // TIMING: a server grants at most its `maxSessionTimeout`; a tenth of a larger ask would
    // be a larger share of the session granted (ask 10 s, be granted 4 s: a quarter), and
    // the client cannot change it once connected: the session is opened again, asking for
    // what was granted.
    pub(super) async fn open(
        cluster: &str,
        asked: Duration,
        connection_timeout: Option<Duration>,
    ) -> std::result::Result<Self, zk::Error> {
        let first_try = connection_timeout.unwrap_or(asked / 10);
        let client = connect_client(cluster, asked, first_try).await?;
        let granted = client.session_timeout();
        if connection_timeout.is_some() || granted / 10 >= first_try {
            return Ok(Self {
                client,
                connection_timeout: first_try,
            });
        }
        drop(client);
        let client = connect_client(cluster, granted, granted / 10).await?;
        Ok(Self {
            connection_timeout: client.session_timeout().min(granted) / 10,
            client,
        })
    }
}

async fn connect_client(
    cluster: &str,
    session_timeout: Duration,
    connection_timeout: Duration,
) -> std::result::Result<zk::Client, zk::Error> {
    zk::Client::connector()
        .with_session_timeout(session_timeout)
        .with_connection_timeout(connection_timeout)
        .connect(cluster)
        .await
}

impl ZkLock {
    pub(super) fn current(&self) -> zk::Client {
        self.session().client.clone()
    }

    pub(super) fn session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.inner
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The session to use: the current one, or a new one if it has ended.
    pub(super) async fn client(&self) -> Result<zk::Client> {
        let current = self.current();
        if current.state().is_terminated() {
            self.replace(&current).await?;
            return Ok(self.current());
        }
        Ok(current)
    }

    /// Run `step` on the current session; if the session turns out to have ended (the
    /// server expired or closed it), run it once more on a new one. Nodes of the old
    /// session are gone, so the second run sees the lock as it now is.
    pub(super) async fn on_session<T, F, Fut>(&self, step: F) -> Result<T>
    where
        F: Fn(zk::Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let client = self.client().await?;
        match step(client.clone()).await {
            Err(error) if session_ended(&error) => {
                self.replace(&client).await?;
                step(self.client().await?).await
            }
            other => other,
        }
    }

    /// Replace the session `failed` is on with a new one (unless another caller did), in a
    /// task on the handle's own runtime: the new client runs its connection there, and a
    /// caller that stops waiting (a deadline, a readiness probe's time-out) does not stop
    /// the replacement half-way.
    pub(super) async fn replace(&self, failed: &zk::Client) -> Result<()> {
        let lock = self.clone();
        let failed = failed.session_id();
        self.inner
            .runtime
            .spawn(async move { lock.replace_now(failed).await })
            .await
            .unwrap_or(Err(zk::Error::ClientClosed.into()))
    }

    pub(super) async fn replace_now(&self, failed: zk::SessionId) -> Result<()> {
        let _one = self.inner.reconnecting.lock().await;
        if self.current().session_id() != failed {
            return Ok(());
        }
        tracing::warn!("ZooKeeper session ended; opening a new one");
        let fresh = self
            .bounded(Session::open(
                &self.inner.cluster,
                self.inner.asked_timeout,
                self.inner.connection_timeout,
            ))
            .await?;
        *self.session() = fresh;
        Ok(())
    }

    /// `request`, or [`zk::Error::Timeout`] once the request timeout has passed.
    pub(super) async fn bounded<T, E: Into<zk::Error>>(
        &self,
        request: impl Future<Output = std::result::Result<T, E>>,
    ) -> std::result::Result<T, zk::Error> {
        match timeout(self.inner.request_timeout, request).await {
            Ok(answer) => answer.map_err(Into::into),
            Err(_elapsed) => Err(zk::Error::Timeout),
        }
    }

    /// The longest ttl a lock on the current session may have: half the session timeout.
    ///
    // TIMING: a holder's lease runs one ttl from when its last proof (a write through the
    // leader) was sent, but the leader does not count that write as a sign of life: it
    // learns of the session's activity from the follower the client is connected to, which
    // reports it at most every half server tick, and the client is quiet for at most 0.15
    // of the session timeout T between messages (zookeeper-client pings after 3/20 of T).
    // So the leader may expire the session as early as T - 0.15 T - tick / 2 after the
    // proof was sent, and a server tick is at most T / 2 (ZooKeeper grants no session
    // shorter than two ticks): 0.6 T at worst. A ttl of at most T / 2 ends first.
    pub fn max_ttl(&self) -> Duration {
        self.session_timeout() / 2
    }

    /// A ttl longer than [`max_ttl`](Self::max_ttl) would let the holder count on a lock
    /// after the ensemble gave it away.
    pub(super) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let session = self.session_timeout();
        if ttl > self.max_ttl() {
            return Err(Error::InvalidOptions(format!(
                "ttl {ttl:?} is longer than half the ZooKeeper session timeout {session:?} the server granted: \
                 a lock lives only as long as its session, and the ensemble may expire a session \
                 0.6 of its timeout after the holder last proved it alive, so the holder could believe \
                 it held a lock the ensemble had already given away"
            )));
        }
        Ok(())
    }
}

/// Whether `error` may pass once a server answers again (the connection was lost, or the
/// request timed out), rather than saying the session is over.
pub(super) fn transient(error: &Error) -> bool {
    matches!(
        error.backend_source(),
        Some(zk::Error::ConnectionLoss | zk::Error::Timeout)
    )
}

/// Whether `error` says the session is over (expired, or its client closed).
pub(super) fn session_ended(error: &Error) -> bool {
    matches!(
        error.backend_source(),
        Some(zk::Error::SessionExpired | zk::Error::ClientClosed)
    )
}

impl From<zk::Error> for Error {
    fn from(error: zk::Error) -> Self {
        Error::backend("zookeeper", error)
    }
}
