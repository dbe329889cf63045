//! `order-expiry ladder migrate`: move every message in flight from an old
//! ladder (another prefix, any number of levels) into the current one, with
//! the time left until each message's `due_at`.

use anyhow::Context;
use clap::{Args, Subcommand};
use order_expiry::{Settings, ops::LadderMigration, ops::MigrationReport};

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
    /// Prefix of the old ladder (the current one is topology.prefix).
    #[arg(long)]
    from_prefix: String,
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
    let mut migration = LadderMigration::open(settings, &args.from_prefix, from_levels)
        .await
        .context("ladder migrate")?;
    let result = migrate(&mut migration, &args, from_levels, settings).await;
    migration.close().await;
    result
}

async fn migrate(
    migration: &mut LadderMigration,
    args: &MigrateArgs,
    from_levels: u8,
    settings: &Settings,
) -> anyhow::Result<()> {
    let old = format!("{} ({from_levels} levels)", args.from_prefix);
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
        "moved {} messages from {old} into {new} in {:.1} s ({} passes): {} through the ladder, {} to the due exchange (due time passed), {} not messages (copied to the parked queue); {} found at the start",
        moved(&report),
        report.elapsed.as_secs_f64(),
        report.passes,
        report.to_ladder,
        report.to_due,
        report.parked,
        report.found_total()
    );
    if args.delete_old {
        let (deleted, last) = migration.delete_old().await?;
        println!(
            "deleted the old ladder's {} exchanges and queues ({} more messages moved first); {}.parked stays",
            deleted.len(),
            moved(&last),
            args.from_prefix
        );
    }
    Ok(())
}

fn moved(report: &MigrationReport) -> u64 {
    report.to_ladder + report.to_due + report.parked
}
