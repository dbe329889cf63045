//! `amqps://` with rustls against a TLS listener started on the live local broker
//! (no restart: `rabbit_networking:start_ssl_listener/4`, stopped again on drop),
//! with a CA and certificates generated here by the openssl CLI.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use order_expiry::{
    ScheduleError, Scheduler, amqp::ConnectError, amqp::TlsFiles, service::Outcome,
    topology::Ladder,
};
use order_expiry_testkit::{
    World, amqp_url_on, at_ms, free_port, rabbitmqctl, succeeded, try_rabbitmqctl,
};
use secrecy::SecretString;

/// A throw-away PKI: a CA, a server certificate for 127.0.0.1 and a client
/// certificate it signed, and an unrelated CA.
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let dir = std::env::temp_dir().join(format!("order-expiry-tls-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self { dir };
        let key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        for (ca, cn) in [
            ("ca", "order-expiry-test-CA"),
            ("other-ca", "someone-elses-CA"),
        ] {
            pki.openssl(&format!(
                "req -x509 {key} -days 2 -subj /CN={cn} -keyout {ca}.key -out {ca}.pem \
                 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
            ));
        }
        let server_ext = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth";
        let server = ("server", "127.0.0.1", server_ext);
        let client_ext = "extendedKeyUsage=clientAuth";
        let client = ("client", "order-expiry-client", client_ext);
        for (leaf, cn, extensions) in [server, client] {
            let ext = format!("basicConstraints=critical,CA:FALSE\n{extensions}\n");
            std::fs::write(pki.path(&format!("{leaf}.ext")), ext).unwrap();
            pki.openssl(&format!(
                "req {key} -subj /CN={cn} -keyout {leaf}.key -out {leaf}.csr"
            ));
            pki.openssl(&format!(
                "x509 -req -days 2 -in {leaf}.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                 -extfile {leaf}.ext -out {leaf}.pem"
            ));
        }
        // The broker runs as another user: it must read the files.
        let dir = &pki.dir;
        let _ = Command::new("chmod").args(["-R", "a+rX"]).arg(dir).status();
        pki
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// `openssl ARGS` (split at whitespace) in the PKI's directory.
    fn openssl(&self, args: &str) {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(&self.dir)
            .output()
            .expect("the openssl CLI runs (apt-get install openssl)");
        succeeded(format_args!("openssl {args}"), &out);
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS listener on the running broker, on a free port; stopped on drop.
struct TlsListener {
    port: u16,
}

impl TlsListener {
    /// `require_client_certificate`: `verify_peer` with `fail_if_no_peer_cert`.
    fn start(pki: &Pki, require_client_certificate: bool) -> Self {
        let file = |f: &str| format!("\"{}\"", pki.path(f).display());
        let verify = if require_client_certificate {
            "{verify, verify_peer}, {fail_if_no_peer_cert, true}"
        } else {
            "{verify, verify_none}, {fail_if_no_peer_cert, false}"
        };
        let options = format!(
            "[{{cacertfile, {}}}, {{certfile, {}}}, {{keyfile, {}}}, {verify}]",
            file("ca.pem"),
            file("server.pem"),
            file("server.key")
        );
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let expression = format!(
                "rabbit_networking:start_ssl_listener({{\"127.0.0.1\", {port}}}, {options}, 1, 1)."
            );
            last = rabbitmqctl(&["eval", &expression]);
            if last.trim() == "ok" {
                return Self { port };
            }
        }
        panic!("cannot start a TLS listener on the broker: {last}");
    }

    fn url(&self) -> SecretString {
        amqp_url_on(self.port)
            .replacen("amqp://", "amqps://", 1)
            .into()
    }

    /// How many client connections on this listener use TLS.
    fn tls_connections(&self) -> usize {
        let args = "-q list_connections --no-table-headers port ssl";
        let out = rabbitmqctl(&args.split(' ').collect::<Vec<_>>());
        let tls = format!("{}\ttrue", self.port);
        out.lines().filter(|l| *l == tls).count()
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        let expression = format!(
            "rabbit_networking:stop_tcp_listener({{\"127.0.0.1\", {}}}).",
            self.port
        );
        let _ = try_rabbitmqctl(&["eval", &expression]);
    }
}

/// The TLS files of `pki` named (`""`: none).
fn tls(pki: &Pki, [ca, cert, key]: [&str; 3]) -> TlsFiles {
    let file = |name: &str| (!name.is_empty()).then(|| pki.path(name));
    TlsFiles {
        ca_file: file(ca),
        cert_file: file(cert),
        key_file: file(key),
    }
}

/// Connects as the publisher does (`Scheduler::connect`: connection, channel,
/// confirm mode) to `url` with `files`, within 5 s.
async fn connect(url: &SecretString, files: TlsFiles) -> Result<(), ConnectError> {
    let ladder = Ladder::new("tls", 1).unwrap();
    let scheduler = Scheduler::new(url.clone(), ladder)
        .with_tls(files)
        .with_timeout(Duration::from_secs(5));
    let connected = scheduler.connect().await;
    scheduler.close().await;
    match connected {
        Ok(()) => Ok(()),
        Err(ScheduleError::Connect(error)) => Err(error),
        Err(other) => panic!("connected, then failed: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_schedules_and_consumes_and_a_wrong_ca_fails_clearly() {
    let pki = Pki::new();
    let listener = TlsListener::start(&pki, false);
    let mut env = World::new().await;
    env.settings.amqp.url = listener.url();
    env.settings.amqp.tls_ca_file = Some(pki.path("ca.pem"));

    let due_at = at_ms(1_500);
    env.create_orders(&[("tls-1".into(), due_at)]).await;
    let scheduler = env.scheduler();
    let scheduled = scheduler.schedule("tls-1", due_at).await;
    scheduled.expect("schedule over amqps://");
    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(1, Duration::from_secs(15)).await;
    assert_eq!(handled[0].order_id.as_deref(), Some("tls-1"));
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    let over_tls = listener.tls_connections();
    assert!(over_tls >= 2, "the publisher and the consumer: {over_tls}");
    scheduler.close().await;
    consumer.stop().await;

    // A CA that did not sign the broker's certificate: a prompt, clear error.
    let mut wrong = env.settings.clone();
    wrong.amqp.tls_ca_file = Some(pki.path("other-ca.pem"));
    let started = Instant::now();
    let wrong = Scheduler::from_settings(&wrong).unwrap();
    let error = wrong.schedule("tls-2", at_ms(1_000)).await;
    let error = error.expect_err("a wrong CA must not connect");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(matches!(error, ScheduleError::Connect(_)), "{error:?}");
    let text = error.to_string();
    for said in [
        "certificate",
        "amqp.tls_ca_file",
        "amqps://guest:***@127.0.0.1",
    ] {
        assert!(text.contains(said), "no {said:?}: {text}");
    }
    assert!(!text.contains("guest:guest"), "{text}");

    // No CA file (the system roots do not know the test CA either), and
    // misconfigurations named before any network traffic.
    let plain = SecretString::from(order_expiry_testkit::amqp_url());
    for (url, files, said) in [
        (listener.url(), ["", "", ""], "certificate"),
        (listener.url(), ["missing.pem", "", ""], "missing.pem"),
        (listener.url(), ["server.ext", "", ""], "no PEM certificate"),
        (plain, ["ca.pem", "", ""], "not amqps://"),
    ] {
        let error = connect(&url, tls(&pki, files))
            .await
            .expect_err("no connection");
        assert!(error.to_string().contains(said), "{files:?}: {error}");
        if files[0] == "missing.pem" {
            assert!(matches!(error, ConnectError::Tls { .. }), "{error:?}");
        }
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_sent_when_the_broker_requires_one() {
    let pki = Pki::new();
    let listener = TlsListener::start(&pki, true);
    connect(
        &listener.url(),
        tls(&pki, ["ca.pem", "client.pem", "client.key"]),
    )
    .await
    .expect("mutual TLS with the client certificate: connection, channel, confirm mode");

    let started = Instant::now();
    let result = connect(&listener.url(), tls(&pki, ["ca.pem", "", ""])).await;
    assert!(result.is_err(), "the broker requires a client certificate");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let half = tls(&pki, ["ca.pem", "client.pem", ""]);
    let error = connect(&listener.url(), half)
        .await
        .expect_err("a certificate without its key");
    assert!(error.to_string().contains("set together"), "{error}");
}
