//! Least privilege in PostgreSQL: the service sells as a role that can read and write rows
//! and nothing else, while another role owns the schema and makes it (`seckill
//! --migrate-only` with `DATABASE_MIGRATION_URL`); both made by the committed
//! `deploy/postgres/roles.sql`.

use std::path::Path;
use std::process::Command;

use seckill::LockStrategy;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{build_error, settings, shared_redis_url, spawn_with, url_of};

/// The two roles `deploy/postgres/roles.sql` makes, named for one test, in its database;
/// dropped (with what they own there) when this is dropped.
struct Roles {
    connect: PgConnectOptions,
    owner: String,
    app: String,
}

impl Roles {
    /// Run `deploy/postgres/roles.sql` with `psql`, as the superuser of `connect`.
    ///
    /// # Panics
    /// If it fails (what it made is dropped first).
    fn make(connect: &PgConnectOptions) -> Self {
        let suffix = testkit::unique_prefix("r")
            .replace(':', "_")
            .trim_matches('_')
            .to_owned();
        let (owner, app) = (
            format!("seckill_owner_{suffix}"),
            format!("seckill_app_{suffix}"),
        );
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/postgres/roles.sql");
        let made = psql(
            connect,
            &[
                "-v",
                &format!("owner={owner}"),
                "-v",
                "owner_password=unused-under-trust",
                "-v",
                &format!("app={app}"),
                "-v",
                "app_password=unused-under-trust",
                "-f",
                script.to_str().unwrap(),
            ],
        );
        if let Err(why) = made {
            let _ = psql(connect, &["-c", &drop_roles(&owner, &app)]);
            panic!("deploy/postgres/roles.sql failed: {why}");
        }
        Self {
            connect: connect.clone(),
            owner,
            app,
        }
    }

    /// The test database's URL, as `role`.
    fn url_as(&self, role: &str) -> String {
        url_of(&self.connect.clone().username(role))
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        // Never a panic here: one during a failed test's unwinding would end every test.
        if let Err(why) = psql(&self.connect, &["-c", &drop_roles(&self.owner, &self.app)]) {
            eprintln!(
                "could not drop the roles {} and {}: {why}",
                self.owner, self.app
            );
        }
    }
}

/// What drops both roles, whichever of them exist. One role at a time: both at once trips
/// over the owner's default privileges, which name the app.
fn drop_roles(owner: &str, app: &str) -> String {
    let mut sql = String::new();
    for role in [app, owner] {
        sql.push_str(&format!(
            "DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN \
             EXECUTE 'DROP OWNED BY {role} CASCADE'; END IF; END $$; "
        ));
    }
    sql + &format!("DROP ROLE IF EXISTS {app}; DROP ROLE IF EXISTS {owner};")
}

/// `psql` on the database of `connect`, as its user; its error output when it fails.
fn psql(connect: &PgConnectOptions, args: &[&str]) -> Result<(), String> {
    let output = Command::new("psql")
        .arg(url_of(connect))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(args)
        .output()
        .map_err(|e| format!("psql (Debian: postgresql-client): {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// What `statement` gets from PostgreSQL as the role of `pool`: `Ok` or the error's text.
async fn as_role(pool: &PgPool, statement: &str) -> Result<(), String> {
    sqlx::raw_sql(statement)
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `seckill --migrate-only`, the real binary, as a deployment's migration job would run it:
/// the flag alone, and no LOCK_STRATEGY (the lock table is made all the same).
fn migrate_only(roles: &Roles) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .arg("--migrate-only")
        .env_clear()
        .env("DATABASE_URL", roles.url_as(&roles.app))
        .env("DATABASE_MIGRATION_URL", roles.url_as(&roles.owner))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    (output.status.success(), said.into_owned())
}

/// The service sells under `pg-lock` (whose table is schema too) as the app role, the
/// schema made by the owner role in a migration job; the app role alone cannot make it,
/// and cannot create, change, drop or empty a table.
#[sqlx::test(migrations = false)]
async fn the_service_sells_as_a_role_that_cannot_change_the_schema(
    _pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: the roles of deploy/postgres/roles.sql in this test's empty database.
    let roles = Roles::make(&connect);
    let as_app = || async {
        PgPoolOptions::new()
            .max_connections(5)
            .connect(&roles.url_as(&roles.app))
            .await
            .expect("the app role connects")
    };
    let mut settings = settings(&shared_redis_url(), &testkit::unique_prefix("privileges"));
    settings.lock.strategy = LockStrategy::PgLock;

    // Act: start as the app role on the empty database (it would have to make the schema);
    // make the schema as the owner with --migrate-only; start as the app role again, and
    // sell; then try the schema as the app role.
    let refused = build_error(settings.clone(), Some(as_app().await)).await;
    let (migrated, said) = migrate_only(&roles);
    // A build after this one added a migration: this build still starts on that schema,
    // with the owner's URL (a rolled-back release) and without it.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99991231000000, 'from a newer build', true, '\\x00', 0)",
    )
    .execute(&PgPool::connect_with(connect.clone()).await.unwrap())
    .await
    .unwrap();
    let mut with_owner = settings.clone();
    with_owner.database.migration_url = Some(roles.url_as(&roles.owner).into());
    let rolled_back = seckill::Application::build_with_pool(with_owner, as_app().await)
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:#}"));
    let app = spawn_with(settings, as_app().await).await;
    let id = app.create_product("sold by the app role", 2).await;
    let sold = app.purchase(id, 1, 1).await.status();
    let pool = as_app().await;
    let attempts = [
        as_role(&pool, "CREATE TABLE intruder (id INT)").await,
        as_role(&pool, "CREATE TEMPORARY TABLE intruder (id INT)").await,
        as_role(&pool, "ALTER TABLE products ADD COLUMN intruder INT").await,
        as_role(&pool, "TRUNCATE orders").await,
        as_role(&pool, "DROP TABLE distlock_locks").await,
    ];
    let superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .unwrap();
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT tableowner::TEXT FROM pg_tables WHERE schemaname = 'public'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();

    // Assert: refused at first, naming what to set; the job made the schema; sold as the
    // app role; every schema change refused; the owner owns every table, the lock table
    // among them.
    assert!(
        refused.contains("cannot run database migrations")
            && refused.contains("permission denied")
            && refused.contains("DATABASE_MIGRATION_URL"),
        "{refused}"
    );
    assert!(
        migrated && said.contains("the database schema is current"),
        "{said}"
    );
    assert_eq!(rolled_back, Ok(()), "an older build on a newer schema");
    assert_eq!(sold, 201);
    let statements = ["CREATE", "CREATE TEMPORARY", "ALTER", "TRUNCATE", "DROP"];
    for (attempt, statement) in attempts.iter().zip(statements) {
        let why = attempt.as_ref().expect_err(statement);
        assert!(
            why.contains("permission denied") || why.contains("must be owner"),
            "{statement}: {why}"
        );
    }
    assert!(!superuser);
    assert_eq!(owners, std::slice::from_ref(&roles.owner));
    drop(app);
}
