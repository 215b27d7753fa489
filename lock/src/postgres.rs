//! The classic database lock: a lock table in PostgreSQL (feature `postgres`).
//!
//! The lock is a row whose name has a unique constraint: `INSERT` takes it (only one
//! concurrent insert can succeed), `DELETE` gives it back. The design has four known flaws;
//! here is how this backend deals with each.
//!
//! | flaw | the usual cure | here |
//! |---|---|---|
//! | single point of failure | replication | not built: run PostgreSQL with a synchronous standby. A failover to an asynchronous one can lose rows, and with them locks (fences are in the same database as the data they protect, so a store in that database stays consistent with them) |
//! | no expiry: a dead holder keeps the row for ever | a timed cleanup job | every row has `expires_at` from the database's clock; the acquire statement itself takes over an expired row, atomically, so no job is needed; the watchdog renews live holders |
//! | non-blocking only | retry in a loop | [`Locker::acquire`](crate::Locker::acquire) retries with backoff until its deadline; [`Locker::try_acquire`](crate::Locker::try_acquire) makes one attempt |
//! | non-reentrant | record the holder, let it in again | [`Owner`](crate::Owner), as for Redis |
//!
//! Fences come from a per-name counter row in `distlock_fences`, which outlives the lock rows,
//! so they strictly increase even across a delete and re-create.
//!
//! Each step is one SQL statement, run outside any transaction of the caller. The queries
//! are checked by the crate's tests against a real PostgreSQL rather than at compile time:
//! a library cannot assume its users build with a database at hand.
//!
//! Waiters poll (no `LISTEN`/`NOTIFY` wake-up). The lock row of a hot key is a hot row of
//! its own: every attempt writes the name's fence counter.

use std::time::Duration;

use sqlx::PgPool;

use crate::backend::{Attempt, Backend, LockState, Renewal, Unlock};
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::token::Token;

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::backend("postgres", error)
    }
}

/// The schema: two tables, created if missing.
pub const SCHEMA: &str = include_str!("../sql/postgres.sql");

/// An arbitrary constant for the advisory lock that serializes concurrent installs
/// (`CREATE TABLE IF NOT EXISTS` is not safe against itself).
const INSTALL_LOCK: i64 = 0x6469_7374_6c6f_636b; // "distlock"

/// The longest lock name, in bytes.
const MAX_NAME_BYTES: usize = 1024;

/// Locks in a PostgreSQL table: a [`Backend`]. Cheap to clone (the pool is shared).
///
/// Create the tables once with [`install`](Self::install) (or run [`SCHEMA`] in a migration).
#[derive(Clone, Debug)]
pub struct PgLockTable {
    pool: PgPool,
}

impl PgLockTable {
    /// Locks in the database `pool` connects to.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Create the lock tables if they are missing.
    ///
    /// # Errors
    /// [`Error::Backend`] when the database cannot be reached or refuses the schema.
    pub async fn install(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(INSTALL_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

impl Backend for PgLockTable {
    fn check_key(&self, key: &str) -> Result<()> {
        crate::keys::check_name(
            key,
            MAX_NAME_BYTES,
            "the key is longer than 1024 bytes",
            |key| key.contains('\0').then_some("the key contains a NUL byte"),
        )
    }

    /// One statement: take the name's next fence, then insert the lock row, or take over a
    /// row whose lease has passed (or that already holds our token: a retried request).
    async fn try_lock(&self, key: &str, token: &Token, ttl: Duration) -> Result<Attempt> {
        let fence: Option<i64> = sqlx::query_scalar(
            "WITH next AS (
                 INSERT INTO distlock_fences AS f (name, fence) VALUES ($1, 1)
                 ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1
                 RETURNING fence
             )
             INSERT INTO distlock_locks AS l (name, token, fence, expires_at)
             SELECT $1, $2, next.fence, clock_timestamp() + $3 * interval '1 millisecond'
             FROM next
             ON CONFLICT (name) DO UPDATE
                 SET token = EXCLUDED.token, fence = EXCLUDED.fence, expires_at = EXCLUDED.expires_at
                 WHERE l.expires_at <= clock_timestamp() OR l.token = EXCLUDED.token
             RETURNING l.fence",
        )
        .bind(key)
        .bind(token.as_str())
        .bind(millis(ttl))
        .fetch_optional(&self.pool)
        .await?;
        Ok(match fence {
            Some(fence) => Attempt::Acquired(Fence::new(fence as u64)),
            None => Attempt::Held { expires_in: None },
        })
    }

    async fn renew(&self, key: &str, token: &Token, ttl: Duration) -> Result<Renewal> {
        let (renewed, holder): (i64, Option<String>) = sqlx::query_as(
            "WITH renewed AS (
                 UPDATE distlock_locks SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
                 WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp()
                 RETURNING 1
             )
             SELECT (SELECT count(*) FROM renewed),
                    (SELECT token FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp())",
        )
        .bind(key)
        .bind(token.as_str())
        .bind(millis(ttl))
        .fetch_one(&self.pool)
        .await?;
        Ok(match (renewed, holder) {
            (1, _) => Renewal::Renewed,
            (_, Some(other)) if other != token.as_str() => Renewal::Taken,
            _ => Renewal::Gone,
        })
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<Unlock> {
        let (live, holder): (Option<bool>, Option<String>) = sqlx::query_as(
            "WITH gone AS (
                 DELETE FROM distlock_locks WHERE name = $1 AND token = $2
                 RETURNING expires_at > clock_timestamp() AS live
             )
             SELECT (SELECT live FROM gone),
                    (SELECT token FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp())",
        )
        .bind(key)
        .bind(token.as_str())
        .fetch_one(&self.pool)
        .await?;
        Ok(match (live, holder) {
            (Some(true), _) => Unlock::Released,
            (None, Some(other)) if other != token.as_str() => Unlock::Taken,
            _ => Unlock::Gone,
        })
    }

    async fn advance_fence(&self, key: &str, token: &Token, seen: Fence) -> Result<Option<Fence>> {
        if seen.get() >= Fence::MAX {
            return Err(Error::InvalidFence(seen.get()));
        }
        let fence: Option<i64> = sqlx::query_scalar(
            "UPDATE distlock_fences f SET fence = GREATEST(f.fence, $3) + 1
             WHERE f.name = $1 AND EXISTS (
                 SELECT 1 FROM distlock_locks l
                 WHERE l.name = $1 AND l.token = $2 AND l.expires_at > clock_timestamp()
             )
             RETURNING f.fence",
        )
        .bind(key)
        .bind(token.as_str())
        .bind(seen.as_i64())
        .fetch_optional(&self.pool)
        .await?;
        Ok(fence.map(|f| Fence::new(f as u64)))
    }

    async fn inspect(&self, key: &str) -> Result<LockState> {
        let (left_ms, fence): (Option<f64>, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000
                     FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp())::float8,
                    (SELECT fence FROM distlock_fences WHERE name = $1)",
        )
        .bind(key)
        .fetch_one(&self.pool)
        .await?;
        Ok(LockState {
            held: left_ms.is_some(),
            expires_in: left_ms.map(|ms| Duration::from_millis(ms.max(0.0) as u64)),
            fence: fence.map(|f| Fence::new(f as u64)),
            waiting: None,
        })
    }

    async fn force_unlock(&self, key: &str) -> Result<bool> {
        let deleted = sqlx::query(
            "DELETE FROM distlock_locks WHERE name = $1 AND expires_at > clock_timestamp()",
        )
        .bind(key)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(deleted > 0)
    }
}
