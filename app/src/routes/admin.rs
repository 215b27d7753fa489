//! The admin check, run as middleware in front of the admin routes: before anything reads
//! the request body, so an unauthenticated request gets 401 and never a 400 or 413 that
//! would tell it which fields the route takes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web;
use secrecy::{ExposeSecret, SecretString};
use subtle::{Choice, ConstantTimeEq};

use super::Side;
use crate::error::ApiError;
use crate::settings::{HttpSettings, read_admin_tokens};

/// The admin tokens accepted now: none (admin routes disabled), `ADMIN_TOKEN`, or the one
/// or two of `ADMIN_TOKEN_FILE`, which [`AdminTokens::watch`] keeps up to date. Its `Debug`
/// shows no secret.
#[derive(Clone, Debug, Default)]
pub struct AdminTokens(Arc<RwLock<Vec<SecretString>>>);

impl AdminTokens {
    /// From the settings: the file's tokens when `ADMIN_TOKEN_FILE` is set (watched for
    /// changes from then on), else `ADMIN_TOKEN`.
    ///
    /// # Errors
    /// The file cannot be read or holds no good token (the message never shows one).
    pub fn from_settings(http: &HttpSettings) -> Result<Self, String> {
        let Some(path) = &http.admin_token_file else {
            return Ok(Self::fixed(http.admin_token.iter().cloned().collect()));
        };
        // Looked at before it is read: a change while it is read is read again.
        let seen = modified(path);
        let tokens = Self::fixed(read_admin_tokens(path, http.allow_demo_admin_token)?);
        tokens.watch(path.clone(), seen, http.allow_demo_admin_token);
        Ok(tokens)
    }

    fn fixed(tokens: Vec<SecretString>) -> Self {
        Self(Arc::new(RwLock::new(tokens)))
    }

    /// Re-read `path` within a second of each change to it, for as long as the tokens are
    /// in use. A file that became unreadable or invalid keeps the tokens read last, with an
    /// error in the log. Replace the file by a rename (as secret stores mount theirs): one
    /// written in place may be read half written.
    fn watch(&self, path: PathBuf, mut seen: Option<(SystemTime, u64)>, allow_demo: bool) {
        let tokens = Arc::downgrade(&self.0);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            loop {
                tick.tick().await;
                let Some(tokens) = tokens.upgrade() else {
                    return;
                };
                let now = modified(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                match read_admin_tokens(&path, allow_demo) {
                    Ok(read) => {
                        tracing::info!(tokens = read.len(), "ADMIN_TOKEN_FILE read again");
                        *tokens.write().unwrap_or_else(PoisonError::into_inner) = read;
                    }
                    Err(why) => {
                        tracing::error!(%why, "ADMIN_TOKEN_FILE changed and cannot be used; the tokens read last stay");
                    }
                }
            }
        });
    }

    /// Whether any token is set (admin routes enabled).
    fn enabled(&self) -> bool {
        !self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// Whether `headers` carry `Authorization: Bearer <one of the tokens>`.
    fn accept(&self, headers: &header::HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            // The scheme is case-insensitive (RFC 9110).
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, token)| token);
        let tokens = self.0.read().unwrap_or_else(PoisonError::into_inner);
        // A maintained constant-time comparison, with every token compared: the time taken
        // depends neither on where a token differs nor on which one matched.
        tokens
            .iter()
            .fold(Choice::from(0), |matched, expected| {
                matched | given.as_bytes().ct_eq(expected.expose_secret().as_bytes())
            })
            .into()
    }
}

/// How often `ADMIN_TOKEN_FILE`'s modification time is looked at.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// When `path` was last modified (with its length, for file systems with coarse times).
fn modified(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Let the request through only with `Authorization: Bearer <an admin token>`. A refusal
/// is an answer, not an error, so that the access log and the default headers see it.
pub async fn require_admin(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let refused = match req.app_data::<web::Data<AdminTokens>>() {
        Some(tokens) if tokens.enabled() => {
            if tokens.accept(req.headers()) {
                return Ok(next.call(req).await?.map_into_boxed_body());
            }
            tracing::warn!(peer = ?req.peer_addr().map(|p| p.ip()), path = req.path(), "an admin route was refused: a missing or wrong token");
            ApiError::Unauthorized
        }
        _ => ApiError::AdminDisabled,
    };
    Ok(req.error_response(refused))
}

/// Whether `req` carries an admin token (never when admin routes are disabled, nor on the
/// public listener: the admin token opens nothing there).
pub(crate) fn carries_admin_token(req: &actix_web::HttpRequest) -> bool {
    req.app_data::<Side>() == Some(&Side::Operations)
        && req
            .app_data::<web::Data<AdminTokens>>()
            .is_some_and(|tokens| tokens.accept(req.headers()))
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
