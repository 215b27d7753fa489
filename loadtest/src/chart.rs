//! The demo's chart: one SVG comparing the strategies, drawn with `plotters`.
//!
//! Four panels: orders per second at full load; p99 latency of the purchases that got an
//! order; oversold units and lost updates; and orders over time, one line per run. A header
//! says when, where and by which command the figures were measured.
//!
//! Made to be read at a glance, in a browser or converted to PNG (`rsvg-convert`):
//! - a strategy has one colour in every panel ([`color`]), whatever the order of the rows;
//! - a per-request run (`BATCH_MAX=1`, labelled `<strategy>/1`) is drawn the same way
//!   everywhere: a light bar with a dashed outline, a dashed line;
//! - every axis says its unit, its labels are whole numbers with thousands separators
//!   ([`thousands`]), and only those labels get a grid line.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use seckill::LockStrategy;

/// What the chart shows of one demo row.
pub struct Bar {
    pub strategy: LockStrategy,
    /// A `BATCH_MAX=1` run: one purchase per transaction.
    pub per_request: bool,
    pub orders_per_sec: f64,
    pub created_p99_ms: f64,
    pub oversold: i64,
    pub lost_updates: i64,
    /// Orders answered in each `bin` of the attack.
    pub orders_over_time: Vec<u64>,
}

impl Bar {
    /// The label on the axis and in the legend: `redis`, or `redis/1` for a per-request run.
    pub fn label(&self) -> String {
        if self.per_request {
            format!("{}/1", self.strategy.name())
        } else {
            self.strategy.name().to_owned()
        }
    }
}

/// The header: a title, and lines under it (when, where, which command, how to read it).
pub struct Header {
    pub title: String,
    pub lines: Vec<String>,
}

/// The width of one bin of `orders_over_time`.
pub const BIN: Duration = Duration::from_millis(250);

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 1000;
const FONT: &str = "sans-serif";

/// The strategy's colour, the same in every panel. The match is exhaustive on purpose: a new
/// strategy must be given a colour of its own. Dark enough to read on white, different in
/// hue from each other, and none a light tint of another (a per-request run is drawn as a
/// light tint of its strategy's colour).
pub fn color(strategy: LockStrategy) -> RGBColor {
    match strategy {
        LockStrategy::Redis => RGBColor(0, 114, 178),
        LockStrategy::Redlock => RGBColor(117, 112, 179),
        LockStrategy::PgLock => RGBColor(0, 158, 115),
        LockStrategy::ZooKeeper => RGBColor(140, 86, 75),
        LockStrategy::Etcd => RGBColor(0, 128, 128),
        LockStrategy::PgRow => RGBColor(230, 171, 2),
        LockStrategy::PgOptimistic => RGBColor(231, 41, 138),
        LockStrategy::PgAtomic => RGBColor(213, 94, 0),
        LockStrategy::None => RGBColor(80, 80, 80),
    }
}

