//! `docker-compose.yml` checked against reality: every setting it gives an app is a real
//! `seckill` setting, its health checks hit routes that answer, its URLs name services it
//! defines, the lock profiles (`redlock`, `zookeeper`, `etcd`) add the servers the apps are
//! pointed at, its Redis admits the apps' ACL user alone (run by a private `redis-server`
//! with the stack's command), and the load test's flags and targets exist. The `monitoring` profile's files
//! (deploy/) are checked the same way: Prometheus scrapes the app services, its rules use
//! metrics an instance serves, and every dashboard panel shows a rule that exists. Running
//! the stack itself is `scripts/compose-smoke` (docs/stack.md): too slow for a test.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser as _};
use serde_norway::Value;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(relative: &str) -> Value {
    yaml_at(&root().join(relative))
}

fn yaml_at(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut value: Value = serde_norway::from_str(&text).expect("valid YAML");
    value.apply_merge().expect("valid merge keys");
    value
}

fn compose() -> Value {
    yaml("docker-compose.yml")
}

fn services(compose: &Value) -> &serde_norway::Mapping {
    compose["services"].as_mapping().expect("a services map")
}

/// The services that run the seckill binary.
fn app_services(compose: &Value) -> Vec<(String, &Value)> {
    services(compose)
        .iter()
        .filter(|(_, s)| s["command"][0].as_str() == Some("seckill"))
        .map(|(name, s)| (name.as_str().unwrap().to_owned(), s))
        .collect()
}

/// `${NAME:-default}` as compose resolves it with NAME unset; anything else as it is.
fn with_defaults(value: &str) -> String {
    with_env(value, &[])
}

/// `${NAME:-default}` as compose resolves it where `set` gives the variables set (to
/// something not empty); anything else as it is.
fn with_env(value: &str, set: &[(&str, &str)]) -> String {
    match value
        .strip_prefix("${")
        .and_then(|v| v.strip_suffix('}'))
        .and_then(|v| v.split_once(":-"))
    {
        Some((name, default)) => set
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(default, |(_, v)| v)
            .to_owned(),
        None => value.to_owned(),
    }
}

/// Every `${NAME:-default}` inside `value` as compose resolves it with NAME unset.
fn with_defaults_inside(value: &str) -> String {
    with_env_inside(value, &[])
}

