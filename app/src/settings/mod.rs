//! Every setting of the service, from flags or environment variables (`seckill --help`).
//!
//! The settings come in groups, one struct each (`groups.rs`, `http.rs`), as `--help` shows them: the
//! HTTP side ([`HttpSettings`]), PostgreSQL ([`DatabaseSettings`]), Redis
//! ([`RedisSettings`]), the lock ([`LockSettings`]), the sale ([`SaleSettings`]), buyers'
//! identity ([`IdentitySettings`]) and the limits on purchase attempts ([`LimitSettings`],
//! both in `buyers.rs`). The authorities trusted over TLS are read by `tls.rs`. A
//! duration is read once, as a whole number of milliseconds, into a [`Duration`]. Each
//! numeric setting's accepted values are stated once, in `range.rs`: clap refuses the
//! command line and the environment outside them, and [`Settings::check`] refuses settings
//! built in code outside them, so both ways in refuse the same values. The rules that tie
//! settings together are in `rules.rs`, one function each with its message.

use std::path::Path;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

pub use buyers::{BuyerIdentity, IdentitySettings, JwtAlgorithm, LimitSettings};
pub use groups::{DatabaseSettings, LockSettings, RedisSettings, SaleSettings};
pub use http::HttpSettings;
pub use tls::CaFile;

use rules::{
    buyers_have_a_key, etcd_ca_has_only_tls_endpoints, etcd_has_endpoints,
    hold_is_below_half_the_wait, lock_names_hold_no_slash, redis_tls_is_all_or_nothing,
    redlock_has_masters, sentinels_name_their_primary, work_ends_before_a_waiting_batch_gives_up,
    work_ends_before_postgres_ends_the_transaction, zookeeper_has_an_ensemble,
    zookeeper_session_outlasts_two_leases,
};

mod buyers;
mod groups;
mod http;
mod range;
mod rules;
mod tls;

/// A flash-sale service: sells limited stock to a flood of buyers without overselling.
#[derive(Debug, Clone, Parser)]
#[command(name = "seckill", version, about, long_about = None)]
pub struct Settings {
    #[command(flatten)]
    pub http: HttpSettings,

    #[command(flatten)]
    pub database: DatabaseSettings,

    #[command(flatten)]
    pub redis: RedisSettings,

    #[command(flatten)]
    pub lock: LockSettings,

    #[command(flatten)]
    pub sale: SaleSettings,

    #[command(flatten)]
    pub identity: IdentitySettings,

    #[command(flatten)]
    pub limits: LimitSettings,

    /// Log format on stdout. The level comes from RUST_LOG (default `info`).
    #[arg(
        long = "log-format",
        id = "log_format",
        value_name = "LOG_FORMAT",
        env = "LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
    )]
    pub log_format: LogFormat,
}

/// `HOLD_MS` when it is not set (and `LOCK_WAIT_MS` is long enough for it).
pub const DEFAULT_HOLD: Duration = Duration::from_millis(100);

/// The shortest admin token accepted: 16 characters, about 95 bits if random.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// The admin token docker-compose.yml publishes for the demo stack: refused unless
/// `ALLOW_DEMO_ADMIN_TOKEN` is on.
pub const DEMO_ADMIN_TOKEN: &str = "demo-admin-token-0123456789";

/// How many tokens `ADMIN_TOKEN_FILE` may hold: the current one, and during a rotation the
/// next (or the last).
pub const MAX_ADMIN_TOKENS: usize = 2;

/// `ADMIN_TOKEN`: refused when blank (an empty token would match a request without any
/// `Authorization` header), too short to be secret, or the demo's published token (unless
/// `allow_demo`). The message never shows the token.
pub fn check_admin_token(token: &SecretString, allow_demo: bool) -> Result<(), String> {
    let raw = token.expose_secret();
    if raw.trim().is_empty() {
        return Err(
            "ADMIN_TOKEN is empty or blank; leave it unset to disable the admin routes".into(),
        );
    }
    let chars = raw.chars().count();
    if chars < MIN_ADMIN_TOKEN_CHARS {
        return Err(format!(
            "ADMIN_TOKEN has {chars} characters; use at least {MIN_ADMIN_TOKEN_CHARS} (for example `openssl rand -hex 16`)"
        ));
    }
    if raw == DEMO_ADMIN_TOKEN && !allow_demo {
        return Err("ADMIN_TOKEN is the demo's token, published in docker-compose.yml: make a token of your own (`openssl rand -hex 16`), or set ALLOW_DEMO_ADMIN_TOKEN=true in a demo".into());
    }
    Ok(())
}

