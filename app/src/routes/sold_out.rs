//! The sold-out lane: a purchase of a product this instance knows is sold out is answered
//! `409 sold_out` before the router, the extractors or the body parser see it. The flood
//! that follows a sale is nearly all such requests, so it costs about what `/healthz` costs.
//!
//! The lane takes only requests the purchase route would get: `POST
//! /api/products/{id}/purchase` with the id in plain digits, for a product whose sold-out
//! mark this instance trusts ([`Sale::known_sold_out`]). It answers them as `Sale::purchase`
//! would, whoever buys, without checking the body. Everything else (another method or path,
//! an id in another form, an open or unknown product) goes on to the router untouched: the
//! route checks the body first, and `Sale::purchase` then answers from memory a product
//! that is sold out (one spelled `%31`, say, or one that sold out while its body was read).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{self, Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::{Method, Version, header};
use actix_web::{Error, HttpRequest, ResponseError, web};
use futures_util::Stream;
use futures_util::future::{Either, Ready, ready};
use tokio::time::Instant;

use super::{MAX_BODY_BYTES, PURCHASE_ROUTE};
use crate::domain::ProductId;
use crate::error::ApiError;
use crate::sale::Sale;

/// How long a sold-out answer waits for the rest of a body it will not parse.
const DISCARD_WITHIN: Duration = Duration::from_secs(2);

/// Middleware for the whole app (`App::wrap`): see the module's docs.
pub struct SoldOutLane;

impl<S> Transform<S, ServiceRequest> for SoldOutLane
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = Error>,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Transform = SoldOutLaneService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, router: S) -> Self::Future {
        let (prefix, suffix) = PURCHASE_ROUTE
            .split_once("{id}")
            .expect("the purchase route has an {id}");
        ready(Ok(SoldOutLaneService {
            router,
            prefix,
            suffix,
        }))
    }
}

/// [`SoldOutLane`] in front of the app's router.
pub struct SoldOutLaneService<S> {
    /// Where every request the lane does not answer goes.
    router: S,
    /// The purchase route's path before and after the id, from [`PURCHASE_ROUTE`] (one
    /// definition for the router and the lane).
    prefix: &'static str,
    suffix: &'static str,
}

impl<S> Service<ServiceRequest> for SoldOutLaneService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = Error>,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = Error;
    type Future = Either<S::Future, SoldOutAnswer>;

    forward_ready!(router);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let Some(id) = self.purchase_of(&req) else {
            return Either::Left(self.router.call(req));
        };
        let started = Instant::now();
        let sold_out = req
            .app_data::<web::Data<Sale>>()
            .is_some_and(|sale| sale.known_sold_out(id));
        if !sold_out {
            return Either::Left(self.router.call(req));
        }
        let decided = started.elapsed();
        let (req, payload) = req.into_parts();
        let body = discard_body(&req, payload);
        Either::Right(SoldOutAnswer {
            req: Some(req),
            body,
            decided,
        })
    }
}

impl<S> SoldOutLaneService<S> {
    /// The product `req` purchases, if it is a request for the purchase route (its method and
    /// path) with the id in plain digits. What other requests pay for it: a method
    /// comparison (every `GET`), or that and the prefix and suffix (other `POST`s).
    fn purchase_of(&self, req: &ServiceRequest) -> Option<ProductId> {
        if req.method() != Method::POST {
            return None;
        }
        let id = req
            .path()
            .strip_prefix(self.prefix)?
            .strip_suffix(self.suffix)?;
        // Digits only: an id percent-encoded, signed or otherwise spelled goes to the route,
        // which decodes the path as every route does.
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        ProductId::parse(id).ok()
    }
}

/// The lane's answer: `409 sold_out` once the body has been read (see [`discard_body`]).
pub struct SoldOutAnswer {
    /// Taken when the answer is made.
    req: Option<HttpRequest>,
    body: DiscardBody,
    /// How long deciding took, without the body's arrival: what the latency metric counts.
    decided: Duration,
}

