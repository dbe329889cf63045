//! [`OrderStore`] on PostgreSQL through a small connection pool, with the
//! statements of `database.cancel_sql`, `database.exists_sql` and
//! `sweeper.sweep_sql`, so users can point them at their own schema.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use secrecy::ExposeSecret;
use tokio_postgres::NoTls;

use super::{Disposition, OrderStore, StoreError, dispositions};
use crate::settings::{DatabaseSettings, Settings, redact_url, scrub_url};

/// The default table, as in the public contract. `migrate` runs it.
pub(crate) const SCHEMA_SQL: &str = "CREATE TABLE IF NOT EXISTS orders (
  id           text PRIMARY KEY,
  status       text NOT NULL DEFAULT 'unpaid' CHECK (status IN ('unpaid','paid','cancelled')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  pay_deadline timestamptz,
  paid_at      timestamptz,
  cancelled_at timestamptz
)";

/// [`OrderStore`] on PostgreSQL.
#[derive(Clone)]
pub struct PgOrderStore {
    pool: Pool,
    cancel_sql: String,
    exists_sql: String,
    sweep_sql: String,
}

impl std::fmt::Debug for PgOrderStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOrderStore")
            .field("cancel_sql", &self.cancel_sql)
            .finish_non_exhaustive()
    }
}

impl PgOrderStore {
    /// A store for the database and statements of `settings`. Connections are
    /// opened on demand, so this succeeds while the database is down;
    /// [`OrderStore::ping`] tells.
    pub fn new(settings: &Settings) -> Result<Self, StoreError> {
        Ok(Self {
            pool: pool(&settings.database)?,
            cancel_sql: settings.database.cancel_sql.clone(),
            exists_sql: settings.database.exists_sql.clone(),
            sweep_sql: settings.sweeper.sweep_sql.clone(),
        })
    }

    /// A pooled connection for order-side SQL the store does not cover: the
    /// demo's and the tests' own queries.
    pub async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Creates the default `orders` table if it does not exist.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.client().await?.batch_execute(SCHEMA_SQL).await?;
        Ok(())
    }

    /// Inserts an unpaid order due at `pay_deadline` (what the order service does).
    pub async fn create_unpaid(
        &self,
        id: &str,
        pay_deadline: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let insert = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)";
        self.client()
            .await?
            .execute(insert, &[&id, &pay_deadline])
            .await?;
        Ok(())
    }

    /// Marks an order paid if it is still unpaid; `true` when it was.
    pub async fn pay(&self, id: &str) -> Result<bool, StoreError> {
        let pay = "UPDATE orders SET status = 'paid', paid_at = now() \
                   WHERE id = $1 AND status = 'unpaid'";
        let n = self.client().await?.execute(pay, &[&id]).await?;
        Ok(n == 1)
    }
}

impl OrderStore for PgOrderStore {
    async fn cancel_unpaid(&self, ids: &[&str]) -> Result<Vec<Disposition>, StoreError> {
        let client = self.client().await?;
        let cancel = client.prepare_cached(&self.cancel_sql).await?;
        let cancelled: HashSet<String> = ids_of(client.query(&cancel, &[&ids]).await?)?;
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
            ids_of(client.query(&exists, &[&rest]).await?)?
        };
        Ok(dispositions(ids, &cancelled, &existing))
    }

    async fn sweep_overdue(&self, grace: Duration, limit: u32) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let sweep = client.prepare_cached(&self.sweep_sql).await?;
        // $1 is seconds (float8), $2 a bigint.
        let (grace, limit) = (grace.as_secs_f64(), i64::from(limit));
        ids_of(client.query(&sweep, &[&grace, &limit]).await?)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }
}

/// The first column of every row, as text: the ids a statement returned.
fn ids_of<C: FromIterator<String>>(rows: Vec<tokio_postgres::Row>) -> Result<C, StoreError> {
    Ok(rows
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<C, _>>()?)
}

fn pool(settings: &DatabaseSettings) -> Result<Pool, StoreError> {
    // Parse errors may quote the URL: scrub the password out of them.
    let mut config: tokio_postgres::Config =
        settings
            .url
            .expose_secret()
            .parse()
            .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl {
                url: redact_url(&settings.url),
                reason: scrub_url(&e.to_string(), &settings.url),
            })?;
    let statement_timeout = format!(
        "-c statement_timeout={}",
        settings.statement_timeout.as_millis()
    );
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {statement_timeout}"),
        None => statement_timeout,
    };
    config
        .options(&options)
        .application_name("order-expiry")
        .connect_timeout(settings.connect_timeout);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(settings.pool_size.max(1))
        .wait_timeout(Some(settings.acquire_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.connect_timeout))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(sql: &str) -> String {
        let without_comments: Vec<&str> = sql
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect();
        let text = without_comments.join(" ");
        let words: Vec<&str> = text.split_whitespace().collect();
        words.join(" ").trim_end_matches(';').trim().to_owned()
    }

    /// The compose stack's PostgreSQL creates the table `migrate` creates.
    #[test]
    fn deploy_init_sql_is_the_migration() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/postgres/init.sql");
        let init = std::fs::read_to_string(path).unwrap();
        assert_eq!(normalized(&init), normalized(SCHEMA_SQL));
    }
}