/// `n` with a comma every three digits: `17885` as `17,885`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Whole-number ticks from 0 past `top`, two to seven of them, a step of 1, 2 or 5 times a
/// power of ten: the axis labels and the only grid lines.
pub fn ticks(top: f64) -> Vec<f64> {
    let top = top.max(1.0);
    let step = (0..)
        .map(|power| 10f64.powi(power))
        .flat_map(|scale| [scale, 2.0 * scale, 5.0 * scale])
        .find(|step| top / step <= 6.0)
        .expect("some power of ten is larger than any f64 we draw");
    let count = (top / step).ceil() as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// A linear axis with our own ticks, and grid lines at those ticks only. (plotters' own
/// `with_key_points` cannot be given a label formatter for `f64`.)
struct Ticked {
    linear: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ticked {
    fn new(range: std::ops::Range<f64>, ticks: Vec<f64>) -> Self {
        Self {
            linear: range.into(),
            ticks,
        }
    }
}

impl Ranged for Ticked {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn range(&self) -> std::ops::Range<f64> {
        self.linear.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Asked for the light grid lines: there are none.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }
}

/// Draw the chart of `bars` into an SVG file at `path`, under `header`.
///
/// # Errors
/// When the file cannot be written.
pub fn draw(path: &Path, header: &Header, bars: &[Bar]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).context("drawing the chart")?;
    let header_height = 34 + 18 * header.lines.len() as u32;
    let (top, body) = root.split_vertically(header_height);
    let centered = |size: u32| {
        TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Center, VPos::Top))
    };
    let middle = WIDTH as i32 / 2;
    top.draw_text(&header.title, &centered(20), (middle, 8))
        .context("drawing the chart")?;
    for (i, line) in header.lines.iter().enumerate() {
        top.draw_text(line, &centered(13), (middle, 36 + 18 * i as i32))
            .context("drawing the chart")?;
    }
    let panels = body.split_evenly((2, 2));
    bar_panel(
        &panels[0],
        "orders/s at full load (higher is better)",
        "orders/s",
        bars,
        |b| vec![b.orders_per_sec],
        |v| thousands(v.round() as u64),
    )?;
    bar_panel(
        &panels[1],
        "p99 latency of the purchases that got an order (lower is better)",
        "ms",
        bars,
        |b| vec![b.created_p99_ms],
        |v| {
            if v < 100.0 {
                format!("{v:.1}")
            } else {
                thousands(v.round() as u64)
            }
        },
    )?;
    bar_panel(
        &panels[2],
        "the books: oversold units (left bar), lost updates (right bar); 0 unless unsafe",
        "units",
        bars,
        |b| vec![b.oversold.max(0) as f64, b.lost_updates.max(0) as f64],
        |v| thousands(v.round() as u64),
    )?;
    timeline_panel(&panels[3], bars)?;
    root.present().context("writing the chart")?;
    Ok(())
}

/// The style of one bar, or of its outline: solid for a batched run, light for a
/// per-request one (whose outline is dashed).
fn fill(bar: &Bar) -> ShapeStyle {
    let color = color(bar.strategy);
    if bar.per_request {
        color.mix(0.3).filled()
    } else {
        color.filled()
    }
}

/// One bar (or a group of bars) per row, each group's values written above it.
fn bar_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    unit: &str,
    bars: &[Bar],
    values: impl Fn(&Bar) -> Vec<f64>,
    format: impl Fn(f64) -> String,
) -> anyhow::Result<()> {
    let highest = bars.iter().flat_map(&values).fold(0.0_f64, f64::max);
    let ticks = ticks(highest * 1.1);
    let top = *ticks.last().expect("at least two ticks");
    let n = bars.len().max(1);
    let positions: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 15))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticked::new(-0.5..(n as f64 - 0.5), positions),
            Ticked::new(0.0..top, ticks),
        )
        .context("drawing a panel")?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(BLACK.mix(0.15))
        .x_label_style((FONT, 12))
        .y_label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        // The names under the bars are drawn below, where they may take two lines.
        .x_label_formatter(&|_| String::new())
        .y_label_formatter(&|y| thousands(y.round() as u64))
        .y_desc(unit)
        .draw()
        .context("drawing a panel")?;
    bar_names(area, &chart, bars)?;
    let label_style =
        TextStyle::from((FONT, 11).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (i, bar) in bars.iter().enumerate() {
        let group = values(bar);
        let width = 0.8 / group.len() as f64;
        for (j, value) in group.iter().enumerate() {
            let left = i as f64 - 0.4 + width * j as f64;
            let right = left + width * 0.92;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(left, 0.0), (right, *value)],
                    fill(bar),
                )))
                .context("drawing a bar")?;
            if bar.per_request {
                let outline = vec![(left, 0.0), (left, *value), (right, *value), (right, 0.0)];
                chart
                    .draw_series(DashedLineSeries::new(
                        outline,
                        5,
                        3,
                        color(bar.strategy).stroke_width(2),
                    ))
                    .context("drawing a bar")?;
            }
        }
        let text: Vec<String> = group.iter().map(|v| format(*v)).collect();
        let tallest = group.iter().copied().fold(0.0_f64, f64::max);
        chart
            .draw_series(std::iter::once(Text::new(
                text.join(" / "),
                (i as f64, tallest + top * 0.01),
                label_style.clone(),
            )))
            .context("drawing a bar's value")?;
    }
    Ok(())
}

