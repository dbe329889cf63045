//! Scenario 1: the primary is killed (-9, every process of it) while orders
//! come due and an order service writes through the outbox; 2 s later (a
//! failover manager's detection) the standby is promoted. Replication is
//! synchronous: nothing a commit answered is lost.

use std::time::Duration;

use order_expiry_testkit::pg_pair::Replication;
use tokio_util::sync::CancellationToken;

use super::outbox::outbox_writer;
use super::run::{Scenario, record_payments, until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_standby_promoted_every_order_cancelled_within_ten_seconds() {
    let s = Scenario::start("failover: primary killed", Replication::Sync, &[]).await;
    let stop = CancellationToken::new();
    let writer = tokio::spawn(outbox_writer(
        s.url(),
        Duration::from_millis(50),
        Duration::from_secs(3),
        stop.clone(),
    ));
    // Due from 2 s to 16 s from now: the kill comes at 7 s.
    let (mut ledger, payer) = s.traffic("k").await;

    let timeline = s.kill_and_promote(Duration::from_secs(7)).await;

    until(s.began, Duration::from_secs(14)).await;
    stop.cancel();
    let outbox = writer.await.expect("outbox writer");
    let unknown = record_payments(&s.world, &mut ledger, payer.await.expect("payer")).await;
    for (id, due) in &outbox.committed {
        ledger.add(id, *due, true, false);
    }
    let end = s.settle(&timeline, &ledger, Duration::from_secs(60)).await;
    let rows = s.world.rows().await;
    let rolled_back_cancelled: Vec<_> = outbox
        .rolled_back
        .iter()
        .filter(|(id, _)| rows.get(id).is_none_or(|r| r.status != "unpaid"))
        .collect();
    end.print(
        "failover: primary killed -9, standby promoted 2 s later (synchronous)",
        &format!(
            "outbox rows committed {}, rolled back {} (none published: {}), writer retries {}; \
             payments without an answer {unknown}",
            outbox.committed.len(),
            outbox.rolled_back.len(),
            rolled_back_cancelled.is_empty(),
            outbox.retries,
        ),
    );
    end.assert_promises(&s).await;
    assert!(
        rolled_back_cancelled.is_empty(),
        "rolled-back outbox rows were published: {rolled_back_cancelled:?}"
    );
    assert_eq!(unknown, 0, "payments through the store went unanswered");
    s.finish().await;
}
