//! `order-expiry ladder migrate`: move every message in flight from an old
//! ladder (another prefix, any number of levels, or another broker) into the
//! current one, with the time left until each message's `due_at`.

use anyhow::Context;
use clap::{Args, Subcommand};
use order_expiry::{Settings, ops::LadderMigration};
use secrecy::SecretString;

/// `ladder` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum LadderCommand {
    /// Move every message from an old ladder into the current one (its
    /// topology applied first), safe while both are in use.
    Migrate(MigrateArgs),
}

/// `ladder migrate` arguments.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Prefix of the old ladder (the current one is topology.prefix; with
    /// --from-url the default is the current one).
    #[arg(long, required_unless_present = "from_url")]
    from_prefix: Option<String>,
    /// The old ladder's broker, when it is another one (a blue-green broker
    /// upgrade): amqp[s]://user:password@host:port/vhost; its parked queue
    /// moves too. Its password is never printed; the variable keeps it out
    /// of the process list.
    #[arg(long, env = "ORDER_EXPIRY_MIGRATE_FROM_URL", hide_env_values = true)]
    from_url: Option<String>,
    /// Levels of the old ladder (default: topology.levels).
    #[arg(long)]
    from_levels: Option<u8>,
    /// Only count the messages in the old ladder.
    #[arg(long)]
    dry_run: bool,
    /// Then delete the old ladder's holding queues and due queue (each only if
    /// empty) and their exchanges; its parked queue stays.
    #[arg(long, conflicts_with = "dry_run")]
    delete_old: bool,
}

pub(super) async fn run(command: LadderCommand, settings: &Settings) -> anyhow::Result<()> {
    let LadderCommand::Migrate(args) = command;
    let from_levels = args.from_levels.unwrap_or(settings.topology.levels);
    let from_prefix = args
        .from_prefix
        .clone()
        .unwrap_or_else(|| settings.topology.prefix.clone());
    let from_url = args.from_url.clone().map(SecretString::from);
    let mut migration =
        LadderMigration::open_from(settings, from_url.as_ref(), &from_prefix, from_levels)
            .await
            .context("ladder migrate")?;
    let old = match migration.from_url() {
        Some(url) => format!("{from_prefix} ({from_levels} levels) on {url}"),
        None => format!("{from_prefix} ({from_levels} levels)"),
    };
    let result = migrate(&mut migration, &args, &old, settings).await;
    migration.close().await;
    result
}

async fn migrate(
    migration: &mut LadderMigration,
    args: &MigrateArgs,
    old: &str,
    settings: &Settings,
) -> anyhow::Result<()> {
    let new = format!(
        "{} ({} levels)",
        settings.topology.prefix, settings.topology.levels
    );
    if args.dry_run {
        let found = migration.count().await?;
        let total: u64 = found.iter().map(|(_, n)| u64::from(n.unwrap_or(0))).sum();
        println!("old ladder {old}: {total} messages");
        for (queue, messages) in &found {
            match messages {
                None => println!("  {queue}  missing"),
                Some(0) => {}
                Some(n) => println!("  {queue}  {n}"),
            }
        }
        println!("dry run: nothing moved");
        return Ok(());
    }
    let report = migration.run().await?;
    println!(
        "moved {} messages from {old} into {new} in {:.1} s ({:.0} messages/s, {} passes): {} through the ladder, {} to the due exchange (due time passed), {} not messages (copied to the parked queue), {} parked messages (to the parked queue); {} found at the start",
        report.moved(),
        report.elapsed.as_secs_f64(),
        report.rate(),
        report.passes,
        report.to_ladder,
        report.to_due,
        report.parked,
        report.parked_moved,
        report.found_total()
    );
    if args.delete_old {
        let (deleted, last) = migration.delete_old().await?;
        println!(
            "deleted the old ladder's {} exchanges and queues ({} more messages moved first); its parked queue stays",
            deleted.len(),
            last.moved(),
        );
    }
    Ok(())
}
