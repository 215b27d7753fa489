use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::admin::actor;
use crate::domain::{ProductId, ProductName, Stock};
use crate::error::ApiError;
use crate::repository::{self, Product, Restocked};
use crate::sale::Sale;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewProduct {
    name: String,
    stock: i64,
}

fn product_json(product: &Product) -> serde_json::Value {
    json!({"id": product.id, "name": product.name, "stock": product.stock})
}

/// `POST /api/products` (admin): 201 `{"id", "name", "stock"}`.
pub async fn create(
    req: HttpRequest,
    sale: web::Data<Sale>,
    body: web::Json<NewProduct>,
) -> Result<HttpResponse, ApiError> {
    let NewProduct { name, stock } = body.into_inner();
    let name = ProductName::parse(name).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(stock).map_err(ApiError::InvalidInput)?;
    let product = repository::insert_product(&sale.pool, sale.bounds, &name, stock, &actor(&req))
        .await
        .map_err(|e| ApiError::from_db(&e))?;
    tracing::info!(
        product_id = product.id,
        stock = product.stock,
        "product created"
    );
    Ok(HttpResponse::Created().json(product_json(&product)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddStock {
    add: i64,
}

/// `POST /api/products/{id}/restock` (admin) `{"add": N}`: add N units; 200 the product.
pub async fn restock(
    req: HttpRequest,
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: web::Json<AddStock>,
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
    let outcome = repository::add_stock(&sale.pool, sale.bounds, id, add, &actor(&req))
        .await
        .map_err(|e| ApiError::from_db(&e))?;
    changed(&sale, id, outcome, None)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStock {
    stock: i64,
    /// The stock the admin believes is there now; nothing changes unless it is.
    expected_stock: i64,
}

/// `PUT /api/products/{id}/stock` (admin) `{"stock", "expected_stock"}`: set the stock, only
/// if it is still `expected_stock`; 200 the product, or 409 `stock_changed`.
pub async fn set_stock(
    req: HttpRequest,
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: web::Json<SetStock>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(body.stock).map_err(ApiError::InvalidInput)?;
    let outcome = repository::set_stock(
        &sale.pool,
        sale.bounds,
        id,
        stock,
        body.expected_stock,
        &actor(&req),
    )
    .await
    .map_err(|e| ApiError::from_db(&e))?;
    changed(&sale, id, outcome, Some(body.expected_stock))
}

/// Answer a stock change, and tell every instance about a committed one.
fn changed(
    sale: &Sale,
    id: ProductId,
    outcome: Restocked,
    expected: Option<i64>,
) -> Result<HttpResponse, ApiError> {
    match outcome {
        Restocked::Done {
            product,
            restock_gen,
        } => {
            sale.restocked(id, restock_gen);
            tracing::info!(product_id = %id, stock = product.stock, "stock changed");
            Ok(HttpResponse::Ok().json(product_json(&product)))
        }
        Restocked::NotFound => Err(ApiError::NotFound("no such product".into())),
        Restocked::Refused { current } => Err(match expected {
            Some(expected) => ApiError::StockChanged { current, expected },
            None => ApiError::StockTooLarge,
        }),
    }
}

/// `GET /api/products/{id}`: 200 `{"id", "name", "stock", "sold", "supplied"}`.
pub async fn show(
    sale: web::Data<Sale>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let product = repository::product_sales(&sale.pool, id)
        .await
        .map_err(|e| ApiError::from_db(&e))?
        .ok_or_else(|| ApiError::NotFound("no such product".into()))?;
    Ok(HttpResponse::Ok().json(json!({
        "id": product.id, "name": product.name, "stock": product.stock,
        "sold": product.sold, "supplied": product.supplied,
    })))
}
