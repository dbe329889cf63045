//! Every way a schedule call can end without a message durable in the broker.

use std::convert::Infallible;
use std::time::Duration;

use thiserror::Error;

use super::order_id::InvalidOrderId;
use crate::amqp::{AmqpError, BrokerError, ConnectError, LinkError};
use crate::settings::InvalidSetting;
use crate::topology::{DelayTooLong, LadderError};

/// Why a schedule call did not end with a message durable in the broker.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The order id breaks the contract (1-128 characters, no control characters).
    #[error("invalid order id: {0}")]
    InvalidOrderId(#[from] InvalidOrderId),
    /// The due time is further away than the ladder can hold.
    #[error(transparent)]
    DelayTooLong(#[from] DelayTooLong),
    /// The ladder description cannot be built from the settings.
    #[error("invalid topology settings: {0}")]
    Topology(#[from] LadderError),
    /// A publisher setting cannot work (named, with the reason).
    #[error(transparent)]
    Settings(#[from] InvalidSetting),
    /// The broker negatively acknowledged the message (e.g. a full queue with
    /// `reject-publish`): it does not hold it.
    #[error("broker refused the message for order {order_id:?} (nack)")]
    Nacked {
        /// The order.
        order_id: String,
    },
    /// No queue accepted the message: the topology is missing or wrong.
    #[error(
        "message for order {order_id:?} was unroutable via {exchange} ({reply_code} {reply_text}); is the topology applied?"
    )]
    Unroutable {
        /// The order.
        order_id: String,
        /// The exchange it was published to.
        exchange: String,
        /// AMQP reply code (312 NO_ROUTE).
        reply_code: u16,
        /// AMQP reply text.
        reply_text: String,
    },
    /// The exchange the message was published to does not exist on the broker
    /// (vhost of `amqp.url`): the topology was never applied there, or with
    /// another prefix. Nothing was published.
    #[error(
        "exchange {exchange} does not exist on the broker; create the topology with `order-expiry topology apply` (same prefix and vhost)"
    )]
    TopologyMissing {
        /// The exchange that is missing.
        exchange: String,
    },
    /// The broker did not confirm in time; the message may or may not be held.
    #[error(
        "no publisher confirm within {0:?}; the broker may or may not hold the message (a slow or unreachable broker, or a cluster without its majority): schedule it again"
    )]
    Timeout(Duration),
    /// The channel or connection failed while publishing.
    #[error("broker connection failed while publishing: {0}")]
    Broker(AmqpError),
    /// No connection could be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

impl ScheduleError {
    /// Short label for the `order_expiry_schedule_total{result}` metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidOrderId(_) => "invalid_order_id",
            Self::DelayTooLong(_) => "delay_too_long",
            Self::Topology(_) | Self::Settings(_) => "topology",
            Self::Nacked { .. } => "nacked",
            Self::Unroutable { .. } => "unroutable",
            Self::TopologyMissing { .. } => "topology_missing",
            Self::Timeout(_) => "timeout",
            Self::Broker(_) | Self::Connect(_) => "connection",
        }
    }
}

impl From<BrokerError> for ScheduleError {
    fn from(error: BrokerError) -> Self {
        match error {
            BrokerError::Failed { source, .. } => Self::Broker(source),
            BrokerError::Timeout { timeout, .. } => Self::Timeout(timeout),
        }
    }
}

/// An [`OrderId`](super::OrderId) passed where an id is converted needs no
/// check: this conversion cannot happen.
impl From<LinkError> for ScheduleError {
    fn from(error: LinkError) -> Self {
        match error {
            LinkError::Connect(e) => e.into(),
            LinkError::Broker(e) => e.into(),
        }
    }
}

impl From<Infallible> for ScheduleError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}
