//! One place that sets up logging (text or JSON lines on stderr) and, with
//! feature `otlp`, the bridge that exports spans.

use std::fmt::{Debug, Write};

use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Registry, fmt};

use crate::settings::LogFormat;
#[cfg(feature = "otlp")]
use crate::telemetry::{OtlpError, OtlpExport};

/// Installs the global tracing subscriber. `RUST_LOG` overrides `filter`. Logs go
/// to stderr so that stdout stays for command output (`topology export`).
/// Calling it twice (tests) keeps the first.
pub fn init_tracing(format: LogFormat, filter: &str) {
    let _ = tracing::dispatcher::set_global_default(dispatch(format, filter, None));
}

/// [`init_tracing`], and span export when `telemetry.otlp` or the `OTEL_*`
/// variables turn it on (feature `otlp`): the binary's one set-up. Keep the
/// returned export and [`OtlpExport::shutdown`] it last, or the last spans are
/// lost. Must run inside a tokio runtime.
#[cfg(feature = "otlp")]
pub fn init_tracing_and_export(
    format: LogFormat,
    filter: &str,
    otlp: &crate::settings::OtlpSettings,
) -> Result<Option<OtlpExport>, OtlpError> {
    let export = OtlpExport::start(otlp)?;
    let installed = tracing::dispatcher::set_global_default(dispatch_with_export(
        format,
        filter,
        export.as_ref(),
    ));
    if let Some(export) = &export {
        if installed.is_ok() {
            opentelemetry::global::set_tracer_provider(export.provider().clone());
        }
        let endpoint = secrecy::SecretString::from(export.endpoint().to_owned());
        let endpoint = crate::settings::redact_url(&endpoint);
        tracing::info!(%endpoint, "exporting spans over OTLP");
    }
    Ok(export)
}

/// The subscriber [`init_tracing_and_export`] installs, for a test to install
/// on its own thread (`tracing::dispatcher::set_default`).
#[cfg(feature = "otlp")]
pub fn dispatch_with_export(
    format: LogFormat,
    filter: &str,
    export: Option<&OtlpExport>,
) -> Dispatch {
    let otel = export.map(|e| Box::new(e.layer::<Registry>()) as OtelLayer);
    dispatch(format, filter, otel)
}

/// The subscriber `serve` installs when it exports, exporting to `provider`.
#[cfg(all(test, feature = "otlp"))]
pub(crate) fn dispatch_exporting_to(
    provider: &opentelemetry_sdk::trace::SdkTracerProvider,
) -> Dispatch {
    let otel = Box::new(super::otlp::layer::<Registry>(provider)) as OtelLayer;
    dispatch(LogFormat::Text, "info", Some(otel))
}

/// A layer that sees every span first (the OpenTelemetry bridge), boxed so the
/// subscriber has one type whichever features are on.
type OtelLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// What is exported when export is on, whatever the log filter says: a
/// `RUST_LOG=warn` for quieter logs must not cut every order's span. The AMQP
/// client's own spans (its I/O loop) tell an operator nothing about an order.
/// Each order's `tracing` span (target `service::ORDER_SPAN`) is for the
/// logs: its exported span is made apart (`telemetry::spans`).
const EXPORTED: &str = "info,lapin=warn,order_expiry::consumer::order=off";

/// One subscriber for every binary and test: the OpenTelemetry layer when
/// export is on, the filter, then text or JSON lines on stderr. Without
/// export the filter is global, as it always was; with it, the filter is the
/// logs' alone and the export has [`EXPORTED`].
fn dispatch(format: LogFormat, filter: &str, otel: Option<OtelLayer>) -> Dispatch {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let Some(otel) = otel else {
        let registry = tracing_subscriber::registry()
            .with(filter)
            .with(ExpectedNotFound);
        return match format {
            LogFormat::Text => Dispatch::new(registry.with(text())),
            LogFormat::Json => Dispatch::new(registry.with(json())),
        };
    };
    let registry = tracing_subscriber::registry()
        .with(otel.with_filter(EnvFilter::new(EXPORTED)))
        .with(ExpectedNotFound.with_filter(filter_fn(ExpectedNotFound::looks_at)));
    match format {
        LogFormat::Text => Dispatch::new(registry.with(text().with_filter(filter))),
        LogFormat::Json => Dispatch::new(registry.with(json().with_filter(filter))),
    }
}

/// Log lines as text on stderr.
fn text<S: Subscriber + for<'span> LookupSpan<'span>>() -> impl Layer<S> {
    fmt::layer().with_writer(std::io::stderr)
}

/// Log lines as JSON on stderr, each with its span's fields.
fn json<S: Subscriber + for<'span> LookupSpan<'span>>() -> impl Layer<S> {
    fmt::layer()
        .json()
        .with_current_span(true)
        .with_writer(std::io::stderr)
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
///
/// Beside the export's filtered layer it is filtered too, to the lines it
/// looks at: a layer without a filter among filtered ones takes every level,
/// and `tracing::enabled!` would then answer yes to lines no one logs. (A
/// per-layer filter of the log lines instead would leave tracing-subscriber's
/// per-thread filter state stale when it drops the only layer's line.)
struct ExpectedNotFound;

impl ExpectedNotFound {
    /// The lines it may drop: lapin's errors.
    fn looks_at(metadata: &Metadata<'_>) -> bool {
        *metadata.level() == Level::ERROR && metadata.target().starts_with("lapin")
    }
}

impl<S: Subscriber> Layer<S> for ExpectedNotFound {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        if !Self::looks_at(event.metadata()) {
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

#[cfg(all(test, feature = "otel", feature = "service"))]
mod tests {
    use super::*;

    /// Whether a debug line of the consumer would be logged under `dispatch`.
    fn consumer_debug(dispatch: &Dispatch) -> bool {
        tracing::dispatcher::with_default(
            dispatch,
            || tracing::enabled!(target: crate::service::CONSUMER, Level::DEBUG),
        )
    }

    fn exporting() -> Option<OtelLayer> {
        Some(Box::new(tracing_opentelemetry::layer()))
    }

    /// The consumer records a cancel's outcome on its span only when its
    /// debug line is logged: the answer must follow the log filter, export
    /// or not (an unfiltered layer beside the export's once made it yes).
    #[test]
    fn a_debug_line_is_enabled_only_where_the_log_filter_says() {
        for format in [LogFormat::Text, LogFormat::Json] {
            assert!(!consumer_debug(&dispatch(format, "info", None)));
            assert!(!consumer_debug(&dispatch(format, "info", exporting())));
            let debug = "info,order_expiry::consumer=debug";
            assert!(consumer_debug(&dispatch(format, debug, None)));
            assert!(consumer_debug(&dispatch(format, debug, exporting())));
        }
    }
}
