//! The command line: an attack (the default), `demo`, `bench-http`, `chaos`, and the hidden
//! `serve`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use goose::config::GooseConfiguration;

/// Floods seckill instances with buyers, then checks the books in PostgreSQL.
///
/// Without a subcommand it attacks running instances (`--hosts`) and prints a verdict; it
/// stops as soon as the sale is decided (every buyer answered, or the stock gone), with
/// goose's `--run-time` (default 60 s) as the upper bound. `loadtest demo` starts its own
/// instances for every lock strategy and compares them. Goose's own options (users,
/// increase rate, run time, reports, thresholds, ...) follow ours; `--host`,
/// `--throttle-requests` and `--timeout` are refused, since purchases go through this
/// tool's own client.
#[derive(Debug, Parser)]
#[command(
    name = "loadtest",
    args_conflicts_with_subcommands = true,
    disable_version_flag = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub attack: AttackArgs,
    #[command(flatten)]
    pub goose: GooseConfiguration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start fresh instances for each lock strategy, attack each the same way, compare.
    Demo(DemoArgs),
    /// Measure instances with wrk (Debian's `wrk` package) against the ceiling, PostgreSQL
    /// selling from one row with nothing in front of it (pgbench, from Debian's
    /// `postgresql-client`): `redis` on one instance at 64 and 1,000 connections, on three
    /// instances, and --products products at once on three instances (round robin, and
    /// through the compose stack's router, Debian's `haproxy`) and on one; the other
    /// strategies, batched and per request; the sold-out path against `/healthz`; and the CPU
    /// each order costs, split by where it is spent.
    BenchHttp(BenchArgs),
    /// A fault soak: a sale with restocks on instances of its own while a nemesis injects
    /// faults drawn from a seed (kills, pauses past the lease, Redis and PostgreSQL
    /// restarts, fence counters set back, terminated sessions, slow and cut links, and
    /// under zookeeper, etcd and redlock the lock's own servers killed and paused); then every
    /// answer is checked against PostgreSQL. Exits 0 only with no violation.
    Chaos(ChaosArgs),
    /// Run one seckill instance (what `demo` starts, as a child process).
    #[command(hide = true)]
    Serve(Box<seckill::Settings>),
}

/// What one attack sells and to whom.
#[derive(Debug, Clone, Args)]
pub struct AttackArgs {
    /// The instances to attack, comma-separated; requests are spread over all of them.
    #[arg(
        long,
        env = "LOADTEST_HOSTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080"
    )]
    pub hosts: Vec<String>,

    /// Units of the product the attack creates and sells.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=1_000_000_000))]
    pub stock: i64,

    /// Distinct buyers (user ids 1..=N). Each buys one unit; one in ten first asks two
    /// instances at once.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub buyers: u64,

    /// Add this many units once half the stock is sold (an admin restock during the sale).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..=1_000_000_000))]
    pub restock: i64,

    /// Admin token of the instances, to create the product (and restock it).
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// The operators' listener (OPS_BIND_ADDR) of one of the instances, where the product is
    /// created and restocked: admin routes are not on the buyers' listener.
    #[arg(
        long,
        env = "LOADTEST_OPS_HOST",
        default_value = "http://127.0.0.1:9080"
    )]
    pub ops_host: String,

    /// The instances' BUYER_JWT_SECRET: the attack signs each buyer's token (HS256) with it,
    /// as their identity provider would. Default: the public demo key of the instances this
    /// tool starts itself.
    #[arg(long, env = "BUYER_JWT_SECRET", hide_env_values = true)]
    pub buyer_jwt_secret: Option<String>,

    /// The instances' PostgreSQL, read directly to check the books.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Seconds to wait after printing the verdict, before exiting. The compose stack waits
    /// 5: `docker compose up --exit-code-from loadtest` stops every service when the load
    /// test exits, and the sale lasts about a second, so without the wait Prometheus (which
    /// scrapes every second) might not see the instances after it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub linger_secs: u64,
}

