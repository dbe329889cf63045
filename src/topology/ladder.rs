//! The delay ladder: pure arithmetic from a delay to where a message enters the
//! broker, and the names of every level.
//!
//! A delay of `d` whole seconds is written in binary. Level `L` holds a message for
//! exactly `2^L` seconds (a queue-level TTL, the same for every message in that
//! queue, so arrival order is expiry order). A message passes through level `L` only
//! when bit `L` of `d` is set, so the TTLs it waits add up to exactly `d`.
//!
//! The routing key carries the bits, most significant first, one word per level:
//! with 4 levels, 5 s is `0.1.0.1`. The message keeps that key as it is
//! dead-lettered from level to level, and each level's topic exchange sends it either
//! into its own queue (bit set) or down to the next exchange (bit clear).

use std::fmt;

use thiserror::Error;

/// Most levels a ladder may have. RabbitMQ refuses an `x-message-ttl` over
/// ten years, [`BROKER_MAX_TTL_MS`] (`PRECONDITION_FAILED ...
/// value_too_large`), and level `n` holds for 2^n s, so the top level is 28
/// (8.5 years) and the longest delay 2^29 - 1 s (17 years).
pub(crate) const MAX_LEVELS: u8 = 29;

/// The ladder cannot hold a delay this long; `schedule()` reports it rather than
/// clamping, because a silently shortened delay would cancel an order early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("delay of {delay_secs} s is longer than the ladder's maximum of {max_secs} s")]
pub struct DelayTooLong {
    /// The whole seconds that were asked for.
    pub delay_secs: u64,
    /// The longest delay this ladder holds.
    pub max_secs: u64,
}

/// A ladder configuration that cannot exist.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LadderError {
    /// Zero levels could hold nothing; more than 29 gives a level a TTL
    /// RabbitMQ refuses (over ten years).
    #[error("a ladder needs between 1 and {MAX_LEVELS} levels, not {0}")]
    Levels(u8),
    /// The prefix becomes part of every exchange and queue name.
    #[error("topology prefix must be 1-200 characters of [A-Za-z0-9._-], not {0:?}")]
    Prefix(String),
}

/// Where to publish a message so that it reaches the due queue after its delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Exchange to publish to: the level of the highest set bit, or the due
    /// exchange for a delay of zero.
    pub exchange: String,
    /// One word per level, most significant first.
    pub routing_key: String,
    /// The whole seconds the message will wait in the ladder.
    pub delay_secs: u64,
}

/// Names and arithmetic of one ladder, derived from the topology prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    prefix: String,
    levels: u8,
}

