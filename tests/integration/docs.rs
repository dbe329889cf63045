//! The README and the book (`docs/src`, an mdBook) against the code and the
//! repository: the README stays a short front door whose snippets are the
//! examples' own text; the book documents every setting and the operations
//! people need, lists every chapter in `SUMMARY.md`, and every relative link and
//! `#anchor` of both leads somewhere. The metrics catalog is checked next to the
//! metrics themselves (`src/telemetry/catalog.rs`); the README's snippets run
//! against the services in `readme.rs`.

use std::path::{Path, PathBuf};

use order_expiry::{CONSUMER_USER, PUBLISHER_USER};

/// The most lines the README may have: a newcomer reads it in five minutes.
const README_MAX_LINES: usize = 320;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn repo_file(path: &str) -> String {
    let full = root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every `.md` file under `docs/src`, as paths relative to the repository.
fn book_pages() -> Vec<String> {
    fn walk(dir: &Path, pages: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut pages = Vec::new();
    walk(&root().join("docs/src"), &mut pages);
    let mut pages: Vec<String> = pages
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .expect("under the root")
                .display()
                .to_string()
        })
        .collect();
    pages.sort();
    pages
}

/// The text of `markdown` outside fenced code blocks, line by line.
fn prose(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of `[text](target)` links and images outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    prose(markdown)
        .iter()
        .flat_map(|line| line.split("](").skip(1))
        .filter_map(|rest| rest.split(')').next())
        .map(str::to_owned)
        .collect()
}

/// mdBook's heading id: lowercase, whitespace to '-', alphanumerics, '-' and
/// '_' kept, every other character dropped (GitHub's rule for these headings).
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of every heading of `markdown`.
fn anchors(markdown: &str) -> Vec<String> {
    prose(markdown)
        .iter()
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#').trim()))
        .collect()
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
fn every_setting_is_in_the_configuration_reference() {
    let configuration = repo_file("docs/src/contract/configuration.md");
    let variables = default_setting_variables();
    assert!(variables.len() > 30, "{variables:?}");
    let missing: Vec<&String> = variables
        .iter()
        .filter(|v| !configuration.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/contract/configuration.md does not document {missing:?}"
    );
}

#[test]
fn the_operating_pages_cover_what_ops_need() {
    let operating: String = book_pages()
        .iter()
        .filter(|p| p.starts_with("docs/src/operating/"))
        .map(|p| repo_file(p))
        .collect();
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
        ("--log-format json", "JSON logs"),
        ("order-expiry status", "the status command"),
        ("parked replay", "replaying parked messages"),
        ("ladder migrate --from-prefix", "moving to another ladder"),
        ("deploy/grafana/order-expiry.json", "the dashboard"),
        ("/readyz", "readiness"),
        ("order_expiry_lateness_seconds", "the lateness alert"),
        ("rabbitmq_queue_messages_ready", "the due-queue depth alert"),
        ("order_expiry_retries_total", "the retries alert"),
        ("ORDER_EXPIRY__TOPOLOGY__REPLICAS", "the cluster's replicas"),
    ] {
        assert!(
            operating.contains(needle),
            "docs/src/operating does not cover {what} ({needle:?})"
        );
    }
}

#[test]
fn the_readme_is_a_short_front_door() {
    let readme = repo_file("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}: move the detail into docs/src"
    );
    for file in std::iter::once("README.md".to_owned()).chain(book_pages()) {
        assert!(
            !repo_file(&file).contains("DESIGN.md"),
            "{file} cites DESIGN.md, which is not in the repository"
        );
    }
    for (needle, what) in [
        ("docs/src/SUMMARY.md", "the book"),
        (
            "docs/src/how-it-works/architecture.md",
            "one order's journey",
        ),
        ("docs/src/contract/configuration.md", "every setting"),
        ("scripts/demo", "the demo"),
        ("scripts/test", "the tests"),
        ("/healthz", "liveness"),
        ("/readyz", "readiness"),
    ] {
        assert!(
            readme.contains(needle),
            "README should name {what} ({needle})"
        );
    }
}

/// The fenced blocks of `language` in `markdown`.
fn code_blocks(markdown: &str, language: &str) -> Vec<String> {
    let open = format!("```{language}\n");
    markdown
        .split(&open)
        .skip(1)
        .map(|rest| rest.split("\n```").next().unwrap_or("").to_owned() + "\n")
        .collect()
}

/// The README's Python and Rust snippets are the examples' own text, which the
/// integration tests run (`outbox_clients.rs`, `readme.rs`): a change to one
/// that is not made to the other fails here.
#[test]
fn the_readme_snippets_are_the_examples_own_text() {
    let readme = repo_file("README.md");
    for (language, example) in [
        ("python", "examples/python/order_service.py"),
        ("rust", "examples/outbox_order.rs"),
    ] {
        let blocks = code_blocks(&readme, language);
        assert_eq!(blocks.len(), 1, "README should have one {language} block");
        assert!(
            repo_file(example).contains(&blocks[0]),
            "the README's {language} snippet is not a part of {example}:\n{}",
            blocks[0]
        );
    }
    assert_eq!(code_blocks(&readme, "sql").len(), 1, "one SQL snippet");
}

/// mdBook renders only the chapters `SUMMARY.md` lists.
#[test]
fn every_chapter_is_in_the_summary() {
    let summary = repo_file("docs/src/SUMMARY.md");
    let listed: Vec<String> = links(&summary)
        .iter()
        .map(|l| format!("docs/src/{l}"))
        .collect();
    let missing: Vec<String> = book_pages()
        .into_iter()
        .filter(|p| p != "docs/src/SUMMARY.md" && !listed.contains(p))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/src/SUMMARY.md: {missing:#?}"
    );
}

/// Relative links of the README, deploy/README.md and the book lead to files
/// that exist, and each `#anchor` to a heading of its page.
#[test]
fn relative_links_and_anchors_resolve() {
    let mut files = vec!["README.md".to_owned(), "deploy/README.md".to_owned()];
    files.extend(book_pages());
    let mut broken = Vec::new();
    for file in &files {
        let text = repo_file(file);
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let page = if path.is_empty() {
                root().join(file)
            } else {
                root().join(dir).join(path)
            };
            if !page.exists() {
                broken.push(format!("{file}: {target}: no such file"));
                continue;
            }
            if fragment.is_empty() {
                continue;
            }
            let headings = std::fs::read_to_string(&page)
                .map(|t| anchors(&t))
                .unwrap_or_default();
            if !headings.iter().any(|h| h == fragment) {
                broken.push(format!("{file}: {target}: no heading #{fragment}"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn anchors_follow_mdbooks_rule() {
    assert_eq!(
        anchor("Message (version 2, a bundle)"),
        "message-version-2-a-bundle"
    );
    assert_eq!(
        anchor("Changing the ladder: `ladder migrate`"),
        "changing-the-ladder-ladder-migrate"
    );
    assert_eq!(anchor("The INSERT race"), "the-insert-race");
}
