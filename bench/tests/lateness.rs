//! The timeliness promise (docs/src/results/timeliness.md), through the benchmark's own code against the
//! real broker and database: a few hundred mixed delays are never cancelled
//! early, none is missed, and p99 lateness stays under a second. A run whose
//! p99 misses the second is measured once more, and the test fails when that
//! one misses it too (one stall of a shared machine: see `burst.rs`).

use order_expiry::Settings;
use order_expiry_bench::Judged;
use order_expiry_bench::check::parse;
use order_expiry_bench::lateness::{LatenessArgs, Row, measure};
use order_expiry_testkit::World;

/// One run: printed, never early, none missed; its ladder row.
async fn steady_run(settings: &Settings, args: &LatenessArgs) -> Row {
    let report = measure(settings, args).await.expect("benchmark runs");
    eprintln!("{}", report.table());
    let ladder = report.rows[0].clone();
    assert_eq!(ladder.orders, 300);
    assert!(
        ladder.lateness.cancelled > 150,
        "most orders are unpaid: {ladder:?}"
    );
    assert_eq!(ladder.missed, 0, "every unpaid order is cancelled");
    assert_eq!(ladder.lateness.early, 0, "no order is cancelled early");
    ladder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_hundred_mixed_delays_are_never_early_and_p99_is_under_a_second() {
    // The test services, quick retries and a 6-level ladder; the benchmark
    // builds its own world (prefix and schema) on top of these settings.
    let settings = World::builder().base_settings().await;
    let args: LatenessArgs =
        parse("--rate 60 --duration 5s --min-delay 500ms --max-delay 12s --no-naive --quiet")
            .unwrap();
    let mut ladder = steady_run(&settings, &args).await;
    if ladder.lateness.p99_ms >= 1000.0 {
        eprintln!("p99 over a second (table above): measuring once more");
        ladder = steady_run(&settings, &args).await;
    }
    assert!(
        ladder.lateness.p99_ms < 1000.0,
        "p99 {} ms",
        ladder.lateness.p99_ms
    );
}
