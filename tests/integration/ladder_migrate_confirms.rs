//! `ladder migrate` confirms before it acks: into a ladder that cannot take
//! the messages (its level 5 queue deleted, so the broker returns every
//! message bound there as unroutable, and the channel stays open), the
//! migration fails and every message is still in the old ladder. A migration
//! that acked an old message before the new broker's confirm of its copy
//! would lose every one in its window.

use std::time::Duration;

use order_expiry_testkit::{World, at_ms, orders, run_cli};

use crate::ladder_migrate::new_ladder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_the_new_broker_refuses_leaves_every_message_in_the_old_ladder() {
    let env = World::builder().kind("mgc").build().await.expect("a world");
    // 300 orders due in 40-60 s, one message each: none leaves the ladder
    // while the test runs.
    let orders = orders("c", 300, |i| at_ms(40_000 + 60 * i as i64));
    let scheduler = env.scheduler().with_bundle_max_orders(1);
    env.place_with(scheduler, &orders).await;
    let before = env.ladder_depth(None).await;
    assert_eq!(before, 300);

    // The new ladder, without the level every one of these messages enters.
    let new = new_ladder(&env, env.settings.topology.levels).await;
    env.delete_queue(&new.ladder().unwrap().level_name(5)).await;
    let prefix = &env.settings.topology.prefix;
    let from = ["ladder", "migrate", "--from-prefix", prefix];
    let out = run_cli(&new, &from, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "migrated into nothing: {stderr}");
    assert!(stderr.contains("unroutable"), "{stderr}");
    // The migration's connection closed: what it held unacked comes back,
    // ready, once the broker has seen the close (on a busy 4.3, all 300 may
    // still be out right after the exit). An acked message never comes back,
    // so a loss still fails here, after the wait.
    let exited = tokio::time::Instant::now();
    let at_exit = env.ladder_depth(None).await;
    let mut after = at_exit;
    while after != before && exited.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = env.ladder_depth(None).await;
    }
    eprintln!(
        "ready in the old ladder: {at_exit} at the exit, {after} after {:?}",
        exited.elapsed()
    );
    assert_eq!(
        after, before,
        "messages acked in the old ladder without a confirm from the new one ({stderr})"
    );
    env.cleanup().await;
}
