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
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token);
    // A maintained constant-time comparison: the time taken does not depend on where the
    // two tokens first differ.
    if bool::from(given.as_bytes().ct_eq(expected.expose_secret().as_bytes())) {
        next.call(req).await
    } else {
        Err(ApiError::Unauthorized.into())
    }
}

/// Who made an admin change, for the stock ledger.
pub fn actor(req: &actix_web::HttpRequest) -> String {
    match req.peer_addr() {
        Some(peer) => format!("admin@{}", peer.ip()),
        None => "admin".to_owned(),
    }
}
