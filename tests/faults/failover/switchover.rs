//! Scenario 2: a planned switchover. The primary is stopped gracefully (fast
//! mode: its sessions end, and it sends the standby all its WAL, the shutdown
//! checkpoint included, before it exits), and the standby is promoted as soon
//! as the stop returned.

use std::time::Duration;

use order_expiry_testkit::pg_pair::{self, Replication};

use super::run::{Scenario, record_payments};
use super::timeline::Timeline;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: scripts/test --long"]
async fn switchover_stop_then_promote_every_order_cancelled_within_ten_seconds() {
    let s = Scenario::start("failover: switchover", Replication::Sync, &[]).await;
    let (mut ledger, payer) = s.traffic("w").await;

    let fault = s.fault_at(Duration::from_secs(7)).await;
    pg_pair::stop(1).await;
    let timeline = Timeline::new(fault, pg_pair::promote(2).await);

    let unknown = record_payments(&s.world, &mut ledger, payer.await.expect("payer")).await;
    let end = s.settle(&timeline, &ledger, Duration::from_secs(60)).await;
    end.print(
        "failover: switchover (graceful stop, then promote)",
        &format!("payments without an answer {unknown}"),
    );
    end.assert_promises(&s).await;
    assert_eq!(unknown, 0, "payments through the store went unanswered");
    s.finish().await;
}
