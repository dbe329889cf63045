//! The W3C trace context (Trace Context level 1) that travels with an order,
//! so that the trace of "order created" reaches "order cancelled" across hours
//! in the ladder. Pure: parsing and checking only; with the `otel` feature,
//! `TraceContext::current` reads the caller's `tracing` span.
//!
//! The context is carried as text, never interpreted: this crate is a carrier
//! between the order service's trace and the consumer's, so a `traceparent`
//! of a future version that the W3C rules accept travels unchanged. A context
//! that breaks the rules on the wire is dropped with a debug log and the order
//! goes on untraced: tracing never costs an order its cancel.

use thiserror::Error;

/// The longest `traceparent` carried: 55 bytes for version 00; a future
/// version may append fields, within this bound.
const TRACEPARENT_MAX: usize = 256;

/// The longest `tracestate` carried. W3C asks carriers to propagate at least
/// 512 bytes of it; longer ones are dropped whole (the `traceparent` stays).
pub const TRACESTATE_MAX: usize = 512;

/// The W3C trace context of one order: the `traceparent` of the span that
/// scheduled it, and that trace's vendor `tracestate` if any. Valid by
/// construction ([`TraceContext::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// Why a text is not a W3C trace context.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InvalidTraceContext {
    /// The `traceparent` breaks the W3C Trace Context format.
    #[error("traceparent {0:?} is not version-traceid-parentid-flags in lowercase hex")]
    Traceparent(String),
    /// The trace id or the parent (span) id is all zeros.
    #[error("traceparent {0:?} has an all-zero trace id or parent id")]
    ZeroId(String),
    /// The `tracestate` is longer than [`TRACESTATE_MAX`] or not printable ASCII.
    #[error("tracestate is empty, over {TRACESTATE_MAX} bytes or not printable ASCII")]
    Tracestate,
}

impl TraceContext {
    /// The AMQP header (and JSON field) name of the `traceparent`.
    pub const TRACEPARENT: &str = "traceparent";
    /// The AMQP header (and JSON field) name of the `tracestate`.
    pub const TRACESTATE: &str = "tracestate";

    /// A context from its W3C headers, checked by the Trace Context level 1
    /// rules: version 00 is exactly `00-<32 hex>-<16 hex>-<2 hex>` in
    /// lowercase, with neither id all zeros; a higher version (not `ff`) is
    /// accepted when it starts that way and goes on with `-`.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, InvalidTraceContext> {
        check_traceparent(traceparent)?;
        let tracestate = match tracestate {
            None => None,
            Some(state) if valid_tracestate(state) => Some(state.to_owned()),
            Some(_) => return Err(InvalidTraceContext::Tracestate),
        };
        Ok(Self {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// A context as a message carried it (headers or JSON fields): `None`
    /// when there is none or it is invalid (logged at debug: the order goes
    /// on untraced). An invalid `tracestate` alone is dropped, as W3C asks.
    pub(crate) fn from_wire(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = traceparent.filter(|t| !t.is_empty())?;
        if let Err(error) = check_traceparent(traceparent) {
            tracing::debug!(%error, "ignoring the trace context a message carried");
            return None;
        }
        let tracestate = tracestate.filter(|state| {
            let valid = valid_tracestate(state);
            if !valid {
                tracing::debug!("ignoring the tracestate a message carried: invalid");
            }
            valid
        });
        Some(Self {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate.map(str::to_owned),
        })
    }

    /// The `traceparent` header's value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header's value, if the trace has one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id (32 lowercase hex digits): what an operator searches for.
    pub fn trace_id(&self) -> &str {
        // Checked at construction: bytes 3..35 are the trace id.
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The context of the caller's current `tracing` span, as the
    /// `tracing-opentelemetry` layer sees it; `None` when there is no valid
    /// one (no layer, no span, or a span outside any trace). Feature `otel`.
    #[cfg(feature = "otel")]
    pub fn current() -> Option<Self> {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;

        let context = tracing::Span::current().context();
        Self::of_span_context(context.span().span_context())
    }

    /// The W3C form of an OpenTelemetry span's context (`None`: a span
    /// outside any trace): what the publisher captures, and what the
    /// consumer passes on. Feature `otel`.
    #[cfg(feature = "otel")]
    pub(crate) fn of_span_context(span: &opentelemetry::trace::SpanContext) -> Option<Self> {
        if !span.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        );
        let state = span.trace_state().header();
        let tracestate = (!state.is_empty() && valid_tracestate(&state)).then_some(state);
        Some(Self {
            traceparent,
            tracestate,
        })
    }
}

/// The context of the caller's current span (feature `otel`).
#[cfg(feature = "otel")]
pub(crate) fn current() -> Option<TraceContext> {
    TraceContext::current()
}

/// Without the `otel` feature there is no span context: nothing is read and
/// nothing costs.
#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Option<TraceContext> {
    None
}

/// The W3C headers of a received message, as text: what
/// [`crate::publisher::DueMessage::decode_traced`] applies to its orders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceHeaders<'a> {
    /// The `traceparent` header, if present and text.
    pub traceparent: Option<&'a str>,
    /// The `tracestate` header, if present and text.
    pub tracestate: Option<&'a str>,
}

