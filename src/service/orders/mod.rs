//! Where orders live: the [`OrderStore`] the consumer and the sweeper cancel
//! through, and its PostgreSQL implementation with configurable statements.
//!
//! Cancelling is one atomic statement per batch (`... WHERE id = ANY($1) AND
//! status = 'unpaid' RETURNING id`): checking "unpaid" and cancelling in two
//! statements would let a payment that lands between them be cancelled.
//!
//! - [`failure`]: what a failed statement means for its messages (pure).
//! - `postgres`: [`PgOrderStore`], every call bounded by `database.query_timeout_ms`.

mod failure;
mod pooled;
mod postgres;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use thiserror::Error;

pub use self::failure::{FailureClass, classify};
pub use self::pooled::{PoolError, PooledClient};
pub use self::postgres::PgOrderStore;
pub(crate) use self::postgres::connect_config;
use crate::clock::Clock;
use crate::publisher::ExpiryMessage;

/// What the cancel statement did to one due order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// It was unpaid and is now cancelled.
    Cancelled,
    /// It exists but was paid or already cancelled: nothing changed.
    NotUnpaid,
    /// No such order.
    Unknown,
    /// Still unpaid, but its deadline was extended past this message's
    /// `due_at`: the message is stale and changes nothing (the deadline rule).
    Extended,
    /// Still unpaid, but another transaction holds its row lock (a payment in
    /// progress): the cancel skipped it; try this one again later.
    Busy,
    /// Still unpaid, but not due yet by the database's clock (this host's
    /// clock, corrected, ran ahead of it): try again after this long.
    NotDue(Duration),
}

/// The database could not answer; the caller keeps the messages and retries.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No connection from the pool (the database is down, or every connection
    /// is busy for longer than `database.acquire_timeout_ms`).
    #[error("no database connection: {}", with_causes(.0))]
    Pool(#[source] PoolError),
    /// The pool cannot be built from the settings.
    #[error("database pool: {0}")]
    Build(#[source] PoolError),
    /// A statement failed (the server's error, or the connection's).
    #[error("database statement failed: {}", with_causes(.0))]
    Query(#[from] tokio_postgres::Error),
    /// A configured statement cannot be prepared: it is wrong for this database
    /// (syntax, a missing table or column), whatever the orders.
    #[error("cannot prepare {setting}: {}", with_causes(.source))]
    Prepare {
        /// The setting holding the statement.
        setting: &'static str,
        /// What the server said.
        source: tokio_postgres::Error,
    },
    /// A configured statement returns something else than described.
    #[error("{setting} {problem}")]
    Shape {
        /// The setting holding the statement.
        setting: &'static str,
        /// What is wrong with what it returns.
        problem: String,
    },
    /// No answer within `database.query_timeout_ms`: the connection is dropped,
    /// never reused.
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),
    /// The server answers but takes no writes (`transaction_read_only` is
    /// on: a standby, or a primary fenced or demoted): no order can be
    /// cancelled there. The connection is dropped.
    #[error(
        "the database is read-only (a standby or a demoted primary): list every host in \
         database.url with target_session_attrs=read-write"
    )]
    ReadOnly,
    /// The URL does not parse.
    #[error("invalid database URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What the parser said, scrubbed of the password.
        reason: String,
    },
}

impl StoreError {
    /// What the failure means for the messages of the statement that hit it.
    pub fn class(&self) -> FailureClass {
        match self.sqlstate() {
            Some((code, _)) if matches!(self, Self::Query(_)) => classify(code),
            // Everything else: the pool, the connection, a timeout, a statement
            // that cannot work at all.
            _ => FailureClass::Unavailable,
        }
    }

    /// The server's SQLSTATE and message, when the server answered with an error.
    pub fn sqlstate(&self) -> Option<(&str, &str)> {
        let db = match self {
            Self::Query(e) | Self::Prepare { source: e, .. } => e.as_db_error()?,
            _ => return None,
        };
        Some((db.code().code(), db.message()))
    }
}

