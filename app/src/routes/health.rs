use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use utoipa::ToSchema;

use super::buyer::Gate;
use crate::redis_link::RedisLink;
use crate::repository;
use crate::sale::{Exclusion, Sale};

/// What `/readyz` checks with. PostgreSQL is asked over a connection of the check's own,
/// opened and closed for each check, so a pool busy with purchases cannot make a healthy
/// instance look unready (and no idle connection is kept for it).
pub struct Health {
    pub postgres: PgConnectOptions,
    pub redis: RedisLink,
    /// The lock read under `zookeeper` and `etcd` to see that the service answers (nobody
    /// takes it).
    pub probe_key: String,
    /// The last answer and when it was made: checks run one at a time and at most once per
    /// [`FRESH`], so a flood of `/readyz` cannot flood PostgreSQL with connections.
    last: tokio::sync::Mutex<Option<(Instant, StatusCode, Readiness)>>,
    /// The runtime the sale's leaders run on, where the ZooKeeper and etcd probe runs.
    runtime: tokio::runtime::Handle,
    /// The ZooKeeper or etcd probe that outlasted a check's time limit and still runs: the
    /// next check waits for it instead of starting another.
    probe: tokio::sync::Mutex<Option<JoinHandle<bool>>>,
}

/// How long a readiness answer is reused.
const FRESH: Duration = Duration::from_secs(1);

impl Health {
    /// Checks with these; made on the runtime the sale's leaders run on (its probe of
    /// ZooKeeper or etcd runs there).
    pub fn new(postgres: PgConnectOptions, redis: RedisLink, probe_key: String) -> Self {
        Self {
            postgres,
            redis,
            probe_key,
            last: tokio::sync::Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
            probe: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether the lock service answers a read of a lock nobody takes, within `limit`.
    ///
    /// The read runs in a task on the sale's runtime, and one that outlasts `limit` is not
    /// cut short: it can finish what it started, a new ZooKeeper session (whose client then
    /// runs on that runtime, not on an HTTP worker's) or a move to another etcd member, so an
    /// instance nobody sends purchases to while it is unready still comes back once the
    /// service does. The next check waits for it rather than starting another.
    async fn lock_service_answers<B: distlock::Backend>(
        &self,
        locker: &distlock::Locker<B>,
        limit: Duration,
    ) -> bool {
        let mut running = self.probe.lock().await;
        let mut probe = match running.take() {
            Some(probe) if !probe.is_finished() => probe,
            _ => {
                let (locker, key) = (locker.clone(), self.probe_key.clone());
                self.runtime
                    .spawn(async move { locker.inspect(&key).await.is_ok() })
            }
        };
        match tokio::time::timeout(limit, &mut probe).await {
            Ok(answered) => answered.unwrap_or(false),
            Err(_) => {
                *running = Some(probe);
                false
            }
        }
    }
}

/// Connect, ask whether the server would take a write ([`repository::takes_writes`]), close.
async fn postgres_answers(options: &PgConnectOptions) -> bool {
    let Ok(mut conn) = PgConnection::connect_with(options).await else {
        return false;
    };
    let answered = repository::takes_writes(&mut conn).await.unwrap_or(false);
    let _ = conn.close().await;
    answered
}

/// `/healthz`: the process is up.
#[derive(Serialize, ToSchema)]
pub struct Alive {
    #[schema(example = "ok")]
    status: &'static str,
}

/// `/readyz`: what the instance depends on, and whether it can sell.
#[derive(Clone, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready`; `degraded` (selling, but restock news from other instances is not heard);
    /// or `not_ready` (503).
    #[schema(example = "ready")]
    status: &'static str,
    postgres: bool,
    redis: bool,
    /// Whether restock messages from other instances are heard.
    restock_news: bool,
    /// How buyers are identified: `jwt`, or `off` (UNSAFE: the body's `user_id` is
    /// believed; for benchmarks only).
    #[schema(example = "jwt")]
    buyer_identity: &'static str,
    /// Under `LOCK_STRATEGY=redlock`: masters reachable, and the majority needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    redlock: Option<Quorum>,
    /// Under `LOCK_STRATEGY=zookeeper`: whether the ensemble answers on the lock's session,
    /// and the session's state.
    #[serde(skip_serializing_if = "Option::is_none")]
    zookeeper: Option<Consensus>,
    /// Under `LOCK_STRATEGY=etcd`: whether the cluster answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    etcd: Option<Consensus>,
    /// `not_ready` when not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'static str>,
}

/// Redlock masters.
#[derive(Clone, Copy, Serialize, ToSchema)]
pub struct Quorum {
    reachable: usize,
    needed: usize,
}

/// A consensus-backed lock service (ZooKeeper, etcd).
#[derive(Clone, Serialize, ToSchema)]
pub struct Consensus {
    /// Whether it answered a read of a lock within a second (etcd: a linearizable read,
    /// which needs a leader and a quorum; ZooKeeper: a read on the lock's session).
    answers: bool,
    /// ZooKeeper's session state as the client sees it (`SyncConnected` when it can lock;
    /// `Disconnected` while it looks for a server; `Expired` until a new session is open).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "SyncConnected")]
    session: Option<String>,
}

/// `GET /healthz`.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "the process is up", body = Alive)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Alive { status: "ok" })
}

