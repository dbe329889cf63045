//! What finished work does to a session. Work that went through marks its
//! deliveries done, and the ack tracker says which acks to send now; a message
//! the action could not take now (a locked order, a 5xx) is retried alone, one
//! it never can (a 4xx) parked, one to look at again later sent through the
//! ladder, one the reference clock says is not due yet held again. A failure of a whole batch is isolated to the order at fault, by
//! what the action error means ([`FailureClass`]):
//!
//! - permanent or transient (the database answered with an error): a batch of
//!   several is split in two, and each half runs as a batch of its own, until
//!   the order at fault is alone; the rest are cancelled and acked on time. A
//!   lone permanent failure is parked with its SQLSTATE; a lone transient one
//!   is retried alone on its own backoff. Neither stops intake or other batches.
//! - unavailable (nothing can succeed now: the database, the order service or
//!   the event exchange is unreachable): nothing is split. The batch waits on
//!   one backoff for the whole session, during which no new batch starts and no
//!   deliveries are taken.

use chrono::Utc;
use tracing::{info, warn};

use super::acks::State;
use super::outbound::{OutboundError, Republish};
use super::session::{Session, SessionError};
use super::work::{Done, Failed, Pending};
use crate::service::CONSUMER;
use crate::service::action::{Action, ActionError};
use crate::service::orders::FailureClass;
use crate::telemetry::RETRIES_TOTAL;

impl<A: Action> Session<'_, A> {
    /// Work finished: record it in the ack tracker, send the acks that allows,
    /// and isolate or retry what failed.
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

    /// Applies finished work to the ack tracker; returns the work that failed.
    /// Messages to retry go to their own timers; parks and re-queues start.
    pub(super) fn record(&mut self, done: Done) -> Result<Option<Failed>, SessionError> {
        match done {
            Done::Republished(tag) => {
                self.unacked.forget(tag);
                self.retries.republished();
            }
            Done::PartMovedOut { tag, handled } => {
                self.unacked.settle(tag, handled);
                self.retries.republished();
            }
            Done::Settled {
                handled,
                retry,
                park,
                requeue,
                hold,
            } => {
                for (tag, handled) in handled {
                    self.unacked.settle(tag, handled);
                }
                for (pending, reason) in retry {
                    metrics::counter!(RETRIES_TOTAL.name).increment(1);
                    pending.span.in_scope(|| {
                        info!(target: CONSUMER, reason = %reason, attempts = pending.attempts,
                            "not now; retrying it alone")
                    });
                    self.retry_alone(pending);
                }
                for (pending, reason) in park {
                    self.unacked.mark(pending.tag(), State::Waiting);
                    self.in_flight
                        .start(self.link.outbound().park(pending.original(), reason));
                }
                for (pending, message, outcome) in requeue {
                    self.unacked.mark(pending.tag(), State::Waiting);
                    self.in_flight
                        .start(self.link.outbound().requeue(pending, message, outcome));
                }
                // Not due by the reference clock: held for the time it says
                // is left, at most consumer.max_hold_ms at a time.
                let max_hold = self.consumer.settings.max_hold;
                for (pending, left) in hold {
                    self.unacked.mark(pending.tag(), State::Waiting);
                    self.backlog.hold_for(pending, left.min(max_hold));
                }
            }
            Done::Failed(failed) => return Ok(Some(failed)),
            Done::BrokerFailed(error) => return Err(error),
        }
        Ok(None)
    }

    /// Isolates a failure to the order at fault; see the module docs.
    async fn on_failed(&mut self, failed: Failed) -> Result<(), SessionError> {
        metrics::counter!(RETRIES_TOTAL.name).increment(1);
        match failed {
            Failed::Action { batch, error } => self.on_action_failed(batch, error),
            Failed::Republish {
                original,
                what,
                error,
            } => {
                let unroutable = matches!(error, OutboundError::Unroutable { .. });
                match &what {
                    Republish::Park(_) => {
                        warn!(target: CONSUMER, error = %error, "parking failed; will retry");
                        if unroutable {
                            // Someone deleted the parked queue or its binding.
                            self.repair("parked").await?;
                        }
                    }
                    Republish::Requeue(message, _) => {
                        warn!(target: CONSUMER, error = %error, order_id = %message.order_id,
                            "sending a message through the ladder again failed (is the ladder \
                             declared?); will retry, the delivery stays unacked");
                    }
                }
                self.retries.republish(original, what);
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
                let reason = error.park_reason();
                self.in_flight
                    .start(self.link.outbound().park(pending.original(), reason));
            }
            FailureClass::Transient => {
                for pending in batch {
                    pending.span.in_scope(|| {
                        warn!(target: CONSUMER, error = %error, attempts = pending.attempts,
                            "action failed; retrying it alone")
                    });
                    self.retry_alone(pending);
                }
            }
        }
    }

    /// Retries one message alone after its own backoff; it does not pin the
    /// ack window meanwhile.
    fn retry_alone(&mut self, pending: Pending) {
        self.unacked.mark(pending.tag(), State::Waiting);
        self.retries.again(pending);
    }

    /// The database is back (or may be): batches that waited for it run
    /// again first, each as it was.
    pub(super) fn on_retry_due(&mut self) {
        self.backlog.resume(self.outage.end());
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
