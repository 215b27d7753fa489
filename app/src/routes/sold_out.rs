//! The sold-out lane: a purchase of a product this instance knows is sold out is answered
//! `409 sold_out` before the router, the extractors or the body parser see it. The flood
//! that follows a sale is nearly all such requests, so it costs about what `/healthz` costs.
//!
//! The lane answers only what the purchase route would answer: `POST
//! /api/products/{id}/purchase` with an id written as plain digits, for a product whose
//! sold-out mark this instance trusts ([`Sale::known_sold_out`]). Everything else (another
//! method or path, an id in another form, an open or unknown product) goes on to the router
//! untouched, and `Sale::purchase` still answers from memory a product that sells out while
//! its body is read.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{self, Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::{Method, header};
use actix_web::{Error, HttpRequest, ResponseError, web};
use futures_util::Stream;
use futures_util::future::{Either, Ready, ready};
use tokio::time::Instant;

use super::MAX_BODY_BYTES;
use crate::domain::ProductId;
use crate::error::ApiError;
use crate::sale::Sale;

/// The purchase route's path, around the product id.
const PREFIX: &str = "/api/products/";
const SUFFIX: &str = "/purchase";

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
        ready(Ok(SoldOutLaneService { router }))
    }
}

/// [`SoldOutLane`] in front of the app's router.
pub struct SoldOutLaneService<S> {
    /// Where every request the lane does not answer goes.
    router: S,
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
        let started = Instant::now();
        if !known_sold_out(&req) {
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

/// Whether `req` is a purchase the lane answers: the route's method and path, an id in
/// plain digits, a product this instance knows is sold out. Cheap for every other request:
/// a method comparison, or that and a prefix.
fn known_sold_out(req: &ServiceRequest) -> bool {
    if req.method() != Method::POST {
        return false;
    }
    let Some(id) = req
        .path()
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(SUFFIX))
    else {
        return false;
    };
    // Digits only: an id percent-encoded, signed or otherwise spelled goes to the route,
    // which decodes the path as every route does.
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let (Ok(id), Some(sale)) = (ProductId::parse(id), req.app_data::<web::Data<Sale>>()) else {
        return false;
    };
    sale.known_sold_out(id)
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
/// `Content-Length`; it reads the rest of a chunked one itself). Nothing is kept. Not read:
/// a body announced larger than any route takes, the part of one past that size, and
/// whatever has not arrived within [`DISCARD_WITHIN`] (the answer is not held back for a
/// client that stopped sending).
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
        polled: false,
        give_up: None,
    }
}

/// The future [`discard_body`] returns: done when the body has been read to its end (or past
/// [`MAX_BODY_BYTES`], or it failed), or when [`DISCARD_WITHIN`] has passed.
///
/// ACTIX: the body that comes in the same read as the head (a buyer's whole request, nearly
/// always) costs no timer and no wake-up. actix calls the service as soon as it has decoded
/// the head, before it hands over the body that followed; it then hands the body over and,
/// in the same pass over the connection, polls the service again (actix-http's h1
/// dispatcher: `poll_request`, then `poll_response`). So the first poll returns `Pending`
/// without arranging a wake-up of its own, and the payload is polled with a waker that does
/// nothing (each of its wake-ups would only schedule one more pass over the connection). The
/// connection's task is what wakes: actix registered it for the socket when it found no more
/// to read, and every pass that hands over more of the body, or the end of a body whose
/// client went away, polls the service again. From the second poll on, a timer with the
/// real waker also bounds the wait to [`DISCARD_WITHIN`]. One case has no second poll to
/// start the timer: a purchase pipelined behind another (sent before that one's answer)
/// whose body has not fully arrived when actix starts it; it waits for its body or for the
/// client to go away, as a body read by any route does. The tests in `tests/api/sold_out.rs`
/// fail if actix stops polling again after the head: the answer would wait for the timer,
/// or forever.
pub struct DiscardBody {
    /// `None` when the body is not to be read at all.
    payload: Option<dev::Payload>,
    /// Bytes read so far.
    read: usize,
    /// Whether it has been polled once (the body cannot have been handed over before).
    polled: bool,
    /// Started at the second poll: the body was not all there.
    give_up: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for DiscardBody {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(payload) = this.payload.as_mut() else {
            return Poll::Ready(());
        };
        let mut quiet = Context::from_waker(Waker::noop());
        loop {
            match Pin::new(&mut *payload).poll_next(&mut quiet) {
                Poll::Ready(Some(Ok(chunk))) => {
                    this.read += chunk.len();
                    if this.read > MAX_BODY_BYTES {
                        return Poll::Ready(());
                    }
                }
                // The end, or a body that failed (a disconnect): nothing more to read.
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        if !std::mem::replace(&mut this.polled, true) {
            return Poll::Pending;
        }
        this.give_up
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(DISCARD_WITHIN)))
            .as_mut()
            .poll(cx)
    }
}
