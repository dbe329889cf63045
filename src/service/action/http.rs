//! The HTTP action: `POST {action.http.base_url}/orders/{id}/expire` on the
//! order service, which owns its database and its cancel.
//!
//! Request: JSON `{"order_id", "due_at", "message_id"}`, header
//! `Idempotency-Key: order-expiry:<id, percent-encoded>:<due_at>` (the same for
//! every delivery, retry and re-check of one deadline, and for a duplicate
//! schedule of it; a new deadline after an extension gets a new key),
//! `Authorization: Bearer …` when `action.http.bearer_token` is set, and the
//! order's W3C `traceparent` (and `tracestate`) when it has one.
//!
//! At most `action.http.concurrency` requests in flight and `max_rps` a
//! second; a 429 or 503 with `Retry-After` pauses every request for that long.
//!
//! Response: 2xx cancelled, 409 not unpaid, 404 unknown; 425 Too Early: not
//! due yet by the order service's clock, held and asked again when it says
//! (`due_in_ms` in a JSON body, else `Retry-After`, else a second); 429, 5xx,
//! a timeout or a broken connection: retried alone with backoff (the message
//! stays unacked); any other status: parked with the status and the start of
//! the body. When no request of a batch could even connect, the whole batch
//! waits and intake pauses, as for a database that is down.
//!
//! The order service's clock decides when an order is due: every answer's
//! `Date` header, and the time left in a 425, measure this host's offset from
//! it (`service::clock`), and the consumer holds orders by the corrected time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use futures::future::join_all;
use serde_json::json;

use super::client::{Answer, Client, Exchange, excerpt, segment, traced};
use super::{Action, ActionAnswer, ActionError, BuildError, Expiring};
use crate::clock::Clock;
use crate::publisher::ExpiryMessage;
use crate::service::clock::{ClockReport, OffsetEstimate, reading_bounds};
use crate::settings::{ClockSettings, HttpActionSettings, bearer};

/// Readings of the order service's clock older than this no longer count.
const CLOCK_WINDOW: Duration = Duration::from_secs(300);

/// The `Idempotency-Key` of one deadline of one order.
pub(crate) fn idempotency_key(message: &ExpiryMessage) -> String {
    let due_at = message.due_at.to_rfc3339_opts(SecondsFormat::Millis, true);
    format!(
        "order-expiry:{}:{due_at}",
        segment(message.order_id.as_str())
    )
}

/// `POST {base}/orders/{id}/expire`; see the module docs.
#[derive(Debug, Clone)]
pub struct HttpAction {
    client: Client,
    /// This host's clock corrected to the order service's.
    clock: Clock,
    /// What the answers so far tell about the order service's clock.
    measured: Arc<Mutex<(OffsetEstimate, ClockReport)>>,
}

impl HttpAction {
    /// The action of `action.http`; `clock` says when its offset is worth a warning.
    pub fn new(settings: &HttpActionSettings, clock: &ClockSettings) -> Result<Self, BuildError> {
        let client = Client::new(
            "action.http.base_url",
            &settings.base_url,
            settings.timeout,
            settings.concurrency,
            bearer(&settings.bearer_token),
            settings.tls_ca_file.as_deref(),
        )?
        .paced(settings.max_rps);
        let corrected = Clock::local();
        let report = ClockReport::new(corrected.clone(), "http", clock).leaning_ahead();
        Ok(Self {
            client,
            clock: corrected,
            measured: Arc::new(Mutex::new((OffsetEstimate::new(CLOCK_WINDOW), report))),
        })
    }

    /// This host's clock corrected to the order service's, as its answers
    /// measured it.
    pub fn clock(&self) -> Clock {
        self.clock.clone()
    }

    /// Reads the order service's clock without an order: `HEAD {base_url}`,
    /// whose answer (any status) carries a `Date`. `serve` does it at start
    /// and every `clock.probe_interval_ms`, so the offset is known before the
    /// first order is due, and narrows between orders. Whether the service
    /// answered (one that answers without a `Date` will not carry one if
    /// asked again soon).
    pub(crate) async fn probe_clock(&self) -> bool {
        let url = format!("{}/", self.client.base);
        let (answer, exchange) = self.client.send_timed(|http| http.head(url)).await;
        let Some(exchange) = exchange else {
            return false;
        };
        self.measure(None, &answer, &exchange);
        true
    }

    /// Measures the order service's clock by what one answer says of it: its
    /// `Date`, and a 425's time left until `due_at`.
    fn measure(&self, due_at: Option<DateTime<Utc>>, answer: &Answer, exchange: &Exchange) {
        let mut readings = Vec::with_capacity(2);
        if let Some(date) = exchange.date {
            let second = TimeDelta::seconds(1);
            readings.push(reading_bounds(
                date,
                exchange.sent,
                exchange.round_trip,
                second,
            ));
        }
        if let Answer::Response { status: 425, body } = answer
            && let (Some(due_at), Some(left)) = (due_at, due_in(body))
        {
            // The service's now was due_at - left, to the millisecond, at
            // some point of the round trip.
            let now = due_at - TimeDelta::from_std(left).unwrap_or_default();
            let (lo, hi) =
                reading_bounds(now, exchange.sent, exchange.round_trip, TimeDelta::zero());
            readings.push((
                lo - TimeDelta::milliseconds(1),
                hi + TimeDelta::milliseconds(1),
            ));
        }
        let Ok(mut measured) = self.measured.lock() else {
            return;
        };
        let (estimate, report) = &mut *measured;
        for (lo, hi) in readings {
            let offset = estimate.observe(Instant::now(), lo, hi);
            report.publish(offset);
        }
    }