/// `error` with the causes its own text leaves out: tokio-postgres says "db
/// error" or "error connecting to server", and what the server said (SQLSTATE
/// first) or why the connection failed (refused, "database does not allow
/// writes") is its source.
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = match cause.downcast_ref::<tokio_postgres::error::DbError>() {
            Some(db) => format!("SQLSTATE {}: {}", db.code().code(), db.message()),
            None => cause.to_string(),
        };
        if !text.contains(&said) {
            text = match text.strip_suffix("db error") {
                // "db error" says only that the server answered with one.
                Some(head) if said.starts_with("SQLSTATE") => format!("{head}{said}"),
                _ => format!("{text}: {said}"),
            };
        }
        source = cause.source();
    }
    text
}

/// Cancels due orders. The consumer and the sweeper depend on this trait, not
/// on PostgreSQL.
pub trait OrderStore: Send + Sync + 'static {
    /// Cancels the order of every message that is still unpaid, atomically per
    /// order; returns one disposition per message, in input order. A repeated
    /// order is `Cancelled` at most once. The messages (not only their ids) are
    /// given so that a statement can use more of them (`$2`: their `due_at`s).
    fn cancel_unpaid(
        &self,
        messages: &[&ExpiryMessage],
    ) -> impl Future<Output = Result<Vec<Disposition>, StoreError>> + Send;

    /// Cancels up to `limit` unpaid orders whose `pay_deadline` passed more than
    /// `grace` ago, atomically per order; returns their ids. The sweeper calls it
    /// until fewer than `limit` come back.
    fn sweep_overdue(
        &self,
        grace: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// How many unpaid orders are more than `margin` past their deadline (the
    /// `order_expiry_overdue_unpaid` gauge).
    fn count_overdue(
        &self,
        margin: Duration,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Whether the database answers now (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// This host's clock corrected to the database's: the consumer holds and
    /// releases orders by it. This host's own clock unless the store measures
    /// its offset.
    fn clock(&self) -> Clock {
        Clock::local()
    }
}

/// What `exists_sql` says about one existing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Existing {
    /// Still unpaid (the second column; `false` for a one-column statement).
    unpaid: bool,
    /// Its payment deadline now (the third column, when there is one).
    deadline: Option<DateTime<Utc>>,
    /// The database's `now()` (the fourth column, when there is one).
    now: Option<DateTime<Utc>>,
}

/// One disposition per message from what the statements returned: the ids the
/// cancel returned, and of the others those that exist, each with whether it is
/// still unpaid, its deadline and the database's `now()`. An unpaid order the
/// cancel left alone is `Extended` when its deadline is later than the
/// message's `due_at`, `NotDue` when its `due_at` is still ahead of the
/// database's clock (`now()` from `exists_sql`, or else `reference_now`), and
/// `Busy` (skipped because locked) otherwise. A repeated id is `Cancelled` the
/// first time only: the second delivery changed nothing.
fn dispositions(
    messages: &[&ExpiryMessage],
    cancelled: &HashSet<String>,
    existing: &HashMap<String, Existing>,
    reference_now: DateTime<Utc>,
) -> Vec<Disposition> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(messages.len());
    messages
        .iter()
        .map(|message| {
            let id = message.order_id.as_str();
            let first = seen.insert(id);
            if cancelled.contains(id) {
                if first {
                    Disposition::Cancelled
                } else {
                    Disposition::NotUnpaid
                }
            } else if let Some(order) = existing.get(id) {
                match order {
                    Existing { unpaid: false, .. } => Disposition::NotUnpaid,
                    Existing {
                        deadline: Some(deadline),
                        ..
                    } if *deadline > message.due_at => Disposition::Extended,
                    Existing { now, .. } => {
                        let now = now.unwrap_or(reference_now);
                        match (message.due_at - now).to_std() {
                            Ok(left) if !left.is_zero() => Disposition::NotDue(left),
                            _ => Disposition::Busy,
                        }
                    }
                }
            } else {
                Disposition::Unknown
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use chrono::TimeDelta;

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn due() -> DateTime<Utc> {
        "2026-11-30T10:00:00Z".parse().unwrap()
    }

    /// Rows `(id, unpaid, deadline in s from due)` read at `due()`.
    fn existing(rows: &[(&str, bool, Option<i64>)]) -> HashMap<String, Existing> {
        let row = |unpaid, deadline: Option<i64>| Existing {
            unpaid,
            deadline: deadline.map(|s| due() + TimeDelta::seconds(s)),
            now: Some(due()),
        };
        rows.iter()
            .map(|(id, unpaid, deadline)| (id.to_string(), row(*unpaid, *deadline)))
            .collect()
    }

    fn messages(ids: &[&str]) -> Vec<ExpiryMessage> {
        ids.iter()
            .map(|id| ExpiryMessage::new(crate::OrderId::new(*id).unwrap(), due()))
            .collect()
    }

    fn of(
        ids: &[&str],
        cancelled: &[&str],
        rows: &[(&str, bool, Option<i64>)],
    ) -> Vec<Disposition> {
        let messages = messages(ids);
        let refs: Vec<&ExpiryMessage> = messages.iter().collect();
        dispositions(&refs, &set(cancelled), &existing(rows), due())
    }

    #[test]
    fn dispositions_tell_cancelled_paid_extended_busy_and_unknown_apart() {
        let rows = [
            ("b", false, Some(60)),
            ("d", true, None),
            ("e", true, Some(60)),
            ("f", true, Some(0)),
            ("g", true, Some(-60)),
        ];
        let got = of(&["a", "b", "c", "d", "e", "f", "g"], &["a"], &rows);
        assert_eq!(
            got,
            [
                Disposition::Cancelled,
                Disposition::NotUnpaid,
                Disposition::Unknown,
                // Unpaid, no deadline or not later than due_at: locked.
                Disposition::Busy,
                // Unpaid, deadline later than this message's due_at: stale.
                Disposition::Extended,
                Disposition::Busy,
                Disposition::Busy,
            ]
        );
        // A repeated id is cancelled once.
        let repeated = of(&["a", "a"], &["a"], &[("a", false, None)]);
        assert_eq!(repeated, [Disposition::Cancelled, Disposition::NotUnpaid]);
    }

    #[test]
    fn an_unpaid_order_not_due_by_the_database_clock_is_not_due_for_the_time_left() {
        let messages = messages(&["early", "fallback"]);
        let refs: Vec<&ExpiryMessage> = messages.iter().collect();
        let mut rows = existing(&[("early", true, Some(0)), ("fallback", true, None)]);
        // The database read its clock 1.5 s before due_at.
        rows.get_mut("early").unwrap().now = Some(due() - TimeDelta::milliseconds(1_500));
        // A three-column exists_sql: this host's corrected clock says 200 ms before.
        rows.get_mut("fallback").unwrap().now = None;
        let now = due() - TimeDelta::milliseconds(200);
        let got = dispositions(&refs, &set(&[]), &rows, now);
        assert_eq!(
            got,
            [
                Disposition::NotDue(Duration::from_millis(1_500)),
                Disposition::NotDue(Duration::from_millis(200)),
            ]
        );
    }

    #[test]
    fn an_error_says_what_caused_it() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "database does not allow writes",
        );
        let outer = std::io::Error::other(refused);
        assert_eq!(
            with_causes(&outer),
            "database does not allow writes",
            "a cause already in the text is not repeated"
        );
        #[derive(Debug, thiserror::Error)]
        #[error("error connecting to server")]
        struct Connect(#[source] std::io::Error);
        let refused = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "read-only");
        assert_eq!(
            with_causes(&Connect(refused)),
            "error connecting to server: read-only"
        );
    }
}
