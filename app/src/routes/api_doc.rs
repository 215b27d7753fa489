//! The OpenAPI 3 document, generated from the handlers and their types (utoipa), served at
//! `/api-docs/openapi.json`: it cannot drift from the code it describes.

use std::sync::LazyLock;

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{health, metrics, orders, products, purchase};
use crate::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "seckill",
        description = "A flash-sale service: sells limited stock to a flood of buyers without overselling. Every error is `{\"error\": code, \"message\": text}`."
    ),
    paths(
        purchase::purchase,
        products::show,
        orders::show,
        products::create,
        products::restock,
        products::set_stock,
        products::set_opening,
        health::healthz,
        health::readyz,
        metrics::metrics,
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerTokens),
    tags(
        (name = "sale", description = "Buying, and reading what was bought: `Authorization: Bearer <buyer JWT>`"),
        (name = "admin", description = "Products and stock: `Authorization: Bearer <ADMIN_TOKEN>`"),
        (name = "operations", description = "Health, readiness, metrics"),
    )
)]
pub struct ApiDoc;

/// The two bearer tokens: the admin routes' (`ADMIN_TOKEN`), and buyers' (a JWT whose
/// subject is the buyer).
struct BearerTokens;

impl Modify for BearerTokens {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "buyer_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A JWT signed by the deployment's identity provider (BUYER_JWT_*): `exp` required, the buyer's id as `sub`",
                    ))
                    .build(),
            ),
        );
    }
}

static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes")
});

/// `GET /api-docs/openapi.json`.
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(DOCUMENT.as_str())
}
