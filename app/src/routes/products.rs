use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::admin::{actor, idempotency_key};
use super::body::Body;
use crate::domain::{ProductId, ProductName, Stock};
use crate::error::{ApiError, ErrorBody};
use crate::repository::{self, IdempotencyKey, Keyed, Product, Restocked};
use crate::sale::Sale;

/// A product to put on sale.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProduct {
    /// 1 to 200 characters, not blank, no control characters.
    #[schema(min_length = 1, max_length = 200, example = "Phone")]
    name: String,
    /// Units on sale.
    #[schema(minimum = 0, maximum = 1_000_000_000, example = 100)]
    stock: i64,
    /// When the sale opens (RFC 3339); purchases before it are refused `not_open`. Default:
    /// now. The database's clock decides.
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-24T12:00:00Z")]
    #[serde(default)]
    on_sale_at: Option<DateTime<Utc>>,
}

/// A product, as the admin routes answer.
#[derive(Serialize, ToSchema)]
pub struct ProductBody {
    id: i64,
    name: String,
    stock: i64,
}

impl From<Product> for ProductBody {
    fn from(product: Product) -> Self {
        Self {
            id: product.id,
            name: product.name,
            stock: product.stock,
        }
    }
}

/// A product and its books: `supplied = stock + sold`.
#[derive(Serialize, ToSchema)]
pub struct ProductBooks {
    id: i64,
    name: String,
    stock: i64,
    /// Units in orders.
    sold: i64,
    /// Units the stock ledger says were supplied: the initial stock and every change.
    supplied: i64,
    /// When the sale opens (or opened), RFC 3339.
    #[schema(value_type = String, format = DateTime)]
    on_sale_at: DateTime<Utc>,
}

/// A product's opening.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Opening {
    /// When the sale opens, RFC 3339. A moment in the past opens it now.
    #[schema(value_type = String, format = DateTime, example = "2026-12-24T12:00:00Z")]
    on_sale_at: DateTime<Utc>,
}

/// The product in the path, for the OpenAPI document (handlers parse the path themselves,
/// to answer a bad id in the API's error format).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code, reason = "read by the OpenAPI derive only")]
pub struct ProductPath {
    /// The product id.
    #[param(minimum = 1)]
    pub id: i64,
}

/// `POST /api/products` (admin).
#[utoipa::path(
    post,
    path = "/api/products",
    tag = "admin",
    params(("Idempotency-Key" = Option<String>, Header, description = "Optional, 1 to 255 visible ASCII characters (a UUID): a retry with the same key and the same request gets the first answer and changes nothing again")),
    request_body = NewProduct,
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "created", body = ProductBody),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 403, description = "admin routes are disabled (no ADMIN_TOKEN)", body = ErrorBody),
        (status = 408, description = "request_timeout: the body did not arrive within HTTP_REQUEST_TIMEOUT_MS (the connection is closed)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused: the Idempotency-Key came before with another request; nothing changed", body = ErrorBody),
        (status = 503, description = "busy, database unavailable, or outcome_unknown (the connection was cut: send it again with the same Idempotency-Key)", body = ErrorBody),
    )
)]
pub async fn create(
    req: HttpRequest,
    sale: web::Data<Sale>,
    body: Body<NewProduct>,
) -> Result<HttpResponse, ApiError> {
    let key = idempotency_key(&req)?;
    let NewProduct {
        name,
        stock,
        on_sale_at,
    } = body.0;
    let name = ProductName::parse(name).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(stock).map_err(ApiError::InvalidInput)?;
    if let Some(at) = on_sale_at {
        check_opening(at)?;
    }
    let request = format!(
        "POST /api/products name={:?} stock={} on_sale_at={on_sale_at:?}",
        name.as_str(),
        stock.get()
    );
    let key = IdempotencyKey::of_request(key, request);
    let created = repository::insert_product(
        &sale.admin_pool,
        sale.bounds,
        &name,
        stock,
        on_sale_at,
        &actor(&req),
        key.as_ref(),
    )
    .await
    .map_err(|e| admin_write_failed(&e))?;
    match created {
        Keyed::Fresh(product) => {
            if let Ok(id) = ProductId::parse(&product.id.to_string()) {
                sale.created(id);
            }
            tracing::info!(
                product_id = product.id,
                stock = product.stock,
                "product created"
            );
            Ok(HttpResponse::Created().json(ProductBody::from(product)))
        }
        Keyed::Replayed { status, product } => {
            // The first request's client may have gone before its handler told this
            // instance: tell it now (again, which changes nothing).
            if let Ok(id) = ProductId::parse(&product.id.to_string()) {
                sale.created(id);
            }
            Ok(HttpResponse::build(
                actix_web::http::StatusCode::from_u16(status)
                    .unwrap_or(actix_web::http::StatusCode::CREATED),
            )
            .json(ProductBody::from(product)))
        }
        Keyed::Reused => Err(ApiError::IdempotencyKeyReused),
    }
}

