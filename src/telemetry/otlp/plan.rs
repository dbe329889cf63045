//! Whether and where spans are exported, decided from `telemetry.otlp` and the
//! standard `OTEL_*` variables in one pure function, so every rule of
//! precedence has a unit test and the exporter is built from one answer.
//!
//! The rules (docs/src/contract/configuration.md):
//! - `OTEL_SDK_DISABLED=true` turns export off, whatever else is set.
//! - Export is on when `telemetry.otlp.enabled` is true or either endpoint
//!   variable is set.
//! - A standard variable wins over its `telemetry.otlp` key: a platform (the
//!   OpenTelemetry Operator, a collector sidecar's manifest) sets the same
//!   `OTEL_*` for every service, and expects each to obey them.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;
use thiserror::Error;

use crate::settings::OtlpSettings;

/// Where the traces go when only a base URL is given (OTLP/HTTP).
const TRACES_PATH: &str = "/v1/traces";

/// Spans per export request, unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says
/// otherwise: a quarter of the SDK's 512. A request of 512 order spans is
/// about 210 kB, above the 128 kB from which glibc maps fresh pages for a
/// buffer and unmaps them when it is freed: in a traced flash sale, a quarter
/// of the export thread's time went to faulting in and copying into new pages.
/// A full request of 128 stays under it, and its buffers are reused.
const EXPORT_BATCH: usize = 128;

/// Links a span keeps, unless `OTEL_SPAN_LINK_COUNT_LIMIT` says otherwise:
/// a batch's span links to each order it carried, and at the SDK's own limit
/// (128) a batch of the default `consumer.batch_max` (200) lost the links to
/// its last 72. A link is about 30 bytes of OTLP.
pub(crate) const LINKS_PER_SPAN: u32 = 1_024;

