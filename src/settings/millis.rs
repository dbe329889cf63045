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

/// `#[serde(with = "millis::list")]`: a list of milliseconds, as a TOML array
/// or as one comma-separated string (`ORDER_EXPIRY__…=1000,3000,5000`; an empty
/// string is an empty list).
pub(super) mod list {
    use std::time::Duration;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<u64>),
        Text(String),
        One(u64),
    }

    pub(in crate::settings) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Duration>, D::Error> {
        let values = match Form::deserialize(deserializer)? {
            Form::List(values) => values,
            Form::One(value) => vec![value],
            Form::Text(text) => text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u64>().map_err(|_| {
                        D::Error::custom(format!("{s:?} is not a whole number of milliseconds"))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(values.into_iter().map(Duration::from_millis).collect())
    }
}