/// Units to add.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddStock {
    #[schema(minimum = 1, maximum = 1_000_000_000, example = 50)]
    add: i64,
}

/// `POST /api/products/{id}/restock` (admin) `{"add": N}`: add N units.
#[utoipa::path(
    post,
    path = "/api/products/{id}/restock",
    tag = "admin",
    params(ProductPath, ("Idempotency-Key" = Option<String>, Header, description = "Optional, 1 to 255 visible ASCII characters (a UUID): a retry with the same key and the same request gets the first answer and changes nothing again")),
    request_body = AddStock,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "restocked", body = ProductBody),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 403, description = "admin routes are disabled", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 409, description = "stock_too_large: the stock would pass a billion", body = ErrorBody),
        (status = 408, description = "request_timeout: the body did not arrive within HTTP_REQUEST_TIMEOUT_MS (the connection is closed)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused: the Idempotency-Key came before with another request; nothing changed", body = ErrorBody),
        (status = 503, description = "busy, database unavailable, or outcome_unknown (the connection was cut: send it again with the same Idempotency-Key)", body = ErrorBody),
    )
)]
pub async fn restock(
    req: HttpRequest,
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: Body<AddStock>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let add = Stock::parse(body.add)
        .ok()
        .filter(|add| add.get() > 0)
        .ok_or_else(|| {
            ApiError::InvalidInput(format!(
                "add must be between 1 and {}, got {}",
                Stock::MAX,
                body.add
            ))
        })?;
    let request = format!("POST /api/products/{id}/restock add={}", add.get());
    let (key, actor) = (idempotency_key(&req)?, actor(&req));
    let key = IdempotencyKey::of_request(key, request);
    let outcome = carried_through(&sale, id, {
        let sale = web::Data::clone(&sale);
        async move {
            repository::add_stock(&sale.admin_pool, sale.bounds, id, add, &actor, key.as_ref())
                .await
        }
    })
    .await?;
    answer(id, outcome, None)
}

/// An absolute stock, with its precondition.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetStock {
    /// The new stock.
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    stock: i64,
    /// The stock the admin believes is there now; nothing changes unless it is.
    expected_stock: i64,
}

/// `PUT /api/products/{id}/stock` (admin): set the stock, only if it is still
/// `expected_stock`.
#[utoipa::path(
    put,
    path = "/api/products/{id}/stock",
    tag = "admin",
    params(ProductPath, ("Idempotency-Key" = Option<String>, Header, description = "Optional, 1 to 255 visible ASCII characters (a UUID): a retry with the same key and the same request gets the first answer and changes nothing again")),
    request_body = SetStock,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "set", body = ProductBody),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 403, description = "admin routes are disabled", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 409, description = "stock_changed: the stock is not expected_stock", body = ErrorBody),
        (status = 408, description = "request_timeout: the body did not arrive within HTTP_REQUEST_TIMEOUT_MS (the connection is closed)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused: the Idempotency-Key came before with another request; nothing changed", body = ErrorBody),
        (status = 503, description = "busy, database unavailable, or outcome_unknown (the connection was cut: send it again with the same Idempotency-Key)", body = ErrorBody),
    )
)]
pub async fn set_stock(
    req: HttpRequest,
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: Body<SetStock>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(body.stock).map_err(ApiError::InvalidInput)?;
    let expected = body.expected_stock;
    let request = format!(
        "PUT /api/products/{id}/stock stock={} expected_stock={expected}",
        stock.get()
    );
    let (key, actor) = (idempotency_key(&req)?, actor(&req));
    let key = IdempotencyKey::of_request(key, request);
    let outcome = carried_through(&sale, id, {
        let sale = web::Data::clone(&sale);
        async move {
            repository::set_stock(
                &sale.admin_pool,
                sale.bounds,
                id,
                stock,
                expected,
                &actor,
                key.as_ref(),
            )
            .await
        }
    })
    .await?;
    answer(id, outcome, Some(expected))
}

