//! `ApiError`: every error answer of the API, as `{"error": code, "message": text}`.

use actix_web::error::JsonPayloadError;
use actix_web::http::StatusCode;
use std::sync::LazyLock;

use actix_web::http::header::{self, HeaderValue};
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;

use crate::domain::shortened;
use crate::identity::Refused;
use crate::repository;
use crate::sale::PurchaseError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Input that is well-formed but not acceptable (a zero quantity, an empty name).
    #[error("{0}")]
    InvalidInput(String),
    /// A body that is not the JSON this route takes.
    #[error("{0}")]
    MalformedBody(String),
    #[error("send the body as application/json")]
    UnsupportedMediaType,
    #[error("the body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body did not arrive within `HTTP_REQUEST_TIMEOUT_MS`; the connection is closed.
    #[error("the body did not arrive in time")]
    RequestTimeout,
    #[error("this route needs `Authorization: Bearer <ADMIN_TOKEN>`")]
    Unauthorized,
    #[error("admin routes are disabled: the service was started without ADMIN_TOKEN")]
    AdminDisabled,
    /// A purchase or order read without a buyer token this service accepts.
    #[error("{0}")]
    BuyerRefused(crate::identity::Refused),
    /// A buyer acting for another buyer.
    #[error("{0}")]
    Forbidden(String),
    /// Over a purchase limit (per buyer or per address); retry after this many seconds.
    #[error("too many purchase attempts; retry after {retry_after_s} s")]
    TooManyRequests { retry_after_s: u64 },
    #[error("{0}")]
    NotFound(String),
    #[error("this route does not take that method")]
    MethodNotAllowed,
    #[error("sold out")]
    SoldOut,
    #[error(
        "the sale of this product has not opened yet; its on_sale_at is in GET /api/products/{{id}}"
    )]
    NotOpen,
    /// With the buyer's order, when it could be looked up.
    #[error("this user already bought this product")]
    AlreadyPurchased { order_id: Option<i64> },
    /// An absolute stock write whose precondition failed.
    #[error("the stock is {current}, not the {expected} you expected; nothing changed")]
    StockChanged { current: i64, expected: i64 },
    /// An `Idempotency-Key` sent before with another request.
    #[error("this Idempotency-Key was used for another request; nothing changed")]
    IdempotencyKeyReused,
    /// A restock that would pass the largest stock.
    #[error("the stock would exceed {max}; nothing changed", max = crate::domain::Stock::MAX)]
    StockTooLarge,
    #[error("too many buyers at once; retry shortly")]
    Busy,
    #[error("the purchase lost its lock before writing; nothing was recorded, retry")]
    LockLost,
    #[error("the lock service is unreachable")]
    RedisUnavailable,
    #[error("the database is unreachable")]
    DatabaseUnavailable,
    /// A commit whose answer was lost: the order may exist. Look it up before trying again.
    #[error(
        "the purchase may or may not have been recorded; look it up at {order_path} before trying again"
    )]
    OutcomeUnknown { order_path: String },
    /// An admin write (a product created, a stock change) whose answer was lost: its
    /// connection was cut, maybe after its commit. Sent again with the same
    /// `Idempotency-Key`, it is made at most once.
    #[error(
        "the write may or may not have been made; read the product first, or send it again with the same Idempotency-Key if it had one"
    )]
    AdminOutcomeUnknown,
    /// Anything unexpected: logged with its cause, answered as a plain 500.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// Every error answer of the API.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable code: `invalid_input`, `malformed_body`, `unsupported_media_type`,
    /// `payload_too_large`, `unauthorized`, `admin_disabled`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `too_many_requests`, `sold_out`, `not_open`,
    /// `already_purchased`, `stock_changed`,
    /// `stock_too_large`, `idempotency_key_reused`, `busy`, `lock_lost`, `redis_unavailable`,
    /// `database_unavailable`, `outcome_unknown`, `internal`.
    #[schema(example = "sold_out")]
    pub error: String,
    /// What happened, for people.
    pub message: String,
    /// `already_purchased`: the buyer's existing order, when it could be looked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    /// `outcome_unknown`: where to look the order up (`GET`) before trying again.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "/api/products/1/orders/42")]
    pub order_path: Option<String>,
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidInput(_) => "invalid_input",
            ApiError::MalformedBody(_) => "malformed_body",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::Unauthorized => "unauthorized",
            ApiError::AdminDisabled => "admin_disabled",
            ApiError::BuyerRefused(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::TooManyRequests { .. } => "too_many_requests",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::SoldOut => "sold_out",
            ApiError::NotOpen => "not_open",
            ApiError::AlreadyPurchased { .. } => "already_purchased",
            ApiError::StockChanged { .. } => "stock_changed",
            ApiError::StockTooLarge => "stock_too_large",
            ApiError::IdempotencyKeyReused => "idempotency_key_reused",
            ApiError::Busy => "busy",
            ApiError::LockLost => "lock_lost",
            ApiError::RedisUnavailable => "redis_unavailable",
            ApiError::DatabaseUnavailable => "database_unavailable",
            ApiError::OutcomeUnknown { .. } | ApiError::AdminOutcomeUnknown => "outcome_unknown",
            ApiError::Internal(_) => "internal",
        }
    }

    /// Map a database error: contention (no pooled connection in time, a row lock or a
    /// statement that ran out of time) is 503 busy; a lost connection is 503 unavailable;
    /// anything else is a bug.
    pub fn from_db(error: &sqlx::Error) -> Self {
        if is_contention(error) {
            tracing::debug!(%error, "database busy");
            ApiError::Busy
        } else if is_unavailable(error) {
            tracing::warn!(%error, "database unavailable");
            ApiError::DatabaseUnavailable
        } else {
            ApiError::Internal(anyhow::anyhow!("database: {error}"))
        }
    }

    /// The handler for every JSON body extractor.
    pub fn from_json(error: JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
        let api = match error {
            JsonPayloadError::ContentType => ApiError::UnsupportedMediaType,
            JsonPayloadError::Overflow { limit }
            | JsonPayloadError::OverflowKnownLength { limit, .. } => {
                ApiError::PayloadTooLarge { limit }
            }
            // serde's message quotes the value it could not take, whole: cut it.
            JsonPayloadError::Deserialize(e) => ApiError::MalformedBody(format!(
                "invalid JSON body: {}",
                shortened(&e.to_string(), ECHO_CHARS)
            )),
            other => ApiError::MalformedBody(format!(
                "unreadable body: {}",
                shortened(&other.to_string(), ECHO_CHARS)
            )),
        };
        api.into()
    }
}

