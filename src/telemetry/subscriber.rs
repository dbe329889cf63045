//! One place that sets up logging: text or JSON lines on stderr.

use std::fmt::{Debug, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

use crate::settings::LogFormat;

/// Installs the global tracing subscriber. `RUST_LOG` overrides `filter`. Logs go
/// to stderr so that stdout stays for command output (`topology export`).
/// Calling it twice (tests) keeps the first.
pub fn init_tracing(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(ExpectedNotFound);
    let _ = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// For tests: logs only when `TEST_LOG` is set, so a passing run stays quiet.
pub fn init_tracing_for_tests() {
    if std::env::var_os("TEST_LOG").is_some() {
        init_tracing(LogFormat::Text, "info,order_expiry=debug");
    }
}

/// Drops lapin's ERROR "Channel closed" line when the 404 that closed the
/// channel is the answer a topology look asked for (an exchange that should
/// not exist: `topology::guard`). Every other lapin line passes.
struct ExpectedNotFound;

impl<S: Subscriber> Layer<S> for ExpectedNotFound {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let metadata = event.metadata();
        if *metadata.level() != Level::ERROR || !metadata.target().starts_with("lapin") {
            return true;
        }
        let mut fields = FieldsText(String::new());
        event.record(&mut fields);
        !crate::topology::is_probe_miss(&fields.0)
    }
}

/// An event's fields as one line of text.
struct FieldsText(String);

impl Visit for FieldsText {
    fn record_debug(&mut self, _: &Field, value: &dyn Debug) {
        let _ = write!(self.0, "{value:?} ");
    }
}
