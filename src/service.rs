//! The consumer service: consumer loop, safety-net sweeper and HTTP endpoint, built
//! once and run until a shutdown token fires. `main` and the integration tests share this constructor.

use std::sync::Arc;

use futures::FutureExt;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::consumer::{Consumer, ConsumerError};
use crate::http::{self, DbCheck, Readiness};
use crate::orders::{OrderStore, PgOrderStore, StoreError};
use crate::settings::Settings;
use crate::sweeper::Sweeper;
use crate::telemetry;

/// The service could not be built.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// Database settings are invalid.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Consumer settings are invalid.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// The HTTP address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A built, not yet running, consumer service.
#[derive(Debug)]
pub struct Service {
    consumer: Consumer<PgOrderStore>,
    sweeper: Option<Sweeper>,
    listener: TcpListener,
    router: axum::Router,
    readiness: Arc<Readiness>,
}

impl Service {
    /// Builds the store, consumer and HTTP listener from `settings`. Port 0 in
    /// `http.listen` picks a free port; [`Service::http_addr`] tells which.
    pub async fn build(settings: &Settings) -> Result<Self, ServiceError> {
        let store = Arc::new(PgOrderStore::new(&settings.database)?);
        let readiness = Arc::new(Readiness::default());
        let consumer = Consumer::new(settings, Arc::clone(&store), Arc::clone(&readiness))?;
        let sweeper = settings
            .sweeper
            .enabled
            .then(|| Sweeper::new(&settings.sweeper, Arc::clone(&store)));
        let listener = TcpListener::bind(&settings.http.listen)
            .await
            .map_err(|source| ServiceError::Listen {
                addr: settings.http.listen.clone(),
                source,
            })?;
        let db_check: DbCheck = Arc::new(move || {
            let store = Arc::clone(&store);
            async move { store.ping().await.is_ok() }.boxed()
        });
        let router = http::app(
            Arc::clone(&readiness),
            db_check,
            telemetry::metrics_handle(),
        );
        Ok(Self {
            consumer,
            sweeper,
            listener,
            router,
            readiness,
        })
    }

    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub fn http_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// What `/readyz` reports on.
    pub fn readiness(&self) -> Arc<Readiness> {
        Arc::clone(&self.readiness)
    }

    /// Runs until `shutdown` is cancelled: the consumer drains and the sweeper
    /// stops, then the HTTP endpoint stops.
    pub async fn run(self, shutdown: CancellationToken) {
        if let Ok(addr) = self.listener.local_addr() {
            info!(%addr, "http endpoint listening");
        }
        let http_stop = CancellationToken::new();
        let http = tokio::spawn(http::serve(self.listener, self.router, http_stop.clone()));
        let sweep_stop = shutdown.child_token();
        let sweeper = self
            .sweeper
            .map(|s| tokio::spawn(s.run(sweep_stop.clone())));
        self.consumer.run(shutdown).await;
        sweep_stop.cancel();
        if let Some(sweeper) = sweeper {
            let _ = sweeper.await;
        }
        http_stop.cancel();
        if let Ok(Err(e)) = http.await {
            tracing::warn!(error = %e, "http endpoint failed");
        }
    }
}
