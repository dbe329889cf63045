//! What finished work does to a session: a batch or park that went through
//! marks its deliveries done, and the ack tracker says which acks to send now; a
//! failure keeps its deliveries unacked and sets a retry timer with backoff,
//! during which no new deliveries are taken.

use chrono::Utc;
use lapin::options::BasicAckOptions;
use tokio::time::Instant;
use tracing::warn;

use super::acks::State;
use super::session::{Session, SessionError};
use super::work::{Done, Failed};
use crate::amqp;
use crate::service::CONSUMER;
use crate::service::orders::OrderStore;
use crate::telemetry::RETRIES_TOTAL;

impl<S: OrderStore> Session<'_, S> {
    /// Work finished: record it in the ack tracker, send the acks that allows,
    /// and schedule a retry if it failed.
    pub(super) async fn on_finished(&mut self, done: Done) -> Result<(), SessionError> {
        match self.record(done)? {
            None => {
                self.worked = true;
                self.retry_backoff.reset();
            }
            Some(failed) => self.on_failed(failed),
        }
        // What finished behind a failed batch need not wait for its retry.
        self.send_acks(false).await
    }

    /// Applies finished work to the ack tracker; returns the work that failed.
    pub(super) fn record(&mut self, done: Done) -> Result<Option<Failed>, SessionError> {
        match done {
            Done::Parked(tag) => self.acks.forget(tag),
            Done::Cancelled(handled) => {
                for (tag, handled) in handled {
                    self.acks.set(tag, State::Done, handled);
                }
            }
            Done::Failed(failed) => return Ok(Some(failed)),
            Done::BrokerFailed(error) => return Err(error),
        }
        Ok(None)
    }

    /// Keeps failed work (its deliveries unacked) for a retry after a backoff.
    fn on_failed(&mut self, failed: Failed) {
        match &failed {
            Failed::Store { batch, error } => {
                warn!(target: CONSUMER, error = %error, orders = batch.len(), "database failed; will retry");
                for p in batch {
                    self.acks.set(p.tag(), State::Waiting, None);
                }
            }
            Failed::Park { error, .. } => {
                warn!(target: CONSUMER, error = %error, "parking failed; will retry")
            }
        }
        metrics::counter!(RETRIES_TOTAL.name).increment(1);
        self.failed.push(failed);
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.retry_backoff.next_delay());
        }
    }

    /// The retry timer fired: failed batches go back to the front of the ready
    /// queue, failed parks run again.
    pub(super) fn on_retry_due(&mut self) {
        self.retry_at = None;
        for failed in std::mem::take(&mut self.failed) {
            match failed {
                Failed::Store { batch, .. } => {
                    for p in batch.into_iter().rev() {
                        self.ready.push_front(p);
                    }
                }
                Failed::Park {
                    delivery, reason, ..
                } => {
                    self.in_flight.push(self.parking.park(*delivery, reason));
                }
            }
        }
    }

    /// Sends the acks the tracker allows now (one `multiple` ack for the
    /// finished front of the window, single ones behind a held delivery; with
    /// `all`, every finished one), then tells the observer about each.
    pub(super) async fn send_acks(&mut self, all: bool) -> Result<(), SessionError> {
        let acks = self.acks.take(all);
        let channel = &self.channel;
        let sending = async {
            if let Some(tag) = acks.multiple_upto {
                channel
                    .basic_ack(tag, BasicAckOptions { multiple: true })
                    .await?;
            }
            let singles = acks
                .single
                .iter()
                .map(|tag| channel.basic_ack(*tag, BasicAckOptions::default()));
            futures::future::try_join_all(singles).await.map(drop)
        };
        amqp::bounded("basic.ack", self.consumer.amqp.timeout, sending).await?;
        if let Some(observer) = &self.consumer.observer {
            let at = Utc::now();
            for mut handled in acks.payloads {
                handled.at = at;
                let _ = observer.send(handled);
            }
        }
        Ok(())
    }
}
