//! The members of the cluster: one client each, asked one at a time, and the failover from
//! a member that cannot answer to the next ([`EtcdLock::call`]). Also what the errors of
//! etcd's client say: which ones mean "ask another member" ([`unreachable()`]).
//!
//! Why a step may go to another member, or twice to one: every step of this backend may
//! run twice (see [`Backend`](crate::backend::Backend)), so one whose answer was lost with
//! its member may go to another, or again to the same: a grant sent again finds its lease
//! there (ids are ours), a join finds its key, a delete or revoke finds nothing left to do,
//! a read or keep-alive is harmless. A member that failed without timing out is asked once
//! more before the next, because its client hands a request the error of an earlier
//! connection attempt whose own request was given up meanwhile (tonic's reconnect keeps
//! that error for the next request): after a member came back, its first answer can be the
//! failure of a connection made while it was away. A member that timed out is not asked
//! again: that would cost another timeout.
//!
//! Why each request runs in a task of its own ([`EtcdLock::ask`]): the task moves the
//! member in use on even when the caller has given up meanwhile (a renewal the watchdog
//! cancels at the end of its lease, a wait dropped at its deadline, a readiness probe under
//! a timeout no longer than ours: the service's `/readyz` gives `inspect` 1 s, the default
//! request timeout). Otherwise a caller that gives up first would leave the member in use
//! on the hung member, and every later step would start there again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client as etcd;
use etcd_client::Txn;

use super::EtcdLock;
use crate::error::{Error, Result};

/// How often a connection with a stream open on it (a watch) is pinged (HTTP/2
/// keep-alive), so that a watch through a member that stopped answering breaks, and is
/// made again through a member that answers, instead of waiting for ever.
///
/// TIMING: etcd sends a GOAWAY ("too many pings") to a client that pings more often than
/// its `--grpc-keepalive-min-time` (5 s by default); 10 s stays above it.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// Settings for [`EtcdLock`]: the cluster's endpoints and how long one request may take.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is called"]
pub struct EtcdLockBuilder {
    endpoints: Vec<String>,
    request_timeout: Duration,
    /// The authority `https://` endpoints are checked against; `None`: the system's.
    #[cfg(feature = "etcd-tls")]
    ca_pem: Option<Vec<u8>>,
}

impl EtcdLockBuilder {
    /// Settings for the cluster at `endpoints`, with the default request timeout.
    pub(super) fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            request_timeout: EtcdLock::DEFAULT_REQUEST_TIMEOUT,
            #[cfg(feature = "etcd-tls")]
            ca_pem: None,
        }
    }

    /// How long one request may take at one member (connecting included) before it is
    /// given up there and sent to the next member. Default
    /// [`EtcdLock::DEFAULT_REQUEST_TIMEOUT`], 1 s: etcd answers a durable write in
    /// milliseconds, so a member that has not answered in a second is taken as hung.
    ///
    /// With more than one member, [`Locker::new`](crate::Locker::new) refuses a ttl that
    /// leaves a renewal less than two of these (see [`EtcdLock::connect`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Check the certificates of `https://` endpoints against the authority in `pem` (one or
    /// more PEM certificates) instead of the system's trusted authorities. Plain `http://`
    /// endpoints ignore it.
    #[cfg(feature = "etcd-tls")]
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// A client for each endpoint, used one at a time (see [`EtcdLock::connect`]). An
    /// `https://` endpoint is reached over TLS (the `etcd-tls` feature), its certificate
    /// checked against `ca_certificate` or, without one, against
    /// the system's trusted authorities.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero request timeout; [`Error::Backend`] for an
    /// endpoint that is not a URL, or none at all.
    pub async fn connect(self) -> Result<EtcdLock> {
        let timeout = self.request_timeout;
        if timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "the etcd request timeout is zero: no request could be answered".into(),
            ));
        }
        let options = client_options(timeout);
        let mut clients = Vec::new();
        for endpoint in &self.endpoints {
            #[cfg_attr(not(feature = "etcd-tls"), expect(unused_mut))]
            let mut options = options.clone();
            #[cfg(feature = "etcd-tls")]
            if endpoint
                .split_once("://")
                .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("https"))
            {
                let tls = etcd::TlsOptions::new();
                options = options.with_tls(match &self.ca_pem {
                    Some(pem) => tls.ca_certificate(etcd::Certificate::from_pem(pem)),
                    None => tls.with_native_roots(),
                });
            }
            // Connects lazily: a member that is down now is tried when a step needs it.
            clients.push(etcd::Client::connect([endpoint], Some(options)).await?);
        }
        if clients.is_empty() {
            return Err(etcd::Error::InvalidArgs("no etcd endpoint".into()).into());
        }
        Ok(EtcdLock::with_clients(clients, timeout))
    }
}

/// How each member's client connects and asks: every request bounded by `timeout`.
fn client_options(timeout: Duration) -> etcd::ConnectOptions {
    etcd::ConnectOptions::new()
        .with_connect_timeout(timeout)
        // The member learns the deadline too (gRPC's `grpc-timeout`); `ask` bounds the
        // whole request on our side, a stream's first answer included.
        .with_timeout(timeout)
        // Pings only while a stream is open: etcd counts pings on an idle connection
        // against the client.
        .with_keep_alive(KEEP_ALIVE_EVERY, timeout)
        .with_keep_alive_while_idle(false)
        // A member cut off from the leader refuses (`UNAVAILABLE`, "no leader") instead
        // of waiting for one, and ends its watch streams: the step goes to another
        // member, the waiter watches through another.
        .with_require_leader(true)
}

