//! Fuzzes the consumer's decoder, `ExpiryMessage::decode`, with arbitrary bodies,
//! content types and size limits. Properties:
//!
//! - it never panics;
//! - what it accepts fits the limit and carries a contract-valid order id;
//! - what it accepts survives the publisher's path: `OrderId::new`, `ExpiryMessage::new`, then
//!   `encode` then `decode` gives the same order and the due time rounded up to
//!   the millisecond (never earlier, at most 1 ms later);
//! - what it refuses has a reason for `x-parked-reason` that is short enough for
//!   an AMQP header.

#![no_main]

use chrono::TimeDelta;
use libfuzzer_sys::fuzz_target;
use order_expiry::{OrderId, publisher::ExpiryMessage};

const CONTENT_TYPE: &str = ExpiryMessage::CONTENT_TYPE;

const CONTENT_TYPES: [Option<&str>; 6] = [
    None,
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some(" Application/JSON ;x"),
    Some("text/plain"),
    Some(""),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(selector & 0x0f) % CONTENT_TYPES.len()];
    let max = if selector & 0x80 != 0 { 48 } else { 16 * 1024 };
    match ExpiryMessage::decode(body, content_type, max) {
        Ok(message) => {
            assert!(!body.is_empty() && body.len() <= max);
            let order_id = OrderId::new(message.order_id.as_str())
                .expect("a decoded order id is valid for the publisher");
            let again = ExpiryMessage::new(order_id, message.due_at);
            // In order, not by subtraction: chrono's arithmetic across a leap second
            // (`23:59:60.9999`, which rounds up to `00:00:00.000`) is not real time.
            assert!(message.due_at <= again.due_at);
            assert!(again.due_at <= message.due_at + TimeDelta::milliseconds(1));
            let encoded = again.encode();
            let decoded = ExpiryMessage::decode(&encoded, Some(CONTENT_TYPE), usize::MAX)
                .unwrap_or_else(|e| {
                    panic!(
                        "re-encoded {:?} does not decode: {e}",
                        String::from_utf8_lossy(&encoded)
                    )
                });
            assert_eq!(decoded, again);
        }
        Err(reason) => {
            let text = reason.to_string();
            assert!(!text.is_empty());
            assert!(text.len() <= 1024, "reason of {} bytes", text.len());
        }
    }
});
