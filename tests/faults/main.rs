//! Fault tests: the real broker and database are broken on purpose (restarted,
//! killed, stopped) while the real `order-expiry serve` runs, and every test
//! audits the orders table against the invariants: every order scheduled with
//! `Ok` and unpaid at its due time ends cancelled, no paid order is cancelled,
//! none is cancelled before it is due.
//!
//! They restart shared services, so they run alone and one at a time:
//! `cargo test --test faults -- --test-threads 1` (`scripts/test` does, after
//! everything else). `--nocapture` shows each scenario's figures (`FIGURES ...`).
//! Every broken service is restored by a guard, even when a test fails.

mod broker_restart;
mod catch_up;
mod consumer_kill;
mod database_outage;
mod failover;
mod graceful_shutdown;
mod isolation;
mod payment_race;
mod support;
