//! Micro-benchmarks of the pure code every message passes through: the ladder
//! route on publish, the v1 wire format both ways, and the consumer's arrival
//! decision. Run with `cargo bench --bench hot_paths`.

use std::hint::black_box;

use chrono::{TimeDelta, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use order_expiry::consumer::on_arrival;
use order_expiry::message::CONTENT_TYPE;
use order_expiry::{ExpiryMessage, Ladder, Settings};

fn ladder(c: &mut Criterion) {
    let ladder = Ladder::new("orders", 22).expect("valid ladder");
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
    let message = ExpiryMessage::new("order-000123456", due_at).expect("valid order id");
    let body = message.encode();
    let settings = Settings::load_without_env(None).expect("default settings");
    let mut group = c.benchmark_group("message");
    group.bench_function("new + encode", |b| {
        b.iter(|| {
            ExpiryMessage::new(black_box("order-000123456"), black_box(due_at)).map(|m| m.encode())
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
                now,
                &settings.consumer,
            )
        })
    });
    group.finish();
}

criterion_group!(hot_paths, ladder, message);
criterion_main!(hot_paths);
