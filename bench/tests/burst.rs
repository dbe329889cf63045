//! The README's flash-sale promise (Timeliness, Flash sales), through the
//! benchmark's own code against the real broker and database: 2,000 orders
//! placed within a second, on top of a steady stream, with delays of 1-15 s,
//! are never cancelled early, none is missed, and their lateness stays within
//! p99 20 ms and max 100 ms; so does the steady stream's beside them.

use std::time::Duration;

use order_expiry_bench::lateness::{LatenessArgs, measure, table};
use order_expiry_testkit::World;

/// The promise, in milliseconds.
const P99_MS: f64 = 20.0;
const MAX_MS: f64 = 100.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_of_two_thousand_orders_is_cancelled_on_time() {
    let env = World::builder().declare(false).build().await.unwrap();
    let mut args = LatenessArgs::steady(
        50,
        Duration::from_secs(10),
        Duration::from_secs(1),
        Duration::from_secs(15),
    );
    args.burst = 2000;
    args.burst_at = Duration::from_secs(3);
    let mut settings = env.settings.clone();
    settings.database.url = secrecy::SecretString::from(order_expiry_testkit::database_url(None));
    let report = measure(&settings, &args).await.expect("benchmark runs");
    eprintln!("{}", table(&report));
    for row in &report.rows {
        assert_eq!(row.missed, 0, "every unpaid order is cancelled: {row:?}");
        assert_eq!(row.early, 0, "no order is cancelled early: {row:?}");
        assert!(
            row.p99_ms <= P99_MS && row.max_ms <= MAX_MS,
            "{}: p99 {} ms, max {} ms",
            row.design,
            row.p99_ms,
            row.max_ms
        );
    }
    let sale = &report.rows[1];
    assert_eq!(sale.design, "ladder, flash sale");
    assert!(
        sale.cancelled > 1000,
        "most sale orders are unpaid: {sale:?}"
    );
    env.cleanup().await;
}
