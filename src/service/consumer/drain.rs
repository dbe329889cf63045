//! The end of a session: stop taking deliveries; after a shutdown, let work in
//! flight finish (bounded by `consumer.drain_timeout_ms`) and ack what finished;
//! then close the channels, which returns every unacked delivery (held, ready,
//! failed, unfinished) to the queue for the next consumer.

use tracing::{info, warn};

use super::session::Session;
use crate::service::CONSUMER;
use crate::service::action::Action;

impl<A: Action> Session<'_, A> {
    /// Closes the session; with `drain`, after the drain.
    pub(super) async fn close(mut self, drain: bool) {
        self.link.cancel().await;
        if drain {
            self.drain().await;
        }
        self.link.close().await;
    }

    /// Leaves the node without closing each consumer and channel (see
    /// `Link::abandon`); nothing is acked, so every delivery comes back.
    pub(super) fn abandon(self) {
        self.link.abandon();
    }

    /// Waits for work in flight (bounded), then acks every finished delivery.
    async fn drain(&mut self) {
        let drain = self.consumer.settings.drain_timeout;
        let mut failed = 0;
        let finishing = async {
            while let Some(done) = self.in_flight.next().await {
                // A broker failure now only means those deliveries come back.
                if let Ok(Some(f)) = self.record(done) {
                    failed += f.deliveries();
                }
            }
        };
        if tokio::time::timeout(drain, finishing).await.is_err() {
            warn!(target: CONSUMER, ?drain, "drain timeout: releasing unfinished deliveries");
        }
        if let Err(error) = self.send_acks(true).await {
            warn!(target: CONSUMER, %error, "acks at shutdown failed; those deliveries come back");
        }
        let waiting: usize = self.outage.waiting().iter().map(Vec::len).sum();
        let released = self.backlog.orders() + self.retries.len() + waiting + failed;
        info!(target: CONSUMER, released, "drained");
    }
}
