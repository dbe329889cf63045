//! Group commit: schedule calls waiting for a slot of the confirm window, and
//! the bundle the next free slot carries. Pure: no I/O, the clock is an argument.
//!
//! A call that finds a free slot and nobody waiting publishes its order alone
//! (v1), at once: at low load nothing changes. Otherwise it joins the queue,
//! and whichever waiting call gets the next slot takes the oldest live waiter
//! and every later one whose order takes the same route through the ladder
//! and falls due within `publisher.bundle_span_ms` of it (the consumer
//! settles a bundle's orders in one pass, at the latest one's due time), up
//! to `publisher.bundle_max_orders` and `publisher.bundle_max_bytes`. The
//! route is computed when the slot is taken, never before the wait, so a
//! waiter never enters the ladder with a delay older than its wait.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::oneshot;

use super::bundle::{ENVELOPE_BYTES, encode_entry};
use super::error::ScheduleError;
use super::message::ExpiryMessage;
use super::scheduler::{Scheduled, remaining_route, remaining_secs};
use crate::topology::{Ladder, Route};

/// Where a waiting call is told how its order went.
pub(super) type Reply = oneshot::Sender<Result<Scheduled, ScheduleError>>;

/// One schedule call waiting for a slot.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) message: ExpiryMessage,
    pub(super) reply: Reply,
}

/// The orders one slot carries: one message, one route, one confirm.
#[derive(Debug)]
pub(super) struct Bundle {
    pub(super) route: Route,
    /// Each with its entry's JSON (its v1 object without `"v"`).
    pub(super) members: Vec<(Waiter, Vec<u8>)>,
}

/// How big a bundle may get.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) max_orders: usize,
    pub(super) max_bytes: usize,
    /// The most the due times of one bundle's orders may differ.
    pub(super) span: Duration,
}

/// Calls waiting for a slot: oldest first, and by the time each may be
/// processed, so that a slot finds the waiters that share the oldest one's
/// route in that second of the index, without reading every other waiter
/// (with a window's worth of `schedule_many` chunks waiting, up to
/// `max_in_flight × bundle_max_orders` of them, on routes all their own).
#[derive(Debug, Default)]
pub(super) struct Waiting {
    /// By id: ids only grow, so the first is the oldest.
    by_id: BTreeMap<u64, Waiter>,
    /// `(process_at, id)` of each waiter.
    by_time: BTreeSet<(DateTime<Utc>, u64)>,
}

impl Waiting {
    pub(super) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Calls waiting, whatever their route.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn push(&mut self, waiter: Waiter) {
        self.by_time
            .insert((waiter.message.process_at(), waiter.id));
        self.by_id.insert(waiter.id, waiter);
    }

    /// Every waiter, oldest first; none is left waiting.
    pub(super) fn take_all(&mut self) -> Vec<Waiter> {
        self.by_time.clear();
        std::mem::take(&mut self.by_id).into_values().collect()
    }

    /// Takes waiter `id` back, if no slot took it yet (its call failed to
    /// get a channel and returns that error itself).
    pub(super) fn remove(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.by_id.remove(&id)?;
        self.by_time.remove(&(waiter.message.process_at(), id));
        Some(waiter)
    }

