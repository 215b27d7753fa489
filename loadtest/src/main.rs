use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use loadtest::attack::Cancel;
use loadtest::attack::{self, Extras};
use loadtest::books;
use loadtest::cli::{AttackArgs, Cli, Command};
use loadtest::demo;

#[tokio::main]
async fn main() -> ExitCode {
    // Before any Redis link of ours: a `rediss://` URL would otherwise find no TLS provider.
    seckill::startup::choose_tls_cryptography();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Some(Command::Serve(settings)) => seckill::run(*settings).await.map(|()| true),
        Some(Command::Demo(args)) => match Cancel::on_ctrl_c() {
            Ok(cancel) => demo::run(args, cancel).await,
            Err(error) => Err(error),
        },
        Some(Command::Chaos(args)) => match Cancel::on_ctrl_c() {
            Ok(cancel) => loadtest::chaos::run(args, cancel).await,
            Err(error) => Err(error),
        },
        Some(Command::BenchHttp(args)) => loadtest::bench::run(args).await.map(|()| true),
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

/// Attack running instances; `Ok(true)` on a PASS verdict. The books are checked and the
/// verdict printed even when goose stops early (a failed `--threshold`).
async fn attack(
    args: AttackArgs,
    goose: goose::config::GooseConfiguration,
) -> anyhow::Result<bool> {
    attack::refuse_ignored_options(&goose)?;
    if let Some(secret) = &args.buyer_jwt_secret {
        loadtest::buyers::use_secret(secret);
    }
    let admin_token = args
        .admin_token
        .as_deref()
        .context("--admin-token (or ADMIN_TOKEN) is needed to create the product")?;
    let database_url = args
        .database_url
        .as_deref()
        .context("--database-url (or DATABASE_URL) is needed to check the books")?;
    let operator = attack::Operator::new(&args.ops_host, admin_token);
    let product = attack::Product {
        id: attack::create_product(&operator.url, admin_token, args.stock).await?,
        stock: args.stock,
    };
    let extras = Extras {
        restock: args.restock,
        cancel: None,
    };
    let report = attack::run(
        goose,
        &args.hosts,
        Some(&operator),
        &[product],
        args.buyers,
        extras,
    )
    .await?;
    let verdict = books::judge(&report, &args.hosts[0], database_url).await?;
    println!("{}", verdict.render(&report));
    // The verdict stays the last line of the output.
    if args.linger_secs > 0 {
        tokio::time::sleep(std::time::Duration::from_secs(args.linger_secs)).await;
    }
    Ok(verdict.passed())
}
