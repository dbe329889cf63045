//! What waits for a batch: early deliveries held until due, due ones ready,
//! and parts of batches that run as batches of their own first (the halves
//! of a failed batch, a message retried alone, batches that waited out an
//! outage). The one place that changes any of them.
//!
//! Held orders are kept by the moment they are due, under one timer for the
//! earliest. When it fires, every order due by then becomes ready at once, so
//! the orders of a flash sale that fall due together (20 a millisecond, or a
//! bundle's all at once) start as one batch, never one statement each. A
//! timer per order did that one order per turn of the session's loop, and a
//! free statement slot took each turn's order as a batch of its own.

use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::{Instant, Sleep};

use super::work::Pending;
use crate::clock::Clock;
use crate::service::rate::Rate;

/// Longest the holds' timer sleeps before it reads the reference clock again:
/// its offset may be corrected meanwhile (the first measurement, a step), and
/// a timer set by the old one would release late by as much as the correction.
const RECHECK: Duration = Duration::from_millis(250);

/// Deliveries (or orders of bundles) not in a batch yet.
pub(super) struct Backlog {
    /// Early deliveries, each until its `process_at`.
    held: Holds,
    /// Due deliveries waiting for a cancel statement.
    ready: VecDeque<Pending>,
    /// The catch-up queue's due orders (an outage's backlog): they fill what
    /// room a batch of `ready` leaves, at most `catch_up_rate` a second.
    catching_up: VecDeque<Pending>,
    catch_up_rate: Rate,
    /// Parts of failed batches, each run as a batch of its own before `ready`,
    /// until the order at fault is alone.
    split: VecDeque<Vec<Pending>>,
    /// The reference clock holds are kept and released by.
    clock: Clock,
}

/// Held orders by when they may be processed, and the timer for the earliest.
struct Holds {
    by_due: BTreeMap<DateTime<Utc>, Vec<Pending>>,
    len: usize,
    timer: Pin<Box<Sleep>>,
}

impl Backlog {
    /// Empty; holds go by `clock`; the catch-up lane drains at
    /// `catch_up_rate` orders a second (0: no limit).
    pub(super) fn new(clock: Clock, catch_up_rate: u32) -> Self {
        Self {
            clock,
            catching_up: VecDeque::new(),
            catch_up_rate: Rate::new(catch_up_rate, Instant::now()),
            held: Holds {
                by_due: BTreeMap::new(),
                len: 0,
                timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            },
            ready: VecDeque::new(),
            split: VecDeque::new(),
        }
    }

    /// Due now: waits for the next batch.
    pub(super) fn due(&mut self, pending: Pending) {
        self.ready.push_back(pending);
    }

    /// Due, from the catch-up queue: waits behind everything due now.
    pub(super) fn catch_up(&mut self, pending: Pending) {
        self.catching_up.push_back(pending);
    }

    /// Whether the catch-up lane takes more: less than a second's worth of
    /// its rate (or four batches, unlimited) waits in it.
    pub(super) fn wants_catch_up(&self, batch_max: usize) -> bool {
        let enough = match self.catch_up_rate.is_unlimited() {
            true => batch_max.saturating_mul(4),
            false => self.catch_up_rate.per_second() as usize,
        };
        self.catching_up.len() < enough.max(1)
    }

    /// Orders in the catch-up lane, and the `process_at` of the first.
    pub(super) fn catching_up(&self) -> (usize, Option<DateTime<Utc>>) {
        let first = self.catching_up.front().map(|p| p.message.process_at());
        (self.catching_up.len(), first)
    }

    /// Not due by the reference clock itself yet: held for `left` from now.
    pub(super) fn hold_for(&mut self, pending: Pending, left: Duration) {
        let at = self.clock.now() + TimeDelta::from_std(left).unwrap_or(TimeDelta::MAX);
        self.hold_until(pending, at);
    }

