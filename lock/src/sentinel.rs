//! Redis behind Sentinel (feature `sentinel`): a connection that finds the primary through
//! the Sentinels and follows it when they fail over.
//!
//! [`SentinelConnection`] is a [`ConnectionLike`], so the single-Redis backend works through
//! it unchanged: `Locker::connect(SentinelConnection::connect(..).await?, options)`. It keeps
//! one multiplexed connection to the primary the Sentinels name, and moves to another one
//! in two ways:
//! - **at once** when a command fails in a way that says the primary is not there any more
//!   (the connection dropped or was refused, a timeout, or `READONLY`: the node was demoted
//!   to a replica): the Sentinels are asked again and the command is sent once more, to
//!   the primary they name (before they have failed over, that is still the old one, and
//!   the command answers its error);
//! - **within [`check_every`](SentinelConnectionBuilder::check_every)** (1 s by default)
//!   otherwise: a background task asks the Sentinels which node is the primary, and a
//!   change moves the connection there. That covers an old primary that is still up but
//!   cut off from the Sentinels, and kept taking our writes.
//!
//! A failover to a replica that had not received the last writes loses them: a lock that
//! looked held is gone, and another owner can take it while its first holder still works
//! (the Redlock debate's failure, for real). The fence is what stays safe then: every
//! fence is above the Redis host's clock in microseconds, so the new primary still hands
//! out fences above the lost holder's, and a store that checks fences refuses that holder's
//! writes. [`LockOptionsBuilder::wait_for_replicas`](crate::LockOptionsBuilder::wait_for_replicas)
//! narrows the window (the guard says whether the lock reached a replica).
//!
//! ```no_run
//! # async fn run() -> distlock::Result<()> {
//! use std::time::Duration;
//! use distlock::{LockOptions, Locker, SentinelConnection};
//!
//! let sentinels = vec!["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"];
//! let conn = SentinelConnection::connect(sentinels, "mymaster").await?;
//! let options = LockOptions::builder()
//!     .ttl(Duration::from_secs(5))
//!     .wait_for_replicas(1, Duration::from_millis(50)) // optional: see the guard's replicas()
//!     .build()?;
//! let locker = Locker::connect(conn, options).await?;
//! let guard = locker.acquire("lock_sale_1").await?;
//! if guard.replicas() == Some(0) {
//!     // No replica has the lock yet: a failover now would forget it.
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Release signals ([`ReleaseSignals`](crate::ReleaseSignals)) subscribe on one fixed
//! connection and do not follow a failover: through Sentinel, waiters poll.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use crate::error::Result;

/// A connection to the primary that a set of Redis Sentinels names, following failovers
/// (see the module docs). Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    /// The master's name the Sentinels monitor it under (`sentinel monitor <name> ...`).
    service: String,
    /// The Sentinels, asked in turn; a tokio mutex: asking takes round trips.
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// How to connect to the primary once found (password, TLS, database).
    node: SentinelNodeConnectionInfo,
    config: AsyncConnectionConfig,
    /// The primary in use, if any: dropped when it fails or the Sentinels name another.
    current: Mutex<Option<Current>>,
    /// Connections made so far: each one's generation, so that a failure forgets only the
    /// connection it came from, never one made after it.
    connections_made: AtomicU64,
    /// One lookup at a time: the callers that find no primary wait for the first one's.
    looking: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Current {
    conn: MultiplexedConnection,
    address: ConnectionAddr,
    /// Counts the connections made, so a failure forgets only the connection it came from.
    generation: u64,
}

/// Builds a [`SentinelConnection`].
#[must_use = "a builder does nothing until `connect` is called"]
pub struct SentinelConnectionBuilder {
    sentinels: Vec<redis::ConnectionInfo>,
    service: String,
    node: SentinelNodeConnectionInfo,
    check_every: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl SentinelConnection {
    /// Find the primary named `service` through `sentinels` (`redis://host:26379` each) and
    /// connect to it, with the defaults of [`builder`](Self::builder).
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when no Sentinel answers, none knows `service`,
    /// or the primary cannot be reached.
    pub async fn connect<T: IntoConnectionInfo>(sentinels: Vec<T>, service: &str) -> Result<Self> {
        Self::builder(sentinels, service)?.connect().await
    }

    /// A builder for a connection to the primary named `service` through `sentinels`.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) for an invalid Sentinel address, or none.
    pub fn builder<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        service: &str,
    ) -> Result<SentinelConnectionBuilder> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a Sentinel connection needs at least one Sentinel address",
            ))
            .into());
        }
        Ok(SentinelConnectionBuilder {
            sentinels,
            service: service.to_owned(),
            node: SentinelNodeConnectionInfo::default(),
            check_every: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(2),
        })
    }

    /// The primary's address in use now (`None` between a failure and the next lookup).
    pub fn primary(&self) -> Option<String> {
        self.inner
            .current()
            .map(|current| current.address.to_string())
    }
}

impl SentinelConnectionBuilder {
    /// How often the Sentinels are asked which node is the primary (1 s by default): the
    /// bound on how long writes can go to an old primary that has not failed outright.
    pub fn check_every(mut self, every: Duration) -> Self {
        self.check_every = every;
        self
    }