/// Every `${NAME:-default}` inside `value` as compose resolves it with `set` (as
/// [`with_env`]).
fn with_env_inside(value: &str, set: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closed ${...}") + start;
        out.push_str(&with_env(&rest[start..=end], set));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The host a URL names (`postgres://user:pw@host:5432/db` → `host`).
fn url_host(url: &str) -> String {
    let rest = url.split("://").nth(1).expect("a URL");
    let authority = rest.split('/').next().unwrap();
    let host_port = authority.rsplit('@').next().unwrap();
    host_port.split(':').next().unwrap().to_owned()
}

/// The port of an address (`0.0.0.0:8008` → `8008`).
fn port_of(address: &str) -> String {
    address.rsplit(':').next().unwrap().to_owned()
}

/// A service's mounts, as written (`./source:/target:ro`).
fn volumes_of(service: &Value) -> Vec<&str> {
    service["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

/// A service's environment as `seckill` flags (`LOCK_TTL_MS: 5000` → `--lock-ttl-ms 5000`).
fn as_flags(env: &serde_norway::Mapping) -> Vec<String> {
    let command = seckill::Settings::command();
    let mut flags = vec!["seckill".to_owned()];
    for (key, value) in env {
        let key = key.as_str().unwrap();
        let value = value
            .as_str()
            .map(with_defaults_inside)
            .unwrap_or_else(|| serde_norway::to_string(value).unwrap().trim().to_owned());
        if let Some(arg) = command
            .get_arguments()
            .find(|arg| arg.get_env().is_some_and(|env| env == key))
        {
            flags.push(format!("--{}", arg.get_long().unwrap()));
            flags.push(value);
        }
    }
    flags
}

/// Services that use an image some service builds, but that compose could try to pull
/// (docker/compose#8723: `up --build` pulls before it builds, and the pull of a local tag
/// fails with "pull access denied").
fn pullable_local_images(compose: &Value) -> Vec<String> {
    let built: BTreeSet<&str> = services(compose)
        .values()
        .filter(|s| !s["build"].is_null())
        .filter_map(|s| s["image"].as_str())
        .collect();
    services(compose)
        .iter()
        .filter(|(_, s)| s["image"].as_str().is_some_and(|i| built.contains(i)))
        .filter(|(_, s)| s["build"].is_null() || s["pull_policy"].as_str() != Some("build"))
        .map(|(name, _)| name.as_str().unwrap().to_owned())
        .collect()
}

/// A seckill instance with the default settings on a free port, its Redis keys under a
/// prefix of its own (deleted when the returned guard drops).
/// An instance on free ports, and the port of its operators' listener (where the health
/// check and Prometheus go).
async fn spawn_instance(pool: PgPool, label: &str) -> (u16, testkit::PrefixCleanup) {
    let mut settings =
        seckill::Settings::try_parse_from(["seckill", "--database-url", "unused"]).unwrap();
    settings.http.bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.http.ops_bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.identity.secret = Some(loadtest::buyers::DEMO_BUYER_SECRET.into());
    settings.redis.key_prefix = testkit::unique_prefix(label);
    if let Ok(url) = std::env::var("REDIS_URL") {
        settings.redis.url = url.into();
    }
    let cleanup = testkit::PrefixCleanup::new(settings.redis.url(), &settings.redis.key_prefix);
    let app = seckill::Application::build_with_pool(settings, pool)
        .await
        .unwrap();
    let ops_port = app.operations_address().port();
    tokio::spawn(app.run_until_stopped());
    (ops_port, cleanup)
}

fn seckill_env_settings() -> BTreeSet<String> {
    seckill::Settings::command()
        .get_arguments()
        .filter_map(|arg| arg.get_env().map(|env| env.to_string_lossy().into_owned()))
        .collect()
}

#[test]
fn the_stack_runs_three_app_instances() {
    let compose = compose();
    assert_eq!(app_services(&compose).len(), 3);
}

#[test]
fn every_app_environment_variable_is_a_real_seckill_setting() {
    let compose = compose();
    let known = seckill_env_settings();
    for (name, service) in app_services(&compose) {
        let env = service["environment"]
            .as_mapping()
            .expect("an environment map");
        for key in env.keys() {
            let key = key.as_str().unwrap();
            assert!(
                known.contains(key) || key == "RUST_LOG",
                "{name} sets {key}, which `seckill --help` does not know (known: {known:?})"
            );
        }
        assert!(
            env.contains_key("DATABASE_URL"),
            "{name}: DATABASE_URL is required"
        );
    }
}

#[test]
fn urls_in_the_stack_name_services_it_defines() {
    let compose = compose();
    let defined: BTreeSet<String> = services(&compose)
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    for (name, service) in services(&compose) {
        let Some(env) = service["environment"].as_mapping() else {
            continue;
        };
        for (key, value) in env {
            let (key, value) = (key.as_str().unwrap(), value.as_str().unwrap_or_default());
            if key.ends_with("_URL") {
                // As compose resolves it: by default, and on the `ha` database.
                for set in [&[][..], &[("DATABASE_HOST", "haproxy")][..]] {
                    let host = url_host(&with_env_inside(value, set));
                    assert!(
                        defined.contains(&host),
                        "{name:?}: {key} points at undefined service {host} ({set:?})"
                    );
                }
            }
        }
        for dependency in service["depends_on"].as_mapping().into_iter().flatten() {
            let (dep, how) = dependency;
            assert!(
                defined.contains(dep.as_str().unwrap()),
                "{name:?} depends on an undefined service"
            );
            assert_eq!(
                how["condition"].as_str(),
                Some("service_healthy"),
                "{name:?} -> {dep:?}"
            );
        }
    }
}

#[test]
fn the_load_test_targets_every_app_and_uses_real_flags() {
    let compose = compose();
    let loadtest = &services(&compose)["loadtest"];
    let command = loadtest_command(&compose, &[]);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    assert_eq!(command[0], "loadtest");

    // Every flag it passes is one the binary parses.
    let parsed = loadtest::cli::Cli::try_parse_from(&command);
    assert!(parsed.is_ok(), "{:?}", parsed.err());

    // It attacks exactly the app services, on their container port.
    let hosts_at = command.iter().position(|a| *a == "--hosts").unwrap() + 1;
    let mut targets: Vec<String> = command[hosts_at]
        .split(',')
        .map(|url| {
            url.trim_start_matches("http://")
                .trim_end_matches(":8080")
                .to_owned()
        })
        .collect();
    let mut apps: Vec<String> = app_services(&compose).into_iter().map(|(n, _)| n).collect();
    targets.sort();
    apps.sort();
    assert_eq!(targets, apps);
    for app in &apps {
        let bind = services(&compose)[app.as_str()]["environment"]["BIND_ADDR"]
            .as_str()
            .unwrap();
        assert!(bind.ends_with(":8080"), "{app} listens on {bind}");
    }
    // It creates the product on an app's operators' listener.
    let ops_at = command.iter().position(|a| *a == "--ops-host").unwrap() + 1;
    let (ops_app, ops_port) = command[ops_at]
        .trim_start_matches("http://")
        .split_once(':')
        .unwrap();
    assert!(apps.iter().any(|app| app == ops_app), "{}", command[ops_at]);
    let ops_bind = services(&compose)[ops_app]["environment"]["OPS_BIND_ADDR"]
        .as_str()
        .unwrap();
    assert!(
        ops_bind.ends_with(&format!(":{ops_port}")),
        "{ops_app} operators on {ops_bind}"
    );
    let env = loadtest["environment"].as_mapping().unwrap();
    assert!(env.contains_key("ADMIN_TOKEN") && env.contains_key("DATABASE_URL"));
}

/// The load test's command as compose runs it with the variables `set`.
fn loadtest_command(compose: &Value, set: &[(&str, &str)]) -> Vec<String> {
    services(compose)["loadtest"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| with_env_inside(v.as_str().unwrap(), set))
        .collect()
}

/// Each app's health check, run as the container runs it (bash, with the port moved to a
/// real instance's operators' listener): it passes there, and fails where nothing answers.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_health_checks_pass_on_a_real_instance_and_fail_without_one(pool: PgPool) {
    let compose = compose();
    let (port, _cleanup) = spawn_instance(pool, "compose").await;
    let check = |script: String| async move {
        tokio::process::Command::new("bash")
            .args(["-c", &script])
            .status()
            .await
            .unwrap()
            .success()
    };

    for (name, service) in app_services(&compose) {
        let test: Vec<&str> = service["healthcheck"]["test"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            test[..3],
            ["CMD", "bash", "-c"],
            "{name}: the image has bash, not curl"
        );
        // The operators' listener, where /readyz is.
        let ops = service["environment"]["OPS_BIND_ADDR"].as_str().unwrap();
        let at = format!("/dev/tcp/127.0.0.1/{}", ops.rsplit(':').next().unwrap());
        assert!(
            test[3].contains(&at) && test[3].contains("/readyz"),
            "{name}: {}",
            test[3]
        );
        let on = |port: u16| test[3].replace(&at, &format!("/dev/tcp/127.0.0.1/{port}"));

        assert!(
            check(on(port)).await,
            "{name}: the check fails on a ready instance"
        );
        assert!(
            !check(on(testkit::free_port())).await,
            "{name}: the check passes on nothing"
        );
    }
}

#[test]
fn the_redlock_profile_has_three_masters_that_the_apps_name() {
    let compose = compose();
    let masters = profile_services(&compose, "redlock");
    assert_eq!(masters.len(), 3, "{masters:?}");
    for (name, service) in app_services(&compose) {
        let urls = service["environment"]["REDLOCK_URLS"].as_str().unwrap();
        for master in &masters {
            assert!(
                with_defaults_inside(urls).contains(&format!("@{master}:6379")),
                "{name} misses {master}"
            );
        }
        let parsed = seckill::Settings::try_parse_from([
            "seckill",
            "--database-url",
            "x",
            "--lock-strategy",
            "redlock",
            "--redlock-urls",
            urls,
        ])
        .unwrap();
        assert_eq!(parsed.lock.redlock_urls.len(), 3);
    }
}

/// A Redis service of the stack started as compose starts it (its `command`, resolved with
/// the variables `set`), on a free port of this machine's loopback. SIGKILLed and reaped when
/// dropped.
struct StackRedis {
    child: std::process::Child,
    port: u16,
}

impl StackRedis {
    fn start(service: &str, set: &[(&str, &str)]) -> Self {
        let compose = compose();
        let command: Vec<String> = services(&compose)[service]["command"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{service} has no command"))
            .iter()
            .map(|arg| with_env_inside(arg.as_str().unwrap(), set))
            .collect();
        assert_eq!(command[0], "redis-server", "{service}");
        let login = apps_redis_user(&compose, set);
        // A port taken between the pick and the bind costs a retry on another.
        for _ in 0..3 {
            let port = testkit::free_port();
            let mut child = std::process::Command::new("redis-server")
                .args(&command[1..])
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                if Self::is_ours(port, &login, child.id()) {
                    return Self { child, port };
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{service}: redis-server did not start on any of three ports");
    }

    /// The Redis that answers on `port`, logged in as the apps' `login`, is process `pid`
    /// (not another test's server that took the port first).
    fn is_ours(port: u16, login: &str, pid: u32) -> bool {
        let url = format!("redis://{login}127.0.0.1:{port}");
        let info = redis::Client::open(url).and_then(|client| {
            let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
            conn.set_read_timeout(Some(Duration::from_secs(1)))?;
            redis::cmd("INFO").arg("server").query::<String>(&mut conn)
        });
        info.is_ok_and(|info| {
            info.lines()
                .any(|l| l.trim_end() == format!("process_id:{pid}"))
        })
    }

    /// Its URL, as `user:password@` says (empty: no authentication).
    fn url(&self, user_and_password: &str) -> String {
        format!("redis://{user_and_password}127.0.0.1:{}", self.port)
    }
}

impl Drop for StackRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `command` on a new connection to the Redis at `url`: its error, connecting included, as
/// text.
fn redis_says(url: &str, command: &redis::Cmd) -> Result<redis::Value, String> {
    let mut conn = redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .map_err(|e| e.to_string())?;
    command.query(&mut conn).map_err(|e| e.to_string())
}

/// The `user:password@` of the apps' `REDIS_URL`, as compose resolves it with `set`.
fn apps_redis_user(compose: &Value, set: &[(&str, &str)]) -> String {
    let (_, app) = &app_services(compose)[0];
    let url = with_env_inside(app["environment"]["REDIS_URL"].as_str().unwrap(), set);
    let (user, host) = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split_once('@'))
        .unwrap_or_else(|| panic!("REDIS_URL {url} names no user"));
    assert_eq!(host, "redis:6379");
    format!("{user}@")
}

/// The stack's Redis (and each Redlock master, which runs the same command) lets a client
/// that has not authenticated do nothing: not hold a lock key, not publish a forged restock
/// message, not even PING. The apps' user does what the sale does, and not Redis's dangerous
/// commands (wiping every database, reconfiguring the server); it can still delete any key. The health check logs in; `REDIS_DEFAULT_USER=on` lets the
/// test suite in without a password.
#[test]
fn the_stacks_redis_admits_only_the_apps_user_unless_told_the_tests_come() {
    let compose = compose();
    let all = services(&compose);
    for master in profile_services(&compose, "redlock") {
        assert_eq!(
            all[master.as_str()]["command"],
            all["redis"]["command"],
            "{master}"
        );
        assert_eq!(
            all[master.as_str()]["healthcheck"],
            all["redis"]["healthcheck"],
            "{master}"
        );
    }
    let user = apps_redis_user(&compose, &[]);
    let redis = StackRedis::start("redis", &[]);
    let (anyone, apps) = (redis.url(""), redis.url(&user));

    let forged = redis::cmd("PUBLISH")
        .arg("restocked")
        .arg("1:9223372036854775807")
        .clone();
    let lock = redis::cmd("SET").arg("lock_sale_1").arg("mine").clone();
    for command in [redis::cmd("PING"), lock.clone(), forged.clone()] {
        let refused = redis_says(&anyone, &command).unwrap_err();
        assert!(refused.contains("NOAUTH"), "{refused}");
    }
    let wrong = redis.url("seckill:not-the-password@");
    assert!(redis_says(&wrong, &redis::cmd("PING")).is_err());

    let script = redis::cmd("EVAL")
        .arg("return redis.call('GET', KEYS[1])")
        .arg(1)
        .arg("lock_sale_1")
        .clone();
    let info = redis::cmd("INFO").arg("server").clone();
    for command in [lock, script, forged, info] {
        redis_says(&apps, &command).unwrap_or_else(|e| panic!("{command:?}: {e}"));
    }
    let config = redis::cmd("CONFIG").arg("SET").arg("save").arg("").clone();
    let keys = redis::cmd("KEYS").arg("*").clone();
    for command in [redis::cmd("FLUSHALL"), config, keys] {
        let refused = redis_says(&apps, &command).unwrap_err();
        assert!(
            refused.to_lowercase().contains("noperm"),
            "{command:?}: {refused}"
        );
    }

    // The health check, run as the container runs it with the port moved: redis-cli exits 0
    // on NOAUTH too, so it must read the PONG.
    let test: Vec<String> = all["redis"]["healthcheck"]["test"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| with_defaults_inside(v.as_str().unwrap()))
        .collect();
    assert_eq!(test[0], "CMD-SHELL");
    let check = |port: u16| {
        std::process::Command::new("sh")
            .args([
                "-c",
                &test[1].replace("redis-cli ", &format!("redis-cli -p {port} ")),
            ])
            .status()
            .unwrap()
            .success()
    };
    assert!(check(redis.port), "the check fails on the stack's Redis");
    let other = StackRedis::start("redis", &[("REDIS_PASSWORD", "another-password")]);
    assert!(!check(other.port), "the check passes without the password");

    let for_tests = StackRedis::start("redis", &[("REDIS_DEFAULT_USER", "on")]);
    let pong = redis_says(&for_tests.url(""), &redis::cmd("PING")).unwrap();
    assert_eq!(pong, redis::Value::SimpleString("PONG".into()));
}

/// Two apps as compose configures them, one under `redis` and one under `redlock`, each on
/// Redis servers started with the stack's commands: both start (the lock checks the server's
/// version with INFO), hear restock news (their /readyz says so) and sell as the ACL user.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_apps_sell_through_the_stacks_redis_as_its_user(pool: PgPool) {
    let compose = compose();
    let (name, app) = &app_services(&compose)[0];
    let main = StackRedis::start("redis", &[]);
    let masters: Vec<(String, StackRedis)> = profile_services(&compose, "redlock")
        .into_iter()
        .map(|m| {
            let server = StackRedis::start(&m, &[]);
            (m, server)
        })
        .collect();
    let client = reqwest::Client::new();
    for strategy in ["redis", "redlock"] {
        let mut service = (*app).clone();
        let env = service["environment"].as_mapping_mut().unwrap();
        // The pool below is the database; nothing to migrate.
        env.remove("DATABASE_MIGRATION_URL");
        for key in ["REDIS_URL", "REDLOCK_URLS"] {
            let mut urls = env[key]
                .as_str()
                .unwrap()
                .replace("@redis:6379", &format!("@127.0.0.1:{}", main.port));
            for (master, server) in &masters {
                urls = urls.replace(
                    &format!("@{master}:6379"),
                    &format!("@127.0.0.1:{}", server.port),
                );
            }
            env.insert(key.into(), urls.into());
        }
        let admin_token = with_defaults(env["ADMIN_TOKEN"].as_str().unwrap());
        let mut settings = app_settings(name, &service, strategy);
        settings.http.bind_addr = "127.0.0.1:0".parse().unwrap();
        settings.http.ops_bind_addr = "127.0.0.1:0".parse().unwrap();
        let instance = seckill::Application::build_with_pool(settings, pool.clone())
            .await
            .unwrap_or_else(|e| panic!("{strategy}: {e:#}"));
        let buyers = format!("http://{}", instance.address());
        let ops = format!("http://{}", instance.operations_address());
        tokio::spawn(instance.run_until_stopped());

        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = client.get(format!("{ops}/readyz")).send().await.unwrap();
            let status = ready.status();
            let body: serde_json::Value = ready.json().await.unwrap();
            if status == 200 && body["redis"] == true && body["restock_news"] == true {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{strategy}: not ready with Redis and its news: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let product = loadtest::attack::create_product(&ops, &admin_token, 1)
            .await
            .unwrap();
        let mut answers = Vec::new();
        for buyer in [1_i64, 2] {
            let answer = client
                .post(format!("{buyers}/api/products/{product}/purchase"))
                .bearer_auth(loadtest::buyers::token(buyer))
                .json(&serde_json::json!({"user_id": buyer, "quantity": 1}))
                .send()
                .await
                .unwrap();
            answers.push(answer.status().as_u16());
        }
        assert_eq!(answers, [201, 409], "{strategy}");
    }
}

/// The app settings of `service` as `seckill` would parse them with `LOCK_STRATEGY` set to
/// `strategy` in compose's environment.
fn app_settings(name: &str, service: &Value, strategy: &str) -> seckill::Settings {
    let mut env = service["environment"].as_mapping().unwrap().clone();
    let lock_strategy = env
        .get_mut("LOCK_STRATEGY")
        .unwrap_or_else(|| panic!("{name} does not take LOCK_STRATEGY from the environment"));
    assert!(
        lock_strategy
            .as_str()
            .is_some_and(|v| v.starts_with("${LOCK_STRATEGY:-")),
        "{name}: LOCK_STRATEGY is {lock_strategy:?}, not compose's environment"
    );
    *lock_strategy = Value::from(strategy);
    let flags = as_flags(&env);
    let settings =
        seckill::Settings::try_parse_from(&flags).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Err(error) = settings.check() {
        panic!("{name}: seckill would refuse to start under {strategy}: {error}");
    }
    settings
}

/// Every app waits for `server` to be healthy when its profile is on, and starts without it
/// when it is off; `server` has a health check to wait for.
fn apps_wait_for_the_optional(compose: &Value, server: &str) {
    let test = &services(compose)[server]["healthcheck"]["test"];
    assert!(
        test.as_sequence().is_some_and(|t| !t.is_empty()),
        "{server} has no health check"
    );
    for (name, service) in app_services(compose) {
        let dependency = &service["depends_on"][server];
        assert_eq!(
            dependency["condition"].as_str(),
            Some("service_healthy"),
            "{name} -> {server}"
        );
        assert_eq!(
            dependency["required"].as_bool(),
            Some(false),
            "{name} -> {server}"
        );
    }
}

/// The zookeeper profile has one server, the apps name it, and the sessions it grants fit the
/// apps' lease.
#[test]
fn the_zookeeper_profile_serves_the_apps_with_sessions_that_fit_the_lease() {
    let compose = compose();
    let servers = profile_services(&compose, "zookeeper");
    assert_eq!(servers, BTreeSet::from(["zookeeper".to_owned()]));
    apps_wait_for_the_optional(&compose, "zookeeper");
    let server = &services(&compose)["zookeeper"];
    assert!(
        server["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("zookeeper:3.")),
        "the official image"
    );
    // The image writes its zoo.cfg from these: without ZOO_SERVERS it serves on 2181; it
    // grants sessions of at most maxSessionTimeout, by default 20 ticks.
    let env = server["environment"]
        .as_mapping()
        .cloned()
        .unwrap_or_default();
    let setting = |key: &str| env.get(key).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(
        setting("ZOO_SERVERS"),
        None,
        "the client port is the image's 2181"
    );
    let tick_ms: u64 = setting("ZOO_TICK_TIME").map_or(2_000, |t| t.parse().unwrap());
    let extra = setting("ZOO_CFG_EXTRA").unwrap_or_default();
    let max_session_ms = extra
        .split_whitespace()
        .find_map(|entry| entry.strip_prefix("maxSessionTimeout="))
        .map_or(20 * tick_ms, |ms| ms.parse().unwrap());

    for (name, service) in app_services(&compose) {
        let settings = app_settings(&name, service, "zookeeper");
        for address in settings.lock.zookeeper_connect.split(',') {
            let (host, port) = address.split_once(':').expect("host:port");
            assert!(
                servers.contains(host),
                "{name}: {address} is not the profile's"
            );
            assert_eq!(port, "2181", "{name}: {address}");
        }
        assert!(
            settings.lock.zookeeper_session_timeout.as_millis() <= u128::from(max_session_ms),
            "{name}: asks for sessions of {} ms, the server grants at most {max_session_ms} ms \
             (and the apps refuse to start with less than LOCK_TTL_MS)",
            settings.lock.zookeeper_session_timeout.as_millis()
        );
    }
}

#[test]
fn the_etcd_profile_has_one_server_listening_where_the_apps_look_for_it() {
    let compose = compose();
    let servers = profile_services(&compose, "etcd");
    assert_eq!(servers, BTreeSet::from(["etcd".to_owned()]));
    apps_wait_for_the_optional(&compose, "etcd");
    let server = &services(&compose)["etcd"];
    let command: Vec<&str> = server["command"]
        .as_sequence()
        .expect("etcd's command line")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let flag = |name: &str| -> &str {
        command
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("etcd is started without --{name}"))
    };
    // etcd listens on localhost only unless told otherwise: the apps are other containers.
    let listen = flag("listen-client-urls");
    assert!(listen.starts_with("http://0.0.0.0:"), "{listen}");
    let port = listen.rsplit(':').next().unwrap();
    let advertised = flag("advertise-client-urls");

    for (name, service) in app_services(&compose) {
        let settings = app_settings(&name, service, "etcd");
        for endpoint in &settings.lock.etcd_endpoints {
            let authority = endpoint
                .strip_prefix("http://")
                .expect("an http:// endpoint");
            let (host, endpoint_port) = authority.split_once(':').expect("host:port");
            assert!(
                servers.contains(host),
                "{name}: {endpoint} is not the profile's"
            );
            assert_eq!(
                endpoint_port, port,
                "{name}: {endpoint}; etcd listens on {listen}"
            );
            assert_eq!(endpoint, advertised, "{name}: etcd advertises {advertised}");
        }
    }
}

/// The stages of the Dockerfile by name (`FROM ... AS <name>`), each with its text.
fn dockerfile_stages() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile");
    let dockerfile = std::fs::read_to_string(path).expect("a Dockerfile at the top of the repo");
    dockerfile
        .split("\nFROM ")
        .skip(1)
        .map(|stage| {
            let first = stage.lines().next().unwrap();
            let name = first.rsplit(" AS ").next().unwrap().trim().to_owned();
            (name, stage.to_owned())
        })
        .collect()
}

/// Every service built from the Dockerfile names a stage that holds the one binary it runs
/// and nothing else of the project's, and runs as a user other than root; `docker build .`
/// (the last stage) makes the service's image.
#[test]
fn each_image_holds_only_the_binary_its_service_runs_and_is_not_root() {
    let stages = dockerfile_stages();
    let compose = compose();
    let mut built = Vec::new();
    for (name, service) in services(&compose) {
        // The services built from this Dockerfile (the `ha` profile's members build from
        // deploy/patroni/).
        if service["build"]["context"].as_str() != Some(".") {
            continue;
        }
        let target = service["build"]["target"].as_str().expect("a build target");
        let (_, stage) = stages
            .iter()
            .find(|(stage, _)| stage == target)
            .unwrap_or_else(|| panic!("{name:?}: no stage {target}"));
        let binary = service["command"][0].as_str().expect("a command");
        let copied: Vec<&str> = ["seckill", "loadtest"]
            .into_iter()
            .filter(|b| stage.contains(&format!("target/release/{b}")))
            .collect();
        assert_eq!(
            copied,
            [binary],
            "{name:?}: stage {target} copies {copied:?}"
        );
        assert!(
            !stage.contains("curl"),
            "{name:?}: stage {target} installs curl"
        );
        let user = stage
            .lines()
            .find_map(|line| line.strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{name:?}: no USER in stage {target}"));
        assert_ne!(user.trim(), "root");
        built.push(target.to_owned());
    }
    assert!(built.contains(&"runtime".to_owned()) && built.contains(&"loadtest".to_owned()));
    let installs_curl = stages.iter().find(|(_, stage)| stage.contains("curl"));
    assert_eq!(
        installs_curl.map(|(name, _)| name),
        None,
        "no stage installs curl"
    );
    assert_eq!(
        stages.last().unwrap().0,
        "runtime",
        "docker build . makes the service"
    );
}

/// The apps migrate as the owner role and sell as the app role, which the database's init
/// script makes by running deploy/postgres/roles.sql (tested itself in the service's
/// `privileges.rs`); the load test reads the books as the app role.
#[test]
fn the_apps_sell_as_the_app_role_and_migrate_as_the_owner() {
    let compose = compose();
    let user_of = |url: &str| -> String {
        let url = with_defaults_inside(url);
        let rest = url.strip_prefix("postgres://").unwrap();
        rest.split(['@', ':']).next().unwrap().to_owned()
    };
    let init = std::fs::read_to_string(root().join("deploy/postgres/initdb/10-roles.sh")).unwrap();
    let volumes = volumes_of(&services(&compose)["postgres"]);
    assert!(volumes.contains(&"./deploy/postgres/initdb:/docker-entrypoint-initdb.d:ro"));
    assert!(volumes.contains(&"./deploy/postgres/roles.sql:/seckill/roles.sql:ro"));
    assert!(init.contains("-f /seckill/roles.sql"), "{init}");
    for (name, service) in app_services(&compose) {
        let env = &service["environment"];
        let app = user_of(env["DATABASE_URL"].as_str().unwrap());
        let owner = user_of(env["DATABASE_MIGRATION_URL"].as_str().unwrap());
        assert!(init.contains(&format!("-v app={app} ")), "{name}: {app}");
        assert!(
            init.contains(&format!("-v owner={owner} ")),
            "{name}: {owner}"
        );
    }
    let loadtest = services(&compose)["loadtest"]["environment"]["DATABASE_URL"]
        .as_str()
        .unwrap();
    assert_eq!(user_of(loadtest), "seckill_app");
}

/// Grafana's admin password is the one given, or a random one written to its log: run as
/// the container runs it, with Grafana itself replaced by a print of the password.
#[test]
fn grafana_never_keeps_its_default_admin_password() {
    let compose = compose();
    let grafana = &services(&compose)["grafana"];
    assert_eq!(
        grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].as_str(),
        Some("${GRAFANA_ADMIN_PASSWORD:-}")
    );
    let entrypoint: Vec<&str> = grafana["entrypoint"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // Compose turns `$$` into `$`; the image's own entrypoint is /run.sh.
    let script = entrypoint[2].replace("$$", "$").replace(
        "exec /run.sh",
        r#"echo "started with $GF_SECURITY_ADMIN_PASSWORD""#,
    );
    // Grafana's data directory: empty at a first start, with its database at a restart.
    let data = std::env::temp_dir().join(testkit::unique_prefix("grafana").replace(':', "-"));
    std::fs::create_dir_all(&data).unwrap();
    let run = |given: &str| -> String {
        let output = std::process::Command::new(entrypoint[0])
            .args([entrypoint[1], &script])
            .env("GF_SECURITY_ADMIN_PASSWORD", given)
            .env("GF_PATHS_DATA", &data)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };

    let chosen = run("chosen-by-the-operator");
    let (first, second) = (run(""), run(""));
    std::fs::write(data.join("grafana.db"), "").unwrap();
    let restarted = run("");
    std::fs::remove_dir_all(&data).unwrap();

    assert_eq!(chosen.trim(), "started with chosen-by-the-operator");
    assert!(
        restarted.contains("unchanged") && restarted.trim_end().ends_with("started with"),
        "a restart announces no new password: {restarted}"
    );
    let started = |out: &str| out.lines().last().unwrap().to_owned();
    for out in [&first, &second] {
        let password = started(out)
            .strip_prefix("started with ")
            .unwrap()
            .to_owned();
        assert!(password.len() >= 20 && password != "admin", "{out}");
        assert!(
            out.contains(&format!(
                "grafana admin password (set GRAFANA_ADMIN_PASSWORD to choose it): {password}"
            )),
            "{out}"
        );
    }
    assert_ne!(started(&first), started(&second), "random each start");
}

#[test]
fn every_app_environment_is_accepted_by_seckill_itself() {
    let compose = compose();
    for (name, service) in app_services(&compose) {
        let flags = as_flags(service["environment"].as_mapping().unwrap());
        let settings =
            seckill::Settings::try_parse_from(&flags).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Err(error) = settings.check() {
            panic!("{name}: seckill would refuse to start: {error}");
        }
    }
}

#[test]
fn no_service_can_pull_an_image_that_is_built_locally() {
    let compose = compose();
    assert_eq!(pullable_local_images(&compose), Vec::<String>::new());

    // The check catches the mistake it is for: a service that only names the local tag
    // (the other apps build it).
    let mut broken = compose.clone();
    let app = broken["services"]["app1"].as_mapping_mut().unwrap();
    app.remove("build");
    app.remove("pull_policy");
    assert_eq!(pullable_local_images(&broken), vec!["app1".to_owned()]);
}

#[test]
fn the_test_suite_services_are_published_on_localhost_as_the_tests_expect() {
    let compose = compose();
    let config = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cargo/config.toml"),
    )
    .unwrap();
    let ports = |service: &str| -> Vec<String> {
        services(&compose)[service]["ports"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{service} publishes no ports"))
            .iter()
            .map(|p| with_defaults_inside(p.as_str().unwrap()))
            .collect()
    };
    assert!(ports("postgres").contains(&"127.0.0.1:5432:5432".to_owned()));
    assert!(ports("redis").contains(&"127.0.0.1:6379:6379".to_owned()));
    // The tests' default URLs (.cargo/config.toml) connect as `postgres` without a password.
    assert!(config.contains("postgres://postgres@127.0.0.1:5432/postgres"));
    assert!(config.contains("redis://127.0.0.1:6379"));
    assert_eq!(
        services(&compose)["postgres"]["environment"]["POSTGRES_HOST_AUTH_METHOD"].as_str(),
        Some("trust")
    );
}

#[test]
fn the_image_listens_on_every_interface_and_builds_offline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let runtime = dockerfile.rsplit("\nFROM ").next().unwrap();
    let bind = runtime
        .lines()
        .find_map(|line| line.strip_prefix("ENV BIND_ADDR="))
        .expect("the runtime stage sets BIND_ADDR");
    let settings = seckill::Settings::try_parse_from(["seckill", "--bind-addr", bind]).unwrap();
    assert!(settings.http.bind_addr.ip().is_unspecified(), "{bind}");
    assert!(runtime.contains(&format!("EXPOSE {}", settings.http.bind_addr.port())));

    // The query macros build from `.sqlx/`, which the build context must include.
    let offline = dockerfile
        .find("ENV SQLX_OFFLINE=true")
        .expect("SQLX_OFFLINE=true");
    assert!(offline < dockerfile.find("cargo build").unwrap());
    assert!(root.join(".sqlx").is_dir());
    let ignored = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    assert!(
        !ignored
            .lines()
            .any(|l| l.trim().trim_matches('/') == ".sqlx")
    );
}

fn profile_services(compose: &Value, profile: &str) -> BTreeSet<String> {
    services(compose)
        .iter()
        .filter(|(_, s)| {
            s["profiles"]
                .as_sequence()
                .is_some_and(|p| p.iter().any(|v| v.as_str() == Some(profile)))
        })
        .map(|(name, _)| name.as_str().unwrap().to_owned())
        .collect()
}

/// The `record:` names of deploy/prometheus/rules.yml, each with its expression.
fn recording_rules() -> Vec<(String, String)> {
    let rules = yaml("deploy/prometheus/rules.yml");
    rules["groups"]
        .as_sequence()
        .expect("rule groups")
        .iter()
        .flat_map(|group| group["rules"].as_sequence().expect("rules").iter())
        .map(|rule| {
            (
                rule["record"]
                    .as_str()
                    .expect("a recording rule")
                    .to_owned(),
                rule["expr"].as_str().expect("an expression").to_owned(),
            )
        })
        .collect()
}

/// Every dashboard in deploy/grafana/dashboards, as (file, JSON).
fn dashboards() -> Vec<(String, serde_json::Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/grafana/dashboards"))
        .expect("deploy/grafana/dashboards")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).expect("valid JSON"))
        })
        .collect()
}

