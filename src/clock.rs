//! The time by a reference clock. "Never early" is judged by the clock of the
//! order's own database (or, with the HTTP action, the order service's), not
//! by the clock of the host `serve` runs on, which may be off. A [`Clock`] is
//! this host's clock plus a measured offset to the reference; the consumer
//! holds and releases orders by it, and the outbox relay computes delays by
//! it. The offset is measured elsewhere (`service::clock`) and set here.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, TimeDelta, Utc};

/// This host's clock corrected by a measured offset to a reference clock.
/// Cheap to clone: clones share one offset, so that whoever measures it
/// corrects every reader at once.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    /// Reference minus local, in microseconds.
    offset_us: Arc<AtomicI64>,
}

impl Clock {
    /// This host's clock, uncorrected until an offset is set.
    pub fn local() -> Self {
        Self::default()
    }

    /// The time now by the reference clock, as far as it is known.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset()
    }

    /// Reference minus local: positive when this host's clock is behind.
    pub fn offset(&self) -> TimeDelta {
        TimeDelta::microseconds(self.offset_us.load(Ordering::Relaxed))
    }

    /// Sets the offset measured to the reference.
    pub(crate) fn set_offset(&self, offset: TimeDelta) {
        let micros = offset.num_microseconds().unwrap_or(0);
        self.offset_us.store(micros, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_offset() {
        let clock = Clock::local();
        let reader = clock.clone();
        assert_eq!(reader.offset(), TimeDelta::zero());
        clock.set_offset(TimeDelta::milliseconds(-5_000));
        assert_eq!(reader.offset(), TimeDelta::milliseconds(-5_000));
        let behind = Utc::now() - reader.now();
        let window = TimeDelta::milliseconds(4_990)..=TimeDelta::milliseconds(5_010);
        assert!(window.contains(&behind), "{behind}");
    }
}
