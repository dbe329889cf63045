//! Where serve's spans go during the comparison: a tiny OTLP/HTTP endpoint in
//! this process that takes `POST /v1/traces`, counts the requests and their
//! bytes, and answers 200 with an empty `application/x-protobuf` body (an
//! empty `ExportTraceServiceResponse`: everything accepted).
//!
//! It never decodes: in production the collector runs on another host, so
//! decoding here would charge the "on" runs for the collector's work on the
//! same two cores. It only walks each request's protobuf to count its spans,
//! and the orders' `process` spans among them ([`count_spans`]), skipping
//! every other field by its length: so that a run whose spans were dropped
//! on their way (a full export queue) shows it.

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
    /// The spans in them.
    pub(crate) spans: u64,
    /// Those named `process {queue}`: one per order the consumer processed.
    pub(crate) order_spans: u64,
}

#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
    spans: AtomicU64,
    order_spans: AtomicU64,
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
                        // A body that is not a request counts what it could.
                        let (spans, orders) = count_spans(&body).unwrap_or_default();
                        counts.spans.fetch_add(spans, Ordering::Relaxed);
                        counts.order_spans.fetch_add(orders, Ordering::Relaxed);
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
            spans: self.counts.spans.swap(0, Ordering::Relaxed),
            order_spans: self.counts.order_spans.swap(0, Ordering::Relaxed),
        }
    }
}

/// The spans of an `ExportTraceServiceRequest` (`resource_spans` = 1, its
/// `scope_spans` = 2, their `spans` = 2), and how many of them are named
/// `process ...` (a span's `name` = 5). `None` when `body` is not protobuf.
fn count_spans(body: &[u8]) -> Option<(u64, u64)> {
    let (mut spans, mut orders) = (0, 0);
    for resource in fields(body, 1) {
        for scope in fields(resource.ok()?, 2) {
            for span in fields(scope.ok()?, 2) {
                spans += 1;
                let name = fields(span.ok()?, 5).next().transpose().ok()?;
                orders += u64::from(name.is_some_and(|n| n.starts_with(b"process ")));
            }
        }
    }
    Some((spans, orders))
}

/// The length-delimited fields numbered `number` of one protobuf message,
/// every other field skipped; an `Err` item, then nothing, where the message
/// breaks the wire format.
fn fields(mut message: &[u8], number: u64) -> impl Iterator<Item = Result<&[u8], ()>> {
    std::iter::from_fn(move || {
        while !message.is_empty() {
            match field(&mut message) {
                Some((n, Some(value))) if n == number => return Some(Ok(value)),
                Some(_) => {}
                None => {
                    message = &[];
                    return Some(Err(()));
                }
            }
        }
        None
    })
}

/// Takes one field off the front of `message`: its number, and its bytes
/// when it is length-delimited. `None` where the wire format breaks.
fn field<'a>(message: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    let key = varint(message)?;
    let len = match key & 7 {
        0 => {
            varint(message)?;
            return Some((key >> 3, None));
        }
        1 => 8,
        5 => 4,
        2 => usize::try_from(varint(message)?).ok()?,
        _ => return None,
    };
    let (value, rest) = message.split_at_checked(len)?;
    *message = rest;
    Some((key >> 3, (key & 7 == 2).then_some(value)))
}

/// Reads one base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message as _;
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
                bytes: 303,
                ..Received::default()
            }
        );
        assert_eq!(sink.take(), Received::default(), "taken, so zero again");
        assert!(sink.base_url().starts_with("http://127.0.0.1:"));
    }

    /// A span as the exporter writes it: every kind of field around its name.
    fn span(name: &str) -> Span {
        Span {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
            name: name.to_owned(),
            kind: 5,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_100_000_000,
            attributes: vec![KeyValue {
                key: "order_expiry.lateness_ms".to_owned(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::DoubleValue(3.5)),
                }),
                ..KeyValue::default()
            }],
            ..Span::default()
        }
    }

    #[test]
    fn it_counts_the_spans_and_the_order_spans_of_a_request() {
        let scope = |names: &[&str]| ScopeSpans {
            spans: names.iter().map(|n| span(n)).collect(),
            schema_url: "https://opentelemetry.io/schemas/1.30.0".to_owned(),
            ..ScopeSpans::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![scope(&["process order-expiry.due", "expire"])],
                    ..ResourceSpans::default()
                },
                ResourceSpans {
                    scope_spans: vec![scope(&[]), scope(&["process q", "processing"])],
                    ..ResourceSpans::default()
                },
            ],
        };
        let body = request.encode_to_vec();
        assert_eq!(count_spans(&body), Some((4, 2)));
        // A span's attributes (9) come after its kind (a varint) and its
        // times (fixed64): each is skipped by its own length.
        let one = span("p").encode_to_vec();
        let attributes: Vec<_> = fields(&one, 9).collect();
        assert_eq!(attributes.len(), 1);
        assert!(attributes[0].is_ok());
        assert_eq!(count_spans(&[]), Some((0, 0)));
        assert_eq!(count_spans(&body[..body.len() - 3]), None, "cut short");
        assert_eq!(
            count_spans(&[0x0b, 1, 2]),
            None,
            "a wire type it cannot skip"
        );
    }
}
