//! The database schema: who makes it, and whether it is made.
//!
//! The schema is the migrations (`migrations/`, [`MIGRATOR`]) and, under `pg-lock`, the lock
//! table. It is made by the role of `DATABASE_MIGRATION_URL` when that is set, on one
//! connection closed once it is done; otherwise by the service's own role
//! (`DATABASE_URL`), unless the schema is already current, which a role that may not change
//! it can tell by reading. So a deployment can make the schema once with
//! `seckill --migrate-only` (a job holding the owner's URL) and run its instances with a
//! role that reads and writes rows and nothing else (`deploy/postgres/roles.sql`).

use std::str::FromStr;

use anyhow::Context;
use distlock::PgLockTable;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::MIGRATOR;
use crate::settings::{DatabaseSettings, LockStrategy, Settings};

/// Make the schema, or find it made: as the owner when `DATABASE_MIGRATION_URL` is set,
/// else as `pool`'s role when the schema is not current yet; on a connection of its own
/// either way, closed once it is done.
///
/// # Errors
/// The owner cannot connect, or the schema cannot be made (the message says which role to
/// give it to when the service's own may not).
pub async fn prepare(pool: &PgPool, settings: &Settings) -> anyhow::Result<()> {
    let lock_table = settings.lock.strategy == LockStrategy::PgLock;
    match settings.database.migration_url() {
        Some(url) => {
            let owner = parse(url, "DATABASE_MIGRATION_URL")?;
            let owner = one_connection(owner, "DATABASE_MIGRATION_URL", &settings.database).await?;
            let made = make(&owner, lock_table).await;
            owner.close().await;
            made
        }
        None if is_current(pool, lock_table).await? => Ok(()),
        None => {
            let own = pool.connect_options().as_ref().clone();
            let own = one_connection(own, "DATABASE_URL", &settings.database).await?;
            let made = make(&own, lock_table).await;
            own.close().await;
            match made {
                Ok(()) => Ok(()),
                // Made meanwhile by someone who may (a migration job this instance waited
                // behind, on the migrator's lock): nothing left to do.
                Err(_) if is_current(pool, lock_table).await? => Ok(()),
                Err(error) => Err(error.context(
                    "as DATABASE_URL's role; a role that may not change the schema needs \
                     DATABASE_MIGRATION_URL, or a run of `seckill --migrate-only` with it first",
                )),
            }
        }
    }
}

/// `seckill --migrate-only`: make the schema as `DATABASE_MIGRATION_URL`'s role, or when it
/// is unset `DATABASE_URL`'s, and return, starting nothing else. The lock table is made
/// whatever `LOCK_STRATEGY` says, so that the instances may run `pg-lock` (now or after a
/// switch) without the right to make it; no other setting matters.
///
/// # Errors
/// No URL, an invalid or unreachable one, or the schema cannot be made.
pub async fn migrate_only(settings: &Settings) -> anyhow::Result<()> {
    let database = &settings.database;
    let (url, setting) = match database.migration_url() {
        Some(url) => (url, "DATABASE_MIGRATION_URL"),
        None if database.url().is_empty() => {
            anyhow::bail!("set DATABASE_MIGRATION_URL, DATABASE_URL or DATABASE_URL_FILE")
        }
        None => (database.url(), "DATABASE_URL"),
    };
    let pool = one_connection(parse(url, setting)?, setting, database).await?;
    let made = make(&pool, true).await;
    pool.close().await;
    made
}

/// The migrations, then (`lock_table`) the `pg-lock` table, as `pool`'s role, unless the
/// schema is current already: a schema with migrations newer than this build's counts as
/// current (a build rolled back starts on it, with or without the owner's URL; the
/// migrator would refuse it). `pool` is one connection, closed by the caller once this
/// returns: the migrator holds an advisory lock for the whole session, and keeps it when
/// it fails, which would hold up every later attempt (another instance's, a migration
/// job's) while the session lived.
async fn make(pool: &PgPool, lock_table: bool) -> anyhow::Result<()> {
    if is_current(pool, lock_table).await? {
        return Ok(());
    }
    MIGRATOR
        .run(pool)
        .await
        .context("cannot run database migrations")?;
    if lock_table {
        PgLockTable::new(pool.clone())
            .install()
            .await
            .context("cannot create the lock table in PostgreSQL")?;
    }
    Ok(())
}

/// Whether every migration of this build was applied (with the same checksum; newer ones
/// may be there too) and, with `lock_table`, the lock tables exist: by reading only, which
/// the service's role may.
async fn is_current(pool: &PgPool, lock_table: bool) -> anyhow::Result<bool> {
    let read = async {
        let tables: (bool, bool) = sqlx::query_as(
            "SELECT to_regclass('_sqlx_migrations') IS NOT NULL, \
                    to_regclass('distlock_locks') IS NOT NULL \
                    AND to_regclass('distlock_fences') IS NOT NULL",
        )
        .fetch_one(pool)
        .await?;
        if !tables.0 {
            return Ok::<_, sqlx::Error>(false);
        }
        let applied: Vec<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
                .fetch_all(pool)
                .await?;
        let migrated = MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .all(|m| applied.contains(&(m.version, m.checksum.to_vec())));
        Ok(migrated && (!lock_table || tables.1))
    };
    read.await
        .context("cannot read whether the database schema is current")
}

/// `url`, the value of `setting` (named in messages), as connection options.
fn parse(url: &str, setting: &str) -> anyhow::Result<PgConnectOptions> {
    PgConnectOptions::from_str(url).with_context(|| format!("invalid {setting}"))
}

/// One connection with `options`, those of `setting` (named in messages).
async fn one_connection(
    options: PgConnectOptions,
    setting: &str,
    database: &DatabaseSettings,
) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(database.acquire_timeout)
        .connect_with(options)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL ({setting})"))
}