/// Errors that mean "too much going on right now; try again": the pool had no connection in
/// time, a statement gave up waiting for a lock (`lock_timeout`, 55P03) or ran past
/// `statement_timeout` (57014), or a transaction lost a deadlock (40P01) or a serialization
/// race (40001). A pool gives up the same way when PostgreSQL is down (sqlx keeps trying to
/// connect until the acquire timeout); `/readyz` tells the two apart.
fn is_contention(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => {
            repository::is_lost_race(error)
                || db
                    .code()
                    .is_some_and(|code| matches!(code.as_ref(), "55P03" | "57014"))
        }
        _ => false,
    }
}

/// How sqlx 0.8 words a connection closed after its TLS request, before any reply.
const CLOSED_DURING_TLS_REQUEST: &str = "unexpected response from SSLRequest: 0x00";

/// Errors that mean "PostgreSQL is not there right now", as opposed to a bad query. One of
/// them comes as a protocol error: sqlx asks a new connection for TLS first (under
/// `sslmode=prefer`, its default) and reads a connection closed after that request, before
/// any reply, as the reply 0x00 (as a PostgreSQL restarting, or a proxy in front of it, can
/// close it). Other protocol errors (an authentication method sqlx lacks, a message it does
/// not know) are no outage: they stay internal errors.
fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Protocol(what) => what.starts_with(CLOSED_DURING_TLS_REQUEST),
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-03: admin shutdown, crash shutdown, cannot
            // connect now (pg_terminate_backend, a restart); 57P05: the session sat idle
            // longer than the server's idle_session_timeout (pooled connections are not
            // pinged before use); 25P03: the session sat idle in a transaction too long and
            // PostgreSQL ended it (this instance was paused); 25006: the server takes no
            // writes (a standby: behind HAProxy, a member that holds Patroni's lease but has
            // not finished its promotion takes connections for a moment).
            code.starts_with("08")
                || matches!(
                    code.as_ref(),
                    "57P01" | "57P02" | "57P03" | "57P05" | "25P03" | "25006"
                )
        }),
        _ => false,
    }
}

