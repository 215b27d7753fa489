//! `seckill`: a flash-sale service that sells limited stock to a flood of buyers.
//!
//! # One purchase, file by file
//! Read these in order to follow `POST /api/products/{id}/purchase` under the default
//! strategy (`LOCK_STRATEGY=redis`), from the request to its answer:
//! 1. `startup.rs`: how the pieces are built from the settings and handed to the server;
//!    `routes/mod.rs`: which handler serves which route.
//! 2. `routes/buyer.rs`: the client's address is within its limit and the buyer's token is
//!    valid (`limits.rs`, `identity.rs`); `routes/purchase.rs`: the handler checks its input
//!    (`domain.rs`) and calls [`sale::Sale::purchase`].
//! 3. `sale/mod.rs`: `Sale::purchase` answers a known sold-out, or a product not yet open,
//!    from memory (`sale/catalog.rs`), or queues the purchase at its product's desk and waits for the
//!    answer.
//! 4. `sale/desk/mod.rs`: the desk, one queue and one leader task per product; the leader
//!    takes what waits as one batch.
//! 5. `sale/desk/locked.rs`: the leader takes the product's lock (a `distlock::Locker`, built
//!    in `sale/exclusion.rs`), sells batches while it holds it, and gives it back.
//! 6. `sale/fenced.rs`: `Holder::sell` allocates the batch and writes it with the lock's
//!    fence, in one statement (`repository/sale.rs`, `sell_as_holder`), which PostgreSQL
//!    refuses when a newer holder wrote first.
//! 7. Back in the desk, each buyer gets their own answer; the handler maps it to `201` and
//!    the order, or to an error (`error.rs`: `ApiError`, the one JSON error format).
//!
//! The strategies without a lock of ours take `sale/batch.rs` at step 5 instead: one
//! transaction per batch.
//!
//! # Layout
//! - `settings/`: every setting, from flags or environment (`seckill --help`), in seven
//!   groups (`groups.rs`, `http.rs`, `buyers.rs`), with their ranges (`range.rs`) and the rules between them (`rules.rs`).
//! - `startup`: [`startup::Application`] builds pools, has the schema made, binds the two
//!   listeners: the buyers' (`BIND_ADDR`) and the operators' (`OPS_BIND_ADDR`).
//! - `schema`: who makes the database schema (`DATABASE_MIGRATION_URL`, `--migrate-only`),
//!   and whether it is made.
//! - `routes/`: one file per group of endpoints; parse input, call in, map errors.
//!   `routes/mod.rs` says which routes each listener serves (`routes::Side`); `body`
//!   reads a JSON body within a deadline.
//! - `domain`: checked input types (`ProductId`, `Quantity`, ...).
//! - `identity`: who is buying (a buyer's JWT); `limits`: how often one buyer or one
//!   address may try. `routes/buyer.rs` applies both before a purchase's body is read.
//! - `sale/`: the purchase path: what the instance knows (`catalog`), the per-product desk
//!   that sells in batches (`desk/`, `batch`), how instances are kept apart and its lock
//!   backends connected (`exclusion`), the fenced write path (`fenced`), restock news
//!   (`restocks`).
//! - `reads`: the public reads (a product's books, order look-ups), on a pool of their own
//!   and shared while they run.
//! - `redis_link`: Redis connections that may come up after the service does.
//! - `repository/`: all SQL, by what it serves: the sale's statements (`sale.rs`), the admin
//!   writes (`admin.rs`), the reads (`reads.rs`). The schema is in `../migrations`.
//! - `error`: `ApiError`, the one JSON error format.
//! - `metrics`, `telemetry`: Prometheus metrics and logs.
//! - `redact`: passwords kept out of messages.
//!
//! It depends on the `distlock` crate for the locks; nothing here depends on the load test.

pub mod domain;
mod error;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod reads;
pub mod redact;
pub mod redis_link;
pub mod repository;
mod routes;
pub mod sale;
pub mod schema;
pub mod settings;
pub mod startup;
pub mod telemetry;

pub use settings::{LockStrategy, Settings};
pub use startup::Application;

/// The migrations in `../migrations`, embedded; shared by the service and its tests.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Run the service until it is asked to stop: what the `seckill` binary does. With
/// `MIGRATE_ONLY`, make the database schema and return instead.
///
/// # Errors
/// Start-up failures (see [`Application::build`]) and server I/O errors.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    telemetry::init(settings.log_format);
    if settings.database.migrate_only {
        schema::migrate_only(&settings).await?;
        println!("the database schema is current");
        return Ok(());
    }
    let app = Application::build(settings).await?;
    // Plain lines for whoever started us with port 0 (the load test's instances).
    println!("listening on {}", app.address());
    println!("operations on {}", app.operations_address());
    app.run_until_stopped().await?;
    Ok(())
}
