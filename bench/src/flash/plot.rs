//! The lateness picture: cumulative distribution of lateness per run, on a
//! logarithmic time axis (as the lateness benchmark draws it), at most 2,000
//! points a run so 200,000 orders still make a small file.

use std::path::Path;

use plotters::prelude::*;

use super::report::Report;
use crate::plot_error;

/// Points drawn per run at most.
const POINTS: usize = 2_000;

/// Writes `report`'s lateness CDFs to an SVG file.
pub(super) fn lateness_cdf(report: &Report, path: &Path) -> anyhow::Result<()> {
    const FLOOR_MS: f64 = 0.1;
    let max_ms = report
        .rows
        .iter()
        .map(|r| r.max_ms)
        .fold(100.0_f64, f64::max)
        * 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let caption = format!(
        "Flash sale: {} orders within {:.0} s, due {:.0} s later, sweeper {} (RabbitMQ {})",
        report.orders,
        report.within_s,
        report.window_s,
        super::on_off(report.sweeper),
        report.broker_version
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((FLOOR_MS..max_ms).log_scale(), 0.0..100.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("lateness = cancelled_at - due_at (ms, log scale)")
        .y_desc("% of cancelled orders")
        .draw()
        .map_err(plot_error)?;
    let colours = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    for (row, colour) in report.rows.iter().zip(colours.iter().cycle()) {
        let n = row.lateness_ms.len();
        let step = n.div_ceil(POINTS).max(1);
        let points = (0..n).step_by(step).chain((n > 0).then(|| n - 1)).map(|i| {
            (
                row.lateness_ms[i].max(FLOOR_MS),
                (i + 1) as f64 * 100.0 / n as f64,
            )
        });
        let label = format!(
            "{}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, swept {:.0}, early {}",
            row.label(),
            row.p50_ms,
            row.p99_ms,
            row.max_ms,
            row.swept,
            row.early
        );
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
