//! The payment check before the action (`action.check`): a payment can succeed
//! at the gateway while its callback to the order service is lost, so the
//! consumer asks `GET {action.check.base_url}/orders/{id}/payment` first.
//!
//! Wire format: a 200 with a JSON object whose `status` is `"paid"`,
//! `"unpaid"` or `"pending"` (other fields are ignored). 429, 5xx, a timeout or
//! a broken connection: retried alone with backoff. Anything else (another
//! status, a body without one of those three) cannot be acted on safely: the
//! message is parked with the answer.

use serde_json::Value;

use super::client::{Answer, Client, excerpt, segment, traced};
use super::{BuildError, Expiring};
use crate::settings::{CheckSettings, bearer};

/// What the gateway says about an order's payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckAnswer {
    /// Paid: the order must not be expired.
    Paid,
    /// Not paid: apply the action.
    Unpaid,
    /// Not settled yet: ask again after the next step.
    Pending,
}

/// The outcome of one check request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Checked {
    /// The gateway answered.
    Answer(CheckAnswer),
    /// Not now: retry this message alone.
    Retry(String),
    /// An answer that cannot be acted on: park with this reason.
    Park(String),
}

/// `GET {base}/orders/{id}/payment`; see the module docs.
#[derive(Debug, Clone)]
pub struct PaymentCheck {
    client: Client,
}

impl PaymentCheck {
    /// The check of `action.check`.
    pub fn new(settings: &CheckSettings) -> Result<Self, BuildError> {
        let client = Client::new(
            "action.check.base_url",
            &settings.base_url,
            settings.timeout,
            settings.concurrency,
            bearer(&settings.bearer_token),
            settings.tls_ca_file.as_deref(),
        )?;
        Ok(Self { client })
    }

    /// Asks about the order of `message`.
    pub(crate) async fn ask(&self, due: Expiring<'_>) -> Checked {
        let url = format!(
            "{}/orders/{}/payment",
            self.client.base,
            segment(due.message.order_id.as_str())
        );
        let answer = self
            .client
            .send(|http| {
                traced(
                    http.get(url).header("accept", "application/json"),
                    due.trace,
                )
            })
            .await;
        checked(answer)
    }
}

/// What one answer of the check endpoint means. Pure.
fn checked(answer: Answer) -> Checked {
    match answer {
        Answer::Response { status: 200, body } => {
            let status = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("status")?.as_str().map(str::to_owned));
            match status.as_deref() {
                Some("paid") => Checked::Answer(CheckAnswer::Paid),
                Some("unpaid") => Checked::Answer(CheckAnswer::Unpaid),
                Some("pending") => Checked::Answer(CheckAnswer::Pending),
                _ => Checked::Park(format!(
                    "payment check answered 200 without a status of paid, unpaid or pending: {}",
                    excerpt(&body, 200)
                )),
            }
        }
        Answer::Response { status, body } if status == 429 || status >= 500 => Checked::Retry(
            format!("payment check answered {status}: {}", excerpt(&body, 200)),
        ),
        Answer::Response { status, body } => Checked::Park(format!(
            "payment check answered {status}: {}",
            excerpt(&body, 200)
        )),
        Answer::Unreachable(reason) | Answer::Failed(reason) => {
            Checked::Retry(format!("payment check: {reason}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Checked {
        checked(Answer::Response {
            status,
            body: body.into(),
        })
    }

    #[test]
    fn the_three_answers_and_everything_else() {
        for (body, want) in [
            (r#"{"status":"paid"}"#, CheckAnswer::Paid),
            (r#"{"status":"unpaid","at":1}"#, CheckAnswer::Unpaid),
            (r#"{"status":"pending"}"#, CheckAnswer::Pending),
        ] {
            assert_eq!(answer(200, body), Checked::Answer(want), "{body}");
        }
        for body in ["", "paid", r#"{"status":"PAID"}"#, r#"{"state":"paid"}"#] {
            assert!(matches!(answer(200, body), Checked::Park(_)), "{body}");
        }
        assert!(matches!(answer(503, "x"), Checked::Retry(_)));
        assert!(matches!(answer(429, "x"), Checked::Retry(_)));
        assert!(matches!(answer(404, "x"), Checked::Park(r) if r.contains("404")));
        assert!(matches!(answer(204, "x"), Checked::Park(_)));
        let failed = checked(Answer::Failed("timed out".into()));
        assert!(matches!(failed, Checked::Retry(_)));
    }
}
