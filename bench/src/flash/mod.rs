//! `order-expiry-bench flash`: a flash sale. `--orders` unpaid orders are
//! created within `--within` seconds, each with the same payment window
//! `--window`, so their due times are spread evenly over `--within` seconds,
//! `--window` after the sale starts; how on time does the ladder cancel them?
//!
//! Each run has a world of its own (prefix `bench-flash-<id>`, its own schema)
//! and its own `order-expiry serve` child (the built-in defaults, the world's
//! names, `--sweeper`, span export off unless the tracing-cost comparison
//! turns it on: [`measure_traced`]), and takes one of three ways onto the
//! ladder (`--path`):
//!
//! - `library`: the orders are inserted first (unpaid, `pay_deadline` =
//!   `due_at`), then each order is scheduled by a `Scheduler::schedule` call
//!   of its own at its creation time, as the checkouts of a sale would
//!   (`--callers N`: N tasks, each one call after another);
//! - `cli`: the orders are inserted first, then all of them go to
//!   `order-expiry schedule --stdin` in one NDJSON stream;
//! - `outbox`: each transaction inserts 2,000 orders and their
//!   `order_expiry_outbox` rows as soon as the last of them is created; serve's
//!   relay publishes them.
//!
//! `--bundles off` gives serve, the CLI and the library's settings
//! `publisher.bundle_max_orders = 1` (one order per message); `on` leaves the
//! built-in default. A build without that setting ignores it (unknown keys are
//! ignored by the settings loader), and then both runs send one message per
//! order: the report's messages per order says which it was.
//!
//! Lateness is `cancelled_at - pay_deadline` of every order, read from the
//! database; who cancelled (the ladder or the sweeper), the messages per order
//! and serve's peak RSS come from serve's `/metrics` and `/proc`, the broker's
//! CPU from its `beam.smp` in `/proc`. The bundles-on runs are judged by the
//! goals of [`crate::goals::Bench::Flash`]; the run exits non-zero when one is missed.

mod broker;
mod paths;
mod plan;
mod report;
mod run;
pub(crate) mod serve;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use order_expiry::Settings;
use order_expiry_testkit::World;
use secrecy::SecretString;
use serde::Serialize;

use crate::Judged;
use crate::tracing_cost::Tracing;

pub use self::report::{Report, Row};

/// Arguments of `flash`.
#[derive(Debug, Clone, Args)]
pub struct FlashArgs {
    /// Orders of the sale.
    #[arg(long, default_value_t = 200_000)]
    pub orders: usize,
    /// The orders are created evenly within this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub within: Duration,
    /// Every order's payment window: due this long after it was created.
    #[arg(long, default_value = "25s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// How the orders reach the ladder; the runs go one after another.
    #[arg(long = "path", value_enum, value_delimiter = ',',
          default_values_t = [SalePath::Library, SalePath::Cli, SalePath::Outbox])]
    pub paths: Vec<SalePath>,
    /// Bundles on (the built-in default), off (one order per message) or both
    /// runs, each path.
    #[arg(long, value_enum, default_value = "both")]
    pub bundles: Bundles,
    /// Whether serve's sweeper runs.
    #[arg(long, value_enum, default_value = "on")]
    pub sweeper: Switch,
    /// The library path's callers: this many tasks, each scheduling its share
    /// one call after another; 0 (the default): one call per order at its
    /// creation time, as an order service's request handlers make them.
    /// Sequential callers cap the rate at callers / confirm latency, whatever
    /// the ladder does.
    #[arg(long, default_value_t = 0)]
    pub callers: usize,
    /// The broker, with its vhost (default: amqp.url of the settings, e.g.
    /// ORDER_EXPIRY__AMQP__URL).
    #[arg(long, value_name = "URL")]
    pub amqp_url: Option<String>,
    /// After the last due time (or the end of scheduling, if later), how long
    /// to wait for every order to be cancelled before counting the rest lost.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// Where flash.json and flash.svg are written.
    #[arg(long, default_value = ".")]
    pub out_dir: PathBuf,
    /// The `order-expiry` binary (default: $ORDER_EXPIRY_BIN, or next to this
    /// one).
    #[arg(long, value_name = "FILE")]
    pub serve_bin: Option<PathBuf>,
    /// The broker's `beam.smp` process (default: the one listening on the
    /// broker URL's port).
    #[arg(long, value_name = "PID")]
    pub broker_pid: Option<u32>,
    /// Only the table, no progress lines.
    #[arg(long)]
    pub quiet: bool,
}

