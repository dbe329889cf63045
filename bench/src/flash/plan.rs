//! The sale's orders: which, when each is created, when each is due.

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

/// The sale's orders: `F-<i>`, created `within * i / orders` after `t0`, due
/// `window` later, in whole milliseconds (as messages carry them, so the
/// deadline rule compares equal times).
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Orders.
    pub(super) orders: usize,
    /// When the sale started (the first order's creation).
    t0: DateTime<Utc>,
    /// The same instant on the monotonic clock.
    pub(super) start: Instant,
    within_ms: i64,
    window_ms: i64,
}

impl Plan {
    /// A sale starting now.
    pub(super) fn new(orders: usize, within: Duration, window: Duration) -> anyhow::Result<Self> {
        let now = Utc::now();
        let t0 = DateTime::from_timestamp_millis(now.timestamp_millis()).context("the clock")?;
        Ok(Self {
            orders,
            t0,
            start: Instant::now(),
            within_ms: i64::try_from(within.as_millis())?,
            window_ms: i64::try_from(window.as_millis())?,
        })
    }

    /// Order `i`'s id.
    pub(super) fn id(i: usize) -> String {
        format!("F-{i}")
    }

    fn created_ms(&self, i: usize) -> i64 {
        (self.within_ms as f64 * i as f64 / self.orders.max(1) as f64) as i64
    }

    /// When order `i` is created.
    pub(super) fn created(&self, i: usize) -> Instant {
        self.start + Duration::from_millis(self.created_ms(i).max(0) as u64)
    }

    /// Order `i`'s due time.
    pub(super) fn due_at(&self, i: usize) -> DateTime<Utc> {
        self.t0 + TimeDelta::milliseconds(self.created_ms(i) + self.window_ms)
    }

    /// Every order with its due time.
    pub(super) fn all(&self) -> impl Iterator<Item = (String, DateTime<Utc>)> + '_ {
        (0..self.orders).map(|i| (Self::id(i), self.due_at(i)))
    }

    /// When the last order is due.
    pub(super) fn last_due(&self) -> Instant {
        self.start + Duration::from_millis((self.within_ms + self.window_ms).max(0) as u64)
    }
}
