//! A small flash sale through the benchmark's own code, the library path,
//! against the real broker, database and `order-expiry serve` (the binary
//! next to the test's target directory: `cargo build -p order-expiry`, which
//! `scripts/test` has done by this stage): 2,000 unpaid orders created within
//! 2 s, each due 8 s later, the sweeper off so the ladder alone must cancel
//! them.
//!
//! What a user relies on: every order is cancelled, none early, none lost,
//! and none absurdly late. The lateness bound (10 s) is one a busy 2-core
//! machine holds with a debug build beside other tests; the goal (p99 at most
//! 100 ms, max at most 1 s at 200,000 orders) is the benchmark's:
//! `order-expiry-bench flash`, on a quiet machine.

use order_expiry_bench::Judged;
use order_expiry_bench::check::parse;
use order_expiry_bench::flash::{FlashArgs, measure};
use order_expiry_testkit::World;

/// The latest any order of the sale may be cancelled after its due time.
const BOUND_MS: f64 = 10_000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_flash_sale_is_cancelled_whole_never_early_and_within_ten_seconds() {
    // The test services and a 6-level ladder; the benchmark builds its own
    // world (prefix and schema) on top of these settings.
    let settings = World::builder().base_settings().await;
    let args: FlashArgs = parse(
        "--orders 2000 --within 2s --window 8s --path library --bundles on --sweeper off \
         --settle 60s --quiet",
    )
    .unwrap();
    let report = measure(&settings, &args).await.expect("benchmark runs");
    eprintln!("{}", report.table());
    let [sale] = report.rows.as_slice() else {
        panic!("one run: {:?}", report.rows);
    };
    assert_eq!(sale.lost, 0, "every order is cancelled: {sale:?}");
    assert_eq!(
        sale.lateness.early, 0,
        "no order is cancelled early: {sale:?}"
    );
    assert_eq!(
        sale.lateness.cancelled, 2_000,
        "every order is cancelled: {sale:?}"
    );
    assert_eq!(
        sale.swept, 0.0,
        "the sweeper is off: the ladder cancelled them"
    );
    assert!(
        sale.lateness.max_ms < BOUND_MS,
        "lateness max {} ms (p99 {} ms), bound {BOUND_MS} ms",
        sale.lateness.max_ms,
        sale.lateness.p99_ms
    );
}
