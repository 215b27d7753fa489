//! The command line: an attack (the default), `demo`, and the hidden `serve`.

use clap::{Args, Parser, Subcommand};
use goose::config::GooseConfiguration;

/// Floods seckill instances with buyers, then checks the books in PostgreSQL.
///
/// Without a subcommand it attacks running instances (`--hosts`) and prints a verdict;
/// `loadtest demo` starts its own instances for every lock strategy and compares them.
/// Goose's own options (users, increase rate, run time, reports, ...) follow ours.
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
    /// Run one seckill instance (what `demo` starts, as a child process).
    #[command(hide = true)]
    Serve(seckill::Settings),
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

    /// Distinct buyers (user ids 1..=N). More attempts than buyers means buyers retry.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub buyers: u64,

    /// Admin token of the instances, to create the product.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// The instances' PostgreSQL, read directly to check the books.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

/// How the demo runs.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// PostgreSQL server to create the demo's throwaway databases on (one per strategy).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,

    /// Redis for the instances (keys go under a prefix unique to the run).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Independent Redis masters for the `redlock` strategy, comma-separated.
    #[arg(long, env = "REDLOCK_URLS", value_delimiter = ',')]
    pub redlock_urls: Vec<String>,

    /// Strategies to compare, comma-separated (`redlock` too, with --redlock-urls).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,pg-row,pg-optimistic,pg-atomic,none"
    )]
    pub strategies: Vec<seckill::LockStrategy>,

    /// Instances per strategy, each a separate process.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub instances: u16,

    /// Units on sale per strategy.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub stock: i64,

    /// Distinct buyers per strategy.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub buyers: u64,

    /// Concurrent simulated users (goose users).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub users: u64,

    /// Seconds each attack runs.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub seconds: u64,

    /// WORK_MS for the instances: time inside the critical section, which widens the
    /// window in which `none` races.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub work_ms: u64,
}
