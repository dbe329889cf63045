//! The AMQP heartbeat of `serve`'s consumer connection (`amqp.heartbeat_ms`).
//! A hung broker node (SIGSTOP, a frozen VM) keeps its sockets open: without
//! heartbeats the consumer would wait on it for as long as it hangs, holding
//! what it was delivered. lapin gives up on a connection after two heartbeat
//! intervals of silence, so 5 s notices a hung node within about 10 s and
//! moves to another node of `amqp.url`.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::settings::url_list;

/// `urls` (one URL or a comma-separated list) with `heartbeat=<seconds>` in
/// the query of each URL that sets no heartbeat of its own; whole seconds,
/// rounded up (AMQP counts seconds). A zero `heartbeat` leaves `urls` as they
/// are: the broker's proposal (60 s) applies.
pub(crate) fn with_heartbeat(urls: &SecretString, heartbeat: Duration) -> SecretString {
    if heartbeat.is_zero() {
        return urls.clone();
    }
    let seconds = heartbeat
        .as_millis()
        .div_ceil(1000)
        .min(u128::from(u16::MAX));
    let one = |url: &str| {
        let query = url.split_once('?').map_or("", |(_, q)| q);
        if query.split('&').any(|p| p.starts_with("heartbeat=")) {
            url.to_owned()
        } else if url.contains('?') {
            format!("{url}&heartbeat={seconds}")
        } else {
            format!("{url}?heartbeat={seconds}")
        }
    };
    let list: Vec<String> = url_list(urls.expose_secret()).map(one).collect();
    SecretString::from(list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(urls: &str, ms: u64) -> String {
        with_heartbeat(&SecretString::from(urls), Duration::from_millis(ms))
            .expose_secret()
            .to_owned()
    }

    #[test]
    fn every_url_of_a_list_gets_the_heartbeat_in_whole_seconds_unless_set_or_zero() {
        assert_eq!(
            with("amqp://a:5672/%2f, amqp://b:5672/v?frame_max=8192", 4500),
            "amqp://a:5672/%2f?heartbeat=5,amqp://b:5672/v?frame_max=8192&heartbeat=5"
        );
        // A URL's own heartbeat, and a heartbeat of zero, are left alone.
        let own = "amqp://a/%2f?heartbeat=30";
        assert_eq!(with(own, 5000), own);
        assert_eq!(with("amqp://a/%2f", 0), "amqp://a/%2f");
    }
}
