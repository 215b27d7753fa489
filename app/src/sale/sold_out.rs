//! The sold-out fast path: once a product is sold out, purchases are answered 409 after one
//! Redis GET, without the lock and without a database connection, until a restock.
//!
//! Each product has one Redis key, `<REDIS_KEY_PREFIX>seckill:sold_out:<id>`, holding `sold:<generation>` or
//! `open:<generation>`, where `<generation>` is the product's restock generation (bumped in PostgreSQL by
//! every restock). A purchase that sees the stock at 0 marks it `sold:<generation>`; a restock
//! writes `open:<generation+1>`. Both scripts refuse to replace a mark of a newer generation, so a
//! slow purchase that saw the old stock cannot hide a restock that committed after it.
//! Every instance reads the same key, so every instance sees the restock at once.
//!
//! The marks are hints; PostgreSQL stays the truth. A `sold` mark expires after
//! [`SOLD_MARK_TTL`], so even a mark that went wrong (Redis lost the newer `open` mark in a
//! restart) costs at most that long. When Redis cannot be reached the fast path is skipped.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::Sale;
use crate::domain::ProductId;

/// How long a `sold` mark is trusted before the next purchase asks PostgreSQL again.
pub const SOLD_MARK_TTL: Duration = Duration::from_secs(10);
/// `open` marks only need to outlive any in-flight purchase of the old generation.
const OPEN_MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// KEYS[1] mark key; ARGV[1] 'sold' or 'open', ARGV[2] generation, ARGV[3] ttl in ms.
/// Returns 1 when written, 0 when a newer generation's mark is already there.
static MARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current then
  local gen = tonumber(string.match(current, ':(%d+)$'))
  if gen and gen > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
return 1
",
    )
});

fn key(sale: &Sale, id: ProductId) -> String {
    format!("{}seckill:sold_out:{id}", sale.key_prefix)
}

/// `true` when the product is marked sold out. Errors count as "not known".
pub async fn is_marked(sale: &Sale, id: ProductId) -> bool {
    let mark: redis::RedisResult<Option<String>> = redis::cmd("GET")
        .arg(key(sale, id))
        .query_async(&mut sale.redis.clone())
        .await;
    matches!(mark, Ok(Some(mark)) if mark.starts_with("sold:"))
}

/// Mark the product sold out as of restock generation `generation`.
pub async fn mark_sold(sale: &Sale, id: ProductId, generation: i64) -> redis::RedisResult<()> {
    write(sale, id, "sold", generation, SOLD_MARK_TTL).await
}

/// Mark the product open again after the restock that started generation `generation`.
pub async fn mark_open(sale: &Sale, id: ProductId, generation: i64) -> redis::RedisResult<()> {
    write(sale, id, "open", generation, OPEN_MARK_TTL).await
}

async fn write(
    sale: &Sale,
    id: ProductId,
    state: &str,
    generation: i64,
    ttl: Duration,
) -> redis::RedisResult<()> {
    let _written: i64 = MARK
        .key(key(sale, id))
        .arg(state)
        .arg(generation)
        .arg(ttl.as_millis() as u64)
        .invoke_async(&mut sale.redis.clone())
        .await?;
    Ok(())
}
