//! [`OrderStore`] on PostgreSQL through a small connection pool, with the
//! statements of `database.cancel_sql`, `database.exists_sql` and
//! `sweeper.sweep_sql`, so users can point them at their own schema.
//!
//! Every prepare and query is bounded by `database.query_timeout_ms` on the
//! client side ([`Checkout`]): `statement_timeout` is the server's, and a server
//! that went silent (a failover, a dropped route) never sends it. A connection
//! whose call did not finish is detached from the pool and closed, never reused.
//!
//! Failover: `database.url` may name several hosts with
//! `target_session_attrs=read-write`; tokio-postgres then tries them in order
//! and keeps the first that takes writes. That choice is made when a connection
//! opens, and the pool's recycling (`is_closed` only) never makes it again, so
//! a pooled connection can outlive its server's role: a primary fenced or
//! demoted while it stays up answers every write with SQLSTATE 25006. A call
//! that fails with the unavailable class (25006, a shutdown, a broken socket,
//! no answer) therefore drops its connection and every idle one of the pool:
//! the next call opens a new connection, to whichever host takes writes then.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use secrecy::ExposeSecret;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Statement};

use super::{
    Disposition, Existing, FailureClass, OrderStore, PooledClient, StoreError, dispositions,
};
use crate::clock::Clock;
use crate::publisher::ExpiryMessage;
use crate::service::migrations::migration_sql;
use crate::settings::{DatabaseSettings, Settings, redact_database_url, scrub_database_url};

/// [`OrderStore`] on PostgreSQL.
#[derive(Clone)]
pub struct PgOrderStore {
    pool: Pool,
    cancel_sql: String,
    exists_sql: String,
    sweep_sql: String,
    overdue_sql: String,
    /// Whether `cancel_sql` skips locked rows: then `exists_sql` must say which
    /// of the rest are still unpaid (its second column).
    skips_locked: bool,
    query_timeout: Duration,
    /// This host's clock corrected to the database's (see `service::clock`).
    clock: Clock,
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
            overdue_sql: settings.overdue.count_sql.clone(),
            skips_locked: skips_locked(&settings.database.cancel_sql),
            query_timeout: settings.database.query_timeout,
            clock: Clock::local(),
        })
    }

    /// One timed reading of the database's clock: its `clock_timestamp()`,
    /// this host's (uncorrected) time when the query was sent, and the round
    /// trip. The database read its clock somewhere within that round trip.
    pub(crate) async fn read_clock(
        &self,
    ) -> Result<(DateTime<Utc>, DateTime<Utc>, Duration), StoreError> {
        let mut db = self.checkout().await?;
        let read = db.prepare("clock", "SELECT clock_timestamp()").await?;
        let sent = Utc::now();
        let started = std::time::Instant::now();
        let rows = db.query(&read, &[]).await?;
        let round_trip = started.elapsed();
        let reference = rows
            .first()
            .and_then(|row| row.try_get::<_, DateTime<Utc>>(0).ok())
            .ok_or_else(|| shape("clock", "SELECT clock_timestamp() returned no time".into()))?;
        Ok((reference, sent, round_trip))
    }

    /// A pooled connection for one store call, bounded by `query_timeout_ms`.
    async fn checkout(&self) -> Result<Checkout, StoreError> {
        Ok(Checkout {
            client: Some(self.pool.get().await?),
            pool: self.pool.clone(),
            detach: false,
            timeout: self.query_timeout,
        })
    }

    /// A pooled connection for order-side SQL the store does not cover: the
    /// demo's and the tests' own queries.
    pub async fn client(&self) -> Result<PooledClient, StoreError> {
        Ok(PooledClient::new(self.pool.get().await?))
    }

    /// Creates the default `orders` table and the outbox
    /// (`order_expiry_outbox`, its rejected rows, its notify trigger) where
    /// they do not exist, in one transaction.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.client().await?.batch_execute(&migration_sql()).await?;
        Ok(())
    }

    /// Inserts an unpaid order due at `pay_deadline` (what the order service does).
    pub async fn create_unpaid(
        &self,
        id: &str,
        pay_deadline: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let insert = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2)";
        self.checkout()
            .await?
            .execute(insert, &[&id, &pay_deadline])
            .await?;
        Ok(())
    }

    /// Marks an order paid if it is still unpaid; `true` when it was.
    pub async fn pay(&self, id: &str) -> Result<bool, StoreError> {
        let pay = "UPDATE orders SET status = 'paid', paid_at = now() \
                   WHERE id = $1 AND status = 'unpaid'";
        let n = self.checkout().await?.execute(pay, &[&id]).await?;
        Ok(n == 1)
    }
}

