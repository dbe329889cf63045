//! The session's check that its broker node still acts for the cluster.
//!
//! A node cut off from its cluster's majority by a network partition keeps
//! its client connections and answers their heartbeats, so nothing on the
//! connection says anything is wrong. Yet on RabbitMQ 4.x it delivers nothing
//! from a quorum queue led on the other side, and answers no declare (the
//! metadata store, Khepri, is Raft too). A `serve` connected only there would
//! hold what it had and take nothing more until the partition healed.
//!
//! So every `amqp.probe_interval_ms` the session declares the due queue's
//! binding again (idempotent; a node answers an exchange or queue re-declare
//! from its own copy, a binding only through the store's leader) on a channel
//! of its own, beside its work; no answer
//! within `amqp.timeout_ms` ends the session, and the next one connects
//! through the next URL of `amqp.url`. What the session held goes back to the
//! other consumers once the majority sees the node gone (`net_ticktime`) and
//! the queue's consumer-disconnected timeout passes.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::{Instant, sleep_until};

use crate::amqp::BrokerError;

/// The probe's clock and the probe under way.
pub(super) struct Probe {
    every: Duration,
    next: Instant,
    running: Option<BoxFuture<'static, Result<(), BrokerError>>>,
}

/// What the probe needs next.
pub(super) enum Probed {
    /// Time to send one.
    Due,
    /// The one under way ended.
    Answered(Result<(), BrokerError>),
}

impl Probe {
    /// Every `every` (never when zero), the first one `every` from now.
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            next: Instant::now() + every,
            running: None,
        }
    }

    /// Whether it probes at all.
    pub(super) fn is_on(&self) -> bool {
        !self.every.is_zero()
    }

    /// Waits for the next probe's time, or the running one's answer.
    /// Cancel-safe: a running probe stays here and is polled again.
    pub(super) async fn next(&mut self) -> Probed {
        match &mut self.running {
            Some(probe) => {
                let answer = probe.await;
                self.running = None;
                self.next = Instant::now() + self.every;
                Probed::Answered(answer)
            }
            None => {
                sleep_until(self.next).await;
                Probed::Due
            }
        }
    }

    /// Runs `probe` (beside the session's work, polled by [`Self::next`]).
    pub(super) fn start(&mut self, probe: BoxFuture<'static, Result<(), BrokerError>>) {
        self.running = Some(probe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_probe_is_due_every_interval_after_the_last_answer() {
        let mut probe = Probe::new(Duration::from_secs(5));
        let start = Instant::now();
        assert!(matches!(probe.next().await, Probed::Due));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        probe.start(Box::pin(async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(())
        }));
        assert!(matches!(probe.next().await, Probed::Answered(Ok(()))));
        assert!(matches!(probe.next().await, Probed::Due));
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        assert!(!Probe::new(Duration::ZERO).is_on());
    }
}
