//! The payment check before the action, against a real local HTTP gateway:
//! `paid` leaves the order alone, `unpaid` cancels it, `pending` sends the
//! message through the ladder to be checked again after the next step (never
//! earlier), a failed check is retried, an unreadable one parked, and after the
//! last step the configured final outcome applies.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use order_expiry::{Settings, service::Outcome, settings::FinalOutcome};
use order_expiry_testkit::steps::assert_late_within;
use order_expiry_testkit::{Endpoint, Reply, RunningConsumer, World, at_ms, bundle, json, message};
use secrecy::SecretString;

const STEPS: [Duration; 2] = [Duration::from_millis(1_000), Duration::from_millis(2_000)];

fn with_check(env: &World, endpoint: &Endpoint, final_outcome: FinalOutcome) -> Settings {
    let mut settings = env.settings.clone();
    settings.action.check.enabled = true;
    settings.action.check.base_url = endpoint.base_url();
    settings.action.check.steps = STEPS.to_vec();
    settings.action.check.final_outcome = final_outcome;
    settings.action.check.timeout = Duration::from_millis(500);
    settings.action.check.bearer_token = Some(SecretString::from("check-token-77"));
    settings
}

/// Every outcome of `id`, in order, until `n` of them were seen in all.
async fn outcomes(consumer: &mut RunningConsumer, n: usize) -> Vec<(String, Outcome)> {
    consumer
        .next_n(n, Duration::from_secs(20))
        .await
        .into_iter()
        .map(|h| (h.order_id.map(String::from).unwrap_or_default(), h.outcome))
        .collect()
}

fn of(seen: &[(String, Outcome)], id: &str) -> Vec<Outcome> {
    seen.iter()
        .filter(|(i, _)| i == id)
        .map(|(_, o)| *o)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_transition_of_the_payment_check() {
    step_transitions(false).await;
}

/// The same orders in one v2 bundle: each is checked on its own, its next
/// step leaves the bundle as a v1 message through the ladder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_transition_of_the_payment_check_in_a_bundle() {
    step_transitions(true).await;
}

async fn step_transitions(bundled: bool) {
    use Outcome::*;
    let env = World::new().await;
    let gateway = Endpoint::start().await;
    let pay = Reply::Payment;
    // Each order: what the gateway answers, its outcomes (c-pending: 2
    // requeues + cancelled; c-stuck: 2 requeues + parked; c-bad parked) and
    // its status after. In the bundle, the gateway's 503 for c-503 came while
    // the others had their answers: it left the bundle through the ladder at
    // once (retried held, it would keep their ack).
    let c_503: &[Outcome] = if bundled {
        &[RetryRequeued, Cancelled]
    } else {
        &[Cancelled]
    };
    let (down, bad) = (
        Reply::Status(503, "down".into()),
        Reply::Status(200, "yes".into()),
    );
    let (paid, unpaid, pending) = (pay("paid"), pay("unpaid"), pay("pending"));
    let twice_requeued = |last| [CheckRequeued, CheckRequeued, last];
    let cases: [(&str, Vec<Reply>, &[Outcome], &str); 6] = [
        ("c-paid", vec![paid], &[PaidAtGateway], "unpaid"),
        ("c-unpaid", vec![unpaid.clone()], &[Cancelled], "cancelled"),
        (
            "c-pending",
            vec![pending.clone(), pending.clone(), unpaid.clone()],
            &twice_requeued(Cancelled),
            "cancelled",
        ),
        ("c-stuck", vec![pending], &twice_requeued(Parked), "unpaid"),
        ("c-503", vec![down, unpaid], c_503, "cancelled"),
        ("c-bad", vec![bad], &[Parked], "unpaid"),
    ];
    let due_at = at_ms(-5);
    for (id, replies, _, _) in &cases {
        gateway.script("payment", id, replies.clone());
    }
    let ids = cases.each_ref().map(|(id, ..)| *id);
    env.create_orders(&ids.map(|id| (id.to_owned(), due_at)))
        .await;
    let mut consumer = env.start_consumer_with(&with_check(&env, &gateway, FinalOutcome::Park));
    let messages = ids.map(|id| message(id, due_at));
    match bundled {
        false => env.publish_messages(&messages).await,
        true => env.publish_due(&bundle(&messages), json()).await,
    }

    let seen = outcomes(&mut consumer, if bundled { 11 } else { 10 }).await;
    // The database agrees: paid at the gateway is not cancelled, nor is the
    // stuck one; the others are.
    for (id, _, expected, status) in &cases {
        assert_eq!(of(&seen, id), *expected, "{id}");
        assert_eq!(env.order(id).await.0, *status, "{id}");
    }
    assert!(of(&seen, "").is_empty(), "every order is named: {seen:?}");

    // Each re-check came after its step, never earlier, and within a second.
    let mut figures = Vec::new();
    for id in ["c-pending", "c-stuck"] {
        let checks = gateway.requests_for("payment", id);
        assert_eq!(checks.len(), 3, "{id}: three checks");
        for (k, step) in STEPS.iter().enumerate() {
            let late = checks[k + 1].at - checks[k].at - TimeDelta::from_std(*step).unwrap();
            let what = format!("{id}: check {}, after the one before and its step,", k + 2);
            assert_late_within(late, TimeDelta::seconds(1), &what);
            figures.push(late.num_milliseconds());
        }
    }
    let (status, _, cancelled_at) = env.order("c-pending").await;
    assert_eq!(status, "cancelled");
    let last_check = gateway.requests_for("payment", "c-pending")[2].at;
    assert!(cancelled_at.unwrap() >= last_check);
    eprintln!("FIGURES payment check: re-checks came {figures:?} ms after their step");

    // What the requests carried.
    let request = &gateway.requests_for("payment", "c-paid")[0];
    assert_eq!(request.method, "GET");
    assert_eq!(request.headers["authorization"], "Bearer check-token-77");

    // The parked ones say why; the stuck one is not cancelled.
    let mut reasons: Vec<String> = env.parked().await.into_iter().map(|p| p.reason).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    let starts = [
        "payment check answered 200 without a status",
        "payment still pending at the gateway after 3 checks",
    ];
    for (reason, start) in reasons.iter().zip(starts) {
        assert!(reason.starts_with(start), "{reasons:?}");
    }

    consumer.expect_quiet(Duration::from_secs(1)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);
    env.cleanup().await;
}

/// After the last step: `keep` acks and leaves the order, `cancel` applies
/// the action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_outcome_keep_or_cancel() {
    use Outcome::*;
    for (final_outcome, last, status) in [
        (FinalOutcome::Keep, PendingAtGateway, "unpaid"),
        (FinalOutcome::Cancel, Cancelled, "cancelled"),
    ] {
        let env = World::new().await;
        let gateway = Endpoint::start().await;
        gateway.script("payment", "f-1", vec![Reply::Payment("pending")]);
        let due_at = at_ms(-5);
        env.create_orders(&[("f-1".into(), due_at)]).await;
        let mut settings = with_check(&env, &gateway, final_outcome);
        settings.action.check.steps = vec![Duration::from_millis(500)];
        let mut consumer = env.start_consumer_with(&settings);
        let started = Utc::now();
        env.publish_message(&message("f-1", due_at)).await;
        let seen = outcomes(&mut consumer, 2).await;
        assert_eq!(of(&seen, "f-1"), [CheckRequeued, last], "{final_outcome:?}");
        assert!(Utc::now() - started >= TimeDelta::milliseconds(500));
        assert_eq!(env.order("f-1").await.0, status, "{final_outcome:?}");
        consumer.stop().await;
        env.cleanup().await;
    }
}
