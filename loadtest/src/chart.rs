//! The demo's chart: one SVG comparing the strategies, drawn with `plotters`.
//!
//! Four panels: orders per second at full load; p99 latency of the purchases that got an
//! order; oversold units and lost updates; and orders over time, one line per strategy.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;

/// What the chart shows of one demo row.
pub struct Bar {
    /// Short label on the x axis.
    pub label: String,
    pub orders_per_sec: f64,
    pub created_p99_ms: f64,
    pub oversold: i64,
    pub lost_updates: i64,
    /// Orders answered in each `bin` of the attack.
    pub orders_over_time: Vec<u64>,
}

/// The width of one bin of `orders_over_time`.
pub const BIN: Duration = Duration::from_millis(250);

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Draw the chart of `bars` into an SVG file at `path`, under `title`.
///
/// # Errors
/// When the file cannot be written.
pub fn draw(path: &Path, title: &str, bars: &[Bar]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1280, 960)).into_drawing_area();
    root.fill(&WHITE).context("drawing the chart")?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .context("drawing the chart")?;
    let panels = root.split_evenly((2, 2));
    bar_panel(
        &panels[0],
        "orders/s at full load (higher is better)",
        bars,
        |b| vec![b.orders_per_sec],
    )?;
    bar_panel(
        &panels[1],
        "p99 latency of purchases that got an order, ms (lower is better)",
        bars,
        |b| vec![b.created_p99_ms],
    )?;
    bar_panel(
        &panels[2],
        "oversold units (left) and lost updates (right): 0 unless unsafe",
        bars,
        |b| vec![b.oversold.max(0) as f64, b.lost_updates.max(0) as f64],
    )?;
    timeline_panel(&panels[3], bars)?;
    root.present().context("writing the chart")?;
    Ok(())
}

/// One bar (or a group of bars) per row.
fn bar_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    bars: &[Bar],
    values: impl Fn(&Bar) -> Vec<f64>,
) -> anyhow::Result<()> {
    let top = bars
        .iter()
        .flat_map(&values)
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..top)
        .context("drawing a panel")?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_style(("sans-serif", 11))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                bars.get(i as usize)
                    .map_or(String::new(), |b| b.label.clone())
            } else {
                String::new()
            }
        })
        .draw()
        .context("drawing a panel")?;
    for (i, bar) in bars.iter().enumerate() {
        let group = values(bar);
        let width = 0.8 / group.len() as f64;
        for (j, value) in group.iter().enumerate() {
            let left = i as f64 - 0.4 + width * j as f64;
            let style = color(i).mix(if j == 0 { 0.9 } else { 0.45 }).filled();
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(left, 0.0), (left + width * 0.95, *value)],
                    style,
                )))
                .context("drawing a bar")?;
        }
    }
    Ok(())
}

/// Cumulative orders over time, one line per row.
fn timeline_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, bars: &[Bar]) -> anyhow::Result<()> {
    let longest = bars
        .iter()
        .map(|b| b.orders_over_time.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let most: u64 = bars
        .iter()
        .map(|b| b.orders_over_time.iter().sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1);
    let seconds = longest as f64 * BIN.as_secs_f64();
    let mut chart = ChartBuilder::on(area)
        .caption("orders over time (cumulative)", ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..most as f64 * 1.05)
        .context("drawing the timeline")?;
    chart
        .configure_mesh()
        .x_desc("seconds since the attack started")
        .x_label_style(("sans-serif", 11))
        .draw()
        .context("drawing the timeline")?;
    for (i, bar) in bars.iter().enumerate() {
        let mut total = 0u64;
        let points = bar.orders_over_time.iter().enumerate().map(|(t, n)| {
            total += n;
            ((t + 1) as f64 * BIN.as_secs_f64(), total as f64)
        });
        let points: Vec<(f64, f64)> = std::iter::once((0.0, 0.0)).chain(points).collect();
        chart
            .draw_series(LineSeries::new(points, color(i).stroke_width(2)))
            .context("drawing a line")?
            .label(bar.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color(i)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .context("drawing the legend")?;
    Ok(())
}