    /// The answer to one expire, with its `Retry-After`.
    async fn expire_one(&self, due: Expiring<'_>) -> (Answer, Option<Duration>) {
        let message = due.message;
        let url = format!(
            "{}/orders/{}/expire",
            self.client.base,
            segment(message.order_id.as_str())
        );
        let body = json!({
            "order_id": message.order_id.as_str(),
            "due_at": message.due_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            "message_id": due.message_id,
        })
        .to_string();
        let key = idempotency_key(message);
        let (answer, exchange) = self
            .client
            .send_timed(|http| {
                let request = http
                    .post(url)
                    .header("content-type", "application/json")
                    .header("idempotency-key", key);
                traced(request, due.trace).body(body)
            })
            .await;
        if let Some(exchange) = &exchange {
            self.measure(Some(message.due_at), &answer, exchange);
        }
        (answer, exchange.and_then(|e| e.retry_after))
    }
}

impl Action for HttpAction {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<ActionAnswer>, ActionError> {
        let answers = join_all(due.iter().map(|d| self.expire_one(*d))).await;
        if let Some((Answer::Unreachable(reason), _)) = answers.first()
            && answers
                .iter()
                .all(|(a, _)| matches!(a, Answer::Unreachable(_)))
        {
            return Err(ActionError::Unavailable(format!(
                "expire endpoint {}: {reason}",
                self.client.base
            )));
        }
        Ok(answers
            .into_iter()
            .map(|(answer, retry_after)| verdict(answer, retry_after))
            .collect())
    }

    fn clock(&self) -> Clock {
        self.clock.clone()
    }
}

/// A 425's time left until due, from its JSON body's `due_in_ms`.
fn due_in(body: &str) -> Option<Duration> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(Duration::from_millis(value.get("due_in_ms")?.as_u64()?))
}

/// What one answer of the expire endpoint means, with its `Retry-After`. Pure.
fn verdict(answer: Answer, retry_after: Option<Duration>) -> ActionAnswer {
    match answer {
        Answer::Response { status, body } => match status {
            200..=299 => ActionAnswer::Cancelled,
            409 => ActionAnswer::NotUnpaid,
            404 => ActionAnswer::Unknown,
            425 => ActionAnswer::NotDue {
                clock: "http",
                left: due_in(&body)
                    .or(retry_after)
                    .unwrap_or(Duration::from_secs(1)),
            },
            429 | 500..=599 => ActionAnswer::Retry(format!(
                "expire endpoint answered {status}: {}",
                excerpt(&body, 200)
            )),
            _ => ActionAnswer::Park(format!(
                "expire endpoint answered {status}: {}",
                excerpt(&body, 200)
            )),
        },
        Answer::Unreachable(reason) | Answer::Failed(reason) => {
            ActionAnswer::Retry(format!("expire endpoint: {reason}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::OrderId;

    fn response(status: u16, body: &str) -> Answer {
        Answer::Response {
            status,
            body: body.into(),
        }
    }

    #[test]
    fn every_response_class_has_its_verdict_and_too_early_its_time_left() {
        for (status, body, want) in [
            (200, "", ActionAnswer::Cancelled),
            (204, "", ActionAnswer::Cancelled),
            (409, "paid", ActionAnswer::NotUnpaid),
            (404, "", ActionAnswer::Unknown),
        ] {
            assert_eq!(verdict(response(status, body), None), want, "{status}");
        }
        for status in [429, 500, 502, 503, 599] {
            let retry = verdict(response(status, "x"), None);
            assert!(matches!(retry, ActionAnswer::Retry(r) if r.contains(&status.to_string())));
        }
        for status in [301, 400, 401, 403, 410, 422] {
            assert_eq!(
                verdict(response(status, "bad\nthing"), None),
                ActionAnswer::Park(format!("expire endpoint answered {status}: bad thing"))
            );
        }
        let long = "x".repeat(500);
        let ActionAnswer::Park(reason) = verdict(response(400, &long), None) else {
            panic!("parked")
        };
        assert!(reason.len() < 260, "{reason}");
        assert!(matches!(
            verdict(Answer::Failed("timed out".into()), None),
            ActionAnswer::Retry(r) if r.contains("timed out")
        ));
        // Too early: held for the time the service says.
        let early = |body: &str, after| verdict(response(425, body), after);
        let not_due = |ms| ActionAnswer::NotDue {
            clock: "http",
            left: Duration::from_millis(ms),
        };
        assert_eq!(early(r#"{"due_in_ms": 1234}"#, None), not_due(1_234));
        assert_eq!(early("", Some(Duration::from_secs(3))), not_due(3_000));
        assert_eq!(
            early(r#"{"due_in_ms": 250}"#, Some(Duration::from_secs(1))),
            not_due(250)
        );
        assert_eq!(early("too early", None), not_due(1_000));
    }

    #[test]
    fn the_idempotency_key_is_the_order_and_its_deadline() {
        let due_at: DateTime<Utc> = "2026-11-30T10:00:00.5Z".parse().unwrap();
        let message = ExpiryMessage::new(OrderId::new("a/b 1").unwrap(), due_at);
        let key = "order-expiry:a%2Fb%201:2026-11-30T10:00:00.500Z";
        assert_eq!(idempotency_key(&message), key);
        let mut rechecked = message.again_at(due_at + chrono::TimeDelta::seconds(3));
        rechecked.check_step = 2;
        assert_eq!(idempotency_key(&rechecked), idempotency_key(&message));
    }
}
