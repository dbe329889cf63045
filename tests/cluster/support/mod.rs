//! Shared set-up of the cluster tests:
//!
//! - the three nodes (kill, stop, start, who leads what), through
//!   `scripts/lib/cluster.sh`, every call bounded, are the testkit's
//!   `order_expiry_testkit::cluster` (the soak drives them too); `NodesBack`
//!   starts any stopped node again when a scenario ends, also on panic.
//! - [`world`]: a test world on the cluster: its topology declared through the
//!   URL list, `serve` processes started on a chosen node, a `rabbitmqctl` view.
//! - [`traffic`]: an order service placing orders (delays 2-30 s) with every
//!   schedule call's outcome and time, and the audit of the orders table.

mod traffic;
mod world;

pub use order_expiry_testkit::cluster::{
    NodesBack, ctl_any, kill, leaders, node_number, node_of_pid, nodes_named, pause, queues,
    resume, start, stop,
};
pub use traffic::*;
pub use world::*;
