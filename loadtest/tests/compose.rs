//! There is no Docker engine here, so `docker-compose.yml` is checked against reality instead:
//! every setting it gives an app is a real `seckill` setting, its health checks hit routes
//! that answer, its URLs name services it defines, and the load test's flags and targets exist.

use std::collections::BTreeSet;
use std::path::Path;

use clap::{CommandFactory, Parser as _};
use serde_norway::Value;
use sqlx::PgPool;

fn compose() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker-compose.yml");
    let text = std::fs::read_to_string(&path).expect("docker-compose.yml at the top of the repo");
    let mut value: Value = serde_norway::from_str(&text).expect("valid YAML");
    value.apply_merge().expect("valid merge keys");
    value
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
    match value
        .strip_prefix("${")
        .and_then(|v| v.strip_suffix('}'))
        .and_then(|v| v.split_once(":-"))
    {
        Some((_, default)) => default.to_owned(),
        None => value.to_owned(),
    }
}

/// Every `${NAME:-default}` inside `value` as compose resolves it with NAME unset.
fn with_defaults_inside(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closed ${...}") + start;
        out.push_str(&with_defaults(&rest[start..=end]));
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// A service's environment as `seckill` flags (`LOCK_TTL_MS: 5000` → `--lock-ttl-ms 5000`).
fn as_flags(env: &serde_norway::Mapping) -> Vec<String> {
    let command = seckill::Settings::command();
    let mut flags = vec!["seckill".to_owned()];
    for (key, value) in env {
        let key = key.as_str().unwrap();
        let value = value
            .as_str()
            .map(with_defaults)
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
    let host_of = |url: &str| {
        let rest = url.split("://").nth(1).expect("a URL");
        let authority = rest.split('/').next().unwrap();
        let host_port = authority.rsplit('@').next().unwrap();
        host_port.split(':').next().unwrap().to_owned()
    };
    for (name, service) in services(&compose) {
        let Some(env) = service["environment"].as_mapping() else {
            continue;
        };
        for (key, value) in env {
            let (key, value) = (key.as_str().unwrap(), value.as_str().unwrap_or_default());
            if key.ends_with("_URL") {
                let host = host_of(value);
                assert!(
                    defined.contains(&host),
                    "{name:?}: {key} points at undefined service {host}"
                );
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
    let command: Vec<&str> = loadtest["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
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
    let env = loadtest["environment"].as_mapping().unwrap();
    assert!(env.contains_key("ADMIN_TOKEN") && env.contains_key("DATABASE_URL"));
}

#[sqlx::test(migrator = "seckill::MIGRATOR")]
async fn the_health_check_paths_answer_on_a_real_instance(pool: PgPool) {
    let compose = compose();
    let mut settings =
        seckill::Settings::try_parse_from(["seckill", "--database-url", "unused"]).unwrap();
    settings.bind_addr = "127.0.0.1:0".parse().unwrap();
    settings.redis_key_prefix = testkit::unique_prefix("compose");
    if let Ok(url) = std::env::var("REDIS_URL") {
        settings.redis_url = url.into();
    }
    let _cleanup = testkit::PrefixCleanup::new(settings.redis_url(), &settings.redis_key_prefix);
    let app = seckill::Application::build_with_pool(settings, pool)
        .await
        .unwrap();
    let port = app.port();
    tokio::spawn(app.run_until_stopped());

    for (name, service) in app_services(&compose) {
        let test: Vec<&str> = service["healthcheck"]["test"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let url = test
            .iter()
            .find(|a| a.starts_with("http://"))
            .expect("a URL in the check");
        assert!(url.starts_with("http://127.0.0.1:8080/"), "{name}: {url}");
        let path = &url["http://127.0.0.1:8080".len()..];
        let status = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{name}: health check {path}");
    }
}

#[test]
fn the_redlock_profile_has_three_masters_that_the_apps_name() {
    let compose = compose();
    let masters: Vec<String> = services(&compose)
        .iter()
        .filter(|(_, s)| {
            s["profiles"]
                .as_sequence()
                .is_some_and(|p| p.iter().any(|v| v.as_str() == Some("redlock")))
        })
        .map(|(name, _)| name.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(masters.len(), 3, "{masters:?}");
    for (name, service) in app_services(&compose) {
        let urls = service["environment"]["REDLOCK_URLS"].as_str().unwrap();
        for master in &masters {
            assert!(
                urls.contains(&format!("redis://{master}:6379")),
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
        assert_eq!(parsed.redlock_urls.len(), 3);
    }
}

#[test]
fn the_image_holds_every_binary_the_stack_runs_and_runs_as_a_non_root_user() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile");
    let dockerfile = std::fs::read_to_string(path).expect("a Dockerfile at the top of the repo");
    let runtime = dockerfile.rsplit("\nFROM ").next().expect("a final stage");
    let compose = compose();
    for (name, service) in services(&compose) {
        let image = service["image"].as_str().unwrap_or_default();
        if image != "seckill:local" {
            continue;
        }
        let binary = service["command"][0].as_str().expect("a command");
        assert!(
            dockerfile.contains(&format!("-p {binary}")),
            "{name:?}: the image does not build {binary}"
        );
        assert!(
            runtime.contains(&format!("target/release/{binary}")),
            "{name:?}: the runtime stage does not copy {binary}"
        );
    }
    let user = runtime
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("a USER in the runtime stage");
    assert_ne!(user.trim(), "root");
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

    // The check catches the mistake it is for: a service that only names the local tag.
    let mut broken = compose.clone();
    let loadtest = broken["services"]["loadtest"].as_mapping_mut().unwrap();
    loadtest.remove("build");
    loadtest.remove("pull_policy");
    assert_eq!(pullable_local_images(&broken), vec!["loadtest".to_owned()]);
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
    assert!(settings.bind_addr.ip().is_unspecified(), "{bind}");
    assert!(runtime.contains(&format!("EXPOSE {}", settings.bind_addr.port())));

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