/// How the demo runs.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// PostgreSQL server for the demo's throwaway databases (one per strategy). Without it,
    /// the demo uses 127.0.0.1:5432 if PostgreSQL answers there, and otherwise starts a
    /// private one (initdb in a temporary directory) and removes it afterwards.
    #[arg(long)]
    pub database_url: Option<String>,

    /// Redis for the instances (keys go under a prefix unique to the run). Without it, as
    /// for PostgreSQL: 127.0.0.1:6379 if it answers without a password, or a private
    /// redis-server.
    #[arg(long)]
    pub redis_url: Option<String>,

    /// Independent Redis masters for the `redlock` strategy, comma-separated. Without them,
    /// `redlock` runs on three private redis-servers.
    #[arg(long, value_delimiter = ',')]
    pub redlock_urls: Vec<String>,

    /// ZooKeeper for the `zookeeper` strategy, as a connect string (host:port,...). Without
    /// it, the demo uses 127.0.0.1:2181 if something answers there, and otherwise starts a
    /// private ZooKeeper (Debian's zookeeper and libslf4j-java packages, and Java) with its
    /// data in a temporary directory, and removes it afterwards.
    #[arg(long, value_name = "HOST:PORT,...")]
    pub zookeeper_connect: Option<String>,

    /// etcd for the `etcd` strategy, comma-separated endpoints (http://host:2379,...).
    /// Without them, as for ZooKeeper: 127.0.0.1:2379, or a private etcd (Debian's
    /// etcd-server package).
    #[arg(long, value_name = "URL,...")]
    pub etcd_endpoints: Option<String>,

    /// Strategies to compare, comma-separated, each with BATCH_MAX = --batch-max. Leave
    /// zookeeper and etcd out on a machine without them (the demo stops at its start
    /// otherwise, saying what to install).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,redlock,pg-lock,zookeeper,etcd,pg-row,pg-optimistic,pg-atomic,none"
    )]
    pub strategies: Vec<seckill::LockStrategy>,

    /// Strategies to run once more with BATCH_MAX=1, one purchase per transaction (the
    /// per-request baseline), comma-separated, from the same list as --strategies; "" for
    /// none. They sell --per-request-stock units.
    #[arg(long, value_delimiter = ',', default_value = "redis,pg-atomic", value_parser = strategy_or_nothing)]
    pub per_request: Vec<Option<seckill::LockStrategy>>,

    /// BATCH_MAX of the batched runs (the service's default).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_max: u32,

    /// Instances per run, each a separate process.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub instances: u16,

    /// Units on sale in each batched run: a sale of a few seconds at full load on a
    /// two-core machine.
    #[arg(long, default_value_t = 25_000, value_parser = clap::value_parser!(i64).range(1..=10_000_000))]
    pub stock: i64,

    /// Products each run sells at once: the run's stock is split over them (the first ones
    /// taking the remainder) and its buyers spread over them (buyer b buys product
    /// (b - 1) % N only). Every product's books must balance, and all of them together.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub products: u64,

    /// Distinct buyers in each batched run (more than the stock, so it sells out). The
    /// per-request runs get as many buyers per unit.
    #[arg(long, default_value_t = 37_500, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub buyers: u64,

    /// Units on sale in each per-request run (at most --stock). One purchase per
    /// transaction sells a few hundred orders/s on a two-core machine: sized so that such a
    /// run sells out well within --max-seconds.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(i64).range(1..=10_000_000))]
    pub per_request_stock: i64,

    /// Concurrent simulated users (goose users), all started in the first second.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub users: u64,

    /// Upper bound on each run's attack, in seconds (it ends earlier, once the sale is
    /// decided). A run that reaches it before selling out is reported INCOMPLETE, which
    /// does not fail the demo by itself.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub max_seconds: u64,

    /// WORK_MS for the instances: pretend work inside each batch's critical section. 0
    /// measures the strategies' own cost (`none` races without it too); more widens the
    /// window in which `none` races, and shows what a long critical section costs each
    /// strategy.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub work_ms: u64,

    /// Where to write the SVG chart comparing the strategies.
    #[arg(long, default_value = "demo-chart.svg")]
    pub chart: PathBuf,
}

/// How `bench-http` runs.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// PostgreSQL server for the throwaway databases (as for `demo`).
    #[arg(long)]
    pub database_url: Option<String>,

    /// Redis (as for `demo`).
    #[arg(long)]
    pub redis_url: Option<String>,

    /// Seconds per wrk run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,

    /// Rounds; the runs alternate and each figure is the median of its rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=50))]
    pub rounds: u64,

    /// Products sold at once in the runs over several products (on three instances, on one,
    /// and through the router). On three instances each wrk process runs a thread per
    /// product (up to its connections), and each product gets the connections of its
    /// threads, so that a product that sells slowly shows; on one instance and through the
    /// router one wrk process of two threads (as with one product) takes the products in
    /// turn.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(2..=1_000))]
    pub products: u64,
}