impl OrderStore for PgOrderStore {
    /// Corrected by what `read_clock` readings measured (`service::clock`).
    fn clock(&self) -> Clock {
        self.clock.clone()
    }

    async fn cancel_unpaid(
        &self,
        messages: &[&ExpiryMessage],
    ) -> Result<Vec<Disposition>, StoreError> {
        let ids: Vec<&str> = messages.iter().map(|m| m.order_id.as_str()).collect();
        let due_at: Vec<DateTime<Utc>> = messages.iter().map(|m| m.due_at).collect();
        let mut db = self.checkout().await?;
        let cancel = db.prepare("database.cancel_sql", &self.cancel_sql).await?;
        let rows =
            query_ids_and_due_at(&mut db, "database.cancel_sql", &cancel, &ids, &due_at).await?;
        let cancelled: HashSet<String> = ids_of("database.cancel_sql", &rows)?;
        // Only the ids not cancelled need telling apart (paid, extended,
        // locked or unknown): usually none.
        let (rest, rest_due_at): (Vec<&str>, Vec<DateTime<Utc>>) = ids
            .iter()
            .zip(&due_at)
            .filter(|(id, _)| !cancelled.contains(**id))
            .map(|(id, at)| (*id, *at))
            .unzip();
        let existing = if rest.is_empty() {
            HashMap::new()
        } else {
            let exists = db.prepare("database.exists_sql", &self.exists_sql).await?;
            let rows =
                query_ids_and_due_at(&mut db, "database.exists_sql", &exists, &rest, &rest_due_at)
                    .await?;
            self.existing(&exists, &rows)?
        };
        Ok(dispositions(
            messages,
            &cancelled,
            &existing,
            self.clock.now(),
        ))
    }

    async fn sweep_overdue(&self, grace: Duration, limit: u32) -> Result<Vec<String>, StoreError> {
        let mut db = self.checkout().await?;
        let sweep = db.prepare("sweeper.sweep_sql", &self.sweep_sql).await?;
        // $1 is seconds (float8), $2 a bigint.
        let (grace, limit) = (grace.as_secs_f64(), i64::from(limit));
        let rows = db.query(&sweep, &[&grace, &limit]).await?;
        ids_of("sweeper.sweep_sql", &rows)
    }

    async fn count_overdue(&self, margin: Duration) -> Result<i64, StoreError> {
        let mut db = self.checkout().await?;
        let count = db.prepare("overdue.count_sql", &self.overdue_sql).await?;
        let rows = db.query(&count, &[&margin.as_secs_f64()]).await?;
        let shape = || StoreError::Shape {
            setting: "overdue.count_sql",
            problem: "must return one row with one bigint column (the count)".into(),
        };
        rows.first()
            .ok_or_else(shape)?
            .try_get(0)
            .map_err(|_| shape())
    }

    /// Ready means able to cancel: a server that answers but refuses writes
    /// (a standby, a fenced primary) is not ready, and its connection goes.
    async fn ping(&self) -> Result<(), StoreError> {
        let mut db = self.checkout().await?;
        let read_only = db.simple("SHOW transaction_read_only").await?;
        if read_only.as_deref() == Some("on") {
            db.detach = true;
            return Err(StoreError::ReadOnly);
        }
        Ok(())
    }
}

