//! Scenario 1: the broker restarts (`stop_app`/`start_app`) or dies (`kill -9`)
//! and comes back, while orders are being scheduled and cancelled; the consumer
//! either keeps running or is killed with it and started again once the broker
//! is back. The consumer and the publisher reconnect; `/readyz` says 503 while
//! the broker is away and 200 again after; every order `schedule()` confirmed
//! is handled, and **every one is cancelled within the broker's dead-letter
//! retry plus [`AFTER_RETRY`] of the later of its due time and the broker's
//! return** (docs/src/results/broker-restarts.md), by the SQL action, by the
//! HTTP action (an order service that cancels in its own table) and by the
//! event action (an `order.expired` subscriber on the same broker that cancels
//! in its own table, [`Subscriber`]).
//!
//! The sweeper is off: every cancel is one the ladder delivered and the
//! consumer made, so a lost message fails the test. The broker carries the
//! topology ballast ([`ensure_ballast`]), so a level's dead-letter worker
//! really does stall at boot (the figures line counts the broker's log lines
//! about it); it retries after the node's `dead_letter_worker_publisher_confirm_timeout`
//! ([`dead_letter_retry`]): 5 s with the deployed configuration scripts/test
//! gives the brokers, so the bound is 10 s; 180 s on stock settings
//! (`ORDER_EXPIRY_BROKER_SETTINGS=stock`), where the same tests hold the
//! orders to 185 s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::task::block_in_place;

use order_expiry_testkit::{Endpoint, Lateness, Orders};

use crate::support::{
    Fault, Outage, ReadyWatch, Subscriber, assert_not_ready, broker_log_count, dead_letter_retry,
    ensure_ballast, kill_9, pace, settle, world,
};

/// The promise: cancelled within the broker's dead-letter retry and this of
/// max(due time, broker back).
const AFTER_RETRY: Duration = Duration::from_secs(5);

/// What happens to the consumer when the broker goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consumer {
    /// `serve` keeps running and reconnects.
    KeptRunning,
    /// `serve` is killed (`kill -9`) with the broker and started again once the
    /// broker is back (a node reboot).
    Killed,
}

/// Who cancels a due order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// `action.kind = sql`: `serve`'s own cancel statement.
    Sql,
    /// `action.kind = http`: the order service's expire endpoint
    /// ([`Endpoint::order_service`]), which cancels in the same table.
    Http,
    /// `action.kind = amqp`: an `order.expired` event, which [`Subscriber`]
    /// (on the broker that restarts) turns into the same cancel.
    Event,
}

