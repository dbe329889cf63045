//! The order service side of a scenario, as the testkit's ledger
//! ([`order_expiry_testkit::ledger`]) runs it on the cluster: orders placed
//! with delays of 2-30 s, every schedule call's outcome kept with its time,
//! and the audit of the orders table against the invariants.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
pub use order_expiry_testkit::ledger::{Call, Figures, Ledger};
use order_expiry_testkit::ledger::{Orders, Pace};

use super::world::ClusterWorld;

/// The publishers' confirm timeout.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// The order service: every 20 ms, an unpaid order due in 2-30 s, scheduled
/// on the URL list with node `publisher` first ([`CONFIRM_TIMEOUT`]) and
/// retried every 200 ms until `schedule()` returns `Ok`; every fourth one is
/// paid right after. Until [`Orders::stop`].
pub fn orders_on(world: &ClusterWorld, publisher: usize) -> Orders {
    let pace = Pace {
        prefix: "c",
        every: Duration::from_millis(20),
        due_from: Duration::from_secs(2),
        due_spread: Duration::from_secs(28),
        retry_every: Duration::from_millis(200),
        give_up_after: Duration::from_secs(60),
    };
    let scheduler = world.scheduler_on(publisher, CONFIRM_TIMEOUT);
    Orders::start(Arc::clone(&world.store), scheduler, pace)
}

/// Waits until every scheduled, unpaid order is due and cancelled, at most
/// `limit` past the last due time; then audits against `recovered` (when the
/// cluster had its majority again: the fault's end for the bound).
pub async fn settle(
    world: &ClusterWorld,
    ledger: &Ledger,
    recovered: DateTime<Utc>,
    limit: Duration,
) -> Figures {
    order_expiry_testkit::settle(world, ledger, Some(recovered), limit, String::new).await
}