impl PgOrderStore {
    /// What `exists_sql` returned: each existing id, with whether it is still
    /// unpaid (second column, boolean), its deadline (third column,
    /// timestamptz, optional) and the database's `now()` (fourth column,
    /// timestamptz, optional: tells an order not due yet by the database's
    /// clock from a locked one). A one-column statement says only that they
    /// exist, which is enough unless the cancel skips locked rows.
    fn existing(
        &self,
        exists: &Statement,
        rows: &[Row],
    ) -> Result<HashMap<String, Existing>, StoreError> {
        const SETTING: &str = "database.exists_sql";
        match exists.columns().len() {
            1 if self.skips_locked => Err(shape(
                SETTING,
                "returns one column, but database.cancel_sql skips locked rows: add a second, \
                 status = 'unpaid', or a locked unpaid order would be taken for paid"
                    .into(),
            )),
            1 => Ok(ids_of::<Vec<String>>(SETTING, rows)?
                .into_iter()
                .map(|id| (id, Existing::default()))
                .collect()),
            n @ 2..=4 => rows
                .iter()
                .map(|row| {
                    let deadline = match n {
                        3 | 4 => row.try_get::<_, Option<DateTime<Utc>>>(2)?,
                        _ => None,
                    };
                    let now = match n {
                        4 => row.try_get::<_, Option<DateTime<Utc>>>(3)?,
                        _ => None,
                    };
                    let unpaid = row.try_get::<_, bool>(1)?;
                    Ok((
                        row.try_get(0)?,
                        Existing {
                            unpaid,
                            deadline,
                            now,
                        },
                    ))
                })
                .collect::<Result<_, tokio_postgres::Error>>()
                .map_err(|e| {
                    shape(
                        SETTING,
                        format!(
                            "returns other types than (text, boolean[, timestamptz[, timestamptz]]): {e}"
                        ),
                    )
                }),
            n => Err(shape(
                SETTING,
                format!(
                    "returns {n} columns, not 1 (id), 2 (id, still unpaid), 3 (id, still unpaid, \
                     deadline) or 4 (id, still unpaid, deadline, now())"
                ),
            )),
        }
    }
}

/// Runs a statement that takes `$1` the ids (text[]) and, when it declares a
/// second parameter, `$2` their messages' `due_at` (timestamptz[]).
async fn query_ids_and_due_at(
    db: &mut Checkout,
    setting: &'static str,
    statement: &Statement,
    ids: &[&str],
    due_at: &[DateTime<Utc>],
) -> Result<Vec<Row>, StoreError> {
    match statement.params().len() {
        1 => db.query(statement, &[&ids]).await,
        2 => db.query(statement, &[&ids, &due_at]).await,
        n => Err(shape(
            setting,
            format!("has {n} parameters, not 1 ($1 ids) or 2 ($2 due_at)"),
        )),
    }
}

/// Whether a cancel statement skips rows another transaction has locked.
fn skips_locked(cancel_sql: &str) -> bool {
    let words: Vec<String> = cancel_sql
        .split_whitespace()
        .map(str::to_ascii_uppercase)
        .collect();
    words.windows(2).any(|w| w[0] == "SKIP" && w[1] == "LOCKED")
}

fn shape(setting: &'static str, problem: String) -> StoreError {
    StoreError::Shape { setting, problem }
}

/// A pooled connection for one store call. Each prepare and query is bounded
/// by `timeout`. Dropping the checkout detaches the connection from the pool
/// and closes it when it must not be used again:
/// - a call did not finish (it timed out, or the caller gave up on it): the
///   connection has a request in flight, perhaps on a dead socket;
/// - a call failed with the unavailable class (see the module docs): then
///   the pool's idle connections go too, as they reach the same server.
struct Checkout {
    client: Option<Object>,
    pool: Pool,
    detach: bool,
    timeout: Duration,
}

impl Checkout {
    async fn prepare(&mut self, setting: &'static str, sql: &str) -> Result<Statement, StoreError> {
        let client = held(&self.client, self.timeout)?;
        let call = client.prepare_cached(sql);
        let answer = bounded(&mut self.detach, self.timeout, call).await?;
        settled(
            &mut self.detach,
            answer.map_err(|source| StoreError::Prepare { setting, source }),
        )
    }

