//! Span export over OTLP/HTTP (protobuf) to an OpenTelemetry collector
//! (feature `otlp`): the tracer provider, its exporter, the `tracing` layer
//! that feeds it, and the flush at shutdown that keeps the last spans.
//!
//! Off unless `telemetry.otlp` or the standard `OTEL_*` variables turn it on
//! (`plan.rs` holds the rules). Off, nothing of it runs: no layer,
//! no thread, no connection.

mod client;
mod plan;

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use thiserror::Error;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

#[cfg(test)]
pub(crate) use self::plan::LINKS_PER_SPAN;
pub use self::plan::OtlpConfigError;
use self::plan::{ExportPlan, SamplerChoice};
use crate::settings::OtlpSettings;
use crate::telemetry::OrderSpans;

/// Bound on one export request, and on the flush at shutdown: a collector that
/// does not answer must not hold `serve`'s exit.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The instrumentation scope of every span this crate exports.
const SCOPE: &str = "order-expiry";

/// Why export could not start, or could not flush. Each message includes its
/// cause (none is a `source`), so it reads whole in one log field.
#[derive(Debug, Error)]
pub enum OtlpError {
    /// A `telemetry.otlp` key or an `OTEL_*` variable that cannot work.
    #[error(transparent)]
    Config(#[from] OtlpConfigError),
    /// The exporter refused its configuration (an endpoint that is no URL).
    #[error("OTLP exporter: {0}")]
    Exporter(opentelemetry_otlp::ExporterBuildError),
    /// The HTTP client could not be built.
    #[error("OTLP HTTP client: {0}")]
    Client(reqwest::Error),
    /// Export sends from the tokio runtime it was started on; there was none.
    #[error("span export must start inside a tokio runtime")]
    NoRuntime,
    /// A flush or the shutdown did not complete (the collector down or slow).
    #[error("flushing spans: {0}")]
    Flush(OTelSdkError),
}

/// Spans leaving for a collector: the tracer provider with its batch exporter.
/// [`OtlpExport::layer`] feeds it from `tracing`; [`OtlpExport::shutdown`]
/// sends what is still buffered.
#[derive(Debug)]
pub struct OtlpExport {
    provider: SdkTracerProvider,
    endpoint: String,
}

impl OtlpExport {
    /// Starts export if `settings` or the process's `OTEL_*` variables say so
    /// (`None`: export is off). Must run inside a tokio runtime, which then
    /// carries the export requests.
    pub fn start(settings: &OtlpSettings) -> Result<Option<Self>, OtlpError> {
        Self::start_with(settings, &|name| std::env::var(name).ok())
    }

    /// [`OtlpExport::start`] reading the `OTEL_*` variables through `env`
    /// instead of the process environment (tests run in parallel in one
    /// process). The exporter's own variables (`OTEL_EXPORTER_OTLP_HEADERS`,
    /// `..._TIMEOUT`) are still read from the process.
    pub fn start_with(
        settings: &OtlpSettings,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, OtlpError> {
        let Some(plan) = plan::plan(settings, env)? else {
            return Ok(None);
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| OtlpError::NoRuntime)?;
        let http = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(OtlpError::Client)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client::RuntimeHttpClient::new(http, runtime))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(plan.traces_endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(OtlpError::Exporter)?;
        let mut batch = BatchConfigBuilder::default();
        if let Some(spans) = plan.export_batch {
            batch = batch.with_max_export_batch_size(spans);
        }
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch.build())
            .build();
        let mut provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler(&plan.sampler))
            .with_resource(resource(&plan));
        if let Some(links) = plan.links_per_span {
            provider = provider.with_max_links_per_span(links);
        }
        let provider = provider.build();
        Ok(Some(Self {
            provider,
            endpoint: plan.traces_endpoint,
        }))
    }

    /// The URL spans are sent to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of this
    /// provider, with the tracer the consumer makes each order's span with
    /// ([`OrderSpans`]).
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + Send + Sync + for<'span> LookupSpan<'span>,
    {
        layer(&self.provider)
    }

    /// The provider, for `opentelemetry::global` and for code that makes
    /// OpenTelemetry spans directly.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Sends every finished span still buffered, and waits for the answer.
    /// The spans of orders already dropped are finished first.
    pub async fn flush(&self) -> Result<(), OtlpError> {
        let provider = self.provider.clone();
        blocking(move || {
            crate::telemetry::spans::drain(EXPORT_TIMEOUT);
            provider.force_flush()
        })
        .await
    }

    /// Sends what is still buffered and stops the export thread: call it last,
    /// after `serve` has drained, so the last spans are not lost. Bounded by
    /// the export timeout.
    pub async fn shutdown(self) -> Result<(), OtlpError> {
        let provider = self.provider;
        blocking(move || {
            crate::telemetry::spans::drain(EXPORT_TIMEOUT);
            provider.shutdown_with_timeout(EXPORT_TIMEOUT)
        })
        .await
    }
}

/// [`OtlpExport::layer`] for `provider`. A span carries its own fields and
/// nothing the bridge could add by itself (source location, thread, busy and
/// idle time, target): they would cost every span a clock read or a string,
/// and tell an operator nothing about an order. Entering a span does not make
/// its context the thread's current one: nothing here reads
/// `opentelemetry::Context::current()` (each context passed on is read off its
/// span), and at a flash sale's 20,000 orders a second the attach and detach
/// on every poll of every order's span was a cost of its own.
pub(crate) fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + Send + Sync + 'static
where
    S: Subscriber + Send + Sync + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(SCOPE))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_context_activation(false)
        .and_then(OrderSpans::new(provider.tracer(SCOPE)))
}

/// The SDK's flush and shutdown block their thread until the batch thread has
/// exported, and the export requests run on this runtime: so they wait on a
/// blocking thread, leaving the runtime free (even a current-thread one).
async fn blocking(
    call: impl FnOnce() -> Result<(), OTelSdkError> + Send + 'static,
) -> Result<(), OtlpError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(OtlpError::Flush),
        Err(join) => Err(OtlpError::Flush(OTelSdkError::InternalFailure(
            join.to_string(),
        ))),
    }
}

fn sampler(choice: &SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::Ratio(ratio) => Sampler::TraceIdRatioBased(*ratio),
        SamplerChoice::ParentBased(root) => Sampler::ParentBased(Box::new(sampler(root))),
    }
}

/// `service.name` and the listed attributes, nothing detected behind the
/// plan's back (the SDK's default builder would read `OTEL_*` again).
fn resource(plan: &ExportPlan) -> Resource {
    let attributes = plan
        .resource
        .iter()
        .map(|(key, value)| KeyValue::new(key.clone(), value.clone()));
    Resource::builder_empty()
        .with_service_name(plan.service_name.clone())
        .with_attributes(attributes)
        .build()
}
