//! The HTTP client of the action and of the payment check: one bounded
//! request at a time per permit, rustls (ring, the system roots plus an
//! optional PEM bundle of the operator's CAs) for `https://`, no redirects, and
//! the bearer token as a sensitive header that never prints.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{AUTHORIZATION, DATE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Semaphore;

use super::BuildError;
use crate::publisher::TraceContext;
use crate::service::rate::Pace;

/// Everything but RFC 3986's unreserved characters is encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// An order id as one path segment: `a/b c` is `a%2Fb%20c`.
pub(super) fn segment(order_id: &str) -> String {
    utf8_percent_encode(order_id, SEGMENT).to_string()
}

/// What came back from one request, besides its [`Answer`]: when it went and
/// how long it took by this host's clocks, and the headers that tell time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Exchange {
    /// This host's wall-clock time (uncorrected) when the request was sent.
    pub(super) sent: DateTime<Utc>,
    /// From sending to the response's headers.
    pub(super) round_trip: Duration,
    /// The response's `Date` header (whole seconds, the server's clock).
    pub(super) date: Option<DateTime<Utc>>,
    /// The response's `Retry-After`, as a delay.
    pub(super) retry_after: Option<Duration>,
}

/// What came back from one request.
#[derive(Debug)]
pub(super) enum Answer {
    /// A response: its status and the start of its body.
    Response { status: u16, body: String },
    /// No response: nothing listened (connection refused, DNS, TLS).
    Unreachable(String),
    /// No complete response within the timeout, or the connection broke.
    Failed(String),
}

/// A client for one base URL, with a concurrency limit and a pace (requests
/// a second, paused by a `Retry-After`).
#[derive(Debug, Clone)]
pub(super) struct Client {
    http: reqwest::Client,
    pub(super) base: String,
    limit: Arc<Semaphore>,
    pace: Arc<Pace>,
}

/// The most of a response body kept (for a parked reason, a check answer).
const BODY_LIMIT: usize = 1024;

/// The certificates of a PEM bundle (`tls_ca_file`), trusted beside the system's.
fn extra_roots(path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("tls_ca_file {}: {e}", path.display()))?;
    if roots.is_empty() {
        return Err(format!(
            "tls_ca_file {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(roots)
}

impl Client {
    /// `setting` names the base URL's key in errors.
    pub(super) fn new(
        setting: &'static str,
        base_url: &str,
        timeout: Duration,
        concurrency: usize,
        token: Option<&SecretString>,
        tls_ca_file: Option<&Path>,
    ) -> Result<Self, BuildError> {
        let error = |reason: String| BuildError::Http { setting, reason };
        let base = base_url.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base).map_err(|e| error(format!("{base:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(error(format!("{base:?} is not an http:// or https:// URL")));
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
                .map_err(|_| {
                    error("the bearer token has characters a header cannot carry".into())
                })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder();
        if let Some(path) = tls_ca_file {
            for ca in extra_roots(path).map_err(error)? {
                builder = builder.add_root_certificate(ca);
            }
        }
        let http = builder
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("order-expiry/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| error(e.without_url().to_string()))?;
        Ok(Self {
            http,
            base,
            limit: Arc::new(Semaphore::new(concurrency.max(1))),
            pace: Arc::new(Pace::new(0)),
        })
    }

    /// At most `per_second` requests a second (0: no limit), and every
    /// request waits out a `Retry-After` the server sent with a 429 or a 503:
    /// a server that asks for a pause gets it from the whole consumer, not
    /// only from the one order it answered.
    pub(super) fn paced(mut self, per_second: u32) -> Self {
        self.pace = Arc::new(Pace::new(per_second));
        self
    }

    /// Sends `request` (built on this client) once a permit is free.
    pub(super) async fn send(
        &self,
        request: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Answer {
        self.send_timed(request).await.0
    }

    /// [`Client::send`], and when a response came, its [`Exchange`].
    pub(super) async fn send_timed(
        &self,
        request: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> (Answer, Option<Exchange>) {
        let Ok(_permit) = self.limit.acquire().await else {
            return (Answer::Failed("the client is closed".into()), None);
        };
        self.pace.ready().await;
        let request = request(&self.http);
        let sent = Utc::now();
        let started = Instant::now();
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() && !e.is_timeout() => {
                return (Answer::Unreachable(describe(&e)), None);
            }
            Err(e) => return (Answer::Failed(describe(&e)), None),
        };
        let headers = response.headers();
        let exchange = Exchange {
            sent,
            round_trip: started.elapsed(),
            date: header(headers, DATE).and_then(http_date),
            retry_after: header(headers, RETRY_AFTER).and_then(|value| retry_after(value, sent)),
        };
        let status = response.status().as_u16();
        if let (429 | 503, Some(after)) = (status, exchange.retry_after) {
            self.pace.pause(after);
        }
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    body.extend_from_slice(&chunk);
                    if body.len() >= BODY_LIMIT {
                        body.truncate(BODY_LIMIT);
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return (Answer::Failed(describe(&e)), Some(exchange)),
            }
        }
        let answer = Answer::Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        (answer, Some(exchange))
    }
}

fn header(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers.get(name)?.to_str().ok()
}

/// An HTTP date (`Fri, 04 Dec 2026 20:18:05 GMT`, RFC 9110's preferred form).
fn http_date(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(value.trim())
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

/// A `Retry-After` (seconds, or an HTTP date, read against `sent`) as a delay.
fn retry_after(value: &str, sent: DateTime<Utc>) -> Option<Duration> {
    match value.trim().parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => Some((http_date(value)? - sent).to_std().unwrap_or_default()),
    }
}

/// A request error without its URL (which could carry credentials), with its
/// causes: reqwest's own text is often only "error sending request".
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut text = kind.to_owned();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `body` on one line, at most `max` characters, for a log line or a header.
pub(super) fn excerpt(body: &str, max: usize) -> String {
    let line: String = body
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim();
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// `request` with the W3C trace headers of `trace`, when there is one: the
/// order service's and the gateway's spans join the order's trace.
pub(super) fn traced(
    request: reqwest::RequestBuilder,
    trace: Option<&TraceContext>,
) -> reqwest::RequestBuilder {
    let Some(trace) = trace else {
        return request;
    };
    let request = request.header(TraceContext::TRACEPARENT, trace.traceparent());
    match trace.tracestate() {
        Some(state) => request.header(TraceContext::TRACESTATE, state),
        None => request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_ids_become_one_path_segment() {
        assert_eq!(segment("o-42_x.y~z"), "o-42_x.y~z");
        assert_eq!(segment("a/b c?d#e%"), "a%2Fb%20c%3Fd%23e%25");
        assert_eq!(segment("ü"), "%C3%BC");
    }

    #[test]
    fn time_headers_parse_in_both_forms() {
        let sent: DateTime<Utc> = "2026-12-04T20:18:00Z".parse().unwrap();
        let date = "Fri, 04 Dec 2026 20:18:05 GMT";
        assert_eq!(http_date(date), Some(sent + chrono::TimeDelta::seconds(5)));
        assert_eq!(retry_after("3", sent), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(date, sent), Some(Duration::from_secs(5)));
        assert_eq!(retry_after("soon", sent), None);
    }

    #[test]
    fn excerpts_are_one_short_line() {
        assert_eq!(excerpt(" a\nb\r\n", 10), "a b");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("üüüü", 2), "üü…");
    }
}
