//! What the consumer does with a due order (`[action]`): cancel it in SQL (the
//! default), call the order service's HTTP endpoint, or publish an event; and
//! the optional payment check before it (`[action.check]`).

use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use super::millis;

/// Which action expires a due order (`action.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// `database.cancel_sql` on PostgreSQL: today's behaviour.
    Sql,
    /// `POST {action.http.base_url}/orders/{id}/expire`.
    Http,
    /// An `order.expired` event to `action.amqp.exchange`, confirmed.
    Amqp,
}

impl ActionKind {
    /// The value of `action.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sql => "sql",
            Self::Http => "http",
            Self::Amqp => "amqp",
        }
    }
}

/// `[action]`.
#[derive(Debug, Clone, Deserialize)]
pub struct ActionSettings {
    /// Which action expires a due order.
    pub kind: ActionKind,
    /// The HTTP action.
    pub http: HttpActionSettings,
    /// The event action.
    pub amqp: AmqpActionSettings,
    /// The payment check before the action.
    pub check: CheckSettings,
}

/// `[action.http]`: the order service's own expire endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpActionSettings {
    /// `http://` or `https://` base; the action posts to `{base_url}/orders/{id}/expire`.
    pub base_url: String,
    /// Bound on one request, from connect to the end of the response (`timeout_ms`).
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Requests started a second at most (0: no limit).
    pub max_rps: u32,
    /// Sent as `Authorization: Bearer …` when set; never logged.
    #[serde(default)]
    pub bearer_token: Option<SecretString>,
    /// A PEM bundle of CA certificates trusted for `https://` beside the
    /// system's (a private CA); none by default.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

/// `[action.amqp]`: the `order.expired` event.
#[derive(Debug, Clone, Deserialize)]
pub struct AmqpActionSettings {
    /// The exchange the event goes to, on the broker of `amqp.url`. It must
    /// exist: order-expiry declares nothing it does not own.
    pub exchange: String,
    /// The event's routing key.
    pub routing_key: String,
    /// Events published a second at most (0: no limit).
    pub max_rps: u32,
}

/// What happens after the last check step when the gateway still says `pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinalOutcome {
    /// Copy the message to `P.parked` for a person (default): nothing is
    /// cancelled, nothing is forgotten.
    Park,
    /// Apply the action anyway.
    Cancel,
    /// Ack it and leave the order as it is (`pending_at_gateway`).
    Keep,
}

/// `[action.check]`: ask the payment gateway before expiring an order.
#[derive(Debug, Clone, Deserialize)]
pub struct CheckSettings {
    /// Whether the consumer checks before the action.
    pub enabled: bool,
    /// `http://` or `https://` base; the check is `GET {base_url}/orders/{id}/payment`.
    pub base_url: String,
    /// Bound on one check request (`timeout_ms`).
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    /// Check requests in flight at once.
    pub concurrency: usize,
    /// After the n-th `pending`, the next check runs `steps_ms[n-1]` later;
    /// after the last, [`Self::final_outcome`] (`steps_ms`).
    #[serde(rename = "steps_ms", with = "millis::list")]
    pub steps: Vec<Duration>,
    /// What happens when the gateway still says `pending` after the last step
    /// (`final`).
    #[serde(rename = "final")]
    pub final_outcome: FinalOutcome,
    /// Sent as `Authorization: Bearer …` when set; never logged.
    #[serde(default)]
    pub bearer_token: Option<SecretString>,
    /// A PEM bundle of CA certificates trusted for `https://` beside the
    /// system's (a private CA); none by default.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

/// A token that is set and not empty.
#[cfg(feature = "service")]
pub(crate) fn bearer(token: &Option<SecretString>) -> Option<&SecretString> {
    use secrecy::ExposeSecret;
    token.as_ref().filter(|t| !t.expose_secret().is_empty())
}
