use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use loadtest::books::{self, Verdict};
use loadtest::cli::{AttackArgs, Cli, Command};
use loadtest::{attack, demo};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Some(Command::Serve(settings)) => seckill::run(settings).await.map(|()| true),
        Some(Command::Demo(args)) => demo::run(args).await,
        None => attack(cli.attack, cli.goose).await,
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Attack running instances; `Ok(true)` on a PASS verdict.
async fn attack(
    args: AttackArgs,
    goose: goose::config::GooseConfiguration,
) -> anyhow::Result<bool> {
    let admin_token = args
        .admin_token
        .as_deref()
        .context("--admin-token (or ADMIN_TOKEN) is needed to create the product")?;
    let database_url = args
        .database_url
        .as_deref()
        .context("--database-url (or DATABASE_URL) is needed to check the books")?;
    let product = attack::create_product(&args.hosts[0], admin_token, args.stock).await?;
    let report = attack::run(goose, &args.hosts, product, args.stock, args.buyers).await?;
    let books = books::read(database_url, product).await?;
    let verdict = Verdict::judge(&report, books);
    println!("{}", verdict.render(&report));
    Ok(verdict.passed())
}
