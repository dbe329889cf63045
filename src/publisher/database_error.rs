//! What PostgreSQL or its client said, as a type of ours: [`OutboxError`](super::OutboxError)
//! carries it, so tokio-postgres's error type stays out of this crate's API
//! while the message, the SQLSTATE and the source chain stay whole.

use thiserror::Error;

/// A failed database call: the server's error (with its SQLSTATE) or the
/// connection's. Its `Display` is the client's message;
/// [`std::error::Error::source`] goes on down its chain.
#[derive(Debug, Error)]
#[error(transparent)]
pub struct DatabaseError(tokio_postgres::Error);

impl DatabaseError {
    /// Wraps what tokio-postgres said.
    pub(crate) fn new(error: tokio_postgres::Error) -> Self {
        Self(error)
    }

    /// The server's SQLSTATE (`42P01`: no such table), if the server answered.
    pub fn sqlstate(&self) -> Option<&str> {
        self.0.code().map(|code| code.code())
    }
}
