//! The admin check shared by the admin routes.

use actix_web::HttpRequest;
use actix_web::http::header;

use crate::error::ApiError;

/// The configured admin token, if any.
#[derive(Clone)]
pub struct AdminToken(pub Option<String>);

/// Let the request through only with `Authorization: Bearer <ADMIN_TOKEN>`.
pub fn require_admin(req: &HttpRequest, token: &AdminToken) -> Result<(), ApiError> {
    let Some(expected) = token.0.as_deref() else {
        return Err(ApiError::AdminDisabled);
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Compare without stopping at the first differing byte, so timing does not leak the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