/// Each bar's name under it; every other one a line lower when two neighbours' names would
/// run into each other (eleven runs side by side in a panel half the chart wide).
fn bar_names(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &ChartContext<'_, SVGBackend<'_>, Cartesian2d<Ticked, Ticked>>,
    bars: &[Bar],
) -> anyhow::Result<()> {
    let style = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    let names: Vec<String> = bars.iter().map(Bar::label).collect();
    let widths = names
        .iter()
        .map(|name| area.estimate_text_size(name, &style).map(|(w, _)| w as i32))
        .collect::<Result<Vec<i32>, _>>()
        .context("measuring the bars' names")?;
    let centre = |i: usize| chart.backend_coord(&(i as f64, 0.0));
    let spacing = centre(1).0 - centre(0).0;
    // A little air between two names on one line.
    let crowded = widths
        .windows(2)
        .any(|pair| (pair[0] + pair[1]) / 2 + 6 > spacing);
    let (left, top) = area.get_base_pixel();
    for (i, name) in names.iter().enumerate() {
        let (x, y) = centre(i);
        let line = if crowded && i % 2 == 1 { 1 } else { 0 };
        area.draw_text(name, &style, (x - left, y - top + 8 + 15 * line))
            .context("drawing a bar's name")?;
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
    let x_ticks = ticks(seconds);
    let y_ticks = ticks(most as f64 * 1.05);
    let (right, top) = (*x_ticks.last().unwrap(), *y_ticks.last().unwrap());
    let mut chart = ChartBuilder::on(area)
        .caption("orders over time, cumulative", (FONT, 15))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticked::new(0.0..right, x_ticks),
            Ticked::new(0.0..top, y_ticks),
        )
        .context("drawing the timeline")?;
    chart
        .configure_mesh()
        .bold_line_style(BLACK.mix(0.15))
        .x_label_style((FONT, 12))
        .y_label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .x_label_formatter(&|x| thousands(x.round() as u64))
        .y_label_formatter(&|y| thousands(y.round() as u64))
        .x_desc("seconds since the attack started")
        .y_desc("orders")
        .draw()
        .context("drawing the timeline")?;
    for bar in bars {
        let mut total = 0u64;
        let points = bar.orders_over_time.iter().enumerate().map(|(t, n)| {
            total += n;
            ((t + 1) as f64 * BIN.as_secs_f64(), total as f64)
        });
        let points: Vec<(f64, f64)> = std::iter::once((0.0, 0.0)).chain(points).collect();
        let style = color(bar.strategy).stroke_width(2);
        let series = if bar.per_request {
            chart.draw_series(DashedLineSeries::new(points, 6, 4, style))
        } else {
            chart.draw_series(LineSeries::new(points, style))
        };
        let per_request = bar.per_request;
        series
            .context("drawing a line")?
            .label(bar.label())
            .legend(move |(x, y)| {
                let sample = vec![(x, y), (x + 24, y)];
                let style = style.stroke_width(3);
                if per_request {
                    DashedPathElement::new(sample, 5, 3, style).into_dyn()
                } else {
                    PathElement::new(sample, style).into_dyn()
                }
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 12))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .context("drawing the legend")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated_by_commas() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(17_885), "17,885");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn ticks_are_whole_numbers_a_few_of_them_covering_the_top() {
        for top in [
            0.3, 1.0, 7.0, 14.3, 57.0, 250.0, 3_596.0, 13_398.0, 75_000.0,
        ] {
            let ticks = ticks(top);
            assert!((2..=7).contains(&ticks.len()), "{top}: {ticks:?}");
            assert_eq!(ticks[0], 0.0);
            assert!(*ticks.last().unwrap() >= top, "{top}: {ticks:?}");
            assert!(ticks.iter().all(|t| t.fract() == 0.0), "{top}: {ticks:?}");
        }
    }

    #[test]
    fn every_strategy_has_a_colour_of_its_own() {
        use clap::ValueEnum;
        let colors: Vec<RGBColor> = LockStrategy::value_variants()
            .iter()
            .map(|s| color(*s))
            .collect();
        for (i, a) in colors.iter().enumerate() {
            for b in &colors[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
