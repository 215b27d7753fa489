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

/// The largest quantity one purchase may ask for (`MAX_QUANTITY`).
#[derive(Clone, Copy)]
pub struct MaxQuantity(pub u32);

/// `POST /api/products/{id}/purchase`: 201 `{"order_id", "product_id", "user_id", "quantity"}`.
pub async fn purchase(
    sale: web::Data<Sale>,
    max: web::Data<MaxQuantity>,
    path: web::Path<String>,
    body: web::Json<PurchaseBody>,
) -> Result<HttpResponse, ApiError> {
    let request = PurchaseRequest {
        product_id: ProductId::parse(&path).map_err(ApiError::InvalidInput)?,
        user_id: UserId::parse(body.user_id).map_err(ApiError::InvalidInput)?,
        quantity: Quantity::parse(body.quantity, max.0).map_err(ApiError::InvalidInput)?,
    };
    let bought = sale.purchase(request).await?;
    Ok(HttpResponse::Created().json(json!({
        "order_id": bought.order_id,
        "product_id": request.product_id.get(),
        "user_id": request.user_id.get(),
        "quantity": request.quantity.get(),
    })))
}
