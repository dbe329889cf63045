//! One place that sets up logging: text or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

/// Installs the global tracing subscriber. `RUST_LOG` overrides `filter`. Logs go
/// to stderr so that stdout stays for command output (`topology export`).
/// Calling it twice (tests) keeps the first.
pub fn init_tracing(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
}

/// For tests: logs only when `TEST_LOG` is set, so a passing run stays quiet.
pub fn init_tracing_for_tests() {
    if std::env::var_os("TEST_LOG").is_some() {
        init_tracing(LogFormat::Text, "info,order_expiry=debug");
    }
}
