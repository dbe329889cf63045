//! `order-expiry topology apply|export`.

use std::io::Write;

use clap::Subcommand;
use order_expiry::{
    Settings, settings::ActionKind, topology::KeptQueue, topology::Topology,
    topology::definitions_json,
};

/// `topology` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum TopologyCommand {
    /// Declare every exchange, queue and binding on the broker (idempotent).
    Apply,
    /// Print RabbitMQ definitions JSON for the current settings: the topology in
    /// its own vhost and the least-privilege publisher and consumer users.
    Export {
        /// Virtual host the definitions name [default: topology.vhost, "order-expiry"].
        #[arg(long)]
        vhost: Option<String>,
    },
}

pub(super) async fn run(command: TopologyCommand, settings: &Settings) -> anyhow::Result<()> {
    match command {
        TopologyCommand::Apply => {
            let (topology, kept) =
                Topology::declare_keeping(settings, "order-expiry topology").await?;
            eprintln!("declared {topology}");
            for k in &kept {
                eprintln!(
                    "warning: {}: {}\n  broker: {}",
                    k.name,
                    KeptQueue::ADVICE,
                    k.reason
                );
            }
        }
        TopologyCommand::Export { vhost } => {
            let vhost = vhost.unwrap_or_else(|| settings.topology.vhost.clone());
            let event_exchange = (settings.action.kind == ActionKind::Amqp)
                .then_some(settings.action.amqp.exchange.as_str());
            let text = definitions_json(
                &settings.ladder()?,
                &settings.topology,
                &vhost,
                event_exchange,
            );
            std::io::stdout().write_all(text.as_bytes())?;
        }
    }
    Ok(())
}