/// How `chaos` runs. It starts everything it uses itself (a private PostgreSQL and Redis on
/// free ports, a ZooKeeper or etcd ensemble, Redlock's masters or a Sentinel-watched Redis
/// under those strategies, the instances, a proxy per instance and server) and removes it
/// all when it ends, whether it passed, failed, hit an error or was stopped by Ctrl-C.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// How long the faults go on, in minutes (decimals allowed: 0.5 is 30 s); then the load
    /// stops, the books settle and everything is checked.
    #[arg(long, default_value_t = 1.0, value_parser = minutes)]
    pub minutes: f64,

    /// The seed of the fault schedule: the same seed injects the same faults, in the same
    /// order, with the same parameters. Without it, a random one (printed at the start).
    #[arg(long)]
    pub seed: Option<u64>,

    /// seckill instances, each a separate process with links of its own.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub instances: u16,

    /// The lock strategy of the instances: redis, pg-lock, pg-row, pg-optimistic, pg-atomic,
    /// redlock, zookeeper, etcd or none. Under zookeeper and etcd it starts a three-member
    /// ensemble, under redlock three Redis masters (under redis with --sentinel, a primary
    /// and a replica behind three Sentinels), and kills and pauses those too. `none` is the
    /// negative control: it must fail.
    #[arg(long, default_value = "redis", value_parser = chaos_strategy)]
    pub strategy: seckill::LockStrategy,

    /// With --strategy redis only: Redis behind Sentinel, as production runs it (a primary,
    /// a replica and three Sentinels that fail a primary over after 1 s without an
    /// answer). The instances find the primary through the Sentinels. The nemesis kills the
    /// primary (a failover) or the replica, pauses the primary past the 1 s, restarts it
    /// empty before the Sentinels notice (no failover: everything is lost), and stalls the
    /// replica before it is promoted. The instances reach Redis directly then, so network
    /// faults hit their PostgreSQL link only.
    #[arg(long)]
    pub sentinel: bool,

    /// The instances' PostgreSQL: `single`, one server, which the nemesis restarts; or
    /// `ha`, three members run by Patroni (etcd its store, `synchronous_mode_strict`) with
    /// HAProxy in front of the primary, as production fails a database over. Under `ha`
    /// the nemesis kills the primary (its synchronous standby is promoted), pauses it past
    /// Patroni's 20 s lease (a standby is promoted, and the old primary demoted when it
    /// resumes), and kills the synchronous standby, instead of restarting the server.
    #[arg(long, value_enum, default_value_t = ChaosDatabase::Single)]
    pub database: ChaosDatabase,

    /// The quiet spell before each fault, in ms (each fault is healed before it starts).
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    pub fault_every_ms: u64,

    /// Units of the product at the start.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub stock: i64,

    /// A restock (through the admin API, with an Idempotency-Key) every this many ms.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub restock_every_ms: u64,

    /// Units each restock adds. With the defaults the supply (250 units/s) is below the
    /// demand (300 buyers/s), so the product sells out between restocks.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub restock_units: i64,

    /// New buyers per second, each with a user id of their own, each at a random instance.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub buyers_per_sec: u32,

    /// Purchase requests open at once at most (a new buyer waits for a free one). Enough
    /// that the requests stuck at a paused instance leave the others busy.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=5_000))]
    pub concurrency: u64,

    /// LOCK_TTL_MS of the instances: the lease a paused instance outlives (under zookeeper
    /// their session is twice this, so at most 30000; under etcd, whose lock renews a third
    /// of the way in with time for two 1 s request timeouts, it must be at least 3000).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(500..=60_000))]
    pub lock_ttl_ms: u64,

    /// SOLD_OUT_RECHECK_MS of the instances: how long one may answer sold_out from memory
    /// after missing a restock's message; the checker allows exactly that.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub sold_out_recheck_ms: u64,

    /// Also write the figures, the fault log, every check and every violation as JSON to
    /// this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
}

/// The soak's PostgreSQL (`chaos --database`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosDatabase {
    /// One server.
    Single,
    /// Three members that fail over (Patroni, HAProxy in front).
    Ha,
}

impl ChaosDatabase {
    pub fn name(self) -> &'static str {
        match self {
            ChaosDatabase::Single => "single",
            ChaosDatabase::Ha => "ha",
        }
    }
}

/// `--minutes`: a positive number of minutes, at most a day.
fn minutes(raw: &str) -> Result<f64, String> {
    match raw.trim().parse::<f64>() {
        Ok(m) if m.is_finite() && m > 0.0 && m <= 1_440.0 => Ok(m),
        _ => Err(format!(
            "{raw:?} is not a number of minutes above 0 and at most 1440 (decimals allowed: 0.5 is 30 s)"
        )),
    }
}

/// `--strategy` of `chaos`: any strategy (chaos starts and faults the servers of each).
fn chaos_strategy(raw: &str) -> Result<seckill::LockStrategy, String> {
    use clap::ValueEnum;
    seckill::LockStrategy::from_str(raw, true).map_err(|_| {
        format!(
            "{raw:?} is not a strategy (redis, pg-lock, pg-row, pg-optimistic, pg-atomic, redlock, zookeeper, etcd, none)"
        )
    })
}

/// A strategy name, or nothing for an empty value (`--per-request ""`).
fn strategy_or_nothing(raw: &str) -> Result<Option<seckill::LockStrategy>, String> {
    use clap::ValueEnum;
    if raw.trim().is_empty() {
        return Ok(None);
    }
    seckill::LockStrategy::from_str(raw, true)
        .map(Some)
        .map_err(|_| format!("{raw:?} is not a strategy"))
}
