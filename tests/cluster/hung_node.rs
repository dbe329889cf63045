//! A hung node is not a dead one: the node leading the most ladder queues,
//! with a `serve` connected to it, is stopped with SIGSTOP for 60 s, then
//! continued with SIGCONT. Its sockets stay open and the kernel still accepts
//! connections on its ports, but nothing answers: no AMQP frame, no confirm,
//! no distribution traffic. Its peers see it gone after net_ticktime (10 s in
//! deploy/rabbitmq/advanced.config, which the test cluster runs with); then the
//! quorum queues return what its consumers held (1 s,
//! `x-consumer-disconnected-timeout`) to the other `serve`. The scenario is
//! [`crate::node_gone::from_due`]: orders in flight, the sweeper off, every
//! cancel bounded from its due time, not from the SIGCONT.

use crate::node_gone::{Gone, HUNG, from_due};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigstop_of_the_busiest_leader_for_60_s_bound_from_due() {
    from_due("SIGSTOP busiest leader 60 s", Gone::Hung, false, HUNG).await;
}
