//! Measuring this host's offset from a reference clock, and keeping the
//! shared [`Clock`] corrected by it.
//!
//! Every reading of a reference clock says where the offset (reference minus
//! local) can be: a reading `r` taken while this host's clock went from `t0`
//! to `t1` allows `[r - t1, r - t0]`; a reading rounded down to the second
//! (an HTTP `Date` header) allows `[r - t1, r + 1 s - t0]`. [`OffsetEstimate`]
//! intersects the recent intervals, newest first, and takes the middle: a
//! timed `SELECT clock_timestamp()` pins the database's offset to within half
//! a round trip at once; `Date` headers at many sub-second phases narrow the
//! order service's to about a round trip after a few dozen answers. Clocks
//! step and drift, so only readings within a window count, and a reading that
//! contradicts the older ones wins over them.
//!
//! [`ClockWatch`] reads the database's clock, or the order service's, at
//! start and every `clock.probe_interval_ms`; the HTTP action also feeds
//! every answer to its estimate. Both publish through [`ClockReport`]: the corrected
//! clock, the gauge `order_expiry_clock_offset_seconds{clock}`, and a warning
//! past `clock.warn_offset_ms`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::service::action::HttpAction;
use crate::service::orders::{OrderStore, PgOrderStore};
use crate::settings::ClockSettings;
use crate::telemetry::CLOCK_OFFSET_SECONDS;

/// Readings of the database's clock per probe; the one with the shortest
/// round trip pins it best.
const READINGS_PER_PROBE: usize = 3;

/// How soon a reference clock is read again while it has never answered (a
/// lost or slow first probe): a whole `clock.probe_interval_ms` of orders held
/// by an unmeasured clock would be late by the whole skew.
const REMEASURE: Duration = Duration::from_millis(250);

/// The offset the readings of a reference clock allow; see the module docs.
#[derive(Debug)]
pub(crate) struct OffsetEstimate {
    window: Duration,
    /// (when it was taken, lowest and highest offset it allows), oldest first.
    readings: VecDeque<(Instant, TimeDelta, TimeDelta)>,
}

/// Where the offset is, as far as the readings tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offset {
    /// The middle of what the readings allow: reference minus local.
    pub(crate) offset: TimeDelta,
    /// Half the width of what they allow: the offset is within this of `offset`.
    pub(crate) error: TimeDelta,
}

impl OffsetEstimate {
    /// Only readings of the last `window` count.
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            readings: VecDeque::new(),
        }
    }

    /// A reading allowing offsets from `lo` to `hi`, taken `at`; the estimate
    /// it leads to.
    pub(crate) fn observe(&mut self, at: Instant, lo: TimeDelta, hi: TimeDelta) -> Offset {
        let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        self.readings.push_back((at, lo, hi));
        while let Some((taken, ..)) = self.readings.front() {
            if at.saturating_duration_since(*taken) <= self.window {
                break;
            }
            self.readings.pop_front();
        }
        // Newest first: an older reading that contradicts the newer ones
        // (the clock stepped) is left out, with everything older still.
        let (mut low, mut high) = (lo, hi);
        for (_, l, h) in self.readings.iter().rev().skip(1) {
            let (l, h) = (low.max(*l), high.min(*h));
            if l > h {
                break;
            }
            (low, high) = (l, h);
        }
        Offset {
            offset: low + (high - low) / 2,
            error: (high - low) / 2,
        }
    }
}

/// The bounds one reading `reference` of a clock allows, taken while this
/// host's clock went from `sent` for `round_trip`; `resolution` is how much
/// the reading may have been rounded down (a second for an HTTP `Date`).
pub(crate) fn reading_bounds(
    reference: DateTime<Utc>,
    sent: DateTime<Utc>,
    round_trip: Duration,
    resolution: TimeDelta,
) -> (TimeDelta, TimeDelta) {
    let received = sent + TimeDelta::from_std(round_trip).unwrap_or(TimeDelta::MAX);
    (reference - received, reference + resolution - sent)
}