/// How the orders of a sale reach the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SalePath {
    /// `Scheduler::schedule`: one call per order, or from `--callers` tasks.
    Library,
    /// One NDJSON stream into `order-expiry schedule --stdin`.
    Cli,
    /// `order_expiry_outbox` rows, 2,000 a transaction, relayed by serve.
    Outbox,
}

impl SalePath {
    /// Its `--path` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Library => "library",
            Self::Cli => "cli",
            Self::Outbox => "outbox",
        }
    }
}

/// `--bundles`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Bundles {
    /// The built-in `publisher.bundle_max_orders`.
    On,
    /// `publisher.bundle_max_orders = 1`: one order per message.
    Off,
    /// Both runs, on first.
    Both,
}

impl Bundles {
    /// The runs, as "bundles on?".
    fn runs(self) -> &'static [bool] {
        match self {
            Self::On => &[true],
            Self::Off => &[false],
            Self::Both => &[true, false],
        }
    }
}

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// The variable that turns bundles off in a child (`--bundles off`).
pub(crate) const NO_BUNDLES_ENV: (&str, &str) = ("ORDER_EXPIRY__PUBLISHER__BUNDLE_MAX_ORDERS", "1");

/// Runs the sale on every path asked for, prints the table, writes
/// flash.json and flash.svg, and judges the bundles-on runs.
pub async fn run(settings: &Settings, args: &FlashArgs) -> anyhow::Result<()> {
    let report = measure(settings, args).await?;
    println!("{}", report.table());
    let caption = format!(
        "Flash sale: {} orders within {:.0} s, due {:.0} s later, sweeper {} (RabbitMQ {})",
        report.orders,
        report.within_s,
        report.window_s,
        on_off(report.sweeper),
        report.broker_version
    );
    let curves: Vec<_> = report.rows.iter().map(report::Row::curve).collect();
    let (json, svg) = crate::cdf::write(&args.out_dir, "flash", &report, &caption, &curves)?;
    println!("wrote {} and {}", json.display(), svg.display());
    if report.rows.iter().all(|r| !r.bundles) {
        println!(
            "bundles off is a comparison (one message per order, the design before bundles): \
             its runs are reported, not judged, and the run exits 0 by design"
        );
    }
    crate::conclude(&report)
}

/// Runs the sale once per path and bundles setting, each in a world of its
/// own based on `settings`, and reads the figures back.
pub async fn measure(settings: &Settings, args: &FlashArgs) -> anyhow::Result<Report> {
    measure_traced(settings, args, &Tracing::Off).await
}

/// [`measure`] with serve's span export and the orders' contexts as
/// `tracing` says (the tracing-cost comparison; the cli path cannot be
/// traced per order and fails with tracing on).
pub async fn measure_traced(
    settings: &Settings,
    args: &FlashArgs,
    tracing: &Tracing,
) -> anyhow::Result<Report> {
    let mut settings = settings.clone();
    if let Some(url) = &args.amqp_url {
        settings.amqp.url = SecretString::from(url.clone());
    }
    settings.sweeper.enabled = args.sweeper == Switch::On;
    let binary = serve::binary(args.serve_bin.as_deref())?;
    let broker = broker::Broker::find(args.broker_pid, &settings).await;
    let mut report = Report::new(&settings, args, &broker);
    for path in &args.paths {
        for bundled in args.bundles.runs() {
            let label = format!("{}, bundles {}", path.as_str(), on_off(*bundled));
            if !args.quiet {
                eprintln!("flash: {label}: {} orders", args.orders);
            }
            let run = async |world: &World| {
                run::run_once(world, args, *path, *bundled, &binary, &broker, tracing).await
            };
            let row = crate::world(&settings, "bench-flash").run(run).await;
            let row = row.with_context(|| label.clone())?;
            if !args.quiet {
                eprintln!("{}", table::row_line(&row));
            }
            report.rows.push(row);
        }
    }
    Ok(report)
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}