/// Ready when PostgreSQL answers, and whatever the strategy sells with answers: Redis under
/// `redis`, a majority of the masters under `redlock`, ZooKeeper on the lock's session under
/// `zookeeper`, etcd under `etcd`. Redis is otherwise only the carrier of restock news:
/// without it the instance is `degraded` (200), not unready.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "ready, or degraded", body = Readiness),
        (status = 503, description = "not ready", body = Readiness),
    )
)]
pub async fn readyz(
    sale: web::Data<Sale>,
    health: web::Data<Health>,
    gate: web::Data<Gate>,
) -> HttpResponse {
    let mut last = health.last.lock().await;
    if let Some((at, status, body)) = last.as_ref()
        && at.elapsed() < FRESH
    {
        return HttpResponse::build(*status).json(body);
    }
    let (status, mut body) = check(&sale, &health).await;
    body.buyer_identity = gate.identity.name();
    *last = Some((Instant::now(), status, body.clone()));
    HttpResponse::build(status).json(body)
}

async fn check(sale: &Sale, health: &Health) -> (StatusCode, Readiness) {
    let limit = Duration::from_secs(1);
    let postgres = tokio::time::timeout(limit, postgres_answers(&health.postgres))
        .await
        .unwrap_or(false);
    let redis = redis_answers(health, limit).await;
    let redlock = redlock_quorum(sale, limit).await;
    let (zookeeper, etcd) = consensus(sale, health, limit).await;
    let restock_news = sale.hears_restocks();
    let mut body = Readiness {
        status: "ready",
        postgres,
        redis,
        restock_news,
        buyer_identity: "",
        redlock,
        zookeeper,
        etcd,
        error: None,
        message: None,
    };
    if let Some(problem) = problem(sale, &body) {
        body.status = "not_ready";
        body.error = Some("not_ready");
        body.message = Some(problem);
        return (StatusCode::SERVICE_UNAVAILABLE, body);
    }
    if !redis || !restock_news {
        body.status = "degraded";
        body.message = Some(
            "restock news is not heard (redis is unreachable): sales go on; restocks reach this instance within SOLD_OUT_RECHECK_MS",
        );
    }
    (StatusCode::OK, body)
}

/// Whether Redis answers a `PING` within `limit`.
async fn redis_answers(health: &Health, limit: Duration) -> bool {
    match health.redis.get() {
        Some(mut conn) => {
            let ping = redis::cmd("PING");
            let ping = ping.query_async::<String>(&mut conn);
            matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_)))
        }
        None => false,
    }
}

/// Under `redlock`, how many masters answer, of how many needed.
async fn redlock_quorum(sale: &Sale, limit: Duration) -> Option<Quorum> {
    match sale.exclusion() {
        Exclusion::Redlock(locker) => {
            let nodes = locker.backend();
            Some(Quorum {
                reachable: nodes.reachable_nodes(limit).await,
                needed: nodes.quorum(),
            })
        }
        _ => None,
    }
}

/// Under `zookeeper` (first) or `etcd` (second), whether the lock service answers.
async fn consensus(
    sale: &Sale,
    health: &Health,
    limit: Duration,
) -> (Option<Consensus>, Option<Consensus>) {
    match sale.exclusion() {
        Exclusion::ZooKeeper(locker) => {
            let answers = health.lock_service_answers(locker, limit).await;
            let session = format!("{:?}", locker.backend().zookeeper().state());
            let consensus = Consensus {
                answers,
                session: Some(session),
            };
            (Some(consensus), None)
        }
        Exclusion::Etcd(locker) => {
            let consensus = Consensus {
                answers: health.lock_service_answers(locker, limit).await,
                session: None,
            };
            (None, Some(consensus))
        }
        _ => (None, None),
    }
}

/// What makes the instance unready, the first found: PostgreSQL, then what the strategy
/// sells with.
fn problem(sale: &Sale, body: &Readiness) -> Option<&'static str> {
    if !body.postgres {
        Some("postgres is unreachable")
    } else if !body.redis && sale.strategy.needs_redis() {
        Some("redis is unreachable")
    } else if body.redlock.is_some_and(|q| q.reachable < q.needed) {
        Some("a majority of the Redlock masters is unreachable")
    } else if body.zookeeper.as_ref().is_some_and(|z| !z.answers) {
        Some(
            "the ZooKeeper session is not connected: the ensemble does not answer (ZOOKEEPER_CONNECT)",
        )
    } else if body.etcd.as_ref().is_some_and(|e| !e.answers) {
        Some("etcd does not answer (ETCD_ENDPOINTS): it is down, or has no leader")
    } else {
        None
    }
}
