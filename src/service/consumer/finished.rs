//! What finished work does to a session. Each order's verdict goes to its
//! delivery's pass (`pass.rs`): settled, parked, to look at again later
//! through the ladder, retried held (only while nothing of its delivery was
//! answered, a few times), or held again because the reference clock says it
//! is not due yet. A delivery whose orders all have their verdicts is acked,
//! after its leftovers left as confirmed messages of their own.
//!
//! A failure of a whole batch is isolated to the order at fault, by what the
//! action error means ([`FailureClass`]):
//!
//! - permanent or transient (the database answered with an error): a batch of
//!   several is split in two, and each half runs as a batch of its own, until
//!   the order at fault is alone; the rest are cancelled on time. A lone
//!   permanent failure is parked with its SQLSTATE; a lone transient one is
//!   retried like any failing order. Neither stops intake or other batches.
//! - unavailable (nothing can succeed now: the database, the order service or
//!   the event exchange is unreachable): nothing is split. The batch waits on
//!   one backoff for the whole session, during which no new batch starts and no
//!   deliveries are taken.

use std::fmt::Display;

use chrono::{TimeDelta, Utc};
use tracing::{info, warn};

use super::Outcome;
use super::acks::State;
use super::decide::Next;
use super::pass::{HeldRetries, ParkedOrder};
use super::session::{Session, SessionError};
use super::work::{Done, Failed, Pending};
use crate::publisher::encode_entry;
use crate::service::CONSUMER;
use crate::service::action::{Action, ActionError};
use crate::service::orders::FailureClass;
use crate::telemetry::RETRIES_TOTAL;

impl<A: Action> Session<'_, A> {
    /// Work finished: record it, send the acks that allows, and isolate or
    /// retry what failed.
    pub(super) async fn on_finished(&mut self, done: Done) -> Result<(), SessionError> {
        match self.record(done)? {
            None => {
                self.worked = true;
                self.outage.on_success();
            }
            Some(failed) => self.on_failed(failed).await?,
        }
        // What finished behind a failed batch need not wait for its retry.
        self.send_acks(false).await
    }

    /// Applies finished work to the passes and the ack tracker; returns the
    /// work that failed. Move-outs of the passes it ends start.
    pub(super) fn record(&mut self, done: Done) -> Result<Option<Failed>, SessionError> {
        match done {
            Done::MovedOut(tag) => {
                self.unacked.forget(tag);
                self.retries.republished();
            }
            Done::Settled(verdicts) => {
                for (pending, next, handled) in verdicts {
                    let tag = pending.tag();
                    self.verdict(pending, next, handled);
                    self.end_pass(tag);
                }
            }
            Done::Failed(failed) => return Ok(Some(failed)),
            Done::BrokerFailed(error) => return Err(error),
        }
        Ok(None)
    }

    /// One order's verdict, into its delivery's pass.
    fn verdict(&mut self, mut pending: Pending, next: Next, handled: Option<super::Handled>) {
        let tag = pending.tag();
        describe(&mut pending, &next);
        let Some(pass) = self.unacked.pass(tag) else {
            return;
        };
        match next {
            Next::Ack(_) => pass.settle(handled),
            Next::Park(reason) => {
                let order = ParkedOrder::Entry {
                    // In a parked copy without trace headers.
                    json: encode_entry(&pending.message, None),
                    order_id: Some(pending.message.order_id.clone()),
                };
                pass.park(order, reason, true);
            }
            Next::Requeue(message, outcome) => pass.again(message, outcome, true),
            Next::Retry(reason) => {
                metrics::counter!(RETRIES_TOTAL.name).increment(1);
                pending.failed();
                let settings = &self.consumer.settings;
                let held = HeldRetries {
                    tries: settings.held_retries,
                    window: settings.held_retry,
                };
                let since = pending
                    .failing_since
                    .unwrap_or_else(std::time::Instant::now);
                if pass.may_retry_held(pending.attempts, since, held) {
                    retrying(&mut pending, RETRY_HELD, &reason);
                    self.unacked.mark(tag, State::Waiting);
                    self.retries.again(pending);
                } else {
                    let delay = self.retries.backoff(pending.attempts);
                    let delay = TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX);
                    let mut again = pending.message.again_at(self.consumer.clock.now() + delay);
                    again.attempts = pending.attempts;
                    retrying(&mut pending, RETRY_LADDER, &reason);
                    pass.again(again, Outcome::RetryRequeued, false);
                }
            }
            // Not due by the reference clock: held for the time it says is
            // left, at most consumer.max_hold_ms at a time. Only a clock that
            // moved between two measurements gets here, and only for as long
            // as it is off.
            Next::Hold(_, left) => {
                let max_hold = self.consumer.settings.max_hold;
                self.unacked.mark(tag, State::Waiting);
                self.backlog.hold_for(pending, left.min(max_hold));
            }
        }
    }

    /// Ends delivery `tag`'s pass once every order in it has its verdict:
    /// acked with the next acks, or its leftovers moved out first.
    pub(super) fn end_pass(&mut self, tag: u64) {
        if let Some(move_out) = self.unacked.end_pass(tag) {
            self.in_flight
                .start(self.link.outbound().move_out(move_out));
        }
    }

    /// Isolates a failure to the order at fault; see the module docs.
    async fn on_failed(&mut self, failed: Failed) -> Result<(), SessionError> {
        metrics::counter!(RETRIES_TOTAL.name).increment(1);
        match failed {
            Failed::Action { batch, error } => self.on_action_failed(batch, error),
            Failed::MoveOut { move_out, error } => {
                let parked = &self.link.outbound().parked_exchange;
                warn!(target: CONSUMER, error = %error,
                    "a leftover of a delivery was not confirmed (is the ladder or the parked \
                     queue declared?); will retry, the delivery stays unacked");
                if error.unroutable_at(parked) {
                    // Someone deleted the parked queue or its binding.
                    self.repair("parked").await?;
                }
                self.retries.move_out(move_out);
            }
        }
        Ok(())
    }

    fn on_action_failed(&mut self, mut batch: Vec<Pending>, error: ActionError) {
        for p in &batch {
            self.unacked.mark(p.tag(), State::Waiting);
        }
        let class = error.class();
        match class {
            FailureClass::Unavailable => {
                warn!(target: CONSUMER, error = %error, orders = batch.len(),
                    "action unavailable; the batch waits and intake pauses");
                self.outage.wait(batch);
            }
            _ if batch.len() > 1 => {
                warn!(target: CONSUMER, error = %error, orders = batch.len(), ?class,
                    "batch failed; splitting it to isolate the order at fault");
                self.backlog.split(batch);
            }
            FailureClass::Permanent => {
                let Some(pending) = batch.pop() else { return };
                let tag = pending.tag();
                self.verdict(pending, Next::Park(error.park_reason()), None);
                self.end_pass(tag);
            }
            FailureClass::Transient => {
                for mut pending in batch {
                    let attempts = pending.attempts;
                    pending.span.in_scope(
                        || warn!(target: CONSUMER, error = %error, attempts, "{FAILED_ALONE}"),
                    );
                    let why: &dyn Display = &error;
                    pending
                        .trace
                        .event(FAILED_ALONE, &[("error", why), ("attempts", &attempts)]);
                    let tag = pending.tag();
                    self.verdict(pending, Next::Retry(error.to_string()), None);
                    self.end_pass(tag);
                }
            }
        }
    }

    /// The database is back (or may be): batches that waited for it run
    /// again first, each as it was; the orders of them that are more than
    /// `topology.catch_up_after_ms` late by now join the catch-up lane.
    pub(super) fn on_retry_due(&mut self) {
        let catch_up = self.consumer.catch_up_after;
        let now = self.consumer.clock.now();
        let mut batches = Vec::new();
        for batch in self.outage.end() {
            let (late, on_time): (Vec<Pending>, Vec<Pending>) = batch.into_iter().partition(|p| {
                let late = (now - p.message.process_at()).to_std().unwrap_or_default();
                !catch_up.is_zero() && late > catch_up
            });
            for pending in late {
                self.backlog.catch_up(pending);
            }
            if !on_time.is_empty() {
                batches.push(on_time);
            }
        }
        self.backlog.resume(batches.into_iter());
    }

    /// Sends the acks the tracker allows now (one `multiple` ack for the
    /// finished front of the window, single ones behind a held delivery; with
    /// `all`, every finished one), then tells the observer about each.
    pub(super) async fn send_acks(&mut self, all: bool) -> Result<(), SessionError> {
        let acks = self.unacked.take(all);
        self.link.ack(acks.multiple_upto, &acks.single).await?;
        if let Some(observer) = &self.consumer.observer {
            let at = Utc::now();
            for mut handled in acks.payloads.into_iter().flatten() {
                handled.at = at;
                let _ = observer.send(handled);
            }
        }
        Ok(())
    }
}

