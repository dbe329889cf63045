//! `order-expiry parked list|replay|purge`: what is in `P.parked`, re-driving
//! what can be processed now, and emptying it (only with `--yes`).

use anyhow::{Context, bail};
use chrono::SecondsFormat;
use clap::{ArgGroup, Args, Subcommand};
use order_expiry::{Settings, ops::Parked, ops::ReplaySelection};

/// `parked` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ParkedCommand {
    /// Each parked message: parked time, order id, reason, body excerpt.
    List {
        /// Show at most this many, oldest first.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Publish selected messages again: past their due time to the due
    /// exchange, otherwise through the ladder for the time left. A message
    /// that is still malformed stays parked with its reason.
    Replay(ReplayArgs),
    /// Delete every parked message.
    Purge {
        /// Required: the messages are gone for good.
        #[arg(long)]
        yes: bool,
    },
}

/// Which parked messages to replay: exactly one of the three.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["all", "reason", "order_id"])))]
pub(crate) struct ReplayArgs {
    /// Every parked message.
    #[arg(long)]
    all: bool,
    /// Those whose x-parked-reason contains TEXT.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Those of this order.
    #[arg(long, value_name = "ID")]
    order_id: Option<String>,
}

impl ReplayArgs {
    fn selection(&self) -> ReplaySelection {
        match (&self.reason, &self.order_id) {
            (Some(text), _) => ReplaySelection::Reason(text.clone()),
            (None, Some(id)) => ReplaySelection::OrderId(id.clone()),
            (None, None) => ReplaySelection::All,
        }
    }
}

pub(super) async fn run(command: ParkedCommand, settings: &Settings) -> anyhow::Result<()> {
    let mut parked = Parked::open(settings)
        .await
        .context("opening the parked queue")?;
    let result = match command {
        ParkedCommand::List { limit } => list(&mut parked, limit).await,
        ParkedCommand::Replay(args) => replay(&mut parked, &args.selection()).await,
        ParkedCommand::Purge { yes } => purge(&mut parked, yes).await,
    };
    parked.close().await;
    result
}

async fn list(parked: &mut Parked, limit: u32) -> anyhow::Result<()> {
    let messages = parked.list(limit).await?;
    let shown = u32::try_from(messages.len()).unwrap_or(u32::MAX);
    match shown < limit {
        true => println!("{shown} parked messages"),
        false => println!(
            "{} parked messages, the oldest {limit} shown",
            parked.depth().await?
        ),
    }
    for m in messages {
        let at = m.parked_at.map_or("-".to_owned(), |at| {
            at.to_rfc3339_opts(SecondsFormat::Secs, true)
        });
        println!(
            "{at}  order {}  reason: {}  body: {}",
            m.order_id.as_deref().unwrap_or("-"),
            m.reason.as_deref().unwrap_or("-"),
            m.excerpt
        );
    }
    Ok(())
}

async fn replay(parked: &mut Parked, selection: &ReplaySelection) -> anyhow::Result<()> {
    let report = parked.replay(selection).await?;
    println!(
        "replayed {}: {} to the due exchange (due time passed), {} through the ladder; {} still malformed and left parked; {} not selected",
        report.to_due + report.to_ladder,
        report.to_due,
        report.to_ladder,
        report.still_malformed.len(),
        report.not_selected
    );
    for (who, why) in &report.still_malformed {
        println!("left parked: {who}: {why}");
    }
    Ok(())
}

async fn purge(parked: &mut Parked, yes: bool) -> anyhow::Result<()> {
    if !yes {
        let depth = parked.depth().await?;
        bail!("purge deletes {depth} parked messages for good; add --yes to do it");
    }
    let purged = parked.purge().await?;
    println!("purged {purged} parked messages");
    Ok(())
}
