//! Where orders live: the [`OrderStore`] the consumer cancels through, and its
//! PostgreSQL implementation with configurable statements.
//!
//! Cancelling is one atomic statement per batch (`... WHERE id = ANY($1) AND
//! status = 'unpaid' RETURNING id`): checking "unpaid" and cancelling in two
//! statements would let a payment that lands between them be cancelled.

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use secrecy::ExposeSecret;
use thiserror::Error;
use tokio_postgres::NoTls;

use crate::settings::{DatabaseSettings, scrub_url};

/// The default table, as in the public contract. `migrate` runs it.
pub const SCHEMA_SQL: &str = "CREATE TABLE IF NOT EXISTS orders (
  id           text PRIMARY KEY,
  status       text NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid','paid','cancelled')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  pay_deadline timestamptz,
  paid_at      timestamptz,
  cancelled_at timestamptz
)";

/// What the cancel statement did to one due order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// It was unpaid and is now cancelled.
    Cancelled,
    /// It exists but was paid or already cancelled: nothing changed.
    NotUnpaid,
    /// No such order.
    Unknown,
}

/// The database could not answer; the caller keeps the messages and retries.
#[derive(Debug, Error)]
pub enum StoreError {
    /// No connection from the pool.
    #[error("no database connection: {0}")]
    Pool(String),
    /// A statement failed.
    #[error("database statement failed: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The URL does not parse.
    #[error("invalid database URL: {0}")]
    Url(String),
}

/// Cancels due orders. The consumer depends on this trait, not on PostgreSQL.
pub trait OrderStore: Send + Sync + 'static {
    /// Cancels every order in `ids` that is still unpaid, atomically per order;
    /// returns one disposition per input id, in input order. A repeated id is
    /// `Cancelled` at most once.
    fn cancel_unpaid(
        &self,
        ids: &[&str],
    ) -> impl Future<Output = Result<Vec<Disposition>, StoreError>> + Send;

    /// Whether the database answers now (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// [`OrderStore`] on PostgreSQL through a small connection pool.
#[derive(Clone)]
pub struct PgOrderStore {
    pool: Pool,
    cancel_sql: String,
    exists_sql: String,
}

impl std::fmt::Debug for PgOrderStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOrderStore")
            .field("cancel_sql", &self.cancel_sql)
            .finish_non_exhaustive()
    }
}

impl PgOrderStore {
    /// A store for `settings`. Connections are opened on demand, so this succeeds
    /// while the database is down; [`OrderStore::ping`] tells.
    pub fn new(settings: &DatabaseSettings) -> Result<Self, StoreError> {
        Ok(Self {
            pool: pool(settings)?,
            cancel_sql: settings.cancel_sql.clone(),
            exists_sql: settings.exists_sql.clone(),
        })
    }

    /// The pool, for the order-side helpers (`migrate`, demo, tests).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the default `orders` table if it does not exist.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.batch_execute(SCHEMA_SQL).await?;
        Ok(())
    }

    /// Inserts an unpaid order due at `pay_deadline` (what the order service does).
    pub async fn create_unpaid(
        &self,
        id: &str,
        pay_deadline: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)",
                &[&id, &pay_deadline],
            )
            .await?;
        Ok(())
    }

    /// Marks an order paid if it is still unpaid; `true` when it was.
    pub async fn pay(&self, id: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1 AND status = 'unpaid'",
                &[&id],
            )
            .await?;
        Ok(n == 1)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Pool(e.to_string()))
    }
}

impl OrderStore for PgOrderStore {
    async fn cancel_unpaid(&self, ids: &[&str]) -> Result<Vec<Disposition>, StoreError> {
        let client = self.client().await?;
        let cancel = client.prepare_cached(&self.cancel_sql).await?;
        let cancelled: HashSet<String> = client
            .query(&cancel, &[&ids])
            .await?
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<_, _>>()?;
        // Only the ids not cancelled need telling apart (paid vs unknown): usually none.
        let rest: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| !cancelled.contains(*id))
            .collect();
        let existing: HashSet<String> = if rest.is_empty() {
            HashSet::new()
        } else {
            let exists = client.prepare_cached(&self.exists_sql).await?;
            client
                .query(&exists, &[&rest])
                .await?
                .iter()
                .map(|row| row.try_get::<_, String>(0))
                .collect::<Result<_, _>>()?
        };
        Ok(dispositions(ids, &cancelled, &existing))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }
}

/// One disposition per id from what the statements returned. A repeated id is
/// `Cancelled` the first time only: the second delivery changed nothing.
pub fn dispositions(
    ids: &[&str],
    cancelled: &HashSet<String>,
    existing: &HashSet<String>,
) -> Vec<Disposition> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(ids.len());
    ids.iter()
        .map(|id| {
            let first = seen.insert(id);
            if cancelled.contains(*id) {
                if first {
                    Disposition::Cancelled
                } else {
                    Disposition::NotUnpaid
                }
            } else if existing.contains(*id) {
                Disposition::NotUnpaid
            } else {
                Disposition::Unknown
            }
        })
        .collect()
}

fn pool(settings: &DatabaseSettings) -> Result<Pool, StoreError> {
    // Parse errors may quote the URL: scrub the password out of them.
    let invalid =
        |e: tokio_postgres::Error| StoreError::Url(scrub_url(&e.to_string(), &settings.url));
    let mut config: tokio_postgres::Config =
        settings.url.expose_secret().parse().map_err(invalid)?;
    let timeout_opt = format!("-c statement_timeout={}", settings.statement_timeout_ms);
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {timeout_opt}"),
        None => timeout_opt,
    };
    config
        .options(&options)
        .application_name("order-expiry")
        .connect_timeout(Duration::from_secs(5));
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(settings.pool_size.max(1))
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Pool(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dispositions_tell_cancelled_paid_and_unknown_apart() {
        let got = dispositions(&["a", "b", "c"], &set(&["a"]), &set(&["b"]));
        assert_eq!(
            got,
            [
                Disposition::Cancelled,
                Disposition::NotUnpaid,
                Disposition::Unknown
            ]
        );
    }

    #[test]
    fn a_repeated_id_is_cancelled_once() {
        let got = dispositions(&["a", "a"], &set(&["a"]), &set(&["a"]));
        assert_eq!(got, [Disposition::Cancelled, Disposition::NotUnpaid]);
    }
}
