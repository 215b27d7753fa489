use actix_web::{HttpRequest, HttpResponse, web};
use utoipa::IntoParams;

use super::buyer::{NO_ORDER, may_read_orders_of};
use super::purchase::OrderBody;
use crate::domain::{ProductId, UserId};
use crate::error::{ApiError, ErrorBody};
use crate::sale::Sale;

/// The product and the buyer in the path, for the OpenAPI document (the handler parses the
/// path itself, to answer a bad id in the API's error format).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code, reason = "read by the OpenAPI derive only")]
pub struct OrderPath {
    /// The product id.
    #[param(minimum = 1)]
    pub id: i64,
    /// The buyer.
    #[param(minimum = 1)]
    pub user_id: i64,
}

/// `GET /api/products/{id}/orders/{user_id}`: the buyer's order, or 404. For a buyer whose
/// answer was lost (a timeout, a dropped connection) to learn whether they bought. With the
/// token of that buyer, or the admin token; another buyer's token gets 404, as if there were
/// no order.
#[utoipa::path(
    get,
    path = "/api/products/{id}/orders/{user_id}",
    tag = "sale",
    params(OrderPath),
    security(("buyer_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "the buyer's order", body = OrderBody),
        (status = 400, description = "a bad id", body = ErrorBody),
        (status = 401, description = "unauthorized: no buyer token, or one this service does not accept", body = ErrorBody),
        (status = 404, description = "no order for this buyer and product (also for another buyer's token)", body = ErrorBody),
        (status = 503, description = "busy or database unavailable", body = ErrorBody),
    )
)]
pub async fn show(
    req: HttpRequest,
    sale: web::Data<Sale>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (product, user) = path.into_inner();
    let product = ProductId::parse(&product).map_err(ApiError::InvalidInput)?;
    let user = user
        .parse::<i64>()
        .map_err(|_| format!("user_id must be a positive integer, got {user:.32?}"))
        .and_then(UserId::parse)
        .map_err(ApiError::InvalidInput)?;
    may_read_orders_of(&req, user)?;
    let order = sale
        .reads
        .order_of(product, user.get())
        .await
        .map_err(|e| ApiError::from_db(&e))?
        .ok_or_else(|| ApiError::NotFound(NO_ORDER.into()))?;
    Ok(HttpResponse::Ok().json(OrderBody {
        order_id: order.id,
        product_id: order.product_id,
        user_id: order.user_id,
        quantity: order.quantity,
    }))
}
