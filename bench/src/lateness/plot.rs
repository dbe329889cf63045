//! The lateness picture: cumulative distribution of lateness per design, on a
//! logarithmic time axis so milliseconds and tens of seconds fit one chart.

use std::path::Path;

use plotters::prelude::*;

use super::report::Report;
use crate::plot_error;

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
    let mut caption = format!(
        "Lateness of cancels, {} orders/s, delays {:.0}-{:.0} s ({} holding queues)",
        report.rate, report.min_delay_s, report.max_delay_s, report.queue_type
    );
    if report.burst > 0 {
        caption.push_str(&format!(
            ", + {} within {:.0} s",
            report.burst, report.burst_over_s
        ));
    }
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
    let colours = [BLUE, RED, GREEN, MAGENTA];
    for (row, colour) in report.rows.iter().zip(colours) {
        let n = row.lateness_ms.len().max(1) as f64;
        let points = row
            .lateness_ms
            .iter()
            .enumerate()
            .map(|(i, l)| (l.max(FLOOR_MS), (i + 1) as f64 * 100.0 / n));
        let label = format!(
            "{}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, early {}",
            row.design, row.p50_ms, row.p99_ms, row.max_ms, row.early
        );
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
