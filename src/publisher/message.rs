//! The v1 wire format: `{"v": 1, "order_id": "...", "due_at": "RFC 3339, UTC, ms"}`,
//! and decoding of every version the consumer knows (v2, a bundle of such
//! orders, is in `bundle.rs`).
//!
//! Four optional fields are written only by the consumer, when it sends a
//! message through the ladder again (a payment still pending at the gateway, an
//! order not found yet, an action that kept failing): `attempts`,
//! `check_step`, `unknown_rechecks` and `not_before`. A message without them
//! was never tried, is step 0, never re-checked, due at `due_at`; a consumer
//! that does not know them ignores them (unknown fields are ignored) and treats
//! the message as an ordinary due one.
//!
//! The order's W3C trace context ([`TraceContext`]) is not in a v1 body: it
//! travels in the message's `traceparent` and `tracestate` headers, and in a
//! v2 bundle per order where it differs from the headers' (`bundle.rs`).
//!
//! Decoding never panics and never guesses: anything that is not a valid v1 message
//! is a [`Malformed`] whose text becomes the `x-parked-reason` header, so a person
//! reading the parked queue knows exactly what was wrong.

use std::io::Write as _;

use chrono::{DateTime, Datelike, SecondsFormat, TimeDelta, Utc};
use serde_json::{Map, Value};
use thiserror::Error;

use super::order_id::{InvalidOrderId, OrderId};
use super::trace::TraceContext;

/// The version of a message that carries one order.
const VERSION: u64 = 1;

/// "Look at this order at this time": the one thing a message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiryMessage {
    /// The order to cancel if it is still unpaid.
    pub order_id: OrderId,
    /// When the payment window closes; never processed before this instant.
    pub due_at: DateTime<Utc>,
    /// The payment check to run next (`check_step`; 0, the first, when absent):
    /// how many times the gateway already answered `pending`.
    pub check_step: u32,
    /// How many times the order was looked for again after it was not found
    /// (`unknown_rechecks`; 0 when absent): its INSERT may not have committed.
    pub unknown_rechecks: u32,
    /// A message sent through the ladder again is not processed before this
    /// instant (`not_before`); `None`: at `due_at`.
    pub not_before: Option<DateTime<Utc>>,
    /// How many times the action already failed for it (`attempts`; 0 when
    /// absent): a failing order goes back through the ladder with its
    /// backoff, and this picks the next delay.
    pub attempts: u32,
    /// The W3C trace context of the span that scheduled it, carried through
    /// every path the order takes so its trace reaches its cancel; `None`:
    /// untraced (nothing is written, nothing costs).
    pub trace: Option<TraceContext>,
}

/// Why a body is not a message we can ever process. The `Display` text is the
/// `x-parked-reason`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Malformed {
    /// Empty body.
    #[error("empty body")]
    Empty,
    /// Larger than the configured limit.
    #[error("body of {size} bytes is larger than the limit of {max} bytes")]
    TooLarge {
        /// Size of the body.
        size: usize,
        /// Configured limit.
        max: usize,
    },
    /// A content type that is not JSON.
    #[error("content type {0:?} is not {json}", json = ExpiryMessage::CONTENT_TYPE)]
    ContentType(String),
    /// Bytes that are not UTF-8.
    #[error("body is not valid UTF-8 (at byte {0})")]
    NotUtf8(usize),
    /// Text that is not JSON.
    #[error("body is not valid JSON: {0}")]
    Json(String),
    /// JSON that is not an object.
    #[error("body is JSON but not an object")]
    NotAnObject,
    /// A required field is absent.
    #[error("missing field {0:?}")]
    Missing(&'static str),
    /// A field of the wrong JSON type.
    #[error("field {field:?} must be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A version this code does not know.
    #[error("unknown version {0}")]
    UnknownVersion(String),
    /// A v2 bundle where one order was expected
    /// ([`ExpiryMessage::decode`] reads v1 only).
    #[error("a v2 bundle of orders, not a v1 message")]
    Bundle,
    /// A v2 bundle whose `orders` list is empty.
    #[error("a v2 bundle with no orders")]
    EmptyBundle,
    /// One entry of a bundle's `orders` is not a JSON object.
    #[error("it is not a JSON object")]
    EntryNotAnObject,
    /// An order id that breaks the contract.
    #[error("invalid order_id: {0}")]
    OrderId(InvalidOrderId),
    /// A time (`due_at`, `not_before`) that is not RFC 3339.
    #[error("invalid {field} {value:?}: {error}")]
    Time {
        /// The field.
        field: &'static str,
        /// The text found.
        value: String,
        /// What the parser said.
        error: String,
    },
}

