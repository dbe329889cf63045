//! Node loss with orders in flight (delays 2-30 s, every fourth order paid):
//! a rolling restart of all three nodes and two of three nodes stopped (the
//! majority lost); a node killed or hung for good is [`crate::node_gone`],
//! bounded from each order's due time. Two `serve`
//! processes consume, one started on node 1 and one on node 2; the publisher
//! starts on node 3. Each reports orders, lost, early, wrongly cancelled, the
//! largest lateness after the cluster recovered and the publisher's time to
//! recover, and asserts 0 / 0 / 0 and its bound.
//!
//! The sweeper is off (`CLUSTER_SWEEPER=on` turns it on): it cancels overdue
//! orders from the database whatever the broker did, so with it on the audit
//! could not tell a message the cluster lost from one it delivered. Off, every
//! cancel is a message the ladder delivered: nothing confirmed was lost.

use std::time::{Duration, Instant};

use chrono::Utc;
use order_expiry::ScheduleError;
use order_expiry_testkit::{at_ms, sum_metric};

use crate::minority::{Minority, READY_BOUND};
use crate::support::{CONFIRM_TIMEOUT, ClusterWorld, NodesBack, orders_on, settle, start, stop};

/// With a majority left the cluster never stops serving: every order is
/// cancelled within this of its due time, the project's restart bound
/// (docs/src/results/broker-restarts.md; measured on this cluster: well under a second).
const BOUND: Duration = Duration::from_secs(10);

/// With the majority lost, nothing moves until a second node is back; then
/// every order is cancelled within this of max(due, quorum back): the restart
/// bound plus the nodes' own recovery of their quorum queues, measured from
/// the first confirm after the loss (the majority's real return, up to 3 s
/// before node 2's start returns): 16.8 s on a shared machine.
const MAJORITY_BOUND: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    RollingRestart,
    MajorityLost,
}

/// What the fault did: when the cluster had its majority again, and a note.
pub(crate) struct Done {
    /// While the majority was lost: schedules started then must all fail.
    pub(crate) refusing: Option<(Instant, Instant)>,
    pub(crate) recovered: Instant,
    pub(crate) recovered_wall: chrono::DateTime<Utc>,
    pub(crate) note: String,
}

