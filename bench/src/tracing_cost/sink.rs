//! Where serve's spans go during the comparison: a tiny OTLP/HTTP endpoint in
//! this process that takes `POST /v1/traces`, counts the requests and their
//! bytes, and answers 200 with an empty `application/x-protobuf` body (an
//! empty `ExportTraceServiceResponse`: everything accepted).
//!
//! It never decodes: in production the collector runs on another host, so
//! decoding here would charge the "on" runs for the collector's work on the
//! same two cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::routing::post;
use tokio_util::sync::CancellationToken;

/// What the sink received since it was last asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// Export requests.
    pub(crate) requests: u64,
    /// Their bodies' bytes (protobuf, uncompressed unless serve was told to
    /// compress).
    pub(crate) bytes: u64,
}

#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// The sink; stops when dropped.
#[derive(Debug)]
pub(crate) struct Sink {
    addr: SocketAddr,
    counts: Arc<Counts>,
    stop: CancellationToken,
}

impl Sink {
    /// Starts it on a free port of 127.0.0.1.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the span sink")?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                post(move |body: Bytes| {
                    let counts = Arc::clone(&shared);
                    async move {
                        counts.requests.fetch_add(1, Ordering::Relaxed);
                        counts.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                        (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "application/x-protobuf")],
                        )
                    }
                }),
            )
            // A batch of 512 spans is far below axum's 2 MB default, but a
            // refused request would lose spans without a trace in the count.
            .layer(DefaultBodyLimit::disable());
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await;
        });
        Ok(Self { addr, counts, stop })
    }

    /// `http://127.0.0.1:<port>`: what serve's `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// is set to (the exporter adds `/v1/traces`).
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What arrived since the last call (or the start), and zero again.
    pub(crate) fn take(&self) -> Received {
        Received {
            requests: self.counts.requests.swap(0, Ordering::Relaxed),
            bytes: self.counts.bytes.swap(0, Ordering::Relaxed),
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// One HTTP/1.1 request with `body` to the sink; its whole answer.
    async fn post(sink: &Sink, path: &str, body: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(sink.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: sink\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn it_counts_requests_and_bytes_and_answers_an_empty_protobuf() {
        let sink = Sink::start().await.unwrap();
        assert_eq!(sink.take(), Received::default());
        let answer = post(&sink, "/v1/traces", &[0x0a; 300]).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains("content-type: application/x-protobuf"),
            "{answer}"
        );
        assert!(answer.contains("content-length: 0"), "{answer}");
        post(&sink, "/v1/traces", &[1, 2, 3]).await;
        let missed = post(&sink, "/v1/metrics", &[1, 2, 3]).await;
        assert!(missed.starts_with("HTTP/1.1 404"), "{missed}");
        assert_eq!(
            sink.take(),
            Received {
                requests: 2,
                bytes: 303
            }
        );
        assert_eq!(sink.take(), Received::default(), "taken, so zero again");
        assert!(sink.base_url().starts_with("http://127.0.0.1:"));
    }
}
