//! Work retried on its own timer, without holding up anything else: a message
//! the action could not take now (a locked order, a 5xx, a timeout), on a
//! backoff of its own attempts; a park or a re-queue the broker did not
//! confirm, on one backoff shared by all of them. The one place that changes
//! either.

use std::time::Duration;

use futures::StreamExt;
use tokio_util::time::DelayQueue;

use super::outbound::{Original, Republish};
use super::work::Pending;
use crate::service::backoff::Backoff;

/// What is retried when its timer fires.
pub(super) enum Retry {
    /// A message whose order was busy (locked), whose action failed
    /// transiently for it (a 5xx, a timeout), or whose batch failed transiently
    /// when it was alone: checked and expired again, alone.
    Again(Box<Pending>),
    /// A park or a re-queue the broker did not confirm.
    Republish { original: Original, what: Republish },
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

    /// Retries one message alone after its own backoff, one attempt later.
    pub(super) fn again(&mut self, mut pending: Pending) {
        let delay = Backoff::nth(self.initial, self.max, pending.attempts);
        pending.attempts = pending.attempts.saturating_add(1);
        self.timers.insert(Retry::Again(Box::new(pending)), delay);
    }

    /// Publishes `what` for `original` again after the shared backoff.
    pub(super) fn republish(&mut self, original: Original, what: Republish) {
        let delay = self.republish.next_delay();
        self.timers
            .insert(Retry::Republish { original, what }, delay);
    }

    /// A park or a re-queue was confirmed: the next failure starts from the
    /// shortest backoff.
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
