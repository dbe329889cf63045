//! The one timeout every await on the broker goes through: lapin's futures wait
//! forever on a half-open connection, so each is bounded and named.

use std::borrow::Cow;
use std::time::Duration;

use thiserror::Error;

use super::AmqpError;

/// A broker operation failed or did not answer in time; `what` names it
/// (`declaring queue orders.due`, `basic.qos`, ...).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker refused, or the channel or connection failed.
    #[error("{what}: {source}")]
    Failed {
        /// The operation.
        what: Cow<'static, str>,
        /// What the broker or the client said.
        source: AmqpError,
    },
    /// No answer within the bound (`amqp.timeout_ms`).
    #[error("{what}: no answer from the broker within {timeout:?}")]
    Timeout {
        /// The operation.
        what: Cow<'static, str>,
        /// The bound.
        timeout: Duration,
    },
}

/// Whether lapin reports the connection itself gone: a reset or broken
/// socket, missed heartbeats, a connection or channel already closed, or the
/// broker closing it with 320 CONNECTION_FORCED (a node shutting down) or
/// 541 INTERNAL_ERROR. A refusal (403, 404, 406, ...) is not. A channel the
/// broker closed with a refusal reports the refusal first; the next use of
/// it, like every use of a channel whose connection closed, reports the
/// closed state (seen in the soak: a publish as its node stopped).
pub(crate) fn is_connection_lost(error: &lapin::Error) -> bool {
    use lapin::ErrorKind;
    use lapin::protocol::{AMQPErrorKind, AMQPHardError};
    match error.kind() {
        ErrorKind::IOError(_)
        | ErrorKind::MissingHeartbeatError
        | ErrorKind::InvalidConnectionState(_)
        | ErrorKind::InvalidChannelState(..) => true,
        ErrorKind::ProtocolError(e) => matches!(
            e.kind(),
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED | AMQPHardError::INTERNALERROR)
        ),
        _ => false,
    }
}

/// Awaits `op`, at most `timeout`.
pub(crate) async fn bounded<T>(
    what: impl Into<Cow<'static, str>>,
    timeout: Duration,
    op: impl Future<Output = lapin::Result<T>>,
) -> Result<T, BrokerError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(BrokerError::Failed {
            what: what.into(),
            source: AmqpError::new(source),
        }),
        Err(_) => Err(BrokerError::Timeout {
            what: what.into(),
            timeout,
        }),
    }
}

/// Whether the broker answered 404 NOT_FOUND: a publish to an exchange, or a
/// passive declare of a queue, that does not exist. The broker closes the
/// channel with it.
pub(crate) fn is_not_found(error: &AmqpError) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.lapin().kind(),
        lapin::ErrorKind::ProtocolError(e)
            if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

/// Whether the broker answered 406 PRECONDITION_FAILED: a re-declare with other
/// arguments than the existing object's. The broker closes the channel with it.
pub(crate) fn is_precondition_failed(error: &AmqpError) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.lapin().kind(),
        lapin::ErrorKind::ProtocolError(e)
            if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))
    )
}
