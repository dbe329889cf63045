//! The ack state of a delivery's orders. A v1 delivery is one order: its
//! state is its delivery's. A v2 bundle is many: each order is settled on its
//! own (cancelled, kept, or moved out as a confirmed message of its own), and
//! the delivery stays `Waiting` in the ack tracker until the last one is, then
//! becomes `Done` with what the observer is told about each. So one locked or
//! failing order never holds the others' cancels, only the bundle's ack; a
//! crash before that ack redelivers the bundle, and every repeat is harmless
//! (the cancel is conditional).

use super::Handled;
use super::acks::State;
use super::session::Session;
use crate::service::action::Action;

impl<A: Action> Session<'_, A> {
    /// Moves a v1 delivery to `state`; a bundle stays waiting until its
    /// last order is settled ([`Session::settle`]).
    pub(super) fn mark(&mut self, tag: u64, state: State) {
        if !self.bundles.contains_key(&tag) {
            self.acks.set(tag, state, None);
        }
    }

    /// One order of delivery `tag` is settled: a v1 delivery may be acked now,
    /// a bundle once this was its last order.
    pub(super) fn settle(&mut self, tag: u64, handled: Option<Handled>) {
        let Some((left, seen)) = self.bundles.get_mut(&tag) else {
            self.acks
                .set(tag, State::Done, Some(handled.into_iter().collect()));
            return;
        };
        *left = left.saturating_sub(1);
        seen.extend(handled);
        if *left == 0
            && let Some((_, seen)) = self.bundles.remove(&tag)
        {
            self.acks.set(tag, State::Done, Some(seen));
        }
    }
}
