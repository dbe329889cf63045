//! The soak's report: one line per fault, the totals, memory, the checker's
//! findings, and a plot of lateness over time with the faults marked.

use std::fmt::Write as _;
use std::path::Path;

use chrono::{DateTime, Utc};
use plotters::prelude::*;

use super::check::{End, Verdict};
use crate::cdf::Distribution;
use crate::{fmt_ms, plot_error};

/// What the report is about.
#[derive(Debug)]
pub(super) struct Run<'a> {
    pub(super) seed: u64,
    pub(super) started: DateTime<Utc>,
    pub(super) end: &'a End,
    pub(super) verdict: &'a Verdict,
}

/// The text report.
pub(super) fn text(run: &Run<'_>) -> String {
    let mut out = String::new();
    let v = run.verdict;
    let _ = writeln!(
        out,
        "soak: seed {}, {} of traffic and faults, started {}",
        run.seed,
        humantime::format_duration(run.end.duration),
        run.started.format("%Y-%m-%d %H:%M:%S UTC")
    );
    let _ = writeln!(
        out,
        "\n| at | fault | lasted | orders it held up | worst lateness among them |\n| --- | --- | --- | --- | --- |"
    );
    for (fault, (n, worst)) in run.end.faults.iter().zip(&v.per_fault) {
        let _ = writeln!(
            out,
            "| +{} | {}{} | {:.1} s | {n} | {} |",
            clock(fault.started - run.started),
            fault.kind.label(),
            if fault.error.is_some() {
                " (failed)"
            } else {
                ""
            },
            (fault.recovered - fault.started).num_milliseconds() as f64 / 1000.0,
            if *n > 0 {
                fmt_ms(worst.as_secs_f64() * 1000.0)
            } else {
                "-".into()
            },
        );
    }
    let mut families: Vec<(&str, usize)> = Vec::new();
    for fault in &run.end.faults {
        match families.iter_mut().find(|(f, _)| *f == fault.kind.family()) {
            Some((_, n)) => *n += 1,
            None => families.push((fault.kind.family(), 1)),
        }
    }
    let families: Vec<String> = families.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let by_ladder = v.cancels.iter().filter(|c| !c.swept);
    let ladder = Distribution::of(by_ladder.map(|c| c.late.as_secs_f64() * 1000.0).collect());
    let bursts = run.end.ledger.orders.iter().filter(|o| o.burst).count();
    let _ = writeln!(
        out,
        "\nfaults: {} ({})\n\
         orders: {} ({} in bursts), cancelled {} (by the sweeper {}, each never scheduled: {}), \
         paid {}, kept by the gateway's \"paid\" {}, extended {}, never scheduled {}, \
         poison sent {} (and {} unconfirmed publishes), schedule calls retried {}\n\
         lateness of the ladder's cancels: p50 {}, p99 {}, p99.9 {}, max {}",
        run.end.faults.len(),
        families.join(", "),
        v.orders,
        bursts,
        v.cancelled,
        v.swept,
        v.swept_explained,
        v.paid,
        v.kept_by_gateway,
        v.extended,
        v.never_scheduled,
        run.end.poison.confirmed,
        run.end.poison.unsure,
        run.end.ledger.schedule_errors(),
        fmt_ms(ladder.p50_ms),
        fmt_ms(ladder.p99_ms),
        fmt_ms(ladder.p999_ms),
        fmt_ms(ladder.max_ms),
    );
    let memory: Vec<String> = run
        .end
        .memory
        .summary()
        .iter()
        .map(|(name, lo, hi, last)| format!("{name} {lo}-{hi} MB (last {last})"))
        .collect();
    let _ = writeln!(out, "memory (RSS): {}", memory.join(", "));
    let b = run.end.bundling;
    let _ = writeln!(
        out,
        "orders per due message: {} orders in {} messages (mean {:.1}), {} of them bundles \
         carrying {} orders (each serve's last reading of order_expiry_orders_per_message; a killed one's counts \
         up to 10 s short)",
        b.orders,
        b.messages,
        b.mean(),
        b.bundles,
        b.bundled_orders()
    );
    if v.violations.is_empty() {
        let _ = writeln!(out, "checker: no violation");
    } else {
        let _ = writeln!(out, "checker: {} violations:", v.violations.len());
        for line in v.violations.iter().take(50) {
            let _ = writeln!(out, "  {line}");
        }
        if v.violations.len() > 50 {
            let _ = writeln!(out, "  ... and {} more", v.violations.len() - 50);
        }
    }
    out
}

/// `+MM:SS` of a time since the start.
fn clock(since: chrono::TimeDelta) -> String {
    let s = since.num_seconds().max(0);
    format!("{:02}:{:02}", s / 60, s % 60)
}

/// Lateness over time (each cancel at its due time, log scale), the faults as
/// bands: the broker's in red, the services' in blue.
pub(super) fn plot(run: &Run<'_>, path: &Path) -> anyhow::Result<()> {
    const FLOOR_S: f64 = 0.001;
    let v = run.verdict;
    let since = |at: DateTime<Utc>| (at - run.started).num_milliseconds() as f64 / 1000.0;
    let end_s = v
        .cancels
        .iter()
        .map(|c| since(c.due_at))
        .fold(run.end.duration.as_secs_f64(), f64::max)
        + 10.0;
    let max_s = v
        .cancels
        .iter()
        .map(|c| c.late.as_secs_f64())
        .fold(1.0_f64, f64::max)
        * 2.0;
    let root = SVGBackend::new(path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Soak, seed {}: lateness of every cancel at its due time; faults as bands \
                 (red: broker nodes, blue: services)",
                run.seed
            ),
            ("sans-serif", 16),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end_s, (FLOOR_S..max_s).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("due time, seconds since the start")
        .y_desc("cancelled_at - due (s, log)")
        .draw()
        .map_err(plot_error)?;
    let bands = run.end.faults.iter().map(|f| {
        let colour = if f.kind.family().starts_with("node") {
            RED
        } else {
            BLUE
        };
        let (from, to) = (
            since(f.started),
            since(f.recovered).max(since(f.started) + 0.5),
        );
        Rectangle::new([(from, FLOOR_S), (to, max_s)], colour.mix(0.08).filled())
    });
    chart.draw_series(bands).map_err(plot_error)?;
    let points = v.cancels.iter().map(|c| {
        let colour = if c.swept { MAGENTA } else { BLACK };
        Circle::new(
            (since(c.due_at), c.late.as_secs_f64().max(FLOOR_S)),
            1,
            colour.mix(0.6).filled(),
        )
    });
    chart.draw_series(points).map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
