//! Tracing off or on for one run, as production would have it: what serve's
//! environment says, and the context each order is scheduled with.

use anyhow::Context;
use order_expiry::publisher::TraceContext;
use rand::Rng;

/// Whether a run is traced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracing {
    /// Export off, orders without a context: the product's default. Serve is
    /// told `OTEL_SDK_DISABLED=true`, so an `OTEL_*` variable this process
    /// inherited cannot turn export on behind the comparison's back.
    Off,
    /// Serve exports every span over OTLP/HTTP to `endpoint` with the default
    /// sampler (`parentbased_always_on`), and every order carries a sampled
    /// W3C context of its own, as from an order service that traces every
    /// order.
    On {
        /// The collector's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`).
        endpoint: String,
    },
}

impl Tracing {
    /// `off` or `on`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On { .. } => "on",
        }
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        matches!(self, Self::On { .. })
    }

    /// The variables serve is started with. An empty variable counts as
    /// unset (the OpenTelemetry specification, and `telemetry/otlp/plan.rs`),
    /// so "on" also blanks those that would turn export off or send the
    /// spans elsewhere.
    pub(crate) fn serve_env(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Off => vec![("OTEL_SDK_DISABLED", "true".to_owned())],
            Self::On { endpoint } => vec![
                ("OTEL_SDK_DISABLED", String::new()),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", String::new()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
                ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
            ],
        }
    }

    /// The context of a new order: a fresh sampled one when on, none when off.
    pub(crate) fn order_context(&self) -> anyhow::Result<Option<TraceContext>> {
        match self {
            Self::Off => Ok(None),
            Self::On { .. } => sampled_context(&mut rand::rng()).map(Some),
        }
    }
}

/// `00-<32 random hex>-<16 random hex>-01`: a new trace, sampled, with a
/// random parent span, as an order service's checkout span would have.
pub(crate) fn sampled_context(rng: &mut impl Rng) -> anyhow::Result<TraceContext> {
    // Neither id may be all zeros (W3C).
    let trace_id: u128 = rng.random_range(1..=u128::MAX);
    let span_id: u64 = rng.random_range(1..=u64::MAX);
    let traceparent = format!("00-{trace_id:032x}-{span_id:016x}-01");
    TraceContext::parse(&traceparent, None).with_context(|| format!("traceparent {traceparent}"))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn contexts_are_valid_sampled_and_each_of_its_own() {
        let mut rng = StdRng::seed_from_u64(38);
        let a = sampled_context(&mut rng).unwrap();
        let b = sampled_context(&mut rng).unwrap();
        assert_ne!(a.trace_id(), b.trace_id());
        for c in [&a, &b] {
            let t = c.traceparent();
            assert_eq!(t.len(), 55, "{t}");
            assert!(t.starts_with("00-") && t.ends_with("-01"), "{t}");
            assert_eq!(c.tracestate(), None);
        }
        assert!(Tracing::Off.order_context().unwrap().is_none());
        let on = Tracing::On {
            endpoint: "http://127.0.0.1:1".to_owned(),
        };
        assert!(on.order_context().unwrap().is_some());
    }

    #[test]
    fn off_disables_export_and_on_points_it_at_the_sink() {
        assert_eq!(
            Tracing::Off.serve_env(),
            [("OTEL_SDK_DISABLED", "true".to_owned())]
        );
        let on = Tracing::On {
            endpoint: "http://127.0.0.1:4318".to_owned(),
        };
        let env = on.serve_env();
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
            Some("http://127.0.0.1:4318")
        );
        assert_eq!(get("OTEL_TRACES_SAMPLER"), Some("parentbased_always_on"));
        assert_eq!(get("OTEL_SDK_DISABLED"), Some(""));
        assert_eq!(get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), Some(""));
    }
}
