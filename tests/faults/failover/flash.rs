//! Scenario 3: the primary is killed in the middle of a flash sale: 10,000
//! orders (bundles on, as by default) due within 10 s, the kill when about
//! 4 s of them have come due, the standby promoted 2 s later.

use std::time::Duration;

use order_expiry_testkit::pg_pair::Replication;

use super::run::Scenario;
use crate::support::{Ledger, ids, orders};

const ORDERS: usize = 10_000;
/// `serve`'s count of due messages (each a bundle of orders).
const PER_MESSAGE: &str = "order_expiry_orders_per_message_count";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: scripts/test --long"]
async fn primary_killed_mid_flash_sale_every_order_cancelled_within_ten_seconds() {
    let s = Scenario::start("failover: flash sale", Replication::Sync, &[]).await;
    // Due from 10 s to 20 s after the start, in no order; one in ten paid.
    let orders = orders("s", ORDERS, |i| 10_000 + (i * 7_919) % 10_000);
    s.world.create_orders(&orders).await;
    let results = s.scheduler.schedule_many(orders.iter().cloned()).await;
    let paid: Vec<&str> = ids(&orders).into_iter().step_by(10).collect();
    let client = s.world.connect().await.expect("database");
    let update = "UPDATE orders SET status = 'paid', paid_at = now() WHERE id = ANY($1)";
    client.execute(update, &[&paid]).await.expect("pay");
    let mut ledger = Ledger::default();
    for (i, ((id, due), result)) in orders.iter().zip(&results).enumerate() {
        ledger.add(id, *due, result.is_ok(), i % 10 == 0);
    }
    let bundles = s.served.metric(PER_MESSAGE).await;

    let timeline = s.kill_and_promote(Duration::from_secs(14)).await;

    let end = s.settle(&timeline, &ledger, Duration::from_secs(120)).await;
    let messages = s.served.metric(PER_MESSAGE).await - bundles;
    end.print(
        "failover: primary killed -9 mid flash sale, standby promoted 2 s later (synchronous)",
        &format!("due messages {messages} for {ORDERS} orders"),
    );
    end.assert_promises(&s).await;
    s.finish().await;
}
