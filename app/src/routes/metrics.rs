use actix_web::{HttpResponse, web};

use crate::sale::Sale;

/// Prometheus text format.
pub async fn metrics(sale: web::Data<Sale>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(sale.metrics.render())
}
