//! A dependent with `order-expiry = { default-features = false }` gets the
//! publisher only: none of the crates the service, the CLI or the benchmarks
//! need may enter that dependency tree, nor OpenTelemetry's unless it asks
//! for the `otel` feature.

use std::process::Command;

use order_expiry_testkit::succeeded;

/// Crates that must stay out of the publisher-only tree, as `name vX` prefixes
/// of `cargo tree` lines (a name alone is any version). `rand v0.10` does
/// appear there: lapin's TLS stack (p12-keystore) brings it; ours (0.9, the
/// demo's) must not.
const SERVICE_ONLY: &str = "anyhow axum clap criterion deadpool-postgres humantime hyper indicatif \
    metrics-exporter-prometheus plotters postgres-protocol rand@v0.9 reqwest tokio-postgres \
    tokio-util tracing-subscriber opentelemetry opentelemetry_sdk opentelemetry-otlp \
    opentelemetry-http opentelemetry-proto prost tracing-opentelemetry";

/// Of the service's crates, the `outbox` feature may bring only PostgreSQL's
/// client (and what it needs itself: its protocol crates, tokio-util, rand).
const OUTBOX_MAY_ADD: &str = "postgres-protocol rand@v0.9 tokio-postgres tokio-util";

/// What the `otel` feature adds to the publisher: the OpenTelemetry API, the
/// bridge from `tracing` spans, and the `tracing-subscriber` registry that the
/// bridge is a layer of (with its two small crates). Nothing else.
const OTEL_ADDS: &str = "opentelemetry tracing-opentelemetry tracing-subscriber sharded-slab \
    thread_local";

/// Whether a `cargo tree` line is one of `crates` (see [`SERVICE_ONLY`]).
fn is_one_of(line: &str, crates: &str) -> bool {
    let prefix = |c: &str| c.replace('@', " ") + if c.contains('@') { "" } else { " " };
    crates
        .split_whitespace()
        .any(|c| line.starts_with(&prefix(c)))
}

fn tree(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args("tree -p order-expiry -e normal --prefix none --offline --locked".split(' '))
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    let mut crates: Vec<String> = succeeded("cargo tree", &out)
        .lines()
        .map(|l| l.trim_end_matches(" (*)").to_owned())
        .collect();
    crates.sort();
    crates.dedup();
    crates
}

fn service_only(crates: &[String]) -> Vec<&String> {
    crates
        .iter()
        .filter(|c| is_one_of(c, SERVICE_ONLY))
        .collect()
}

#[test]
fn the_publisher_only_tree_has_no_service_crates() {
    let publisher = tree(&["--no-default-features"]);
    let leaked = service_only(&publisher);
    assert!(leaked.is_empty(), "in the publisher-only tree: {leaked:?}");
    // The check itself works: the default tree does have them.
    let service = tree(&[]);
    let found = service_only(&service);
    assert!(
        found.len() >= 8,
        "the service tree lacks its crates: {found:?}"
    );
    let exports = service.iter().any(|c| c.starts_with("opentelemetry-otlp "));
    assert!(
        exports,
        "the default binary can export spans (feature otlp)"
    );
    eprintln!(
        "FIGURES dependencies: {} crates publisher-only, {} with the service",
        publisher.len(),
        service.len()
    );
}

#[test]
fn the_outbox_feature_adds_tokio_postgres_and_no_service_crate() {
    let outbox = tree(&["--no-default-features", "--features", "outbox"]);
    let has_postgres = outbox.iter().any(|c| c.starts_with("tokio-postgres "));
    assert!(has_postgres, "schedule_in_tx needs tokio-postgres");
    let leaked: Vec<&String> = service_only(&outbox)
        .into_iter()
        .filter(|c| !is_one_of(c, OUTBOX_MAY_ADD))
        .collect();
    assert!(leaked.is_empty(), "in the outbox tree: {leaked:?}");
    let n = outbox.len();
    eprintln!("FIGURES dependencies: {n} crates with --features outbox");
}

#[test]
fn the_otel_feature_adds_opentelemetrys_api_and_bridge_only() {
    let publisher = tree(&["--no-default-features"]);
    let otel = tree(&["--no-default-features", "--features", "otel"]);
    let in_publisher: Vec<&String> = publisher
        .iter()
        .filter(|c| is_one_of(c, OTEL_ADDS))
        .collect();
    assert!(in_publisher.is_empty(), "without otel: {in_publisher:?}");
    let added: Vec<&String> = otel.iter().filter(|c| !publisher.contains(c)).collect();
    let unexpected: Vec<&&String> = added.iter().filter(|c| !is_one_of(c, OTEL_ADDS)).collect();
    assert!(unexpected.is_empty(), "otel adds {unexpected:?}");
    assert!(
        added
            .iter()
            .any(|c| c.starts_with("tracing-opentelemetry ")),
        "{added:?}"
    );
    eprintln!("FIGURES dependencies: otel adds {} crates", added.len());
}
