//! Where the queues live, and the publisher moving between nodes:
//!
//! - the default topology (22 levels, due, parked and catch-up: 25 queues)
//!   declared through one node has its leaders spread over the nodes
//!   (`balanced`) and three members per queue, and `topology.replicas = 1`
//!   gives one member;
//! - a publisher whose node is killed (-9) with calls in flight: those calls
//!   return an error, the caller's next calls are confirmed on another node,
//!   and every order confirmed is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use order_expiry_testkit::{at_ms, vhost, wire_due};
use tokio_util::sync::CancellationToken;

use crate::support::{
    Call, ClusterWorld, NodesBack, ctl_any, kill, node_number, node_of_pid, nodes_named, queues,
    start,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_spread_and_every_queue_has_the_replicas() {
    let world = ClusterWorld::new("placement", 6).await;
    let mut full = world.settings.clone();
    full.topology.prefix = format!("{}-full", world.settings.topology.prefix);
    full.topology.levels = 22;
    // `balanced` places each new leader by the leaders every node has: this
    // scenario's own six levels and whatever else the vhost holds, printed.
    let before = all_leaders().await;
    world.declare(&full).await.expect("the default ladder");
    let leaders = crate::support::leaders(&vhost(), &full.topology.prefix, "").await;
    let after = all_leaders().await;
    let members = queues(&vhost(), &full.topology.prefix, &["members"]).await;
    eprintln!(
        "FIGURES placement: 25 queues declared through one node, leaders per node {leaders:?} \
         (every queue of the vhost: before {before:?}, after {after:?})"
    );
    assert_eq!(leaders.iter().sum::<usize>(), 25, "{leaders:?}");
    // Not to the letter of `balanced`: a node started again just before (the
    // publisher scenario kills one) is given fewer leaders for a while, more
    // than the counts explain (measured: [10, 6, 9] new from [2, 0, 7], node
    // 2 restarted seconds before; [11, 2, 12] in another run). What
    // order-expiry asks for is spreading: the broker's default,
    // client-local, puts all 25 on one node.
    let spread = leaders.iter().filter(|&&n| n >= 6).count() >= 2;
    assert!(
        spread && leaders.iter().all(|&n| n <= 15),
        "leaders spread over the nodes (balanced), from {before:?}: the 25 new {leaders:?}, \
         all {after:?}"
    );
    for (queue, fields) in &members {
        assert_eq!(nodes_named(&fields[0]), 3, "{queue}: {fields:?}");
    }

    let mut single = world.settings.clone();
    single.topology.prefix = format!("{}-one", world.settings.topology.prefix);
    single.topology.replicas = 1;
    world.declare(&single).await.expect("replicas 1");
    for (queue, fields) in queues(&vhost(), &single.topology.prefix, &["members"]).await {
        assert_eq!(nodes_named(&fields[0]), 1, "{queue}: {fields:?}");
    }
    world.cleanup().await;
}

/// How many of the test vhost's queues (every scenario's) each node leads.
async fn all_leaders() -> [usize; 3] {
    let vhost = vhost();
    let listing = ctl_any(&["list_queues", "-p", &vhost, "--no-table-headers", "leader"]).await;
    let mut counts = [0; 3];
    for n in listing.lines().filter_map(|l| node_number(l.trim())) {
        counts[n - 1] += 1;
    }
    counts
}

/// The node of this process's publisher connection (named `order-expiry
/// publisher`), from the connections' client properties.
async fn publisher_node() -> Option<usize> {
    let args = [
        "list_connections",
        "--no-table-headers",
        "vhost",
        "pid",
        "client_properties",
    ];
    let listing = ctl_any(&args).await;
    let ours =
        |l: &&str| l.starts_with(&format!("{}\t", vhost())) && l.contains("order-expiry publisher");
    let mut publishers = listing.lines().filter(ours);
    publishers.find_map(|l| node_of_pid(l.split('\t').nth(1)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publisher_whose_node_dies_fails_the_calls_in_flight_then_confirms_on_another() {
    let _back = NodesBack;
    let world = ClusterWorld::new("publisher failover", 6).await;
    let served = world.serves_on(&[1], &[]).await;
    let scheduler = Arc::new(world.scheduler_on(2, Duration::from_secs(5)));
    scheduler.connect().await.expect("connected");
    let node = publisher_node().await.expect("the publisher's connection");

    // 16 callers, each scheduling one order after the other (due in 2 s).
    let stop = CancellationToken::new();
    let mut callers = Vec::new();
    for task in 0..16 {
        let (scheduler, store, stop) = (
            Arc::clone(&scheduler),
            Arc::clone(&world.store),
            stop.clone(),
        );
        callers.push(tokio::spawn(async move {
            let mut calls: Vec<(String, Call)> = Vec::new();
            let mut n = 0;
            while !stop.is_cancelled() {
                n += 1;
                let id = format!("p-{task}-{n}");
                let due_at = wire_due(at_ms(2000));
                store.create_unpaid(&id, due_at).await.expect("insert");
                let started = Instant::now();
                let result = scheduler.schedule(id.as_str(), due_at).await;
                let error = result.err().map(|e| e.to_string());
                calls.push((
                    id,
                    Call {
                        started,
                        ended: Instant::now(),
                        error,
                    },
                ));
            }
            calls
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The beam dies somewhere between these two (cluster.sh finds its pid first).
    let kill_started = Instant::now();
    kill(node).await;
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = publisher_node().await;
    stop.cancel();
    let mut per_caller = Vec::new();
    for caller in callers {
        per_caller.push(caller.await.expect("caller"));
    }
    start(node).await;

    let all = per_caller.iter().flatten();
    let (failed, confirmed): (Vec<_>, Vec<_>) = all.partition(|(_, c)| c.error.is_some());
    let failed_before = failed.iter().filter(|(_, c)| c.ended < kill_started);
    let failed_before = failed_before.count();
    // For each caller: the longest run of failed calls in a row, and how long
    // after the kill its first call started after it was confirmed.
    let mut streaks = Vec::new();
    let mut recoveries = Vec::new();
    for calls in &per_caller {
        let (mut run, mut longest) = (0, 0);
        for (_, c) in calls {
            run = if c.error.is_some() { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        streaks.push(longest);
        if let Some((_, ok)) = calls
            .iter()
            .find(|(_, c)| c.started >= killed && c.error.is_none())
        {
            recoveries.push(ok.ended.saturating_duration_since(kill_started));
        }
    }
    let errors: Vec<&str> = failed
        .iter()
        .filter_map(|(_, c)| c.error.as_deref())
        .take(3)
        .collect();

    // Every confirmed order is cancelled (due 2 s after its call).
    let deadline = Utc::now() + chrono::TimeDelta::seconds(30);
    let mut uncancelled;
    loop {
        let rows = world.rows().await;
        uncancelled = confirmed
            .iter()
            .filter(|(id, _)| rows[id.as_str()].status != "cancelled")
            .count();
        if uncancelled == 0 || Utc::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let max_recovery = recoveries.iter().max().copied().unwrap_or_default();
    eprintln!(
        "FIGURES publisher failover: killed node {node} (the publisher's), then on node {after:?}; \
         calls {}, confirmed {}, failed {} (all while or after the node died: {}), \
         longest run of failures per caller {streaks:?}, first confirm after the kill within {} ms for every caller; \
         confirmed but not cancelled {uncancelled}; errors e.g. {errors:?}",
        failed.len() + confirmed.len(),
        confirmed.len(),
        failed.len(),
        failed_before == 0,
        max_recovery.as_millis(),
    );
    assert!(
        !failed.is_empty(),
        "calls in flight when the node died fail"
    );
    assert_eq!(failed_before, 0, "no call failed before the kill");
    assert!(
        streaks.iter().all(|&n| n <= 1),
        "after a failed call, the caller's next call is confirmed: {streaks:?}"
    );
    assert!(
        after.is_some_and(|n| n != node),
        "the publisher moved: {after:?}"
    );
    assert_eq!(
        recoveries.len(),
        16,
        "every caller was confirmed again after the kill"
    );
    assert!(max_recovery < Duration::from_secs(8), "{max_recovery:?}");
    assert_eq!(uncancelled, 0, "every confirmed order was cancelled");
    drop(served);
    world.cleanup().await;
}
