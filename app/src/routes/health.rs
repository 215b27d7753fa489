use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::repository;
use crate::sale::Sale;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// PostgreSQL and Redis both answer within a second.
pub async fn readyz(sale: web::Data<Sale>) -> HttpResponse {
    let limit = Duration::from_secs(1);
    let postgres = matches!(
        tokio::time::timeout(limit, repository::ping(&sale.pool)).await,
        Ok(Ok(()))
    );
    let ping = async {
        redis::cmd("PING")
            .query_async::<String>(&mut sale.redis.clone())
            .await
    };
    let redis = matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_)));
    let body = json!({"postgres": postgres, "redis": redis});
    if postgres && redis {
        HttpResponse::Ok().json(body)
    } else {
        let down = if postgres { "redis" } else { "postgres" };
        HttpResponse::ServiceUnavailable().json(json!({
            "error": "not_ready",
            "message": format!("{down} is unreachable"),
            "postgres": postgres,
            "redis": redis,
        }))
    }
}
