//! The outbox relay's promise, through the benchmark's own code against the
//! real broker and database: every committed row is relayed exactly once,
//! none is lost, and 99 % of them (after the warm-up) wait at most a second
//! from their commit to their confirm.
//!
//! The bound is one a busy laptop holds, not the goal. This debug build shares
//! the machine with the rest of the test run (500 committed transactions a
//! second here; the book's 1,000 a second come from the release build): on
//! this 2-core machine under a load average of 10-18, p99 was 300-700 ms and
//! max 400-780 ms, and a 50 ms p99 fails whenever other work runs (seen at load
//! 2.9: p99 1,170 ms, max 2,016 ms, while PostgreSQL's own commits stood
//! still too; not explained yet, see docs/src/results/outbox-lag.md). A stall
//! of the relay, rows that wait for the next poll or for a retry, still fails
//! it; a single row held up once by the database does not. The goal (p99 at most 50 ms at 1,000 rows/s) is the
//! benchmark's: `order-expiry-bench outbox`, on a quiet machine.

use order_expiry_bench::Judged;
use order_expiry_bench::check::parse;
use order_expiry_bench::outbox::{OutboxArgs, measure};
use order_expiry_testkit::World;

/// The most 99 % of the committed rows may wait from commit to confirm.
const BOUND_MS: f64 = 1000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_is_relayed_once_and_p99_waits_at_most_a_second() {
    // The test services and a 6-level ladder; the benchmark builds its own
    // world (prefix and schema) on top of these settings.
    let settings = World::builder().base_settings().await;
    let args: OutboxArgs =
        parse("--rate 500 --duration 10s --warmup 2s --writers 8 --due-in 30s").unwrap();
    let report = measure(&settings, &args).await.expect("benchmark runs");
    eprintln!("{}", report.table());
    assert_eq!(report.committed, 5_000);
    assert_eq!(report.relayed, 5_000, "every committed row is relayed");
    assert_eq!(report.duplicates, 0, "each row is relayed once");
    let [_, _, p99, _, max] = report.commit_to_confirm_ms;
    assert!(
        p99 <= BOUND_MS,
        "p99 commit to confirm {p99} ms (max {max} ms)"
    );
}