    /// The bundle a slot taken at `now` carries; `None` when nobody waits.
    /// Waiters whose call was dropped are skipped; one whose delay is beyond
    /// the ladder is answered with that error here.
    pub(super) fn take_bundle(
        &mut self,
        ladder: &Ladder,
        lead: Duration,
        limits: Limits,
        now: DateTime<Utc>,
    ) -> Option<Bundle> {
        let (first, route) = loop {
            let (id, waiter) = self.by_id.pop_first()?;
            self.by_time.remove(&(waiter.message.process_at(), id));
            if waiter.reply.is_closed() {
                continue;
            }
            match remaining_route(&waiter.message, ladder, lead, now) {
                Ok(route) => break (waiter, route),
                Err(too_long) => {
                    let _ = waiter.reply.send(Err(too_long.into()));
                }
            }
        };
        // The bundle's trace headers carry the first order's context; the
        // others carry theirs only where it differs.
        let shared = first.message.trace.clone();
        let entry = encode_entry(&first.message, shared.as_ref());
        let mut bytes = ENVELOPE_BYTES + entry.len();
        // Earliest due first; the ones dropped by their callers go too.
        let mut chosen: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut dropped: Vec<u64> = Vec::new();
        let (from, until) = same_second(route.delay_secs, lead, now);
        // Within the span: half of it on either side of the first's time.
        let first_at = first.message.process_at();
        let half = TimeDelta::from_std(limits.span / 2).unwrap_or(TimeDelta::MAX);
        let from = from.max(first_at.checked_sub_signed(half).unwrap_or(from));
        let until = until.min(
            first_at
                .checked_add_signed(half + TimeDelta::nanoseconds(1))
                .unwrap_or(until),
        );
        for (_, id) in self.by_time.range((from, 0)..(until, 0)) {
            if chosen.len() + 1 >= limits.max_orders {
                break;
            }
            let waiter = &self.by_id[id];
            if waiter.reply.is_closed() {
                dropped.push(*id);
                continue;
            }
            // The same whole seconds through the ladder is the same route;
            // the window is a little wider than that second.
            if remaining_secs(&waiter.message, lead, now) != route.delay_secs {
                continue;
            }
            let entry = encode_entry(&waiter.message, shared.as_ref());
            // The comma before it.
            if bytes + 1 + entry.len() > limits.max_bytes {
                continue;
            }
            bytes += 1 + entry.len();
            chosen.push((*id, entry));
        }
        for id in dropped {
            self.remove(id);
        }
        let mut members = vec![(first, entry)];
        // Oldest first in the body, as the calls came.
        chosen.sort_unstable_by_key(|(id, _)| *id);
        for (id, entry) in chosen {
            if let Some(waiter) = self.remove(id) {
                members.push((waiter, entry));
            }
        }
        Some(Bundle { route, members })
    }
}

