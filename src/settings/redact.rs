//! URLs carry passwords: the forms of them that may be logged or put in an
//! error message.

use secrecy::{ExposeSecret, SecretString};

/// `url` with its password replaced by `***`, for logs and error messages.
pub(crate) fn redact_url(url: &SecretString) -> String {
    let raw = url.expose_secret();
    let Some((scheme, rest)) = raw.split_once("://") else {
        return "***".to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// `text` with `url` and its password (as written and percent-decoded) replaced
/// by `***`: for third-party error messages that may quote what they were given.
pub(crate) fn scrub_url(text: &str, url: &SecretString) -> String {
    let raw = url.expose_secret();
    if raw.is_empty() {
        return text.to_owned();
    }
    let mut out = text.replace(raw, &redact_url(url));
    let password = raw
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, password)| password);
    if let Some(password) = password.filter(|p| !p.is_empty()) {
        out = out.replace(password, "***");
        let decoded = percent_decode(password);
        if !decoded.is_empty() {
            out = out.replace(&decoded, "***");
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_removes_the_url_and_its_password_in_both_spellings() {
        let url = SecretString::from("amqp://app:s%40cret-pw@rabbit:5672/vh");
        let text = "failed: amqp://app:s%40cret-pw@rabbit:5672/vh; pw s%40cret-pw or s@cret-pw";
        let scrubbed = scrub_url(text, &url);
        assert!(!scrubbed.contains("cret-pw"), "{scrubbed}");
        assert!(
            scrubbed.contains("amqp://app:***@rabbit:5672/vh"),
            "{scrubbed}"
        );
        let opaque = SecretString::from("amqp:app:hunter2@rabbit");
        assert_eq!(
            scrub_url("Invalid URL: 'amqp:app:hunter2@rabbit'", &opaque),
            "Invalid URL: '***'"
        );
    }

    #[test]
    fn redacted_urls_keep_everything_but_the_password() {
        let url = SecretString::from("amqp://app:hunter2@rabbit:5672/vh");
        assert_eq!(redact_url(&url), "amqp://app:***@rabbit:5672/vh");
        let url = SecretString::from("postgres://u:p%40ss@db/orders?sslmode=require");
        assert_eq!(
            redact_url(&url),
            "postgres://u:***@db/orders?sslmode=require"
        );
    }
}
