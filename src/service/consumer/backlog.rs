//! What waits for a batch: early deliveries held until due, due ones ready,
//! and parts of batches that run as batches of their own first (the halves
//! of a failed batch, a message retried alone, batches that waited out an
//! outage). The one place that changes any of them.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::Utc;
use futures::{FutureExt, StreamExt};
use tokio_util::time::DelayQueue;

use super::work::Pending;

/// Deliveries (or orders of bundles) not in a batch yet.
pub(super) struct Backlog {
    /// Early deliveries, each until its `due_at`.
    held: DelayQueue<Pending>,
    /// Due deliveries waiting for a cancel statement.
    ready: VecDeque<Pending>,
    /// Parts of failed batches, each run as a batch of its own before `ready`,
    /// until the order at fault is alone.
    split: VecDeque<Vec<Pending>>,
}

impl Backlog {
    pub(super) fn new() -> Self {
        Self {
            held: DelayQueue::new(),
            ready: VecDeque::new(),
            split: VecDeque::new(),
        }
    }

    /// Due now: waits for the next batch.
    pub(super) fn due(&mut self, pending: Pending) {
        self.ready.push_back(pending);
    }

    /// Early by `early`: held until then.
    pub(super) fn hold(&mut self, pending: Pending, early: Duration) {
        self.held.insert(pending, early);
    }

    /// Whether any delivery is held.
    pub(super) fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The next held delivery whose timer fired; `None` when none is held.
    pub(super) async fn next_expired(&mut self) -> Option<Pending> {
        self.held.next().await.map(|expired| expired.into_inner())
    }

    /// A held delivery's timer fired: ready if its `due_at` (or later
    /// `not_before`) has passed (the timer has millisecond granularity), held
    /// again otherwise.
    pub(super) fn hold_expired(&mut self, pending: Pending) {
        match (pending.message.process_at() - Utc::now()).to_std() {
            Ok(left) if !left.is_zero() => {
                self.held.insert(pending, left);
            }
            _ => self.ready.push_back(pending),
        }
    }

    /// Every other held delivery whose timer has fired too, without waiting.
    /// One timer tick fires many at once (a bundle's orders due together, or
    /// 20 a millisecond in a flash sale): taken one event each, the first ones
    /// would start batches of one order apiece while the statement slots are
    /// free, and the many small commits fall behind. Bounded by what is held
    /// now, so one re-held for its last fraction of a millisecond is not
    /// taken again and again.
    pub(super) fn take_expired(&mut self) {
        for _ in 0..self.held.len() {
            match self.held.next().now_or_never() {
                Some(Some(expired)) => self.hold_expired(expired.into_inner()),
                Some(None) | None => break,
            }
        }
    }

    /// A failed batch of several: its two halves run next, each as a batch of
    /// its own.
    pub(super) fn split(&mut self, mut batch: Vec<Pending>) {
        let second = batch.split_off(batch.len() / 2);
        self.split.push_front(second);
        self.split.push_front(batch);
    }

    /// A message retried alone: runs in a batch of its own (it may fail
    /// again, and must not take others with it).
    pub(super) fn alone(&mut self, pending: Pending) {
        self.split.push_back(vec![pending]);
    }

    /// Batches that waited for the action, newest first: they run next, each
    /// as it was, the oldest first.
    pub(super) fn resume(&mut self, batches: impl Iterator<Item = Vec<Pending>>) {
        for batch in batches {
            self.split.push_front(batch);
        }
    }

    /// The next batch to start: a part of a split batch, or else up to
    /// `batch_max` ready deliveries; `None` when nothing is ready.
    pub(super) fn next_batch(&mut self, batch_max: usize) -> Option<Vec<Pending>> {
        match self.split.pop_front() {
            Some(part) => Some(part),
            None if self.ready.is_empty() => None,
            None => {
                let n = self.ready.len().min(batch_max);
                Some(self.ready.drain(..n).collect())
            }
        }
    }

    /// Orders waiting here (for the drain's count of released deliveries).
    pub(super) fn orders(&self) -> usize {
        let split: usize = self.split.iter().map(Vec::len).sum();
        self.ready.len() + self.held.len() + split
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::TimeDelta;
    use lapin::message::Delivery;

    use super::*;
    use crate::publisher::{ExpiryMessage, OrderId};

    /// `n` orders of one bundle, each held until `due_in` from now.
    fn hold(backlog: &mut Backlog, prefix: &str, n: usize, due_in: Duration) {
        let delivery = Arc::new(Delivery::mock(1, "".into(), "".into(), false, Vec::new()));
        let due_at = Utc::now() + TimeDelta::from_std(due_in).unwrap();
        for i in 0..n {
            let order_id = OrderId::new(format!("{prefix}-{i}")).unwrap();
            let message = ExpiryMessage::new(order_id, due_at);
            backlog.hold(Pending::new(Arc::clone(&delivery), message, true), due_in);
        }
    }

    #[tokio::test]
    async fn holds_that_fired_together_start_as_one_batch_and_the_others_stay_held() {
        let mut backlog = Backlog::new();
        hold(&mut backlog, "now", 100, Duration::from_millis(5));
        hold(&mut backlog, "later", 10, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(30)).await;

        let fired = backlog.next_expired().await.expect("a hold fired");
        backlog.hold_expired(fired);
        backlog.take_expired();

        // One cancel statement for the hundred, not one each.
        let batch = backlog.next_batch(200).expect("a batch");
        assert_eq!(batch.len(), 100);
        assert!(
            batch
                .iter()
                .all(|p| p.message.order_id.as_str().starts_with("now-"))
        );
        assert!(backlog.next_batch(200).is_none(), "nothing else is due");
        assert_eq!(backlog.orders(), 10, "the later ones are still held");
    }

    #[tokio::test]
    async fn taking_the_fired_holds_takes_nothing_when_none_fired() {
        let mut backlog = Backlog::new();
        hold(&mut backlog, "later", 10, Duration::from_secs(60));
        backlog.take_expired();
        assert!(backlog.next_batch(200).is_none());
        assert_eq!(backlog.orders(), 10);
    }
}