impl EtcdLock {
    /// Send `request` to the member in use; if it cannot be reached ([`unreachable()`]), to
    /// the next, until every member was tried (a member that failed without timing out is
    /// asked twice). Answers the first answer that is not such a failure, or the last error.
    pub(super) async fn call<T, F, Fut>(&self, request: F) -> Result<T, etcd::Error>
    where
        F: Fn(etcd::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let members = self.clients.len();
        let first = self.current.load(Ordering::Relaxed) % members;
        let mut last_error = None;
        for at in (first..first + members).map(|i| i % members) {
            for last_try in [false, true] {
                match self
                    .ask(at, last_try, request(self.clients[at].clone()))
                    .await
                {
                    Err(error) if unreachable(&error) => {
                        tracing::debug!(%error, member = at, "etcd member could not answer");
                        let again = !last_try && !timed_out(&error);
                        last_error = Some(error);
                        if !again {
                            break;
                        }
                    }
                    answer => return answer,
                }
            }
        }
        Err(last_error.expect("at least one member"))
    }

    /// `request` to member `at`, bounded by the request timeout. If the member does not
    /// answer in time, or fails on our `last_try` of it, `current` moves on to the next
    /// member (unless a step has moved it already: its news is as new), so that the steps
    /// after this one start there. The request runs in a task of its own, which ends within
    /// the request timeout and sends nothing more.
    async fn ask<T, Fut>(&self, at: usize, last_try: bool, request: Fut) -> Result<T, etcd::Error>
    where
        Fut: Future<Output = Result<T, etcd::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let (current, members, timeout) = (
            Arc::clone(&self.current),
            self.clients.len(),
            self.request_timeout,
        );
        let asked = tokio::spawn(async move {
            let answer = match tokio::time::timeout(timeout, request).await {
                Ok(answer) => answer,
                Err(_) => Err(no_answer_within(timeout)),
            };
            if let Err(error) = &answer
                && (timed_out(error) || (last_try && unreachable(error)))
            {
                let _ = current.compare_exchange(
                    at,
                    (at + 1) % members,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            answer
        });
        match asked.await {
            Ok(answer) => answer,
            Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
            Err(ended) => Err(etcd::Error::Internal(format!(
                "the task of a request to etcd ended: {ended}"
            ))),
        }
    }

    /// One transaction, through [`call`](Self::call).
    pub(super) async fn txn(&self, txn: Txn) -> Result<etcd::TxnResponse, etcd::Error> {
        self.call(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }
}

/// Whether `error` says that the member could not be reached or could not answer now, so
/// that another member may (and a waiter should try again rather than give up its place):
/// gRPC's `UNAVAILABLE` (not connected, no leader, leader changed, shutting down, a request
/// that timed out in raft), `CANCELLED` (the connection closed, the client's timeout),
/// `DEADLINE_EXCEEDED`, etcd's "not leader" (a lease request that reached a member which
/// had just lost the lead), any status the client made itself from a transport error (a
/// member sends none with a source: a broken connection comes as `UNKNOWN`), a
/// keep-alive stream that ended before its answer, and our own request timeout.
pub(super) fn unreachable(error: &etcd::Error) -> bool {
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    const UNAVAILABLE: i32 = 14;
    match error {
        etcd::Error::TransportError(_) => true,
        etcd::Error::IoError(_) => timed_out(error),
        // etcd-client's `lease_keep_alive` when the stream ends without an answer.
        etcd::Error::WatchError(_) => true,
        etcd::Error::GRpcStatus(status) => {
            matches!(
                i32::from(status.code()),
                CANCELLED | DEADLINE_EXCEEDED | UNAVAILABLE
            ) || has_status(error, FAILED_PRECONDITION, "etcdserver: not leader")
                || std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

/// Whether `error` is a request timeout ([`EtcdLock::ask`]'s, or the client's), or a
/// deadline that ran out at the member.
pub(super) fn timed_out(error: &etcd::Error) -> bool {
    const CANCELLED: i32 = 1;
    const DEADLINE_EXCEEDED: i32 = 4;
    match error {
        etcd::Error::IoError(error) => error.kind() == std::io::ErrorKind::TimedOut,
        etcd::Error::GRpcStatus(status) => {
            matches!(i32::from(status.code()), CANCELLED | DEADLINE_EXCEEDED)
        }
        _ => false,
    }
}

/// The error of a request that a member did not answer within `timeout`.
fn no_answer_within(timeout: Duration) -> etcd::Error {
    etcd::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the etcd member did not answer within the request timeout ({timeout:?})"),
    ))
}

pub(super) const FAILED_PRECONDITION: i32 = 9;
pub(super) const NOT_FOUND: i32 = 5;

/// Whether `error` is a gRPC status `code` whose message contains `message`.
pub(super) fn has_status(error: &etcd::Error, code: i32, message: &str) -> bool {
    matches!(error, etcd::Error::GRpcStatus(status)
        if i32::from(status.code()) == code && status.message().contains(message))
}

/// etcd's answer to a revoke, or a put, on a lease it does not have.
pub(super) fn lease_not_found(error: &etcd::Error) -> bool {
    has_status(error, NOT_FOUND, "requested lease not found")
}
