//! Where orders live: the [`OrderStore`] the consumer and the sweeper cancel
//! through, and its PostgreSQL implementation with configurable statements.
//!
//! Cancelling is one atomic statement per batch (`... WHERE id = ANY($1) AND
//! status = 'unpaid' RETURNING id`): checking "unpaid" and cancelling in two
//! statements would let a payment that lands between them be cancelled.

mod postgres;

use std::collections::HashSet;
use std::time::Duration;

use thiserror::Error;

pub use self::postgres::PgOrderStore;

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
    /// No connection from the pool (the database is down, or every connection
    /// is busy for longer than `database.acquire_timeout_ms`).
    #[error("no database connection: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The pool cannot be built from the settings.
    #[error("database pool: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    /// A statement failed.
    #[error("database statement failed: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The URL does not parse.
    #[error("invalid database URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What the parser said, scrubbed of the password.
        reason: String,
    },
}

/// Cancels due orders. The consumer and the sweeper depend on this trait, not
/// on PostgreSQL.
pub trait OrderStore: Send + Sync + 'static {
    /// Cancels every order in `ids` that is still unpaid, atomically per order;
    /// returns one disposition per input id, in input order. A repeated id is
    /// `Cancelled` at most once.
    fn cancel_unpaid(
        &self,
        ids: &[&str],
    ) -> impl Future<Output = Result<Vec<Disposition>, StoreError>> + Send;

    /// Cancels up to `limit` unpaid orders whose `pay_deadline` passed more than
    /// `grace` ago, atomically per order; returns their ids. The sweeper calls it
    /// until fewer than `limit` come back.
    fn sweep_overdue(
        &self,
        grace: Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Whether the database answers now (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// One disposition per id from what the statements returned. A repeated id is
/// `Cancelled` the first time only: the second delivery changed nothing.
fn dispositions(
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
