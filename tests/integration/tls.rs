//! `amqps://` with rustls against a TLS listener started on the live local broker
//! (no restart: `rabbit_networking:start_ssl_listener/4`, stopped again on drop),
//! with a CA and certificates generated here by the openssl CLI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use order_expiry::{
    ScheduleError, Scheduler, amqp::ConnectError, amqp::TlsFiles, service::Outcome,
    topology::Ladder,
};
use order_expiry_testkit::{World, at_ms, free_port, rabbitmqctl, succeeded, vhost};
use secrecy::SecretString;

/// A throw-away PKI: a CA, a server certificate for 127.0.0.1 and a client
/// certificate it signed, and an unrelated CA.
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "order-expiry-tls-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Self { dir };
        pki.ca("ca", "order-expiry test CA");
        pki.ca("other-ca", "someone else's CA");
        pki.leaf(
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        pki.leaf(
            "client",
            "order-expiry client",
            "extendedKeyUsage=clientAuth\n",
        );
        // The broker runs as another user: it must read the files.
        for entry in std::fs::read_dir(&pki.dir).unwrap() {
            let path = entry.unwrap().path();
            let _ = Command::new("chmod").arg("0644").arg(&path).status();
        }
        let _ = Command::new("chmod").arg("0755").arg(&pki.dir).status();
        pki
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn ca(&self, name: &str, cn: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }

    fn leaf(&self, name: &str, cn: &str, extensions: &str) {
        std::fs::write(
            self.path(&format!("{name}.ext")),
            format!("basicConstraints=critical,CA:FALSE\n{extensions}"),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl CLI runs (apt-get install openssl)");
    succeeded(format_args!("openssl {args:?}"), &out);
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
        let vhost = vhost().replace('%', "%25").replace('/', "%2f");
        SecretString::from(format!(
            "amqps://guest:guest@127.0.0.1:{}/{vhost}",
            self.port
        ))
    }

    /// How many client connections on this listener use TLS.
    fn tls_connections(&self) -> usize {
        let out = rabbitmqctl(&[
            "-q",
            "list_connections",
            "--no-table-headers",
            "port",
            "ssl",
        ]);
        out.lines()
            .filter(|l| *l == format!("{}\ttrue", self.port))
            .count()
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        let expression = format!(
            "rabbit_networking:stop_tcp_listener({{\"127.0.0.1\", {}}}).",
            self.port
        );
        let _ = Command::new("rabbitmqctl")
            .args(["eval", &expression])
            .output();
    }
}

fn tls(ca: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>) -> TlsFiles {
    TlsFiles {
        ca_file: ca,
        cert_file: cert,
        key_file: key,
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
    let scheduler = Scheduler::from_settings(&env.settings).unwrap();
    scheduler
        .schedule("tls-1", due_at)
        .await
        .expect("schedule over amqps://");
    let mut consumer = env.start_consumer();
    let handled = consumer.next_n(1, Duration::from_secs(15)).await;
    assert_eq!(handled[0].order_id.as_deref(), Some("tls-1"));
    assert_eq!(handled[0].outcome, Outcome::Cancelled);
    assert!(
        listener.tls_connections() >= 2,
        "the publisher and the consumer connect over TLS"
    );
    scheduler.close().await;
    consumer.stop().await;

    // A CA that did not sign the broker's certificate: a prompt, clear error.
    let mut wrong = env.settings.clone();
    wrong.amqp.tls_ca_file = Some(pki.path("other-ca.pem"));
    let started = Instant::now();
    let error = Scheduler::from_settings(&wrong)
        .unwrap()
        .schedule("tls-2", at_ms(1_000))
        .await
        .expect_err("a wrong CA must not connect");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(error, ScheduleError::Connect(_)), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("certificate"), "not clear enough: {text}");
    assert!(text.contains("amqp.tls_ca_file"), "no hint: {text}");
    assert!(text.contains("amqps://guest:***@127.0.0.1"), "{text}");
    assert!(!text.contains("guest:guest"), "{text}");

    // No CA file: the system roots do not know the test CA either.
    let error = connect(&listener.url(), TlsFiles::default())
        .await
        .expect_err("an unknown issuer must not connect");
    assert!(error.to_string().contains("certificate"), "{error}");

    // Misconfigurations are named before any network traffic.
    let missing = tls(Some(pki.path("missing.pem")), None, None);
    let error = connect(&listener.url(), missing)
        .await
        .expect_err("a missing CA file");
    assert!(matches!(error, ConnectError::Tls { .. }), "{error:?}");
    assert!(error.to_string().contains("missing.pem"), "{error}");
    let not_a_ca = tls(Some(pki.path("server.ext")), None, None);
    let error = connect(&listener.url(), not_a_ca)
        .await
        .expect_err("a CA file without certificates");
    assert!(error.to_string().contains("no PEM certificate"), "{error}");
    let plain = SecretString::from(order_expiry_testkit::amqp_url());
    let error = connect(&plain, tls(Some(pki.path("ca.pem")), None, None))
        .await
        .expect_err("TLS files with an amqp:// URL");
    assert!(error.to_string().contains("not amqps://"), "{error}");

    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_sent_when_the_broker_requires_one() {
    let pki = Pki::new();
    let listener = TlsListener::start(&pki, true);
    let timeout = Duration::from_secs(5);
    let with_certificate = tls(
        Some(pki.path("ca.pem")),
        Some(pki.path("client.pem")),
        Some(pki.path("client.key")),
    );
    connect(&listener.url(), with_certificate)
        .await
        .expect("mutual TLS with the client certificate: connection, channel, confirm mode");

    let started = Instant::now();
    let without = tls(Some(pki.path("ca.pem")), None, None);
    let result = connect(&listener.url(), without).await;
    assert!(result.is_err(), "the broker requires a client certificate");
    assert!(started.elapsed() < timeout, "took {:?}", started.elapsed());

    let half = tls(Some(pki.path("ca.pem")), Some(pki.path("client.pem")), None);
    let error = connect(&listener.url(), half)
        .await
        .expect_err("a certificate without its key");
    assert!(error.to_string().contains("set together"), "{error}");
}
