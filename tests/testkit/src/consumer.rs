//! The real consumer in the test's own process, observed: tests wait for
//! outcomes instead of sleeping.

use std::sync::Arc;
use std::time::Duration;

use order_expiry::{
    Settings, service::Action, service::ConfiguredAction, service::Consumer, service::Handled,
    service::Outcome, service::PgOrderStore, service::Readiness,
};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

/// A running [`Consumer`] and what it reports.
#[derive(Debug)]
pub struct RunningConsumer {
    /// Every handled delivery, after its ack.
    pub outcomes: UnboundedReceiver<Handled>,
    /// Cancelled to stop it.
    pub stop: CancellationToken,
    /// Its task.
    pub task: tokio::task::JoinHandle<()>,
    /// What `/readyz` would say.
    pub readiness: Arc<Readiness>,
}

impl RunningConsumer {
    /// Starts a consumer for `settings` on `store`.
    pub fn start(settings: &Settings, store: Arc<PgOrderStore>) -> Self {
        Self::with_action(settings, store)
    }

    /// Starts a consumer with the action `settings.action.kind` selects (the
    /// SQL one on `store`), as `serve` builds it.
    pub fn configured(settings: &Settings, store: Arc<PgOrderStore>) -> Self {
        let action = ConfiguredAction::from_settings(settings, Some(store)).expect("the action");
        Self::with_action(settings, Arc::new(action))
    }

    /// Starts a consumer for `settings` expiring through `action`.
    pub fn with_action<A: Action>(settings: &Settings, action: Arc<A>) -> Self {
        let readiness = Arc::new(Readiness::default());
        let mut consumer =
            Consumer::new(settings, action, Arc::clone(&readiness)).expect("consumer");
        let outcomes = consumer.observe();
        let stop = CancellationToken::new();
        let task = tokio::spawn(consumer.run(stop.clone()));
        Self {
            outcomes,
            stop,
            task,
            readiness,
        }
    }

    /// Waits for `n` handled deliveries, failing the test after `timeout`.
    pub async fn next_n(&mut self, n: usize, timeout: Duration) -> Vec<Handled> {
        self.next_until(timeout, |got| got.len() >= n).await
    }

    /// [`RunningConsumer::next_n`], asserting that each ended in `outcome`.
    pub async fn next_all(
        &mut self,
        n: usize,
        timeout: Duration,
        outcome: Outcome,
    ) -> Vec<Handled> {
        let handled = self.next_n(n, timeout).await;
        let all = handled.iter().all(|h| h.outcome == outcome);
        assert!(all, "not all {outcome:?}: {handled:?}");
        handled
    }

    /// Collects handled deliveries until `done` says what came is enough,
    /// failing the test after `timeout`.
    pub async fn next_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&[Handled]) -> bool,
    ) -> Vec<Handled> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&got) {
            match tokio::time::timeout_at(deadline, self.outcomes.recv()).await {
                Ok(Some(h)) => got.push(h),
                Ok(None) => panic!("consumer stopped after {got:?}"),
                Err(_) => panic!("not done within {timeout:?}: {got:?}"),
            }
        }
        got
    }

    /// Everything handled during `period`.
    pub async fn during(&mut self, period: Duration) -> Vec<Handled> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + period;
        while let Ok(Some(h)) = tokio::time::timeout_at(deadline, self.outcomes.recv()).await {
            got.push(h);
        }
        got
    }

    /// Everything handled during `period`, each of which must be `outcome`.
    pub async fn only_during(&mut self, period: Duration, outcome: Outcome) -> Vec<Handled> {
        let got = self.during(period).await;
        assert!(
            got.iter().all(|h| h.outcome == outcome),
            "not all {outcome:?}: {got:?}"
        );
        got
    }

    /// Asserts nothing more is handled for `quiet`.
    pub async fn expect_quiet(&mut self, quiet: Duration) {
        if let Ok(Some(h)) = tokio::time::timeout(quiet, self.outcomes.recv()).await {
            panic!("unexpected outcome {h:?}");
        }
    }

    /// Stops it and waits for its drain.
    pub async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("consumer stops within its drain timeout")
            .expect("consumer task");
    }
}
