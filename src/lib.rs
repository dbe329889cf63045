//! order-expiry cancels orders that are still unpaid when their payment window
//! closes, using RabbitMQ dead-lettering through a ladder of fixed-TTL queues.
//!
//! The order service links this crate and calls [`Scheduler::schedule`] when it
//! creates an order; the `order-expiry serve` consumer cancels the order at its
//! due time if, and only if, it is still unpaid. A `schedule` that returned `Ok`
//! is durable in the broker.
//!
//! ```no_run
//! use chrono::{TimeDelta, Utc};
//! use order_expiry::{ScheduleError, Scheduler, Settings};
//!
//! # async fn create_order() -> Result<(), Box<dyn std::error::Error>> {
//! // Defaults, then ORDER_EXPIRY__SECTION__KEY variables (amqp.url, topology.prefix, ...).
//! let scheduler = Scheduler::from_settings(&Settings::load(None)?)?;
//!
//! // ... the order "order-42" is committed with a 30-minute payment window ...
//! let due_at = Utc::now() + TimeDelta::minutes(30);
//! match scheduler.schedule("order-42", due_at).await {
//!     Ok(scheduled) => println!("expiry of order-42 held by the broker: {scheduled:?}"),
//!     // The broker may or may not hold it: schedule again (a duplicate is harmless).
//!     Err(ScheduleError::Timeout(_) | ScheduleError::Broker(_)) => {
//!         scheduler.schedule("order-42", due_at).await?;
//!     }
//!     // Nothing a retry mends: a bad order id, a delay beyond the ladder, no topology.
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # What the root holds
//!
//! What an order service uses: [`Scheduler`] (built from [`Settings`], or
//! `Scheduler::new` with a URL and a [`topology::Ladder`]), [`ScheduleError`],
//! [`Scheduled`] and [`OrderId`]. With feature `outbox`,
//! `Scheduler::schedule_in_tx` schedules inside the order's own PostgreSQL
//! transaction, returning `OutboxEntry` or `OutboxError`. Everything else is in
//! a named module below.
//!
//! # Features
//!
//! - `service` (default): the consumer service (`service`), operator tooling
//!   (`ops`), the tracing setup and the `order-expiry` binary. With
//!   `default-features = false` a dependent gets the publisher only: the root,
//!   [`publisher`], [`topology`], [`settings`] and [`amqp`], without axum,
//!   PostgreSQL, clap or the Prometheus exporter.
//! - `outbox` (in `service`; on its own beside `default-features = false`):
//!   `Scheduler::schedule_in_tx`. Adds tokio-postgres only.
//! - `otel`: the OpenTelemetry API and its bridge from `tracing` spans.
//! - `otlp` (default; implies `otel` and `service`): span export over
//!   OTLP/HTTP from the binary, off at run time until `telemetry.otlp` or the
//!   standard `OTEL_*` variables turn it on.
//!
//! # Layout
//!
//! - [`publisher`]: [`Scheduler`], [`ScheduleError`], the wire formats (v1
//!   [`publisher::ExpiryMessage`], v2 bundles in [`publisher::DueMessage`]),
//!   [`OrderId`], the W3C [`publisher::TraceContext`] each order carries
//!   (with `otel`, taken from the caller's `tracing` span); with `outbox`,
//!   `schedule_in_tx`.
//! - [`topology`]: ladder arithmetic, the one [`topology::Topology`] description,
//!   declaring it, definitions export.
//! - [`amqp`]: bounded, password-safe connect with TLS; the one timeout for
//!   broker awaits; the broker errors the other errors carry; confirmed
//!   publishes, each told its own `basic.return`.
//! - [`settings`]: typed [`Settings`]: `config/default.toml`, a file,
//!   `ORDER_EXPIRY__…` variables.
//! - `telemetry`: the metrics catalog; with `service`, the tracing subscriber
//!   and Prometheus recorder; with `otlp`, span export (`OtlpExport`).
//! - `service` (feature): consumer session, acks, actions (SQL, HTTP, events)
//!   and the payment check, orders store, sweeper, outbox relay, HTTP, shutdown.
//! - `ops` (feature `service`): operator tooling over AMQP and SQL: `status`,
//!   `parked`, `ladder migrate`.
//!
//! The `order-expiry` binary adds `cli` (`serve`, `schedule`, `topology`,
//! `migrate`, `demo`) on top of this API; the benchmarks are the workspace
//! member `order-expiry-bench`.

#![deny(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

pub mod amqp;
// The publisher only reads it (the outbox relay's corrected clock is the
// service's); `service::Clock` is its public name.
#[cfg_attr(not(feature = "service"), allow(unreachable_pub, dead_code))]
mod clock;
#[cfg(feature = "service")]
pub mod ops;
pub mod publisher;
#[cfg(feature = "service")]
pub mod service;
pub mod settings;
pub mod telemetry;
pub mod topology;

pub use crate::publisher::{OrderId, ScheduleError, Scheduled, Scheduler};
#[cfg(feature = "outbox")]
pub use crate::publisher::{OutboxEntry, OutboxError};
pub use crate::settings::Settings;
