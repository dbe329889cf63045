//! What the broker or the AMQP client said, as a type of ours: the public error
//! enums carry it, so lapin's error type (and its version) stays out of this
//! crate's API while the message and the source chain stay whole.

use thiserror::Error;

/// A failure reported by the broker (a refusal, a closed channel) or by the
/// AMQP client (a dropped connection, a TLS handshake). Its `Display` is the
/// client's message; [`std::error::Error::source`] goes on down its chain.
#[derive(Debug, Clone, Error)]
#[error(transparent)]
pub struct AmqpError(lapin::Error);

impl AmqpError {
    /// Wraps what lapin said.
    pub(crate) fn new(error: lapin::Error) -> Self {
        Self(error)
    }

    /// What lapin said, for the crate's own checks (404, 406, TLS trust).
    pub(crate) fn lapin(&self) -> &lapin::Error {
        &self.0
    }
}
