//! A dependent with `order-expiry = { default-features = false }` gets the
//! publisher only: none of the crates the service, the CLI or the benchmarks
//! need may enter that dependency tree.

use std::process::Command;

use order_expiry_testkit::succeeded;

/// Crates that must stay out of the publisher-only tree, as `name vX` prefixes
/// of `cargo tree` lines. `rand v0.10` does appear there: lapin's TLS stack
/// (p12-keystore) brings it; ours (0.9, the demo's) must not.
const SERVICE_ONLY: &[&str] = &[
    "anyhow ",
    "axum ",
    "clap ",
    "criterion ",
    "deadpool-postgres ",
    "humantime ",
    "hyper ",
    "indicatif ",
    "metrics-exporter-prometheus ",
    "plotters ",
    "postgres-protocol ",
    "rand v0.9",
    "reqwest ",
    "tokio-postgres ",
    "tokio-util ",
    "tracing-subscriber ",
];

fn tree(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "order-expiry",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--offline", "--locked"])
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
        .filter(|c| SERVICE_ONLY.iter().any(|s| c.starts_with(s)))
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
    eprintln!(
        "FIGURES dependencies: {} crates publisher-only, {} with the service",
        publisher.len(),
        service.len()
    );
}

/// Of the service's crates, the `outbox` feature may bring only PostgreSQL's
/// client (and what it needs itself: its protocol crates, tokio-util, rand).
const OUTBOX_MAY_ADD: &[&str] = &[
    "postgres-protocol ",
    "rand v0.9",
    "tokio-postgres ",
    "tokio-util ",
];

#[test]
fn the_outbox_feature_adds_tokio_postgres_and_no_service_crate() {
    let outbox = tree(&["--no-default-features", "--features", "outbox"]);
    assert!(
        outbox.iter().any(|c| c.starts_with("tokio-postgres ")),
        "schedule_in_tx needs tokio-postgres"
    );
    let leaked: Vec<&String> = service_only(&outbox)
        .into_iter()
        .filter(|c| !OUTBOX_MAY_ADD.iter().any(|ok| c.starts_with(ok)))
        .collect();
    assert!(leaked.is_empty(), "in the outbox tree: {leaked:?}");
    eprintln!(
        "FIGURES dependencies: {} crates with --features outbox",
        outbox.len()
    );
}
