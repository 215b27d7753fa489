use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::admin::{AdminToken, require_admin};
use crate::domain::{ProductId, ProductName, Stock};
use crate::error::ApiError;
use crate::repository;
use crate::sale::{Sale, sold_out};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewProduct {
    name: String,
    stock: i64,
}

/// `POST /api/products` (admin): 201 `{"id", "name", "stock"}`.
pub async fn create(
    req: HttpRequest,
    admin: web::Data<AdminToken>,
    sale: web::Data<Sale>,
    body: web::Json<NewProduct>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &admin)?;
    let NewProduct { name, stock } = body.into_inner();
    let name = ProductName::parse(name).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(stock).map_err(ApiError::InvalidInput)?;
    let product = repository::insert_product(&sale.pool, &name, stock)
        .await
        .map_err(ApiError::from_db)?;
    tracing::info!(
        product_id = product.id,
        stock = product.stock,
        "product created"
    );
    Ok(HttpResponse::Created().json(json!({
        "id": product.id, "name": product.name, "stock": product.stock,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    stock: i64,
}

/// `PUT /api/products/{id}/stock` (admin): set the stock; 200 `{"id", "name", "stock"}`.
pub async fn restock(
    req: HttpRequest,
    admin: web::Data<AdminToken>,
    sale: web::Data<Sale>,
    path: web::Path<String>,
    body: web::Json<Restock>,
) -> Result<HttpResponse, ApiError> {
    require_admin(&req, &admin)?;
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let stock = Stock::parse(body.stock).map_err(ApiError::InvalidInput)?;
    let (product, restock_gen) = repository::restock(&sale.pool, id, stock)
        .await
        .map_err(ApiError::from_db)?
        .ok_or_else(|| ApiError::NotFound("no such product".into()))?;
    if let Err(error) = sold_out::mark_open(&sale, id, restock_gen).await {
        tracing::warn!(%error, product_id = %id, "restocked, but could not clear the sold-out mark; it expires by itself");
    }
    tracing::info!(product_id = %id, stock = product.stock, "restocked");
    Ok(HttpResponse::Ok().json(json!({
        "id": product.id, "name": product.name, "stock": product.stock,
    })))
}

/// `GET /api/products/{id}`: 200 `{"id", "name", "stock", "sold"}`.
pub async fn show(
    sale: web::Data<Sale>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = ProductId::parse(&path).map_err(ApiError::InvalidInput)?;
    let product = repository::product_sales(&sale.pool, id)
        .await
        .map_err(ApiError::from_db)?
        .ok_or_else(|| ApiError::NotFound("no such product".into()))?;
    Ok(HttpResponse::Ok().json(json!({
        "id": product.id, "name": product.name, "stock": product.stock, "sold": product.sold,
    })))
}
