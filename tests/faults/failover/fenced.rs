//! The primary is demoted in place: fenced read-only
//! (`default_transaction_read_only`, reloaded) while `serve`'s pooled
//! connections stay open to it, then the standby is promoted 2 s later. The
//! old primary stays up and answers every write with SQLSTATE 25006: each such
//! answer must be the database-unavailable class (retried, never parked) and
//! drop the connections that reach it, or the cancels go on failing there for
//! as long as it runs.

use std::time::Duration;

use order_expiry_testkit::pg_pair::{self, Replication};

use super::run::{Scenario, record_payments};
use super::timeline::Timeline;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_fenced_read_only_is_left_for_the_promoted_standby_and_nothing_is_parked() {
    // Unwatched: `/readyz`'s ping drops a read-only connection by itself, and
    // this is the test of the cancels' own handling of one.
    let s = Scenario::start("failover: primary fenced", Replication::Sync, &[])
        .await
        .unwatched();
    let (mut ledger, payer) = s.traffic("f").await;

    let fault = s.fault_at(Duration::from_secs(7)).await;
    pg_pair::fence(1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Synchronous replication: the standby has every commit the fence let through.
    let timeline = Timeline::new(fault, pg_pair::promote(2).await);

    let unknown = record_payments(&s.world, &mut ledger, payer.await.expect("payer")).await;
    let end = s.settle(&timeline, &ledger, Duration::from_secs(60)).await;
    let parked = s.served.metric("order_expiry_parked_total").await;
    let read_only_errors = s.served.log_count("25006") + s.served.log_count("read-only");
    end.print(
        "failover: primary fenced read-only and left running, standby promoted 2 s later",
        &format!(
            "parked {parked}; serve's log lines naming the read-only server {read_only_errors}; \
             payments without an answer {unknown}"
        ),
    );
    end.assert_promises(&s).await;
    assert_eq!(
        parked, 0.0,
        "a cancel refused by the read-only server was parked"
    );
    assert!(
        read_only_errors > 0,
        "serve never met the read-only server: the scenario did not test it"
    );
    assert_eq!(
        unknown, 0,
        "payments through the store went unanswered: its connections stayed on the read-only server"
    );
    s.finish().await;
}
