//! Rates: how much may start per second. [`Rate`] is a token bucket (pure,
//! the clock an argument): the consumer's catch-up lane takes orders from it.
//! [`Pace`] shares one among concurrent callers and can be paused: the HTTP
//! and event actions wait on it before each request or event, and a
//! receiver's `Retry-After` pauses it for everyone.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket: `per_second` tokens a second, at most a tenth of a
/// second's worth (and at least one) saved up, so that no second ever sees
/// more than the rate and a tenth. A rate of 0 is no limit.
#[derive(Debug, Clone)]
pub(crate) struct Rate {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Rate {
    /// Full: its burst may start at once.
    pub(crate) fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second);
        let burst = (per_second / 10.0).max(1.0);
        Self {
            per_second,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Its rate, a second.
    pub(crate) fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Takes `n` more than it gave: the next ones wait for them.
    pub(crate) fn charge(&mut self, n: usize) {
        if !self.is_unlimited() {
            self.tokens -= n as f64;
        }
    }

    /// Whether there is no limit.
    pub(crate) fn is_unlimited(&self) -> bool {
        self.per_second == 0.0
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.last = now;
    }

    /// Takes up to `wanted` tokens at `now`; how many it got.
    pub(crate) fn take(&mut self, wanted: usize, now: Instant) -> usize {
        if self.is_unlimited() {
            return wanted;
        }
        self.refill(now);
        let got = (self.tokens.floor() as usize).min(wanted);
        self.tokens -= got as f64;
        got
    }

    /// How long from `now` until one token is there (zero when one is).
    pub(crate) fn wait(&mut self, now: Instant) -> Duration {
        if self.is_unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        match self.tokens >= 1.0 {
            true => Duration::ZERO,
            false => Duration::from_secs_f64((1.0 - self.tokens) / self.per_second),
        }
    }
}

/// A [`Rate`] shared by concurrent callers, which a receiver can pause.
#[derive(Debug)]
pub(crate) struct Pace {
    state: Mutex<(Rate, Option<Instant>)>,
}

impl Pace {
    /// `per_second` starts a second (0: no limit), not paused.
    pub(crate) fn new(per_second: u32) -> Self {
        Self {
            state: Mutex::new((Rate::new(per_second, Instant::now()), None)),
        }
    }

    /// Waits until one more may start: no pause, and a token.
    pub(crate) async fn ready(&self) {
        loop {
            let wait = {
                let mut state = self.lock();
                let now = Instant::now();
                let (rate, paused) = &mut *state;
                match paused {
                    Some(until) if *until > now => *until - now,
                    _ => match rate.wait(now) {
                        Duration::ZERO => {
                            rate.take(1, now);
                            return;
                        }
                        wait => wait,
                    },
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Nothing starts for `pause` (a receiver's `Retry-After`); a longer
    /// pause already set stays.
    pub(crate) fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause;
        let mut state = self.lock();
        if state.1.is_none_or(|set| set < until) {
            state.1 = Some(until);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Rate, Option<Instant>)> {
        // Never held across an await; nothing panics inside it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_gives_a_tenth_at_once_then_its_rate() {
        let start = Instant::now();
        let mut rate = Rate::new(100, start);
        // A tenth of a second's worth saved up at once, never more than a
        // tenth saved, and at least one.
        assert_eq!(rate.take(500, start), 10);
        assert_eq!(rate.take(10, start), 0);
        assert_eq!(rate.wait(start), Duration::from_millis(10));
        assert_eq!(rate.take(500, start + Duration::from_millis(50)), 5);
        assert_eq!(rate.take(500, start + Duration::from_secs(60)), 10);
        assert_eq!(Rate::new(3, start).take(5, start), 1);
        // A rate of zero is no limit.
        let mut rate = Rate::new(0, start);
        assert_eq!(rate.take(1_000_000, start), 1_000_000);
        assert_eq!(rate.wait(start), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_pace_keeps_its_rate_and_its_pause() {
        let pace = Pace::new(100);
        let start = Instant::now();
        for _ in 0..120 {
            pace.ready().await;
        }
        // 10 at once, then 110 more at 100 a second: 1.1 s, never less.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(1_090), "{took:?}");
        pace.pause(Duration::from_millis(300));
        let paused = Instant::now();
        pace.ready().await;
        assert!(paused.elapsed() >= Duration::from_millis(300));
    }
}
