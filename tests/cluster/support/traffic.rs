//! The order service side of a scenario, as the testkit's ledger
//! ([`order_expiry_testkit::ledger`]) runs it on the cluster: orders placed
//! with delays of 2-30 s, every schedule call's outcome kept with its time,
//! and the audit of the orders table against the invariants.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use order_expiry::{Scheduler, service::PgOrderStore};
use order_expiry_testkit::OrderRow;
pub use order_expiry_testkit::ledger::{Call, Figures, Ledger};
use order_expiry_testkit::ledger::{Orders, Pace};
use tokio_util::sync::CancellationToken;

use super::world::ClusterWorld;

/// The publishers' confirm timeout.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// The order service: every `every`, an unpaid order due in 2-30 s, scheduled
/// and retried every 200 ms until `schedule()` returns `Ok`; every fourth one
/// is paid right after. Until `stop`.
pub async fn order_service(
    store: Arc<PgOrderStore>,
    scheduler: Arc<Scheduler>,
    every: Duration,
    stop: CancellationToken,
) -> Ledger {
    let pace = Pace {
        prefix: "c",
        every,
        due_from: Duration::from_secs(2),
        due_spread: Duration::from_secs(28),
        retry_every: Duration::from_millis(200),
        give_up_after: Duration::from_secs(60),
    };
    order_expiry_testkit::order_service(store, scheduler, pace, stop).await
}

/// [`order_service`] every 20 ms, publishing on the URL list with node
/// `publisher` first ([`CONFIRM_TIMEOUT`]), until [`Orders::stop`].
pub fn orders_on(world: &ClusterWorld, publisher: usize) -> Orders {
    let store = Arc::clone(&world.store);
    let scheduler = world.scheduler_on(publisher, CONFIRM_TIMEOUT);
    Orders::spawn(scheduler, move |scheduler, stop| {
        order_service(store, scheduler, Duration::from_millis(20), stop)
    })
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

/// Every order row (retrying a failed read for up to 30 s).
pub async fn rows(world: &ClusterWorld) -> HashMap<String, OrderRow> {
    world.rows().await
}
