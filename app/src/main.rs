use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    seckill::run(seckill::Settings::parse()).await
}
