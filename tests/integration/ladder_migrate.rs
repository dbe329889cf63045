//! `order-expiry ladder migrate` with a few thousand orders in flight: from a
//! 22-level ladder into a 24-level one under a new prefix, and a prefix
//! rename, each while the old ladder keeps expiring messages and consumers
//! run. Nothing lost (every order cancelled), nothing early (`cancelled_at`
//! never before `pay_deadline`), the old ladder empty and deleted after.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use order_expiry::{Scheduler, Settings};
use order_expiry_testkit::{
    Proxy, World, amqp_port, at_ms, eventually, number_after, orders, run_cli, succeeded,
};
use rand::Rng;
use secrecy::ExposeSecret;

/// Runs `order-expiry ladder migrate ARGS` with `settings` (the new ladder).
async fn migrate(settings: &Settings, args: &[&str]) -> String {
    let args = [&["ladder", "migrate"][..], args].concat();
    let out = run_cli(settings, &args, &[]).await;
    succeeded("order-expiry ladder migrate", &out)
}

/// The settings of a new ladder of `levels` beside the world's (its prefix
/// and `-new`), declared.
pub(crate) async fn new_ladder(env: &World, levels: u8) -> Settings {
    let mut new = env.settings.clone();
    new.topology.prefix = format!("{}-new", env.settings.topology.prefix);
    new.topology.levels = levels;
    env.declare(&new).await.unwrap();
    new
}

/// Waits until every order is cancelled (at most 90 s); none early.
async fn all_cancelled_none_early(env: &World, orders: &[(String, DateTime<Utc>)]) {
    let rows = env.wait_cancelled(orders, Duration::from_secs(90)).await;
    assert_eq!(rows.len(), orders.len());
    let early = rows
        .values()
        .filter(|r| r.cancelled_at.is_some_and(|at| at < r.pay_deadline));
    assert_eq!(early.count(), 0, "orders cancelled before their deadline");
}

/// `n` unpaid orders due 4-40 s from now, scheduled into the old ladder at
/// once: the publisher's window fills and most leave in v2 bundles, which the
/// migration moves as bundles.
async fn migrate_while_running(old_levels: u8, new_levels: u8, n: usize, old_consumer: bool) {
    let env = World::builder().kind("mg").levels(old_levels).build();
    let env = env.await.expect("a world");
    let new = new_ladder(&env, new_levels).await;
    let mut rng = rand::rng();
    let orders = orders("m", n, |_| at_ms(rng.random_range(4_000..40_000)));
    let messages = env.place(&orders).await;
    assert!(
        messages < n,
        "{messages} messages for {n} orders: no bundle to move"
    );
    let consumer = env.start_consumer_with(&new);
    let old = old_consumer.then(|| env.start_consumer());
    let levels = old_levels.to_string();
    let from = ["--from-prefix", &env.settings.topology.prefix];
    let from = [&from[..], &["--from-levels", levels.as_str()]].concat();

    let dry = migrate(&new, &[&from[..], &["--dry-run"]].concat()).await;
    eprintln!("{dry}");
    let found = number_after(&dry, "levels):") as u64;
    assert!(found > 0 && found <= n as u64, "{dry}");
    assert!(dry.contains("dry run: nothing moved"), "{dry}");

    let out = migrate(&new, &[&from[..], &["--delete-old"]].concat()).await;
    eprintln!("{out}");
    let moved = number_after(&out, "moved") as u64;
    assert!(moved > 0 && moved <= messages as u64, "{out}");
    assert!(out.contains("deleted"), "{out}");
    let migrated = Instant::now();
    all_cancelled_none_early(&env, &orders).await;
    eprintln!(
        "all {n} cancelled, none early, {:?} after the migration",
        migrated.elapsed()
    );
    // The old ladder is gone: its queues no longer exist.
    let level_0 = env.ladder().level_name(0);
    assert!(!env.has_queue(&level_0).await, "old level 0 deleted");
    if let Some(old) = old {
        old.stop().await;
    }
    consumer.stop().await;
    env.cleanup().await;
}

