//! Shared set-up of the cluster tests:
//!
//! - [`nodes`]: the three nodes (kill, stop, start, who leads what), through
//!   `scripts/lib/cluster.sh`, every call bounded; [`NodesBack`] starts any
//!   stopped node again when a scenario ends, also on panic.
//! - [`world`]: a test world on the cluster: its topology declared through the
//!   URL list, `serve` processes started on a chosen node, a `rabbitmqctl` view.
//! - [`traffic`]: an order service placing orders (delays 2-30 s) with every
//!   schedule call's outcome and time, and the audit of the orders table.

mod nodes;
mod traffic;
mod world;

pub use nodes::*;
pub use traffic::*;
pub use world::*;
