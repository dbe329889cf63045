//! The v2 wire format, a bundle: `{"v": 2, "orders": [{"order_id": "...",
//! "due_at": "..."}, ...]}`. One ladder message carries many orders that take
//! the same route (scheduled at the same moment with the same whole-second
//! delay), so the broker's cost follows the number of messages, not of orders.
//! Every order in it obeys the v1 rules (the same fields, the same checks,
//! the same optional fields); v1 stays valid forever.
//!
//! Decoding keeps the orders apart: a bundle whose structure is wrong (not
//! JSON, no `orders` list, an empty one) is [`Malformed`] as a whole, but one
//! bad order in a good bundle is a [`BadEntry`] beside the good ones, so the
//! consumer parks that order alone and cancels the others on time.
//!
//! Trace context: the message's `traceparent`/`tracestate` headers hold the
//! context of the bundle's first order; an order whose context differs
//! carries its own `"traceparent"` (and `"tracestate"`) fields, and
//! `"traceparent":""` means "none" (an untraced order in a traced bundle).
//! An order without the fields has the headers' context. One field per
//! order is the cheapest rule that keeps orders of different traces apart
//! and costs nothing when they share one (a flash sale from one request).

use serde_json::Value;

use super::message::{ExpiryMessage, Malformed, json_object, version};
use super::trace::{TraceContext, TraceHeaders};

/// The version of a message that carries a bundle of orders.
pub(crate) const VERSION: u64 = 2;

/// The bytes of a bundle around its orders: `{"orders":[`, `],"v":2}`.
pub(crate) const ENVELOPE_BYTES: usize = 19;

/// A decoded body of any version the consumer knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DueMessage {
    /// v1: one order.
    One(ExpiryMessage),
    /// v2: a bundle, each order decoded on its own, in the order of the body.
    Bundle(Vec<Result<ExpiryMessage, BadEntry>>),
}

/// One order of a bundle that breaks the v1 rules; the bundle's other orders
/// are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("order {index} of the bundle (counting from 0): {reason}")]
pub struct BadEntry {
    /// Its position in `orders`, from 0.
    pub index: usize,
    /// What is wrong with it.
    pub reason: Malformed,
    /// The entry as it was in the body (JSON text), for its parked copy.
    pub raw: String,
}

impl BadEntry {
    /// A bundle of this entry alone: the body its parked copy carries, so the
    /// parked queue shows exactly what was received.
    pub fn body(&self) -> Vec<u8> {
        format!("{{\"orders\":[{}],\"v\":{VERSION}}}", self.raw).into_bytes()
    }
}

impl DueMessage {
    /// Parses and validates a body of any known version; the checks before
    /// the version are the same for all (see [`ExpiryMessage::decode`]).
    /// Orders get only the trace contexts of their own bundle entries; see
    /// [`DueMessage::decode_traced`] for the headers'.
    pub fn decode(
        body: &[u8],
        content_type: Option<&str>,
        max_body_bytes: usize,
    ) -> Result<Self, Malformed> {
        Self::decode_traced(body, content_type, max_body_bytes, TraceHeaders::NONE)
    }

    /// [`DueMessage::decode`] for a message that came with these trace
    /// headers: a v1 order gets their context, and so does each bundle order
    /// without its own (see the module docs). A context that breaks the W3C
    /// rules is dropped (logged at debug), never a reason to park.
    pub fn decode_traced(
        body: &[u8],
        content_type: Option<&str>,
        max_body_bytes: usize,
        headers: TraceHeaders<'_>,
    ) -> Result<Self, Malformed> {
        let fields = json_object(body, content_type, max_body_bytes)?;
        let shared = || headers.context();
        match version(&fields)? {
            1 => ExpiryMessage::from_fields(&fields).map(|m| Self::One(m.with_trace(shared()))),
            VERSION => {
                let orders = match fields.get("orders") {
                    None | Some(Value::Null) => return Err(Malformed::Missing("orders")),
                    Some(Value::Array(orders)) => orders,
                    Some(_) => {
                        return Err(Malformed::WrongType {
                            field: "orders",
                            expected: "a list",
                        });
                    }
                };
                if orders.is_empty() {
                    return Err(Malformed::EmptyBundle);
                }
                let shared = shared();
                Ok(Self::Bundle(
                    orders
                        .iter()
                        .enumerate()
                        .map(|(i, o)| entry(i, o, shared.as_ref()))
                        .collect(),
                ))
            }
            other => Err(Malformed::UnknownVersion(other.to_string())),
        }
    }