/// 22 levels under one prefix to 24 under another, 2,000 orders in flight,
/// the new consumer running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_22_to_24_levels_loses_nothing_and_cancels_nothing_early() {
    migrate_while_running(22, 24, 2_000, false).await;
}

/// A prefix rename (22 levels both), 2,000 orders in flight, the old and the
/// new consumer both running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_a_prefix_rename_with_both_consumers_running() {
    migrate_while_running(22, 22, 2_000, true).await;
}

/// A ladder nobody consumes moves what falls due on to its catch-up queue
/// after `topology.catch_up_after_ms`: the migration takes it from there too,
/// and `--delete-old` removes that queue and its exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_moves_what_waited_in_the_old_catch_up_queue() {
    let env = World::builder().kind("mgc").declare(false).build();
    let env = env.await.expect("a world");
    let mut old = env.settings.clone();
    old.topology.catch_up_after = Duration::from_secs(1);
    env.declare(&old).await.unwrap();
    let new = new_ladder(&env, env.settings.topology.levels).await;

    let due = at_ms(500);
    let orders = orders("c", 20, |_| due);
    env.place_with(Scheduler::from_settings(&old).unwrap(), &orders)
        .await;
    let (due_queue, catch_up) = (env.ladder().due_queue(), env.ladder().catch_up_queue());
    eventually(
        Duration::from_secs(20),
        "all in the catch-up queue",
        async || env.depth(&due_queue).await == 0 && env.depth(&catch_up).await > 0,
    )
    .await;

    let consumer = env.start_consumer_with(&new);
    let levels = env.settings.topology.levels.to_string();
    let prefix = env.settings.topology.prefix.as_str();
    let from = ["--from-prefix", prefix, "--from-levels", &levels];
    let out = migrate(&new, &[&from[..], &["--delete-old"]].concat()).await;
    eprintln!("{out}");
    assert!(number_after(&out, "moved") > 0.0, "{out}");
    all_cancelled_none_early(&env, &orders).await;
    assert!(
        !env.has_queue(&catch_up).await,
        "the old catch-up queue deleted"
    );
    consumer.stop().await;
    env.cleanup().await;
}

/// Whether `bytes` hold an AMQP `channel.open` method frame: frame type 1,
/// a channel, a size, then class 20 (channel) and method 10 (open).
fn channel_open(bytes: &[u8]) -> bool {
    bytes
        .windows(11)
        .any(|f| f[0] == 1 && f[1..3] != [0, 0] && f[7..11] == [0, 20, 0, 10])
}

/// A node that goes away between the connect and the first channel (it
/// accepted the connection while stopping): the first URL of the list is a
/// proxy to the broker that resets each connection at its `channel.open`;
/// the migration must carry on through the second, and move what the old
/// ladder holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_carries_on_when_its_first_node_resets_at_the_first_channel() {
    let env = World::builder().kind("mgr").build().await.expect("a world");
    let new = new_ladder(&env, env.settings.topology.levels).await;
    let due = at_ms(6_000);
    let orders = orders("r", 20, |_| due);
    env.place(&orders).await;
    let consumer = env.start_consumer_with(&new);

    let broker = ([127, 0, 0, 1], amqp_port()).into();
    let proxy = Proxy::cutting(broker, channel_open).await;
    let url = new.amqp.url.expose_secret().to_owned();
    let direct = format!("127.0.0.1:{}", amqp_port());
    assert!(url.contains(&direct), "{url}");
    let mut through_proxy = new.clone();
    through_proxy.amqp.url =
        format!("{},{url}", url.replace(&direct, &proxy.addr().to_string())).into();
    let from = ["--from-prefix", &env.settings.topology.prefix];
    let out = migrate(&through_proxy, &from).await;
    eprintln!("{out}");
    assert!(proxy.cuts() > 0, "the proxy never reset a connection");
    assert!(number_after(&out, "moved") > 0.0, "{out}");
    all_cancelled_none_early(&env, &orders).await;
    consumer.stop().await;
    env.cleanup().await;
}
