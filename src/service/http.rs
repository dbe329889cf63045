//! `/healthz` (process alive), `/readyz` (broker connected, consuming, and the
//! database answers when something uses it) and `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::telemetry::CONSUMING;

/// What the consumer (and the outbox relay) report about themselves; `/readyz`
/// reads it.
#[derive(Debug, Default)]
pub struct Readiness {
    consuming: AtomicBool,
    outbox: AtomicU8,
}

/// What the outbox relay last reported. `/readyz` shows it, but its status
/// does not depend on it: the relay needs the broker and the database, which
/// readiness already checks, and whatever else stops it (no outbox table, a
/// permission) stops every replica alike while their consumers go on
/// cancelling on time. The pending-rows gauges alert on a stuck relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    /// `outbox.enabled = false`, or the relay has not started.
    Disabled,
    /// The last round succeeded.
    Relaying,
    /// The last round failed (database, broker, missing table); it is retried.
    Failing,
}

impl Readiness {
    /// Set when the consumer is subscribed to the due queue on a live connection,
    /// cleared when the connection drops or the consumer stops.
    pub(crate) fn set_consuming(&self, consuming: bool) {
        self.consuming.store(consuming, Ordering::SeqCst);
        metrics::gauge!(CONSUMING.name).set(if consuming { 1.0 } else { 0.0 });
    }

    /// Whether the consumer is consuming now.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::SeqCst)
    }

    /// The relay's state after each round (see [`OutboxState`]).
    pub(crate) fn set_outbox(&self, state: OutboxState) {
        let code = match state {
            OutboxState::Disabled => 0,
            OutboxState::Relaying => 1,
            OutboxState::Failing => 2,
        };
        self.outbox.store(code, Ordering::SeqCst);
    }

    /// What the relay last reported.
    pub fn outbox(&self) -> OutboxState {
        match self.outbox.load(Ordering::SeqCst) {
            1 => OutboxState::Relaying,
            2 => OutboxState::Failing,
            _ => OutboxState::Disabled,
        }
    }
}

impl OutboxState {
    /// How `/readyz` shows it.
    fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Relaying => "relaying",
            Self::Failing => "failing",
        }
    }
}

/// Asks the database whether it answers.
pub(crate) type DbCheck = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

#[derive(Clone)]
struct AppState {
    readiness: Arc<Readiness>,
    db_check: Option<DbCheck>,
    db_timeout: Duration,
    metrics: PrometheusHandle,
}

/// The router `serve` runs. `/readyz` waits at most `db_timeout` for
/// `db_check`; without one (the action does not use the database) it does not
/// ask.
pub(crate) fn app(
    readiness: Arc<Readiness>,
    db_check: Option<DbCheck>,
    db_timeout: Duration,
    metrics: PrometheusHandle,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(AppState {
            readiness,
            db_check,
            db_timeout,
            metrics,
        })
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    let consuming = state.readiness.is_consuming();
    let (db, db_text) = match &state.db_check {
        Some(check) => {
            let db = tokio::time::timeout(state.db_timeout, check())
                .await
                .unwrap_or(false);
            (db, db.to_string())
        }
        None => (true, "not used".to_owned()),
    };
    let outbox = state.readiness.outbox().as_str();
    let body = format!("consuming: {consuming}\ndatabase: {db_text}\noutbox: {outbox}\n");
    if consuming && db {
        (StatusCode::OK, body)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.metrics.render()
}

/// Serves `app` on `listener` until `shutdown` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
