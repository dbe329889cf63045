//! The HTTP client of the action and of the payment check: one bounded
//! request at a time per permit, rustls (ring, the system roots plus an
//! optional PEM bundle of the operator's CAs) for `https://`, no redirects, and
//! the bearer token as a sensitive header that never prints.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Semaphore;

use super::BuildError;

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

/// A client for one base URL, with a concurrency limit.
#[derive(Debug, Clone)]
pub(super) struct Client {
    http: reqwest::Client,
    pub(super) base: String,
    limit: Arc<Semaphore>,
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
        })
    }

    /// Sends `request` (built on this client) once a permit is free.
    pub(super) async fn send(
        &self,
        request: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Answer {
        let Ok(_permit) = self.limit.acquire().await else {
            return Answer::Failed("the client is closed".into());
        };
        let mut response = match request(&self.http).send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() && !e.is_timeout() => {
                return Answer::Unreachable(describe(&e));
            }
            Err(e) => return Answer::Failed(describe(&e)),
        };
        let status = response.status().as_u16();
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
                Err(e) => return Answer::Failed(describe(&e)),
            }
        }
        Answer::Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
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
    fn excerpts_are_one_short_line() {
        assert_eq!(excerpt(" a\nb\r\n", 10), "a b");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("üüüü", 2), "üü…");
    }
}