impl Future for SoldOutAnswer {
    type Output = Result<ServiceResponse<BoxBody>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        std::task::ready!(Pin::new(&mut this.body).poll(cx));
        let req = this
            .req
            .take()
            .expect("SoldOutAnswer polled after it answered");
        // Borrowed, not cloned: the `Arc` is shared by every worker thread.
        if let Some(sale) = req.app_data::<web::Data<Sale>>() {
            sale.answered_sold_out(this.decided);
        }
        let answer = ApiError::SoldOut.error_response();
        Poll::Ready(Ok(ServiceResponse::new(req, answer)))
    }
}

/// Read a body we will not parse to its end, so that the connection can carry the buyer's
/// next request: actix closes a connection whose request body was left unread (one with a
/// `Content-Length`; it reads the rest of a chunked one itself, once the payload is
/// dropped). Nothing is kept. Not read: a body announced larger than any route takes, the
/// part of one past that size, and whatever has not arrived within [`DISCARD_WITHIN`] (the
/// answer is not held back for a client that stopped sending).
fn discard_body(req: &HttpRequest, payload: dev::Payload) -> DiscardBody {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    DiscardBody {
        payload: announced
            .is_none_or(|length| length <= MAX_BODY_BYTES)
            .then_some(payload),
        read: 0,
        quiet: matches!(req.version(), Version::HTTP_10 | Version::HTTP_11),
        give_up: None,
    }
}

/// The future [`discard_body`] returns: done when the body has been read to its end (or past
/// [`MAX_BODY_BYTES`], or it failed), or when [`DISCARD_WITHIN`] has passed. It drops the
/// payload when it is done, before the answer is sent.
///
/// ACTIX: over HTTP/1 the payload is polled with a waker that does nothing, and a body that
/// comes in the same read as the head (a buyer's whole request, nearly always) costs no
/// extra pass over the connection. actix calls the service as soon as it has decoded the
/// head, before it hands over the body that followed; it then hands the body over and, in
/// the same pass, polls the service again (actix-http's h1 dispatcher: `poll_request`, then
/// `poll_response`). A wake-up from the payload would only schedule one more pass, which is
/// a good part of what a sold-out answer costs. Every pass that hands over more of the body,
/// or the end of a body whose client went away, polls the service again, so nothing is
/// lost; and the timer, which has the real waker, bounds the wait whatever actix does. Over
/// HTTP/2 (whose streams are tasks of their own, not polled again by a connection) the
/// payload gets the real waker. The tests in `tests/api/sold_out.rs` fail if actix stops
/// polling again after handing a body over: the answer would wait for the timer.
pub struct DiscardBody {
    /// `None` when the body is not (or no longer) to be read.
    payload: Option<dev::Payload>,
    /// Bytes read so far.
    read: usize,
    /// Whether the payload is polled with a waker that does nothing (HTTP/1, see above).
    quiet: bool,
    /// Started at the first poll that found the body not all there.
    give_up: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for DiscardBody {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(payload) = this.payload.as_mut() else {
            return Poll::Ready(());
        };
        let waker = if this.quiet {
            Waker::noop()
        } else {
            cx.waker()
        };
        let mut for_payload = Context::from_waker(waker);
        let done = loop {
            match Pin::new(&mut *payload).poll_next(&mut for_payload) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.read += chunk.len();
                    if this.read > MAX_BODY_BYTES {
                        break true;
                    }
                }
                // The end, or a body that failed (a disconnect): nothing more to read.
                Poll::Ready(_) => break true,
                Poll::Pending => break false,
            }
        };
        let done = done
            || this
                .give_up
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(DISCARD_WITHIN)))
                .as_mut()
                .poll(cx)
                .is_ready();
        if !done {
            return Poll::Pending;
        }
        // Dropped before the answer goes out: actix then reads out the rest of a chunked
        // body and keeps the connection (it closes one whose payload is still held).
        this.payload = None;
        Poll::Ready(())
    }
}
