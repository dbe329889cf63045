//! The README against the code and the repository: it stands on its own (no
//! reference to a design document outside the repository), documents every
//! setting and the operations people need, and its links lead somewhere. The
//! metrics catalog is checked next to the metrics themselves
//! (`src/telemetry/catalog.rs`).

use std::path::Path;

use order_expiry::{CONSUMER_USER, PUBLISHER_USER};

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn readme_section(title: &str) -> String {
    let readme = repo_file("README.md");
    readme
        .split("\n## ")
        .find(|s| s.starts_with(&format!("{title}\n")))
        .unwrap_or_else(|| panic!("README.md has no '## {title}' section"))
        .to_owned()
}

/// `ORDER_EXPIRY__SECTION__KEY` of every key set in `config/default.toml`.
fn default_setting_variables() -> Vec<String> {
    let mut section = String::new();
    let mut variables = Vec::new();
    for line in repo_file("config/default.toml").lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // `[action.http]` is `ORDER_EXPIRY__ACTION__HTTP__…`.
            section = name.to_uppercase().replace('.', "__");
        } else if let Some((key, _)) = line.split_once(" = ")
            && !line.starts_with('#')
        {
            variables.push(format!("ORDER_EXPIRY__{section}__{}", key.to_uppercase()));
        }
    }
    variables
}

#[test]
fn every_setting_is_documented() {
    let configuration = readme_section("The public contract");
    let variables = default_setting_variables();
    assert!(variables.len() > 30, "{variables:?}");
    let missing: Vec<&String> = variables
        .iter()
        .filter(|v| !configuration.contains(&format!("`{v}`")))
        .collect();
    assert!(missing.is_empty(), "README does not document {missing:?}");
}

#[test]
fn operations_cover_what_ops_need() {
    let operations = readme_section("Operations");
    for (needle, what) in [
        ("rabbitmqctl import_definitions", "importing definitions"),
        ("rabbitmqctl change_password", "setting passwords"),
        (PUBLISHER_USER, "the publisher user"),
        (CONSUMER_USER, "the consumer user"),
        ("docker compose", "deploying with compose"),
        (
            "kubectl apply -k deploy/kubernetes",
            "deploying with Kubernetes",
        ),
        ("amqps://", "TLS"),
        ("ORDER_EXPIRY__AMQP__TLS_CA_FILE", "the TLS CA setting"),
        ("deploy/grafana/order-expiry.json", "the dashboard"),
        ("/readyz", "readiness"),
        ("order_expiry_lateness_seconds", "the lateness alert"),
        ("rabbitmq_queue_messages_ready", "the due-queue depth alert"),
        ("order_expiry_retries_total", "the retries alert"),
    ] {
        assert!(
            operations.contains(needle),
            "README Operations does not cover {what} ({needle:?})"
        );
    }
    assert!(
        repo_file("README.md").contains("(#operations)"),
        "README should link to #operations"
    );
}

#[test]
fn the_readme_stands_on_its_own() {
    let readme = repo_file("README.md");
    assert!(
        !readme.contains("DESIGN.md"),
        "README cites DESIGN.md, which is not in the repository"
    );
    assert!(
        readme.contains("docs/architecture.md"),
        "README should point to docs/architecture.md"
    );
}

/// Relative links of the README and docs/ lead to files that exist.
#[test]
fn relative_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    for (file, dir) in [
        ("README.md", ""),
        ("docs/architecture.md", "docs"),
        ("deploy/README.md", "deploy"),
    ] {
        let text = repo_file(file);
        for target in text
            .split("](")
            .skip(1)
            .filter_map(|rest| rest.split(')').next())
        {
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !root.join(dir).join(path).exists() {
                broken.push(format!("{file}: {target}"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
