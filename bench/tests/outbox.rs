//! The README's relay-lag bound, through the benchmark's own code against the
//! real broker and database: every committed row is relayed, and p99 from
//! commit to confirm is at most 50 ms. The README's 1,000 rows/s figures come
//! from the release build (`order-expiry-bench outbox`); this debug build,
//! sharing the machine with the rest of the test run, commits 500 a second.

use std::time::Duration;

use order_expiry_bench::outbox::{OutboxArgs, measure, table};
use order_expiry_testkit::World;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_is_relayed_and_p99_commit_to_confirm_is_at_most_50_ms() {
    // The test services and a 6-level ladder; the benchmark builds its own
    // world (prefix and schema) on top of these settings.
    let env = World::builder().declare(false).build().await.unwrap();
    let args = OutboxArgs {
        rate: 500,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        writers: 8,
        due_in: Duration::from_secs(30),
        json: std::env::temp_dir().join("order-expiry-outbox-test.json"),
    };
    let mut settings = env.settings.clone();
    settings.database.url = secrecy::SecretString::from(order_expiry_testkit::database_url(None));
    let report = measure(&settings, &args).await.expect("benchmark runs");
    eprintln!("{}", table(&report));
    assert_eq!(report.committed, 5_000);
    assert_eq!(report.relayed, 5_000, "every committed row is relayed");
    let p99 = report.commit_to_confirm_ms[2];
    assert!(p99 <= 50.0, "p99 commit → confirm {p99} ms");
    env.cleanup().await;
}
