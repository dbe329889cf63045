//! `/healthz`, `/readyz` and `/metrics` of the running service.

use std::time::Duration;

use order_expiry::service::Service;
use order_expiry_testkit::{World, http_get};
use tokio_util::sync::CancellationToken;

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path).await.expect("the endpoint answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let mut env = World::new().await;
    // An order not found is acked as unknown at once, not looked for again.
    env.settings.consumer.unknown_rechecks = Vec::new();
    let service = Service::build(&env.settings).await.unwrap();
    let addr = service.http_addr().unwrap();
    let readiness = service.readiness();
    let stop = CancellationToken::new();
    let task = tokio::spawn(service.run(stop.clone()));

    assert_eq!(get(addr, "/healthz").await.0, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !readiness.is_consuming() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never started consuming"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");

    let scheduler = order_expiry::Scheduler::from_settings(&env.settings).unwrap();
    scheduler
        .schedule("m-unknown", order_expiry_testkit::at_ms(-1))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = get(addr, "/metrics").await;
        // Every outcome is exported from the start at 0: wait for a non-zero one.
        let unknown = metrics.lines().any(|l| {
            l.starts_with("order_expiry_messages_total{outcome=\"unknown\"}") && !l.ends_with(" 0")
        });
        if unknown {
            assert!(metrics.contains("order_expiry_schedule_total"), "{metrics}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed the outcome: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    scheduler.close().await;

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .unwrap()
        .unwrap();
    assert!(!readiness.is_consuming(), "not ready after shutdown");
    env.cleanup().await;
}
