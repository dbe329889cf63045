//! Which deliveries to ack, and how: one `basic.ack` with `multiple` for every run
//! of finished deliveries at the front of the channel's unacked window, single
//! acks only when something held (not yet due) blocks that front. Pure: the
//! consumer sends what [`AckTracker::take`] says.
//!
//! One `multiple` ack instead of one ack per delivery is one frame instead of
//! hundreds for the client to send and the broker to parse, and one settle
//! command in the quorum due queue's log instead of hundreds (measured: a third
//! less client CPU and a quarter less broker CPU per drained message). It is only
//! correct when every delivery up to its tag is finished, which this tracks.
//!
//! The channel carries two consumers (the due queue's and the catch-up
//! queue's) on one sequence of delivery tags, and their deliveries come out of
//! two streams in no set order: delivery 7 of one may be taken after 9 of the
//! other. So the tracker keeps its deliveries in tag order, and a `multiple`
//! ack never reaches past a tag it has not been given yet (it would ack that
//! delivery unhandled, before the session even saw it).

use std::collections::VecDeque;

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Held until due, queued for a batch, being parked, or waiting to retry.
    Waiting,
    /// In a cancel statement now: finishes (or fails) within the statement timeout.
    InBatch,
    /// Handled: may be acked.
    Done,
    /// Acked already, singly (its leftovers were moved out): no ack is due,
    /// but a `multiple` ack may pass over it.
    Acked,
}

/// The unacked deliveries of one channel, in delivery-tag order, each with a
/// payload handed back when it is acked (what the observer reports).
#[derive(Debug)]
pub(super) struct AckTracker<P> {
    entries: VecDeque<(u64, State, Option<P>)>,
    /// The lowest tag not acked yet: tags start at 1 and grow by one.
    next: u64,
}

/// What to send: at most one `multiple` ack, then single acks.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Acks<P> {
    /// `basic.ack(tag, multiple = true)`: every delivery up to this tag.
    pub(super) multiple_upto: Option<u64>,
    /// `basic.ack(tag, multiple = false)` for each.
    pub(super) single: Vec<u64>,
    /// Payloads of every delivery these acks cover.
    pub(super) payloads: Vec<P>,
}

impl<P> Default for AckTracker<P> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            next: 1,
        }
    }
}

impl<P> AckTracker<P> {
    /// A delivery arrived, in whatever order its stream gave it.
    pub(super) fn received(&mut self, tag: u64) {
        let at = self.entries.partition_point(|e| e.0 < tag);
        self.entries.insert(at, (tag, State::Waiting, None));
    }

    /// Moves `tag` to `state`, with `payload` when done. Unknown tags are ignored.
    pub(super) fn set(&mut self, tag: u64, state: State, payload: Option<P>) {
        if let Ok(i) = self.entries.binary_search_by_key(&tag, |e| e.0) {
            self.entries[i].1 = state;
            self.entries[i].2 = payload;
        }
    }

    /// `tag` was acked by someone else (its leftovers were moved out).
    pub(super) fn forget(&mut self, tag: u64) {
        self.set(tag, State::Acked, None);
    }

