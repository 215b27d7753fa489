//! Start-up fails fast, with a message that names the problem; secrets can come from files.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::helpers::{build_error, settings, shared_redis_url, url_of};

#[tokio::test]
async fn an_unreachable_postgres_stops_start_up_with_a_clear_message() {
    let mut settings = settings(&shared_redis_url(), "");
    settings.database.url = Some(
        format!(
            "postgres://postgres@127.0.0.1:{}/nowhere",
            testkit::free_port()
        )
        .into(),
    );
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

/// The real binary, reading its database URL and its admin tokens from files, as a
/// deployment that keeps secrets out of the environment would run it; stopped by its pid
/// when dropped.
struct FromFiles {
    child: std::process::Child,
    /// The operators' listener.
    address: String,
    /// Its stdout (its log, as JSON lines) since it said where it listens.
    said: Arc<Mutex<Vec<String>>>,
}

impl Drop for FromFiles {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_from_files(database_url_file: &Path, admin_token_file: &Path) -> FromFiles {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .env_remove("DATABASE_URL")
        .env_remove("ADMIN_TOKEN")
        .env("DATABASE_URL_FILE", database_url_file)
        .env("ADMIN_TOKEN_FILE", admin_token_file)
        .env("BIND_ADDR", "127.0.0.1:0")
        .env("OPS_BIND_ADDR", "127.0.0.1:0")
        .env("LOCK_STRATEGY", "pg-atomic")
        .env("BUYER_JWT_SECRET", crate::helpers::BUYER_SECRET)
        .env("REDIS_URL", shared_redis_url())
        .env("REDIS_KEY_PREFIX", testkit::unique_prefix("files"))
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    // The operators' listener, where the admin routes are.
    let address = loop {
        let line = lines
            .next()
            .expect("the service printed its addresses")
            .unwrap();
        if let Some(address) = line.strip_prefix("operations on ") {
            break address.to_owned();
        }
    };
    // Keep reading stdout, so the service never blocks on a full pipe; keep what it says.
    let said = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&said);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap().push(line);
        }
    });
    FromFiles {
        child,
        address,
        said,
    }
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn admin_tokens_rotate_through_their_file_without_a_restart(
    _pool_options: sqlx::postgres::PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange: secrets in files only; the first token in the token file.
    let dir = std::env::temp_dir().join(testkit::unique_prefix("secret-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let (url_file, token_file) = (dir.join("database-url"), dir.join("admin-token"));
    std::fs::write(&url_file, format!("{}\n", url_of(&connect))).unwrap();
    let (old, new) = ("old-admin-token-0123456789", "new-admin-token-0123456789");
    std::fs::write(&token_file, format!("{old}\n")).unwrap();
    let service = start_from_files(&url_file, &token_file);
    let client = reqwest::Client::new();
    let create = |token: &'static str| {
        client
            .post(format!("http://{}/api/products", service.address))
            .bearer_auth(token)
            .json(&serde_json::json!({"name": "Phone", "stock": 1}))
            .send()
    };
    let status = |token| async move { create(token).await.unwrap().status().as_u16() };
    assert_eq!((status(old).await, status(new).await), (201, 401));

    // Act and assert: both during the rotation, then only the new one.
    // TIMING: the file is looked at every second; 30 s leaves a busy machine room.
    std::fs::write(&token_file, format!("{new}\n{old}\n")).unwrap();
    let both = until(Duration::from_secs(30), || async {
        status(new).await == 201
    })
    .await;
    assert!(both, "the new token was not accepted within 30 s");
    assert_eq!(status(old).await, 201);
    std::fs::write(&token_file, format!("{new}\n")).unwrap();
    let retired = until(Duration::from_secs(30), || async {
        status(old).await == 401
    })
    .await;
    assert!(retired, "the old token was still accepted after 30 s");

    // A file that went bad keeps the tokens read last; a good one after it is read.
    std::fs::write(&token_file, "short\n").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(new).await, 201);
    std::fs::write(&token_file, format!("{old}\n")).unwrap();
    let back = until(Duration::from_secs(30), || async {
        status(old).await == 201
    })
    .await;
    assert!(back, "the watcher stopped after a bad file");
    assert_eq!(status(new).await, 401);
    drop(service);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether `check` came true within `within`, asked every 100 ms.
async fn until<F: std::future::Future<Output = bool>>(
    within: Duration,
    check: impl Fn() -> F,
) -> bool {
    let started = tokio::time::Instant::now();
    while started.elapsed() < within {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[test]
fn the_demo_admin_token_stops_start_up_outside_the_demo() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
        .env("DATABASE_URL", "postgres://nowhere")
        .env("ADMIN_TOKEN", seckill::settings::DEMO_ADMIN_TOKEN)
        .env_remove("ALLOW_DEMO_ADMIN_TOKEN")
        .env_remove("ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("docker-compose.yml"), "{stderr}");
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_access_log_follows_a_request_by_its_id_and_never_writes_a_token(
    _pool_options: sqlx::postgres::PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Arrange
    let dir = std::env::temp_dir().join(testkit::unique_prefix("access-log"));
    std::fs::create_dir_all(&dir).unwrap();
    let (url_file, token_file) = (dir.join("database-url"), dir.join("admin-token"));
    std::fs::write(&url_file, url_of(&connect)).unwrap();
    let admin = "access-log-admin-token-0123456789";
    std::fs::write(&token_file, admin).unwrap();
    let service = start_from_files(&url_file, &token_file);
    let client = reqwest::Client::new();
    let buyer = crate::helpers::buyer_token(9);

    // Act: a product made with an id the proxy chose; a purchase, and a refused admin
    // request, with ids made here.
    let created = client
        .post(format!("http://{}/api/products", service.address))
        .bearer_auth(admin)
        .header("X-Request-Id", "complaint-42")
        .json(&serde_json::json!({"name": "Phone", "stock": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.headers()["x-request-id"], "complaint-42");
    let id = created.json::<serde_json::Value>().await.unwrap()["id"].clone();
    let bought = client
        .post(format!(
            "http://{}/api/products/{id}/purchase",
            service.address
        ))
        .bearer_auth(&buyer)
        .header("X-Request-Id", "not a usable id")
        .json(&serde_json::json!({"quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(bought.status(), 201);
    let made = bought.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_ne!(made, "not a usable id");
    let refused = client
        .post(format!("http://{}/api/products", service.address))
        .bearer_auth("a-wrong-admin-token-0123456789")
        .json(&serde_json::json!({"name": "X", "stock": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let refused_id = refused.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    // TIMING: the lines are written as the answers go; a second is plenty.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Assert: one line per request, found by its id, and no token anywhere in the log.
    let said = service.said.lock().unwrap().clone();
    let line_of = |id: &str| -> serde_json::Value {
        let line = said
            .iter()
            .find(|line| line.contains(&format!("\"request_id\":\"{id}\"")))
            .unwrap_or_else(|| panic!("no access line for {id} in {said:#?}"));
        serde_json::from_str(line).unwrap()
    };
    let line = line_of("complaint-42");
    assert_eq!(line["fields"]["status"], 201);
    assert_eq!(line["fields"]["path"], "/api/products");
    assert_eq!(line_of(&made)["fields"]["status"], 201);
    assert_eq!(line_of(&refused_id)["fields"]["status"], 401);
    for secret in [admin, buyer.as_str(), "a-wrong-admin-token-0123456789"] {
        assert!(
            !said.iter().any(|line| line.contains(secret)),
            "a token was logged"
        );
    }
    drop(service);
    std::fs::remove_dir_all(&dir).unwrap();
}
