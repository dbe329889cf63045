//! `/healthz`, `/readyz` and `/metrics` of the running service.

use std::time::Duration;

use order_expiry::service::Service;
use order_expiry_testkit::{World, at_ms, eventually, http_get, metric_value};
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
    let consuming = async || readiness.is_consuming();
    eventually(Duration::from_secs(10), "consuming", consuming).await;
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");

    let scheduler = env.scheduler();
    scheduler.schedule("m-unknown", at_ms(-1)).await.unwrap();
    // Every outcome is exported from the start at 0: wait for a non-zero one.
    let unknown = "order_expiry_messages_total{outcome=\"unknown\"}";
    eventually(
        Duration::from_secs(10),
        "the outcome in /metrics",
        async || metric_value(&get(addr, "/metrics").await.1, unknown) > 0.0,
    )
    .await;
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(metrics.contains("order_expiry_schedule_total"), "{metrics}");
    scheduler.close().await;

    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(15), task).await;
    stopped.expect("stopped within 15 s").unwrap();
    assert!(!readiness.is_consuming(), "not ready after shutdown");
    env.cleanup().await;
}