/// Rounds up to the next whole millisecond: the wire carries milliseconds, and
/// rounding down would make a message due (slightly) before the time asked for.
pub(crate) fn ceil_to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    let sub_ms_nanos = at.timestamp_subsec_nanos() % 1_000_000;
    match sub_ms_nanos {
        0 => at,
        n => at + TimeDelta::nanoseconds(i64::from(1_000_000 - n)),
    }
}

impl ExpiryMessage {
    /// The content type every message carries.
    pub const CONTENT_TYPE: &str = "application/json";

    /// A message for `order_id` due at `due_at`, rounded up to the millisecond
    /// the wire carries.
    pub fn new(order_id: OrderId, due_at: DateTime<Utc>) -> Self {
        Self {
            order_id,
            due_at: ceil_to_millis(due_at),
            check_step: 0,
            unknown_rechecks: 0,
            not_before: None,
            attempts: 0,
            trace: None,
        }
    }

    /// The same message carrying `trace`: for an order service that passes
    /// its context explicitly (to [`crate::Scheduler::schedule_message`])
    /// instead of through a `tracing` span.
    pub fn with_trace(mut self, trace: impl Into<Option<TraceContext>>) -> Self {
        self.trace = trace.into();
        self
    }

    /// When the consumer may process it: `due_at`, or a later `not_before`.
    pub fn process_at(&self) -> DateTime<Utc> {
        match self.not_before {
            Some(at) if at > self.due_at => at,
            _ => self.due_at,
        }
    }

    /// The same order and due time, to be looked at again from `not_before`
    /// on (rounded up to the millisecond); the step counters are the caller's.
    pub fn again_at(&self, not_before: DateTime<Utc>) -> Self {
        Self {
            not_before: Some(ceil_to_millis(not_before)),
            ..self.clone()
        }
    }

    /// The JSON body.
    ///
    /// Written directly rather than through a `serde_json::Value` (keys in the
    /// same sorted order, the same escaping): the publisher encodes every order,
    /// and building the map cost a sixth of its instructions per message.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64 + self.order_id.len());
        self.write_object(&mut body, Some(VERSION), None);
        body
    }

    /// Writes this order as a JSON object: with `"v"` as a v1 message (its
    /// trace context goes in the headers), without it as one order of a v2
    /// bundle whose headers carry `shared`: the order's own context is
    /// written only where it differs from that (`"traceparent":""` for an
    /// untraced order in a traced bundle).
    pub(crate) fn write_object(
        &self,
        body: &mut Vec<u8>,
        version: Option<u64>,
        shared: Option<&TraceContext>,
    ) {
        let due_at = self.due_at.to_rfc3339_opts(SecondsFormat::Millis, true);
        // Keys in sorted order; the optional ones only when set, so that what
        // the publisher writes is exactly the contract's three fields.
        body.push(b'{');
        if self.attempts > 0 {
            let _ = write!(body, "\"attempts\":{},", self.attempts);
        }
        if self.check_step > 0 {
            let _ = write!(body, "\"check_step\":{},", self.check_step);
        }
        body.extend_from_slice(b"\"due_at\":\"");
        body.extend_from_slice(due_at.as_bytes());
        if let Some(at) = self.not_before {
            let at = at.to_rfc3339_opts(SecondsFormat::Millis, true);
            let _ = write!(body, "\",\"not_before\":\"{at}");
        }
        body.extend_from_slice(b"\",\"order_id\":");
        // Writing a `&str` or a number into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut *body, self.order_id.as_str());
        if version.is_none() && self.trace.as_ref() != shared {
            write_trace(body, self.trace.as_ref());
        }
        if self.unknown_rechecks > 0 {
            let _ = write!(body, ",\"unknown_rechecks\":{}", self.unknown_rechecks);
        }
        match version {
            Some(v) => {
                let _ = write!(body, ",\"v\":{v}}}");
            }
            None => body.push(b'}'),
        }
    }

    /// Parses and validates a v1 body. `content_type` is the AMQP property; a
    /// missing one is accepted, a present non-JSON one is not. A v2 bundle is
    /// [`Malformed::Bundle`] here: [`crate::publisher::DueMessage::decode`] reads every
    /// version the consumer knows.
    pub fn decode(
        body: &[u8],
        content_type: Option<&str>,
        max_body_bytes: usize,
    ) -> Result<Self, Malformed> {
        let fields = json_object(body, content_type, max_body_bytes)?;
        match version(&fields)? {
            VERSION => Self::from_fields(&fields),
            super::bundle::VERSION => Err(Malformed::Bundle),
            other => Err(Malformed::UnknownVersion(other.to_string())),
        }
    }

    /// The order in `fields`, by the v1 rules (the version is the caller's):
    /// a v1 message's fields, or one order of a v2 bundle.
    pub(crate) fn from_fields(fields: &Map<String, Value>) -> Result<Self, Malformed> {
        let order_id =
            OrderId::new(string_field(fields, "order_id")?).map_err(Malformed::OrderId)?;
        let due_at = time_field(string_field(fields, "due_at")?, "due_at")?;
        let not_before = match fields.get("not_before") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(time_field(text, "not_before")?),
            Some(_) => {
                return Err(Malformed::WrongType {
                    field: "not_before",
                    expected: "a string",
                });
            }
        };
        Ok(Self {
            order_id,
            due_at,
            check_step: count_field(fields, "check_step")?,
            unknown_rechecks: count_field(fields, "unknown_rechecks")?,
            not_before,
            attempts: count_field(fields, "attempts")?,
            trace: None,
        })
    }
}

