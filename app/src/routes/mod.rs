//! HTTP routes, one file per group. Handlers parse input into `domain` types, call the
//! repository or the sale, and map errors to `ApiError`; they hold no SQL.

pub(crate) mod admin;
pub(crate) mod health;
mod metrics;
mod orders;
mod products;
pub(crate) mod purchase;

use actix_web::middleware::from_fn;
use actix_web::{HttpResponse, web};

use crate::error::ApiError;

/// The largest JSON body any route accepts.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(MAX_BODY_BYTES)
            .error_handler(ApiError::from_json),
    )
    // The purchase first: routes with path parameters are matched in order, each by a
    // regex, and this one carries the flood.
    .route(
        "/api/products/{id}/purchase",
        web::post().to(purchase::purchase),
    )
    .route("/healthz", web::get().to(health::healthz))
    .route("/readyz", web::get().to(health::readyz))
    .route("/metrics", web::get().to(metrics::metrics))
    .service(
        web::resource("/api/products").route(
            web::post()
                .to(products::create)
                .wrap(from_fn(admin::require_admin)),
        ),
    )
    .route("/api/products/{id}", web::get().to(products::show))
    .service(
        web::resource("/api/products/{id}/restock").route(
            web::post()
                .to(products::restock)
                .wrap(from_fn(admin::require_admin)),
        ),
    )
    .service(
        web::resource("/api/products/{id}/stock").route(
            web::put()
                .to(products::set_stock)
                .wrap(from_fn(admin::require_admin)),
        ),
    )
    .route(
        "/api/products/{id}/orders/{user_id}",
        web::get().to(orders::show),
    );
}

/// Unknown routes (and known paths with the wrong method) answer in the API's error format.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}
