//! `seckill`: a flash-sale service that sells limited stock to a flood of buyers.
//!
//! # Layout
//! - `settings`: every setting, from flags or environment (`seckill --help`).
//! - `startup`: [`startup::Application`] builds pools, runs migrations, binds the listener.
//! - `routes/`: one file per group of endpoints; parse input, call in, map errors.
//! - `domain`: checked input types (`ProductId`, `Quantity`, ...).
//! - `sale/`: the purchase path: what the instance knows (`catalog`), the per-product desk
//!   that sells in batches (`desk`, `batch`), the fenced write path (`fenced`), restock news.
//! - `redis_link`: Redis connections that may come up after the service does.
//! - `repository`: all SQL. The schema is in `../migrations`.
//! - `error`: `ApiError`, the one JSON error format.
//! - `metrics`, `telemetry`: Prometheus metrics and logs.
//!
//! It depends on the `distlock` crate for the Redis lock; nothing here depends on the load test.

pub mod domain;
mod error;
pub mod metrics;
pub mod reads;
pub mod redact;
pub mod redis_link;
pub mod repository;
mod routes;
pub mod sale;
pub mod settings;
pub mod startup;
pub mod telemetry;

pub use settings::{LockStrategy, Settings};
pub use startup::Application;

/// The migrations in `../migrations`, embedded; shared by the service and its tests.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Run the service until it is asked to stop: what the `seckill` binary does.
///
/// # Errors
/// Start-up failures (see [`Application::build`]) and server I/O errors.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    telemetry::init(settings.log_format);
    let app = Application::build(settings).await?;
    // One plain line for whoever started us with BIND_ADDR port 0 (the load test's demo).
    println!("listening on {}", app.address());
    app.run_until_stopped().await?;
    Ok(())
}
