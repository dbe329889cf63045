//! order-expiry cancels orders that are still unpaid when their payment window
//! closes, using RabbitMQ dead-lettering through a ladder of fixed-TTL queues.
//!
//! The order service links this crate and calls [`Scheduler::schedule`] when it
//! creates an order; the `order-expiry serve` consumer cancels the order at its
//! due time if, and only if, it is still unpaid.
//!
//! # Features
//!
//! - `service` (default): the consumer service ([`Service`], [`Consumer`], the
//!   orders store, the sweeper, HTTP, telemetry) and the `order-expiry` binary.
//!   With `default-features = false` a dependent gets the publisher only:
//!   [`Scheduler`], the [`Ladder`], [`ExpiryMessage`] and [`OrderId`], the
//!   [`Topology`] and its [`definitions_json`] export, and [`Settings`], without
//!   axum, PostgreSQL, clap or the Prometheus exporter.
//! - `outbox` (in `service`; on its own beside `default-features = false`):
//!   `Scheduler::schedule_in_tx`, which schedules inside the order's own
//!   PostgreSQL transaction through the `order_expiry_outbox` table. Adds
//!   tokio-postgres only.
//!
//! # What to use
//!
//! - Publishing: [`Scheduler`] (from [`Settings`] or a URL and a [`Ladder`]),
//!   its [`ScheduleError`] and [`Scheduled`]; [`OrderId`] and [`ExpiryMessage`].
//!   Through the transactional outbox instead (feature `outbox`):
//!   `Scheduler::schedule_in_tx`, `OutboxEntry`, `OutboxError`.
//! - The broker's topology: [`Topology::describe`] / [`Topology::declare`] and
//!   [`definitions_json`], for `topology apply` and `export` done in code.
//! - Running the consumer service: [`Service::build`] and [`Service::run`] with
//!   [`shutdown_on_signal`]; or its parts, [`Consumer`] with an [`Action`]
//!   (every [`OrderStore`] such as [`PgOrderStore`] is one; [`HttpAction`] and
//!   [`EventAction`] are the others, [`ConfiguredAction`] the one the settings
//!   pick), [`Sweeper`] and the outbox [`Relay`]. [`on_arrival`] is its pure decision on arrival,
//!   [`Action::expire`] its unit of work, for tests.
//!
//! # Layout
//!
//! - `publisher`: [`Scheduler`], [`ScheduleError`], the v1 [`ExpiryMessage`], [`OrderId`];
//!   with `outbox`, `schedule_in_tx`.
//! - `topology`: ladder arithmetic, the one [`Topology`] description, declaring it, definitions export.
//! - `amqp`: bounded, password-safe connect with TLS; the one timeout for broker awaits.
//! - `settings`: typed [`Settings`]: `config/default.toml`, a file, `ORDER_EXPIRY__…` variables.
//! - `telemetry`: the metrics catalog; with `service`, the tracing subscriber and Prometheus recorder.
//! - `service` (feature): consumer session, acks, actions (SQL, HTTP, events) and the
//!   payment check, orders store, sweeper, outbox relay, HTTP, shutdown.
//! - `ops` (feature `service`): operator tooling over AMQP and SQL: [`Status`], [`Parked`],
//!   [`LadderMigration`].
//!
//! The `order-expiry` binary adds `cli` (`serve`, `schedule`, `topology`,
//! `migrate`, `demo`) on top of this API; the benchmarks are the workspace
//! member `order-expiry-bench`.

#![deny(unsafe_code)]
#![warn(missing_debug_implementations, unreachable_pub, missing_docs)]

mod amqp;
#[cfg(feature = "service")]
mod ops;
mod publisher;
#[cfg(feature = "service")]
mod service;
mod settings;
mod telemetry;
mod topology;

pub use crate::amqp::{BrokerError, ConnectError, TlsError, TlsFiles};
#[cfg(feature = "service")]
pub use crate::ops::{
    DueStatus, LadderMigration, LevelStatus, MigrationRefused, MigrationReport, OpsError,
    OrdersStatus, OutboxStatus, Parked, ParkedMessage, ParkedStatus, QueueState, ReplayReport,
    ReplaySelection, STATUS_VERSION, Status,
};
pub use crate::publisher::{
    BadEntry, DueMessage, ExpiryMessage, InvalidOrderId, Malformed, OrderId, ScheduleError,
    Scheduled, Scheduler,
};
#[cfg(feature = "outbox")]
pub use crate::publisher::{OUTBOX_INSERT_SQL, OutboxEntry, OutboxError};
#[cfg(feature = "service")]
pub use crate::service::{
    Action, ActionAnswer, ActionError, Arrival, BuildError, BundlePart, CheckAnswer,
    ConfiguredAction, Consumer, ConsumerError, Disposition, EventAction, Expiring, FailureClass,
    Handled, HttpAction, OrderStore, OutboxState, Outcome, PaymentCheck, PgOrderStore, Readiness,
    Relay, RelayError, Relayed, Round, Service, ServiceError, StoreError, Sweeper, classify,
    on_arrival, shutdown_on_signal,
};
pub use crate::settings::{
    ActionKind, ActionSettings, AmqpActionSettings, AmqpSettings, CheckSettings, ConsumerSettings,
    DatabaseSettings, ENV_PREFIX, FinalOutcome, HttpActionSettings, HttpSettings, InvalidSetting,
    LogFormat, LogSettings, OutboxSettings, PublisherSettings, QueueType, Settings,
    SweeperSettings, TopologySettings,
};
#[cfg(feature = "service")]
pub use crate::telemetry::{init_tracing, init_tracing_for_tests};
pub use crate::topology::{
    CONSUMER_USER, DelayTooLong, KeptQueue, Ladder, LadderError, PUBLISHER_USER, Route, Topology,
    TopologyError, definitions_json,
};