/// A bundle entry's own `"traceparent"` (and `"tracestate"`) fields, in
/// sorted key order after `"order_id"`; `"traceparent":""` for none.
fn write_trace(body: &mut Vec<u8>, trace: Option<&TraceContext>) {
    body.extend_from_slice(b",\"traceparent\":");
    let _ = serde_json::to_writer(&mut *body, trace.map_or("", TraceContext::traceparent));
    if let Some(state) = trace.and_then(TraceContext::tracestate) {
        body.extend_from_slice(b",\"tracestate\":");
        let _ = serde_json::to_writer(&mut *body, state);
    }
}

/// The checks every body passes before its version is read: not empty, not
/// too large, JSON content type (or none), UTF-8, a JSON object.
pub(crate) fn json_object(
    body: &[u8],
    content_type: Option<&str>,
    max_body_bytes: usize,
) -> Result<Map<String, Value>, Malformed> {
    if body.is_empty() {
        return Err(Malformed::Empty);
    }
    if body.len() > max_body_bytes {
        return Err(Malformed::TooLarge {
            size: body.len(),
            max: max_body_bytes,
        });
    }
    if let Some(ct) = content_type {
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case(ExpiryMessage::CONTENT_TYPE) {
            return Err(Malformed::ContentType(ct.to_owned()));
        }
    }
    let text = std::str::from_utf8(body).map_err(|e| Malformed::NotUtf8(e.valid_up_to()))?;
    let value: Value = serde_json::from_str(text).map_err(|e| Malformed::Json(e.to_string()))?;
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(Malformed::NotAnObject),
    }
}

/// The `"v"` field: present and a non-negative integer.
pub(crate) fn version(fields: &Map<String, Value>) -> Result<u64, Malformed> {
    match fields.get("v") {
        None => Err(Malformed::Missing("v")),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| Malformed::UnknownVersion(n.to_string())),
        Some(_) => Err(Malformed::WrongType {
            field: "v",
            expected: "an integer",
        }),
    }
}

