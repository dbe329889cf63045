//! Fuzzes the consumer's decoder of every version, `DueMessage::decode`
//! (v1 and v2 bundles), with arbitrary bodies, content types and size limits.
//! Properties:
//!
//! - it never panics;
//! - a v1 body decodes exactly as `ExpiryMessage::decode` decodes it (the two
//!   decoders agree on everything that is not a bundle);
//! - what it accepts fits the limit, carries at least one order, and every
//!   good order has a contract-valid order id;
//! - a bad order of a bundle is parked as a bundle of that entry alone
//!   (`BadEntry::body`): that body decodes again to one bad entry with the
//!   same reason, at index 0, so the parked copy says what was received;
//! - what it refuses has a reason for `x-parked-reason` short enough for an
//!   AMQP header.

#![no_main]

use libfuzzer_sys::fuzz_target;
use order_expiry::{
    OrderId,
    publisher::{DueMessage, ExpiryMessage},
};

const CONTENT_TYPES: [Option<&str>; 4] = [
    None,
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("text/plain"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(selector & 0x0f) % CONTENT_TYPES.len()];
    let max = if selector & 0x80 != 0 { 64 } else { 16 * 1024 };
    let v1 = ExpiryMessage::decode(body, content_type, max);
    match DueMessage::decode(body, content_type, max) {
        Ok(decoded) => {
            assert!(!body.is_empty() && body.len() <= max);
            assert!(decoded.orders() >= 1);
            for message in decoded.messages() {
                OrderId::new(message.order_id.as_str())
                    .expect("a decoded order id is valid for the publisher");
            }
            match &decoded {
                DueMessage::One(message) => assert_eq!(v1.as_ref(), Ok(message)),
                DueMessage::Bundle(entries) => {
                    assert!(v1.is_err(), "the v1 decoder refuses a bundle");
                    for bad in entries.iter().filter_map(|e| e.as_ref().err()) {
                        let parked = bad.body();
                        match DueMessage::decode(&parked, None, usize::MAX) {
                            Ok(DueMessage::Bundle(again)) => match again.as_slice() {
                                [Err(alone)] => {
                                    assert_eq!(alone.index, 0);
                                    assert_eq!(alone.reason, bad.reason);
                                }
                                other => panic!("parked entry decodes as {other:?}"),
                            },
                            other => panic!(
                                "parked body {:?} decodes as {other:?}",
                                String::from_utf8_lossy(&parked)
                            ),
                        }
                    }
                }
            }
        }
        Err(reason) => {
            assert!(v1.is_err(), "what every version refuses, v1 refuses");
            let text = reason.to_string();
            assert!(!text.is_empty());
            assert!(text.len() <= 1024, "reason of {} bytes", text.len());
        }
    }
});