impl Ladder {
    /// A ladder of `levels` holding queues whose names start with `prefix`.
    pub fn new(prefix: &str, levels: u8) -> Result<Self, LadderError> {
        if levels == 0 || levels > MAX_LEVELS {
            return Err(LadderError::Levels(levels));
        }
        let valid_prefix = !prefix.is_empty()
            && prefix.len() <= 200
            && prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid_prefix {
            return Err(LadderError::Prefix(prefix.to_owned()));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            levels,
        })
    }

    /// The prefix every name of this ladder starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many holding levels there are.
    pub fn levels(&self) -> u8 {
        self.levels
    }

    /// The longest delay, in whole seconds, the ladder can hold: all bits set.
    pub fn max_delay_secs(&self) -> u64 {
        (1u64 << self.levels) - 1
    }

    /// TTL of level `level`'s holding queue, in milliseconds.
    pub fn level_ttl_ms(level: u8) -> u64 {
        (1u64 << level) * 1000
    }

    /// Name of level `level`'s exchange and of its holding queue (RabbitMQ keeps
    /// exchange and queue names apart, so they can share one).
    pub fn level_name(&self, level: u8) -> String {
        format!("{}.ladder.{level:02}", self.prefix)
    }

    /// The exchange that routes due messages into the due queue.
    pub fn due_exchange(&self) -> String {
        format!("{}.due", self.prefix)
    }

    /// The queue the consumer reads: a message here is due.
    pub fn due_queue(&self) -> String {
        format!("{}.due", self.prefix)
    }

    /// Where a due message goes when no consumer took it within
    /// `topology.catch_up_after_ms` (the due queue's message TTL): the
    /// backlog of an outage, drained at `consumer.catch_up_rate` beside what
    /// is due now.
    pub fn catch_up_exchange(&self) -> String {
        format!("{}.catch-up", self.prefix)
    }

    /// The catch-up queue: the backlog (see [`Ladder::catch_up_exchange`]).
    pub fn catch_up_queue(&self) -> String {
        format!("{}.catch-up", self.prefix)
    }

    /// The exchange the consumer publishes messages it can never process to.
    pub fn parked_exchange(&self) -> String {
        format!("{}.parked", self.prefix)
    }

    /// Where messages that can never be processed are kept for a person to look at.
    pub fn parked_queue(&self) -> String {
        format!("{}.parked", self.prefix)
    }

    /// Where a message dead-letters to when it expires from level `level`.
    pub fn dead_letter_target(&self, level: u8) -> String {
        match level {
            0 => self.due_exchange(),
            _ => self.level_name(level - 1),
        }
    }

    /// The binding patterns of level `level`: the first sends a message with bit
    /// `level` set into the level's queue, the second sends one with it clear to
    /// the exchange below.
    pub fn binding_patterns(&self, level: u8) -> (String, String) {
        let leading = usize::from(self.levels - 1 - level);
        let mut hold = "*.".repeat(leading);
        let mut pass = hold.clone();
        hold.push_str("1.#");
        pass.push_str("0.#");
        (hold, pass)
    }

    /// The routing key for a delay: its bits, most significant first.
    pub fn routing_key(&self, delay_secs: u64) -> String {
        let mut key = String::with_capacity(usize::from(self.levels) * 2);
        for level in (0..self.levels).rev() {
            if !key.is_empty() {
                key.push('.');
            }
            key.push(if delay_secs >> level & 1 == 1 {
                '1'
            } else {
                '0'
            });
        }
        key
    }

    /// Where to publish a message that must wait `delay_secs` whole seconds.
    pub fn route(&self, delay_secs: u64) -> Result<Route, DelayTooLong> {
        if delay_secs > self.max_delay_secs() {
            return Err(DelayTooLong {
                delay_secs,
                max_secs: self.max_delay_secs(),
            });
        }
        let exchange = match highest_set_bit(delay_secs) {
            None => self.due_exchange(),
            Some(level) => self.level_name(level),
        };
        Ok(Route {
            exchange,
            routing_key: self.routing_key(delay_secs),
            delay_secs,
        })
    }

    /// The route for a message due in `remaining_ms` milliseconds (negative: due
    /// already). Only the whole seconds go through the ladder; the consumer holds
    /// the sub-second remainder, so the message is never delivered late by it.
    pub fn route_for_remaining_ms(&self, remaining_ms: i64) -> Result<Route, DelayTooLong> {
        let delay_secs = u64::try_from(remaining_ms.max(0) / 1000).unwrap_or(0);
        self.route(delay_secs)
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} s via {} [{}]",
            self.delay_secs, self.exchange, self.routing_key
        )
    }
}

/// Index of the most significant set bit; `None` for zero.
fn highest_set_bit(value: u64) -> Option<u8> {
    match value {
        0 => None,
        // At most 63, so the cast cannot truncate.
        _ => Some((63 - value.leading_zeros()) as u8),
    }
}

/// The largest `x-message-ttl` RabbitMQ takes: 315,360,000,000 ms (365 days
/// times ten), found by bisection on 3.10.8; 4.3.6 refuses 2^31 s too.
#[cfg(test)]
const BROKER_MAX_TTL_MS: u64 = 315_360_000_000;

