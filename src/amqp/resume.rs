//! Doing again, through another node of `amqp.url`, what failed because its
//! node went away (killed, stopped, hung, cut off): for work that is safe to
//! repeat, such as the operator commands and a topology declare.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::bounded::is_connection_lost;
use super::{BrokerError, ConnectError};
use crate::settings::url_list;

/// An error that says whether the node it came from was lost (went away or
/// stopped answering), rather than refusing or failing for good.
pub(crate) trait NodeLost: std::fmt::Display {
    /// Whether another node, or a new connection, may succeed.
    fn is_node_lost(&self) -> bool;
}

/// No answer in time, or the connection gone (see [`is_connection_lost`]).
impl NodeLost for BrokerError {
    fn is_node_lost(&self) -> bool {
        match self {
            Self::Timeout { .. } => true,
            Self::Failed { source, .. } => is_connection_lost(source.lapin()),
        }
    }
}

/// Unreachable or silent, rather than refusing (bad credentials, a bad URL
/// or TLS setting).
impl NodeLost for ConnectError {
    fn is_node_lost(&self) -> bool {
        match self {
            Self::Refused { source, .. } => is_connection_lost(source.lapin()),
            Self::Timeout { .. } => true,
            Self::NoBroker { failures } => failures.iter().any(Self::is_node_lost),
            Self::InvalidUrl { .. } | Self::Tls { .. } | Self::NoUrl => false,
        }
    }
}

/// How long work keeps trying after its node went away. The survivors
/// of a three-node cluster elect new queue leaders within a few seconds of
/// noticing a dead peer, at most `net_ticktime` (10 s in `deploy/`) for a
/// hung one; each attempt on a silent node gives up after `amqp.timeout_ms`
/// (10 s). A minute covers both with room, and still ends a command whose
/// cluster has lost its majority.
pub(crate) const RESUME_FOR: Duration = Duration::from_secs(60);

/// Pause before an attempt on another node.
const RESUME_PAUSE: Duration = Duration::from_secs(1);

/// Whether a failed attempt of some work may be made again on another
/// node: only when its node was lost after the work had connected (a first
/// connect has tried every node already, and a broker that was never there
/// is reported at once), and for at most [`RESUME_FOR`] since the loss. An
/// attempt that had run longer than that before failing starts a new loss,
/// so a long migration survives one node after another.
#[derive(Debug)]
pub(crate) struct Resume {
    what: &'static str,
    /// Whether `amqp.url` lists another node to carry on through: with one
    /// URL a loss is final, as a broker without its majority must be
    /// reported at once (`tests/cluster/minority.rs`).
    another_node: bool,
    connected: bool,
    attempt_started: Instant,
    lost_at: Option<Instant>,
}

impl Resume {
    /// Before the first attempt of `what`, which connects first: call
    /// [`Self::connected`] once it has.
    pub(crate) fn new(what: &'static str) -> Self {
        Self {
            what,
            another_node: false,
            connected: false,
            attempt_started: Instant::now(),
            lost_at: None,
        }
    }

    /// Before the first attempt of `what`, already connected.
    #[cfg(any(feature = "service", test))]
    pub(crate) fn connected_already(what: &'static str) -> Self {
        Self {
            connected: true,
            ..Self::new(what)
        }
    }

    /// For work on the brokers of `urls`: resumed only when they are
    /// several.
    pub(crate) fn through(mut self, urls: &SecretString) -> Self {
        self.another_node = url_list(urls.expose_secret()).nth(1).is_some();
        self
    }

    /// The work has connected to a node.
    pub(crate) fn connected(&mut self) {
        self.connected = true;
    }

    /// After a failed attempt: `Ok` (after a pause) when the next attempt
    /// should be made, else the error to give up with.
    pub(crate) async fn after<E: NodeLost>(&mut self, error: E) -> Result<(), E> {
        if !self.another_node || !self.connected || !error.is_node_lost() {
            return Err(error);
        }
        let now = Instant::now();
        if self.attempt_started.elapsed() > RESUME_FOR {
            self.lost_at = None;
        }
        let lost_at = *self.lost_at.get_or_insert(now);
        if now.duration_since(lost_at) >= RESUME_FOR {
            return Err(error);
        }
        tracing::warn!(
            %error,
            "{}: the broker node went away; carrying on through another node of amqp.url",
            self.what
        );
        tokio::time::sleep(RESUME_PAUSE).await;
        self.attempt_started = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> SecretString {
        SecretString::from("amqp://a:5672/%2f,amqp://b:5672/%2f")
    }

    fn timeout() -> BrokerError {
        BrokerError::Timeout {
            what: "basic.get".into(),
            timeout: Duration::from_secs(10),
        }
    }

    fn failed(kind: lapin::ErrorKind) -> BrokerError {
        BrokerError::Failed {
            what: "basic.get".into(),
            source: crate::amqp::AmqpError::new(lapin::Error::from(kind)),
        }
    }

    fn refused() -> BrokerError {
        use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPSoftError};
        let not_found = AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND);
        failed(lapin::ErrorKind::ProtocolError(AMQPError::new(
            not_found,
            "NOT_FOUND - no queue".into(),
        )))
    }

    #[test]
    fn what_counts_as_a_lost_node() {
        use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPHardError};
        let closed = lapin::ErrorKind::InvalidChannelState(lapin::ChannelState::Closed, "publish");
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let forced = AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED);
        let shutdown = AMQPError::new(forced, "CONNECTION_FORCED - shutdown".into());
        assert!(timeout().is_node_lost());
        assert!(failed(closed).is_node_lost());
        assert!(failed(lapin::ErrorKind::IOError(reset.into())).is_node_lost());
        assert!(failed(lapin::ErrorKind::ProtocolError(shutdown)).is_node_lost());
        assert!(failed(lapin::ErrorKind::MissingHeartbeatError).is_node_lost());
        assert!(!refused().is_node_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_node_is_tried_again_for_a_minute_then_given_up() {
        let mut resume = Resume::connected_already("test").through(&two_nodes());
        let start = Instant::now();
        let mut attempts = 1;
        while resume.after(timeout()).await.is_ok() {
            attempts += 1;
            tokio::time::sleep(Duration::from_secs(9)).await;
        }
        let gave_up_after = start.elapsed();
        assert!(gave_up_after >= RESUME_FOR, "{gave_up_after:?}");
        assert!(gave_up_after < RESUME_FOR + Duration::from_secs(11));
        assert_eq!(attempts, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_one_url_or_a_broker_never_reached_is_not_tried_again() {
        let mut refusal = Resume::connected_already("test").through(&two_nodes());
        assert!(refusal.after(refused()).await.is_err());
        let mut alone = Resume::connected_already("test").through(&SecretString::from("amqp://a"));
        assert!(alone.after(timeout()).await.is_err());
        let mut resume = Resume::new("test").through(&two_nodes());
        assert!(resume.after(timeout()).await.is_err());
        resume.connected();
        assert!(resume.after(timeout()).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_attempt_between_two_losses_starts_a_new_minute() {
        let mut resume = Resume::connected_already("test").through(&two_nodes());
        assert!(resume.after(timeout()).await.is_ok());
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert!(resume.after(timeout()).await.is_ok());
        tokio::time::sleep(RESUME_FOR + Duration::from_secs(1)).await;
        assert!(resume.after(timeout()).await.is_ok(), "a new loss");
    }
}
