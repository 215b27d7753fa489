//! The access log and the request id: every answer carries an `X-Request-Id` (the one the
//! proxy in front sent, when it is a short visible token, or one made here), and, when the
//! `seckill::access` target is enabled at `info` (the default `RUST_LOG`), one log line
//! per request with that id, the client's address, the method, the path, the status and the
//! time taken. A buyer's complaint that quotes the id leads to the line. Headers are never
//! logged: the `Authorization` of a buyer or an admin stays out of the log.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use actix_web::Error;
use actix_web::body::BoxBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::header::{HeaderName, HeaderValue};
use futures_util::future::{Ready, ready};
use pin_project_lite::pin_project;
use tokio::time::Instant;

/// The header the id travels in, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest id taken from a request; a longer one, or one with other than visible
/// ASCII, is replaced.
const MAX_ID: usize = 64;

/// Middleware for the whole app (`App::wrap`): see the module's docs.
pub struct AccessLog;

/// Ids made here: this process's random prefix, and a counter.
struct Ids {
    prefix: std::sync::LazyLock<String>,
    next: AtomicU64,
}

static IDS: Ids = Ids {
    prefix: std::sync::LazyLock::new(|| format!("{:08x}", rand::random::<u32>())),
    next: AtomicU64::new(1),
};

impl Ids {
    fn make(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::try_from(format!("{}-{n}", *self.prefix))
            .expect("hex digits and a number are a header value")
    }
}

impl<S> Transform<S, ServiceRequest> for AccessLog
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = Error>,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Transform = AccessLogService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, inner: S) -> Self::Future {
        ready(Ok(AccessLogService { inner }))
    }
}

/// [`AccessLog`] in front of the app.
pub struct AccessLogService<S> {
    inner: S,
}

impl<S> Service<ServiceRequest> for AccessLogService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = Error>,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Future = Logged<S::Future>;

    forward_ready!(inner);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let id = req
            .headers()
            .get(&REQUEST_ID)
            .filter(|given| is_usable(given.as_bytes()))
            .cloned()
            .unwrap_or_else(|| IDS.make());
        // What the line needs, taken only when it will be written.
        let line =
            tracing::enabled!(target: "seckill::access", tracing::Level::INFO).then(|| Line {
                peer: req.peer_addr().map(|peer| peer.ip()),
                method: req.method().clone(),
                path: req.path().to_owned(),
                started: Instant::now(),
            });
        Logged {
            inner: self.inner.call(req),
            id,
            line,
        }
    }
}

/// An id a client may choose: 1 to [`MAX_ID`] visible ASCII characters.
fn is_usable(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_ID && id.iter().all(u8::is_ascii_graphic)
}

struct Line {
    peer: Option<std::net::IpAddr>,
    method: actix_web::http::Method,
    path: String,
    started: Instant,
}

pin_project! {
    /// The app's answer, with the id added and the line written.
    pub struct Logged<F> {
        #[pin]
        inner: F,
        id: HeaderValue,
        line: Option<Line>,
    }
}

impl<F> Future for Logged<F>
where
    F: Future<Output = Result<ServiceResponse<BoxBody>, Error>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = match this.inner.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(answer) => answer,
        };
        // The app answers its errors itself (the routes' middleware too), so an `Err` here is
        // unexpected: it is logged with the status actix will answer, without an id.
        let status = match &answer {
            Ok(answer) => answer.status(),
            Err(error) => error.as_response_error().status_code(),
        };
        if let Some(line) = this.line.take() {
            let id = this.id.to_str().unwrap_or_default();
            tracing::info!(
                target: "seckill::access",
                request_id = id,
                peer = ?line.peer,
                method = %line.method,
                path = %line.path,
                status = status.as_u16(),
                took_us = u64::try_from(line.started.elapsed().as_micros()).unwrap_or(u64::MAX),
            );
        }
        Poll::Ready(answer.map(|mut answer| {
            answer.headers_mut().insert(REQUEST_ID, this.id.clone());
            answer
        }))
    }
}
