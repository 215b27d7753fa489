//! Least privilege in PostgreSQL: the service sells as a role that can read and write rows
//! and nothing else, while another role owns the schema and runs the migrations
//! (`DATABASE_MIGRATION_URL`); both made by the committed `deploy/postgres/roles.sql`.

use std::path::Path;
use std::process::Command;

use seckill::LockStrategy;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{settings, shared_redis_url, spawn_with, url_of};

/// The two roles `deploy/postgres/roles.sql` makes, named for one test, in its database;
/// dropped (with what they own there) when this is dropped.
struct Roles {
    connect: PgConnectOptions,
    owner: String,
    app: String,
}

impl Roles {
    /// Run `deploy/postgres/roles.sql` with `psql`, as the superuser of `connect`.
    fn make(connect: &PgConnectOptions) -> Self {
        let suffix = testkit::unique_prefix("r")
            .replace(':', "_")
            .trim_matches('_')
            .to_owned();
        let roles = Self {
            connect: connect.clone(),
            owner: format!("seckill_owner_{suffix}"),
            app: format!("seckill_app_{suffix}"),
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/postgres/roles.sql");
        roles.psql(&[
            "-v",
            &format!("owner={}", roles.owner),
            "-v",
            "owner_password=unused-under-trust",
            "-v",
            &format!("app={}", roles.app),
            "-v",
            "app_password=unused-under-trust",
            "-f",
            script.to_str().unwrap(),
        ]);
        roles
    }

    fn psql(&self, args: &[&str]) {
        let output = Command::new("psql")
            .arg(url_of(&self.connect))
            .args(["-X", "-q"])
            .args(args)
            .output()
            .expect("psql (Debian: postgresql-client)");
        assert!(
            output.status.success(),
            "psql {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The test database's URL, as `role`.
    fn url_as(&self, role: &str) -> String {
        url_of(&self.connect.clone().username(role))
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let (owner, app) = (&self.owner, &self.app);
        self.psql(&[
            "-c",
            // One role at a time: both at once trips over the owner's default privileges,
            // which name the app.
            &format!(
                "DROP OWNED BY {app} CASCADE; DROP OWNED BY {owner} CASCADE; \
                 DROP ROLE {app}; DROP ROLE {owner}"
            ),
        ]);
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

/// The service sells under `pg-lock` (whose table is schema too) as the app role, the
/// schema made by the owner role; the app role alone cannot migrate, and cannot create,
/// change, drop or empty a table.
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
    let mut alone = settings(&shared_redis_url(), &testkit::unique_prefix("privileges"));
    alone.lock.strategy = LockStrategy::PgLock;
    let mut split = alone.clone();
    split.database.migration_url = Some(roles.url_as(&roles.owner).into());

    // Act: start as the app role alone (it must migrate), then with the owner migrating;
    // sell; then try the schema as the app role.
    let refused = match seckill::Application::build_with_pool(alone, as_app().await).await {
        Ok(_) => panic!("the app role changed the schema"),
        Err(error) => format!("{error:#}"),
    };
    let app = spawn_with(split, as_app().await).await;
    let id = app.create_product("sold by the app role", 2).await;
    let sold = app.purchase(id, 1, 1).await.status();
    let pool = as_app().await;
    let attempts = [
        as_role(&pool, "CREATE TABLE intruder (id INT)").await,
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

    // Assert: sold as the app role; every schema change refused; the owner owns every
    // table, the lock table among them.
    assert!(
        refused.contains("cannot run database migrations") && refused.contains("permission denied"),
        "{refused}"
    );
    assert_eq!(sold, 201);
    for (attempt, statement) in attempts.iter().zip(["CREATE", "ALTER", "TRUNCATE", "DROP"]) {
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
