//! Topology ballast: the broker-side load under which a restart really stalls
//! a ladder level.
//!
//! After a restart, RabbitMQ starts quorum queues before it has recovered
//! exchanges and bindings. A holding queue whose messages expire in that window
//! cannot route them to the next level; its at-least-once dead-letter worker
//! keeps them ("dead-letter pending") and tries again only after
//! `dead_letter_worker_publisher_confirm_timeout` (180 s by default) or a
//! policy change. With a handful of exchanges the window is a few milliseconds
//! and the stall is rare; a broker with a realistic amount of topology (other
//! applications' exchanges and bindings) recovers them for seconds and stalls
//! most of the time. A node recovers one vhost at a time, exchanges, then
//! queues, then bindings, so the ballast lives in the test vhost itself, beside
//! the tests' ladders: 5,000 topic exchanges, 20,000 bindings and 150 quorum
//! queues (`ballast.*`), imported once per broker (about a minute) and gone
//! with the test vhost (`scripts/test` deletes it after the fault stage).

use order_expiry_testkit::vhost;
use serde_json::{Value, json};

use super::{argv, run};

const EXCHANGES: usize = 5000;
const BINDINGS_PER_EXCHANGE: usize = 4;
const QUEUES: usize = 150;

/// Imports the ballast into the test broker unless it is there already.
pub fn ensure_ballast() {
    let vhost = vhost();
    let list = argv("-q list_queues --no-table-headers name -p", &vhost);
    let listing = run("rabbitmqctl", &list).unwrap_or_default();
    let ballast = listing.lines().filter(|l| l.starts_with("ballast.q."));
    if ballast.count() == QUEUES {
        return;
    }
    let file =
        std::env::temp_dir().join(format!("order-expiry-ballast-{}.json", std::process::id()));
    std::fs::write(&file, definitions(&vhost).to_string()).expect("write ballast definitions");
    let started = std::time::Instant::now();
    let path = file.to_str().expect("utf-8 path");
    let imported = run("rabbitmqctl", &["-q", "import_definitions", path]);
    let _ = std::fs::remove_file(&file);
    imported.expect("import the ballast");
    eprintln!(
        "ballast: {EXCHANGES} exchanges, {} bindings, {QUEUES} quorum queues in {vhost}, imported in {:.0} s",
        EXCHANGES * BINDINGS_PER_EXCHANGE,
        started.elapsed().as_secs_f64()
    );
}

fn definitions(v: &str) -> Value {
    let exchanges: Vec<Value> = (0..EXCHANGES)
        .map(|i| {
            json!({"name": format!("ballast.x.{i}"), "vhost": v, "type": "topic",
            "durable": true, "auto_delete": false, "internal": false, "arguments": {}})
        })
        .collect();
    let queues: Vec<Value> = (0..QUEUES)
        .map(|i| {
            json!({"name": format!("ballast.q.{i}"), "vhost": v, "durable": true,
            "auto_delete": false, "arguments": {"x-queue-type": "quorum"}})
        })
        .collect();
    let bindings: Vec<Value> = (0..EXCHANGES)
        .flat_map(|i| (0..BINDINGS_PER_EXCHANGE).map(move |k| (i, k)))
        .map(|(i, k)| {
            json!({"source": format!("ballast.x.{i}"), "vhost": v,
            "destination": format!("ballast.q.{}", (i * BINDINGS_PER_EXCHANGE + k) % QUEUES),
            "destination_type": "queue", "routing_key": format!("k.{k}.#"), "arguments": {}})
        })
        .collect();
    json!({"exchanges": exchanges, "queues": queues, "bindings": bindings})
}
