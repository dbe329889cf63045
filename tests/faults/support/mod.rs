//! Shared set-up for the fault tests, on top of `order_expiry_testkit` (the
//! isolated world and the `serve` child-process runner):
//!
//! - [`world`]: one scenario's world (the testkit's, its `serve` logs kept
//!   per scenario), once the broker and the database are up.
//! - [`Outage`]: breaks the broker or the database; dropping it (also when the test
//!   panics) brings the service back and waits until it answers.
//! - [`settle`]: the testkit's [`Ledger`] audited against the invariants,
//!   with where the messages are while it waits.
//! - [`ensure_ballast`]: the broker topology under which a restart stalls a level.

mod audit;
mod ballast;
mod services;
mod world;

pub use audit::*;
pub use ballast::*;
pub use order_expiry_testkit::{ReadyWatch, Subscriber, World, at_ms, json, poll, schedule_all};
pub use services::*;
pub use world::*;