impl ApiError {
    /// The answer to a purchase of `product` by `user` that failed with `error`;
    /// `order_id` is the buyer's existing order, for `already_purchased`.
    pub fn from_purchase(
        error: PurchaseError,
        product: i64,
        user: i64,
        order_id: Option<i64>,
    ) -> Self {
        match error {
            PurchaseError::NotFound => ApiError::NotFound("no such product".into()),
            PurchaseError::SoldOut(_) => ApiError::SoldOut,
            PurchaseError::NotOpen => ApiError::NotOpen,
            PurchaseError::AlreadyPurchased(_) => ApiError::AlreadyPurchased { order_id },
            PurchaseError::Busy => ApiError::Busy,
            PurchaseError::LockLost => ApiError::LockLost,
            PurchaseError::Redis(error) => {
                tracing::warn!(%error, "redis unavailable");
                ApiError::RedisUnavailable
            }
            PurchaseError::LockService(error) => {
                tracing::warn!(%error, "lock service unavailable");
                ApiError::RedisUnavailable
            }
            PurchaseError::Database(error) => ApiError::from_db(&error),
            PurchaseError::OutcomeUnknown => {
                tracing::warn!(
                    product_id = product,
                    user_id = user,
                    "a purchase's outcome is unknown: its commit's answer was lost"
                );
                ApiError::OutcomeUnknown {
                    order_path: format!("/api/products/{product}/orders/{user}"),
                }
            }
            PurchaseError::Internal(why) => ApiError::Internal(anyhow::anyhow!(why)),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidInput(_) | ApiError::MalformedBody(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized | ApiError::BuyerRefused(_) => StatusCode::UNAUTHORIZED,
            ApiError::AdminDisabled | ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::SoldOut
            | ApiError::NotOpen
            | ApiError::AlreadyPurchased { .. }
            | ApiError::StockChanged { .. }
            | ApiError::StockTooLarge => StatusCode::CONFLICT,
            ApiError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Busy
            | ApiError::LockLost
            | ApiError::RedisUnavailable
            | ApiError::DatabaseUnavailable
            | ApiError::OutcomeUnknown { .. }
            | ApiError::AdminOutcomeUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(cause) = self {
            tracing::error!(error = ?cause, "internal error");
        }
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Busy | ApiError::LockLost => {
                response.insert_header((header::RETRY_AFTER, HeaderValue::from_static("1")));
            }
            ApiError::RedisUnavailable | ApiError::DatabaseUnavailable => {
                response.insert_header((header::RETRY_AFTER, HeaderValue::from_static("2")));
            }
            ApiError::Unauthorized | ApiError::BuyerRefused(Refused::Missing) => {
                response
                    .insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
            }
            // RFC 6750: a token was sent, and is not accepted.
            ApiError::BuyerRefused(Refused::Invalid(_)) => {
                response.insert_header((
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                ));
            }
            ApiError::TooManyRequests { retry_after_s } => {
                response.insert_header((header::RETRY_AFTER, retry_after_s.to_string()));
            }
            // The rest of the body may still be trickling in: the connection is not reused.
            ApiError::RequestTimeout => {
                response.force_close();
            }
            _ => {}
        }
        match self {
            // The answers a flood gets, serialized once (the sold-out path is served from
            // memory, and the body is most of what is left of its cost).
            ApiError::SoldOut => response
                .insert_header(JSON_CONTENT_TYPE)
                .body(SOLD_OUT_BODY.clone()),
            ApiError::AlreadyPurchased { order_id: None } => response
                .insert_header(JSON_CONTENT_TYPE)
                .body(ALREADY_PURCHASED_BODY.clone()),
            _ => response.json(self.body()),
        }
    }
}

impl ApiError {
    fn body(&self) -> ErrorBody {
        let (order_id, order_path) = match self {
            ApiError::AlreadyPurchased { order_id } => (*order_id, None),
            ApiError::OutcomeUnknown { order_path } => (None, Some(order_path.clone())),
            _ => (None, None),
        };
        ErrorBody {
            error: self.code().to_owned(),
            message: self.to_string(),
            order_id,
            order_path,
        }
    }
}

/// How much of a parser's message a 400 carries: enough to say what was wrong and where.
const ECHO_CHARS: usize = 120;

/// `Content-Type: application/json`, as a ready header (`content_type` parses its argument).
const JSON_CONTENT_TYPE: (header::HeaderName, HeaderValue) = (
    header::CONTENT_TYPE,
    HeaderValue::from_static("application/json"),
);
static SOLD_OUT_BODY: LazyLock<Bytes> = LazyLock::new(|| serialized(&ApiError::SoldOut));
static ALREADY_PURCHASED_BODY: LazyLock<Bytes> =
    LazyLock::new(|| serialized(&ApiError::AlreadyPurchased { order_id: None }));

/// Serialized once for the life of the process: a static `Bytes` is cloned without touching
/// a reference count that every worker thread would share.
fn serialized(error: &ApiError) -> Bytes {
    let body = serde_json::to_vec(&error.body()).expect("an error body serializes");
    Bytes::from_static(body.leak())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_closed_during_its_tls_request_is_an_outage_and_other_protocol_errors_bugs() {
        let closed = sqlx::Error::Protocol(CLOSED_DURING_TLS_REQUEST.into());
        let unknown = sqlx::Error::Protocol("unsupported authentication method: 10".into());

        assert!(matches!(
            ApiError::from_db(&closed),
            ApiError::DatabaseUnavailable
        ));
        assert!(matches!(ApiError::from_db(&unknown), ApiError::Internal(_)));
        // At a commit, either may have committed.
        assert!(repository::may_have_committed(&closed));
    }
}