    /// How many orders it carries, bad ones included.
    pub fn orders(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Bundle(entries) => entries.len(),
        }
    }

    /// The orders that decoded, in body order.
    pub fn messages(&self) -> impl Iterator<Item = &ExpiryMessage> {
        let (one, many) = match self {
            Self::One(message) => (Some(message), None),
            Self::Bundle(entries) => (None, Some(entries.iter().filter_map(|e| e.as_ref().ok()))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

fn entry(
    index: usize,
    value: &Value,
    shared: Option<&TraceContext>,
) -> Result<ExpiryMessage, BadEntry> {
    let bad = |reason| BadEntry {
        index,
        reason,
        raw: value.to_string(),
    };
    let Value::Object(fields) = value else {
        return Err(bad(Malformed::EntryNotAnObject));
    };
    let message = ExpiryMessage::from_fields(fields).map_err(bad)?;
    let text = |field| fields.get(field).and_then(Value::as_str);
    let trace = match fields.get(TraceContext::TRACEPARENT) {
        // Its own (a wrong JSON type is no context, never a parked order).
        Some(_) => TraceContext::from_wire(
            text(TraceContext::TRACEPARENT),
            text(TraceContext::TRACESTATE),
        ),
        None => shared.cloned(),
    };
    Ok(message.with_trace(trace))
}

/// The JSON of one order as a bundle whose headers carry `shared` carries it
/// (its v1 object without `"v"`, with its own trace context where it differs
/// from `shared`). `shared` `None`: for a message without trace headers.
pub(crate) fn encode_entry(message: &ExpiryMessage, shared: Option<&TraceContext>) -> Vec<u8> {
    let mut entry = Vec::with_capacity(64 + message.order_id.len());
    message.write_object(&mut entry, None, shared);
    entry
}

/// The v2 body for these orders' entries ([`encode_entry`]): keys in sorted
/// order, as v1 writes them.
pub(crate) fn encode_bundle<'a>(entries: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut body = Vec::with_capacity(1024);
    body.extend_from_slice(b"{\"orders\":[");
    for (i, entry) in entries.into_iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(entry);
    }
    body.extend_from_slice(format!("],\"v\":{VERSION}}}").as_bytes());
    body
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::publisher::{OrderId, TraceHeaders};

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn message(id: &str) -> ExpiryMessage {
        ExpiryMessage::new(OrderId::new(id).unwrap(), at("2026-11-30T10:00:00.5Z"))
    }

    fn decode(body: &[u8]) -> Result<DueMessage, Malformed> {
        DueMessage::decode(body, Some(ExpiryMessage::CONTENT_TYPE), 16 * 1024)
    }

    fn bundle(messages: &[ExpiryMessage]) -> Vec<u8> {
        let entries: Vec<Vec<u8>> = messages.iter().map(|m| encode_entry(m, None)).collect();
        encode_bundle(entries.iter().map(Vec::as_slice))
    }

    #[test]
    fn encodes_the_contract_format_and_round_trips() {
        let (a, b) = (message("A-1"), message("q\"uote"));
        let body = bundle(&[a.clone(), b.clone()]);
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            r#"{"orders":[{"due_at":"2026-11-30T10:00:00.500Z","order_id":"A-1"},{"due_at":"2026-11-30T10:00:00.500Z","order_id":"q\"uote"}],"v":2}"#
        );
        assert_eq!(
            decode(&body),
            Ok(DueMessage::Bundle(vec![Ok(a.clone()), Ok(b.clone())]))
        );
        let entries = encode_entry(&a, None).len() + encode_entry(&b, None).len();
        assert_eq!(body.len(), ENVELOPE_BYTES + entries + 1, "one comma");
    }

    #[test]
    fn every_order_keeps_its_own_fields_and_v1_is_one_order() {
        let mut again = message("A-1").again_at(at("2026-11-30T10:00:03Z"));
        again.check_step = 2;
        let body = bundle(&[again.clone(), message("B")]);
        let decoded = decode(&body).unwrap();
        assert_eq!(decoded.orders(), 2);
        let messages: Vec<_> = decoded.messages().cloned().collect();
        assert_eq!(messages, [again, message("B")]);
        // v1 is still read by the same decoder.
        let one = message("A-1");
        assert_eq!(decode(&one.encode()), Ok(DueMessage::One(one.clone())));
        assert_eq!(decode(&one.encode()).unwrap().messages().count(), 1);
    }

    #[test]
    fn one_bad_order_is_set_apart_and_the_others_decode() {
        let body = br#"{"v":2,"orders":[{"order_id":"A","due_at":"2026-11-30T10:00:00Z"},{"order_id":"","due_at":"2026-11-30T10:00:00Z"},7,{"order_id":"C"}]}"#;
        let DueMessage::Bundle(entries) = decode(body).unwrap() else {
            panic!("a bundle")
        };
        assert!(entries[0].is_ok());
        let reasons: Vec<String> = entries[1..]
            .iter()
            .map(|e| e.as_ref().unwrap_err().to_string())
            .collect();
        assert_eq!(
            reasons,
            [
                "order 1 of the bundle (counting from 0): invalid order_id: it is empty",
                "order 2 of the bundle (counting from 0): it is not a JSON object",
                "order 3 of the bundle (counting from 0): missing field \"due_at\"",
            ]
        );
        let Err(bad) = &entries[2] else { panic!() };
        assert_eq!(bad.body(), br#"{"orders":[7],"v":2}"#);
        assert!(matches!(
            decode(&bad.body()),
            Ok(DueMessage::Bundle(e)) if e.len() == 1 && e[0].is_err()
        ));
    }

    const TP_A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TP_B: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

    fn traced(id: &str, traceparent: &str, tracestate: Option<&str>) -> ExpiryMessage {
        message(id).with_trace(TraceContext::parse(traceparent, tracestate).unwrap())
    }

    fn headers<'a>(traceparent: &'a str, tracestate: Option<&'a str>) -> TraceHeaders<'a> {
        TraceHeaders {
            traceparent: Some(traceparent),
            tracestate,
        }
    }

    fn decode_with(body: &[u8], headers: TraceHeaders<'_>) -> Vec<ExpiryMessage> {
        DueMessage::decode_traced(body, None, 16 * 1024, headers)
            .unwrap()
            .messages()
            .cloned()
            .collect()
    }

    #[test]
    fn a_v1_order_takes_the_headers_context_and_its_body_is_unchanged() {
        let a = traced("A-1", TP_A, Some("rojo=1"));
        assert_eq!(
            a.encode(),
            message("A-1").encode(),
            "the context is not in the body"
        );
        assert_eq!(decode_with(&a.encode(), headers(TP_A, Some("rojo=1"))), [a]);
        // No headers, or invalid ones: untraced, never parked.
        assert_eq!(
            decode_with(&message("A-1").encode(), TraceHeaders::NONE),
            [message("A-1")]
        );
        let bad = headers(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            None,
        );
        assert_eq!(decode_with(&message("A-1").encode(), bad), [message("A-1")]);
    }

    #[test]
    fn orders_sharing_the_headers_context_carry_no_field_and_the_others_their_own() {
        let shared = TraceContext::parse(TP_A, Some("rojo=1")).unwrap();
        let (a, b) = (
            traced("A", TP_A, Some("rojo=1")),
            traced("B", TP_A, Some("rojo=1")),
        );
        let c = traced("C", TP_B, None);
        let d = message("D");
        let all = [a.clone(), b.clone(), c.clone(), d.clone()];
        let entries: Vec<Vec<u8>> = all.iter().map(|m| encode_entry(m, Some(&shared))).collect();
        let body = encode_bundle(entries.iter().map(Vec::as_slice));
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            format!(
                r#"{{"orders":[{a},{b},{{"due_at":"2026-11-30T10:00:00.500Z","order_id":"C","traceparent":"{TP_B}"}},{{"due_at":"2026-11-30T10:00:00.500Z","order_id":"D","traceparent":""}}],"v":2}}"#,
                a = String::from_utf8(encode_entry(&message("A"), None)).unwrap(),
                b = String::from_utf8(encode_entry(&message("B"), None)).unwrap(),
            )
        );
        assert_eq!(decode_with(&body, headers(TP_A, Some("rojo=1"))), all);
        // Keys in sorted order, as serde_json writes a map.
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value.to_string().into_bytes(), body);
        // Without the headers (an old publisher's copy) only own fields count.
        let plain = decode_with(&body, TraceHeaders::NONE);
        assert_eq!(plain, [message("A"), message("B"), c, d]);
    }

    #[test]
    fn an_entry_with_its_own_bad_context_is_untraced_and_still_decodes() {
        let body = format!(
            r#"{{"v":2,"orders":[{{"order_id":"A","due_at":"2026-11-30T10:00:00.5Z","traceparent":"nonsense"}},{{"order_id":"B","due_at":"2026-11-30T10:00:00.5Z","traceparent":7}},{{"order_id":"C","due_at":"2026-11-30T10:00:00.5Z","traceparent":"{TP_B}","tracestate":"\u0007"}}]}}"#
        );
        let decoded = decode_with(body.as_bytes(), headers(TP_A, None));
        assert_eq!(decoded[..2], [message("A"), message("B")]);
        assert_eq!(
            decoded[2],
            traced("C", TP_B, None),
            "a bad tracestate alone is dropped"
        );
    }

    #[test]
    fn a_bundle_that_is_wrong_as_a_whole_is_malformed() {
        let cases: [(&[u8], &str); 5] = [
            (br#"{"v":2}"#, "missing field \"orders\""),
            (br#"{"v":2,"orders":{}}"#, "\"orders\" must be a list"),
            (br#"{"v":2,"orders":[]}"#, "a v2 bundle with no orders"),
            (br#"{"v":9,"orders":[]}"#, "unknown version 9"),
            (b"[]", "not an object"),
        ];
        for (body, reason) in cases {
            let err = decode(body).expect_err(reason).to_string();
            assert!(err.contains(reason), "{err:?} should contain {reason:?}");
        }
        let big = bundle(&vec![message("A"); 400]);
        assert!(matches!(
            DueMessage::decode(&big, None, 1024),
            Err(Malformed::TooLarge { .. })
        ));
    }
}