/// The `process_at` times whose orders, published at `now`, wait
/// `delay_secs` whole seconds in the ladder (see [`remaining_secs`]), a
/// millisecond wider on each side: `[now + lead + delay, now + lead + delay
/// + 1 s)`, and everything before it for a delay of 0 (due already).
fn same_second(
    delay_secs: u64,
    lead: Duration,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let at = |ms: u128| {
        i64::try_from(ms)
            .ok()
            .and_then(TimeDelta::try_milliseconds)
            .and_then(|ahead| now.checked_add_signed(ahead))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    };
    let start = u128::from(delay_secs) * 1000 + lead.as_millis();
    let from = if delay_secs == 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        at(start.saturating_sub(1))
    };
    (from, at(start + 1001))
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::publisher::{OrderId, TraceContext};

    const LEAD: Duration = Duration::from_millis(300);

    type Rx = oneshot::Receiver<Result<Scheduled, ScheduleError>>;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    /// Bundles of up to `max_orders`, their due times limited only by the
    /// route's second.
    fn limits(max_orders: usize) -> Limits {
        Limits {
            max_orders,
            max_bytes: 16384,
            span: Duration::from_secs(2),
        }
    }

    /// Waiters `(id, due in ms from now)`, pushed in that order, and their
    /// replies: a dropped reply is a dropped call.
    fn waiting(due: impl IntoIterator<Item = (u64, i64)>) -> (Waiting, Vec<Rx>) {
        let mut waiting = Waiting::default();
        let replies = due
            .into_iter()
            .map(|(id, ms)| {
                let (reply, rx) = oneshot::channel();
                let order = OrderId::new(format!("o-{id}")).unwrap();
                let message = ExpiryMessage::new(order, now() + TimeDelta::milliseconds(ms));
                waiting.push(Waiter { id, message, reply });
                rx
            })
            .collect();
        (waiting, replies)
    }

    fn take(waiting: &mut Waiting, limits: Limits) -> Option<Bundle> {
        waiting.take_bundle(&Ladder::new("g", 10).unwrap(), LEAD, limits, now())
    }

    /// The ids of the next bundle of up to 100 orders.
    fn next(waiting: &mut Waiting) -> Option<Vec<u64>> {
        take(waiting, limits(100)).map(|b| ids(&b))
    }

    fn ids(bundle: &Bundle) -> Vec<u64> {
        bundle.members.iter().map(|(w, _)| w.id).collect()
    }

    #[test]
    fn waiters_sharing_a_route_leave_together_and_the_others_keep_their_place() {
        // 25.4 s and 25.9 s: 25 s through the ladder; 27 s takes another route.
        let (mut waiting, _replies) = waiting([(1, 25_700), (2, 27_500), (3, 26_200), (4, 25_950)]);
        let bundle = take(&mut waiting, limits(100)).unwrap();
        assert_eq!((ids(&bundle), bundle.route.delay_secs), (vec![1, 3, 4], 25));
        assert_eq!(next(&mut waiting), Some(vec![2]));
        assert_eq!(next(&mut waiting), None);
    }

    #[test]
    fn a_slot_finds_its_route_behind_a_thousand_other_routes_and_they_keep_their_place() {
        // 0: 5.5 s; 1..=1000: 10 s, 11 s, ... each a route of its own; then
        // three more on 0's route, and one due already (route 0).
        let others = (1..=1000).map(|id| (id, 10_000 + 1_000 * id as i64));
        let (mut waiting, _replies) = waiting([(0, 5_500)].into_iter().chain(others).chain([
            (1001, 5_900),
            (1002, 6_299),
            (1003, 5_301),
            (1004, -50),
        ]));
        let bundle = take(&mut waiting, limits(100)).unwrap();
        // 5.5 - 0.3 s: 5 s through the ladder; 6.299 - 0.3 and 5.301 - 0.3
        // are the same whole seconds.
        assert_eq!(bundle.route.delay_secs, 5);
        assert_eq!(ids(&bundle), [0, 1001, 1002, 1003]);
        assert_eq!(waiting.len(), 1001);
        for expected in 1..=3 {
            assert_eq!(next(&mut waiting), Some(vec![expected]));
        }
        // One not taken yet can be taken back, once.
        assert_eq!(waiting.remove(1004).map(|w| w.id), Some(1004));
        assert!(waiting.remove(1004).is_none());
    }

    #[test]
    fn a_bundle_holds_only_orders_due_within_its_span() {
        // All 5 s through the ladder; the first is due at 5.500 s.
        let (mut waiting, _replies) =
            waiting([(0, 5_500), (1, 5_502), (2, 5_498), (3, 5_503), (4, 5_900)]);
        let five_ms = Limits {
            span: Duration::from_millis(5),
            ..limits(100)
        };
        let bundle = take(&mut waiting, five_ms).unwrap();
        assert_eq!(ids(&bundle), [0, 1, 2], "5.498-5.502 s: within 5 ms");
        let times = bundle.members.iter().map(|(w, _)| w.message.due_at);
        let spread = times.clone().max().unwrap() - times.min().unwrap();
        assert!(spread <= TimeDelta::milliseconds(5), "{spread}");
        let next = take(&mut waiting, five_ms).unwrap();
        assert_eq!(ids(&next), [3], "5.503 s alone: 4 is 397 ms later");
    }

    #[test]
    fn a_bundle_stops_at_its_order_and_byte_limits() {
        let (mut waiting, _replies) = waiting((0..10).map(|id| (id, 5_000)));
        let bundle = take(&mut waiting, limits(4)).unwrap();
        assert_eq!(ids(&bundle), [0, 1, 2, 3]);
        let entry = bundle.members[0].1.len();
        let two = Limits {
            max_bytes: ENVELOPE_BYTES + 2 * entry + 1,
            ..limits(100)
        };
        let bundle = take(&mut waiting, two).unwrap();
        assert_eq!(ids(&bundle), [4, 5]);
        let body_bytes: usize = bundle.members.iter().map(|(_, e)| e.len()).sum();
        assert_eq!(ENVELOPE_BYTES + body_bytes + 1, two.max_bytes);
    }

    /// A waiting queue of `n` orders due in 5 s, id `id(i)`, context `trace(i)`.
    fn traced_waiting(
        n: u64,
        id: impl Fn(u64) -> String,
        trace: impl Fn(u64) -> Option<TraceContext>,
    ) -> (Waiting, Vec<Rx>) {
        let mut waiting = Waiting::default();
        let replies = (0..n)
            .map(|i| {
                let (reply, rx) = oneshot::channel();
                let order = OrderId::new(id(i)).unwrap();
                let due_at = now() + TimeDelta::milliseconds(5_000);
                let message = ExpiryMessage::new(order, due_at).with_trace(trace(i));
                waiting.push(Waiter {
                    id: i,
                    message,
                    reply,
                });
                rx
            })
            .collect();
        (waiting, replies)
    }

    /// A context of trace `i`, and with a tracestate of 21 bytes.
    fn context(i: u64, state: bool) -> TraceContext {
        let parent = format!("00-{:032x}-00f067aa0ba902b7-01", i + 1);
        TraceContext::parse(&parent, state.then_some("rojo=00f067aa0ba902b7")).unwrap()
    }

    #[test]
    fn a_bundle_writes_each_order_against_its_first_orders_context() {
        let (mut waiting, _replies) = traced_waiting(
            3,
            |i| format!("o-{i}"),
            |i| (i < 2).then(|| context(7, false)),
        );
        let bundle = take(&mut waiting, limits(100)).unwrap();
        let entries: Vec<&[u8]> = bundle.members.iter().map(|(_, e)| e.as_slice()).collect();
        let decoded = crate::publisher::DueMessage::decode_traced(
            &crate::publisher::encode_bundle(entries),
            None,
            16384,
            crate::publisher::TraceHeaders {
                traceparent: Some(context(7, false).traceparent()),
                tracestate: None,
            },
        )
        .unwrap();
        let sent: Vec<_> = bundle
            .members
            .iter()
            .map(|(w, _)| w.message.clone())
            .collect();
        assert_eq!(decoded.messages().cloned().collect::<Vec<_>>(), sent);
        assert!(bundle.members[2].1.ends_with(br#""traceparent":""}"#));
    }

    /// Orders per bundle with the default settings (100 orders, 16,384
    /// bytes): the numbers in docs/src/contract/messages.md.
    #[test]
    fn orders_per_bundle_with_and_without_trace_contexts() {
        let defaults = crate::Settings::default().publisher;
        let limits = Limits {
            max_orders: defaults.bundle_max_orders,
            max_bytes: defaults.bundle_max_bytes,
            span: Duration::from_secs(2),
        };
        let flash = |i: u64| format!("F-{}", 10_000 + i);
        let uuid = |i: u64| format!("{:08x}-0000-4000-8000-{:012x}", i, i);
        let orders_per_bundle =
            |id: &dyn Fn(u64) -> String, trace: &dyn Fn(u64) -> Option<TraceContext>| {
                let (mut waiting, _replies) = traced_waiting(300, id, trace);
                let bundle = take(&mut waiting, limits).unwrap();
                let bytes: usize = bundle.members.iter().map(|(_, e)| e.len() + 1).sum();
                (bundle.members.len(), ENVELOPE_BYTES + bytes - 1)
            };
        let mut table = Vec::new();
        for (ids, id) in [
            ("F-1xxxx", &flash as &dyn Fn(u64) -> String),
            ("uuid", &uuid),
        ] {
            let none = orders_per_bundle(id, &|_| None);
            let shared = orders_per_bundle(id, &|_| Some(context(0, true)));
            let own = orders_per_bundle(id, &|i| Some(context(i, false)));
            let own_state = orders_per_bundle(id, &|i| Some(context(i, true)));
            println!(
                "{ids}: orders (bytes) none {none:?}, shared {shared:?}, own {own:?}, \
                 own+tracestate {own_state:?}"
            );
            table.push([none.0, shared.0, own.0, own_state.0]);
        }
        // One traceparent per order still fills bundles of 100; only a
        // tracestate on every order makes them smaller.
        assert_eq!(table, [[100, 100, 100, 98], [100, 100, 100, 83]]);
    }

    #[test]
    fn dropped_calls_are_skipped_and_a_delay_too_long_is_answered_at_once() {
        let far = TimeDelta::days(400).num_milliseconds();
        let (mut waiting, mut replies) = waiting([(1, 5_000), (2, far), (3, 5_000)]);
        drop(replies.remove(0));
        assert_eq!(next(&mut waiting), Some(vec![3]));
        assert!(matches!(
            replies[0].try_recv(),
            Ok(Err(ScheduleError::DelayTooLong(_)))
        ));
        assert!(waiting.is_empty());
    }
}
