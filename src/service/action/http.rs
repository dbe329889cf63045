//! The HTTP action: `POST {action.http.base_url}/orders/{id}/expire` on the
//! order service, which owns its database and its cancel.
//!
//! Request: JSON `{"order_id", "due_at", "message_id"}`, header
//! `Idempotency-Key: order-expiry:<id, percent-encoded>:<due_at>` (the same for
//! every delivery, retry and re-check of one deadline, and for a duplicate
//! schedule of it; a new deadline after an extension gets a new key), and
//! `Authorization: Bearer …` when `action.http.bearer_token` is set.
//!
//! Response: 2xx cancelled, 409 not unpaid, 404 unknown; 429, 5xx, a timeout or
//! a broken connection: retried alone with backoff (the message stays unacked);
//! any other status: parked with the status and the start of the body. When no
//! request of a batch could even connect, the whole batch waits and intake
//! pauses, as for a database that is down.

use chrono::SecondsFormat;
use futures::future::join_all;
use serde_json::json;

use super::client::{Answer, Client, excerpt, segment};
use super::{Action, ActionAnswer, ActionError, BuildError, Expiring};
use crate::publisher::ExpiryMessage;
use crate::settings::{HttpActionSettings, bearer};

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
}

impl HttpAction {
    /// The action of `action.http`.
    pub fn new(settings: &HttpActionSettings) -> Result<Self, BuildError> {
        let client = Client::new(
            "action.http.base_url",
            &settings.base_url,
            settings.timeout,
            settings.concurrency,
            bearer(&settings.bearer_token),
            settings.tls_ca_file.as_deref(),
        )?;
        Ok(Self { client })
    }

    async fn expire_one(&self, due: Expiring<'_>) -> Answer {
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
        self.client
            .send(|http| {
                http.post(url)
                    .header("content-type", "application/json")
                    .header("idempotency-key", key)
                    .body(body)
            })
            .await
    }
}

impl Action for HttpAction {
    async fn expire(&self, due: &[Expiring<'_>]) -> Result<Vec<ActionAnswer>, ActionError> {
        let answers = join_all(due.iter().map(|d| self.expire_one(*d))).await;
        if let Some(Answer::Unreachable(reason)) = answers.first()
            && answers.iter().all(|a| matches!(a, Answer::Unreachable(_)))
        {
            return Err(ActionError::Unavailable(format!(
                "expire endpoint {}: {reason}",
                self.client.base
            )));
        }
        Ok(answers.into_iter().map(verdict).collect())
    }
}

/// What one answer of the expire endpoint means. Pure.
fn verdict(answer: Answer) -> ActionAnswer {
    match answer {
        Answer::Response { status, body } => match status {
            200..=299 => ActionAnswer::Cancelled,
            409 => ActionAnswer::NotUnpaid,
            404 => ActionAnswer::Unknown,
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
    fn every_response_class_has_its_verdict() {
        assert_eq!(verdict(response(200, "")), ActionAnswer::Cancelled);
        assert_eq!(verdict(response(204, "")), ActionAnswer::Cancelled);
        assert_eq!(verdict(response(409, "paid")), ActionAnswer::NotUnpaid);
        assert_eq!(verdict(response(404, "")), ActionAnswer::Unknown);
        for status in [429, 500, 502, 503, 599] {
            assert!(
                matches!(verdict(response(status, "x")), ActionAnswer::Retry(r) if r.contains(&status.to_string()))
            );
        }
        for status in [301, 400, 401, 403, 410, 422] {
            assert_eq!(
                verdict(response(status, "bad\nthing")),
                ActionAnswer::Park(format!("expire endpoint answered {status}: bad thing"))
            );
        }
        let long = "x".repeat(500);
        let ActionAnswer::Park(reason) = verdict(response(400, &long)) else {
            panic!("parked")
        };
        assert!(reason.len() < 260, "{reason}");
        assert!(matches!(
            verdict(Answer::Failed("timed out".into())),
            ActionAnswer::Retry(r) if r.contains("timed out")
        ));
    }

    #[test]
    fn the_idempotency_key_is_the_order_and_its_deadline() {
        let due_at: DateTime<Utc> = "2026-11-30T10:00:00.5Z".parse().unwrap();
        let message = ExpiryMessage::new(OrderId::new("a/b 1").unwrap(), due_at);
        assert_eq!(
            idempotency_key(&message),
            "order-expiry:a%2Fb%201:2026-11-30T10:00:00.500Z"
        );
        let mut rechecked = message.again_at(due_at + chrono::TimeDelta::seconds(3));
        rechecked.check_step = 2;
        assert_eq!(idempotency_key(&rechecked), idempotency_key(&message));
    }
}