    async fn query(
        &mut self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = held(&self.client, self.timeout)?;
        let call = client.query(statement, params);
        let answer = bounded(&mut self.detach, self.timeout, call).await?;
        settled(&mut self.detach, answer.map_err(StoreError::from))
    }

    async fn execute(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = held(&self.client, self.timeout)?;
        let call = client.execute(sql, params);
        let answer = bounded(&mut self.detach, self.timeout, call).await?;
        settled(&mut self.detach, answer.map_err(StoreError::from))
    }

    /// Runs `sql` (simple protocol); the first column of its first row.
    async fn simple(&mut self, sql: &str) -> Result<Option<String>, StoreError> {
        let client = held(&self.client, self.timeout)?;
        let call = client.simple_query(sql);
        let answer = bounded(&mut self.detach, self.timeout, call).await?;
        let messages = settled(&mut self.detach, answer.map_err(StoreError::from))?;
        Ok(messages.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        }))
    }
}

/// The checkout's client; only a dropped checkout has none.
fn held(client: &Option<Object>, timeout: Duration) -> Result<&Object, StoreError> {
    client.as_ref().ok_or(StoreError::Timeout(timeout))
}

/// Awaits `call` for at most `timeout`, with `detach` set while it runs (a
/// call given up on leaves it set).
async fn bounded<T>(
    detach: &mut bool,
    timeout: Duration,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<Result<T, tokio_postgres::Error>, StoreError> {
    *detach = true;
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| StoreError::Timeout(timeout))
}

/// A finished call's answer; `detach` stays set only when it failed with the
/// unavailable class.
fn settled<T>(detach: &mut bool, answer: Result<T, StoreError>) -> Result<T, StoreError> {
    *detach = matches!(&answer, Err(e) if e.class() == FailureClass::Unavailable);
    answer
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && self.detach
        {
            // Detached: dropping the connection closes it instead of pooling
            // it; the idle ones were opened before the failure, to the same
            // server, and go as well.
            drop(Object::take(client));
            drop(self.pool.retain(|_, _| false));
        }
    }
}

/// The first column of every row, as text: the ids a statement returned.
fn ids_of<C: FromIterator<String>>(setting: &'static str, rows: &[Row]) -> Result<C, StoreError> {
    rows.iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<C, _>>()
        .map_err(|e| shape(setting, format!("must return the ids as text first: {e}")))
}

/// The connection settings every database connection of the service uses:
/// the URL, server-side statement and lock timeouts, keepalives. The pool's
/// connections and the outbox relay's own connection share them.
pub(crate) fn connect_config(
    settings: &DatabaseSettings,
) -> Result<tokio_postgres::Config, StoreError> {
    // Parse errors may quote the URL: scrub the password out of them.
    let mut config: tokio_postgres::Config =
        settings
            .url
            .expose_secret()
            .parse()
            .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl {
                url: redact_database_url(&settings.url),
                reason: scrub_database_url(&e.to_string(), &settings.url),
            })?;
    // Server-side bounds on every session: a statement, and a wait for a row
    // lock (a custom cancel_sql without SKIP LOCKED then fails fast with 55P03,
    // which the consumer isolates to the one locked order).
    let timeouts = format!(
        "-c statement_timeout={} -c lock_timeout={}",
        settings.statement_timeout.as_millis(),
        settings.lock_timeout.as_millis()
    );
    let options = match config.get_options() {
        Some(existing) => format!("{existing} {timeouts}"),
        None => timeouts,
    };
    // TCP keepalives and a user timeout notice a dead peer that the client-side
    // query timeout would otherwise be the only one to catch.
    config
        .options(&options)
        .application_name("order-expiry")
        .connect_timeout(settings.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(settings.query_timeout);
    Ok(config)
}

fn pool(settings: &DatabaseSettings) -> Result<Pool, StoreError> {
    let config = connect_config(settings)?;
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
