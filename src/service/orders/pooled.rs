//! [`PooledClient`]: one connection of the store's pool, lent out for SQL the
//! store does not cover, without the pool's types in the crate's API.

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
