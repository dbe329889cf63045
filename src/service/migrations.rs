//! The default schema, kept once as SQL files in `migrations/`: the orders
//! table, then the outbox, then the outbox's trace columns. `order-expiry migrate` runs them in order, in one
//! transaction ([`super::PgOrderStore::migrate`]), and the postgres service of
//! `docker-compose.yml` runs the same files on an empty data directory
//! (mounted into `/docker-entrypoint-initdb.d`). Every statement is idempotent.

/// The files of `migrations/`, in the order they run (their names' order, as
/// the postgres image runs them).
const MIGRATIONS: [(&str, &str); 3] = [
    (
        "0001_orders.sql",
        include_str!("../../migrations/0001_orders.sql"),
    ),
    (
        "0002_outbox.sql",
        include_str!("../../migrations/0002_outbox.sql"),
    ),
    (
        "0003_outbox_trace.sql",
        include_str!("../../migrations/0003_outbox_trace.sql"),
    ),
];

/// Everything `migrate` runs, as one batch.
pub(crate) fn migration_sql() -> String {
    MIGRATIONS.map(|(_, sql)| sql).join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file added to `migrations/` runs in compose: `migrate` must run it too.
    #[test]
    fn migrate_runs_every_file_of_migrations_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, MIGRATIONS.map(|(name, _)| name.to_owned()));
    }
}
