//! Scenario 5, the poison corpus: one table of bad messages, each parked exactly
//! once with a precise reason and its body intact, none retried, and the good
//! messages between them cancelled as usual.

use std::collections::HashMap;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use order_expiry::service::Outcome;
use order_expiry_testkit::{World, at_ms};

const DUE: &str = "2026-01-01T00:00:00.000Z";

/// How the parked reason must read.
enum Reason {
    Exactly(&'static str),
    StartsWith(&'static str),
}

struct Case {
    name: &'static str,
    body: Vec<u8>,
    content_type: Option<&'static str>,
    reason: Reason,
}

fn json_case(name: &'static str, body: String, reason: Reason) -> Case {
    Case {
        name,
        body: body.into_bytes(),
        content_type: Some("application/json"),
        reason,
    }
}

fn corpus() -> Vec<Case> {
    use Reason::{Exactly, StartsWith};
    let valid = |id: &str| format!(r#"{{"v":1,"order_id":"{id}","due_at":"{DUE}"}}"#);
    let mut big = valid("big").into_bytes();
    big.truncate(big.len() - 1);
    big.extend(format!(r#","pad":"{}"}}"#, "x".repeat(16_384)).into_bytes());
    let deep = format!(
        r#"{{"v":1,"order_id":"deep","due_at":"{DUE}","x":{}{}}}"#,
        "[".repeat(1000),
        "]".repeat(1000)
    );
    let mut cases = vec![
        json_case("empty body", String::new(), Exactly("empty body")),
        json_case(
            "invalid JSON",
            r#"{"v":1,"order_id":"#.into(),
            StartsWith("body is not valid JSON: "),
        ),
        json_case(
            "byte order mark",
            format!("\u{feff}{}", valid("bom")),
            StartsWith("body is not valid JSON: "),
        ),
        json_case(
            "nested too deep",
            deep,
            StartsWith("body is not valid JSON: recursion limit exceeded"),
        ),
        json_case(
            "array",
            "[1,2,3]".into(),
            Exactly("body is JSON but not an object"),
        ),
        json_case(
            "null",
            "null".into(),
            Exactly("body is JSON but not an object"),
        ),
        json_case(
            "v is a string",
            format!(r#"{{"v":"1","order_id":"a","due_at":"{DUE}"}}"#),
            Exactly(r#"field "v" must be an integer"#),
        ),
        json_case(
            "order_id is a number",
            format!(r#"{{"v":1,"order_id":42,"due_at":"{DUE}"}}"#),
            Exactly(r#"field "order_id" must be a string"#),
        ),
        json_case(
            "due_at is a number",
            r#"{"v":1,"order_id":"a","due_at":1767225600}"#.into(),
            Exactly(r#"field "due_at" must be a string"#),
        ),
        json_case(
            "missing v",
            format!(r#"{{"order_id":"a","due_at":"{DUE}"}}"#),
            Exactly(r#"missing field "v""#),
        ),
        json_case(
            "missing order_id",
            format!(r#"{{"v":1,"due_at":"{DUE}"}}"#),
            Exactly(r#"missing field "order_id""#),
        ),
        json_case(
            "null order_id",
            format!(r#"{{"v":1,"order_id":null,"due_at":"{DUE}"}}"#),
            Exactly(r#"missing field "order_id""#),
        ),
        json_case(
            "missing due_at",
            r#"{"v":1,"order_id":"a"}"#.into(),
            Exactly(r#"missing field "due_at""#),
        ),
        json_case(
            "unknown version 3",
            format!(r#"{{"v":3,"order_id":"a","due_at":"{DUE}"}}"#),
            Exactly("unknown version 3"),
        ),
        json_case(
            "v2 without its orders list",
            format!(r#"{{"v":2,"order_id":"a","due_at":"{DUE}"}}"#),
            Exactly(r#"missing field "orders""#),
        ),
        json_case(
            "v2 with an empty orders list",
            r#"{"v":2,"orders":[]}"#.into(),
            Exactly("a v2 bundle with no orders"),
        ),
        json_case(
            "version 1.5",
            format!(r#"{{"v":1.5,"order_id":"a","due_at":"{DUE}"}}"#),
            Exactly("unknown version 1.5"),
        ),
        json_case(
            "empty order id",
            format!(r#"{{"v":1,"order_id":"","due_at":"{DUE}"}}"#),
            Exactly("invalid order_id: it is empty"),
        ),
        json_case(
            "order id of 129 characters",
            valid(&"x".repeat(129)),
            Exactly("invalid order_id: 129 characters is more than 128"),
        ),
        json_case(
            "order id with NUL",
            valid(r"ab\u0000c"),
            Exactly("invalid order_id: it contains a control character at character 2"),
        ),
        json_case(
            "order id with newline",
            valid(r"a\nb"),
            Exactly("invalid order_id: it contains a control character at character 1"),
        ),
        json_case(
            "order id with DEL",
            valid(r"\u007f"),
            Exactly("invalid order_id: it contains a control character at character 0"),
        ),
        json_case(
            "due_at not a time",
            r#"{"v":1,"order_id":"a","due_at":"tomorrow"}"#.into(),
            StartsWith(r#"invalid due_at "tomorrow": "#),
        ),
        json_case(
            "due_at without offset",
            r#"{"v":1,"order_id":"a","due_at":"2026-01-01T00:00:00"}"#.into(),
            StartsWith(r#"invalid due_at "2026-01-01T00:00:00": "#),
        ),
        json_case(
            "due_at in year 10000 in UTC",
            r#"{"v":1,"order_id":"a","due_at":"9999-12-31T23:59:59-01:00"}"#.into(),
            Exactly(
                r#"invalid due_at "9999-12-31T23:59:59-01:00": outside the years 0000-9999 in UTC"#,
            ),
        ),
        json_case(
            "due far in the future (did not come through the ladder)",
            format!(
                r#"{{"v":1,"order_id":"future","due_at":"{}"}}"#,
                at_ms(3_600_000).to_rfc3339()
            ),
            StartsWith("arrived 3"),
        ),
    ];
    cases.push(Case {
        name: "body over 16 KiB",
        body: big,
        content_type: Some("application/json"),
        reason: StartsWith("body of 16"),
    });
    cases.push(Case {
        name: "invalid UTF-8",
        body: b"{\"v\":1,\"order_id\":\"\xc3\x28\",\"due_at\":\"x\"}".to_vec(),
        content_type: Some("application/json"),
        reason: Exactly("body is not valid UTF-8 (at byte 19)"),
    });
    cases.push(Case {
        name: "wrong content type",
        body: valid("text").into_bytes(),
        content_type: Some("text/plain"),
        reason: Exactly(r#"content type "text/plain" is not application/json"#),
    });
    cases.push(Case {
        name: "XML content type",
        body: valid("xml").into_bytes(),
        content_type: Some("application/xml"),
        reason: Exactly(r#"content type "application/xml" is not application/json"#),
    });
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
        let mut properties = BasicProperties::default().with_message_id(format!("case-{i}").into());
        if let Some(ct) = case.content_type {
            properties = properties.with_content_type(ct.into());
        }
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
    let parked = handled
        .iter()
        .filter(|h| h.outcome == Outcome::Parked)
        .count();
    let cancelled = handled
        .iter()
        .filter(|h| h.outcome == Outcome::Cancelled)
        .count();
    assert_eq!(parked, cases.len(), "{handled:?}");
    assert_eq!(cancelled, good_ids.len(), "{handled:?}");
    for id in &good_ids {
        assert_eq!(env.order(id).await.0, "cancelled", "{id}");
    }
    // None retried: nothing more happens, nothing is left in the due queue.
    consumer.expect_quiet(Duration::from_millis(700)).await;
    consumer.stop().await;
    assert_eq!(env.depth(&env.ladder().due_queue()).await, 0);

    // Each bad message is parked exactly once, intact, with its reason.
    let mut found: HashMap<String, (Vec<u8>, String, usize)> = HashMap::new();
    while let Some(message) = env.get(&env.ladder().parked_queue()).await {
        let properties = &message.delivery.properties;
        let id = properties
            .message_id()
            .as_ref()
            .map(|m| m.to_string())
            .expect("message_id kept");
        let headers = properties.headers().clone().unwrap_or_default();
        let reason = match headers.inner().get("x-parked-reason") {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("{id}: no x-parked-reason: {other:?}"),
        };
        assert!(headers.inner().contains_key("x-parked-at"), "{id}");
        assert!(
            headers.inner().contains_key("x-original-routing-key"),
            "{id}"
        );
        let entry = found
            .entry(id)
            .or_insert((message.delivery.data.clone(), reason, 0));
        entry.2 += 1;
    }
    let mut report = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (body, reason, times) = found
            .get(&format!("case-{i}"))
            .unwrap_or_else(|| panic!("{}: not parked", case.name));
        assert_eq!(*times, 1, "{}: parked {times} times", case.name);
        assert_eq!(body, &case.body, "{}: body not intact", case.name);
        let precise = match case.reason {
            Reason::Exactly(expected) => reason == expected,
            Reason::StartsWith(expected) => reason.starts_with(expected),
        };
        assert!(precise, "{}: reason {reason:?}", case.name);
        report.push(format!("{}: {reason}", case.name));
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
