//! The demo's table and chart.

use plotters::prelude::*;
use sluice_vendor_sim::Shape;

use crate::{Mode, Run};

fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::PerSecond => "per second",
        Shape::PerMinute => "per minute",
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::None => "no limiter",
        Mode::Split => "static split (quota / N per process)",
        Mode::Sluice => "sluice (DynamoDB)",
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// One run as a Markdown table row.
pub(crate) fn row(run: &Run) -> String {
    let sent = run.accepted + run.rejected;
    let grants: Vec<String> = run.per_process.iter().map(u64::to_string).collect();
    format!(
        "| {} | {} | {:.1}% ({} of {}) | {:.2}% ({} of {}) | {} |",
        shape_name(run.shape),
        mode_name(run.mode),
        percent(run.used, run.supply),
        run.used,
        run.supply,
        percent(run.rejected, sent),
        run.rejected,
        sent,
        grants.join(" "),
    )
}

/// The whole table, with what was run.
pub(crate) fn table(runs: &[Run], setup: &str) -> String {
    let mut out = format!(
        "{setup}; sluice configured per minute in every run.\n\n\
         | vendor enforces | limiter | vendor's supply used (heavy phases) | requests answered 429 | successful calls per process (lightest to heaviest) |\n\
         |---|---|---|---|---|\n"
    );
    for run in runs {
        out.push_str(&row(run));
        out.push('\n');
    }
    out
}

/// A panel per run: requests accepted and answered 429 each second, against the vendor's
/// sustained limit; one row of panels per vendor shape.
pub(crate) fn chart(runs: &[Run], path: &str) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let columns = runs
        .iter()
        .filter(|r| r.shape == Shape::PerSecond)
        .count()
        .max(1);
    let rows = runs.len().div_ceil(columns).max(1);
    let root = SVGBackend::new(path, (400 * columns as u32, 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((rows, columns));
    for (run, panel) in runs.iter().zip(panels.iter()) {
        draw(run, panel)?;
    }
    root.present()?;
    Ok(())
}

fn draw(
    run: &Run,
    panel: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    let seconds = run.seconds.len().max(1) as u32;
    let top = run
        .seconds
        .iter()
        .map(|(a, r)| (*a).max(*r))
        .max()
        .unwrap_or(0)
        .max((run.limit_per_second * 2.0) as u64)
        .max(1) as f64;
    let sent = run.accepted + run.rejected;
    let caption = format!(
        "vendor {}: {} ({:.0}% used, {:.1}% 429)",
        shape_name(run.shape),
        match run.mode {
            Mode::None => "no limiter",
            Mode::Split => "static split",
            Mode::Sluice => "sluice",
        },
        percent(run.used, run.supply),
        percent(run.rejected, sent),
    );
    let mut chart = ChartBuilder::on(panel)
        .caption(caption, ("sans-serif", 14))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(40)
        .build_cartesian_2d(0u32..seconds, 0f64..top * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("second")
        .y_desc("requests / s")
        .light_line_style(WHITE)
        .draw()?;
    let limit = run.limit_per_second;
    let each_second = |pick: fn(&(u64, u64)) -> u64| {
        run.seconds
            .iter()
            .enumerate()
            .map(move |(i, s)| (i as u32, pick(s) as f64))
            .collect::<Vec<_>>()
    };
    let lines = [
        (
            "vendor's limit",
            vec![(0, limit), (seconds, limit)],
            BLACK,
            1,
        ),
        ("accepted", each_second(|s| s.0), GREEN, 2),
        ("429", each_second(|s| s.1), RED, 2),
    ];
    for (label, points, color, width) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}
