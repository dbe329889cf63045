//! Integration tests against the real RabbitMQ and PostgreSQL (see `helpers.rs`).
//! One binary, so the shared set-up runs once and the tests run in parallel.

mod cli;
mod definitions;
mod delivery;
mod helpers;
mod http;
mod lateness;
mod payments;
mod poison;
mod poison_corpus;
mod scheduling;
mod secrets;
mod sweeper;
mod tls;