/// The tokens in an `ADMIN_TOKEN_FILE`: one or two, one per line (blank lines and the
/// whitespace around each ignored), each as [`check_admin_token`] wants it. The message
/// names the file and the line, never a token.
pub fn read_admin_tokens(path: &Path, allow_demo: bool) -> Result<Vec<SecretString>, String> {
    let shown = path.display();
    let content = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read ADMIN_TOKEN_FILE {shown}: {e}"))?;
    let mut tokens = Vec::new();
    for (number, line) in content.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let token = SecretString::from(line);
        check_admin_token(&token, allow_demo)
            .map_err(|why| format!("ADMIN_TOKEN_FILE {shown}, line {}: {why}", number + 1))?;
        tokens.push(token);
    }
    match tokens.len() {
        0 => Err(format!("ADMIN_TOKEN_FILE {shown} holds no token")),
        1..=MAX_ADMIN_TOKENS => Ok(tokens),
        n => Err(format!(
            "ADMIN_TOKEN_FILE {shown} holds {n} tokens; at most {MAX_ADMIN_TOKENS} (the current one and, during a rotation, one more)"
        )),
    }
}

impl Settings {
    /// Settings for tests and embedding: every default, with this database and Redis.
    pub fn new(database_url: &str, redis_url: &str) -> Self {
        Self::parse_from([
            "seckill",
            "--database-url",
            database_url,
            "--redis-url",
            redis_url,
        ])
    }

    /// `HOLD_MS`, or when unset [`DEFAULT_HOLD`], shortened to stay below half of
    /// `LOCK_WAIT_MS`.
    pub fn hold(&self) -> Duration {
        self.sale.hold.unwrap_or_else(|| {
            let wait_ms = u64::try_from(self.lock.wait.as_millis()).unwrap_or(u64::MAX);
            DEFAULT_HOLD
                .min(Duration::from_millis(wait_ms.saturating_sub(1) / 2))
                .max(Duration::from_millis(1))
        })
    }

    /// Every setting in its range, then the rules that tie settings together.
    ///
    /// # Errors
    /// A message naming the settings.
    pub fn check(&self) -> Result<(), String> {
        self.ranges()?;
        work_ends_before_a_waiting_batch_gives_up(&self.lock, &self.sale, &self.database)?;
        if let Some(token) = &self.http.admin_token {
            check_admin_token(token, self.http.allow_demo_admin_token)?;
        }
        if self.database.url().is_empty() {
            return Err("set DATABASE_URL or DATABASE_URL_FILE".into());
        }
        let (public, ops) = (self.http.bind_addr, self.http.ops_bind_addr);
        if public.port() != 0 && public == ops {
            return Err(format!(
                "BIND_ADDR and OPS_BIND_ADDR are both {public}: the operators' listener needs an address of its own"
            ));
        }
        hold_is_below_half_the_wait(self.hold(), self.lock.wait)?;
        work_ends_before_postgres_ends_the_transaction(&self.sale, &self.database)?;
        sentinels_name_their_primary(&self.redis)?;
        redlock_has_masters(&self.lock)?;
        zookeeper_session_outlasts_two_leases(&self.lock)?;
        zookeeper_has_an_ensemble(&self.lock)?;
        etcd_has_endpoints(&self.lock)?;
        redis_tls_is_all_or_nothing(&self.redis, &self.lock)?;
        etcd_ca_has_only_tls_endpoints(&self.lock)?;
        lock_names_hold_no_slash(&self.lock, &self.redis)?;
        buyers_have_a_key(&self.identity)
    }