/// What its span says of an order's verdict: the outcome (`retried` for
/// another try, none for a hold; a settled one's was recorded when it was
/// logged, and a second record would repeat it in text logs) and the
/// attempt; a parked order's span fails, with the reason.
fn describe(pending: &mut Pending, next: &Next) {
    let outcome = match next {
        Next::Ack(_) => None,
        Next::Requeue(_, outcome) => Some(outcome.label()),
        Next::Park(reason) => {
            pending.trace.failed(reason);
            Some(Outcome::Parked.label())
        }
        Next::Retry(_) => Some("retried"),
        Next::Hold(..) => return,
    };
    if let Some(outcome) = outcome {
        pending.span.record("outcome", outcome);
        pending.trace.outcome(outcome);
    }
    pending.trace.attempt(pending.attempts.saturating_add(1));
}

/// Says in `pending`'s span that the action will try it again, as `line`
/// says, and why; the line is also an event of its exported span.
fn retrying(pending: &mut Pending, line: &'static str, reason: &str) {
    let attempts = pending.attempts;
    pending
        .span
        .in_scope(|| info!(target: CONSUMER, reason = %reason, attempts, "{line}"));
    let why: &dyn Display = &reason;
    pending
        .trace
        .event(line, &[("reason", why), ("attempts", &attempts)]);
}

/// The lines of an order the action did not take this time, each also an
/// event of its exported span.
const RETRY_HELD: &str = "not now; retrying it held";
const RETRY_LADDER: &str = "not now; it leaves its delivery, through the ladder with its backoff";
const FAILED_ALONE: &str = "action failed for it alone";