    /// How to connect to the primary (password, database, TLS), when the Sentinels' address
    /// is not enough.
    pub fn node_info(mut self, node: SentinelNodeConnectionInfo) -> Self {
        self.node = node;
        self
    }

    /// How long a connection attempt to the primary may take (1 s by default).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long a command may wait for its answer (2 s by default); a timeout counts as a
    /// primary that went away.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Find the primary and connect to it; start following it.
    ///
    /// # Errors
    /// As [`SentinelConnection::connect`].
    pub async fn connect(self) -> Result<SentinelConnection> {
        let sentinel = Sentinel::build(self.sentinels)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout));
        let inner = Arc::new(Inner {
            service: self.service,
            sentinel: tokio::sync::Mutex::new(sentinel),
            node: self.node,
            config,
            current: Mutex::new(None),
            connections_made: AtomicU64::new(0),
            looking: tokio::sync::Mutex::new(()),
        });
        inner.connection().await?;
        tokio::spawn(follow(Arc::downgrade(&inner), self.check_every));
        Ok(SentinelConnection { inner })
    }
}

impl Inner {
    fn current(&self) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to the primary, looked up through the Sentinels when there is none.
    async fn connection(&self) -> RedisResult<Current> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let _looking = self.looking.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let address = self.primary_address().await?;
        self.connect_to(address).await
    }

    /// Ask the Sentinels for the primary (they check it answers `ROLE` as a master).
    async fn primary_address(&self) -> RedisResult<redis::ConnectionInfo> {
        let client = self
            .sentinel
            .lock()
            .await
            .async_master_for(&self.service, Some(&self.node))
            .await?;
        Ok(client.get_connection_info().clone())
    }

    async fn connect_to(&self, info: redis::ConnectionInfo) -> RedisResult<Current> {
        let address = info.addr().clone();
        let conn = redis::Client::open(info)?
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let generation = self.connections_made.fetch_add(1, Ordering::SeqCst) + 1;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let made = Current {
            conn,
            address,
            generation,
        };
        *current = Some(made.clone());
        tracing::info!(primary = %made.address, service = %self.service, "connected to the Redis primary");
        Ok(made)
    }

    /// Forget the connection of `generation` (not a newer one made meanwhile).
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            tracing::warn!(service = %self.service, "the Redis primary went away; asking the Sentinels again");
            *current = None;
        }
    }
}

/// Ask the Sentinels every `every` which node is the primary, and move there when it
/// changed. Ends when the connection's last clone is dropped.
async fn follow(inner: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Some(current) = inner.current() else {
            continue;
        };
        match inner.primary_address().await {
            Ok(info) if *info.addr() != current.address => {
                let _looking = inner.looking.lock().await;
                tracing::warn!(old = %current.address, new = %info.addr(), "the Sentinels name another primary");
                inner.forget(current.generation);
                if let Err(error) = inner.connect_to(info).await {
                    tracing::warn!(%error, "cannot connect to the new primary yet");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "no Sentinel answered"),
        }
    }
}

/// Whether an error says the primary we talk to is gone or no longer the primary.
fn primary_gone(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// Whether `cmd` is `WAIT`.
fn is_wait(cmd: &Cmd) -> bool {
    matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"WAIT"))
}

/// What is sent: a command or a pipeline.
#[derive(Clone, Copy)]
enum Request<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

impl SentinelConnection {
    /// Send `request` to the primary; if that fails because the primary went away, ask the
    /// Sentinels again and send it once more (see the module docs).
    async fn on_primary(&self, request: Request<'_>) -> RedisResult<Vec<Value>> {
        // `WAIT` counts the replicas that acknowledged this connection's writes: on another
        // connection it would count none of ours (and answer at once with every replica
        // listed), and its timing out means only that replicas were slow. It is sent once.
        let is_wait = matches!(request, Request::One(cmd) if is_wait(cmd));
        let mut last = None;
        for _ in 0..if is_wait { 1 } else { 2 } {
            let current = self.inner.connection().await?;
            let mut conn = current.conn.clone();
            let answer = match request {
                Request::One(cmd) => conn.req_packed_command(cmd).await.map(|v| vec![v]),
                Request::Many(pipeline, offset, count) => {
                    conn.req_packed_commands(pipeline, offset, count).await
                }
            };
            match answer {
                Err(error) if primary_gone(&error) && !(is_wait && error.is_timeout()) => {
                    self.inner.forget(current.generation);
                    last = Some(error);
                }
                answer => return answer,
            }
        }
        Err(last.expect("two tries failed"))
    }
}

/// Every command goes to the primary. One that fails because the primary went away is sent
/// once more, to the primary the Sentinels name then (except `WAIT`, see above). The first
/// try may have run: an acquire or renewal re-sent with the same token answers as the first
/// did; a release re-sent after its first try ran finds the key gone (reported as released
/// while the lease runs) or, if another owner took it meanwhile, taken (reported as lost:
/// a false alarm of that rare kind, never a missed one); a fence advance re-sent hands out
/// one more fence. Other commands sent through this connection should be safe to re-send.
impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut answer = self.on_primary(Request::One(cmd)).await?;
            Ok(answer.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.on_primary(Request::Many(pipeline, offset, count))
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.inner
            .current()
            .map_or(0, |current| current.conn.get_db())
    }
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("service", &self.inner.service)
            .field("primary", &self.primary())
            .finish_non_exhaustive()
    }
}
