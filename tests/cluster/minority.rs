//! What the clients see on a node without a majority (RabbitMQ 4.3, Khepri: the
//! metadata store is a Raft cluster like every quorum queue). Run inside the
//! majority-lost scenario of [`crate::node_loss`], while nodes 2 and 3 are
//! stopped and node 1 runs alone, each client given node 1's URL only:
//!
//! - a publisher (`Scheduler::schedule`): connects, publishes, gets no confirm
//!   and fails with `ScheduleError::Timeout` after its whole timeout (asserted
//!   there);
//! - `order-expiry topology apply`: exits non-zero within a bounded time, for
//!   the topology that exists (every declare must be checked against the
//!   metadata store) and for a new one alike; nothing is half-declared that a
//!   later apply could not repeat;
//! - `serve`: starts, is not ready (`/readyz` never 200) while the majority is
//!   lost, keeps retrying, and is ready and consuming within a bound once a
//!   second node is back, with no restart.

use std::time::{Duration, Instant};

use order_expiry_testkit::{Served, settings_env};

use crate::support::{ClusterWorld, NO_SWEEPER, node_url};

/// How long each `topology apply` may take without a majority before the test
/// calls it hung: its declares are bounded by `amqp.timeout_ms` (3 s here).
const APPLY_LIMIT: Duration = Duration::from_secs(60);

/// A `serve` started without a majority is ready within this of the majority's
/// return (it retries with a backoff of at most `reconnect_max_ms`, 500 ms).
pub(crate) const READY_BOUND: Duration = Duration::from_secs(60);

/// One `topology apply` run.
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) code: Option<i32>,
    pub(crate) took: Duration,
    pub(crate) last_line: String,
}

/// What the clients did on node 1 alone.
pub(crate) struct Minority {
    pub(crate) apply_existing: Applied,
    pub(crate) apply_new: Applied,
    /// `serve` started on node 1 alone, still running.
    pub(crate) serve: Served,
    /// `/readyz` answered 200 at some point while the majority was lost.
    pub(crate) serve_ready_without_majority: bool,
}

impl Minority {
    /// Runs `topology apply` twice and starts a `serve`, all on node 1 only;
    /// samples the serve's `/readyz` for `watch`.
    pub(crate) async fn probe(world: &ClusterWorld, watch: Duration) -> Self {
        let apply_existing = apply(world, &world.settings.topology.prefix).await;
        let new_prefix = format!("{}-new", world.settings.topology.prefix);
        let apply_new = apply(world, &new_prefix).await;
        let url = node_url(1);
        let env = [("ORDER_EXPIRY__AMQP__URL", url.as_str()), NO_SWEEPER[0]];
        let serve = world.serve(1, &env).await;
        let until = Instant::now() + watch;
        let mut ready = false;
        while Instant::now() < until {
            ready |= matches!(serve.get("/readyz").await, Some((200, _)));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Self {
            apply_existing,
            apply_new,
            serve,
            serve_ready_without_majority: ready,
        }
    }

    /// Asserts the answers above; `ready_after` is how long after the majority
    /// came back the serve was ready.
    pub(crate) fn assert_answers(&self, ready_after: Duration) {
        for (what, applied) in [
            ("the existing topology", &self.apply_existing),
            ("a new topology", &self.apply_new),
        ] {
            assert!(
                applied.code.is_some_and(|c| c != 0),
                "topology apply of {what} without a majority must fail, not succeed or hang: {applied:?}"
            );
            assert!(applied.took < APPLY_LIMIT, "{what}: {applied:?}");
        }
        assert!(
            !self.serve_ready_without_majority,
            "serve was ready without a majority"
        );
        assert!(
            ready_after <= READY_BOUND,
            "serve ready {ready_after:?} after the majority came back, beyond {READY_BOUND:?}"
        );
    }

    /// For the FIGURES line.
    pub(crate) fn note(&self, ready_after: Duration) -> String {
        format!(
            "without a majority: topology apply (existing) exit {:?} after {:.1} s ({}), (new) exit {:?} \
             after {:.1} s ({}); serve started there ready {}, ready {:.1} s after the majority came back",
            self.apply_existing.code,
            self.apply_existing.took.as_secs_f64(),
            self.apply_existing.last_line,
            self.apply_new.code,
            self.apply_new.took.as_secs_f64(),
            self.apply_new.last_line,
            if self.serve_ready_without_majority {
                "meanwhile"
            } else {
                "never meanwhile"
            },
            ready_after.as_secs_f64(),
        )
    }
}

/// `order-expiry topology apply` for `prefix` on node 1 only, bounded.
async fn apply(world: &ClusterWorld, prefix: &str) -> Applied {
    let started = Instant::now();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-expiry"));
    command
        .envs(settings_env(&world.settings))
        .env("ORDER_EXPIRY__AMQP__URL", node_url(1))
        .env("ORDER_EXPIRY__AMQP__TIMEOUT_MS", "3000")
        .env("ORDER_EXPIRY__TOPOLOGY__PREFIX", prefix)
        .args(["topology", "apply"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(APPLY_LIMIT, command.output()).await {
        Ok(Ok(out)) => Applied {
            code: out.status.code(),
            took: started.elapsed(),
            last_line: String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect(),
        },
        Ok(Err(e)) => panic!("topology apply did not run: {e}"),
        Err(_) => Applied {
            code: None,
            took: started.elapsed(),
            last_line: format!("still running after {APPLY_LIMIT:?}"),
        },
    }
}