async fn broker_outage(name: &'static str, fault: Fault, consumer: Consumer, expiry: Expiry) {
    block_in_place(ensure_ballast);
    let retry = block_in_place(dead_letter_retry);
    let bound = retry + AFTER_RETRY;
    let world = world(name).await;
    let endpoint = match expiry {
        Expiry::Sql | Expiry::Event => None,
        Expiry::Http => Some(Endpoint::order_service(Arc::clone(&world.store)).await),
    };
    let base_url = endpoint.as_ref().map(Endpoint::base_url);
    let subscriber = match expiry {
        Expiry::Event => Some(Subscriber::start(&world).await),
        Expiry::Sql | Expiry::Http => None,
    };
    let mut env = vec![
        // Reconnect every 250 ms at most, so the consumer is back while the
        // restarted node is still recovering its quorum queues.
        ("ORDER_EXPIRY__AMQP__RECONNECT_MAX_MS", "250"),
    ];
    if let Some(base_url) = &base_url {
        env.push(("ORDER_EXPIRY__ACTION__KIND", "http"));
        env.push(("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", base_url));
    }
    if let Some(subscriber) = &subscriber {
        env.push(("ORDER_EXPIRY__ACTION__KIND", "amqp"));
        env.push(("ORDER_EXPIRY__ACTION__AMQP__EXCHANGE", &subscriber.exchange));
    }
    let mut served = world.serve_ready(&env).await;
    let mut watch = Some(ReadyWatch::start(&served));
    let pace = pace(Duration::from_millis(20));
    let orders = Orders::start(Arc::clone(&world.store), world.scheduler(), pace);

    // Orders flow, some through the ladder, some already due and being cancelled.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let broken_at = Instant::now();
    let outage = block_in_place(|| Outage::begin(fault));
    if consumer == Consumer::Killed {
        kill_9(&mut served).await;
        watch = None;
    }
    let mut not_ready_at = None;
    if let Some(watch) = &watch {
        not_ready_at = Some(
            watch
                .wait_for(503, broken_at, Duration::from_secs(10))
                .await,
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before_restore = Instant::now();
    let back_at = block_in_place(|| outage.restore());
    let back_wall = Utc::now();
    if consumer == Consumer::Killed {
        served = world.serve(&env).await;
        watch = Some(ReadyWatch::start(&served));
    }
    let watch = watch.expect("a watch on the running serve");
    let ready_at = watch.wait_for(200, back_at, Duration::from_secs(60)).await;
    if let Some(not_ready_at) = not_ready_at {
        assert_not_ready(&watch, not_ready_at, before_restore, "the broker");
    }

    // Keep placing orders for a while on the recovered broker, then let all come due.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ledger = orders.stop().await;
    // Past the bound the test fails anyway.
    let figures = settle(&world, &ledger, bound + Duration::from_secs(5)).await;
    let drained_at = Instant::now();
    let late = Lateness::since(&ledger, &world.rows().await, Some(back_wall), |_| true);
    let stuck_levels = broker_log_count(&format!(
        "Cannot forward any dead-letter messages from source quorum queue '{}.",
        world.settings.topology.prefix
    ));
    let swept = served.metric("order_expiry_swept_total").await;
    let reconnects = served.metric("order_expiry_reconnects_total").await;
    let events = match subscriber {
        Some(subscriber) => {
            let received = subscriber.stop(&world).await;
            assert_eq!(
                received.cancelled as usize, figures.cancelled,
                "every cancel is the subscriber's, one per order: {received:?}"
            );
            assert!(
                received.reconnects >= 1,
                "the subscriber never lost the broker"
            );
            format!(
                "; events acked by the subscriber {} (cancels {}, duplicates or not unpaid {}), its reconnects {}",
                received.events,
                received.cancelled,
                received.events.saturating_sub(received.cancelled),
                received.reconnects
            )
        }
        None => String::new(),
    };

    figures.print(
        name,
        &format!(
            "action {expiry:?}, sweeper off, the broker's dead-letter retry {} s; past max(due, broker back): \
             {late}; swept {swept}; \"cannot forward\" lines the broker logged for this test's ladder: {stuck_levels}; \
             schedule() errors during the outage {} (all retried to Ok), consumer reconnects {reconnects}, \
             broker down {:.1} s, ready again {:.1} s after the broker was back, all settled {:.1} s after it{events}",
            retry.as_secs(),
            ledger.schedule_errors(),
            (back_at - broken_at).as_secs_f64(),
            (ready_at - back_at).as_secs_f64(),
            (drained_at - back_at).as_secs_f64(),
        ),
    );
    assert!(served.running(), "the consumer exited on its own");
    assert_eq!(
        ledger.orders.iter().filter(|o| !o.scheduled).count(),
        0,
        "schedule() kept failing after the broker came back"
    );
    figures.assert_invariants();
    served.assert_nothing_swept().await;
    assert!(
        late.max <= bound,
        "orders cancelled later than {bound:?} after max(due, broker back): {late}"
    );
    assert_eq!(world.depth(&world.ladder().due_queue()).await, 0);
    assert_eq!(world.depth(&world.ladder().parked_queue()).await, 0);
    if consumer == Consumer::KeptRunning {
        assert!(reconnects >= 1.0, "the consumer never reconnected");
    }
    drop(watch);
    drop(served);
    drop(endpoint);
    world.cleanup().await;
}

/// One test per row: its name, its FIGURES label, the fault, what happens to
/// the consumer, who cancels.
macro_rules! outage_tests {
    ($($test:ident: $label:literal, $fault:ident, $consumer:ident, $expiry:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            broker_outage($label, Fault::$fault, Consumer::$consumer, Expiry::$expiry).await;
        }
    )*};
}

outage_tests! {
    broker_stop_app_and_start_app_cancels_within_the_bound:
        "broker stop_app/start_app", BrokerStopApp, KeptRunning, Sql;
    broker_killed_and_restarted_cancels_within_the_bound:
        "broker kill -9 and restart", BrokerKill, KeptRunning, Sql;
    broker_and_consumer_restarted_cancel_within_the_bound:
        "broker stop_app/start_app, serve killed and restarted", BrokerStopApp, Killed, Sql;
    broker_and_consumer_killed_cancel_within_the_bound:
        "broker kill -9, serve kill -9, both restarted", BrokerKill, Killed, Sql;
    the_http_action_cancels_within_the_bound_through_a_broker_restart:
        "http action: broker stop_app/start_app", BrokerStopApp, KeptRunning, Http;
    the_http_action_cancels_within_the_bound_when_broker_and_consumer_die:
        "http action: broker kill -9, serve kill -9, both restarted", BrokerKill, Killed, Http;
    the_event_action_cancels_within_the_bound_through_a_broker_kill:
        "event action: broker kill -9 and restart", BrokerKill, KeptRunning, Event;
}
