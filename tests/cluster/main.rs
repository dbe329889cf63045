//! Tests on a three-node RabbitMQ 4.0 cluster (`scripts/lib/cluster.sh`, nodes
//! `rabbit4c{1,2,3}@localhost` on AMQP 5691-5693): queue leaders spread over the
//! nodes, the publisher and the consumer moving between nodes through the
//! comma-separated `amqp.url`, competing consumers, and node loss with orders in
//! flight (kill -9 of the busiest leader, a rolling restart, the majority lost).
//!
//! `scripts/test` runs them in a stage of their own: it brings the cluster up,
//! makes the vhost, runs `cargo test --test cluster -- --test-threads 1` and
//! brings the cluster down again, also on failure. By hand:
//!
//! ```sh
//! scripts/lib/cluster.sh up
//! scripts/lib/cluster.sh ctl 1 add_vhost order-expiry-cluster
//! scripts/lib/cluster.sh ctl 1 set_permissions -p order-expiry-cluster guest '.*' '.*' '.*'
//! ORDER_EXPIRY_TEST_VHOST=order-expiry-cluster cargo test --test cluster -- --test-threads 1 --nocapture
//! scripts/lib/cluster.sh down
//! ```
//!
//! Every scenario prints a `FIGURES` line; each bound it asserts is named where
//! it is defined. A scenario that fails midway starts every node again before
//! the next one (a guard), and every wait is bounded.

mod consumers;
mod node_loss;
mod placement;
mod support;
