//! PostgreSQL failover. The orders live on a primary and its streaming
//! standby (`scripts/lib/pg-pair.sh`: node 1 on 5433, node 2 on 5434, beside
//! the system cluster, which these tests never touch); `serve` gets both hosts
//! with `target_session_attrs=read-write`, the sweeper is off, and the primary
//! fails while orders come due. Every scenario asserts: none cancelled early,
//! none paid and cancelled, no cancel lost or done twice (`serve`'s count of
//! its cancels against the database's), every order within 10 s of the later
//! of its due time and the promotion. Each prints a FIGURES line with its
//! timeline (docs/src/results/failover.md).
//!
//! Each test holds the pair's lock (`order_expiry_testkit::pg_pair::lock`) and
//! starts with `pg-pair.sh up`, which rebuilds whatever the last one broke.
//! `scripts/test` runs the kill and the fenced primary; the others are
//! `#[ignore]`d and run with `scripts/test --long`.

mod fenced;
mod flash;
mod kill;
mod outbox;
mod replication;
mod run;
mod switchover;
mod timeline;