/// Every panel query of every dashboard: (dashboard file, panel title, data source uid, expr).
fn panel_queries() -> Vec<(String, String, String, String)> {
    let mut queries = Vec::new();
    for (file, dashboard) in dashboards() {
        for panel in dashboard["panels"].as_array().expect("panels") {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            for target in panel["targets"].as_array().expect("targets") {
                let uid = target["datasource"]["uid"]
                    .as_str()
                    .or(panel["datasource"]["uid"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                let expr = target["expr"].as_str().expect("an expr").to_owned();
                queries.push((file.clone(), title.clone(), uid, expr));
            }
        }
    }
    queries
}

/// The `seckill_*` metric names an expression reads, with `_bucket` of a histogram as the
/// histogram's own name, and the `outcome` values it selects.
fn metrics_read_by(expr: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut outcomes = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("seckill_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        // A recording rule's own name (`instance:seckill_...:rate10s`) is not a metric.
        if !rest[..start].ends_with(':') && !tail[end..].starts_with(':') {
            names.insert(name.trim_end_matches("_bucket").to_owned());
        }
        rest = &tail[end..];
    }
    let mut rest = expr;
    while let Some(start) = rest.find("outcome=\"") {
        let tail = &rest[start + "outcome=\"".len()..];
        let end = tail.find('"').expect("a closed label value");
        outcomes.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    (names, outcomes)
}

#[test]
fn the_monitoring_profile_adds_prometheus_and_grafana_and_nothing_else() {
    let compose = compose();
    let monitoring = profile_services(&compose, "monitoring");
    assert_eq!(
        monitoring,
        BTreeSet::from(["grafana".to_owned(), "prometheus".to_owned()])
    );
    // Without the profile the demo does not need them: a dependency on one (the load test
    // waits for Prometheus's first scrapes) is not required.
    for (name, service) in services(&compose) {
        for (dep, how) in service["depends_on"].as_mapping().into_iter().flatten() {
            let dep = dep.as_str().unwrap();
            if monitoring.contains(dep) {
                assert_eq!(
                    how["required"].as_bool(),
                    Some(false),
                    "{name:?} needs {dep}"
                );
            }
        }
    }
}

#[test]
fn prometheus_scrapes_exactly_the_app_services_on_the_port_they_listen_on() {
    let compose = compose();
    let config = yaml("deploy/prometheus/prometheus.yml");
    let jobs = config["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs");
    let mut targets: Vec<String> = jobs
        .iter()
        .flat_map(|job| job["static_configs"].as_sequence().unwrap().iter())
        .flat_map(|static_config| static_config["targets"].as_sequence().unwrap().iter())
        .map(|target| target.as_str().unwrap().to_owned())
        .collect();
    targets.sort();
    let mut expected: Vec<String> = app_services(&compose)
        .into_iter()
        .map(|(name, service)| {
            // Metrics are on the operators' listener.
            let bind = service["environment"]["OPS_BIND_ADDR"].as_str().unwrap();
            let port = bind.rsplit(':').next().unwrap();
            format!("{name}:{port}")
        })
        .collect();
    expected.sort();
    assert_eq!(targets, expected);
    for job in jobs {
        let path = job["metrics_path"].as_str().unwrap_or("/metrics");
        assert_eq!(path, "/metrics", "the route seckill serves its metrics on");
    }
}

#[test]
fn the_monitoring_files_are_mounted_where_the_images_read_them() {
    let compose = compose();
    let mounts = |service: &str| -> Vec<(PathBuf, String)> {
        services(&compose)[service]["volumes"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{service} mounts nothing"))
            .iter()
            .map(|v| {
                let mut parts = v.as_str().unwrap().split(':');
                let source = root().join(parts.next().unwrap());
                (source, parts.next().expect("a target").to_owned())
            })
            .collect()
    };
    let mounted_at = |service: &str, target: &str| -> PathBuf {
        mounts(service)
            .into_iter()
            .find(|(_, t)| target.starts_with(t.as_str()))
            .map(|(source, t)| source.join(target[t.len()..].trim_start_matches('/')))
            .unwrap_or_else(|| panic!("{service}: nothing is mounted at {target}"))
    };

    // Prometheus reads the config it is told to, and the rule files it names, beside it.
    let command: Vec<&str> = services(&compose)["prometheus"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let config_path = command
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .expect("--config.file");
    let config_file = mounted_at("prometheus", config_path);
    assert!(config_file.is_file(), "{}", config_file.display());
    let config = yaml("deploy/prometheus/prometheus.yml");
    assert_eq!(
        config_file.canonicalize().unwrap(),
        root()
            .join("deploy/prometheus/prometheus.yml")
            .canonicalize()
            .unwrap()
    );
    for rule_file in config["rule_files"].as_sequence().expect("rule_files") {
        let path = config_file
            .parent()
            .unwrap()
            .join(rule_file.as_str().unwrap());
        assert!(path.is_file(), "{}", path.display());
    }

    // Grafana reads its provisioning, and the dashboard provider's folder, from the mounts.
    let provisioning = mounted_at("grafana", "/etc/grafana/provisioning");
    let providers = yaml_at(&provisioning.join("dashboards/seckill.yml"));
    for provider in providers["providers"].as_sequence().expect("providers") {
        let folder = mounted_at("grafana", provider["options"]["path"].as_str().unwrap());
        assert!(
            std::fs::read_dir(&folder).unwrap().any(|e| e
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")),
            "no dashboard in {}",
            folder.display()
        );
    }
    let home =
        services(&compose)["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
            .as_str()
            .expect("a home dashboard");
    assert!(mounted_at("grafana", home).is_file(), "{home}");
}

#[test]
fn every_dashboard_panel_shows_a_recording_rule_and_every_rule_is_shown() {
    let rules: BTreeSet<String> = recording_rules().into_iter().map(|(r, _)| r).collect();
    let queries = panel_queries();
    assert!(!queries.is_empty());
    let sources = yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let uids: BTreeSet<&str> = sources["datasources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| s["uid"].as_str().expect("a data source uid"))
        .collect();
    for (file, title, uid, expr) in &queries {
        assert!(
            rules.contains(expr.trim()),
            "{file}: panel {title:?} shows {expr:?}, which is no recording rule ({rules:?})"
        );
        assert!(
            uids.contains(uid.as_str()),
            "{file}: panel {title:?} uses data source {uid:?}"
        );
    }
    let shown: BTreeSet<&str> = queries.iter().map(|q| q.3.trim()).collect();
    for rule in &rules {
        assert!(shown.contains(rule.as_str()), "rule {rule} is on no panel");
    }
    // The five the issue asks for: throughput, two latencies, the busy share, lost locks.
    for metric in [
        "seckill_orders_total",
        "seckill_purchase_duration_seconds",
        "seckill_lock_wait_seconds",
        "seckill_purchases_total",
        "seckill_locks_lost_total",
    ] {
        assert!(
            recording_rules()
                .iter()
                .any(|(_, expr)| metrics_read_by(expr).0.contains(metric)),
            "no rule reads {metric}"
        );
    }
}

#[test]
fn the_grafana_data_source_is_the_stacks_prometheus() {
    let compose = compose();
    let sources = yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    for source in sources["datasources"].as_sequence().unwrap() {
        assert_eq!(source["type"].as_str(), Some("prometheus"));
        let url = source["url"].as_str().unwrap();
        let authority = url.trim_start_matches("http://");
        let (host, port) = authority.trim_end_matches('/').split_once(':').unwrap();
        assert!(services(&compose).contains_key(host), "{url}");
        let published = services(&compose)[host]["ports"].as_sequence().unwrap();
        assert!(
            published
                .iter()
                .any(|p| p.as_str().unwrap().ends_with(&format!(":{port}"))),
            "{host} does not listen on {port}"
        );
    }
}

#[test]
fn every_published_port_is_on_localhost_only() {
    let compose = compose();
    for (name, service) in services(&compose) {
        for port in service["ports"].as_sequence().into_iter().flatten() {
            let port = port.as_str().unwrap();
            assert!(port.starts_with("127.0.0.1:"), "{name:?} publishes {port}");
        }
    }
}

/// The postgres health check waits for the server that listens on the network, not the
/// socket-only one the image runs first.
#[test]
fn postgres_health_check_waits_for_the_server_on_the_network() {
    // On first start the postgres image creates POSTGRES_DB on a server that listens on its
    // socket only, then restarts it; over the socket the check passes during that window.
    let compose = compose();
    let test: Vec<&str> = services(&compose)["postgres"]["healthcheck"]["test"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(test[1], "pg_isready");
    let host = test.iter().position(|a| *a == "-h").map(|i| test[i + 1]);
    assert_eq!(host, Some("127.0.0.1"), "{test:?}");
}

/// The reader of PromQL expressions finds the metric names and outcomes they read, and skips
/// the recording rules' names.
#[test]
fn metrics_reader_finds_names_and_outcomes_and_skips_rule_names() {
    let (names, outcomes) = metrics_read_by(
        r#"sum(rate(seckill_purchases_total{outcome="busy"}[10s])) / instance:seckill_orders:rate10s + histogram_quantile(0.99, rate(seckill_lock_wait_seconds_bucket[1m]))"#,
    );
    assert_eq!(
        names,
        BTreeSet::from([
            "seckill_lock_wait_seconds".to_owned(),
            "seckill_purchases_total".to_owned()
        ])
    );
    assert_eq!(outcomes, BTreeSet::from(["busy".to_owned()]));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn every_metric_and_outcome_the_rules_read_is_served_by_a_real_instance(pool: PgPool) {
    let (port, _cleanup) = spawn_instance(pool, "compose-rules").await;
    let served = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    let rules = recording_rules();
    assert!(!rules.is_empty());
    for (record, expr) in rules {
        let (names, outcomes) = metrics_read_by(&expr);
        assert!(!names.is_empty(), "{record} reads no seckill metric");
        for name in names {
            assert!(
                served.contains(&format!("# TYPE {name} ")),
                "{record} reads {name}, which /metrics does not serve"
            );
        }
        for outcome in outcomes {
            assert!(
                served.contains(&format!("seckill_purchases_total{{outcome=\"{outcome}\"}}")),
                "{record} selects outcome {outcome:?}, which /metrics does not serve"
            );
        }
    }
}

/// The `ha` profile: three Patroni members whose leader lease is in the profile's etcd, and
/// HAProxy in front of them, checking each member's Patroni for `GET /primary`; with
/// DATABASE_HOST=haproxy the apps (migrations included) and the load test reach PostgreSQL
/// through HAProxy, and the apps wait for it to have a primary.
#[test]
fn the_ha_profile_puts_haproxy_in_front_of_three_patroni_members() {
    let compose = compose();
    let ha = profile_services(&compose, "ha");
    let members: BTreeSet<String> = ["patroni1", "patroni2", "patroni3"]
        .map(str::to_owned)
        .into();
    let mut expected = members.clone();
    expected.extend(["etcd".to_owned(), "haproxy".to_owned()]);
    assert_eq!(ha, expected);
    apps_wait_for_the_optional(&compose, "haproxy");

    let patroni = yaml("deploy/patroni/patroni.yml");
    let dcs = &patroni["bootstrap"]["dcs"];
    assert_eq!(dcs["synchronous_mode"].as_bool(), Some(true));
    assert_eq!(dcs["synchronous_mode_strict"].as_bool(), Some(true));
    // Patroni's own rule: a lease outlives a loop and two retries.
    let (ttl, loop_wait, retry) = (
        dcs["ttl"].as_u64().unwrap(),
        dcs["loop_wait"].as_u64().unwrap(),
        dcs["retry_timeout"].as_u64().unwrap(),
    );
    assert!(loop_wait + 2 * retry <= ttl, "ttl {ttl}");
    assert_eq!(patroni["etcd3"]["hosts"].as_str(), Some("etcd:2379"));
    let rest_port = port_of(patroni["restapi"]["listen"].as_str().unwrap());
    let pg_port = port_of(patroni["postgresql"]["listen"].as_str().unwrap());
    for member in &members {
        let service = &services(&compose)[member.as_str()];
        let env = &service["environment"];
        assert_eq!(env["PATRONI_NAME"].as_str(), Some(member.as_str()));
        assert_eq!(
            env["PATRONI_RESTAPI_CONNECT_ADDRESS"].as_str(),
            Some(format!("{member}:{rest_port}").as_str())
        );
        assert_eq!(
            env["PATRONI_POSTGRESQL_CONNECT_ADDRESS"].as_str(),
            Some(format!("{member}:{pg_port}").as_str())
        );
        let volumes = volumes_of(service);
        assert!(volumes.contains(&"./deploy/patroni/patroni.yml:/etc/patroni/patroni.yml:ro"));
        assert!(volumes.contains(&"./deploy/postgres/roles.sql:/seckill/roles.sql:ro"));
        let post_bootstrap = patroni["bootstrap"]["post_bootstrap"].as_str().unwrap();
        assert!(
            volumes.contains(
                &format!("./deploy/patroni/post-bootstrap.sh:{post_bootstrap}:ro").as_str()
            ),
            "{member}: {volumes:?}"
        );
        assert_eq!(
            service["depends_on"]["etcd"]["condition"].as_str(),
            Some("service_healthy")
        );
    }

    // HAProxy reads the mounted file where its image looks, and sends connections only to
    // a member whose Patroni answers 200 to GET /primary, on the member's REST port.
    let haproxy = &services(&compose)["haproxy"];
    assert!(
        volumes_of(haproxy)
            .contains(&"./deploy/haproxy/postgres.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro")
    );
    let cfg = std::fs::read_to_string(root().join("deploy/haproxy/postgres.cfg")).unwrap();
    assert!(cfg.contains("option httpchk GET /primary"), "{cfg}");
    assert!(cfg.contains("on-marked-down shutdown-sessions"), "{cfg}");
    // Healthy (the apps start) only when a commit can be acknowledged: a primary, and a
    // synchronous standby (GET /sync answers 200 only there).
    assert!(cfg.contains("option httpchk GET /sync"), "{cfg}");
    assert!(
        cfg.contains("monitor fail if { nbsrv(primary) lt 1 } || { nbsrv(sync_standby) lt 1 }"),
        "{cfg}"
    );
    assert!(cfg.contains(&format!("bind :{pg_port}")), "{cfg}");
    let servers: BTreeSet<String> = cfg
        .lines()
        .filter_map(|line| line.trim().strip_prefix("server "))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words[1], format!("{}:{pg_port}", words[0]), "{line}");
            assert_eq!(words[2..], ["check", "port", rest_port.as_str()], "{line}");
            words[0].to_owned()
        })
        .collect();
    assert_eq!(servers, members);

    let host_of = |url: &str| url_host(&with_env_inside(url, &[("DATABASE_HOST", "haproxy")]));
    for (name, service) in app_services(&compose) {
        for key in ["DATABASE_URL", "DATABASE_MIGRATION_URL"] {
            let url = service["environment"][key].as_str().unwrap();
            assert_eq!(host_of(url), "haproxy", "{name}: {key}");
        }
    }
    let loadtest = services(&compose)["loadtest"]["environment"]["DATABASE_URL"]
        .as_str()
        .unwrap();
    assert_eq!(host_of(loadtest), "haproxy");
}

/// The `router` profile: HAProxy in front of the three apps, hashing each request on the path
/// consistently, sending only to an app whose operators' listener answers /readyz with 200;
/// with LOADTEST_HOSTS=http://router:8080 the load test attacks it alone, once it is healthy.
#[test]
fn the_router_profile_sends_each_product_to_one_ready_instance() {
    let compose = compose();
    assert_eq!(
        profile_services(&compose, "router"),
        BTreeSet::from(["router".to_owned()])
    );
    let router = &services(&compose)["router"];
    assert!(
        volumes_of(router)
            .contains(&"./deploy/haproxy/router.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro")
    );
    assert!(
        router["healthcheck"]["test"]
            .as_sequence()
            .is_some_and(|t| !t.is_empty())
    );

    let cfg = std::fs::read_to_string(root().join("deploy/haproxy/router.cfg")).unwrap();
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    assert!(lines.contains(&"hash-type consistent"), "{cfg}");
    assert!(lines.contains(&"option httpchk GET /readyz"), "{cfg}");
    assert!(lines.contains(&"http-check expect status 200"), "{cfg}");

    // Each app once, on its buyers' port, checked on its operators' port.
    let bind_port = |name: &str, key: &str| -> String {
        port_of(
            services(&compose)[name]["environment"][key]
                .as_str()
                .unwrap(),
        )
    };
    let servers: BTreeSet<String> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("server "))
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let app = words[0];
            let buyers = bind_port(app, "BIND_ADDR");
            let ops = bind_port(app, "OPS_BIND_ADDR");
            assert_eq!(words[1], format!("{app}:{buyers}"), "{line}");
            assert_eq!(words[2..], ["check", "port", ops.as_str()], "{line}");
            app.to_owned()
        })
        .collect();
    let apps: BTreeSet<String> = app_services(&compose).into_iter().map(|(n, _)| n).collect();
    assert_eq!(servers, apps);
    let bind = lines
        .iter()
        .find_map(|l| l.strip_prefix("bind :"))
        .expect("the buyers' frontend binds");
    let published = router["ports"][0].as_str().unwrap();
    assert!(published.ends_with(&format!(":{bind}")), "{published}");

    // The load test attacks the router alone when told to, and waits for it to be healthy.
    let command = loadtest_command(&compose, &[("LOADTEST_HOSTS", "http://router:8080")]);
    let hosts_at = command.iter().position(|a| a == "--hosts").unwrap() + 1;
    assert_eq!(command[hosts_at], format!("http://router:{bind}"));
    let waits = &services(&compose)["loadtest"]["depends_on"]["router"];
    assert_eq!(waits["condition"].as_str(), Some("service_healthy"));
    assert_eq!(waits["required"].as_bool(), Some(false));
    // The router starts once every app is ready: every instance is in from its first
    // check, so no product moves as instances come up.
    for app in &apps {
        assert_eq!(
            router["depends_on"][app.as_str()]["condition"].as_str(),
            Some("service_healthy"),
            "router -> {app}"
        );
    }
}

/// The router hashes the path up to its `depth`-th segment: in every route about one product
/// that a real instance's OpenAPI document lists, that segment is the product id, so a
/// product's purchases, page and orders reach one instance.
#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_routers_hash_ends_at_the_product_id_of_every_product_route(pool: PgPool) {
    let cfg = std::fs::read_to_string(root().join("deploy/haproxy/router.cfg")).unwrap();
    let depth: usize = cfg
        .lines()
        .find_map(|l| l.trim().strip_prefix("balance uri path-only depth "))
        .expect("balance uri path-only depth N")
        .parse()
        .unwrap();
    let (ops_port, _cleanup) = spawn_instance(pool, "router").await;
    let document: serde_json::Value =
        reqwest::get(format!("http://127.0.0.1:{ops_port}/api-docs/openapi.json"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let product_routes: Vec<&String> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|path| path.starts_with("/api/products/"))
        .collect();
    assert!(
        product_routes.iter().any(|p| p.ends_with("/purchase")),
        "{product_routes:?}"
    );
    for path in product_routes {
        // "/api/products/{id}/purchase".split('/') is "", "api", "products", "{id}", ...
        assert_eq!(path.split('/').nth(depth), Some("{id}"), "{path}");
    }
}

/// A stand-in instance for the router's test: answers every request with its name, and
/// `/readyz` with 200 while `ready` holds, 503 otherwise.
async fn named_instance(name: &'static str, ready: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let ready = ready.clone();
            tokio::spawn(async move {
                // One request per connection: read its head (and a body, if announced).
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match socket.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0));
                let mut body = vec![0u8; length];
                if socket.read_exact(&mut body).await.is_err() {
                    return;
                }
                let status = if head.starts_with("get /readyz ") && !ready.load(Ordering::SeqCst) {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// The committed router.cfg run by a real HAProxy (Debian's `haproxy`) in front of three
/// stand-in instances on loopback: every request about one product (its page, a purchase,
/// a buyer's order) reaches one instance; products spread over all three; when an instance's
/// /readyz fails, its products move to the others and no other product moves, and when it
/// answers again they come back.
#[tokio::test]
async fn the_router_keeps_each_product_on_one_instance_and_moves_only_a_dead_ones() {
    let names = ["app1", "app2", "app3"];
    let ready: Vec<Arc<AtomicBool>> = names
        .iter()
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect();
    let mut backends = Vec::new();
    for (name, ready) in names.iter().zip(&ready) {
        let port = named_instance(name, ready.clone()).await;
        backends.push(loadtest::router::Backend {
            buyers: port,
            ops: port,
        });
    }
    let committed = std::fs::read_to_string(loadtest::router::COMMITTED).unwrap();
    for name in names {
        assert!(committed.contains(&format!("server {name} {name}:8080 check port 9080")));
    }
    // The committed file, addresses aside, by a real HAProxy; stopped when dropped.
    let router = loadtest::router::Router::start(&backends, false)
        .await
        .unwrap();

    let client = reqwest::Client::new();
    let base = router.url.clone();
    let owner = |product: u32| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let page = client
                .get(format!("{base}/api/products/{product}"))
                .send()
                .await
                .ok()?;
            page.status().is_success().then_some(())?;
            let page = page.text().await.ok()?;
            let buy = client
                .post(format!("{base}/api/products/{product}/purchase"))
                .body("{}")
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            let order = client
                .get(format!("{base}/api/products/{product}/orders/7"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            // While an instance goes out or comes back, the three may straddle the change:
            // the caller asks again.
            (page == buy && buy == order).then_some(page)
        }
    };
    let products = 1..=60u32;
    let owners = |products: std::ops::RangeInclusive<u32>| {
        let owner = &owner;
        async move {
            let mut map = std::collections::BTreeMap::new();
            for product in products {
                map.insert(product, owner(product).await?);
            }
            Some(map)
        }
    };
    // Nothing changes here: every pass must find each product's three requests on one
    // instance, from the first that answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        if let Some(map) = owners(products.clone()).await {
            break map;
        }
        assert!(
            Instant::now() < deadline,
            "the router never sent a product's requests to one instance"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        owners(products.clone()).await.as_ref(),
        Some(&before),
        "a product's requests reached more than one instance"
    );
    for name in names {
        let count = before.values().filter(|o| *o == name).count();
        assert!(count >= 5, "{name} owns {count} of 60 products: {before:?}");
    }

    // The owner of product 1 fails its /readyz.
    let gone = before[&1].clone();
    let gone_at = names.iter().position(|n| *n == gone).unwrap();
    ready[gone_at].store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    let during = loop {
        let map = owners(products.clone()).await;
        if let Some(map) = map.filter(|m| m[&1] != gone) {
            break map;
        }
        assert!(Instant::now() < deadline, "{gone} never went out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (product, was) in &before {
        let now = &during[product];
        if *was == gone {
            assert_ne!(
                now, &gone,
                "product {product} stayed on the instance that went out"
            );
        } else {
            assert_eq!(
                now, was,
                "product {product} moved although its instance stayed in"
            );
        }
    }

    // It answers again: its products come back.
    ready[gone_at].store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(map) = owners(products.clone()).await.filter(|m| m[&1] == gone) {
            assert_eq!(map, before);
            break;
        }
        assert!(Instant::now() < deadline, "{gone} never came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