/// Publishes what is measured about one reference clock: the corrected
/// [`Clock`], the gauge, and a warning when the offset is large.
#[derive(Debug)]
pub(crate) struct ClockReport {
    clock: Clock,
    /// The `clock` label: `database` or `http`.
    label: &'static str,
    warn_above: TimeDelta,
    /// The offset last warned about, while it stays large.
    warned: Option<TimeDelta>,
    /// Set the clock to the latest time the reference could read (`offset +
    /// error`) rather than the middle: see [`ClockReport::leaning_ahead`].
    lean_ahead: bool,
}

impl ClockReport {
    pub(crate) fn new(clock: Clock, label: &'static str, settings: &ClockSettings) -> Self {
        Self {
            clock,
            label,
            warn_above: TimeDelta::from_std(settings.warn_offset).unwrap_or(TimeDelta::MAX),
            warned: None,
            lean_ahead: false,
        }
    }

    /// Corrects the clock to the latest time the reference could read, not
    /// the middle of what the readings allow: for a reference that refuses
    /// an early request and says exactly how early (an order service's 425).
    /// While the offset is known only to a second (`Date` headers), an
    /// order released by the middle could be half a second late; released
    /// at the edge it is at worst early, refused, and the refusal's time left
    /// pins the offset to the millisecond.
    pub(crate) fn leaning_ahead(mut self) -> Self {
        self.lean_ahead = true;
        self
    }

    /// Sets the clock and the gauge to `measured`; warns when the offset is
    /// past `clock.warn_offset_ms` (again when it moved by as much since the
    /// last warning), and says when it is back under.
    pub(crate) fn publish(&mut self, measured: Offset) {
        let Offset { offset, error } = measured;
        self.clock.set_offset(match self.lean_ahead {
            true => offset + error,
            false => offset,
        });
        let seconds = offset.num_microseconds().unwrap_or(0) as f64 / 1e6;
        metrics::gauge!(CLOCK_OFFSET_SECONDS.name, "clock" => self.label).set(seconds);
        let (offset_ms, error_ms) = (offset.num_milliseconds(), error.num_milliseconds());
        let clock = self.label;
        if offset.abs() > self.warn_above {
            if self
                .warned
                .is_none_or(|last| (offset - last).abs() > self.warn_above)
            {
                warn!(
                    clock,
                    offset_ms,
                    error_ms,
                    "this host's clock is off from the reference clock; orders are held and \
                     released by the corrected time (offset = reference - this host)"
                );
                self.warned = Some(offset);
            }
        } else if self.warned.take().is_some() {
            info!(
                clock,
                offset_ms, error_ms, "clock offset back under clock.warn_offset_ms"
            );
        } else {
            debug!(clock, offset_ms, error_ms, "clock offset measured");
        }
    }
}

/// Reads a reference clock at start and every `clock.probe_interval_ms`, and
/// keeps its [`Clock`] corrected: the order database's (timed `SELECT
/// clock_timestamp()`) or the order service's (`HEAD {base_url}`'s `Date`,
/// beside what every expire's answer tells).
#[derive(Debug)]
pub(crate) struct ClockWatch {
    source: Source,
    interval: Duration,
}

#[derive(Debug)]
enum Source {
    Database {
        store: Arc<PgOrderStore>,
        estimate: OffsetEstimate,
        report: ClockReport,
    },
    OrderService(HttpAction),
}

impl ClockWatch {
    /// The database's clock, read through `store`, whose clock it corrects.
    pub(crate) fn database(store: Arc<PgOrderStore>, settings: &ClockSettings) -> Self {
        let report = ClockReport::new(OrderStore::clock(store.as_ref()), "database", settings);
        let source = Source::Database {
            store,
            // Only the latest probe's readings count: the database's are
            // exact enough on their own, and older ones only add drift.
            estimate: OffsetEstimate::new(settings.probe_interval / 2),
            report,
        };
        Self {
            source,
            interval: settings.probe_interval,
        }
    }

    /// The order service's clock, read by the HTTP action, whose clock it corrects.
    pub(crate) fn order_service(http: HttpAction, settings: &ClockSettings) -> Self {
        Self {
            source: Source::OrderService(http),
            interval: settings.probe_interval,
        }
    }

    /// The clock this keeps corrected.
    pub(crate) fn clock(&self) -> Clock {
        match &self.source {
            Source::Database { store, .. } => OrderStore::clock(store.as_ref()),
            Source::OrderService(http) => http.clock(),
        }
    }

