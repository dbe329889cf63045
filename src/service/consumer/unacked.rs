//! The session's unacked deliveries and the ack state of their orders. A v1
//! delivery is one order: its state is its delivery's. A v2 bundle is many:
//! each order is settled on its own (cancelled, kept, or moved out as a
//! confirmed message of its own), and the delivery stays `Waiting` in the ack
//! tracker until the last one is, then becomes `Done` with what the observer
//! is told about each. So one locked or failing order never holds the others'
//! cancels, only the bundle's ack; a crash before that ack redelivers the
//! bundle, and every repeat is harmless (the cancel is conditional).

use std::collections::HashMap;

use super::Handled;
use super::acks::{AckTracker, Acks, State};

/// Unacked deliveries of the consuming channel, and the bundles among them.
#[derive(Default)]
pub(super) struct Unacked {
    /// Acked with `multiple` where possible; with what the observer is told
    /// about each once it is.
    tracker: AckTracker<Vec<Handled>>,
    /// Bundles with orders not settled yet: how many, and what the observer
    /// is told about those that are. A bundle is acked when none is left.
    bundles: HashMap<u64, (usize, Vec<Handled>)>,
}

impl Unacked {
    /// A delivery arrived; tags only grow on a channel.
    pub(super) fn received(&mut self, tag: u64) {
        self.tracker.received(tag);
    }

    /// Delivery `tag` is a bundle of `orders` orders: acked once each is settled.
    pub(super) fn bundle(&mut self, tag: u64, orders: usize) {
        self.bundles.insert(tag, (orders, Vec::new()));
    }

    /// Moves a v1 delivery to `state`; a bundle stays waiting until its
    /// last order is settled ([`Unacked::settle`]).
    pub(super) fn mark(&mut self, tag: u64, state: State) {
        if !self.bundles.contains_key(&tag) {
            self.tracker.set(tag, state, None);
        }
    }

    /// One order of delivery `tag` is settled: a v1 delivery may be acked now,
    /// a bundle once this was its last order.
    pub(super) fn settle(&mut self, tag: u64, handled: Option<Handled>) {
        let Some((left, seen)) = self.bundles.get_mut(&tag) else {
            self.tracker
                .set(tag, State::Done, Some(handled.into_iter().collect()));
            return;
        };
        *left = left.saturating_sub(1);
        seen.extend(handled);
        if *left == 0
            && let Some((_, seen)) = self.bundles.remove(&tag)
        {
            self.tracker.set(tag, State::Done, Some(seen));
        }
    }

    /// Delivery `tag` was acked on its own (its confirmed copy was published):
    /// stop tracking it.
    pub(super) fn forget(&mut self, tag: u64) {
        self.tracker.forget(tag);
    }

    /// The acks to send now, forgetting what they cover; see [`AckTracker::take`].
    pub(super) fn take(&mut self, all: bool) -> Acks<Vec<Handled>> {
        self.tracker.take(all)
    }
}
