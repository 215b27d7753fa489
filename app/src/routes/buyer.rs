//! The buyer's side of the door: the client address's limit, then the buyer's token,
//! checked by the purchase handler's first extractor ([`Checked`]), so before the body is
//! read (an extractor that fails ends the extraction; the body's is never polled). A request
//! turned away here wrote nothing, queued nothing and made no key.

use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, web};

use super::admin::carries_admin_token;
use crate::domain::UserId;
use crate::error::ApiError;
use crate::identity::Identity;
use crate::limits::{Exceeded, Limits};

/// Who may buy, and how often: shared by every worker.
pub struct Gate {
    pub identity: Identity,
    pub limits: Limits,
}

/// A purchase let through the door: within its address's limit and, with identity on,
/// with a valid buyer token, whose buyer this is (`None` with identity off).
#[derive(Debug, Clone, Copy)]
pub struct Checked(pub Option<UserId>);

impl FromRequest for Checked {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(check(req))
    }
}

fn check(req: &HttpRequest) -> Result<Checked, ApiError> {
    let gate = gate(req)?;
    gate.limits.address(req).map_err(too_many)?;
    let Identity::Verified(verifier) = &gate.identity else {
        return Ok(Checked(None));
    };
    let authorization = req.headers().get(header::AUTHORIZATION);
    verifier
        .buyer(authorization.map(|value| value.as_bytes()))
        .map(|buyer| Checked(Some(buyer)))
        .map_err(ApiError::BuyerRefused)
}

/// The app's [`Gate`], borrowed (not cloned: every worker shares its `Arc`).
pub fn gate(req: &HttpRequest) -> Result<&Gate, ApiError> {
    req.app_data::<web::Data<Gate>>()
        .map(|gate| gate.get_ref())
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the app has no gate registered")))
}

/// The answer to a client over a limit.
pub fn too_many(exceeded: Exceeded) -> ApiError {
    // Whole seconds, rounded up: `Retry-After` takes no fraction, and 0 would invite a retry
    // that is refused again.
    let millis = u64::try_from(exceeded.retry_after.as_millis()).unwrap_or(u64::MAX);
    ApiError::TooManyRequests {
        retry_after_s: millis.div_ceil(1_000).max(1),
    }
}

/// Who may read the orders of `user`: the admin, or (with identity on) `user` themself.
/// Anyone else is told there is no order (`404`), not whether one exists.
///
/// # Errors
/// `401` without a token this service accepts; `404` for another buyer's token.
pub fn may_read_orders_of(req: &HttpRequest, user: UserId) -> Result<(), ApiError> {
    let Identity::Verified(verifier) = &gate(req)?.identity else {
        return Ok(());
    };
    let authorization = req.headers().get(header::AUTHORIZATION);
    if carries_admin_token(req) {
        return Ok(());
    }
    let buyer = verifier
        .buyer(authorization.map(|value| value.as_bytes()))
        .map_err(ApiError::BuyerRefused)?;
    if buyer == user {
        Ok(())
    } else {
        Err(ApiError::NotFound(NO_ORDER.into()))
    }
}

/// What a read of a buyer with no order for the product is told (and a read of another
/// buyer's order, alike).
pub const NO_ORDER: &str = "this user has no order for this product";