impl TraceHeaders<'_> {
    /// A message without trace headers.
    pub const NONE: TraceHeaders<'static> = TraceHeaders {
        traceparent: None,
        tracestate: None,
    };

    /// The context they carry (see [`TraceContext::from_wire`]).
    pub(crate) fn context(&self) -> Option<TraceContext> {
        TraceContext::from_wire(self.traceparent, self.tracestate)
    }
}

fn check_traceparent(text: &str) -> Result<(), InvalidTraceContext> {
    let bad = || InvalidTraceContext::Traceparent(text.chars().take(64).collect());
    let bytes = text.as_bytes();
    if bytes.len() < 55 || bytes.len() > TRACEPARENT_MAX {
        return Err(bad());
    }
    let hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let dashes = bytes[2] == b'-' && bytes[35] == b'-' && bytes[52] == b'-';
    if !(dashes && hex(0..2) && hex(3..35) && hex(36..52) && hex(53..55)) {
        return Err(bad());
    }
    match &bytes[0..2] {
        // Version 00 is exactly 55 bytes.
        b"00" if bytes.len() != 55 => return Err(bad()),
        b"00" => {}
        // ff is forbidden; a later version may append `-`-led fields.
        b"ff" => return Err(bad()),
        _ if bytes.len() > 55 && (bytes[55] != b'-' || !printable(&bytes[55..])) => {
            return Err(bad());
        }
        _ => {}
    }
    let zero = |range: std::ops::Range<usize>| bytes[range].iter().all(|b| *b == b'0');
    if zero(3..35) || zero(36..52) {
        return Err(InvalidTraceContext::ZeroId(text.to_owned()));
    }
    Ok(())
}

/// A `tracestate` this crate carries: not empty, bounded, printable ASCII.
/// Its list members are the vendors' business, carried as they are.
fn valid_tracestate(state: &str) -> bool {
    !state.trim().is_empty() && state.len() <= TRACESTATE_MAX && printable(state.as_bytes())
}

fn printable(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| (0x20..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example_and_keeps_its_text() {
        let context = TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(context.traceparent(), VALID);
        assert_eq!(context.tracestate(), Some("rojo=00f067aa0ba902b7"));
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(TraceContext::parse(VALID, None).unwrap().tracestate(), None);
    }

    #[test]
    fn accepts_a_future_version_by_the_w3c_rules() {
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceContext::parse(future, None).is_ok());
        let longer = format!("{future}-what-the-future-holds");
        assert_eq!(
            TraceContext::parse(&longer, None).unwrap().traceparent(),
            longer
        );
        // The next byte must be a dash.
        assert!(TraceContext::parse(&format!("{future}x"), None).is_err());
    }

    #[test]
    fn refuses_each_way_a_traceparent_breaks_the_rules() {
        let cases = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", // 00: exactly 55
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0-04bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for case in cases {
            assert!(TraceContext::parse(case, None).is_err(), "{case:?}");
            assert_eq!(TraceContext::from_wire(Some(case), None), None, "{case:?}");
        }
        let zero = TraceContext::parse(cases[4], None).unwrap_err();
        assert!(zero.to_string().contains("all-zero"), "{zero}");
    }

    #[test]
    fn a_bad_tracestate_is_refused_when_given_and_dropped_alone_on_the_wire() {
        let long = "a=".to_owned() + &"b".repeat(TRACESTATE_MAX);
        for state in ["", " ", "a=\u{7}", long.as_str(), "é=1"] {
            assert_eq!(
                TraceContext::parse(VALID, Some(state)),
                Err(InvalidTraceContext::Tracestate)
            );
            let wire = TraceContext::from_wire(Some(VALID), Some(state)).unwrap();
            assert_eq!((wire.traceparent(), wire.tracestate()), (VALID, None));
        }
        let max = "a=".to_owned() + &"b".repeat(TRACESTATE_MAX - 2);
        assert!(TraceContext::parse(VALID, Some(&max)).is_ok());
    }

    #[test]
    fn absent_or_empty_on_the_wire_is_none() {
        assert_eq!(TraceContext::from_wire(None, Some("a=1")), None);
        assert_eq!(TraceContext::from_wire(Some(""), None), None);
        assert_eq!(TraceHeaders::NONE.context(), None);
    }
}

/// The capture from a `tracing` span, with the `tracing-opentelemetry` layer
/// (its no-op tracer: the span takes the context it was given as parent).
#[cfg(all(test, feature = "otel", feature = "service"))]
mod otel_tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[test]
    fn the_current_spans_context_is_taken_only_when_valid() {
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer());
        tracing::subscriber::with_default(subscriber, || {
            assert_eq!(current(), None, "no span");
            let untraced = tracing::info_span!("untraced");
            assert_eq!(untraced.in_scope(current), None, "a span outside any trace");

            let remote = SpanContext::new(
                TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
                SpanId::from_hex("00f067aa0ba902b7").unwrap(),
                TraceFlags::SAMPLED,
                true,
                TraceState::from_key_value([("rojo", "1")]).unwrap(),
            );
            let span = tracing::info_span!("create order");
            let parent = opentelemetry::Context::new().with_remote_span_context(remote);
            span.set_parent(parent).unwrap();
            let taken = span.in_scope(current).expect("a context");
            assert_eq!(taken.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_eq!(
                TraceContext::parse(taken.traceparent(), None).map(drop),
                Ok(())
            );
            assert!(taken.traceparent().ends_with("-01"), "{taken:?}");
            assert_eq!(taken.tracestate(), Some("rojo=1"));
        });
    }
}
