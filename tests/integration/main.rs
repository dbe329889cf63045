//! Integration tests against the real RabbitMQ and PostgreSQL. Every test
//! builds its own isolated world (`order_expiry_testkit::World`: a topology
//! prefix in the test vhost and a schema in the test database), so the tests
//! run in parallel in one binary. `docs` and `dependencies` need no services.

mod actions;
mod blue_green;
mod broker_versions;
mod bundles;
mod catch_up;
mod check;
mod cli;
mod clock;
mod database_hosts;
mod definitions;
mod delivery;
mod demo;
mod dependencies;
mod deploy_users;
mod docs;
mod extensions;
mod failover;
mod following;
mod http;
mod https;
mod insert_race;
mod isolation;
mod ladder_migrate;
mod ladder_migrate_confirms;
mod ops;
#[cfg(feature = "otlp")]
mod otlp;
mod outbox;
mod outbox_clients;
mod payments;
mod poison_corpus;
mod readme;
mod redelivery;
mod returns;
mod scheduling;
mod secrets;
mod sweeper;
mod tls;
mod traces;
