//! A deployment: a set of seckill instances of one configuration, with a throwaway database
//! and a Redis key prefix of its own, started for the bench and removed after it.

use seckill::LockStrategy;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::ADMIN_TOKEN;
use crate::instances::{Instance, InstanceConfig};
use crate::servers::{self, ThrowawayDatabase};

/// A set of instances of one configuration, sharing a database and a Redis key prefix.
pub(super) struct Deployment {
    pub strategy: LockStrategy,
    /// `BATCH_MAX`, where a run sets it; `None`: the service's default.
    pub batch: Option<u32>,
    pub instances: Vec<Instance>,
    /// Counts the orders (one connection: the bench's own reads stay few).
    pub pool: PgPool,
    database: ThrowawayDatabase,
    prefix: String,
}

impl Deployment {
    /// Stop the instances, drop the database, delete the Redis keys.
    pub(super) async fn remove(self, redis_url: &str) -> anyhow::Result<()> {
        drop(self.instances);
        self.pool.close().await;
        self.database.remove().await?;
        servers::forget_keys(redis_url, &self.prefix).await
    }
}

/// Start `count` instances of `strategy` on a throwaway database `name`.
pub(super) async fn deploy(
    admin_url: &str,
    redis_url: &str,
    name: String,
    strategy: LockStrategy,
    batch: Option<u32>,
    count: usize,
    more: &[(&'static str, &str)],
) -> anyhow::Result<Deployment> {
    let prefix = format!("bench:{name}:");
    let database = ThrowawayDatabase::create(admin_url, name.clone()).await?;
    let config = InstanceConfig {
        database_url: &database.url,
        redis_url,
        redis_key_prefix: &prefix,
        admin_token: ADMIN_TOKEN,
        strategy,
        work_ms: 0,
        // The service's defaults (LOCK_WAIT_MS, LOCK_TTL_MS), written out because the
        // instance's configuration names them.
        lock_wait_ms: 2_000,
        lock_ttl_ms: 5_000,
        redlock_urls: "",
        extra: batch
            .map(|b| ("BATCH_MAX", b.to_string()))
            .into_iter()
            .chain(more.iter().map(|(k, v)| (*k, (*v).to_owned())))
            .collect(),
    };
    let started = async {
        let me = std::env::current_exe()?;
        let mut instances = Vec::new();
        for i in 0..count {
            instances.push(Instance::start(&me, &config, &format!("{name}-{i}")).await?);
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&database.url)
            .await?;
        anyhow::Ok((instances, pool))
    }
    .await;
    match started {
        Ok((instances, pool)) => Ok(Deployment {
            strategy,
            batch,
            instances,
            pool,
            database,
            prefix,
        }),
        Err(error) => {
            // Nothing of it is kept: the database and any keys go now.
            let _ = database.remove().await;
            let _ = servers::forget_keys(redis_url, &prefix).await;
            Err(error)
        }
    }
}

/// Orders of `product` so far.
pub(super) async fn sold(pool: &PgPool, product: i64) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "orders!" FROM orders WHERE product_id = $1"#,
        product
    )
    .fetch_one(pool)
    .await?)
}