/// The answer: what the exporter and the tracer provider are built with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExportPlan {
    /// The full URL spans are POSTed to, `/v1/traces` included.
    pub(crate) traces_endpoint: String,
    /// The resource's `service.name`.
    pub(crate) service_name: String,
    /// Which spans are recorded and exported.
    pub(crate) sampler: SamplerChoice,
    /// The other resource attributes, in order, each key once.
    pub(crate) resource: Vec<(String, String)>,
    /// Spans per export request: [`EXPORT_BATCH`], or `None` where
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` is set (the SDK reads it itself).
    pub(crate) export_batch: Option<usize>,
    /// Links per span: [`LINKS_PER_SPAN`], or `None` where
    /// `OTEL_SPAN_LINK_COUNT_LIMIT` is set (the SDK reads it itself).
    pub(crate) links_per_span: Option<u32>,
}

/// The samplers of `OTEL_TRACES_SAMPLER` this build knows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SamplerChoice {
    /// Every span.
    AlwaysOn,
    /// No span.
    AlwaysOff,
    /// This fraction of traces, chosen by trace id.
    Ratio(f64),
    /// A span with a parent follows the parent's decision; a root uses the inner one.
    ParentBased(Box<SamplerChoice>),
}

/// A variable or key that cannot be understood: start-up stops and says which.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum OtlpConfigError {
    /// An unknown sampler name.
    #[error(
        "{source_name}: unknown sampler {value:?} (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)"
    )]
    Sampler {
        /// `OTEL_TRACES_SAMPLER` or `telemetry.otlp.sampler`.
        source_name: &'static str,
        /// What it said.
        value: String,
    },
    /// A ratio that is not a number from 0 to 1.
    #[error("{source_name}: {value:?} is not a ratio from 0.0 to 1.0")]
    Ratio {
        /// `OTEL_TRACES_SAMPLER_ARG` or `telemetry.otlp.sampler_arg`.
        source_name: &'static str,
        /// What it said.
        value: String,
    },
    /// A resource attribute list that is not `key=value,key=value`.
    #[error("{source_name}: {entry:?} is not key=value")]
    ResourceAttribute {
        /// `OTEL_RESOURCE_ATTRIBUTES` or `telemetry.otlp.resource_attributes`.
        source_name: &'static str,
        /// The entry.
        entry: String,
    },
}

/// The plan for these settings and variables (`env` looks one up), or `None`
/// when export is off.
pub(crate) fn plan(
    settings: &OtlpSettings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ExportPlan>, OtlpConfigError> {
    // An empty variable counts as unset, as the specification asks.
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let traces_endpoint = match (
        var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        var("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(traces), _) => traces,
        (None, Some(base)) => with_traces_path(&base),
        (None, None) if settings.enabled => with_traces_path(&settings.endpoint),
        (None, None) => return Ok(None),
    };
    let sampler = match var("OTEL_TRACES_SAMPLER") {
        Some(name) => sampler(
            "OTEL_TRACES_SAMPLER",
            &name,
            var("OTEL_TRACES_SAMPLER_ARG").as_deref(),
            "OTEL_TRACES_SAMPLER_ARG",
        )?,
        None => sampler(
            "telemetry.otlp.sampler",
            &settings.sampler,
            Some(&settings.sampler_arg.to_string()),
            "telemetry.otlp.sampler_arg",
        )?,
    };
    let mut resource = attributes(
        "telemetry.otlp.resource_attributes",
        &settings.resource_attributes,
    )?;
    if let Some(list) = var("OTEL_RESOURCE_ATTRIBUTES") {
        for (key, value) in attributes("OTEL_RESOURCE_ATTRIBUTES", &list)? {
            resource.retain(|(k, _)| *k != key);
            resource.push((key, value));
        }
    }
    // OTEL_SERVICE_NAME, then service.name of the attributes, then the setting.
    let listed_name = resource
        .iter()
        .position(|(k, _)| k == "service.name")
        .map(|i| resource.remove(i).1);
    let service_name = var("OTEL_SERVICE_NAME")
        .or(listed_name)
        .unwrap_or_else(|| settings.service_name.clone());
    let export_batch = var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
        .is_none()
        .then_some(EXPORT_BATCH);
    let links_per_span = var("OTEL_SPAN_LINK_COUNT_LIMIT")
        .is_none()
        .then_some(LINKS_PER_SPAN);
    Ok(Some(ExportPlan {
        traces_endpoint,
        service_name,
        sampler,
        resource,
        export_batch,
        links_per_span,
    }))
}

/// A base URL with `/v1/traces` appended, one slash between them.
fn with_traces_path(base: &str) -> String {
    format!("{}{TRACES_PATH}", base.trim().trim_end_matches('/'))
}

fn sampler(
    source_name: &'static str,
    name: &str,
    arg: Option<&str>,
    arg_name: &'static str,
) -> Result<SamplerChoice, OtlpConfigError> {
    let ratio = || -> Result<f64, OtlpConfigError> {
        // The specification's default ratio when no argument is given.
        let Some(arg) = arg else { return Ok(1.0) };
        match arg.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(OtlpConfigError::Ratio {
                source_name: arg_name,
                value: arg.to_owned(),
            }),
        }
    };
    let parent_based = |root| SamplerChoice::ParentBased(Box::new(root));
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::Ratio(ratio()?),
        "parentbased_always_on" => parent_based(SamplerChoice::AlwaysOn),
        "parentbased_always_off" => parent_based(SamplerChoice::AlwaysOff),
        "parentbased_traceidratio" => parent_based(SamplerChoice::Ratio(ratio()?)),
        _ => {
            return Err(OtlpConfigError::Sampler {
                source_name,
                value: name.to_owned(),
            });
        }
    })
}

/// `key=value,key=value` (the `OTEL_RESOURCE_ATTRIBUTES` form, values
/// percent-decoded); a later key replaces an earlier one.
fn attributes(
    source_name: &'static str,
    list: &str,
) -> Result<Vec<(String, String)>, OtlpConfigError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || OtlpConfigError::ResourceAttribute {
            source_name,
            entry: entry.to_owned(),
        };
        let (key, value) = entry.split_once('=').ok_or_else(bad)?;
        let key = key.trim();
        if key.is_empty() {
            return Err(bad());
        }
        let value: Cow<'_, str> = percent_decode_str(value.trim()).decode_utf8_lossy();
        out.retain(|(k, _)| k != key);
        out.push((key.to_owned(), value.into_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Settings;

    fn plan_with(settings: &OtlpSettings, vars: &[(&str, &str)]) -> Option<ExportPlan> {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        plan(settings, &env).unwrap()
    }

    fn defaults() -> OtlpSettings {
        Settings::default().telemetry.otlp
    }

    fn enabled() -> OtlpSettings {
        OtlpSettings {
            enabled: true,
            ..defaults()
        }
    }

    #[test]
    fn off_by_default_and_on_by_the_setting_or_an_endpoint_variable() {
        assert_eq!(plan_with(&defaults(), &[]), None);
        assert_eq!(plan_with(&defaults(), &[("OTEL_SERVICE_NAME", "x")]), None);
        let on = plan_with(&enabled(), &[]).unwrap();
        assert_eq!(on.traces_endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(on.service_name, "order-expiry");
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        let on = plan_with(&defaults(), &base).unwrap();
        assert_eq!(on.traces_endpoint, "http://collector:4318/v1/traces");
        let traces = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom")];
        let on = plan_with(&defaults(), &traces).unwrap();
        assert_eq!(on.traces_endpoint, "http://c:4318/custom", "used as given");
        // An empty variable is unset.
        assert_eq!(
            plan_with(&defaults(), &[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]),
            None
        );
    }

    #[test]
    fn export_requests_hold_128_spans_unless_the_sdk_variable_says() {
        assert_eq!(plan_with(&enabled(), &[]).unwrap().export_batch, Some(128));
        let set = [("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512")];
        assert_eq!(plan_with(&enabled(), &set).unwrap().export_batch, None);
        let empty = [("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", " ")];
        assert_eq!(
            plan_with(&enabled(), &empty).unwrap().export_batch,
            Some(128)
        );
    }

    #[test]
    fn a_span_keeps_1024_links_unless_the_sdk_variable_says() {
        let plan = plan_with(&enabled(), &[]).unwrap();
        assert_eq!(plan.links_per_span, Some(1_024));
        let set = [("OTEL_SPAN_LINK_COUNT_LIMIT", "128")];
        assert_eq!(plan_with(&enabled(), &set).unwrap().links_per_span, None);
    }

    #[test]
    fn sdk_disabled_wins_over_everything() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ];
        assert_eq!(plan_with(&enabled(), &vars), None);
        let not_disabled = [("OTEL_SDK_DISABLED", "false")];
        assert!(plan_with(&enabled(), &not_disabled).is_some());
    }

    #[test]
    fn standard_variables_win_over_the_settings() {
        let settings = OtlpSettings {
            endpoint: "http://from-settings:4318".into(),
            service_name: "from-settings".into(),
            sampler: "always_off".into(),
            resource_attributes: "deployment.environment=staging,team=payments".into(),
            ..enabled()
        };
        let from_settings = plan_with(&settings, &[]).unwrap();
        assert_eq!(
            from_settings.traces_endpoint,
            "http://from-settings:4318/v1/traces"
        );
        assert_eq!(from_settings.service_name, "from-settings");
        assert_eq!(from_settings.sampler, SamplerChoice::AlwaysOff);
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod%20eu",
            ),
        ];
        let from_env = plan_with(&settings, &vars).unwrap();
        assert_eq!(from_env.traces_endpoint, "http://from-env:4318/v1/traces");
        assert_eq!(from_env.service_name, "from-env");
        let quarter = SamplerChoice::ParentBased(Box::new(SamplerChoice::Ratio(0.25)));
        assert_eq!(from_env.sampler, quarter);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        let expected = pairs(&[("team", "payments"), ("deployment.environment", "prod eu")]);
        assert_eq!(from_env.resource, expected);
    }

    #[test]
    fn service_name_comes_from_otel_service_name_then_the_attributes() {
        let listed = [("OTEL_RESOURCE_ATTRIBUTES", "service.name=listed,a=b")];
        let plan = plan_with(&enabled(), &listed).unwrap();
        assert_eq!(plan.service_name, "listed");
        assert_eq!(plan.resource, [("a".to_owned(), "b".to_owned())]);
        let both = [listed[0], ("OTEL_SERVICE_NAME", "named")];
        assert_eq!(plan_with(&enabled(), &both).unwrap().service_name, "named");
    }

    #[test]
    fn the_default_sampler_follows_the_parent_and_samples_every_root() {
        let plan = plan_with(&enabled(), &[]).unwrap();
        let expected = SamplerChoice::ParentBased(Box::new(SamplerChoice::AlwaysOn));
        assert_eq!(plan.sampler, expected);
        let ratio = [("OTEL_TRACES_SAMPLER", "traceidratio")];
        let plan = plan_with(&enabled(), &ratio).unwrap();
        assert_eq!(plan.sampler, SamplerChoice::Ratio(1.0), "no argument: 1.0");
    }

    #[test]
    fn what_cannot_be_understood_is_an_error_naming_its_source() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let unknown = plan(
            &enabled(),
            &env(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]),
        );
        let message = unknown.unwrap_err().to_string();
        assert!(
            message.starts_with("OTEL_TRACES_SAMPLER: unknown sampler"),
            "{message}"
        );
        let vars = &[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ];
        let ratio = plan(&enabled(), &env(vars)).unwrap_err();
        assert!(matches!(
            ratio,
            OtlpConfigError::Ratio {
                source_name: "OTEL_TRACES_SAMPLER_ARG",
                ..
            }
        ));
        let attributes = plan(&enabled(), &env(&[("OTEL_RESOURCE_ATTRIBUTES", "novalue")]));
        assert!(matches!(
            attributes,
            Err(OtlpConfigError::ResourceAttribute { .. })
        ));
    }
}
