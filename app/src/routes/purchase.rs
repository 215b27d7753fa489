use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::Body;
use super::buyer::{Checked, gate, too_many};
use super::products::ProductPath;
use crate::domain::{ProductId, Quantity, UserId};
use crate::error::{ApiError, ErrorBody};
use crate::sale::{PurchaseError, PurchaseRequest, Sale};

/// A purchase. The buyer is the subject of the bearer token; `user_id`, when sent, must be
/// that buyer (`403` otherwise). Under `BUYER_IDENTITY=off` (benchmarks only) `user_id` is
/// required and believed.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    #[schema(minimum = 1, example = 42)]
    user_id: Option<i64>,
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
    security(("buyer_token" = [])),
    responses(
        (status = 201, description = "bought: the buyer's own order", body = OrderBody),
        (status = 400, description = "invalid input or malformed body", body = ErrorBody),
        (status = 401, description = "unauthorized: no buyer token, or one this service does not accept (see WWW-Authenticate)", body = ErrorBody),
        (status = 403, description = "forbidden: the body's user_id is another buyer than the token's", body = ErrorBody),
        (status = 404, description = "no such product", body = ErrorBody),
        (status = 409, description = "sold_out (a product this instance knows is sold out is answered before the token and the body are checked, when its id is in plain digits), not_open (before the product's on_sale_at), or already_purchased (one order per buyer; with the buyer's `order_id`)", body = ErrorBody),
        (status = 408, description = "request_timeout: the body did not arrive within HTTP_REQUEST_TIMEOUT_MS (the connection is closed)", body = ErrorBody),
        (status = 413, description = "body over 16 KiB", body = ErrorBody),
        (status = 415, description = "not application/json", body = ErrorBody),
        (status = 429, description = "too_many_requests: over the buyer's or the address's limit (see Retry-After)", body = ErrorBody),
        (status = 503, description = "busy or lock_lost (retry; see Retry-After), redis_unavailable, database_unavailable (nothing was recorded), or outcome_unknown (the commit's answer was lost: look the order up at `order_path` before trying again)", body = ErrorBody),
    )
)]
pub async fn purchase(
    req: HttpRequest,
    // First: the address's limit and the buyer's token, before the body is read.
    checked: Checked,
    path: web::Path<String>,
    // The app's `JsonConfig` applies (size limit, content type, error format), and a deadline.
    body: Body<PurchaseBody>,
) -> actix_web::Result<HttpResponse> {
    // Borrowed from the app, not extracted as `web::Data`: that would clone an `Arc` that
    // every worker thread shares, on every purchase of the flood.
    let sale: &Sale = req
        .app_data::<web::Data<Sale>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the app has no sale registered")))?;
    let user_id = buyer_of(checked, body.user_id)?;
    gate(&req)?.limits.buyer(user_id.get()).map_err(too_many)?;
    let request = PurchaseRequest {
        product_id: ProductId::parse(&path).map_err(ApiError::InvalidInput)?,
        user_id,
        quantity: Quantity::parse(body.quantity, sale.max_quantity)
            .map_err(ApiError::InvalidInput)?,
    };
    let product = request.product_id.get();
    let user = request.user_id.get();
    let bought = match sale.purchase(request).await {
        Ok(bought) => bought,
        Err(error @ PurchaseError::AlreadyPurchased(_)) => {
            // Rare (a retry, a twin request): tell the buyer which order they have. A failed
            // look-up leaves it out; the answer stands.
            let order_id = sale
                .reads
                .order_of(request.product_id, user)
                .await
                .ok()
                .flatten()
                .map(|order| order.id);
            return Err(ApiError::from_purchase(error, product, user, order_id).into());
        }
        Err(error) => return Err(ApiError::from_purchase(error, product, user, None).into()),
    };
    Ok(HttpResponse::Created().json(OrderBody {
        order_id: bought.order_id,
        product_id: request.product_id.get(),
        user_id: request.user_id.get(),
        quantity: request.quantity.get(),
    }))
}

/// The buyer of a purchase: the token's (the body may name them too, but no one else), or
/// with identity off the body's.
fn buyer_of(checked: Checked, named: Option<i64>) -> Result<UserId, ApiError> {
    match (checked.0, named) {
        (Some(buyer), Some(named)) if named != buyer.get() => Err(ApiError::Forbidden(
            "the body's user_id is not the buyer of the token".into(),
        )),
        (Some(buyer), _) => Ok(buyer),
        (None, Some(named)) => UserId::parse(named).map_err(ApiError::InvalidInput),
        (None, None) => Err(ApiError::InvalidInput(
            "user_id is required when buyers are not identified (BUYER_IDENTITY=off)".into(),
        )),
    }
}
