//! `order-expiry-bench soak`: an hour (or `--duration`) of orders under random
//! faults on the local three-node cluster, every order accounted for.
//!
//! The world ([`world`]): two isolated worlds on the cluster, three `serve`;
//! the traffic ([`traffic`]): order services through the library and the
//! outbox, bursts, a payer, extensions, poison messages, a payment gateway;
//! the faults ([`faults`]): two lanes of faults drawn from the seed (broker
//! nodes; services, database, endpoints, parked replay); the checker
//! ([`check`]) at the end, against the ledger and the fault records; the
//! report ([`report`]): one line per fault, totals, memory ([`memory`]), and an
//! SVG of lateness over time with the faults marked.
//!
//! The cluster must be the one of `scripts/lib/cluster.sh` (4.3 by default);
//! the soak brings it up, and the PostgreSQL pair of `scripts/lib/pg-pair.sh`
//! (the sql world's, which it fails over), and restarts the local PostgreSQL
//! as one of its faults: run it alone (scripts/test runs a short one in its
//! cluster stage).
//! The same seed draws the same faults and the same orders.

mod bundles;
mod check;
mod faults;
mod memory;
mod report;
mod traffic;
mod world;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{TimeDelta, Utc};
use clap::Args;
use order_expiry::Settings;
use order_expiry_testkit::cluster;
use tokio_util::sync::CancellationToken;

use order_expiry_testkit::world::OrderRow;

use self::check::End;
use self::faults::{Lane, Record};
use self::memory::Samples;
use self::traffic::{Gateway, Ledger, Poison, Traffic};
use self::world::{SERVES, SWEEP_GRACE, SoakWorld, VHOST, Which};
use crate::GoalsMissed;

/// `order-expiry-bench soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long traffic and faults run; the checker then waits for the last
    /// orders to fall due (up to two more minutes).
    #[arg(long, default_value = "60m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed of every random choice (faults, orders); printed. Default: a
    /// random one.
    #[arg(long)]
    seed: Option<u64>,
    /// Orders a second in the sql world (the http world gets a quarter), on
    /// top of the bursts.
    #[arg(long, default_value_t = 8.0)]
    rate: f64,
    /// Where the report, the plot and the services' logs go. Default:
    /// target/soak/seed-SEED.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The `order-expiry` binary (default: next to this one).
    #[arg(long, value_name = "PATH")]
    serve_bin: Option<PathBuf>,
    /// Never draw the PostgreSQL restart: for a soak beside other users of
    /// the local PostgreSQL (a development run; the soak of record has it).
    #[arg(long)]
    no_postgres_restart: bool,
}

/// Runs the soak; [`GoalsMissed`] when the checker found a violation.
pub async fn run(settings: &Settings, args: &SoakArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("target/soak/seed-{seed}")));
    println!(
        "soak: seed {seed}, {} of traffic and faults; report in {} \
         (the same faults again: order-expiry-bench soak --seed {seed})",
        humantime::format_duration(args.duration),
        out.display()
    );
    let binary = crate::flash::serve::binary(args.serve_bin.as_deref())?;
    let up = cluster::script(&["up"], Duration::from_secs(300));
    up.await
        .context("bringing the cluster up (scripts/lib/cluster.sh up)")?;
    let world = Arc::new(SoakWorld::start(settings, binary, out.join("logs")).await?);
    let started = Utc::now();
    let stop = CancellationToken::new();

    let traffic = Traffic::new(Arc::clone(&world))?;
    // The last unscheduled order falls due (at most 40 s after it is placed)
    // early enough for the sweeper's grace to pass before the end.
    let unscheduled_until = tokio::time::Instant::now()
        + args
            .duration
            .saturating_sub(SWEEP_GRACE + Duration::from_secs(45));
    let traffic = tokio::spawn(traffic.run(seed, args.rate, unscheduled_until, stop.clone()));
    let lanes = [(Lane::Broker, seed ^ 0x62), (Lane::Service, seed ^ 0x73)].map(|(lane, s)| {
        let (world, stop) = (Arc::clone(&world), stop.clone());
        let postgres = !args.no_postgres_restart;
        tokio::spawn(async move { faults::lane(&world, lane, s, postgres, started, stop).await })
    });
    let watching = CancellationToken::new();
    let memory = {
        let (world, watching) = (Arc::clone(&world), watching.clone());
        tokio::spawn(async move { Samples::watch(&world, watching).await })
    };
    let bundling = {
        let (world, watching) = (Arc::clone(&world), watching.clone());
        tokio::spawn(async move { bundles::watch(&world, watching).await })
    };

    tokio::time::sleep(args.duration).await;
    stop.cancel();
    let mut records: Vec<Record> = Vec::new();
    for lane in lanes {
        records.extend(lane.await.context("a fault lane")?);
    }
    records.sort_by_key(|r| r.started);
    faults::repair_all(&world)
        .await
        .context("repairing every fault")?;
    let (ledger, poison) = traffic.await.context("the order services")?;
    println!(
        "soak: traffic and faults stopped ({} orders, {} faults); waiting for the last orders",
        ledger.orders.len(),
        records.len()
    );
    let (sql_rows, http_rows) = settle(&world, &ledger, poison).await;
    watching.cancel();
    let memory = memory.await.context("the memory watch")?;
    let bundling = bundling.await.context("the orders-per-message watch")?;

    let queues = queues(&world).await;
    let left = leftovers(&world, &queues, poison).await;
    let end = End {
        ledger,
        poison,
        faults: records,
        slot_worlds: SERVES.map(|(_, which, _)| which),
        sql_rows,
        http_rows,
        queues,
        sql_parked_queue: world.sql.ladder().parked_queue(),
        exited: world.exited().await,
        memory,
        bundling,
        duration: args.duration,
    };
    let mut verdict = check::check(&end);
    verdict.violations.extend(left);
    let logs = world.logs().to_owned();
    let world = Arc::into_inner(world).context("the world is still shared")?;
    for problem in world.finish().await {
        verdict
            .violations
            .push(format!("stopping serve at the end: {problem}"));
    }

    let run = report::Run {
        seed,
        started,
        end: &end,
        verdict: &verdict,
    };
    let text = report::text(&run);
    print!("{text}");
    std::fs::write(out.join("report.md"), &text).context("writing the report")?;
    let svg = out.join("lateness.svg");
    report::plot(&run, &svg)?;
    println!(
        "report: {}, plot: {}, service logs: {}",
        out.join("report.md").display(),
        svg.display(),
        logs.display()
    );
    if verdict.violations.is_empty() {
        println!(
            "soak passed: seed {seed}, {} faults, no violation",
            end.faults.len()
        );
        Ok(())
    } else {
        let line = format!(
            "soak FAILED: seed {seed}, {} violations (the first: {})",
            verdict.violations.len(),
            verdict.violations[0]
        );
        println!("{line}");
        Err(GoalsMissed(line).into())
    }
}

