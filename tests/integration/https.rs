//! The HTTP action and the payment check over `https://`: a server whose
//! certificate a private CA signed is trusted through `tls_ca_file`, and one signed
//! by a CA nobody configured is never spoken to (the order is retried: neither
//! cancelled nor parked, its message stays in the due queue).

use std::time::Duration;

use order_expiry::{Settings, service::Outcome, settings::ActionKind};
use order_expiry_testkit::{Endpoint, Reply, TlsFront, World, at_ms};

use crate::tls::Pki;

/// The HTTP action and the check, both at `base` with `tls_ca_file` trusted.
fn over_https(env: &World, base: &str, tls_ca_file: std::path::PathBuf) -> Settings {
    let mut settings = env.settings.clone();
    settings.action.kind = ActionKind::Http;
    settings.action.http.base_url = base.to_owned();
    settings.action.http.tls_ca_file = Some(tls_ca_file.clone());
    settings.action.http.timeout = Duration::from_millis(500);
    settings.action.check.enabled = true;
    settings.action.check.base_url = base.to_owned();
    settings.action.check.tls_ca_file = Some(tls_ca_file);
    settings.action.check.timeout = Duration::from_millis(500);
    settings
}

/// A fake order service behind a TLS front whose certificate the test CA
/// signed; its `https://` base URL.
async fn order_service_over_tls() -> (Pki, Endpoint, TlsFront, String) {
    let pki = Pki::new();
    let endpoint = Endpoint::start().await;
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let front = TlsFront::start(endpoint.addr, &cert, &key).await;
    let base = format!("https://127.0.0.1:{}", front.addr.port());
    (pki, endpoint, front, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_and_the_check_trust_a_private_ca_through_tls_ca_file() {
    let env = World::new().await;
    let (pki, endpoint, front, base) = order_service_over_tls().await;
    endpoint.script("payment", "tls-1", vec![Reply::Payment("unpaid")]);
    let settings = over_https(&env, &base, pki.path("ca.pem"));
    let mut consumer = env.start_consumer_with(&settings);
    env.scheduler().schedule("tls-1", at_ms(-5)).await.unwrap();

    let ten_s = Duration::from_secs(10);
    consumer.next_all(1, ten_s, Outcome::Cancelled).await;
    let kinds: Vec<_> = endpoint.requests().into_iter().map(|r| r.kind).collect();
    assert_eq!(kinds, ["payment", "expire"], "checked, then expired");
    assert!(front.handshakes() >= 1, "over TLS");
    consumer.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_signed_by_a_ca_nobody_configured_is_never_spoken_to() {
    let env = World::new().await;
    let (pki, endpoint, front, base) = order_service_over_tls().await;
    let settings = over_https(&env, &base, pki.path("other-ca.pem"));
    let mut consumer = env.start_consumer_with(&settings);
    env.scheduler().schedule("tls-2", at_ms(-5)).await.unwrap();

    // Retried on its backoff (held, then through the ladder): never
    // expired, no request, no completed handshake.
    let retried = Outcome::RetryRequeued;
    consumer.only_during(Duration::from_secs(2), retried).await;
    assert!(endpoint.requests().is_empty());
    assert_eq!(front.handshakes(), 0);
    consumer.stop().await;
    let waiting = env.ladder_depth(None).await;
    assert_eq!(waiting, 1, "the order waits in the due queue or the ladder");
    assert_eq!(env.depth(&env.ladder().parked_queue()).await, 0);
    env.cleanup().await;
}
