//! HTTP routes, one file per group. Handlers parse input into `domain` types, call the
//! repository or the sale, and map errors to `ApiError`; they hold no SQL.

pub(crate) mod access_log;
pub(crate) mod admin;
pub mod api_doc;
pub(crate) mod body;
pub(crate) mod buyer;
pub(crate) mod health;
mod metrics;
mod orders;
mod products;
pub(crate) mod purchase;
pub(crate) mod sold_out;

use actix_web::middleware::from_fn;
use actix_web::{HttpResponse, web};

use crate::error::ApiError;

/// The largest JSON body any route accepts.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The purchase route (`POST`), which the sold-out lane matches by hand.
pub(crate) const PURCHASE_ROUTE: &str = "/api/products/{id}/purchase";

/// Which listener an app serves: what buyers may reach, or everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `BIND_ADDR`: the sale (a product, a purchase, an order) and `/healthz`.
    Public,
    /// `OPS_BIND_ADDR`: the public routes, and the operators' own: the admin writes,
    /// `/metrics` (live sales figures), `/readyz` (which backends, in what state) and the
    /// OpenAPI document.
    Operations,
}

/// The routes of `side`.
pub fn configure(side: Side) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        public(cfg);
        if side == Side::Operations {
            operations(cfg);
        }
    }
}

/// What buyers reach.
fn public(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(MAX_BODY_BYTES)
            .error_handler(ApiError::from_json),
    )
    // The purchase first: routes with path parameters are matched in order, each by a
    // regex, and this one carries the flood of an open sale (the flood after it is answered
    // before the router: `sold_out`).
    .service(resource(PURCHASE_ROUTE).route(web::post().to(purchase::purchase)))
    .service(resource("/healthz").route(web::get().to(health::healthz)))
    .service(resource("/api/products/{id}").route(web::get().to(products::show)))
    .service(resource("/api/products/{id}/orders/{user_id}").route(web::get().to(orders::show)));
}

/// What only operators reach.
fn operations(cfg: &mut web::ServiceConfig) {
    let admin = || from_fn(admin::require_admin);
    cfg.service(resource("/readyz").route(web::get().to(health::readyz)))
        .service(resource("/metrics").route(web::get().to(metrics::metrics)))
        .service(resource("/api-docs/openapi.json").route(web::get().to(api_doc::openapi_json)))
        .service(resource("/api/products").route(web::post().to(products::create).wrap(admin())))
        .service(
            resource("/api/products/{id}/restock")
                .route(web::post().to(products::restock).wrap(admin())),
        )
        .service(
            resource("/api/products/{id}/stock")
                .route(web::put().to(products::set_stock).wrap(admin())),
        )
        .service(
            resource("/api/products/{id}/opening")
                .route(web::put().to(products::set_opening).wrap(admin())),
        );
}

/// A route's resource: a known path asked with a method it does not take answers 405 in the
/// API's error format (a resource does not fall back to the app's default service).
fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

async fn method_not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

/// Unknown routes answer in the API's error format.
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound("no such route".into()))
}