/// Waits until every order that should be cancelled is (or two minutes past
/// the last deadline plus the sweeper's grace), and the sql world's due queue
/// has parked every poison message; the rows of both worlds.
async fn settle(
    world: &SoakWorld,
    ledger: &Ledger,
    poison: Poison,
) -> (HashMap<String, OrderRow>, HashMap<String, OrderRow>) {
    let last_due = ledger
        .orders
        .iter()
        .map(|o| o.due_at)
        .max()
        .unwrap_or_else(Utc::now);
    let limit = last_due + TimeDelta::seconds(120);
    loop {
        let (sql, http) = (world.sql.rows().await, world.http.rows().await);
        let waiting = ledger.orders.iter().filter(|o| {
            let rows = if o.which == Which::Sql { &sql } else { &http };
            let should_cancel = !o.paid && o.gateway != Gateway::Paid;
            should_cancel && rows.get(&o.id).is_some_and(|r| r.status == "unpaid")
        });
        let waiting = waiting.count();
        let parked = world.sql.depth(&world.sql.ladder().parked_queue()).await;
        let settled = waiting == 0 && u64::from(parked) >= poison.confirmed;
        if (settled && Utc::now() > last_due) || Utc::now() > limit {
            if !settled {
                println!("soak: {waiting} orders still unpaid and {parked} parked at the limit");
            }
            drain(world, poison).await;
            return (sql, http);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits (at most 90 s: the longest delay of the soak's 6-level ladder is
/// 63 s) until every queue of both worlds has held what it should at the end
/// for [`QUIET`]: a message still travelling for an order already settled (a
/// duplicate of a retried publish, an extended order's first message, a
/// re-check) arrives and is acked. One reading is not enough: a message being
/// dead-lettered from one level to the next is counted in neither while the
/// dead-letter worker holds it. What is left after that is stuck, and the
/// checker says so.
async fn drain(world: &SoakWorld, poison: Poison) {
    let parked = world.sql.ladder().parked_queue();
    let expected =
        |(name, messages): &(String, u64)| poison.expected(&parked, name).contains(messages);
    let limit = Instant::now() + Duration::from_secs(90);
    let mut quiet_since = None;
    while Instant::now() < limit {
        match queues(world).await.iter().all(&expected) {
            true => {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= QUIET {
                    return;
                }
            }
            false => quiet_since = None,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Not drained by then is for the checker to report.
}

/// How long the queues must hold what they should before the end is read:
/// longer than a dead-letter worker holds a message between two levels
/// (`dead_letter_worker_publisher_confirm_timeout`, 5 s in `deploy/`).
const QUIET: Duration = Duration::from_secs(8);

/// One message of each ladder or due queue that should be empty and is not
/// (taken off it: the world is removed next), for the report.
async fn leftovers(world: &SoakWorld, queues: &[(String, u64)], poison: Poison) -> Vec<String> {
    let mut found = Vec::new();
    for (name, messages) in queues {
        let parked = world.sql.ladder().parked_queue();
        if *name == parked || poison.expected(&parked, name).contains(messages) {
            continue;
        }
        let w = if name.starts_with(&format!("{}.", world.sql.settings.topology.prefix)) {
            &world.sql
        } else {
            &world.http
        };
        if let Some(message) = w.get(name).await {
            found.push(format!(
                "left in {name}: {} (headers {:?})",
                String::from_utf8_lossy(&message.delivery.data),
                message.delivery.properties.headers()
            ));
        }
    }
    found
}

/// Messages in each queue of both worlds.
async fn queues(world: &SoakWorld) -> Vec<(String, u64)> {
    let mut all = Vec::new();
    for prefix in [
        &world.sql.settings.topology.prefix,
        &world.http.settings.topology.prefix,
    ] {
        for (name, fields) in cluster::queues(VHOST, prefix, &["messages"]).await {
            let messages = fields
                .first()
                .and_then(|m| m.parse().ok())
                .unwrap_or(u64::MAX);
            all.push((name, messages));
        }
    }
    all
}
