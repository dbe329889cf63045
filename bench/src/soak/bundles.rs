//! Orders per due message over the soak, read from each `serve`'s
//! `order_expiry_orders_per_message` histogram every 10 s. A `serve` killed
//! by a fault loses its counters: its last reading (at most 10 s old) stands
//! for it, so the totals are a little short of what the consumers decoded.

use std::collections::BTreeMap;
use std::time::Duration;

use order_expiry_testkit::{http_get, metric_value};
use tokio_util::sync::CancellationToken;

use super::world::SoakWorld;

/// How often to read.
const EVERY: Duration = Duration::from_secs(10);

const METRIC: &str = "order_expiry_orders_per_message";

/// One reading of one `serve`'s histogram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Bundling {
    /// Due messages decoded.
    pub(super) messages: u64,
    /// Orders in them.
    pub(super) orders: u64,
    /// Messages that carried more than one order: bundles.
    pub(super) bundles: u64,
}

impl Bundling {
    /// The reading in a `/metrics` text.
    pub(super) fn read(text: &str) -> Self {
        let count = |series: &str| metric_value(text, series) as u64;
        let messages = count(&format!("{METRIC}_count"));
        Self {
            messages,
            orders: count(&format!("{METRIC}_sum")),
            bundles: messages.saturating_sub(count(&format!("{METRIC}_bucket{{le=\"1\"}}"))),
        }
    }

    /// Orders that came in bundles: all but those of the one-order messages.
    pub(super) fn bundled_orders(self) -> u64 {
        self.orders
            .saturating_sub(self.messages.saturating_sub(self.bundles))
    }

    /// Orders per message, 0 before any.
    pub(super) fn mean(self) -> f64 {
        if self.messages == 0 {
            0.0
        } else {
            self.orders as f64 / self.messages as f64
        }
    }
}

/// Reads every running `serve` until `stop`; the sum of each one's last
/// reading (a restarted `serve` is a new one).
pub(super) async fn watch(world: &SoakWorld, stop: CancellationToken) -> Bundling {
    let mut last: BTreeMap<(String, u32), Bundling> = BTreeMap::new();
    loop {
        for (name, pid, addr) in world.running_serves().await {
            if let Some((200, text)) = http_get(addr, "/metrics").await {
                last.insert((name, pid), Bundling::read(&text));
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
    last.into_values()
        .fold(Bundling::default(), |a, b| Bundling {
            messages: a.messages + b.messages,
            orders: a.orders + b.orders,
            bundles: a.bundles + b.bundles,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_messages_orders_and_bundles_off_the_histogram() {
        let text = "\
# TYPE order_expiry_orders_per_message histogram
order_expiry_orders_per_message_bucket{le=\"1\"} 40
order_expiry_orders_per_message_bucket{le=\"2\"} 41
order_expiry_orders_per_message_bucket{le=\"+Inf\"} 50
order_expiry_orders_per_message_sum 700
order_expiry_orders_per_message_count 50
";
        let b = Bundling::read(text);
        assert_eq!(
            b,
            Bundling {
                messages: 50,
                orders: 700,
                bundles: 10
            }
        );
        assert!((b.mean() - 14.0).abs() < 1e-9);
        assert_eq!(b.bundled_orders(), 660);
        assert_eq!(Bundling::read(""), Bundling::default());
    }
}
