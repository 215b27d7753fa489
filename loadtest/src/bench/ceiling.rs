//! The ceiling: PostgreSQL selling from one row with nothing in front of it, measured with
//! pgbench (one client) running `loadtest/scripts/ceiling.sql` in a throwaway database with
//! the service's migrations.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::servers::ThrowawayDatabase;

/// The script, built into the binary so that bench-http runs from anywhere.
const SCRIPT: &str = include_str!("../../scripts/ceiling.sql");

/// Orders each of the script's transactions inserts.
pub(crate) const ORDERS_PER_COMMIT: u64 = 64;

/// Units of the ceiling's product, as many as the service accepts.
const STOCK: i64 = 1_000_000_000;

/// Whether pgbench runs here, and if not, what to install.
///
/// # Errors
/// pgbench is not installed.
pub(crate) fn check_installed() -> anyhow::Result<()> {
    match Command::new("pgbench").arg("--version").output() {
        Ok(output) if output.status.success() => Ok(()),
        _ => bail!(
            "pgbench is not installed (bench-http measures the ceiling with it): install it \
             (Debian: apt-get install postgresql-client)"
        ),
    }
}

/// The ceiling's database, its product, and the script on disk for pgbench.
pub(crate) struct Ceiling {
    database: ThrowawayDatabase,
    /// Counts the orders, to check what pgbench says.
    pub pool: PgPool,
    product: i64,
    script: PathBuf,
}

/// What one pgbench run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Run {
    /// Transactions per second, as pgbench reports it (without the connection's set-up).
    pub tps: f64,
    /// Orders inserted, counted in PostgreSQL.
    pub orders: u64,
}

impl Ceiling {
    /// A throwaway database `name` with the service's migrations, a product of a billion
    /// units, the buyers' sequence, and the script written into `dir`.
    ///
    /// # Errors
    /// PostgreSQL refuses, or `dir` cannot be written.
    pub async fn create(admin_url: &str, name: String, dir: &Path) -> anyhow::Result<Self> {
        let database = ThrowawayDatabase::create(admin_url, name).await?;
        match prepare(&database.url, dir).await {
            Ok((pool, product, script)) => Ok(Self {
                database,
                pool,
                product,
                script,
            }),
            Err(error) => {
                let _ = database.remove().await;
                Err(error)
            }
        }
    }

    /// Run pgbench for `seconds` with one client, and check that every transaction it
    /// counts inserted its orders.
    ///
    /// # Errors
    /// pgbench fails, or the orders in PostgreSQL are not its transactions times 64 (the
    /// product ran out, say).
    pub async fn run(&self, seconds: u64) -> anyhow::Result<Run> {
        let before = self.orders().await?;
        let output = tokio::process::Command::new("pgbench")
            // No vacuum of pgbench's own tables (there are none); one client and one thread.
            .args(["-n", "-c", "1", "-j", "1", "-T", &seconds.to_string()])
            // Prepared, as the service's statements are (sqlx prepares them): no parse per
            // transaction that the service does not pay either.
            .args(["-M", "prepared"])
            .arg("-D")
            .arg(format!("product={}", self.product))
            .arg("-f")
            .arg(&self.script)
            .arg(&self.database.url)
            .kill_on_drop(true)
            .output()
            .await
            .context("running pgbench")?;
        let text = String::from_utf8_lossy(&output.stdout);
        let report = parse(&text);
        let (Some((transactions, tps)), true) = (report, output.status.success()) else {
            bail!(
                "pgbench failed ({}): {text}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let orders = (self.orders().await? - before) as u64;
        if orders != transactions * ORDERS_PER_COMMIT {
            bail!(
                "pgbench counted {transactions} transactions, but {orders} orders were inserted, \
                 not {ORDERS_PER_COMMIT} each: the ceiling's product ran out, or the script \
                 changed"
            );
        }
        Ok(Run { tps, orders })
    }

    /// The orders the script has inserted so far: one buyer number each, from the sequence
    /// (read in constant time: a `COUNT(*)` of the growing table would be PostgreSQL work
    /// inside the CPU the ceiling is measured by).
    async fn orders(&self) -> anyhow::Result<i64> {
        let (last, called): (i64, bool) =
            sqlx::query_as("SELECT last_value, is_called FROM ceiling_buyers")
                .fetch_one(&self.pool)
                .await?;
        Ok(if called { last } else { 0 })
    }

    /// Drop the database.
    pub async fn remove(self) -> anyhow::Result<()> {
        self.pool.close().await;
        self.database.remove().await
    }
}

async fn prepare(url: &str, dir: &Path) -> anyhow::Result<(PgPool, i64, PathBuf)> {
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    seckill::MIGRATOR
        .run(&pool)
        .await
        .context("applying the service's migrations to the ceiling's database")?;
    // Set up as the admin API would (the product and its ledger row), in plain SQL: the
    // service is not running here.
    let product: i64 = sqlx::query_scalar(
        "INSERT INTO products (name, stock) VALUES ('ceiling', $1) RETURNING id",
    )
    .bind(STOCK)
    .fetch_one(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO stock_changes (product_id, delta, reason, actor) VALUES ($1, $2, 'create', 'bench-http')",
    )
    .bind(product)
    .bind(STOCK)
    .execute(&pool)
    .await?;
    sqlx::query("CREATE SEQUENCE ceiling_buyers")
        .execute(&pool)
        .await?;
    let script = dir.join("ceiling.sql");
    std::fs::write(&script, SCRIPT).context("writing the ceiling's script")?;
    Ok((pool, product, script))
}

/// Transactions and tps from pgbench's report.
pub(crate) fn parse(text: &str) -> Option<(u64, f64)> {
    let transactions = text
        .lines()
        .find_map(|line| line.strip_prefix("number of transactions actually processed:"))?
        .split_whitespace()
        .next()?
        // With -t, pgbench writes `N/M`; with -T, `N`.
        .split('/')
        .next()?
        .parse()
        .ok()?;
    let tps = text
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((transactions, tps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_reports_its_transactions_and_tps() {
        let report = "pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: /tmp/ceiling.sql
scaling factor: 1
query mode: prepared
number of clients: 1
number of threads: 1
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 1712
number of failed transactions: 0 (0.000%)
latency average = 1.168 ms
initial connection time = 9.928 ms
tps = 856.123456 (without initial connection time)
";
        assert_eq!(parse(report), Some((1_712, 856.123456)));
        assert_eq!(parse("pgbench: error: connection failed"), None);
    }

    #[test]
    fn the_script_takes_64_units_and_inserts_64_orders_in_one_statement() {
        let code: String = SCRIPT
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        let statements: Vec<&str> = code
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(statements.len(), 1, "{statements:?}");
        let statement = statements[0];
        assert!(statement.contains(&format!("stock - {ORDERS_PER_COMMIT}")));
        assert!(statement.contains(&format!("generate_series(1, {ORDERS_PER_COMMIT})")));
        assert!(statement.contains(":product"));
    }
}
