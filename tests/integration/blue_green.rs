//! A blue-green broker upgrade with `ladder migrate --from-url`: 5,000 orders
//! in flight on the blue broker (the system 3.10, `ORDER_EXPIRY_TEST_BLUE_AMQP_PORT`,
//! default 5672) with `serve` running there, a few poison bodies in its
//! parked queue; then `serve` on the green broker (the test's broker, 4.3 in
//! scripts/test), the real `order-expiry ladder migrate --from-url <blue>`,
//! blue's `serve` stopped and blue drained (`--delete-old`). Sweepers off.
//! Nothing lost, nothing early, no paid or extended order cancelled, every
//! unpaid one cancelled exactly once (the two serves' `cancelled` counts add
//! up to it), the parked messages in green's parked queue with their reasons,
//! and every order due during the move cancelled within [`LATE_BOUND`].

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lapin::BasicProperties;
use order_expiry::Settings;
use order_expiry_testkit::{
    OrderRow, Served, World, amqp_port, amqp_url, blue_amqp_port, number_after, number_before,
    orders, poll, run_cli, schedule_all,
};
use rand::Rng;

const ORDERS: usize = 5_000;
/// Poison bodies parked on blue before the move.
const POISON: usize = 3;
/// Every order due during the move (and any other) is cancelled within this
/// of its deadline, or of the end of scheduling for an order already due by
/// then (it went straight to the due queue): holds on a busy 2-core machine
/// running both brokers.
const LATE_BOUND: Duration = Duration::from_secs(5);

/// `order-expiry ladder migrate ARGS` with `settings` (green's): whether it
/// succeeded, and its stdout and stderr.
async fn migrate(settings: &Settings, args: &[&str]) -> (bool, String) {
    let out = run_cli(settings, &[&["ladder", "migrate"][..], args].concat(), &[]).await;
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text.into_owned())
}

/// How late `order` was cancelled: after its deadline, or after `scheduled`
/// (the end of scheduling) if it was due by then. Scheduling 5,000 orders
/// takes seconds on a busy machine and the first fall due 2 s in: an order
/// scheduled past its deadline is late by what scheduling took, which the
/// move has no part in.
fn lateness(order: &OrderRow, scheduled: DateTime<Utc>) -> Duration {
    let from = order.pay_deadline.max(scheduled);
    (order.cancelled_at.unwrap_or(from) - from)
        .to_std()
        .unwrap_or_default()
}

