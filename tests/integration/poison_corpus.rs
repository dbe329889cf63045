//! The poison corpus: one table of bad messages, each parked exactly once
//! with a precise reason and its body intact, none retried, and the good
//! messages between them cancelled as usual.

use std::collections::HashMap;
use std::time::Duration;

use lapin::BasicProperties;
use order_expiry::service::Outcome;
use order_expiry_testkit::{World, at_ms, count};

use Reason::{Is, StartsWith};

const DUE: &str = "2026-01-01T00:00:00.000Z";

/// How the parked reason must read.
enum Reason {
    Is(&'static str),
    StartsWith(&'static str),
}

/// Bad `application/json` bodies, `DUE` standing for [`DUE`]: (name, body,
/// reason).
const BAD_JSON: &[(&str, &str, Reason)] = &[
    ("empty body", "", Is("empty body")),
    (
        "invalid JSON",
        r#"{"v":1,"order_id":"#,
        StartsWith("body is not valid JSON: "),
    ),
    ("array", "[1,2,3]", Is("body is JSON but not an object")),
    ("null", "null", Is("body is JSON but not an object")),
    (
        "v is a string",
        r#"{"v":"1","order_id":"a","due_at":"DUE"}"#,
        Is(r#"field "v" must be an integer"#),
    ),
    (
        "order_id is a number",
        r#"{"v":1,"order_id":42,"due_at":"DUE"}"#,
        Is(r#"field "order_id" must be a string"#),
    ),
    (
        "due_at is a number",
        r#"{"v":1,"order_id":"a","due_at":1767225600}"#,
        Is(r#"field "due_at" must be a string"#),
    ),
    (
        "missing v",
        r#"{"order_id":"a","due_at":"DUE"}"#,
        Is(r#"missing field "v""#),
    ),
    (
        "missing order_id",
        r#"{"v":1,"due_at":"DUE"}"#,
        Is(r#"missing field "order_id""#),
    ),
    (
        "null order_id",
        r#"{"v":1,"order_id":null,"due_at":"DUE"}"#,
        Is(r#"missing field "order_id""#),
    ),
    (
        "missing due_at",
        r#"{"v":1,"order_id":"a"}"#,
        Is(r#"missing field "due_at""#),
    ),
    (
        "unknown version 3",
        r#"{"v":3,"order_id":"a","due_at":"DUE"}"#,
        Is("unknown version 3"),
    ),
    (
        "v2 without its orders list",
        r#"{"v":2,"order_id":"a","due_at":"DUE"}"#,
        Is(r#"missing field "orders""#),
    ),
    (
        "v2 with an empty orders list",
        r#"{"v":2,"orders":[]}"#,
        Is("a v2 bundle with no orders"),
    ),
    (
        "version 1.5",
        r#"{"v":1.5,"order_id":"a","due_at":"DUE"}"#,
        Is("unknown version 1.5"),
    ),
    (
        "empty order id",
        r#"{"v":1,"order_id":"","due_at":"DUE"}"#,
        Is("invalid order_id: it is empty"),
    ),
    (
        "order id with NUL",
        r#"{"v":1,"order_id":"ab\u0000c","due_at":"DUE"}"#,
        Is("invalid order_id: it contains a control character at character 2"),
    ),
    (
        "order id with newline",
        r#"{"v":1,"order_id":"a\nb","due_at":"DUE"}"#,
        Is("invalid order_id: it contains a control character at character 1"),
    ),
    (
        "order id with DEL",
        r#"{"v":1,"order_id":"\u007f","due_at":"DUE"}"#,
        Is("invalid order_id: it contains a control character at character 0"),
    ),
    (
        "due_at not a time",
        r#"{"v":1,"order_id":"a","due_at":"tomorrow"}"#,
        StartsWith(r#"invalid due_at "tomorrow": "#),
    ),
    (
        "due_at without offset",
        r#"{"v":1,"order_id":"a","due_at":"2026-01-01T00:00:00"}"#,
        StartsWith(r#"invalid due_at "2026-01-01T00:00:00": "#),
    ),
    (
        "due_at in year 10000 in UTC",
        r#"{"v":1,"order_id":"a","due_at":"9999-12-31T23:59:59-01:00"}"#,
        Is(r#"invalid due_at "9999-12-31T23:59:59-01:00": outside the years 0000-9999 in UTC"#),
    ),
];

/// (name, body, content type, reason).
type Case = (&'static str, Vec<u8>, &'static str, &'static Reason);

fn corpus() -> Vec<Case> {
    const JSON: &str = "application/json";
    let valid = |id: &str| format!(r#"{{"v":1,"order_id":"{id}","due_at":"{DUE}"}}"#);
    let mut cases: Vec<Case> = BAD_JSON
        .iter()
        .map(|(name, body, reason)| (*name, body.replace("DUE", DUE).into_bytes(), JSON, reason))
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
    let not_json = &StartsWith("body is not valid JSON: ");
    let utf8 = b"{\"v\":1,\"order_id\":\"\xc3\x28\",\"due_at\":\"x\"}".to_vec();
    cases.extend([
        (
            "byte order mark",
            format!("\u{feff}{}", valid("bom")).into_bytes(),
            JSON,
            not_json,
        ),
        (
            "nested too deep",
            deep.into_bytes(),
            JSON,
            &StartsWith("body is not valid JSON: recursion limit exceeded"),
        ),
        (
            "order id of 129 characters",
            valid(&"x".repeat(129)).into_bytes(),
            JSON,
            &Is("invalid order_id: 129 characters is more than 128"),
        ),
        (
            "due far in the future (did not come through the ladder)",
            future.into_bytes(),
            JSON,
            &StartsWith("arrived 3"),
        ),
        ("body over 16 KiB", big, JSON, &StartsWith("body of 16")),
        (
            "invalid UTF-8",
            utf8,
            JSON,
            &Is("body is not valid UTF-8 (at byte 19)"),
        ),
        (
            "wrong content type",
            valid("text").into_bytes(),
            "text/plain",
            &Is(r#"content type "text/plain" is not application/json"#),
        ),
        (
            "XML content type",
            valid("xml").into_bytes(),
            "application/xml",
            &Is(r#"content type "application/xml" is not application/json"#),
        ),
    ]);
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

    for (i, (_, body, content_type, _)) in cases.iter().enumerate() {
        let properties = BasicProperties::default()
            .with_message_id(format!("case-{i}").into())
            .with_content_type((*content_type).into());
        env.publish_due(body, properties).await;
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
                1 => BasicProperties::default().with_content_type("application/json".into()),
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
    for (i, (name, case_body, _, expected)) in cases.iter().enumerate() {
        let (body, reason, times) = found
            .get(&format!("case-{i}"))
            .unwrap_or_else(|| panic!("{name}: not parked"));
        assert_eq!(*times, 1, "{name}: parked {times} times");
        assert_eq!(body, case_body, "{name}: body not intact");
        let precise = match expected {
            Is(expected) => reason == expected,
            StartsWith(expected) => reason.starts_with(expected),
        };
        assert!(precise, "{name}: reason {reason:?}");
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
