//! Shared set-up for the fault tests.
//!
//! - [`World`]: one test's own topology prefix (in the test vhost) and PostgreSQL
//!   schema (in the test database), like `tests/integration/helpers.rs`, but every
//!   broker call opens a fresh connection, since the broker restarts under it.
//! - [`Served`]: the real `order-expiry serve` binary as a child process, with its
//!   HTTP address, metrics, CPU time and log.
//! - [`Outage`]: breaks the broker or the database; dropping it (also when the test
//!   panics) brings the service back and waits until it answers.
//! - [`Ledger`] / [`Figures`]: what the order service did, audited from the
//!   database against the invariants.

mod audit;
mod served;
mod services;
mod world;

pub use audit::*;
pub use served::*;
pub use services::*;
pub use world::*;
