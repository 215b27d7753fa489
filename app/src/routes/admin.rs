//! The admin check, run as middleware in front of the admin routes: before anything reads
//! the request body, so an unauthenticated request gets 401 and never a 400 or 413 that
//! would tell it which fields the route takes.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web;
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The configured admin token, if any (its `Debug` shows no secret).
#[derive(Clone, Debug)]
pub struct AdminToken(pub Option<SecretString>);

/// Let the request through only with `Authorization: Bearer <ADMIN_TOKEN>`.
pub async fn require_admin(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let token = req
        .app_data::<web::Data<AdminToken>>()
        .and_then(|token| token.0.clone());
    let Some(expected) = token else {
        return Err(ApiError::AdminDisabled.into());
    };
    if matches_admin_token(req.headers(), &expected) {
        next.call(req).await
    } else {
        tracing::warn!(peer = ?req.peer_addr().map(|p| p.ip()), path = req.path(), "an admin route was refused: a missing or wrong token");
        Err(ApiError::Unauthorized.into())
    }
}

/// Whether `req` carries the admin token (never, when admin routes are disabled).
pub(crate) fn carries_admin_token(req: &actix_web::HttpRequest) -> bool {
    req.app_data::<web::Data<AdminToken>>()
        .and_then(|token| token.0.as_ref())
        .is_some_and(|expected| matches_admin_token(req.headers(), expected))
}

/// Whether `headers` carry `Authorization: Bearer <expected>`.
fn matches_admin_token(headers: &header::HeaderMap, expected: &SecretString) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token);
    // A maintained constant-time comparison: the time taken does not depend on where the
    // two tokens first differ.
    bool::from(given.as_bytes().ct_eq(expected.expose_secret().as_bytes()))
}

/// Who made an admin change, for the stock ledger.
pub fn actor(req: &actix_web::HttpRequest) -> String {
    match req.peer_addr() {
        Some(peer) => format!("admin@{}", peer.ip()),
        None => "admin".to_owned(),
    }
}

/// The longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's `Idempotency-Key`, if it sent one: 1 to 255 visible ASCII characters (a
/// UUID is usual). A retry of an admin write with the same key and the same request gets
/// the first answer and changes nothing again.
///
/// # Errors
/// [`ApiError::InvalidInput`] for a key that is empty, too long or not visible ASCII.
pub fn idempotency_key(req: &actix_web::HttpRequest) -> Result<Option<String>, ApiError> {
    let Some(value) = req.headers().get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.as_bytes();
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.iter().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::InvalidInput(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        )));
    }
    Ok(Some(String::from_utf8_lossy(key).into_owned()))
}
