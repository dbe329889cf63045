//! The order id of the contract, validated once where it enters: at
//! `schedule()`, in the consumer's decoder, and on each `schedule --stdin` line.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use thiserror::Error;

/// Longest order id, in characters.
const MAX_CHARS: usize = 128;

/// An order id that keeps the contract: 1-128 characters, no control
/// characters. Holding one means it was checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId(String);

/// Why an order id is refused, at `schedule()` and at the consumer alike.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InvalidOrderId {
    /// Zero characters.
    #[error("it is empty")]
    Empty,
    /// Over 128 characters.
    #[error("{0} characters is more than {MAX_CHARS}")]
    TooLong(usize),
    /// Control characters corrupt logs and are never part of a real id.
    #[error("it contains a control character at character {0}")]
    ControlCharacter(usize),
}

impl OrderId {
    /// Checks `id` against the contract.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidOrderId> {
        let id = id.into();
        if id.is_empty() {
            return Err(InvalidOrderId::Empty);
        }
        let mut count = 0;
        for (index, c) in id.chars().enumerate() {
            if c.is_control() {
                return Err(InvalidOrderId::ControlCharacter(index));
            }
            count += 1;
        }
        if count > MAX_CHARS {
            return Err(InvalidOrderId::TooLong(count));
        }
        Ok(Self(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned `String`.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl Deref for OrderId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for OrderId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for OrderId {
    type Err = InvalidOrderId;

    fn from_str(id: &str) -> Result<Self, InvalidOrderId> {
        Self::new(id)
    }
}

impl TryFrom<String> for OrderId {
    type Error = InvalidOrderId;

    fn try_from(id: String) -> Result<Self, InvalidOrderId> {
        Self::new(id)
    }
}

impl TryFrom<&str> for OrderId {
    type Error = InvalidOrderId;

    fn try_from(id: &str) -> Result<Self, InvalidOrderId> {
        Self::new(id)
    }
}

impl TryFrom<&String> for OrderId {
    type Error = InvalidOrderId;

    fn try_from(id: &String) -> Result<Self, InvalidOrderId> {
        Self::new(id.as_str())
    }
}

impl From<OrderId> for String {
    fn from(id: OrderId) -> String {
        id.0
    }
}

impl PartialEq<str> for OrderId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for OrderId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_too_long_in_characters_and_control_characters_are_refused() {
        assert!(OrderId::new("é".repeat(128)).is_ok());
        let too_long = Err(InvalidOrderId::TooLong(129));
        assert_eq!(OrderId::new("a".repeat(129)), too_long);
        assert_eq!(OrderId::new(""), Err(InvalidOrderId::Empty));
        let control = Err(InvalidOrderId::ControlCharacter(1));
        assert_eq!(OrderId::new("a\u{7}b"), control);
        assert_eq!(OrderId::new("o-1").unwrap(), "o-1");
    }
}
