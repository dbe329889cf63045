//! The store's pool in the crate's API without its types: [`PooledClient`],
//! one connection lent out for SQL the store does not cover, and
//! [`PoolError`], why there was none.

use std::ops::{Deref, DerefMut};

/// A connection of [`super::PgOrderStore`]'s pool, for SQL the store does not
/// cover (the demo's counts, `status`, the tests' own queries). It derefs to a
/// [`tokio_postgres::Client`] and goes back to the pool when dropped.
pub struct PooledClient(deadpool_postgres::Client);

impl PooledClient {
    pub(super) fn new(client: deadpool_postgres::Client) -> Self {
        Self(client)
    }
}

impl Deref for PooledClient {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self.0
    }
}

impl DerefMut for PooledClient {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Client {
        &mut self.0
    }
}

impl std::fmt::Debug for PooledClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledClient").finish_non_exhaustive()
    }
}

/// The pool gave no connection (the database is down, or every connection was
/// busy for longer than `database.acquire_timeout_ms`), or could not be built
/// from the settings. The pool's own error is inside, and is what prints.
#[derive(Debug)]
pub struct PoolError(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<deadpool_postgres::PoolError> for super::StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Pool(PoolError(Box::new(error)))
    }
}

impl From<deadpool_postgres::BuildError> for super::StoreError {
    fn from(error: deadpool_postgres::BuildError) -> Self {
        Self::Build(PoolError(Box::new(error)))
    }
}