/// Run a stock change of `id` to the end, and tell every instance about it once committed,
/// in a task of its own: a client that goes away (the handler is dropped) cannot stop it
/// between its commit and the news, which would leave every instance answering `sold_out`
/// from memory until `SOLD_OUT_RECHECK_MS`.
async fn carried_through(
    sale: &web::Data<Sale>,
    id: ProductId,
    change: impl Future<Output = sqlx::Result<Restocked>> + Send + 'static,
) -> Result<Restocked, ApiError> {
    let sale = web::Data::clone(sale);
    let task = tokio::spawn(async move {
        let outcome = change.await;
        match &outcome {
            Ok(Restocked::Done { restock_gen, .. }) => sale.restocked(id, *restock_gen),
            // A retry is told again: the news of the first request may have been lost with
            // its answer (a cut connection), and hearing it twice changes nothing.
            Ok(Restocked::Replayed {
                restock_gen: Some(restock_gen),
                ..
            }) => sale.restocked(id, *restock_gen),
            _ => {}
        }
        outcome
    });
    task.await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("the stock change failed: {e}")))?
        .map_err(|e| admin_write_failed(&e))
}

/// The answer to an admin write that failed: its outcome is unknown when its connection
/// was cut (it may have committed), as [`ApiError::from_db`] says otherwise.
fn admin_write_failed(error: &sqlx::Error) -> ApiError {
    if repository::may_have_committed(error) {
        tracing::warn!(%error, "an admin write's outcome is unknown");
        ApiError::AdminOutcomeUnknown
    } else {
        ApiError::from_db(error)
    }
}

/// Answer a stock change.
fn answer(
    id: ProductId,
    outcome: Restocked,
    expected: Option<i64>,
) -> Result<HttpResponse, ApiError> {
    match outcome {
        Restocked::Done { product, .. } => {
            tracing::info!(product_id = %id, stock = product.stock, "stock changed");
            Ok(HttpResponse::Ok().json(ProductBody::from(product)))
        }
        Restocked::Replayed { product, .. } => {
            Ok(HttpResponse::Ok().json(ProductBody::from(product)))
        }
        Restocked::KeyReused => Err(ApiError::IdempotencyKeyReused),
        Restocked::NotFound => Err(ApiError::NotFound("no such product".into())),
        Restocked::Refused { current } => Err(match expected {
            Some(expected) => ApiError::StockChanged { current, expected },
            None => ApiError::StockTooLarge,
        }),
    }
}

/// `GET /api/products/{id}`: the product and its books.
#[utoipa::path(
    get,
    path = "/api/products/{id}",
    tag = "sale",
    params(ProductPath),
    responses(
        (status = 200, description = "the product", body = ProductBooks),
        (status = 400, description = "a bad id", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 503, description = "busy or database unavailable", body = ErrorBody),
    )
)]
pub async fn show(
    sale: web::Data<Sale>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let product = sale
        .reads
        .books(id)
        .await
        .map_err(|e| ApiError::from_db(&e))?
        .ok_or_else(|| ApiError::NotFound("no such product".into()))?;
    Ok(HttpResponse::Ok().json(ProductBooks {
        id: product.id,
        name: product.name,
        stock: product.stock,
        sold: product.sold,
        supplied: product.supplied,
        on_sale_at: product.on_sale_at,
    }))
}

/// An opening from 1970 to the end of 9999 (PostgreSQL keeps far wider, chrono wider still:
/// a year like -5000 or 200000 is a typo, not a sale).
fn check_opening(at: DateTime<Utc>) -> Result<(), ApiError> {
    use chrono::Datelike;
    if (1970..=9999).contains(&at.year()) {
        Ok(())
    } else {
        Err(ApiError::InvalidInput(format!(
            "on_sale_at must be between 1970 and 9999, got year {}",
            at.year()
        )))
    }
}

/// `PUT /api/products/{id}/opening` (admin): move the product's opening. This instance
/// takes it at once, the others when the restock channel's message arrives (without it:
/// within a second while they think it closed, at the database's first refusal while they
/// think it open).
#[utoipa::path(
    put,
    path = "/api/products/{id}/opening",
    tag = "admin",
    params(ProductPath),
    request_body = Opening,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "moved", body = Opening),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 401, description = "missing or wrong admin token", body = ErrorBody),
        (status = 403, description = "admin routes are disabled", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 408, description = "request_timeout: the body did not arrive within HTTP_REQUEST_TIMEOUT_MS (the connection is closed)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 503, description = "busy, database unavailable, or outcome_unknown (the connection was cut: send it again, which changes nothing more)", body = ErrorBody),
    )
)]
pub async fn set_opening(
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: Body<Opening>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    check_opening(body.on_sale_at)?;
    let on_sale_at = repository::set_on_sale_at(&sale.admin_pool, id, body.on_sale_at)
        .await
        .map_err(|e| admin_write_failed(&e))?
        .ok_or_else(|| ApiError::NotFound("no such product".into()))?;
    sale.opening_changed(id);
    tracing::info!(product_id = %id, %on_sale_at, "opening moved");
    Ok(HttpResponse::Ok().json(Opening { on_sale_at }))
}