    /// Every numeric setting in its range (`range.rs`) (settings built in code skip clap's check).
    fn ranges(&self) -> Result<(), String> {
        let (lock, sale, db) = (&self.lock, &self.sale, &self.database);
        range::HTTP_MAX_CONNECTIONS.check(self.http.max_connections)?;
        range::HTTP_REQUEST_TIMEOUT.check(self.http.request_timeout)?;
        range::HTTP_KEEP_ALIVE.check(self.http.keep_alive)?;
        range::LOCK_TTL.check(lock.ttl)?;
        range::LOCK_WAIT.check(lock.wait)?;
        range::BATCH_MAX.check(sale.batch_max)?;
        range::HOLD.check(self.hold())?;
        range::QUEUE_MAX.check(sale.queue_max)?;
        range::SOLD_OUT_RECHECK.check(sale.sold_out_recheck)?;
        range::WORK.check(sale.work)?;
        range::MAX_QUANTITY.check(sale.max_quantity)?;
        range::DATABASE_MAX_CONNECTIONS.check(db.max_connections)?;
        range::DATABASE_READ_CONNECTIONS.check(db.read_connections)?;
        range::DATABASE_ACQUIRE_TIMEOUT.check(db.acquire_timeout)?;
        range::PG_STATEMENT_TIMEOUT.check(db.statement_timeout)?;
        range::PG_LOCK_TIMEOUT.check(db.lock_timeout)?;
        range::PG_IDLE_IN_TRANSACTION_TIMEOUT.check(db.idle_in_transaction_timeout)?;
        range::ZOOKEEPER_SESSION_TIMEOUT.check(lock.zookeeper_session_timeout)?;
        let limits = &self.limits;
        range::BUYER_JWT_LEEWAY.check(self.identity.leeway_s)?;
        range::BUYER_RATE.check(limits.buyer_rate)?;
        range::BUYER_BURST.check(limits.buyer_burst)?;
        range::ADDRESS_RATE.check(limits.address_rate)?;
        range::ADDRESS_BURST.check(limits.address_burst)
    }
}

/// The purchase strategies; each one's way of selling a batch lives under `sale/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum LockStrategy {
    /// Redis lock `lock_sale_<id>` with watchdog and fencing, then one transaction per batch.
    Redis,
    /// The same lock on a majority of the masters in REDLOCK_URLS (Redlock), same fencing.
    Redlock,
    /// The same lock in a PostgreSQL lock table (the seed's database lock), same fencing.
    PgLock,
    /// The same lock in ZooKeeper (ZOOKEEPER_CONNECT; the seed's third lock), its fence the
    /// holder node's creation zxid; waiters queue in arrival order.
    #[value(name = "zookeeper")]
    ZooKeeper,
    /// The same lock in etcd (ETCD_ENDPOINTS), its fence the holder key's create revision;
    /// waiters queue in arrival order.
    Etcd,
    /// `SELECT ... FOR UPDATE` on the product row.
    PgRow,
    /// Optimistic: compare-and-set on a version column, with bounded retries.
    PgOptimistic,
    /// One guarded `UPDATE ... WHERE stock >= sold`: no lock at all needed.
    PgAtomic,
    /// Read-modify-write with no lock: UNSAFE, shows the lost update.
    None,
}

