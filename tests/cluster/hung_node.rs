//! A hung node is not a dead one: the node leading the most ladder queues is
//! stopped with SIGSTOP for 30 s, then continued with SIGCONT. Its sockets stay
//! open and the kernel still accepts connections on its ports, but nothing
//! answers: no AMQP frame, no confirm, no distribution traffic. Its peers notice
//! through Ra's failure detector (quorum queues and Khepri elect new leaders
//! elsewhere), its AMQP clients through their own timeouts or heartbeats. The
//! scenario is [`crate::node_loss::scenario`] with this fault: orders in flight,
//! two `serve` (nodes 1 and 2), the order service on node 3, the sweeper off.

use std::time::{Duration, Instant};

use chrono::Utc;

use crate::node_loss::{Done, Fault, scenario};
use crate::support::{ClusterWorld, pause, resume};

/// How long the node stays hung.
const PAUSED: Duration = Duration::from_secs(30);

/// Every order is cancelled within this of max(due, the node's SIGCONT). Not
/// the 10 s of a kill -9 or a restart: on RabbitMQ 4.3.6 the surviving nodes
/// elect new leaders 5-11 s into the pause, yet the due orders stop reaching
/// the consumers until the hung node answers again, and for a while after
/// (it works off 30 s of backlog on one scheduler). Measured on 2026-12-02:
/// 13.3 s and 50.3 s after SIGCONT (README, Running on a cluster).
const BOUND: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigstop_of_the_node_leading_most_ladder_queues_for_30_s() {
    scenario(
        "SIGSTOP busiest leader 30 s",
        Fault::PauseBusiestLeader,
        BOUND,
    )
    .await;
}

/// Pauses the node leading the most ladder queues for [`PAUSED`] while orders
/// flow, then continues it. The majority never goes: the lateness bound is
/// counted from the SIGCONT, when the hung node's own clients and deliveries
/// come back at the latest.
pub(crate) async fn pause_busiest_leader(world: &ClusterWorld) -> Done {
    let before = world.leaders(".ladder.").await;
    let busiest = (1..=3).max_by_key(|n| before[n - 1]).expect("three nodes");
    let paused_at = Instant::now();
    pause(busiest).await;
    tokio::time::sleep(PAUSED.saturating_sub(paused_at.elapsed())).await;
    resume(busiest).await;
    let (recovered, recovered_wall) = (Instant::now(), Utc::now());
    let after = world.leaders(".ladder.").await;
    Done {
        refusing: None,
        recovered,
        recovered_wall,
        note: format!(
            "node {busiest} hung (SIGSTOP) {:.1} s; ladder leaders per node before {before:?}, \
             after SIGCONT {after:?}",
            (recovered - paused_at).as_secs_f64()
        ),
    }
}
