//! Start-up fails fast, with a message that names the problem.

use std::time::Duration;

use sqlx::PgPool;

use crate::helpers::{settings, shared_redis_url};

async fn build_error(settings: seckill::Settings, pool: Option<PgPool>) -> String {
    let built = match pool {
        Some(pool) => seckill::Application::build_with_pool(settings, pool).await,
        None => seckill::Application::build(settings).await,
    };
    match built {
        Ok(_) => panic!("the app started with bad settings"),
        Err(error) => format!("{error:#}"),
    }
}

#[tokio::test]
async fn an_unreachable_postgres_stops_start_up_with_a_clear_message() {
    let mut settings = settings(&shared_redis_url(), "");
    settings.database.url = format!(
        "postgres://postgres@127.0.0.1:{}/nowhere",
        testkit::free_port()
    )
    .into();
    let message = build_error(settings, None).await;
    assert!(
        message.contains("cannot connect to PostgreSQL"),
        "{message}"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn an_unreachable_redis_stops_start_up_with_a_clear_message(pool: PgPool) {
    let url = format!("redis://127.0.0.1:{}", testkit::free_port());
    let message = build_error(settings(&url, ""), Some(pool)).await;
    assert!(message.contains("cannot connect to Redis"), "{message}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_zero_lock_ttl_is_refused_at_start_up(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), "");
    settings.lock.ttl = Duration::from_millis(0);
    let message = build_error(settings, Some(pool)).await;
    assert!(message.contains("LOCK_TTL_MS"), "{message}");
}

#[test]
fn the_command_line_refuses_invalid_settings() {
    use clap::Parser;
    for args in [
        vec!["seckill"], // DATABASE_URL missing
        vec!["seckill", "--database-url", "x", "--lock-ttl-ms", "0"],
        vec!["seckill", "--database-url", "x", "--max-quantity", "0"],
        vec![
            "seckill",
            "--database-url",
            "x",
            "--lock-strategy",
            "consul",
        ],
        vec![
            "seckill",
            "--database-url",
            "x",
            "--bind-addr",
            "not-an-address",
        ],
        vec!["seckill", "--database-url", "x", "--work-ms=-5"],
        vec!["seckill", "--database-url", "x", "--lock-wait-ms", "0"],
        vec!["seckill", "--database-url", "x", "--batch-max", "0"],
        vec!["seckill", "--database-url", "x", "--queue-max", "0"],
        vec![
            "seckill",
            "--database-url",
            "x",
            "--pg-lock-timeout-ms",
            "0",
        ],
    ] {
        // The environment must not supply what a case leaves out.
        if std::env::var_os("DATABASE_URL").is_some() && args.len() == 1 {
            continue;
        }
        assert!(
            seckill::Settings::try_parse_from(&args).is_err(),
            "{args:?}"
        );
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn redlock_without_masters_stops_start_up_with_a_clear_message(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), "");
    settings.lock.strategy = seckill::LockStrategy::Redlock;
    let message = build_error(settings, Some(pool)).await;
    assert!(message.contains("REDLOCK_URLS"), "{message}");
}

/// An empty, blank or short admin token stops start up with a message naming it.
#[test]
fn empty_blank_or_short_admin_token_stops_start_up_naming_it() {
    for token in ["", "   ", "short-token"] {
        let mut settings = settings(&shared_redis_url(), "");
        settings.http.admin_token = Some(token.into());
        let why = settings.check().expect_err("a weak token was accepted");
        assert!(why.contains("ADMIN_TOKEN"), "{why}");
    }
}

#[test]
fn a_weak_admin_token_in_the_environment_is_refused_without_being_shown() {
    // The real binary, so the environment is its own.
    for token in ["", "tooshort-secret"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
            .env("DATABASE_URL", "postgres://nowhere")
            .env("ADMIN_TOKEN", token)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains("ADMIN_TOKEN"), "{stderr}");
        if !token.is_empty() {
            assert!(!stderr.contains(token), "the token was printed: {stderr}");
        }
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn work_that_would_outlast_postgres_idle_timeout_is_refused(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), "");
    settings.sale.work = Duration::from_millis(5_000);
    settings.database.idle_in_transaction_timeout = Duration::from_millis(1_000);
    let message = build_error(settings, Some(pool)).await;
    assert!(
        message.contains("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS"),
        "{message}"
    );
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn a_hold_as_long_as_the_buyers_wait_is_refused(pool: PgPool) {
    let mut settings = settings(&shared_redis_url(), "");
    settings.sale.hold = Some(Duration::from_millis(1_000));
    settings.lock.wait = Duration::from_millis(1_500);
    let message = build_error(settings, Some(pool)).await;
    assert!(message.contains("HOLD_MS"), "{message}");
}