    /// The acks to send now, forgetting what they cover. Finished deliveries
    /// behind one in a running batch wait for it (milliseconds, then one ack
    /// covers both); behind a waiting one (held up to a second or more, or
    /// failing) they are acked singly, so they never pin the prefetch window.
    /// With `all`, every finished delivery is acked now (shutdown).
    pub(super) fn take(&mut self, all: bool) -> Acks<P> {
        let mut acks = Acks {
            multiple_upto: None,
            single: Vec::new(),
            payloads: Vec::new(),
        };
        // The finished front, as long as its tags follow on from the last
        // acked one (a gap is a delivery not handed to the tracker yet).
        while let Some((tag, State::Done | State::Acked, _)) = self.entries.front() {
            if *tag != self.next {
                break;
            }
            self.next += 1;
            if let Some((tag, state, payload)) = self.entries.pop_front() {
                if state == State::Done {
                    acks.multiple_upto = Some(tag);
                }
                acks.payloads.extend(payload);
            }
        }
        let blocked = match self.entries.front() {
            Some((tag, state, _)) => *tag != self.next || *state == State::Waiting,
            None => false,
        };
        if all || blocked {
            for (tag, state, payload) in self.entries.iter_mut() {
                if *state == State::Done {
                    acks.single.push(*tag);
                    acks.payloads.extend(payload.take());
                    *state = State::Acked;
                }
            }
        }
        acks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl AckTracker<u64> {
        /// Unacked deliveries tracked.
        fn len(&self) -> usize {
            self.entries.iter().filter(|e| e.1 != State::Acked).count()
        }

        /// Each of `tags` done, its payload its tag.
        fn done(&mut self, tags: &[u64]) {
            for &tag in tags {
                self.set(tag, State::Done, Some(tag));
            }
        }

        fn in_batch(&mut self, tags: &[u64]) {
            for &tag in tags {
                self.set(tag, State::InBatch, None);
            }
        }

        /// What `take` acks: up to which tag with `multiple`, which tags
        /// singly, and the payloads it hands back.
        fn acks(&mut self, at_shutdown: bool) -> (Option<u64>, Vec<u64>, Vec<u64>) {
            let acks = self.take(at_shutdown);
            (acks.multiple_upto, acks.single, acks.payloads)
        }
    }

    fn tracker(tags: std::ops::RangeInclusive<u64>) -> AckTracker<u64> {
        let mut t = AckTracker::default();
        tags.for_each(|tag| t.received(tag));
        t
    }

    #[test]
    fn a_finished_front_run_is_one_multiple_ack() {
        let mut t = tracker(1..=5);
        t.done(&[1, 2, 3]);
        t.in_batch(&[4]);
        assert_eq!(t.acks(false), (Some(3), vec![], vec![1, 2, 3]));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn finished_deliveries_wait_for_a_running_batch_in_front() {
        let mut t = tracker(1..=4);
        t.in_batch(&[1, 2]);
        t.done(&[3, 4]);
        assert_eq!(t.acks(false), (None, vec![], vec![]));
        t.done(&[1, 2]);
        assert_eq!(t.acks(false), (Some(4), vec![], vec![1, 2, 3, 4]));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_held_delivery_in_front_does_not_pin_the_ones_behind_it() {
        let mut t = tracker(1..=4);
        t.done(&[2, 4]);
        t.in_batch(&[3]);
        assert_eq!(t.acks(false), (None, vec![2, 4], vec![2, 4]));
        assert_eq!(t.len(), 2);
        // The held one finishes later: acking it with `multiple` covers only
        // itself, since 2 and 4 are acked already.
        t.done(&[1]);
        assert_eq!(t.take(false).multiple_upto, Some(1));
    }

    #[test]
    fn forgotten_and_unknown_tags_are_skipped() {
        let mut t = tracker(1..=3);
        t.forget(2);
        t.done(&[9, 1, 3]);
        assert_eq!(t.acks(false), (Some(3), vec![], vec![1, 3]));
    }

    #[test]
    fn at_shutdown_everything_finished_is_acked() {
        let mut t = tracker(1..=3);
        t.in_batch(&[1]);
        t.done(&[3]);
        assert_eq!(t.acks(true), (None, vec![3], vec![3]));
        assert_eq!(t.len(), 2);
    }

    /// Two consumers on one channel: delivery 2 is still in the other
    /// stream when 1 and 3 are done. A `multiple` ack up to 3 would ack 2
    /// unhandled: 3 is acked singly, and 2 in its turn.
    #[test]
    fn a_multiple_ack_never_passes_a_delivery_not_received_yet() {
        let mut t = AckTracker::<u64>::default();
        t.received(1);
        t.received(3);
        t.done(&[1, 3]);
        assert_eq!(t.acks(false), (Some(1), vec![3], vec![1, 3]));
        t.received(2);
        t.done(&[2]);
        assert_eq!(t.acks(false), (Some(2), vec![], vec![2]));
        assert_eq!(t.len(), 0);
        // Tags go on from there.
        t.received(4);
        t.done(&[4]);
        assert_eq!(t.take(false).multiple_upto, Some(4));
    }
}