impl LockStrategy {
    /// The name as given in `LOCK_STRATEGY`.
    pub fn name(self) -> &'static str {
        match self {
            LockStrategy::Redis => "redis",
            LockStrategy::Redlock => "redlock",
            LockStrategy::PgLock => "pg-lock",
            LockStrategy::ZooKeeper => "zookeeper",
            LockStrategy::Etcd => "etcd",
            LockStrategy::PgRow => "pg-row",
            LockStrategy::PgOptimistic => "pg-optimistic",
            LockStrategy::PgAtomic => "pg-atomic",
            LockStrategy::None => "none",
        }
    }

    /// Whether the strategy needs `REDIS_URL` to sell at all (the others only use it for
    /// restock messages, and start and sell without it; Redlock locks on REDLOCK_URLS).
    pub fn needs_redis(self) -> bool {
        matches!(self, LockStrategy::Redis)
    }

    /// Whether the lock lives in a consensus service (ZooKeeper, etcd), whose fences the
    /// server assigns.
    pub fn locks_in_consensus(self) -> bool {
        matches!(self, LockStrategy::ZooKeeper | LockStrategy::Etcd)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults, with a database, a Redis and a buyer key.
    fn sample() -> Settings {
        let mut settings = Settings::new("postgres://x", "redis://r");
        settings.identity.secret = Some("a-buyer-secret-of-at-least-32-bytes".into());
        settings
    }

    #[test]
    fn start_up_refuses_buyers_without_a_key_unless_identity_is_off() {
        let mut settings = Settings::new("postgres://x", "redis://r");
        let why = settings.check().unwrap_err();
        assert!(why.contains("BUYER_JWT_SECRET"), "{why}");
        assert!(why.contains("BUYER_IDENTITY=off"), "{why}");
        settings.identity.secret = Some("too-short".into());
        let why = settings.check().unwrap_err();
        assert!(why.contains("at least 32"), "{why}");
        assert!(
            !why.contains("too-short"),
            "the message shows the secret: {why}"
        );
        settings.identity.secret = Some("a-buyer-secret-of-at-least-32-bytes".into());
        assert_eq!(settings.check(), Ok(()));
        settings.identity.algorithm = JwtAlgorithm::RS256;
        let why = settings.check().unwrap_err();
        assert!(why.contains("asymmetric"), "{why}");
        settings.identity.secret = None;
        settings.identity.public_key_file = Some("key.pem".into());
        assert_eq!(settings.check(), Ok(()));
        settings.identity.jwks_file = Some("jwks.json".into());
        assert!(settings.check().unwrap_err().contains("only one"));
        let mut off = Settings::new("postgres://x", "redis://r");
        off.identity.mode = BuyerIdentity::Off;
        assert_eq!(off.check(), Ok(()));
    }

    #[test]
    fn migrate_only_is_a_flag_that_may_also_take_a_value() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["seckill", "--database-url", "x"];
            args.extend(extra);
            Settings::try_parse_from(args).map(|s| s.database.migrate_only)
        };

        assert!(matches!(parse(&[]), Ok(false)));
        assert!(matches!(parse(&["--migrate-only"]), Ok(true)));
        assert!(matches!(parse(&["--migrate-only", "true"]), Ok(true)));
        assert!(matches!(parse(&["--migrate-only=false"]), Ok(false)));
        assert!(parse(&["--migrate-only", "soon"]).is_err());
    }

    #[test]
    fn redis_and_etcd_over_tls_are_all_or_nothing() {
        let ca = CaFile {
            path: "ca.pem".into(),
            pem: std::sync::Arc::from(b"-----BEGIN CERTIFICATE-----".as_slice()),
        };
        let mut redis = sample();
        redis.redis.ca_file = Some(ca.clone());
        let plain = redis.check().unwrap_err();
        redis.lock.strategy = LockStrategy::Redlock;
        redis.lock.redlock_urls = vec!["rediss://a".into(), "REDISS://b".into()];
        let redlock_over_tls_beside_a_plain_redis = redis.check().unwrap_err();
        redis.redis.url = "valkeys://r".into();
        let all_over_tls = redis.check();
        redis.lock.redlock_urls.push("redis://:secret@c".into());
        let one_master_plain = redis.check().unwrap_err();
        redis.lock.strategy = LockStrategy::Redis;
        let redlock_unused = redis.check();
        redis.redis.sentinels = vec!["redis://s:26379".into()];
        let ca_with_sentinels = redis.check().unwrap_err();
        let mut sentinels = sample();
        sentinels.redis.sentinels = vec!["rediss://s:26379".into()];
        let sentinels_over_tls = sentinels.check().unwrap_err();
        let mut etcd = sample();
        etcd.lock.etcd_ca_file = Some(ca);
        let unused = etcd.check().unwrap_err();
        etcd.lock.strategy = LockStrategy::Etcd;
        etcd.lock.etcd_endpoints = vec!["HTTPS://e1:2379".into(), "http://e2:2379".into()];
        let one_plain = etcd.check().unwrap_err();
        etcd.lock.etcd_endpoints.pop();
        let all_tls = etcd.check();

        assert!(
            plain.contains("REDIS_CA_FILE (ca.pem)") && plain.contains("redis://r"),
            "{plain}"
        );
        assert!(redlock_over_tls_beside_a_plain_redis.contains("redis://r"));
        assert_eq!(all_over_tls, Ok(()));
        assert!(
            one_master_plain.contains("redis://***@c"),
            "{one_master_plain}"
        );
        assert!(!one_master_plain.contains("secret"), "{one_master_plain}");
        assert_eq!(redlock_unused, Ok(()), "REDLOCK_URLS unused under redis");
        assert!(
            ca_with_sentinels.contains("REDIS_SENTINELS"),
            "{ca_with_sentinels}"
        );
        assert!(
            sentinels_over_tls.contains("not supported over TLS"),
            "{sentinels_over_tls}"
        );
        assert!(unused.contains("LOCK_STRATEGY is redis"), "{unused}");
        assert!(one_plain.contains("http://e2:2379"), "{one_plain}");
        assert_eq!(all_tls, Ok(()));
    }

    #[test]
    fn limits_and_proxies_are_read_from_the_command_line() {
        let parsed = Settings::try_parse_from([
            "seckill",
            "--database-url",
            "x",
            "--trusted-proxies",
            "10.0.0.0/8,192.168.1.7/32",
            "--buyer-rate",
            "0",
        ])
        .unwrap();
        assert_eq!(parsed.limits.trusted_proxies.len(), 2);
        assert_eq!(parsed.limits.buyer_rate, 0);
        assert_eq!(parsed.limits.buyer_burst, 10);
        let bad = Settings::try_parse_from([
            "seckill",
            "--database-url",
            "x",
            "--trusted-proxies",
            "10.0.0.300",
        ]);
        assert!(bad.is_err(), "a bad proxy address was accepted");
        let bad =
            Settings::try_parse_from(["seckill", "--database-url", "x", "--buyer-burst", "0"]);
        assert!(bad.is_err(), "a burst of 0 was accepted");
    }

    #[test]
    fn every_strategy_name_is_what_lock_strategy_accepts() {
        for strategy in LockStrategy::value_variants() {
            let accepted = strategy.to_possible_value().expect("not hidden");
            assert_eq!(accepted.get_name(), strategy.name());
        }
    }

    #[test]
    fn an_empty_blank_or_short_admin_token_is_refused_with_the_settings_name() {
        for bad in ["", "   ", "\t\n", "short-token"] {
            let why = check_admin_token(&bad.into(), false).expect_err(bad);
            assert!(why.contains("ADMIN_TOKEN"), "{why}");
            if !bad.trim().is_empty() {
                assert!(!why.contains(bad), "the message shows the token: {why}");
            }
        }
        assert!(check_admin_token(&"0123456789abcdef".into(), false).is_ok());
    }

    #[test]
    fn the_demo_admin_token_is_refused_unless_the_demo_allows_it() {
        let demo = SecretString::from(DEMO_ADMIN_TOKEN);
        let why = check_admin_token(&demo, false).unwrap_err();
        assert!(why.contains("docker-compose.yml"), "{why}");
        assert!(
            !why.contains(DEMO_ADMIN_TOKEN),
            "the message shows the token: {why}"
        );
        assert!(check_admin_token(&demo, true).is_ok());
        let mut settings = Settings::new("postgres://db/seckill", "redis://r");
        settings.identity.secret = Some("a-buyer-key-of-at-least-32-bytes-0123".into());
        settings.http.admin_token = Some(demo);
        assert!(settings.check().is_err());
        settings.http.allow_demo_admin_token = true;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn the_compose_stack_publishes_the_token_the_service_refuses() {
        let compose = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docker-compose.yml"
        ))
        .unwrap();
        assert!(compose.contains(DEMO_ADMIN_TOKEN));
        assert!(compose.contains("ALLOW_DEMO_ADMIN_TOKEN"));
    }

    #[test]
    fn an_admin_token_file_holds_one_or_two_good_tokens() {
        let dir = std::env::temp_dir().join(format!("seckill-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("admin-token");
        let read = |content: &str| {
            std::fs::write(&file, content).unwrap();
            read_admin_tokens(&file, false)
        };
        let one = read("0123456789abcdef-one\n").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].expose_secret(), "0123456789abcdef-one");
        assert_eq!(
            read("\n  0123456789abcdef-one \n\n0123456789abcdef-two\n")
                .unwrap()
                .len(),
            2
        );
        for (bad, says) in [
            ("", "no token"),
            ("short\n", "line 1"),
            ("0123456789abcdef-one\nshort", "line 2"),
            (
                "0123456789abcdef-one\n0123456789abcdef-two\n0123456789abcdef-3",
                "3 tokens",
            ),
            (DEMO_ADMIN_TOKEN, "docker-compose.yml"),
        ] {
            let why = read(bad).unwrap_err();
            assert!(why.contains(says), "{bad:?}: {why}");
            assert!(
                !why.contains("0123456789abcdef"),
                "the message shows a token: {why}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            read_admin_tokens(&file, false)
                .unwrap_err()
                .contains("cannot read")
        );
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let mut settings = Settings::new(
            "postgres://app:hunter2-password@db/seckill",
            "redis://:redis-password@r",
        );
        settings.http.admin_token = Some("super-secret-admin-token".into());
        settings.identity.secret = Some("super-secret-buyer-key-0123456789abcdef".into());
        let shown = format!("{settings:?}");
        assert!(!shown.contains("super-secret-buyer-key"), "{shown}");
        assert!(!shown.contains("hunter2-password"), "{shown}");
        assert!(!shown.contains("super-secret-admin-token"), "{shown}");
        assert!(!shown.contains("redis-password"), "{shown}");
    }

    #[test]
    fn settings_built_in_code_are_held_to_the_ranges_the_command_line_is() {
        type Spoil = fn(&mut Settings);
        let cases: [(&str, Spoil); 4] = [
            ("BATCH_MAX", |s| s.sale.batch_max = 0),
            ("QUEUE_MAX", |s| s.sale.queue_max = 0),
            ("SOLD_OUT_RECHECK_MS", |s| {
                s.sale.sold_out_recheck = Duration::ZERO
            }),
            ("DATABASE_MAX_CONNECTIONS", |s| {
                s.database.max_connections = 0
            }),
        ];
        for (name, spoil) in cases {
            let mut settings = sample();
            assert_eq!(settings.check(), Ok(()));
            spoil(&mut settings);
            let why = settings.check().expect_err(name);
            assert!(why.starts_with(name), "{name}: {why}");
            // The command line refuses the same value.
            let flag = format!("--{}", name.to_lowercase().replace('_', "-"));
            let parsed = Settings::try_parse_from([
                "seckill",
                "--database-url",
                "postgres://x",
                flag.as_str(),
                "0",
            ]);
            assert!(parsed.is_err(), "{flag} 0 was accepted");
        }
    }

    #[test]
    fn under_pg_row_the_work_must_end_before_a_waiting_batch_gives_up() {
        let mut settings = sample();
        settings.lock.strategy = LockStrategy::PgRow;
        settings.sale.work = Duration::from_millis(2_000);
        settings.database.lock_timeout = Duration::from_millis(2_000);
        assert!(settings.check().unwrap_err().contains("PG_LOCK_TIMEOUT_MS"));
        settings.lock.strategy = LockStrategy::Redis;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn an_unset_hold_ms_stays_below_half_a_short_lock_wait_and_a_set_one_is_checked() {
        let mut settings = sample();
        assert_eq!(settings.hold(), DEFAULT_HOLD);
        settings.lock.wait = Duration::from_millis(150);
        assert_eq!(
            settings.check(),
            Ok(()),
            "the default adapts to a short wait"
        );
        assert_eq!(settings.hold(), Duration::from_millis(74));
        settings.sale.hold = Some(Duration::from_millis(100));
        let why = settings.check().unwrap_err();
        assert!(why.contains("HOLD_MS (100)"), "{why}");
    }

    #[test]
    fn under_zookeeper_the_session_must_last_at_least_twice_the_lock_ttl() {
        let mut settings = sample();
        settings.lock.strategy = LockStrategy::ZooKeeper;
        assert_eq!(settings.check(), Ok(()), "the defaults fit together");
        settings.lock.ttl = Duration::from_millis(5_001);
        let why = settings.check().unwrap_err();
        assert!(
            why.contains("ZOOKEEPER_SESSION_TIMEOUT_MS (10000)"),
            "{why}"
        );
        assert!(why.contains("twice LOCK_TTL_MS (5001)"), "{why}");
        // The session timeout means nothing to the other strategies.
        settings.lock.strategy = LockStrategy::Etcd;
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn a_lock_name_prefix_with_a_slash_is_refused_where_lock_names_cannot_hold_one() {
        let mut settings = sample();
        settings.redis.key_prefix = "shop/a:".into();
        assert_eq!(settings.check(), Ok(()), "Redis keys may hold a '/'");
        for strategy in [LockStrategy::ZooKeeper, LockStrategy::Etcd] {
            settings.lock.strategy = strategy;
            let why = settings.check().unwrap_err();
            assert!(why.starts_with("REDIS_KEY_PREFIX"), "{why}");
        }
    }

    #[test]
    fn etcd_endpoints_are_comma_separated_with_a_local_default() {
        let parsed = Settings::parse_from(["seckill", "--database-url", "x"]);
        assert_eq!(parsed.lock.etcd_endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(parsed.lock.zookeeper_connect, "127.0.0.1:2181");
        let parsed = Settings::parse_from([
            "seckill",
            "--database-url",
            "x",
            "--etcd-endpoints",
            "http://a:2379,http://b:2379",
        ]);
        assert_eq!(
            parsed.lock.etcd_endpoints,
            ["http://a:2379", "http://b:2379"]
        );
    }

    #[test]
    fn work_inside_a_transaction_must_end_before_postgres_ends_the_session() {
        let mut settings = sample();
        settings.sale.work = Duration::from_millis(6_000);
        assert!(
            settings
                .check()
                .unwrap_err()
                .contains("PG_IDLE_IN_TRANSACTION_TIMEOUT_MS")
        );
    }
}