/// RabbitMQ topic matching: `*` is exactly one word, `#` zero or more. Used by
/// the tests to walk the ladder the way the broker does.
#[cfg(test)]
pub(crate) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match p.split_first() {
            None => k.is_empty(),
            Some((&"#", rest)) => (0..=k.len()).any(|skip| go(rest, &k[skip..])),
            Some((word, rest)) => match k.split_first() {
                Some((first, k_rest)) => (*word == "*" || word == first) && go(rest, k_rest),
                None => false,
            },
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    go(&p, &k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(levels: u8) -> Ladder {
        Ladder::new("orders", levels).unwrap()
    }

    /// The shipped ladder (`topology.levels` in `config/default.toml`).
    fn default_ladder() -> Ladder {
        crate::Settings::default().ladder().unwrap()
    }

    /// Follows a message through the exchanges the way the broker would, using
    /// the binding patterns, and returns the milliseconds it waited in their
    /// queues.
    fn walk(ladder: &Ladder, route: &Route) -> u64 {
        let Some(entry) = (0..ladder.levels()).find(|l| ladder.level_name(*l) == route.exchange)
        else {
            assert_eq!(route.exchange, ladder.due_exchange());
            return 0;
        };
        let held = |level: &u8| {
            let (hold, pass) = ladder.binding_patterns(*level);
            let held = topic_matches(&hold, &route.routing_key);
            let passed = topic_matches(&pass, &route.routing_key);
            assert!(held ^ passed, "exactly one binding at level {level}");
            held
        };
        let waited = (0..=entry).rev().filter(held).map(Ladder::level_ttl_ms);
        waited.sum()
    }

    #[test]
    fn ttls_of_levels_passed_add_up_to_the_delay_for_every_delay() {
        let ladder = default_ladder();
        for delay in 0..=ladder.max_delay_secs() {
            let route = ladder.route(delay).unwrap();
            let levels = route.routing_key.split('.').rev().enumerate();
            let total_ms: u64 = levels
                .filter(|(_, bit)| *bit == "1")
                .map(|(level, _)| Ladder::level_ttl_ms(level as u8))
                .sum();
            assert_eq!(total_ms, delay * 1000, "delay {delay}");
        }
    }

    #[test]
    fn broker_walk_waits_exactly_the_delay() {
        let ladder = default_ladder();
        let max = ladder.max_delay_secs();
        let mut delays: Vec<u64> = (0..=4096).collect();
        delays.extend([max, max - 1, 1 << 21, (1 << 21) - 1, 1_800, 2_592_000]);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            // xorshift: deterministic spread over the whole range
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            delays.push(x % (max + 1));
        }
        for delay in delays {
            let route = ladder.route(delay).unwrap();
            let waited_ms = walk(&ladder, &route);
            assert_eq!(waited_ms, delay * 1000, "delay {delay} via {route}");
        }
    }

    /// A message enters at the level of its highest set bit; a zero delay (or
    /// a due time past) goes straight to due; past the maximum is an error,
    /// not a clamp.
    #[test]
    fn entry_is_the_level_of_the_highest_set_bit() {
        let ladder = ladder(4);
        for (delay, exchange, key) in [
            (0, "orders.due", "0.0.0.0"),
            (1, "orders.ladder.00", "0.0.0.1"),
            (5, "orders.ladder.02", "0.1.0.1"),
            (8, "orders.ladder.03", "1.0.0.0"),
            (15, "orders.ladder.03", "1.1.1.1"),
        ] {
            let route = ladder.route(delay).unwrap();
            assert_eq!([route.exchange, route.routing_key], [exchange, key]);
        }
        assert_eq!(ladder.max_delay_secs(), 15);
        let too_long = ladder.route(16).unwrap_err();
        assert_eq!((too_long.delay_secs, too_long.max_secs), (16, 15));
        let ladder = default_ladder();
        let remaining = |ms| ladder.route_for_remaining_ms(ms).unwrap();
        assert_eq!(remaining(-5_000).exchange, "orders.due");
        let secs = |ms| remaining(ms).delay_secs;
        assert_eq!((secs(999), secs(1_999)), (0, 1));
    }

    #[test]
    fn dead_letter_chain_ends_at_due() {
        let ladder = ladder(3);
        assert_eq!(ladder.dead_letter_target(2), "orders.ladder.01");
        assert_eq!(ladder.dead_letter_target(0), "orders.due");
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        assert_eq!(Ladder::new("orders", 0), Err(LadderError::Levels(0)));
        assert_eq!(Ladder::new("orders", 33), Err(LadderError::Levels(33)));
        assert!(Ladder::new("", 4).is_err());
        assert!(Ladder::new("a b", 4).is_err());
        assert!(Ladder::new("orders", 29).is_ok());
        assert!(Ladder::new("orders", 30).is_err());
        // A level RabbitMQ would refuse to declare is refused here first.
        assert!(Ladder::level_ttl_ms(MAX_LEVELS - 1) <= BROKER_MAX_TTL_MS);
        assert!(Ladder::level_ttl_ms(MAX_LEVELS) > BROKER_MAX_TTL_MS);
    }

    /// AMQP short strings (routing keys, binding keys, exchange and queue
    /// names) hold at most 255 bytes (kombu#2556): every key, pattern and
    /// name of every ladder allowed, with the longest prefix allowed, fits.
    #[test]
    fn keys_patterns_and_names_fit_in_255_bytes_at_every_number_of_levels() {
        let prefix = "p".repeat(200);
        for levels in 1..=MAX_LEVELS {
            let ladder = Ladder::new(&prefix, levels).unwrap();
            for delay in [0, 1, ladder.max_delay_secs() / 2, ladder.max_delay_secs()] {
                let route = ladder.route(delay).unwrap();
                assert!(route.routing_key.len() <= 255, "{levels} levels");
                assert!(route.exchange.len() <= 255, "{levels} levels");
            }
            for level in 0..levels {
                let (hold, pass) = ladder.binding_patterns(level);
                assert!(hold.len() <= 255 && pass.len() <= 255, "{levels}/{level}");
                assert!(ladder.level_name(level).len() <= 255);
            }
            assert!(ladder.parked_queue().len() <= 255 && ladder.due_queue().len() <= 255);
        }
        let longest = Ladder::new("p", MAX_LEVELS).unwrap().routing_key(u64::MAX);
        assert_eq!(longest.len(), 57, "two bytes a level, less one dot");
    }

    #[test]
    fn topic_matching_follows_rabbitmq() {
        assert!(topic_matches("*.1.#", "0.1"));
        assert!(topic_matches("*.1.#", "0.1.0.0"));
        assert!(!topic_matches("*.1.#", "1.0.1"));
        assert!(topic_matches("#", "0.0"));
        assert!(topic_matches("1.#", "1"));
    }
}
