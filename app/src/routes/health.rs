use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::repository;
use crate::sale::Sale;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// PostgreSQL and Redis answer within a second (with `LOCK_STRATEGY=redlock`, also a
/// majority of the Redlock masters).
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
    let redlock = match &sale.redlock {
        Some(redlock) => {
            let nodes = redlock.backend();
            Some((nodes.reachable_nodes(limit).await, nodes.quorum()))
        }
        None => None,
    };
    let redlock_ok = redlock.is_none_or(|(reachable, quorum)| reachable >= quorum);
    let mut body = json!({"postgres": postgres, "redis": redis});
    if let Some((reachable, quorum)) = redlock {
        body["redlock"] = json!({"reachable": reachable, "needed": quorum});
    }
    if postgres && redis && redlock_ok {
        return HttpResponse::Ok().json(body);
    }
    let down = if !postgres {
        "postgres is unreachable"
    } else if !redis {
        "redis is unreachable"
    } else {
        "a majority of the Redlock masters is unreachable"
    };
    body["error"] = json!("not_ready");
    body["message"] = json!(down);
    HttpResponse::ServiceUnavailable().json(body)
}
