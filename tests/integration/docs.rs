//! The book (`docs/src`, an mdBook) and the README against the code and the
//! repository: the book documents every setting with its real default and the
//! operations people need, lists every chapter in `SUMMARY.md`, and every
//! relative link and `#anchor` of the book and the READMEs leads somewhere. The
//! README's own checks are in `readme.rs`; the metrics catalog is checked next
//! to the metrics themselves (`src/telemetry/catalog.rs`).

use std::path::Path;

use order_expiry::{topology::CONSUMER_USER, topology::PUBLISHER_USER};

use crate::readme::code_blocks;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn repo_file(path: &str) -> String {
    let full = root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// Every `.md` file under `docs/src`, as paths relative to the repository.
pub(crate) fn book_pages() -> Vec<String> {
    fn walk(dir: &Path, pages: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                let relative = path.strip_prefix(root()).expect("under the root");
                pages.push(relative.display().to_string());
            }
        }
    }
    let mut pages = Vec::new();
    walk(&root().join("docs/src"), &mut pages);
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
    let kept = |c: &char| c.is_alphanumeric() || c.is_whitespace() || "-_".contains(*c);
    let dashed = |c: char| (if c.is_whitespace() { '-' } else { c }).to_ascii_lowercase();
    heading.chars().filter(kept).map(dashed).collect()
}

/// The anchors of every heading of `markdown`.
fn anchors(markdown: &str) -> Vec<String> {
    prose(markdown)
        .iter()
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#').trim()))
        .collect()
}

/// `ORDER_EXPIRY__SECTION__KEY` of every key set in `config/default.toml`, with
/// its value (unquoted; `None` for a multi-line string).
fn default_settings() -> Vec<(String, Option<String>)> {
    let mut section = String::new();
    let mut settings = Vec::new();
    let mut in_multiline = false;
    for line in repo_file("config/default.toml").lines() {
        let line = line.trim();
        if in_multiline {
            in_multiline = line.matches("\"\"\"").count() % 2 == 0;
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            // `[action.http]` is `ORDER_EXPIRY__ACTION__HTTP__…`.
            section = name.to_uppercase().replace('.', "__");
        } else if let Some((key, value)) = line.split_once(" = ")
            && !line.starts_with('#')
        {
            let variable = format!("ORDER_EXPIRY__{section}__{}", key.to_uppercase());
            in_multiline = value.matches("\"\"\"").count() % 2 == 1;
            let value = value.trim_matches('"');
            settings.push((variable, (!in_multiline).then(|| value.to_owned())));
        }
    }
    settings
}

#[test]
fn every_setting_is_in_the_configuration_reference() {
    let configuration = repo_file("docs/src/contract/configuration.md");
    let settings = default_settings();
    assert!(settings.len() > 30, "{settings:?}");
    let missing: Vec<&String> = settings
        .iter()
        .map(|(variable, _)| variable)
        .filter(|v| !configuration.contains(&format!("`{v}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/contract/configuration.md does not document {missing:?}"
    );
}

/// The operating pages (`docs/src/operating`) name each of these.
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
        ("kubectl apply -k deploy/kubernetes", "Kubernetes"),
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
        assert!(operating.contains(needle), "no {what} ({needle:?})");
    }
}

/// A row `| `ORDER_EXPIRY__…` | `default` | … |` of the README or the
/// configuration page gives the default `config/default.toml` sets.
#[test]
fn the_documented_defaults_are_the_defaults() {
    let settings = default_settings();
    let mut wrong = Vec::new();
    for file in ["README.md", "docs/src/contract/configuration.md"] {
        for line in repo_file(file).lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let cell = |i: usize| {
                let inner = cells.get(i)?.strip_prefix('`')?.strip_suffix('`')?;
                (!inner.contains('`')).then_some(inner)
            };
            let (Some(variable), Some(default)) = (cell(1), cell(2)) else {
                continue;
            };
            if !variable.starts_with("ORDER_EXPIRY__") {
                continue;
            }
            match settings.iter().find(|(v, _)| *v == variable) {
                None => wrong.push(format!("{file}: {variable} is not a setting")),
                Some((_, Some(value))) if *value != default => wrong.push(format!(
                    "{file}: {variable} says `{default}`, the default is `{value}`"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The cancel statement the Orders table page shows is the default one,
/// word for word (whitespace aside): users copy it for their own schema.
#[test]
fn the_orders_table_page_shows_the_default_cancel_sql() {
    let words = |sql: &str| sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let config = repo_file("config/default.toml");
    let default = config
        .split_once("cancel_sql = \"\"\"")
        .and_then(|(_, rest)| rest.split_once("\"\"\""))
        .map(|(sql, _)| words(sql))
        .expect("cancel_sql in config/default.toml");
    let page = repo_file("docs/src/contract/orders-table.md");
    let shown: Vec<String> = code_blocks(&page, "sql")
        .iter()
        .map(|sql| words(sql))
        .filter(|sql| sql.starts_with("UPDATE orders SET status = 'cancelled'"))
        .collect();
    assert_eq!(shown, [default], "docs/src/contract/orders-table.md");
}

/// mdBook renders only the chapters `SUMMARY.md` lists.
#[test]
fn every_chapter_is_in_the_summary() {
    let listed = links(&repo_file("docs/src/SUMMARY.md"));
    let listed = |page: &String| listed.iter().any(|l| *page == format!("docs/src/{l}"));
    let mut missing = book_pages();
    missing.retain(|p| p != "docs/src/SUMMARY.md" && !listed(p));
    assert!(
        missing.is_empty(),
        "not in docs/src/SUMMARY.md: {missing:#?}"
    );
}

/// Relative links of the README, CONTRIBUTING.md and the book lead to files
/// that exist, and each `#anchor` to a heading of its page; none cites
/// DESIGN.md, which is not in the repository.
#[test]
fn relative_links_and_anchors_resolve() {
    let mut files = vec!["README.md".to_owned(), "CONTRIBUTING.md".to_owned()];
    files.extend(book_pages());
    let mut broken = Vec::new();
    for file in &files {
        let text = repo_file(file);
        if text.contains("DESIGN.md") {
            broken.push(format!("{file} cites DESIGN.md"));
        }
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
    for (heading, id) in [
        (
            "Message (version 2, a bundle)",
            "message-version-2-a-bundle",
        ),
        (
            "Changing the ladder: `ladder migrate`",
            "changing-the-ladder-ladder-migrate",
        ),
        ("The INSERT race", "the-insert-race"),
    ] {
        assert_eq!(anchor(heading), id);
    }
}
