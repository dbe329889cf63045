//! Talking to RabbitMQ: one bounded, password-safe way to connect (with TLS for
//! `amqps://`), and one timeout for every other await on the broker.

mod bounded;
mod client_error;
mod confirms;
mod connect;
#[cfg(feature = "service")]
mod heartbeat;
mod link;
mod resume;
mod tls;

pub use self::bounded::BrokerError;
pub(crate) use self::bounded::{bounded, is_not_found, is_precondition_failed};
pub use self::client_error::AmqpError;
pub(crate) use self::confirms::{Confirmed, Confirming, Confirms};
pub use self::connect::ConnectError;
#[cfg(feature = "service")]
pub(crate) use self::connect::{BrokerNode, connect_node};
pub(crate) use self::connect::{close_failed, connect};
#[cfg(feature = "service")]
pub(crate) use self::heartbeat::with_heartbeat;
pub(crate) use self::link::{ConfirmLink, LinkError};
pub(crate) use self::resume::{NodeLost, Resume};
pub use self::tls::{TlsError, TlsFiles};
