//! The session's unacked deliveries: where each is in the ack tracker, and
//! each one's [`Pass`] (the verdicts of its orders so far). A delivery is
//! acked once, when every order in it has its verdict: with one `multiple`
//! ack when all were settled, or singly after its leftovers left as messages
//! of their own ([`Finished::MoveOut`]).

use std::collections::HashMap;
use std::sync::Arc;

use lapin::message::Delivery;

use super::Handled;
use super::acks::{AckTracker, Acks, State};
use super::outbound::MoveOut;
use super::pass::{Finished, Pass};

/// Unacked deliveries of the consuming channel, and their passes.
#[derive(Default)]
pub(super) struct Unacked {
    /// Acked with `multiple` where possible; with what the observer is told
    /// about each once it is.
    tracker: AckTracker<Vec<Handled>>,
    /// Deliveries with orders not decided yet.
    passes: HashMap<u64, (Arc<Delivery>, Pass)>,
}

impl Unacked {
    /// `delivery` arrived with `pass` (its orders); tags only grow on a channel.
    pub(super) fn received(&mut self, delivery: &Arc<Delivery>, pass: Pass) {
        let tag = delivery.delivery_tag;
        self.tracker.received(tag);
        self.passes.insert(tag, (Arc::clone(delivery), pass));
    }

    /// Moves delivery `tag` to `state` (in a batch, or waiting).
    pub(super) fn mark(&mut self, tag: u64, state: State) {
        self.tracker.set(tag, state, None);
    }

    /// The pass of delivery `tag`, while it has one.
    pub(super) fn pass(&mut self, tag: u64) -> Option<&mut Pass> {
        self.passes.get_mut(&tag).map(|(_, pass)| pass)
    }

    /// Ends delivery `tag`'s pass if every order has its verdict. All
    /// settled: it is done, acked with the next acks. With leftovers: they are
    /// returned, to be moved out, and the delivery waits for that (then it is
    /// acked singly and [`Unacked::forget`]).
    pub(super) fn end_pass(&mut self, tag: u64) -> Option<MoveOut> {
        if !self.passes.get(&tag)?.1.is_decided() {
            return None;
        }
        let (delivery, pass) = self.passes.remove(&tag)?;
        let orders = pass.orders();
        match pass.finish() {
            Finished::Ack(handled) => {
                self.tracker.set(tag, State::Done, Some(handled));
                None
            }
            Finished::MoveOut(leftovers, handled) => {
                self.tracker.set(tag, State::Waiting, None);
                Some(MoveOut::new(delivery, orders, leftovers, handled))
            }
        }
    }

    /// Delivery `tag` was acked on its own (its leftovers were confirmed):
    /// stop tracking it.
    pub(super) fn forget(&mut self, tag: u64) {
        self.tracker.forget(tag);
        self.passes.remove(&tag);
    }

    /// The acks to send now, forgetting what they cover; see [`AckTracker::take`].
    pub(super) fn take(&mut self, all: bool) -> Acks<Vec<Handled>> {
        self.tracker.take(all)
    }
}
