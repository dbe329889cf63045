//! Logs, metrics and traces: the catalog of every metric (publisher and service
//! alike); with the service, the tracing subscriber and the Prometheus
//! recorder; with `otlp`, span export to an OpenTelemetry collector.

mod catalog;
#[cfg(feature = "otlp")]
mod otlp;
#[cfg(feature = "service")]
mod recorder;
#[cfg(feature = "service")]
pub(crate) mod spans;
#[cfg(feature = "service")]
mod subscriber;

pub(crate) use self::catalog::*;
#[cfg(all(test, feature = "otlp"))]
pub(crate) use self::otlp::LINKS_PER_SPAN;
#[cfg(feature = "otlp")]
pub use self::otlp::{OtlpConfigError, OtlpError, OtlpExport};
#[cfg(feature = "service")]
pub(crate) use self::recorder::metrics_handle;
#[cfg(all(feature = "service", feature = "otel"))]
pub use self::spans::OrderSpans;
#[cfg(all(test, feature = "otlp"))]
pub(crate) use self::subscriber::dispatch_exporting_to;
/// For the tests of this workspace (a subscriber with export on a test's own
/// thread); not for users, who call [`init_tracing_and_export`].
#[cfg(feature = "otlp")]
#[doc(hidden)]
pub use self::subscriber::dispatch_with_export;
#[cfg(feature = "service")]
pub use self::subscriber::init_tracing;
#[cfg(feature = "otlp")]
pub use self::subscriber::init_tracing_and_export;
/// For the tests of this workspace (output only with `TEST_LOG`); not for users.
#[cfg(feature = "service")]
#[doc(hidden)]
pub use self::subscriber::init_tracing_for_tests;
