//! The poison corpus: one table of bad messages, each parked exactly once
//! with a precise reason and its body intact, none retried, and the good
//! messages between them (with and without a content type) cancelled as
//! usual.

use std::collections::HashMap;
use std::time::Duration;

use lapin::BasicProperties;
use order_expiry::service::Outcome;
use order_expiry_testkit::{World, at_ms, count};

const DUE: &str = "2026-01-01T00:00:00.000Z";
const JSON: &str = "application/json";

/// Bad `application/json` bodies, one a line: name | body | reason. `DUE`
/// stands for [`DUE`]; a reason ending in `…` is the start of the reason.
const BAD_JSON: &str = r#"
empty body |  | empty body
invalid JSON | {"v":1,"order_id": | body is not valid JSON: …
not JSON at all | {this is not json | body is not valid JSON: …
array | [1,2,3] | body is JSON but not an object
null | null | body is JSON but not an object
v is a string | {"v":"1","order_id":"a","due_at":"DUE"} | field "v" must be an integer
order_id is a number | {"v":1,"order_id":42,"due_at":"DUE"} | field "order_id" must be a string
due_at is a number | {"v":1,"order_id":"a","due_at":1767225600} | field "due_at" must be a string
missing v | {"order_id":"a","due_at":"DUE"} | missing field "v"
missing order_id | {"v":1,"due_at":"DUE"} | missing field "order_id"
null order_id | {"v":1,"order_id":null,"due_at":"DUE"} | missing field "order_id"
missing due_at | {"v":1,"order_id":"a"} | missing field "due_at"
unknown version 3 | {"v":3,"order_id":"a","due_at":"DUE"} | unknown version 3
unknown version 9 | {"v":9,"order_id":"a","due_at":"DUE"} | unknown version 9
v2 without its orders list | {"v":2,"order_id":"a","due_at":"DUE"} | missing field "orders"
v2 with an empty orders list | {"v":2,"orders":[]} | a v2 bundle with no orders
version 1.5 | {"v":1.5,"order_id":"a","due_at":"DUE"} | unknown version 1.5
empty order id | {"v":1,"order_id":"","due_at":"DUE"} | invalid order_id: it is empty
order id with NUL | {"v":1,"order_id":"ab\u0000c","due_at":"DUE"} | invalid order_id: it contains a control character at character 2
order id with newline | {"v":1,"order_id":"a\nb","due_at":"DUE"} | invalid order_id: it contains a control character at character 1
order id with DEL | {"v":1,"order_id":"\u007f","due_at":"DUE"} | invalid order_id: it contains a control character at character 0
due_at not a time | {"v":1,"order_id":"a","due_at":"tomorrow"} | invalid due_at "tomorrow": …
due_at without offset | {"v":1,"order_id":"a","due_at":"2026-01-01T00:00:00"} | invalid due_at "2026-01-01T00:00:00": …
due_at in year 10000 in UTC | {"v":1,"order_id":"a","due_at":"9999-12-31T23:59:59-01:00"} | invalid due_at "9999-12-31T23:59:59-01:00": outside the years 0000-9999 in UTC
"#;

/// One bad message: its name, body, content type and expected reason.
struct Case {
    name: String,
    body: Vec<u8>,
    content_type: &'static str,
    reason: String,
}

impl Case {
    /// An `application/json` message.
    fn json(name: &str, body: impl Into<Vec<u8>>, reason: &str) -> Self {
        Self {
            name: name.to_owned(),
            body: body.into(),
            content_type: JSON,
            reason: reason.to_owned(),
        }
    }

    /// Whether `reason` is the expected one (or starts as it must).
    fn precise(&self, reason: &str) -> bool {
        match self.reason.strip_suffix('…') {
            Some(start) => reason.starts_with(start),
            None => reason == self.reason,
        }
    }
}

fn corpus() -> Vec<Case> {
    let valid = |id: &str| format!(r#"{{"v":1,"order_id":"{id}","due_at":"{DUE}"}}"#);
    let mut cases: Vec<Case> = BAD_JSON
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            let [name, body, reason] = line.splitn(3, " | ").collect::<Vec<_>>()[..] else {
                panic!("name | body | reason: {line}")
            };
            Case::json(name, body.replace("DUE", DUE), reason)
        })
        .collect();
    let mut big = valid("big").into_bytes();
    big.truncate(big.len() - 1);
    big.extend(format!(r#","pad":"{}"}}"#, "x".repeat(16_384)).into_bytes());
    let deep = format!(
        r#"{{"v":1,"order_id":"deep","due_at":"{DUE}","x":{}{}}}"#,
        "[".repeat(1000),
        "]".repeat(1000)
    );
    let future = format!(
        r#"{{"v":1,"order_id":"future","due_at":"{}"}}"#,
        at_ms(3_600_000).to_rfc3339()
    );
    let utf8 = b"{\"v\":1,\"order_id\":\"\xc3\x28\",\"due_at\":\"x\"}".to_vec();
    let too_long = "invalid order_id: 129 characters is more than 128";
    let deep_reason = "body is not valid JSON: recursion limit exceeded…";
    let future_name = "due far in the future (did not come through the ladder)";
    cases.extend([
        Case::json(
            "byte order mark",
            format!("\u{feff}{}", valid("bom")),
            "body is not valid JSON: …",
        ),
        Case::json("nested too deep", deep, deep_reason),
        Case::json(
            "order id of 129 characters",
            valid(&"x".repeat(129)),
            too_long,
        ),
        Case::json(future_name, future, "arrived 3…"),
        Case::json("body over 16 KiB", big, "body of 16…"),
        Case::json(
            "bytes, not UTF-8",
            *b"\xc3\x28\xa0\xa1",
            "body is not valid UTF-8 (at byte 0)",
        ),
        Case::json(
            "invalid UTF-8",
            utf8,
            "body is not valid UTF-8 (at byte 19)",
        ),
    ]);
    let types = [
        ("wrong content type", "text", "text/plain"),
        ("XML content type", "xml", "application/xml"),
    ];
    for (name, id, content_type) in types {
        let reason = format!(r#"content type "{content_type}" is not application/json"#);
        cases.push(Case {
            content_type,
            ..Case::json(name, valid(id), &reason)
        });
    }
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_poison_message_is_parked_once_with_a_precise_reason() {
    let env = World::new().await;
    let cases = corpus();
    // Good messages, one after every third bad one, in the accepted variants.
    let good_ids: Vec<String> = (0..cases.len().div_ceil(3))
        .map(|i| format!("good-{i}"))
        .collect();
    let good_orders: Vec<_> = good_ids.iter().map(|id| (id.clone(), at_ms(-5))).collect();
    env.create_orders(&good_orders).await;
    let mut consumer = env.start_consumer();

    for (i, case) in cases.iter().enumerate() {
        let properties = BasicProperties::default()
            .with_message_id(format!("case-{i}").into())
            .with_content_type(case.content_type.into());
        env.publish_due(&case.body, properties).await;
        if i % 3 == 2 || i == cases.len() - 1 {
            let n = i / 3;
            let due = env.order(&good_ids[n]).await.1;
            let body = format!(
                r#"{{"v":1,"order_id":"{}","due_at":"{}","extra":{{"ignored":true}}}}"#,
                good_ids[n],
                due.to_rfc3339()
            );
            let properties = match n % 3 {
                0 => BasicProperties::default(),
                1 => BasicProperties::default().with_content_type(JSON.into()),
                _ => BasicProperties::default()
                    .with_content_type("application/json; charset=utf-8".into()),
            };
            env.publish_due(body.as_bytes(), properties).await;
        }
    }

    let handled = consumer
        .next_n(cases.len() + good_ids.len(), Duration::from_secs(20))
        .await;
    assert_eq!(count(&handled, Outcome::Parked), cases.len(), "{handled:?}");
    assert_eq!(count(&handled, Outcome::Cancelled), good_ids.len());
    for id in &good_ids {
        assert_eq!(env.order(id).await.0, "cancelled", "{id}");
    }
    // None retried: nothing more happens, nothing is left in the due queue.
    consumer.expect_quiet(Duration::from_millis(700)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);

    // Each bad message is parked exactly once, intact, with its reason.
    let mut found: HashMap<String, (Vec<u8>, String, usize)> = HashMap::new();
    for parked in env.parked().await {
        let id = parked.message_id.expect("message_id kept");
        assert!(parked.headers.inner().contains_key("x-parked-at"), "{id}");
        let routing_key = parked
            .headers
            .inner()
            .contains_key("x-original-routing-key");
        assert!(routing_key, "{id}");
        found.entry(id).or_insert((parked.body, parked.reason, 0)).2 += 1;
    }
    let mut report = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = &case.name;
        let (body, reason, times) = found
            .get(&format!("case-{i}"))
            .unwrap_or_else(|| panic!("{name}: not parked"));
        assert_eq!(*times, 1, "{name}: parked {times} times");
        assert_eq!(*body, case.body, "{name}: body not intact");
        assert!(case.precise(reason), "{name}: reason {reason:?}");
        report.push(format!("{name}: {reason}"));
    }
    assert_eq!(found.len(), cases.len());
    eprintln!(
        "FIGURES poison corpus: {} bad messages, each parked once with a precise reason, retried 0; \
         {} good messages between them cancelled; lost 0, wrongly cancelled 0\n  {}",
        cases.len(),
        good_ids.len(),
        report.join("\n  ")
    );
    env.cleanup().await;
}
