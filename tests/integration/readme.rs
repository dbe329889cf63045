//! The README's snippets run: its outbox SQL (the 30-minute window shortened to
//! 2 s) and its Rust `create_order` (the function of `examples/outbox_order.rs`,
//! compiled in here) against the real database, while the real `serve` relays
//! the outbox and cancels every order on time, the sweeper off. The Python
//! snippet runs in `outbox_clients.rs`; `docs.rs` holds each snippet equal to
//! its example.

use std::path::Path;
use std::time::Duration;

use order_expiry_testkit::{Served, World, at_ms};
use secrecy::ExposeSecret;

use crate::outbox::{assert_cancelled_on_time, outbox_rows};

#[allow(dead_code)] // the example's `main` is not called here
#[path = "../../examples/outbox_order.rs"]
mod outbox_order;

/// The README's one SQL block.
fn readme_sql() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    readme
        .split("```sql\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README has a SQL block")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_snippets_schedule_orders_cancelled_on_time() {
    let env = World::new().await;
    let log = std::env::temp_dir().join(format!("order-expiry-readme-{}.log", env.id));
    let binary = Path::new(env!("CARGO_BIN_EXE_order-expiry"));
    let mut served = Served::start(binary, &env.settings, &[], log).await;
    served.wait_ready(Duration::from_secs(20)).await;
    let url = env.settings.database.url.expose_secret().to_owned();
    let (mut db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("database");
    tokio::spawn(connection);

    let sql = readme_sql();
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

    let mut due = Vec::new();
    for id in ["order-42", "readme-rs"] {
        due.push((id.to_owned(), env.order(id).await.1));
    }
    assert_cancelled_on_time(&env, &due).await;
    let orders = env.orders().await.expect("orders");
    assert!(!orders.contains_key("readme-rs-rolled-back") && !orders.contains_key(""));
    assert_eq!(outbox_rows(&env).await, 0);
    served.assert_nothing_swept().await;
    served.signal("-TERM");
    let status = served.wait_exit(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    env.cleanup().await;
}
