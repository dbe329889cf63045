//! The broker side: the delay ladder's arithmetic, the one description of every
//! exchange, queue and binding, declaring it, and the definitions ops import.
//!
//! - `ladder`: delay → entry exchange and routing key; level names. Pure.
//! - `describe`: the [`Topology`], derived from a ladder and its settings. Pure.
//! - `declare`: `topology apply`: declare it over AMQP, bounded; `guard`
//!   refuses another level count under a prefix that has a ladder.
//! - `definitions`: `topology export`: the definitions JSON, with the users of `access`.
//! - `access`: the least-privilege publisher and consumer users. Pure.

mod access;
mod declare;
mod definitions;
mod describe;
mod guard;
mod ladder;

pub use self::access::{CONSUMER_USER, PUBLISHER_USER};
pub use self::declare::{KeptQueue, TopologyError};
pub use self::definitions::definitions_json;
pub use self::describe::Topology;
#[cfg_attr(not(feature = "service"), allow(unused_imports))]
pub(crate) use self::guard::is_probe_miss;
pub use self::ladder::{DelayTooLong, Ladder, LadderError, Route};