impl Done {
    /// Recovered at `at` instead, if that is earlier.
    fn recovered_by(self, at: Option<Instant>) -> Self {
        match at {
            Some(at) if at < self.recovered => Self {
                recovered_wall: self.recovered_wall
                    - chrono::TimeDelta::from_std(self.recovered - at).unwrap_or_default(),
                recovered: at,
                note: format!(
                    "{}; first confirm {:.1} s before node 2's start returned",
                    self.note,
                    (self.recovered - at).as_secs_f64()
                ),
                ..self
            },
            _ => self,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_of_all_three_nodes() {
    scenario("rolling restart", Fault::RollingRestart, BOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn majority_lost_refuses_schedules_loses_nothing_and_resumes() {
    scenario("majority lost", Fault::MajorityLost, MAJORITY_BOUND).await;
}

/// Two `serve` (nodes 1 and 2), the order service on node 3, `fault` 5 s in,
/// orders for 3 s more; then the audit, its `FIGURES` line and its asserts.
pub(crate) async fn scenario(name: &'static str, fault: Fault, bound: Duration) {
    let _back = NodesBack;
    let world = ClusterWorld::new(name, 6).await;
    let sweeper = match std::env::var("CLUSTER_SWEEPER").as_deref() {
        Ok("on") => "true",
        _ => "false",
    };
    let env = [("ORDER_EXPIRY__SWEEPER__ENABLED", sweeper)];
    let serves = world.serves_on(&[1, 2], &env).await;
    let orders = orders_on(&world, 3);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let fault_at = Instant::now();
    let done = match fault {
        Fault::RollingRestart => rolling_restart().await,
        Fault::MajorityLost => majority_lost(&world).await,
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ledger = orders.stop().await;
    // The majority may be back before `start` returns (it also waits for the
    // node to join and settle): recovery is the first confirm after the loss
    // when that came earlier, so lateness after recovery is not understated.
    let done = match done.refusing {
        Some((lost_at, _)) => done.recovered_by(ledger.first_confirm_after(lost_at)),
        None => done,
    };
    let figures = settle(
        &world,
        &ledger,
        done.recovered_wall,
        bound + Duration::from_secs(5),
    )
    .await;
    let settled = Instant::now();
    let consumers = wait_for_consumers(&world, serves.len()).await;
    let (errors, first_error) = ledger.errors();
    let recover = ledger
        .first_ok_after(done.recovered)
        .map_or("never".to_owned(), |d| format!("{} ms", d.as_millis()));
    let refused = done
        .refusing
        .map(|(from, to)| ledger.outcomes_between(from, to));
    let swept: f64 = sum_metric(&serves, "order_expiry_swept_total").await;
    let reconnects: f64 = sum_metric(&serves, "order_expiry_reconnects_total").await;
    figures.print(
        name,
        &format!(
            "{}; fault {:.1} s; publisher: first confirm {recover} after recovery, {errors} failed calls \
             (first: {}); consumers: {reconnects} reconnects, sweeper {sweeper} ({swept} swept), on nodes \
             {consumers:?} afterwards; settled {:.1} s after recovery{}",
            done.note,
            (done.recovered - fault_at).as_secs_f64(),
            first_error.unwrap_or("none"),
            (settled - done.recovered).as_secs_f64(),
            refused.map_or(String::new(), |(ok, failed)| format!(
                "; calls started without a majority: {ok} confirmed, {failed} refused"
            )),
        ),
    );
    if let Some((confirmed, refused)) = refused {
        assert_eq!(confirmed, 0, "no schedule is confirmed without a majority");
        assert!(refused > 0, "the order service kept trying meanwhile");
    }
    figures.assert_within(bound);
    if sweeper == "false" {
        assert_eq!(swept, 0.0, "swept with the sweeper off");
    }
    assert_eq!(
        consumers.len(),
        serves.len(),
        "one consumer per serve on the due queue, no zombie left by a failed session"
    );
    drop(serves);
    world.cleanup().await;
}

/// Stops and starts each node in turn (graceful stop, 2 s down, started, 3 s
/// to catch up). Two of three always run.
async fn rolling_restart() -> Done {
    let (recovered, recovered_wall) = (Instant::now(), Utc::now());
    let mut steps = Vec::new();
    for n in 1..=3 {
        let t = Instant::now();
        stop(n).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        start(n).await;
        steps.push(format!("node {n} {:.1} s", t.elapsed().as_secs_f64()));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    Done {
        refusing: None,
        recovered,
        recovered_wall,
        note: format!("restarted one at a time: {}", steps.join(", ")),
    }
}

/// Stops nodes 2 and 3: node 1 alone has no majority. A new schedule must fail
/// (bounded) and say why; after 10 s node 2 comes back (majority again), then 3.
async fn majority_lost(world: &ClusterWorld) -> Done {
    stop(2).await;
    stop(3).await;
    let lost_at = Instant::now();
    let probe = world.scheduler_on(1, CONFIRM_TIMEOUT);
    let called = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        probe.schedule("probe-majority-lost", at_ms(5000)),
    )
    .await
    .expect("a schedule without a majority returns within 30 s");
    let waited = called.elapsed();
    // The refusal is the confirm timeout, after the whole timeout: the broker
    // took the publish and never confirmed it (the queues have no majority),
    // rather than failing at once for some other reason.
    let refusal = match refused {
        Ok(scheduled) => panic!("confirmed without a majority: {scheduled:?}"),
        Err(ScheduleError::Timeout(timeout)) => {
            assert_eq!(timeout, CONFIRM_TIMEOUT, "the probe's confirm timeout");
            assert!(
                waited >= CONFIRM_TIMEOUT && waited <= CONFIRM_TIMEOUT + Duration::from_secs(5),
                "refused after {waited:?}, not after its {CONFIRM_TIMEOUT:?} confirm timeout"
            );
            format!(
                "no confirm within {timeout:?} (after {} ms)",
                waited.as_millis()
            )
        }
        Err(e) => panic!("refused for another reason than the missing majority: {e}"),
    };
    probe.close().await;
    // `topology apply` and a new `serve` on node 1 alone (crate::minority).
    let minority = Minority::probe(world, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(lost_at.elapsed())).await;
    // Node 2 may give the queues their majority back before `start` returns
    // (which also waits for it to join and settle).
    let restarting = Instant::now();
    let recovered = start(2).await;
    let recovered_wall = Utc::now();
    let down = recovered - lost_at;
    // Counted from node 2's start (its boot included): the majority's return
    // lies between that and the start's return.
    minority
        .serve
        .wait_ready(READY_BOUND + Duration::from_secs(30))
        .await;
    let ready_after = restarting.elapsed();
    let khepri = minority.note(ready_after);
    minority.assert_answers(ready_after);
    drop(minority);
    start(3).await;
    Done {
        // A call started within 3 s (its confirm timeout) of node 2's start
        // may be confirmed once the majority is back; none started earlier.
        refusing: Some((lost_at, restarting - Duration::from_secs(3))),
        recovered,
        recovered_wall,
        note: format!(
            "nodes 2 and 3 stopped for {:.1} s; a new schedule meanwhile: {refusal}; {khepri}",
            down.as_secs_f64()
        ),
    }
}

/// The nodes of the due queue's consumers once there are `n` (at most 30 s).
async fn wait_for_consumers(world: &ClusterWorld, n: usize) -> Vec<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = world.due_consumer_nodes().await;
        if nodes.len() == n || Instant::now() > deadline {
            return nodes;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
