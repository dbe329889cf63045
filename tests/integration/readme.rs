//! The README, a front door a newcomer reads in five minutes: at most 320
//! lines, naming the book, its Python and Rust snippets the examples' own text,
//! and its snippets run against the real database and `serve`: the outbox SQL
//! (its 30-minute window shortened to 2 s) and the Rust `create_order` of
//! `examples/outbox_order.rs`. The Python snippet runs in `outbox_clients.rs`;
//! links and defaults are checked in `docs.rs`.

use order_expiry_testkit::{World, at_ms};

use crate::docs::repo_file;
use crate::outbox::{assert_cancelled_on_time, outbox_rows};

const README_MAX_LINES: usize = 320;

#[allow(dead_code)] // the example's `main` is not called here
#[path = "../../examples/outbox_order.rs"]
mod outbox_order;

/// The fenced blocks of `language` in `markdown`.
pub(crate) fn code_blocks(markdown: &str, language: &str) -> Vec<String> {
    let open = format!("```{language}\n");
    markdown
        .split(&open)
        .skip(1)
        .map(|rest| rest.split("\n```").next().unwrap_or("").to_owned() + "\n")
        .collect()
}

#[test]
fn the_readme_is_a_short_front_door() {
    let readme = repo_file("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, at most {README_MAX_LINES}: move the detail into docs/src"
    );
    for (needle, what) in [
        ("docs/src/SUMMARY.md", "the book"),
        ("docs/src/how-it-works/architecture.md", "the journey"),
        ("docs/src/contract/configuration.md", "every setting"),
        ("scripts/demo", "the demo"),
        ("scripts/test", "the tests"),
        ("/healthz", "liveness"),
        ("/readyz", "readiness"),
    ] {
        assert!(readme.contains(needle), "README lacks {what} ({needle})");
    }
}

/// A change to a snippet that is not made to its example (or back) fails here.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_snippets_schedule_orders_cancelled_on_time() {
    let env = World::new().await;
    let served = env.serve_ready(&[]).await;
    let mut db = env.connect().await.expect("database");

    let sql = code_blocks(&repo_file("README.md"), "sql").remove(0);
    assert!(sql.contains("interval '30 minutes'"), "{sql}");
    db.batch_execute(&sql.replace("interval '30 minutes'", "interval '2 seconds'"))
        .await
        .expect("the README's SQL runs");

    let scheduler = env.scheduler();
    let create = async |db: &mut tokio_postgres::Client, id: &str, rollback: bool| {
        outbox_order::create_order(&scheduler, db, id, at_ms(2_500), rollback)
            .await
            .expect("create_order")
    };
    let created = create(&mut db, "readme-rs", false).await;
    assert!(created.starts_with("readme-rs: created"), "{created}");
    let rolled_back = create(&mut db, "readme-rs-rolled-back", true).await;
    assert!(rolled_back.contains("rolled back"), "{rolled_back}");
    let refused = create(&mut db, "", false).await;
    assert!(refused.starts_with(": not created"), "{refused}");

    assert_cancelled_on_time(&env, &["order-42", "readme-rs"]).await;
    let orders = env.orders().await.expect("orders");
    assert!(!orders.contains_key("readme-rs-rolled-back") && !orders.contains_key(""));
    assert_eq!(outbox_rows(&env).await, 0);
    served.assert_nothing_swept().await;
    served.terminate().await;
    env.cleanup().await;
}
