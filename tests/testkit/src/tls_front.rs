//! A TLS front for a plain local server (the fake order service): it accepts
//! TLS on a free port of 127.0.0.1 with a given certificate, and relays the
//! decrypted bytes to the target. It counts completed handshakes, so a test
//! can tell a request came over TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The front; stops when dropped.
#[derive(Debug)]
pub struct TlsFront {
    /// Where it accepts TLS.
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl TlsFront {
    /// Serves TLS with the PEM certificate chain `cert` and key `key`, relaying
    /// to `target`.
    pub async fn start(target: SocketAddr, cert: &Path, key: &Path) -> Self {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("the certificate file")
            .collect::<Result<_, _>>()
            .expect("PEM certificates");
        let key = PrivateKeyDer::from_pem_file(key).expect("the PEM key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the certificate and key match");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("its address");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let (counted, stopped) = (Arc::clone(&handshakes), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else { continue };
                let (acceptor, counted) = (acceptor.clone(), Arc::clone(&counted));
                tokio::spawn(async move {
                    // A client that refuses our certificate ends here.
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut plain) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Self {
            addr,
            handshakes,
            stop,
        }
    }

    /// TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
