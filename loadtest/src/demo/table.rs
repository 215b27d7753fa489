//! The demo's outputs: the comparison table and the chart.

use std::fmt::Write as _;
use std::path::Path;

use super::row::Row;
use super::run_info::RunInfo;
use crate::chart::{self, Bar, Header};
use crate::cli::DemoArgs;

/// The comparison table, under a header that says when, where and how it was measured.
pub fn table(args: &DemoArgs, info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n=== DEMO: {} instances per run, {} product(s) per run, {} users, WORK_MS={}; {:.1} buyers per unit ===\n\
         date: {}; machine: {}; command: {}\n\
         orders/s at full load; latency of every purchase attempt, then of those that got an order (201);\n\
         batch: BATCH_MAX (1 = one purchase per transaction, the per-request baseline); stock: of all products together",
        args.instances,
        args.products,
        args.users,
        args.work_ms,
        args.buyers as f64 / args.stock as f64,
        info.date,
        info.machine,
        info.command,
    );
    let _ = writeln!(
        out,
        "| strategy      | batch | stock | orders/s | p50 ms | p99 ms | 201 p50 ms | 201 p99 ms | oversold | lost updates | busy % | orders per instance | verdict |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    );
    for row in rows {
        let name = row.strategy.name();
        let verdict = row.verdict();
        match &row.outcome {
            Ok(f) => {
                let split: Vec<String> = f.split.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    out,
                    "| {name:<13} | {:>5} | {:>5} | {:>8.0} | {:>6.1} | {:>6.1} | {:>10.1} | {:>10.1} | {:>8} | {:>12} | {:>6.2} | {} | {verdict} |",
                    row.batch_max,
                    row.stock,
                    f.orders_per_sec,
                    f.p50_ms,
                    f.p99_ms,
                    f.created_p50_ms,
                    f.created_p99_ms,
                    f.oversold,
                    f.lost_updates,
                    f.busy_share * 100.0,
                    split.join(" / "),
                );
            }
            Err(_) => {
                let _ = writeln!(
                    out,
                    "| {name:<13} | {:>5} | {:>5} | - | - | - | - | - | - | - | - | - | {verdict} |",
                    row.batch_max, row.stock
                );
            }
        }
    }
    out
}

/// The chart of the rows that have figures, at `--chart`.
pub(super) fn draw_chart(args: &DemoArgs, info: &RunInfo, rows: &[Row]) -> anyhow::Result<()> {
    let bars: Vec<Bar> = rows
        .iter()
        .filter_map(|row| {
            let f = row.outcome.as_ref().ok()?;
            Some(Bar {
                strategy: row.strategy,
                per_request: row.batch_max == 1,
                orders_per_sec: f.orders_per_sec,
                created_p99_ms: f.created_p99_ms,
                oversold: f.oversold,
                lost_updates: f.lost_updates,
                orders_over_time: f.orders_over_time.clone(),
            })
        })
        .collect();
    if bars.is_empty() {
        return Ok(());
    }
    let per_request = rows
        .iter()
        .find(|r| r.batch_max == 1)
        .map(|r| {
            format!(
                " ({} in the per-request runs)",
                chart::thousands(r.stock as u64)
            )
        })
        .unwrap_or_default();
    let header = Header {
        title: format!(
            "seckill demo: {} instances per strategy, {} units on sale{per_request}{}, {} users",
            args.instances,
            chart::thousands(args.stock as u64),
            if args.products > 1 {
                format!(" over {} products", args.products)
            } else {
                String::new()
            },
            args.users
        ),
        lines: vec![
            format!("{} · {} · {}", info.date, info.machine, info.command),
            "solid: batches of up to BATCH_MAX purchases per transaction; light, dashed, \"/1\": BATCH_MAX=1, one purchase per transaction; compare runs of one chart, not charts".to_owned(),
        ],
    };
    chart::draw(&args.chart, &header, &bars)?;
    println!("chart: {}", display(&args.chart));
    Ok(())
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
