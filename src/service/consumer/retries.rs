//! Work retried on its own timer, without holding up anything else: an order
//! the action could not take now (a locked order, a 5xx, a timeout), retried
//! held on a backoff of its own attempts (see `pass.rs` for how long); a
//! delivery's leftovers the broker did not confirm, on one backoff shared by
//! all of them. The one place that changes either.

use std::time::Duration;

use futures::StreamExt;
use tokio_util::time::DelayQueue;

use super::outbound::MoveOut;
use super::work::Pending;
use crate::service::backoff::Backoff;

/// What is retried when its timer fires.
pub(super) enum Retry {
    /// An order that was busy (locked), whose action failed transiently for
    /// it (a 5xx, a timeout), or whose batch failed transiently when it was
    /// alone: checked and expired again, alone.
    Again(Box<Pending>),
    /// Leftovers of a delivery the broker did not confirm.
    MoveOut(MoveOut),
}

/// Messages, parks and re-queues waiting for their retry.
pub(super) struct Retries {
    /// Each until its own retry.
    timers: DelayQueue<Retry>,
    /// `consumer.retry_initial_ms` and `retry_max_ms`: a message's backoff
    /// by its own attempts.
    initial: Duration,
    max: Duration,
    /// Parks' and re-queues' backoff, reset when one is confirmed.
    republish: Backoff,
}

impl Retries {
    /// Nothing to retry; backoffs from `initial`, doubling up to `max`.
    pub(super) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            timers: DelayQueue::new(),
            initial,
            max,
            republish: Backoff::new(initial, max),
        }
    }

    /// The delay before an order's next try, after `attempts` failures.
    pub(super) fn backoff(&self, attempts: u32) -> Duration {
        Backoff::nth(self.initial, self.max, attempts.saturating_sub(1))
    }

    /// Retries one order alone (its failure counted) after its own backoff.
    pub(super) fn again(&mut self, pending: Pending) {
        let delay = self.backoff(pending.attempts);
        self.timers.insert(Retry::Again(Box::new(pending)), delay);
    }

    /// Publishes what is left of `move_out` again after the shared backoff.
    pub(super) fn move_out(&mut self, move_out: MoveOut) {
        let delay = self.republish.next_delay();
        self.timers.insert(Retry::MoveOut(move_out), delay);
    }

    /// Leftovers were confirmed: the next failure starts from the shortest
    /// backoff.
    pub(super) fn republished(&mut self) {
        self.republish.reset();
    }

    /// Whether nothing waits for a retry.
    pub(super) fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// The next retry whose timer fired; `None` when nothing waits.
    pub(super) async fn next_due(&mut self) -> Option<Retry> {
        self.timers.next().await.map(|expired| expired.into_inner())
    }

    /// Retries waiting (for the drain's count of released deliveries).
    pub(super) fn len(&self) -> usize {
        self.timers.len()
    }
}
