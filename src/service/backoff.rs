//! Exponential backoff with an upper bound, for reconnects and retries.

use std::time::Duration;

/// Starts at `initial`, doubles on each [`Backoff::next_delay`], never above `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait now; the following one is twice as long.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// The delay before attempt `n + 1` of something retried on its own:
    /// `initial * 2^n`, never above `max`. Pure.
    pub(crate) fn nth(initial: Duration, max: Duration, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        initial.saturating_mul(factor).min(max)
    }

    /// Back to the initial delay after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets_and_the_nth_delay_is_the_same() {
        let (initial, max) = (Duration::from_millis(100), Duration::from_millis(350));
        let mut b = Backoff::new(initial, max);
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        let got: Vec<u128> = (0..4)
            .map(|n| Backoff::nth(initial, max, n).as_millis())
            .collect();
        assert_eq!(got, [100, 200, 350, 350]);
        assert_eq!(Backoff::nth(initial, max, u32::MAX), max);
    }
}
