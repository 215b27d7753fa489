use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::domain::{ProductId, UserId};
use crate::error::ApiError;
use crate::repository;
use crate::sale::Sale;

/// `GET /api/products/{id}/orders/{user_id}`: 200 the buyer's order, or 404. For a buyer
/// whose answer was lost (a timeout, a dropped connection) to learn whether they bought.
pub async fn show(
    sale: web::Data<Sale>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (product, user) = path.into_inner();
    let product = ProductId::parse(&product).map_err(ApiError::InvalidInput)?;
    let user = user
        .parse::<i64>()
        .map_err(|_| format!("user_id must be a positive integer, got {:.32?}", user))
        .and_then(UserId::parse)
        .map_err(ApiError::InvalidInput)?;
    let order = repository::order_of(&sale.pool, product, user.get())
        .await
        .map_err(|e| ApiError::from_db(&e))?
        .ok_or_else(|| ApiError::NotFound("this user has no order for this product".into()))?;
    Ok(HttpResponse::Ok().json(json!({
        "order_id": order.id,
        "product_id": order.product_id,
        "user_id": order.user_id,
        "quantity": order.quantity,
    })))
}
