//! What waits for a batch: early deliveries held until due, due ones ready,
//! and parts of batches that run as batches of their own first (the halves
//! of a failed batch, a message retried alone, batches that waited out an
//! outage). The one place that changes any of them.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
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
