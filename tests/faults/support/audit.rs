//! The audit of the testkit's ledger ([`order_expiry_testkit::ledger`]) as the
//! fault tests run it: settling on the one test broker, whose queues say
//! where a missing order's message is.

use std::time::Duration;

pub use order_expiry_testkit::ledger::{Figures, Ledger, Pace, Placed};

use super::World;

/// The broker tests' order service: an order every `every`, due in 1-6 s,
/// a failed `schedule()` retried every 100 ms for up to 300 s past due (a
/// RabbitMQ 4.0 node carrying the ballast took 78 s to come back from a
/// kill -9 on a busy machine).
pub fn pace(every: Duration) -> Pace {
    Pace {
        prefix: "o",
        every,
        due_from: Duration::from_secs(1),
        due_spread: Duration::from_secs(5),
        retry_every: Duration::from_millis(100),
        give_up_after: Duration::from_secs(300),
    }
}

/// Waits until every scheduled, unpaid order is due and resolved (at most
/// `limit` past the last due time), then audits the table.
pub async fn settle(world: &World, ledger: &Ledger, limit: Duration) -> Figures {
    let progress = || format!("queues {}", world.queue_report());
    order_expiry_testkit::settle(world, ledger, None, limit, progress).await
}