/// The sum of `cancelled` outcomes of `served`, once it stopped changing.
async fn settled_cancels(served: &Served) -> f64 {
    let series = "order_expiry_messages_total{outcome=\"cancelled\"}";
    let mut last = served.metric(series).await;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = served.metric(series).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blue_green_broker_move_loses_nothing_and_cancels_each_order_once() {
    let blue_port = blue_amqp_port();
    if blue_port == amqp_port() {
        eprintln!(
            "skipped: the blue broker (ORDER_EXPIRY_TEST_BLUE_AMQP_PORT={blue_port}) is the test's broker; \
             run with ORDER_EXPIRY_TEST_AMQP_PORT set to another node (scripts/test's 4.3 stage)"
        );
        return;
    }
    // Blue: its own prefix and the schema both serves share (one database).
    let blue = World::builder().kind("bg").amqp_port(blue_port).build();
    let blue = blue
        .await
        .expect("a world on the blue broker (its test vhost made?)");
    // Green: the same prefix, levels and database on the test's broker;
    // green's world only removes that topology at cleanup.
    let green = World::builder().kind("bg").declare(false).build();
    let mut green = green.await.expect("a world on the green broker");
    green.settings = blue.settings.clone();
    green.settings.amqp.url = amqp_url().into();
    let settings = green.settings.clone();
    green.declare(&settings).await.expect("green topology");

    // Orders due 2-60 s from now (the move starts a few seconds in, and some
    // fall due during it): every 10th paid, every 10th (another) extended.
    let now = Utc::now();
    let mut rng = rand::rng();
    let orders = orders("bg", ORDERS, |_| {
        now + TimeDelta::milliseconds(rng.random_range(2_000..60_000))
    });
    blue.create_orders(&orders).await;
    for i in 0..POISON {
        let body = format!("{{\"v\": 1, \"order_id\": \"poison-{i}\"}}");
        blue.publish_due(body.as_bytes(), BasicProperties::default())
            .await;
    }
    let blue_serve = blue.serve_ready(&[]).await;
    // Most orders one message each, the rest in bundles: both move.
    let (alone, bundled) = orders.split_at(ORDERS * 4 / 5);
    schedule_all(blue.scheduler().with_bundle_max_orders(1), alone).await;
    schedule_all(blue.scheduler(), bundled).await;
    let scheduled = Utc::now();
    let paid = blue
        .execute(
            "UPDATE orders SET status = 'paid', paid_at = now() \
             WHERE right(id, 1) = '3' AND status = 'unpaid'",
        )
        .await;
    let extended = blue
        .execute(
            "UPDATE orders SET pay_deadline = pay_deadline + interval '1 hour' \
             WHERE right(id, 1) = '7' AND status = 'unpaid'",
        )
        .await;

    let green_serve = green.serve_ready(&[]).await;
    let blue_url = secrecy::ExposeSecret::expose_secret(&blue.settings.amqp.url).to_owned();
    // The same prefix on the same broker is refused (asked of the brokers).
    let (ok, out) = migrate(&green.settings, &["--from-url", &amqp_url()]).await;
    assert!(
        !ok && out.contains("the old ladder is the current one"),
        "{out}"
    );

    let (ok, dry) = migrate(&green.settings, &["--from-url", &blue_url, "--dry-run"]).await;
    assert!(ok && dry.contains("dry run: nothing moved"), "{dry}");
    assert!(dry.contains("on amqp://guest:***@"), "{dry}");
    let found = number_before(&dry, " messages");
    let started = Utc::now();
    let (ok, out) = migrate(&green.settings, &["--from-url", &blue_url]).await;
    let ended = Utc::now();
    assert!(ok, "{out}");
    eprintln!("{out}");
    assert!(!out.contains("guest:guest"), "the password printed: {out}");
    let moved = number_after(&out, "moved");
    let rate = number_before(&out, " messages/s");
    let parked_moved = number_before(&out, " parked messages (to the parked queue)");
    assert_eq!(parked_moved, POISON as f64, "{out}");

    // Blue's serve finishes what it holds (due within a second), then stops.
    let blue_cancels = settled_cancels(&blue_serve).await;
    blue_serve.assert_nothing_swept().await;
    blue_serve.terminate().await;
    // Blue drained (what its serve released) and retired.
    let (ok, out) = migrate(&green.settings, &["--from-url", &blue_url, "--delete-old"]).await;
    assert!(ok && out.contains("deleted"), "{out}");
    let ladder = blue.ladder();
    for queue in [ladder.due_queue(), ladder.level_name(0)] {
        let left = blue.has_queue(&queue).await;
        assert!(!left, "{queue} is still on blue after the drain");
    }

    let unpaid = (ORDERS as u64 - paid - extended) as usize;
    let rows = poll(Duration::from_secs(120), 50, || async {
        let rows = blue.orders().await.expect("orders");
        match rows.values().filter(|o| o.status == "cancelled").count() >= unpaid {
            true => Ok(rows),
            false => Err("unpaid orders cancelled within 120 s"),
        }
    })
    .await;
    let green_cancels = settled_cancels(&green_serve).await;
    green_serve.assert_nothing_swept().await;
    let cancelled: Vec<_> = rows.values().filter(|o| o.status == "cancelled").collect();
    let lost = unpaid - cancelled.len().min(unpaid);
    let early = cancelled
        .iter()
        .filter(|o| o.cancelled_at.is_some_and(|at| at < o.pay_deadline))
        .count();
    let wrongly = rows
        .values()
        .filter(|o| o.paid_at.is_some() || o.pay_deadline > ended + TimeDelta::minutes(30))
        .filter(|o| o.status == "cancelled")
        .count();
    let overdue = orders.iter().filter(|(_, due)| *due < scheduled).count();
    let late = |o: &&OrderRow| lateness(o, scheduled);
    let max_late = cancelled.iter().map(late).max().unwrap_or_default();
    let during: Vec<&OrderRow> = cancelled
        .iter()
        .copied()
        .filter(|o| o.pay_deadline >= started && o.pay_deadline <= ended)
        .collect();
    let max_late_during = during.iter().map(late).max().unwrap_or_default();

    // Green's parked queue holds blue's poison, each with its reason.
    let parked = green.parked().await;
    for p in &parked {
        let body = String::from_utf8_lossy(&p.body);
        assert!(body.contains("poison-"), "{body}");
    }
    eprintln!(
        "FIGURES blue-green move (blue :{blue_port} -> green :{}): {ORDERS} orders ({unpaid} unpaid, {paid} paid, {extended} extended) \
         scheduled in {:.1} s ({overdue} due by then), \
         {found} messages found, {moved} moved at {rate} messages/s in {:.1} s, {} due during the move; \
         lost {lost}, early {early}, wrongly cancelled {wrongly}, cancels blue {blue_cancels} + green {green_cancels}, \
         max lateness {} ms (during the move {} ms, bound {} ms), parked moved {}",
        amqp_port(),
        (scheduled - now).num_milliseconds() as f64 / 1000.0,
        (ended - started).num_milliseconds() as f64 / 1000.0,
        during.len(),
        max_late.as_millis(),
        max_late_during.as_millis(),
        LATE_BOUND.as_millis(),
        parked.len()
    );
    assert_eq!(lost, 0, "unpaid orders never cancelled");
    assert_eq!(early, 0, "orders cancelled before their deadline");
    assert_eq!(wrongly, 0, "paid or extended orders cancelled");
    assert_eq!(
        blue_cancels + green_cancels,
        unpaid as f64,
        "each unpaid order cancelled exactly once"
    );
    assert_eq!(
        parked.len(),
        POISON,
        "blue's parked messages in green's parked queue"
    );
    assert!(!during.is_empty(), "no order fell due during the move");
    assert!(max_late <= LATE_BOUND, "{max_late:?} late");
    assert!(max_late_during <= LATE_BOUND, "{max_late_during:?} late");

    green_serve.terminate().await;
    blue.cleanup().await;
    green.cleanup().await;
}