/// An RFC 3339 time, in UTC.
fn time_field(text: &str, field: &'static str) -> Result<DateTime<Utc>, Malformed> {
    let at = DateTime::parse_from_rfc3339(text)
        .map_err(|e| Malformed::Time {
            field,
            value: text.chars().take(64).collect(),
            error: e.to_string(),
        })?
        .with_timezone(&Utc);
    // RFC 3339 has four-digit years; an offset (or rounding up to the
    // millisecond) can push a time at either end out of them in UTC, and such
    // a time could not be written back.
    if !(0..=9999).contains(&ceil_to_millis(at).year()) {
        return Err(Malformed::Time {
            field,
            value: text.chars().take(64).collect(),
            error: "outside the years 0000-9999 in UTC".to_owned(),
        });
    }
    Ok(at)
}

/// An optional non-negative integer field; 0 when absent.
fn count_field(fields: &Map<String, Value>, field: &'static str) -> Result<u32, Malformed> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => {
            n.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(Malformed::WrongType {
                    field,
                    expected: "an integer from 0 to 4294967295",
                })
        }
        Some(_) => Err(Malformed::WrongType {
            field,
            expected: "an integer",
        }),
    }
}

fn string_field<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, Malformed> {
    match fields.get(field) {
        None | Some(Value::Null) => Err(Malformed::Missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(Malformed::WrongType {
            field,
            expected: "a string",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped `consumer.max_body_bytes`.
    fn max() -> usize {
        crate::Settings::default().consumer.max_body_bytes
    }

    fn id(text: &str) -> OrderId {
        OrderId::new(text).unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn decode(body: &[u8]) -> Result<ExpiryMessage, Malformed> {
        ExpiryMessage::decode(body, Some(ExpiryMessage::CONTENT_TYPE), max())
    }

    #[test]
    fn encodes_the_contract_format_as_serde_json_would_and_round_trips() {
        let msg = ExpiryMessage::new(id("A-1"), at("2026-11-30T10:00:00.5Z"));
        let text = String::from_utf8(msg.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"due_at":"2026-11-30T10:00:00.500Z","order_id":"A-1","v":1}"#
        );
        for id in ["A-1", "q\"uote\\back", "ü-ß-€-😀", "</script>"] {
            let msg = ExpiryMessage::new(self::id(id), at("2026-11-30T10:00:00.5Z"));
            let via_value = serde_json::json!({
                "v": VERSION,
                "order_id": msg.order_id.as_str(),
                "due_at": msg.due_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            });
            assert_eq!(
                String::from_utf8(msg.encode()).unwrap(),
                via_value.to_string()
            );
            assert_eq!(decode(&msg.encode()).unwrap(), msg, "round trip");
        }
        let msg = ExpiryMessage::new(id("ü-ß-1"), at("2026-11-30T10:00:00.123Z"));
        assert_eq!(decode(&msg.encode()).unwrap(), msg);
        // An offset at the end of year 9999 that UTC keeps inside it.
        let edge = decode(br#"{"v":1,"order_id":"x","due_at":"9999-12-31T23:59:59+01:00"}"#);
        let edge = edge.unwrap();
        assert_eq!(decode(&edge.encode()).unwrap(), edge);
    }

    #[test]
    fn the_optional_fields_round_trip_and_are_written_only_when_set() {
        let plain = ExpiryMessage::new(id("A-1"), at("2026-11-30T10:00:00Z"));
        let mut again = plain.again_at(at("2026-11-30T10:00:03.0001Z"));
        again.check_step = 2;
        again.unknown_rechecks = 1;
        let text = String::from_utf8(again.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"check_step":2,"due_at":"2026-11-30T10:00:00.000Z","not_before":"2026-11-30T10:00:03.001Z","order_id":"A-1","unknown_rechecks":1,"v":1}"#
        );
        let decoded = decode(text.as_bytes()).unwrap();
        assert_eq!(decoded, again);
        assert_eq!(decoded.process_at(), at("2026-11-30T10:00:03.001Z"));
        assert_eq!(plain.process_at(), plain.due_at);
        // A v1 message without them is step 0, never re-checked, due at due_at.
        let old = decode(br#"{"v":1,"order_id":"A-1","due_at":"2026-11-30T10:00:00Z"}"#).unwrap();
        assert_eq!(old, plain);
    }

    #[test]
    fn due_at_rounds_up_never_down() {
        let msg = ExpiryMessage::new(id("A"), at("2026-11-30T10:00:00.123000001Z"));
        assert_eq!(msg.due_at, at("2026-11-30T10:00:00.124Z"));
        let exact = ExpiryMessage::new(id("A"), at("2026-11-30T10:00:00.123Z"));
        assert_eq!(exact.due_at, at("2026-11-30T10:00:00.123Z"));
    }

    #[test]
    fn accepts_offsets_extra_fields_and_a_json_content_type_or_none() {
        let m =
            decode(br#"{"v":1,"order_id":"x","due_at":"2026-11-30T11:00:00+01:00","extra":[1]}"#)
                .unwrap();
        assert_eq!(m.due_at, at("2026-11-30T10:00:00Z"));
        let body = br#"{"v":1,"order_id":"x","due_at":"2026-11-30T10:00:00Z"}"#;
        let with = |content_type| ExpiryMessage::decode(body, content_type, max());
        assert!(with(None).is_ok());
        assert!(with(Some("application/json; charset=utf-8")).is_ok());
        let wrong = Malformed::ContentType("text/plain".into());
        assert_eq!(with(Some("text/plain")), Err(wrong));
    }

    #[test]
    fn rejects_each_kind_of_bad_body_with_a_precise_reason() {
        let oversized = vec![b' '; max() + 1];
        let outside = "outside the years 0000-9999";
        #[rustfmt::skip]
        let cases: [(&[u8], &str); 22] = [
            (&oversized, "larger than the limit"),
            (b"", "empty body"),
            (b"{not json", "not valid JSON"),
            (b"[1,2]", "not an object"),
            (b"\xff\xfe{}", "not valid UTF-8"),
            (br#"{"order_id":"x","due_at":"2026-11-30T10:00:00Z"}"#, "missing field \"v\""),
            (br#"{"v":3,"order_id":"x","due_at":"2026-11-30T10:00:00Z"}"#, "unknown version 3"),
            (br#"{"v":2,"orders":[]}"#, "a v2 bundle of orders, not a v1 message"),
            (br#"{"v":"1","order_id":"x","due_at":"2026-11-30T10:00:00Z"}"#,
                "\"v\" must be an integer"),
            (br#"{"v":1,"due_at":"2026-11-30T10:00:00Z"}"#, "missing field \"order_id\""),
            (br#"{"v":1,"order_id":7,"due_at":"2026-11-30T10:00:00Z"}"#,
                "\"order_id\" must be a string"),
            (br#"{"v":1,"order_id":"","due_at":"2026-11-30T10:00:00Z"}"#,
                "invalid order_id: it is empty"),
            (br#"{"v":1,"order_id":"a\u0007b","due_at":"2026-11-30T10:00:00Z"}"#,
                "control character"),
            (br#"{"v":1,"order_id":"x"}"#, "missing field \"due_at\""),
            (br#"{"v":1,"order_id":"x","due_at":"tomorrow"}"#, "invalid due_at"),
            // The optional fields.
            (br#"{"v":1,"order_id":"x","due_at":"2026-11-30T10:00:00Z","check_step":-1}"#,
                "\"check_step\" must be an integer from 0"),
            (br#"{"v":1,"order_id":"x","due_at":"2026-11-30T10:00:00Z","unknown_rechecks":"1"}"#,
                "\"unknown_rechecks\" must be an integer"),
            (br#"{"v":1,"order_id":"x","due_at":"2026-11-30T10:00:00Z","not_before":7}"#,
                "\"not_before\" must be a string"),
            (br#"{"v":1,"order_id":"x","due_at":"2026-11-30T10:00:00Z","not_before":"soon"}"#,
                "invalid not_before \"soon\""),
            // Found by the fuzzer: valid input whose UTC form has a five-digit or
            // negative year, which encode() would write and decode() refuse.
            (br#"{"v":1,"order_id":"x","due_at":"9999-12-31T23:59:59-01:00"}"#, outside),
            (br#"{"v":1,"order_id":"x","due_at":"0000-01-01T00:00:00+01:00"}"#, outside),
            (br#"{"v":1,"order_id":"x","due_at":"9999-12-31T23:59:59.9999Z"}"#, outside),
        ];
        for (body, reason) in cases {
            let err = decode(body).expect_err(reason).to_string();
            assert!(err.contains(reason), "{err:?} should contain {reason:?}");
        }
    }
}
