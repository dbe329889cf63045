//! The lateness benchmarks' figures and output files, alike: a
//! [`Distribution`] of each row's lateness, and `<name>.json`, the
//! report with every row's sorted lateness, and `<name>.svg`, each row's
//! cumulative distribution of lateness on a logarithmic time axis (so
//! milliseconds and tens of seconds fit one chart), at most 2,000 points a
//! row so 200,000 orders still make a small file.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use order_expiry_testkit::World;
use plotters::prelude::*;
use serde::Serialize;

use crate::{percentile, plot_error};

/// Points drawn per curve at most.
const POINTS: usize = 2_000;

/// Lateness below this is drawn at it (the axis is logarithmic).
const FLOOR_MS: f64 = 0.1;

/// The lateness of a run's cancelled orders (`cancelled_at - due_at`), ms:
/// the figures each lateness report prints, and the values its curve is
/// drawn from.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Distribution {
    /// Orders cancelled.
    pub cancelled: usize,
    /// Cancelled before their due time.
    pub early: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Worst.
    pub max_ms: f64,
    /// Every cancelled order's lateness, sorted.
    #[serde(skip)]
    pub sorted_ms: Vec<f64>,
}

impl Distribution {
    /// The figures of every cancelled order's lateness, ms.
    pub fn of(mut lateness_ms: Vec<f64>) -> Self {
        lateness_ms.sort_by(f64::total_cmp);
        let at = |p| percentile(&lateness_ms, p);
        Self {
            cancelled: lateness_ms.len(),
            early: lateness_ms.iter().filter(|l| **l < 0.0).count(),
            p50_ms: at(50.0),
            p90_ms: at(90.0),
            p99_ms: at(99.0),
            p999_ms: at(99.9),
            max_ms: lateness_ms.last().copied().unwrap_or(0.0),
            sorted_ms: lateness_ms,
        }
    }

    /// Its curve, labelled `<name>: p50 …, p99 …, max …, <also>early N`.
    pub(crate) fn curve(&self, name: &str, also: &str) -> Curve<'_> {
        let label = format!(
            "{name}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, {also}early {}",
            self.p50_ms, self.p99_ms, self.max_ms, self.early
        );
        Curve {
            label,
            lateness_ms: &self.sorted_ms,
        }
    }
}

/// `cancelled_at - pay_deadline` (ms) and `pay_deadline` of every cancelled
/// order of `world` whose id is `LIKE id_pattern`.
pub(crate) async fn cancelled(
    world: &World,
    id_pattern: &str,
) -> anyhow::Result<Vec<(f64, DateTime<Utc>)>> {
    let select = "SELECT extract(epoch FROM cancelled_at - pay_deadline)::float8 * 1000, \
                  pay_deadline FROM orders WHERE id LIKE $1 AND status = 'cancelled'";
    let client = world.store.client().await?;
    let rows = client.query(select, &[&id_pattern]).await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// One row of a report as a curve: its legend and its sorted lateness.
#[derive(Debug)]
pub(crate) struct Curve<'a> {
    pub(crate) label: String,
    pub(crate) lateness_ms: &'a [f64],
}

/// Writes `<name>.json` (`report`, each of its `rows` given the sorted
/// lateness of its curve as `lateness_ms_sorted`) and `<name>.svg` into
/// `dir`; returns both paths.
pub(crate) fn write(
    dir: &Path,
    name: &str,
    report: &impl Serialize,
    caption: &str,
    curves: &[Curve<'_>],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let json = dir.join(format!("{name}.json"));
    let mut value = serde_json::to_value(report)?;
    let rows = value["rows"].as_array_mut().into_iter().flatten();
    for (curve, out) in curves.iter().zip(rows) {
        out["lateness_ms_sorted"] = serde_json::json!(curve.lateness_ms);
    }
    std::fs::write(&json, serde_json::to_string_pretty(&value)? + "\n")?;
    let svg = dir.join(format!("{name}.svg"));
    plot(&svg, caption, curves)?;
    Ok((json, svg))
}

fn plot(path: &Path, caption: &str, curves: &[Curve<'_>]) -> anyhow::Result<()> {
    let max_ms = curves
        .iter()
        .flat_map(|c| c.lateness_ms.last())
        .fold(100.0_f64, |a, b| a.max(*b))
        * 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
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
    for (curve, colour) in curves.iter().zip(colours.iter().cycle()) {
        let lateness = curve.lateness_ms;
        let n = lateness.len();
        let step = n.div_ceil(POINTS).max(1);
        let points = (0..n)
            .step_by(step)
            .chain((n > 0).then(|| n - 1))
            .map(|i| (lateness[i].max(FLOOR_MS), (i + 1) as f64 * 100.0 / n as f64));
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(plot_error)?
            .label(curve.label.as_str())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_carries_each_rows_lateness_and_the_svg_each_legend() {
        let dir = std::env::temp_dir().join(format!("order-expiry-cdf-{}", std::process::id()));
        let report = serde_json::json!({"rows": [{"design": "ladder"}, {"design": "naive"}]});
        let (ladder, naive) = ([0.5, 2.0, 30.0], [-1.0, 4_000.0]);
        let curves = [
            Curve {
                label: "ladder".into(),
                lateness_ms: &ladder,
            },
            Curve {
                label: "naive".into(),
                lateness_ms: &naive,
            },
        ];
        let (json, svg) = write(&dir, "t", &report, "caption", &curves).expect("written");
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(written["rows"][1]["lateness_ms_sorted"][1], 4_000.0);
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(svg.contains("ladder") && svg.contains("naive"), "{svg}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
