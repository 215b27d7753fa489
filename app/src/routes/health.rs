use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde_json::{Value, json};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::time::Instant;

use crate::redis_link::RedisLink;
use crate::repository;
use crate::sale::{Exclusion, Sale};

/// What `/readyz` checks with. PostgreSQL is asked over a connection of the check's own,
/// opened and closed for each check, so a pool busy with purchases cannot make a healthy
/// instance look unready (and no idle connection is kept for it).
pub struct Health {
    pub postgres: PgConnectOptions,
    pub redis: RedisLink,
    /// The last answer and when it was made: checks run one at a time and at most once per
    /// [`FRESH`], so a flood of `/readyz` cannot flood PostgreSQL with connections.
    last: tokio::sync::Mutex<Option<(Instant, StatusCode, Value)>>,
}

/// How long a readiness answer is reused.
const FRESH: Duration = Duration::from_secs(1);

impl Health {
    pub fn new(postgres: PgConnectOptions, redis: RedisLink) -> Self {
        Self {
            postgres,
            redis,
            last: tokio::sync::Mutex::new(None),
        }
    }
}

/// Connect, `SELECT 1`, close.
async fn postgres_answers(options: &PgConnectOptions) -> bool {
    let Ok(mut conn) = PgConnection::connect_with(options).await else {
        return false;
    };
    let answered = repository::ping(&mut conn).await.is_ok();
    let _ = conn.close().await;
    answered
}

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Ready when PostgreSQL answers, and whatever the strategy sells with answers: Redis under
/// `redis`, a majority of the masters under `redlock`. Under the other strategies Redis only
/// carries restock news, so a Redis that is down makes the instance `degraded` (200), not
/// unready.
pub async fn readyz(sale: web::Data<Sale>, health: web::Data<Health>) -> HttpResponse {
    let mut last = health.last.lock().await;
    if let Some((at, status, body)) = last.as_ref()
        && at.elapsed() < FRESH
    {
        return HttpResponse::build(*status).json(body);
    }
    let (status, body) = check(&sale, &health).await;
    *last = Some((Instant::now(), status, body.clone()));
    HttpResponse::build(status).json(body)
}

async fn check(sale: &Sale, health: &Health) -> (StatusCode, Value) {
    let limit = Duration::from_secs(1);
    let postgres = tokio::time::timeout(limit, postgres_answers(&health.postgres))
        .await
        .unwrap_or(false);
    let redis = match health.redis.get() {
        Some(mut conn) => {
            let ping = redis::cmd("PING");
            let ping = ping.query_async::<String>(&mut conn);
            matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_)))
        }
        None => false,
    };
    let redlock = match sale.exclusion() {
        Exclusion::Redlock(locker) => {
            let nodes = locker.backend();
            Some((nodes.reachable_nodes(limit).await, nodes.quorum()))
        }
        _ => None,
    };
    let mut body = json!({
        "postgres": postgres,
        "redis": redis,
        "restock_news": sale.hears_restocks(),
    });
    if let Some((reachable, quorum)) = redlock {
        body["redlock"] = json!({"reachable": reachable, "needed": quorum});
    }
    let problem = if !postgres {
        Some("postgres is unreachable")
    } else if !redis && sale.strategy.needs_redis() {
        Some("redis is unreachable")
    } else if redlock.is_some_and(|(reachable, quorum)| reachable < quorum) {
        Some("a majority of the Redlock masters is unreachable")
    } else {
        None
    };
    if let Some(problem) = problem {
        body["status"] = json!("not_ready");
        body["error"] = json!("not_ready");
        body["message"] = json!(problem);
        return (StatusCode::SERVICE_UNAVAILABLE, body);
    }
    let news = sale.hears_restocks();
    body["status"] = json!(if redis && news { "ready" } else { "degraded" });
    if !redis || !news {
        body["message"] = json!(
            "restock news is not heard (redis is unreachable): sales go on; restocks reach this instance within SOLD_OUT_RECHECK_MS"
        );
    }
    (StatusCode::OK, body)
}
