//! One delivery's pass: each of its orders comes to a verdict once, and the
//! delivery is acked once, at the end. Pure: no I/O.
//!
//! An order is settled (the action answered: cancelled, not unpaid, paid at
//! the gateway, …) or left over: parked (it can never be processed), or to
//! be looked at again later (not found yet, payment pending, or the action
//! kept failing for it). Once every order of the delivery has its verdict,
//! the leftovers leave as confirmed messages of their own (one parked copy
//! for all the parked ones; one message through the ladder per route for
//! the others) and only then is the delivery acked.
//!
//! So a crash repeats only the pass that was in flight: before the ack, the
//! broker redelivers the whole delivery and every verdict is made again
//! (the SQL cancel changes nothing the second time; an HTTP call or an event
//! is sent again, with the same `Idempotency-Key`); after it, nothing of the
//! delivery is left to repeat. A failing order is retried held (unacked, in
//! memory) only while no other order of its delivery has an answer from the
//! action: from then on a retry would keep answered orders unacked, and a
//! crash would send their calls again, so it leaves through the ladder at
//! once, with its backoff.

use std::time::{Duration, Instant};

use super::{Handled, Outcome};
use crate::publisher::ExpiryMessage;

/// One delivery's verdicts so far; see the module docs.
#[derive(Debug)]
pub(super) struct Pass {
    /// Orders the delivery carries, bad entries included.
    orders: usize,
    /// Orders with a verdict (settled or left over).
    decided: usize,
    /// Whether an order of it had an answer from the action or the check.
    acted: bool,
    /// What the observer is told about each settled order, once acked.
    handled: Vec<Handled>,
    leftovers: Leftovers,
}

/// What leaves a delivery as confirmed messages of its own before its ack.
#[derive(Debug, Default)]
pub(super) struct Leftovers {
    /// Orders that can never be processed, each with its reason: one parked
    /// copy for all of them.
    pub(super) parked: Vec<(ParkedOrder, String)>,
    /// Orders to look at again from their `not_before`, each counted with its
    /// outcome once its message is confirmed.
    pub(super) again: Vec<(ExpiryMessage, Outcome)>,
}

/// One parked order, as its parked copy carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ParkedOrder {
    /// The whole body (a v1 message, or a body that does not decode).
    Whole,
    /// One entry of a bundle: its JSON, and its order id when it decoded.
    Entry {
        json: Vec<u8>,
        order_id: Option<crate::publisher::OrderId>,
    },
}

/// The end of a pass.
#[derive(Debug)]
pub(super) enum Finished {
    /// Every order settled: ack the delivery, then tell the observer these.
    Ack(Vec<Handled>),
    /// Publish the leftovers, confirmed, then ack; the settled ones' reports.
    MoveOut(Leftovers, Vec<Handled>),
}

/// When a failing order may be retried held rather than leave through the
/// ladder: `consumer.held_retries` and `consumer.held_retry_ms`.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldRetries {
    pub(super) tries: u32,
    pub(super) window: Duration,
}

impl Pass {
    /// A delivery of `orders` orders, none decided.
    pub(super) fn new(orders: usize) -> Self {
        Self {
            orders,
            decided: 0,
            acted: false,
            handled: Vec::new(),
            leftovers: Leftovers::default(),
        }
    }

    /// An order was settled by the action (or the check).
    pub(super) fn settle(&mut self, handled: Option<Handled>) {
        self.decided += 1;
        self.acted = true;
        self.handled.extend(handled);
    }

    /// An order can never be processed; `acted` when the action said so (a
    /// 4xx, a permanent SQL error), not when it was refused on arrival.
    pub(super) fn park(&mut self, order: ParkedOrder, reason: String, acted: bool) {
        self.decided += 1;
        self.acted |= acted;
        self.leftovers.parked.push((order, reason));
    }

    /// An order is to be looked at again, through the ladder; `acted` when
    /// the action or the check answered for it (not found, pending), not
    /// when it only failed.
    pub(super) fn again(&mut self, message: ExpiryMessage, outcome: Outcome, acted: bool) {
        self.decided += 1;
        self.acted |= acted;
        self.leftovers.again.push((message, outcome));
    }

    /// Whether a failing order that already failed `attempts` times, the
    /// first of them at `failing_since`, is retried held: only while no other
    /// order of this delivery has an answer from the action, and within the
    /// held retries.
    pub(super) fn may_retry_held(
        &self,
        attempts: u32,
        failing_since: Instant,
        held: HeldRetries,
    ) -> bool {
        !self.acted && attempts < held.tries && failing_since.elapsed() < held.window
    }

    /// Orders the delivery carries.
    pub(super) fn orders(&self) -> usize {
        self.orders
    }

    /// Whether every order has its verdict.
    pub(super) fn is_decided(&self) -> bool {
        self.decided >= self.orders
    }

    /// What ends the pass (call once it [`Pass::is_decided`]).
    pub(super) fn finish(self) -> Finished {
        let Leftovers { parked, again } = &self.leftovers;
        match parked.is_empty() && again.is_empty() {
            true => Finished::Ack(self.handled),
            false => Finished::MoveOut(self.leftovers, self.handled),
        }
    }
}

