//! Scenario 3: PostgreSQL goes away for 10 s while orders come due. Nothing is
//! acked without its cancel, the consumer backs off instead of spinning (its CPU
//! time over the outage is measured), `/readyz` says 503, and everything due is
//! cancelled once the database is back.

use std::time::{Duration, Instant};

use tokio::task::block_in_place;

use crate::support::{Fault, Ledger, Outage, ReadyWatch, assert_not_ready, orders, settle, world};

const ORDERS: usize = 400;
const OUTAGE: Duration = Duration::from_secs(10);
/// CPU the consumer may use over the 10 s outage: a busy loop would use ~10 s.
const MAX_CPU_SECONDS: f64 = 0.5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_for_ten_seconds_backs_off_and_loses_nothing() {
    let world = world("database outage").await;
    let mut served = world.serve_ready(&[]).await;
    let watch = ReadyWatch::start(&served);

    // Due from 1 s to 9 s from now: most come due while the database is down.
    let orders = orders("db", ORDERS, |i| 1000 + (i * 53) % 8000);
    let ledger = Ledger::place(&world, &world.scheduler(), &orders, 4).await;
    assert!(ledger.orders.iter().all(|o| o.scheduled), "all scheduled");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let broken_at = Instant::now();
    let outage = block_in_place(|| Outage::begin(Fault::DatabaseStop));
    let not_ready_at = watch
        .wait_for(503, broken_at, Duration::from_secs(10))
        .await;
    let cpu_before = served.cpu_seconds();
    let measure_from = Instant::now();
    tokio::time::sleep(OUTAGE).await;
    let cpu = served.cpu_seconds() - cpu_before;
    let measured = measure_from.elapsed();
    assert!(served.running(), "the consumer exited during the outage");
    let retries = served.metric("order_expiry_retries_total").await;
    let before_restore = Instant::now();
    let back_at = block_in_place(|| outage.restore());
    let ready_at = watch.wait_for(200, back_at, Duration::from_secs(30)).await;
    assert_not_ready(&watch, not_ready_at, before_restore, "the database");

    let figures = settle(&world, &ledger, Duration::from_secs(60)).await;
    let settled_at = Instant::now();
    figures.assert_invariants();
    served.assert_nothing_swept().await;
    assert!(served.running());
    assert!(retries >= 1.0, "the consumer never saw the database fail");
    assert!(
        cpu < MAX_CPU_SECONDS,
        "consumer used {cpu:.2} s CPU over {measured:?} of database outage: a hot loop"
    );
    assert_eq!(world.depth(&world.ladder().due_queue()).await, 0);
    figures.print(
        "database outage",
        &format!(
            "database down {:.1} s, consumer CPU during {:.1} s of it {:.3} s ({:.1} %), retries {retries}, \
             /readyz 503 {:.1} s after the stop, ready again {:.1} s after the database was back, \
             all settled {:.1} s after it was back",
            (back_at - broken_at).as_secs_f64(),
            measured.as_secs_f64(),
            cpu,
            100.0 * cpu / measured.as_secs_f64(),
            (not_ready_at - broken_at).as_secs_f64(),
            (ready_at - back_at).as_secs_f64(),
            (settled_at - back_at).as_secs_f64(),
        ),
    );
    drop(watch);
    drop(served);
    world.cleanup().await;
}
