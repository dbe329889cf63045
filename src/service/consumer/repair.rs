//! Self-healing of the consumer's own resources. An operator may delete
//! `P.due` or `P.parked` (to clear one), or a binding: a park then comes back
//! unroutable, and the broker ends our consumer of a deleted due queue. Either
//! way the session re-declares its part of the topology (`P.due`, `P.parked` and
//! their bindings, [`Topology::consumer_part`]), logs it, counts it in
//! `order_expiry_repairs_total{what}`, and carries on with what it holds.

use tracing::warn;

use super::session::{Session, SessionError};
use crate::service::CONSUMER;
use crate::service::action::Action;
use crate::telemetry::REPAIRS_TOTAL;

impl<A: Action> Session<'_, A> {
    /// Re-declares the consumer's part of the topology; `what` was found
    /// missing (`due`: the broker ended our consumer; `parked`: a park was
    /// unroutable).
    pub(super) async fn repair(&mut self, what: &'static str) -> Result<(), SessionError> {
        let ladder = &self.consumer.ladder;
        self.link.redeclare(&self.consumer.own_part).await?;
        metrics::counter!(REPAIRS_TOTAL.name, "what" => what).increment(1);
        warn!(target: CONSUMER, what, due = %ladder.due_queue(), parked = %ladder.parked_queue(),
            "re-declared the consumer's queues, exchanges and bindings");
        Ok(())
    }

    /// The broker ended our consumer (its queue was deleted): re-declare and
    /// consume again on the same channel. Held and in-flight deliveries carry
    /// on; if the broker no longer knows their tags, the ack fails, the session
    /// ends and the next one starts over (their orders were cancelled first).
    pub(super) async fn on_consumer_ended(&mut self) -> Result<(), SessionError> {
        if !self.link.is_connected() {
            return Err(SessionError::ConsumerEnded);
        }
        warn!(target: CONSUMER, queue = %self.consumer.ladder.due_queue(),
            "the broker ended our consumer: was the due queue deleted?");
        self.repair("due").await?;
        self.link.resubscribe(self.consumer).await?;
        Ok(())
    }
}
