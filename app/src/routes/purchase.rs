use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;
use utoipa::ToSchema;

use super::MAX_BODY_BYTES;
use super::products::ProductPath;
use crate::domain::{ProductId, Quantity, UserId};
use crate::error::{ApiError, ErrorBody};
use crate::sale::{PurchaseRequest, Sale};

/// A purchase. The buyer is not authenticated in this demo: `user_id` is trusted.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    #[schema(minimum = 1, example = 42)]
    user_id: i64,
    /// 1 to MAX_QUANTITY (5 by default).
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1)]
    quantity: i64,
}

fn one() -> i64 {
    1
}

/// An order.
#[derive(Serialize, ToSchema)]
pub struct OrderBody {
    pub order_id: i64,
    pub product_id: i64,
    pub user_id: i64,
    pub quantity: i32,
}

/// `POST /api/products/{id}/purchase`.
#[utoipa::path(
    post,
    path = "/api/products/{id}/purchase",
    tag = "sale",
    params(ProductPath),
    request_body = PurchaseBody,
    responses(
        (status = 201, description = "bought: the buyer's own order", body = OrderBody),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 409, description = "sold_out (a product known to be sold out is answered before the body is checked), or already_purchased (one order per buyer)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 503, description = "busy or lock_lost (retry; see Retry-After), redis_unavailable, database_unavailable", body = ErrorBody),
    )
)]
pub async fn purchase(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> actix_web::Result<HttpResponse> {
    // Borrowed from the app, not extracted as `web::Data`: that would clone an `Arc` that
    // every worker thread shares, on every purchase of the flood.
    let sale: &Sale = req
        .app_data::<web::Data<Sale>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the app has no sale registered")))?;
    let product_id = ProductId::parse(&path);
    // The flood after a sale: answered from memory, whoever is buying, without parsing the
    // body.
    let started = Instant::now();
    if let Ok(id) = product_id
        && sale.known_sold_out(id)
    {
        let decided = started.elapsed();
        discard_body(&req, payload).await;
        sale.answered_sold_out(decided);
        return Err(ApiError::SoldOut.into());
    }
    // The app's `JsonConfig` applies (size limit, content type, error format).
    let body = web::Json::<PurchaseBody>::from_request(&req, &mut payload.into_inner()).await?;
    let request = PurchaseRequest {
        product_id: product_id.map_err(ApiError::InvalidInput)?,
        user_id: UserId::parse(body.user_id).map_err(ApiError::InvalidInput)?,
        quantity: Quantity::parse(body.quantity, sale.max_quantity)
            .map_err(ApiError::InvalidInput)?,
    };
    let bought = sale.purchase(request).await.map_err(ApiError::from)?;
    Ok(HttpResponse::Created().json(OrderBody {
        order_id: bought.order_id,
        product_id: request.product_id.get(),
        user_id: request.user_id.get(),
        quantity: request.quantity.get(),
    }))
}

/// How long a sold-out answer waits for the rest of a body it will not parse.
const DISCARD_WITHIN: Duration = Duration::from_secs(2);

/// Read a body we will not parse to its end, so that the connection can carry the buyer's
/// next request: actix closes a connection whose request body was left unread (one with a
/// `Content-Length`; it reads the rest of a chunked one itself). Nothing is kept. Not read:
/// a body announced larger than any route takes, the part of one past that size, and
/// whatever has not arrived within [`DISCARD_WITHIN`] (the answer is not held back for a
/// client that stopped sending).
async fn discard_body(req: &HttpRequest, mut payload: web::Payload) {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    if announced.is_some_and(|length| length > MAX_BODY_BYTES) {
        return;
    }
    let read_all = async {
        let mut read = 0;
        while let Some(Ok(chunk)) = payload.next().await {
            read += chunk.len();
            if read > MAX_BODY_BYTES {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_WITHIN, read_all).await;
}