    /// Held until `at`, by the reference clock.
    pub(super) fn hold_until(&mut self, pending: Pending, at: DateTime<Utc>) {
        self.held.by_due.entry(at).or_default().push(pending);
        self.held.len += 1;
    }

    /// Whether any delivery is held.
    pub(super) fn is_holding(&self) -> bool {
        self.held.len > 0
    }

    /// Waits until the earliest held order is due (at once when none is
    /// held: call it only while [`Backlog::is_holding`]). Cancel-safe: the
    /// timer lives here, and [`Backlog::release_due`] moves the orders.
    pub(super) async fn next_due(&mut self) {
        let Some(at) = self.held.by_due.keys().next() else {
            return;
        };
        // The timer has millisecond ticks and rounds up; the reference
        // clock decides in release_due, so a clock a fraction behind the
        // timer only means one more short wait, never an early cancel. It
        // wakes at least every RECHECK, to go by an offset corrected since.
        let left = (*at - self.clock.now()).to_std().unwrap_or(Duration::ZERO);
        let left = left.min(RECHECK);
        let deadline = Instant::now() + left;
        if self.held.timer.deadline() != deadline {
            self.held.timer.as_mut().reset(deadline);
        }
        self.held.timer.as_mut().await;
    }

    /// Every held order whose `process_at` has passed becomes ready, the
    /// earliest first.
    pub(super) fn release_due(&mut self) {
        let now = self.clock.now();
        while let Some(entry) = self.held.by_due.first_entry() {
            if *entry.key() > now {
                break;
            }
            let due = entry.remove();
            self.held.len -= due.len();
            self.ready.extend(due);
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
    /// `batch_max` ready orders, then (in the room left) orders of the
    /// catch-up lane as its rate allows; past each, the rest of the last
    /// one's delivery (a delivery's orders released together go through in
    /// one batch); `None` when nothing is ready. The second value: how many
    /// came from the catch-up lane.
    pub(super) fn next_batch(&mut self, batch_max: usize) -> Option<(Vec<Pending>, usize)> {
        if let Some(part) = self.split.pop_front() {
            return Some((part, 0));
        }
        let mut batch = take_deliveries(&mut self.ready, batch_max);
        let room = batch_max.saturating_sub(batch.len());
        let mut caught_up = 0;
        if room > 0 && !self.catching_up.is_empty() {
            let allowed = self.catch_up_rate.take(room, Instant::now());
            if allowed > 0 {
                let more = take_deliveries(&mut self.catching_up, allowed);
                // The rest of a delivery beyond the rate is charged to it.
                self.catch_up_rate
                    .charge(more.len().saturating_sub(allowed));
                caught_up = more.len();
                batch.extend(more);
            }
        }
        (!batch.is_empty()).then_some((batch, caught_up))
    }

    /// Orders waiting here (for the drain's count of released deliveries).
    pub(super) fn orders(&self) -> usize {
        let split: usize = self.split.iter().map(Vec::len).sum();
        self.ready.len() + self.held.len + split + self.catching_up.len()
    }

    /// When the catch-up lane waits for its rate: when to look again.
    pub(super) fn catch_up_wait(&mut self) -> Option<Duration> {
        if self.catching_up.is_empty() {
            return None;
        }
        Some(self.catch_up_rate.wait(Instant::now()))
    }
}

/// Up to `n` orders from the front of `lane`, and past that the rest of the
/// last one's delivery.
fn take_deliveries(lane: &mut VecDeque<Pending>, n: usize) -> Vec<Pending> {
    let mut n = lane.len().min(n);
    if n == 0 {
        return Vec::new();
    }
    let last = lane[n - 1].tag();
    while lane.get(n).is_some_and(|p| p.tag() == last) {
        n += 1;
    }
    lane.drain(..n).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::TimeDelta;
    use lapin::message::Delivery;

    use super::*;
    use crate::publisher::{ExpiryMessage, OrderId};
    use crate::telemetry::spans::Consuming;

    fn consuming() -> Arc<Consuming> {
        let node = crate::amqp::BrokerNode {
            host: "localhost".into(),
            port: 5672,
        };
        Arc::new(Consuming::new("due", "sql", node, false))
    }

    /// `n` orders of one bundle, each due `due_in` from now, held.
    fn hold(backlog: &mut Backlog, prefix: &str, n: usize, due_in: Duration) {
        let delivery = Arc::new(Delivery::mock(1, "".into(), "".into(), false, Vec::new()));
        let due_at = Utc::now() + TimeDelta::from_std(due_in).unwrap();
        for i in 0..n {
            let order_id = OrderId::new(format!("{prefix}-{i}")).unwrap();
            let message = ExpiryMessage::new(order_id, due_at);
            let pending = Pending::new(Arc::clone(&delivery), message, &consuming());
            backlog.hold_until(pending, due_at);
        }
    }

    #[tokio::test]
    async fn holds_due_together_start_as_one_batch_and_the_others_stay_held() {
        let mut backlog = Backlog::new(Clock::local(), 0);
        hold(&mut backlog, "now", 100, Duration::from_millis(5));
        hold(&mut backlog, "later", 10, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(30)).await;

        backlog.next_due().await;
        backlog.release_due();

        // One cancel statement for the hundred, not one each.
        let (batch, _) = backlog.next_batch(200).expect("a batch");
        assert_eq!(batch.len(), 100);
        let mut ids = batch.iter().map(|p| p.message.order_id.as_str());
        assert!(ids.all(|id| id.starts_with("now-")));
        assert!(backlog.next_batch(200).is_none(), "nothing else is due");
        assert_eq!(backlog.orders(), 10, "the later ones are still held");
    }

    #[tokio::test]
    async fn a_held_order_is_released_at_its_due_time_never_before() {
        let mut backlog = Backlog::new(Clock::local(), 0);
        for (i, ms) in [40u64, 10, 25].into_iter().enumerate() {
            hold(&mut backlog, &format!("o{i}"), 1, Duration::from_millis(ms));
        }
        let mut released = Vec::new();
        while backlog.is_holding() {
            backlog.next_due().await;
            backlog.release_due();
            let now = Utc::now();
            while let Some((batch, _)) = backlog.next_batch(200) {
                for p in batch {
                    assert!(now >= p.message.process_at(), "released early");
                    released.push(p.message.order_id.as_str().to_owned());
                }
            }
        }
        assert_eq!(released, ["o1-0", "o2-0", "o0-0"], "the earliest first");
    }

    #[tokio::test]
    async fn a_hold_made_before_the_clock_was_corrected_goes_by_the_corrected_clock() {
        // This host's clock 5 s behind the reference, not measured yet.
        let clock = Clock::local();
        clock.set_offset(TimeDelta::seconds(-5));
        let mut backlog = Backlog::new(clock.clone(), 0);
        hold(&mut backlog, "o", 1, Duration::from_millis(100));
        let released = async {
            loop {
                backlog.next_due().await;
                backlog.release_due();
                if let Some((batch, _)) = backlog.next_batch(200) {
                    return batch.len();
                }
            }
        };
        let measured = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            clock.set_offset(TimeDelta::zero());
        };
        let limit = Duration::from_secs(2);
        let (released, ()) = tokio::join!(tokio::time::timeout(limit, released), measured);
        let released = released.expect("held past 2 s: by the timer the clock 5 s behind set");
        assert_eq!(released, 1);
    }

    #[tokio::test]
    async fn nothing_is_released_before_any_hold_is_due() {
        let mut backlog = Backlog::new(Clock::local(), 0);
        hold(&mut backlog, "later", 10, Duration::from_secs(60));
        backlog.release_due();
        assert!(backlog.next_batch(200).is_none());
        assert_eq!(backlog.orders(), 10);
    }
}
