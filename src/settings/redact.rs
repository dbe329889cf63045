//! URLs carry passwords: the forms of them that may be logged or put in an
//! error message. `amqp.url` may be a comma-separated list of broker URLs (the
//! nodes of a cluster): every URL of a list is redacted and scrubbed.
//! `database.url` is one URL whose host part may list several hosts
//! (`postgres://u:pw@h1:5432,h2:5432/db`): its commas separate hosts, not URLs.

use secrecy::{ExposeSecret, SecretString};

/// The URLs of a comma-separated list, trimmed, empty ones skipped. A comma
/// inside a password is written `%2C` (it is a separator here).
pub(crate) fn url_list(raw: &str) -> impl Iterator<Item = &str> {
    raw.split(',').map(str::trim).filter(|u| !u.is_empty())
}

/// `url` (or every URL of a comma-separated list) with its password replaced
/// by `***`, for logs and error messages.
pub(crate) fn redact_url(url: &SecretString) -> String {
    let raw = url.expose_secret();
    if raw.contains(',') {
        return url_list(raw).map(redact_one).collect::<Vec<_>>().join(",");
    }
    redact_one(raw)
}

/// The database URL with its password replaced by `***`: one URL, however
/// many hosts it names, with a `password` parameter redacted as well.
pub(crate) fn redact_database_url(url: &SecretString) -> String {
    let raw = url.expose_secret();
    let redacted = redact_one(raw);
    match password_parameter(raw) {
        Some(password) => redacted.replace(&format!("password={password}"), "password=***"),
        None => redacted,
    }
}

/// `text` with the database URL and its password scrubbed (see
/// [`redact_database_url`]).
#[cfg(feature = "service")]
pub(crate) fn scrub_database_url(text: &str, url: &SecretString) -> String {
    let raw = url.expose_secret();
    if raw.is_empty() {
        return text.to_owned();
    }
    let out = scrub_one(&text.replace(raw, &redact_database_url(url)), raw);
    match password_parameter(raw).filter(|p| !p.is_empty()) {
        Some(password) => out
            .replace(password, "***")
            .replace(&percent_decode(password), "***"),
        None => out,
    }
}

/// The value of a `password=` parameter of a URL's query or of a key=value
/// connection string, as written.
fn password_parameter(raw: &str) -> Option<&str> {
    let at = raw.find("password=")?;
    let value = &raw[at + "password=".len()..];
    let end = value.find(['&', ' ']).unwrap_or(value.len());
    Some(&value[..end])
}

fn redact_one(raw: &str) -> String {
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
    if raw.contains(',') {
        for one in url_list(raw) {
            out = scrub_one(&out, one);
        }
        return out;
    }
    scrub_one(&out, raw)
}

/// `text` with the one URL `raw` and its password scrubbed.
fn scrub_one(text: &str, raw: &str) -> String {
    let mut out = text.replace(raw, &redact_one(raw));
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
    fn a_url_keeps_all_but_its_password_and_scrubbing_removes_it_in_both_spellings() {
        let url = SecretString::from("amqp://app:hunter2@rabbit:5672/vh");
        assert_eq!(redact_url(&url), "amqp://app:***@rabbit:5672/vh");
        let url = SecretString::from("postgres://u:p%40ss@db/orders?sslmode=require");
        let redacted = "postgres://u:***@db/orders?sslmode=require";
        assert_eq!(redact_url(&url), redacted);
        let url = SecretString::from("amqp://app:s%40cret-pw@rabbit:5672/vh");
        let text = "failed: amqp://app:s%40cret-pw@rabbit:5672/vh; pw s%40cret-pw or s@cret-pw";
        let scrubbed = scrub_url(text, &url);
        assert!(!scrubbed.contains("cret-pw"), "{scrubbed}");
        let kept = "amqp://app:***@rabbit:5672/vh";
        assert!(scrubbed.contains(kept), "{scrubbed}");
        let opaque = SecretString::from("amqp:app:hunter2@rabbit");
        assert_eq!(
            scrub_url("Invalid URL: 'amqp:app:hunter2@rabbit'", &opaque),
            "Invalid URL: '***'"
        );
    }

    #[test]
    fn every_url_of_a_list_is_redacted_and_scrubbed() {
        let list = SecretString::from(
            "amqp://app:pw-one@rabbit-0:5672/vh, amqp://app:pw-two@rabbit-1:5672/vh,amqps://app:p%40w3@rabbit-2/vh",
        );
        assert_eq!(
            redact_url(&list),
            "amqp://app:***@rabbit-0:5672/vh,amqp://app:***@rabbit-1:5672/vh,amqps://app:***@rabbit-2/vh"
        );
        let text = "cannot connect to amqp://app:pw-two@rabbit-1:5672/vh (pw-one, p@w3, pw-two)";
        let scrubbed = scrub_url(text, &list);
        for secret in ["pw-one", "pw-two", "p@w3", "p%40w3"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        let kept = "amqp://app:***@rabbit-1:5672/vh";
        assert!(scrubbed.contains(kept), "{scrubbed}");
        let urls: Vec<_> = url_list(" a ,, b,").collect();
        assert_eq!(urls, ["a", "b"]);
    }

    #[test]
    fn a_database_url_with_several_hosts_is_one_url() {
        let url = SecretString::from(
            "postgres://app:s%40cret@db-a:5432,db-b:5433/orders?target_session_attrs=read-write",
        );
        assert_eq!(
            redact_database_url(&url),
            "postgres://app:***@db-a:5432,db-b:5433/orders?target_session_attrs=read-write"
        );
        let text = "cannot connect to postgres://app:s%40cret@db-a:5432,db-b:5433/orders?target_session_attrs=read-write (s@cret)";
        let scrubbed = scrub_database_url(text, &url);
        assert!(!scrubbed.contains("cret"), "{scrubbed}");
        let kept = "@db-a:5432,db-b:5433/orders";
        assert!(scrubbed.contains(kept), "{scrubbed}");
        let query =
            SecretString::from("postgres://app@db-a,db-b/orders?password=hunter2&sslmode=require");
        assert_eq!(
            redact_database_url(&query),
            "postgres://app:***@db-a,db-b/orders?password=***&sslmode=require"
        );
        assert!(!scrub_database_url("pw hunter2", &query).contains("hunter2"));
        let keywords = SecretString::from("host=db-a,db-b user=app password=hunter2");
        assert_eq!(redact_database_url(&keywords), "***");
    }
}
