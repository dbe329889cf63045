//! A real OTLP/HTTP receiver for tests: neither the OpenTelemetry Collector
//! nor Jaeger installs from the registries this machine reaches, so this small
//! server takes `POST /v1/traces` (`application/x-protobuf`), decodes each
//! `ExportTraceServiceRequest` with the `opentelemetry-proto` crate (the types
//! the exporter encodes with) and keeps every span for assertions, with the
//! `service.name` of its resource. [`Receiver::tree`] prints them as a trace.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

/// One span as received, ids in lower-case hex as W3C `traceparent` writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits; `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// Its attributes, values as text.
    pub attributes: BTreeMap<String, String>,
    /// The spans it links to.
    pub links: Vec<ReceivedLink>,
    /// `error: <message>` when the span's status is error.
    pub error: Option<String>,
    /// `service.name` of the resource it came with.
    pub service_name: Option<String>,
    /// The other attributes of that resource.
    pub resource: BTreeMap<String, String>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// When it started, by its host's clock.
    pub start: SystemTime,
    /// When it ended, by its host's clock.
    pub end: SystemTime,
}

/// A link from a span to another span, possibly of another trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedLink {
    /// The linked span's trace.
    pub trace_id: String,
    /// The linked span.
    pub span_id: String,
    /// The link's attributes, values as text.
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct State {
    spans: Vec<ReceivedSpan>,
    /// Export requests answered, spans or not.
    requests: usize,
}

/// The receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Receiver {
    /// Starts it on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(Mutex::new(State::default()));
        let stop = CancellationToken::new();
        let shared = Arc::clone(&state);
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| {
                let state = Arc::clone(&shared);
                async move { receive(&state, &headers, &body) }
            }),
        );
        crate::endpoint::serve_until(listener, app, stop.clone());
        Self { addr, state, stop }
    }

    /// `http://127.0.0.1:<port>`: what `OTEL_EXPORTER_OTLP_ENDPOINT` is set to.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.state.lock().unwrap().spans.clone()
    }

    /// How many export requests arrived.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }

    /// The span named `name`; panics unless there is exactly one.
    pub fn span(&self, name: &str) -> ReceivedSpan {
        let spans = self.spans();
        let mut named = spans.iter().filter(|s| s.name == name);
        match (named.next(), named.next()) {
            (Some(span), None) => span.clone(),
            _ => panic!("not exactly one span {name:?} in\n{}", tree(&spans)),
        }
    }

    /// Waits until at least `n` spans arrived; all of them.
    pub async fn wait_for_spans(&self, n: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        crate::poll(timeout, 20, || async {
            let spans = self.spans();
            match spans.len() >= n {
                true => Ok(spans),
                false => Err(format!(
                    "only {} of {n} spans within {timeout:?}:\n{}",
                    spans.len(),
                    tree(&spans)
                )),
            }
        })
        .await
    }

    /// The spans so far as [`tree`] prints them.
    pub fn tree(&self) -> String {
        tree(&self.spans())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Spans as an indented tree per trace, children under their parent in
/// arrival order, each with its attributes and links:
///
/// ```text
/// trace 4bf92f3577b34da6a3ce929d0e0e4736
/// └─ place order [order-expiry]  order.id=o-1
///    └─ schedule [order-expiry]  messaging.system=rabbitmq
/// ```
pub fn tree(spans: &[ReceivedSpan]) -> String {
    let mut out = String::new();
    let mut traces: Vec<&str> = Vec::new();
    for span in spans {
        if !traces.contains(&span.trace_id.as_str()) {
            traces.push(&span.trace_id);
        }
    }
    for trace in traces {
        let of_trace: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.trace_id == trace).collect();
        let _ = writeln!(out, "trace {trace}");
        // A span whose parent did not arrive is shown as a root.
        let is_root = |s: &ReceivedSpan| {
            s.parent_span_id
                .as_ref()
                .is_none_or(|p| !of_trace.iter().any(|o| &o.span_id == p))
        };
        let roots: Vec<&ReceivedSpan> = of_trace.iter().copied().filter(|s| is_root(s)).collect();
        for (i, root) in roots.iter().enumerate() {
            branch(&mut out, &of_trace, root, "", i + 1 == roots.len());
        }
    }
    out
}

fn branch(
    out: &mut String,
    spans: &[&ReceivedSpan],
    span: &ReceivedSpan,
    indent: &str,
    last: bool,
) {
    let attributes: String = span
        .attributes
        .iter()
        .map(|(k, v)| format!("  {k}={v}"))
        .collect();
    let status = span
        .error
        .as_ref()
        .map(|e| format!("  ({e})"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{indent}{} {} [{}]{status}{attributes}",
        if last { "└─" } else { "├─" },
        span.name,
        span.service_name.as_deref().unwrap_or("?"),
    );
    let inner = format!("{indent}{}", if last { "   " } else { "│  " });
    for link in &span.links {
        let _ = writeln!(out, "{inner}  ↪ link {}/{}", link.trace_id, link.span_id);
    }
    let children: Vec<&&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id.as_deref() == Some(span.span_id.as_str()))
        .collect();
    for (i, child) in children.iter().enumerate() {
        branch(out, spans, child, &inner, i + 1 == children.len());
    }
}

/// One export request: 200 with an empty `ExportTraceServiceResponse` (the
/// protocol's "all accepted"), 415 for anything but protobuf, 400 for a body
/// that does not decode.
fn receive(
    state: &Mutex<State>,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/x-protobuf" || headers.contains_key(header::CONTENT_ENCODING) {
        // The exporter this project builds sends protobuf, uncompressed.
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, protobuf, Vec::new());
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let mut resource = attributes(
            resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default(),
        );
        let service_name = resource.remove("service.name");
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for span in scope_spans.spans {
                received.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    name: span.name,
                    attributes: attributes(span.attributes),
                    links: span
                        .links
                        .into_iter()
                        .map(|l| ReceivedLink {
                            trace_id: hex(&l.trace_id),
                            span_id: hex(&l.span_id),
                            attributes: attributes(l.attributes),
                        })
                        .collect(),
                    // Status code 2 is STATUS_CODE_ERROR.
                    error: span
                        .status
                        .filter(|status| status.code == 2)
                        .map(|status| format!("error: {}", status.message)),
                    service_name: service_name.clone(),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    start: UNIX_EPOCH + Duration::from_nanos(span.start_time_unix_nano),
                    end: UNIX_EPOCH + Duration::from_nanos(span.end_time_unix_nano),
                });
            }
        }
    }
    let mut state = state.lock().unwrap();
    state.requests += 1;
    state.spans.extend(received);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (StatusCode::OK, protobuf, answer)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(list: Vec<KeyValue>) -> BTreeMap<String, String> {
    list.into_iter()
        .map(|kv| (kv.key, kv.value.map(text).unwrap_or_default()))
        .collect()
}

/// An attribute value as text: strings as they are, the rest as Rust prints them.
fn text(value: AnyValue) -> String {
    match value.value {
        Some(any_value::Value::StringValue(s)) => s,
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
