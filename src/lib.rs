//! order-expiry cancels orders that are still unpaid when their payment window
//! closes, using RabbitMQ dead-lettering through a ladder of fixed-TTL queues.
//!
//! The order service links this crate and calls [`Scheduler::schedule`] when it
//! creates an order; the `order-expiry serve` consumer cancels the order at its due
//! time if, and only if, it is still unpaid.
//!
//! # Layout
//!
//! - [`ladder`]: delay → entry exchange and routing key; level names. Pure.
//! - [`message`]: the v1 wire format: encode, decode, validate. Pure.
//! - [`topology`]: one description of exchanges, queues, bindings; declare or export.
//! - [`definitions`]: what ops import: the topology in its own vhost plus least-privilege users.
//! - [`scheduler`]: the publisher library (confirms, mandatory, typed errors).
//! - [`consumer`]: delivery loop: hold until due, batch, ack / park / retry.
//! - [`acks`]: which deliveries to ack, one `multiple` ack per finished run. Pure.
//! - [`orders`]: the [`OrderStore`] trait and its PostgreSQL implementation.
//! - [`service`]: consumer + sweeper + HTTP, built once for `main` and tests.
//! - [`sweeper`]: safety net: periodically cancels unpaid orders long overdue.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`cli`]: the `order-expiry` commands.
//! - [`broker`]: bounded, password-safe connect; backoff.
//! - [`settings`]: typed settings: defaults, file, `ORDER_EXPIRY__…` variables.
//! - [`telemetry`]: tracing subscriber (text or JSON) and Prometheus recorder.
//! - [`shutdown`]: SIGTERM / Ctrl-C → cancellation token.
//! - [`demo`]: the end-to-end demo behind `order-expiry demo`.
//! - [`bench`]: `order-expiry bench lateness|throughput` against the real services.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

pub mod acks;
pub mod bench;
pub mod broker;
pub mod cli;
pub mod consumer;
pub mod definitions;
pub mod demo;
pub mod http;
pub mod ladder;
pub mod message;
pub mod orders;
pub mod scheduler;
pub mod service;
pub mod settings;
pub mod shutdown;
pub mod sweeper;
pub mod telemetry;
pub mod topology;

pub use consumer::{Consumer, Handled, Outcome};
pub use ladder::{Ladder, Route};
pub use message::ExpiryMessage;
pub use orders::{OrderStore, PgOrderStore};
pub use scheduler::{ScheduleError, Scheduled, Scheduler};
pub use service::Service;
pub use settings::Settings;
