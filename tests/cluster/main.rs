//! Tests on a three-node RabbitMQ cluster (`scripts/lib/cluster.sh`; with
//! `ORDER_EXPIRY_RMQ4_SUITE=forky`, as `scripts/test` runs them, the 4.3.6
//! Khepri cluster `rabbit43c{1,2,3}@localhost` on AMQP 5695-5697): queue leaders
//! spread over the nodes, the publisher and the consumer moving between nodes
//! through the comma-separated `amqp.url`, competing consumers, node loss with
//! orders in flight (a rolling restart, the majority lost), a node that dies or
//! hangs with a `serve` on it, bounded from each order's due time (kill -9 for
//! 60 s, for good, SIGSTOP for 60 s), network partitions (a node cut off with
//! nftables), and what clients see on a node without a majority. The tests read the nodes' names and ports
//! from `cluster.sh env`, so the variable must reach them.
//!
//! `scripts/test` runs them in a stage of their own: it brings the cluster up,
//! makes the vhost, runs `cargo test --test cluster -- --test-threads 1` and
//! brings the cluster down again, also on failure. By hand:
//!
//! ```sh
//! export ORDER_EXPIRY_RMQ4_SUITE=forky
//! scripts/lib/cluster.sh up
//! scripts/lib/cluster.sh ctl 1 add_vhost order-expiry-cluster
//! scripts/lib/cluster.sh ctl 1 set_permissions -p order-expiry-cluster guest '.*' '.*' '.*'
//! ORDER_EXPIRY_TEST_VHOST=order-expiry-cluster ORDER_EXPIRY_TEST_AMQP_PORT=5695 \
//!   cargo test --test cluster -- --test-threads 1 --nocapture
//! scripts/lib/cluster.sh down
//! ```
//!
//! Every scenario prints a `FIGURES` line; each bound it asserts is named where
//! it is defined. A scenario that fails midway starts (and continues) every
//! node again before the next one (a guard), and every wait is bounded.

mod consumers;
mod hung_node;
mod minority;
mod node_gone;
mod node_loss;
mod operator;
mod partition;
mod placement;
mod support;
