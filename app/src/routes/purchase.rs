use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::domain::{ProductId, Quantity, UserId};
use crate::error::ApiError;
use crate::sale::{PurchaseRequest, Sale};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurchaseBody {
    user_id: i64,
    #[serde(default = "one")]
    quantity: i64,
}

fn one() -> i64 {
    1
}

/// `POST /api/products/{id}/purchase`: 201 `{"order_id", "product_id", "user_id", "quantity"}`.
pub async fn purchase(
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: web::Json<PurchaseBody>,
) -> Result<HttpResponse, ApiError> {
    let request = PurchaseRequest {
        product_id: ProductId::parse(&path).map_err(ApiError::InvalidInput)?,
        user_id: UserId::parse(body.user_id).map_err(ApiError::InvalidInput)?,
        quantity: Quantity::parse(body.quantity, sale.max_quantity)
            .map_err(ApiError::InvalidInput)?,
    };
    let bought = sale.purchase(request).await?;
    Ok(HttpResponse::Created().json(json!({
        "order_id": bought.order_id,
        "product_id": request.product_id.get(),
        "user_id": request.user_id.get(),
        "quantity": request.quantity.get(),
    })))
}