    /// One probe. The database is read a few times, and the reading with
    /// the shortest round trip pins it best; an unreachable reference keeps
    /// the last offset. Whether the reference answered with its time.
    pub(crate) async fn probe(&mut self) -> bool {
        let (store, estimate, report) = match &mut self.source {
            Source::OrderService(http) => return http.probe_clock().await,
            Source::Database {
                store,
                estimate,
                report,
            } => (store, estimate, report),
        };
        let mut best: Option<Offset> = None;
        for _ in 0..READINGS_PER_PROBE {
            match store.read_clock().await {
                Ok((reference, sent, round_trip)) => {
                    let (lo, hi) = reading_bounds(reference, sent, round_trip, TimeDelta::zero());
                    best = Some(estimate.observe(Instant::now(), lo, hi));
                }
                Err(error) => {
                    debug!(%error, "cannot read the database's clock; keeping the last offset");
                    break;
                }
            }
        }
        if let Some(offset) = best {
            report.publish(offset);
        }
        best.is_some()
    }

    /// Probes every interval until `shutdown`; every [`REMEASURE`] instead
    /// while the reference has not answered once (`measured` says whether
    /// the first probe did): until then orders are held by this host's
    /// uncorrected clock, late by as much as it is behind.
    pub(crate) async fn run(mut self, mut measured: bool, shutdown: CancellationToken) {
        loop {
            let wait = match measured {
                true => self.interval,
                false => REMEASURE.min(self.interval),
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => measured |= self.probe().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: i64) -> TimeDelta {
        TimeDelta::milliseconds(n)
    }

    fn offset(offset: i64, error: i64) -> Offset {
        Offset {
            offset: ms(offset),
            error: ms(error),
        }
    }

    #[test]
    fn a_timed_reading_pins_the_offset_within_half_its_round_trip() {
        let sent: DateTime<Utc> = "2026-12-04T10:00:00Z".parse().unwrap();
        // The reference read 10:00:05.002 while this host went 10:00:00.000-.004.
        let reference = sent + ms(5_002);
        let (lo, hi) = reading_bounds(reference, sent, Duration::from_millis(4), ms(0));
        assert_eq!((lo, hi), (ms(4_998), ms(5_002)));
        let mut estimate = OffsetEstimate::new(Duration::from_secs(10));
        let found = estimate.observe(Instant::now(), lo, hi);
        assert_eq!(found, offset(5_000, 2));
    }

    #[test]
    fn second_resolution_readings_narrow_as_they_come_at_other_phases() {
        // The reference is 1,234 ms ahead; Date headers drop the milliseconds.
        let truth = ms(1_234);
        let start: DateTime<Utc> = "2026-12-04T10:00:00Z".parse().unwrap();
        let mut estimate = OffsetEstimate::new(Duration::from_secs(60));
        let now = Instant::now();
        let mut found = None;
        for i in 0..40 {
            let sent = start + ms(i * 137);
            let reference = sent + ms(1) + truth; // read 1 ms into a 2 ms round trip
            let date = reference - ms(reference.timestamp_subsec_millis().into());
            let (lo, hi) = reading_bounds(date, sent, Duration::from_millis(2), ms(1_000));
            let o = estimate.observe(now + Duration::from_millis(i as u64 * 137), lo, hi);
            let pinned = o.offset - o.error..=o.offset + o.error;
            assert!(pinned.contains(&truth), "{o:?}");
            found = Some(o);
        }
        let error = found.unwrap().error;
        assert!(error <= ms(30), "still ±{error}");
    }

    #[test]
    fn a_clock_that_stepped_is_believed_at_once_and_old_readings_no_longer_count() {
        let mut estimate = OffsetEstimate::new(Duration::from_secs(60));
        let now = Instant::now();
        estimate.observe(now, ms(-10), ms(10));
        let stepped = estimate.observe(now + Duration::from_secs(1), ms(4_990), ms(5_010));
        assert_eq!(stepped, offset(5_000, 10));
        // A reading older than the window no longer counts.
        let mut estimate = OffsetEstimate::new(Duration::from_secs(5));
        estimate.observe(now, ms(0), ms(2));
        let later = estimate.observe(now + Duration::from_secs(6), ms(-100), ms(100));
        assert_eq!(later, offset(0, 100));
    }
}
