//! The action's outage: while the database (or the order service) cannot take
//! any batch, the failed batches wait here, no new batch starts and no
//! deliveries are taken, until the backoff says to try again. The one place
//! that starts and ends it.

use std::time::Duration;

use tokio::time::Instant;

use super::work::Pending;
use crate::service::backoff::Backoff;

/// Batches waiting for the action to come back, and when to try again.
pub(super) struct Outage {
    /// Batches the action could not take at all, oldest first.
    waiting: Vec<Vec<Pending>>,
    /// Set while the action is unavailable: when to try again.
    retry_at: Option<Instant>,
    backoff: Backoff,
}

impl Outage {
    /// No outage; tries again after `initial`, doubling up to `max`.
    pub(super) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            waiting: Vec::new(),
            retry_at: None,
            backoff: Backoff::new(initial, max),
        }
    }

    /// A batch the action could not take at all waits; the first one starts
    /// the outage and sets when to try again.
    pub(super) fn wait(&mut self, batch: Vec<Pending>) {
        self.waiting.push(batch);
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.backoff.next_delay());
        }
    }

    /// When to try again; `None` when there is no outage.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Whether the action is unavailable: intake and new batches pause.
    pub(super) fn is_on(&self) -> bool {
        self.retry_at.is_some()
    }

    /// Time to try again: ends the outage and hands back the waiting
    /// batches, newest first (to be pushed to the front of the split queue,
    /// which puts the oldest first).
    pub(super) fn end(&mut self) -> impl Iterator<Item = Vec<Pending>> {
        self.retry_at = None;
        std::mem::take(&mut self.waiting).into_iter().rev()
    }

    /// Work succeeded: the next outage starts from the shortest backoff.
    pub(super) fn on_success(&mut self) {
        self.backoff.reset();
    }

    /// The waiting batches (for the drain's count of released deliveries).
    pub(super) fn waiting(&self) -> &[Vec<Pending>] {
        &self.waiting
    }
}