/// The `x-parked-reason` of one parked copy of `parked` (out of a delivery of
/// `orders`): the one reason, or each distinct reason once with how many
/// orders it stands for, in the order first seen, cut to about `max` bytes.
/// A bundle entry's reason starts with its position ("order 3 of the
/// bundle (counting from 0): ..."), which the copy's body keeps; the count
/// groups by what follows.
pub(super) fn parked_reason(parked: &[(ParkedOrder, String)], orders: usize, max: usize) -> String {
    if let [(_, reason)] = parked {
        return reason.clone();
    }
    let mut distinct: Vec<(&str, usize)> = Vec::new();
    for (_, reason) in parked {
        let what = reason
            .split_once("): ")
            .filter(|(head, _)| head.starts_with("order ") && head.ends_with("(counting from 0"))
            .map_or(reason.as_str(), |(_, rest)| rest);
        match distinct.iter_mut().find(|(seen, _)| *seen == what) {
            Some((_, n)) => *n += 1,
            None => distinct.push((what, 1)),
        }
    }
    let mut text = format!("{} of {orders} orders:", parked.len());
    for (i, (what, n)) in distinct.iter().enumerate() {
        let next = format!(" {n} × {what}");
        if text.len() + next.len() > max {
            text.push_str(&format!(" … and {} more reasons", distinct.len() - i));
            break;
        }
        text.push_str(&next);
        if i + 1 < distinct.len() {
            text.push(';');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::publisher::OrderId;

    const HELD: HeldRetries = HeldRetries {
        tries: 3,
        window: Duration::from_secs(10),
    };

    fn message(id: &str) -> ExpiryMessage {
        ExpiryMessage::new(OrderId::new(id).unwrap(), Utc::now())
    }

    fn handled(id: &str, outcome: Outcome) -> Option<Handled> {
        Some(Handled {
            order_id: Some(OrderId::new(id).unwrap()),
            outcome,
            at: Utc::now(),
            not_before: None,
        })
    }

    fn entry(json: &str) -> ParkedOrder {
        ParkedOrder::Entry {
            json: json.as_bytes().to_vec(),
            order_id: None,
        }
    }

    #[test]
    fn a_delivery_is_acked_with_its_reports_once_settled_and_its_leftovers_gone() {
        let mut pass = Pass::new(2);
        pass.settle(handled("a", Outcome::Cancelled));
        assert!(!pass.is_decided());
        pass.settle(handled("b", Outcome::NotUnpaid));
        assert!(pass.is_decided());
        let Finished::Ack(reports) = pass.finish() else {
            panic!("acked")
        };
        assert_eq!(reports.len(), 2);
        // Leftovers leave before the ack.
        let mut pass = Pass::new(3);
        pass.park(entry(r#"{"order_id":""}"#), "bad".into(), false);
        pass.settle(handled("a", Outcome::Cancelled));
        pass.again(message("b"), Outcome::UnknownRequeued, true);
        let Finished::MoveOut(leftovers, reports) = pass.finish() else {
            panic!("moved out")
        };
        assert_eq!((leftovers.parked.len(), leftovers.again.len()), (1, 1));
        assert_eq!(reports.len(), 1);
    }

    #[test]
    fn a_failing_order_is_retried_held_only_while_nothing_of_its_delivery_was_answered() {
        let mut pass = Pass::new(3);
        let since = Instant::now();
        // Refused on arrival: no call was made for it.
        pass.park(entry("1"), "bad".into(), false);
        // Three tries held at most, ten seconds at most.
        let long_ago = Instant::now() - Duration::from_secs(11);
        for (tries, since, ok) in [
            (0, since, true),
            (2, since, true),
            (3, since, false),
            (0, long_ago, false),
        ] {
            assert_eq!(pass.may_retry_held(tries, since, HELD), ok, "{tries} tries");
        }
        // Another order was cancelled: a crash now would call it again.
        pass.settle(handled("a", Outcome::Cancelled));
        assert!(!pass.may_retry_held(0, since, HELD));
    }

    #[test]
    fn one_parked_copy_names_each_reason_once() {
        let bad = |i: usize, what: &str| {
            let reason = format!("order {i} of the bundle (counting from 0): {what}");
            (entry("{}"), reason)
        };
        let whats = ["missing field \"due_at\"", "invalid order_id: empty"];
        let parked: Vec<_> = (0..8000).map(|i| bad(i, whats[i % 2])).collect();
        assert_eq!(
            parked_reason(&parked, 8000, 1024),
            "8000 of 8000 orders: 4000 × missing field \"due_at\"; 4000 × invalid order_id: empty"
        );
        let one = [bad(3, "x")];
        assert_eq!(
            parked_reason(&one, 5, 1024),
            "order 3 of the bundle (counting from 0): x"
        );
        let many: Vec<_> = (0..50).map(|i| bad(i, &format!("reason {i}"))).collect();
        let cut = parked_reason(&many, 50, 120);
        assert!(cut.len() < 160 && cut.ends_with("more reasons"), "{cut}");
    }
}
