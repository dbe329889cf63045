//! The end of a session: stop taking deliveries; after a shutdown, let work in
//! flight finish (bounded by `consumer.drain_timeout_ms`) and ack what finished;
//! then close the channels, which returns every unacked delivery (held, ready,
//! failed, unfinished) to the queue for the next consumer.

use lapin::options::BasicCancelOptions;
use tracing::{info, warn};

use super::session::Session;
use crate::amqp;
use crate::service::CONSUMER;
use crate::service::action::Action;

impl<A: Action> Session<'_, A> {
    /// Closes the session; with `drain`, after the drain.
    pub(super) async fn close(mut self, drain: bool) {
        let timeout = self.consumer.amqp.timeout;
        let cancel = self
            .channel
            .basic_cancel(self.tag.as_str().into(), BasicCancelOptions::default());
        let _ = amqp::bounded("basic.cancel", timeout, cancel).await;
        if drain {
            self.drain().await;
        }
        let channel = self.channel.close(200, "shutdown".into());
        let _ = amqp::bounded("channel.close", timeout, channel).await;
        let outbound = self.outbound.channel.close(200, "shutdown".into());
        let _ = amqp::bounded("channel.close", timeout, outbound).await;
        let connection = self.connection.close(200, "shutdown".into());
        let _ = amqp::bounded("connection.close", timeout, connection).await;
    }

    /// Waits for work in flight (bounded), then acks every finished delivery.
    async fn drain(&mut self) {
        let drain = self.consumer.settings.drain_timeout;
        let mut failed = 0;
        let finishing = async {
            while let Some(done) = futures::StreamExt::next(&mut self.in_flight).await {
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
        let waiting: usize = self
            .outage
            .waiting()
            .iter()
            .chain(&self.split)
            .map(Vec::len)
            .sum();
        let released = self.ready.len() + self.held.len() + self.retrying.len() + waiting + failed;
        info!(target: CONSUMER, released, "drained");
    }
}
