//! The consumer service: consumer loop, safety-net sweeper and HTTP endpoint,
//! built once and run until a shutdown token fires. `order-expiry serve` and the
//! integration tests share this constructor.

use std::sync::Arc;

use futures::FutureExt;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::action::{BuildError, ConfiguredAction};
use super::clock::ClockWatch;
use super::consumer::{Consumer, ConsumerError};
use super::http::{self, DbCheck, Readiness};
use super::orders::{OrderStore, PgOrderStore, StoreError};
use super::outbox::{Relay, RelayError};
use super::overdue::OverdueWatch;
use super::sweeper::Sweeper;
use crate::settings::{InvalidSetting, Settings};
use crate::telemetry::metrics_handle;

/// How long start-up waits for the first reading of the database's clock.
const FIRST_PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// The service could not be built.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// A setting cannot work: named, with the reason, in one line.
    #[error(transparent)]
    Settings(#[from] InvalidSetting),
    /// Database settings are invalid.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The action cannot be built (its URL, its token).
    #[error("invalid setting {0}")]
    Action(#[from] BuildError),
    /// Consumer settings are invalid.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// Outbox relay settings are invalid.
    #[error(transparent)]
    Relay(#[from] RelayError),
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
    consumer: Consumer<ConfiguredAction>,
    sweeper: Option<Sweeper<PgOrderStore>>,
    overdue: Option<OverdueWatch<PgOrderStore>>,
    relay: Option<Relay>,
    /// Measure this host's offset from the reference clocks: the database's,
    /// when anything uses it (the SQL action, the outbox relay); the order
    /// service's, with the HTTP action.
    clocks: Vec<ClockWatch>,
    listener: TcpListener,
    router: axum::Router,
    readiness: Arc<Readiness>,
    /// The broker and database URLs, passwords redacted, for the start-up log
    /// (the database's only when something uses it).
    urls: (String, Option<String>),
    /// `action.kind`, for the start-up log.
    action: &'static str,
}

impl Service {
    /// Validates `settings` ([`Settings::validate`]), then builds the action
    /// (and the store, when the action or the sweeper uses the database),
    /// consumer and HTTP listener from them. Port 0 in `http.listen` picks a
    /// free port; [`Service::http_addr`] tells which.
    pub async fn build(settings: &Settings) -> Result<Self, ServiceError> {
        settings.validate()?;
        let action = Arc::new(ConfiguredAction::from_settings(settings, None)?);
        // Only the SQL action uses the database (the sweeper is refused with
        // any other, see `Settings::validate`).
        let store: Option<Arc<PgOrderStore>> = action.store().cloned();
        let readiness = Arc::new(Readiness::default());
        let consumer = Consumer::new(settings, Arc::clone(&action), Arc::clone(&readiness))?;
        let sweeper = match (&store, settings.sweeper.enabled) {
            (Some(store), true) => Some(Sweeper::new(&settings.sweeper, Arc::clone(store))),
            _ => None,
        };
        let overdue = store
            .as_ref()
            .map(|store| OverdueWatch::new(&settings.overdue, Arc::clone(store)));
        // The relay reads database.url whatever the action: an order service
        // that expires its orders itself (http, amqp) may keep its outbox there.
        let relay = match settings.outbox.enabled {
            true => Some(Relay::new(settings, Arc::clone(&readiness))?),
            false => None,
        };
        // The database's clock judges the SQL action's due times and the
        // outbox's delays: measured on the store when there is one, else on a
        // pool of its own (connections open on demand).
        let clock_store = match (&store, &relay) {
            (Some(store), _) => Some(Arc::clone(store)),
            (None, Some(_)) => Some(Arc::new(PgOrderStore::new(settings)?)),
            (None, None) => None,
        };
        let database_clock = clock_store.map(|store| ClockWatch::database(store, &settings.clock));
        let relay = match (relay, &database_clock) {
            (Some(relay), Some(clock)) => Some(relay.with_clock(clock.clock())),
            (relay, _) => relay,
        };
        let mut clocks: Vec<ClockWatch> = database_clock.into_iter().collect();
        if let ConfiguredAction::Http(http) = action.as_ref() {
            clocks.push(ClockWatch::order_service(http.clone(), &settings.clock));
        }
        let listener = TcpListener::bind(&settings.http.listen)
            .await
            .map_err(|source| ServiceError::Listen {
                addr: settings.http.listen.clone(),
                source,
            })?;
        let db_check: Option<DbCheck> = store.clone().map(|store| -> DbCheck {
            Arc::new(move || {
                let store = Arc::clone(&store);
                async move { store.ping().await.is_ok() }.boxed()
            })
        });
        let router = http::app(
            Arc::clone(&readiness),
            db_check,
            settings.http.ready_timeout,
            metrics_handle(),
        );
        let uses_database = store.is_some() || relay.is_some();
        let database = uses_database.then(|| settings.database.display_url());
        let urls = (settings.amqp.display_url(), database);
        Ok(Self {
            consumer,
            sweeper,
            overdue,
            relay,
            clocks,
            listener,
            router,
            readiness,
            urls,
            action: settings.action.kind.as_str(),
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

    /// Runs until `shutdown` is cancelled (see [`crate::service::shutdown_on_signal`]):
    /// the consumer drains, the sweeper stops and the outbox relay finishes its
    /// round, then the HTTP endpoint stops.
    pub async fn run(self, shutdown: CancellationToken) {
        let (amqp, database) = &self.urls;
        let database = database.as_deref().unwrap_or("not used");
        info!(%amqp, %database, action = self.action, "starting consumer service");
        if let Ok(addr) = self.listener.local_addr() {
            info!(%addr, "http endpoint listening");
        }
        let http_stop = CancellationToken::new();
        let http = tokio::spawn(http::serve(self.listener, self.router, http_stop.clone()));
        let sweep_stop = shutdown.child_token();
        // The offsets from the reference clocks before the first delivery: a
        // reference that does not answer soon is read again every quarter
        // second until it does (until then the cancel statement's own now()
        // rule, or the order service's 425, keeps every cancel from being
        // early, and a host that is behind holds orders late).
        let mut clocks = Vec::with_capacity(self.clocks.len());
        for mut clock in self.clocks {
            let first = tokio::time::timeout(FIRST_PROBE, clock.probe()).await;
            let measured = first.unwrap_or(false);
            if !measured {
                warn!("no reading of the reference clock at start; trying again until one");
            }
            clocks.push(tokio::spawn(clock.run(measured, sweep_stop.clone())));
        }
        let sweeper = self
            .sweeper
            .map(|s| tokio::spawn(s.run(sweep_stop.clone())));
        let relay = self.relay.map(|r| tokio::spawn(r.run(sweep_stop.clone())));
        let overdue = self
            .overdue
            .map(|w| tokio::spawn(w.run(sweep_stop.clone())));
        self.consumer.run(shutdown).await;
        sweep_stop.cancel();
        if let Some(overdue) = overdue {
            let _ = overdue.await;
        }
        if let Some(sweeper) = sweeper {
            let _ = sweeper.await;
        }
        if let Some(relay) = relay {
            let _ = relay.await;
        }
        for clock in clocks {
            let _ = clock.await;
        }
        http_stop.cancel();
        if let Ok(Err(e)) = http.await {
            warn!(error = %e, "http endpoint failed");
        }
    }
}
