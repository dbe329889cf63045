//! Durations written as whole milliseconds: the public keys keep their `_ms`
//! names (`timeout_ms = 10000`, `ORDER_EXPIRY__AMQP__TIMEOUT_MS=10000`) while
//! the code reads a [`Duration`].

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `#[serde(with = "millis")]`: a non-negative integer of milliseconds.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(Duration::from_millis)
}
