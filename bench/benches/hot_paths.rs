//! Micro-benchmarks of the pure code every message passes through: the ladder
//! route on publish, the v1 wire format both ways, and the consumer's arrival
//! decision. Run with `cargo bench -p order-expiry-bench --bench hot_paths`.

use std::hint::black_box;

use chrono::{TimeDelta, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use order_expiry::publisher::{ExpiryMessage, TraceHeaders};
use order_expiry::{OrderId, Settings, service::on_arrival};

const CONTENT_TYPE: &str = ExpiryMessage::CONTENT_TYPE;

fn ladder(c: &mut Criterion) {
    let ladder = Settings::default().ladder().expect("valid ladder");
    let mut group = c.benchmark_group("ladder");
    for (name, ms) in [
        ("route 1.5 s", 1_500i64),
        ("route 30 min", 1_800_000),
        ("route 30 days", 2_592_000_000),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| ladder.route_for_remaining_ms(black_box(ms)))
        });
    }
    group.bench_function("routing key 30 min", |b| {
        b.iter(|| ladder.routing_key(black_box(1800)))
    });
    group.finish();
}

fn message(c: &mut Criterion) {
    let due_at = Utc::now() + TimeDelta::minutes(30);
    let order_id = OrderId::new("order-000123456").expect("valid order id");
    let body = ExpiryMessage::new(order_id, due_at).encode();
    let settings = Settings::default();
    let mut group = c.benchmark_group("message");
    group.bench_function("new + encode", |b| {
        b.iter(|| {
            OrderId::new(black_box("order-000123456"))
                .map(|id| ExpiryMessage::new(id, black_box(due_at)).encode())
        })
    });
    group.bench_function("decode", |b| {
        b.iter(|| ExpiryMessage::decode(black_box(&body), Some(CONTENT_TYPE), 16 * 1024))
    });
    let now = due_at + TimeDelta::milliseconds(3);
    group.bench_function("consumer on_arrival (due)", |b| {
        b.iter(|| {
            on_arrival(
                black_box(&body),
                Some(CONTENT_TYPE),
                TraceHeaders::NONE,
                now,
                &settings.consumer,
            )
        })
    });
    group.finish();
}

criterion_group!(hot_paths, ladder, message);
criterion_main!(hot_paths);
