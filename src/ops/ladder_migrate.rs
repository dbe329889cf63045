//! `order-expiry ladder migrate`: moves every message in flight from an old
//! ladder (another prefix, and with it any number of levels, or another
//! broker: `--from-url`) into the current one, with the time left until its
//! `due_at`.
//!
//! The old ladder keeps expiring messages while this runs: a message moves
//! down its levels and out into the old due queue, and what no consumer takes
//! there within `topology.catch_up_after_ms` moves on to the old catch-up
//! queue. So each pass takes every old holding queue, highest level first,
//! then the old due queue, then its catch-up queue (and from another broker,
//! its parked queue), and the passes repeat until they all
//! are empty twice in a row, a second apart (a message being dead-lettered
//! between two queues is briefly in neither). Each queue is drained with a
//! consumer and a window of publisher confirms ([`QueueDrain`]); each message
//! is published into the current ladder, confirmed, and only then acked in
//! the old one: an interruption leaves a duplicate, never a loss, and the
//! consumer holds an early arrival until `due_at`, so nothing is cancelled
//! early. A body that is not a message is copied to the current parked queue
//! with its reason, then acked.
//!
//! On one broker the old and the current ladder must not share a prefix:
//! with one prefix they share exchange names, and `topology apply` with
//! another level count binds each shared exchange a second time for keys of
//! another length. On another broker they may: whether `--from-url` reaches
//! the same broker and vhost is asked of the brokers (a queue declared on one
//! and looked for on the other), never guessed from the URLs.

use std::time::{Duration, Instant};

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use secrecy::SecretString;

use super::admin::{Admin, OpsError, Resume};
use super::drain::{Carry, QueueDrain};
use super::republish::Republisher;
use crate::amqp;
use crate::settings::{Settings, redact_url};
use crate::topology::Ladder;

/// What a migration did (or, dry, would find).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LadderMigrationReport {
    /// Messages found in each old queue at the start: (queue, messages;
    /// `None` when it does not exist).
    pub found: Vec<(String, Option<u32>)>,
    /// Moved into the current ladder.
    pub to_ladder: u64,
    /// Moved to the current due exchange: their due time had passed.
    pub to_due: u64,
    /// Not messages: copied to the current parked queue.
    pub parked: u64,
    /// From another broker's parked queue into the current parked queue,
    /// headers kept.
    pub parked_moved: u64,
    /// Passes over the old queues.
    pub passes: u32,
    /// How long it took.
    pub elapsed: Duration,
}

impl LadderMigrationReport {
    /// Messages found at the start, in the queues that exist.
    pub fn found_total(&self) -> u64 {
        self.found
            .iter()
            .map(|(_, n)| u64::from(n.unwrap_or(0)))
            .sum()
    }

    /// Messages moved, whichever way.
    pub fn moved(&self) -> u64 {
        self.to_ladder + self.to_due + self.parked + self.parked_moved
    }

    /// Messages moved per second.
    pub fn rate(&self) -> f64 {
        self.moved() as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }
}

/// A migration from `from` into the ladder of the settings it was opened with.
pub struct LadderMigration {
    /// The current broker.
    target: Admin,
    /// The old ladder's broker: the current one again without `--from-url`.
    source: Admin,
    /// The old broker's URL, password redacted, when it is another one.
    from_url: Option<String>,
    from: Ladder,
    settings: Settings,
}

impl std::fmt::Debug for LadderMigration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LadderMigration")
            .field("from", &self.from)
            .field("from_url", &self.from_url)
            .finish_non_exhaustive()
    }
}

/// Why a migration cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LadderMigrationRefused {
    /// The old ladder is the current one.
    #[error(
        "the old ladder is the current one ({0} levels under prefix {1} on this broker and vhost); give --from-prefix, or --from-url for another broker"
    )]
    Same(u8, String),
    /// The same prefix with another number of levels.
    #[error(
        "the old ladder ({old} levels) and the current one ({new} levels) share prefix {prefix}, so they share exchanges: move to a new prefix instead (set topology.prefix and topology.levels, topology apply, then ladder migrate --from-prefix {prefix} --from-levels {old})"
    )]
    SharedPrefix {
        /// The prefix.
        prefix: String,
        /// Old levels.
        old: u8,
        /// Current levels.
        new: u8,
    },
}

impl LadderMigration {
    /// Connects to the broker of `settings` (the current ladder) to migrate
    /// from the ladder `from_prefix` with `from_levels` levels on the same
    /// broker.
    pub async fn open(
        settings: &Settings,
        from_prefix: &str,
        from_levels: u8,
    ) -> Result<Self, OpsError> {
        Self::open_from(settings, None, from_prefix, from_levels).await
    }

    /// As [`LadderMigration::open`], the old ladder on the broker at
    /// `from_url` when given (a blue-green broker upgrade: the old broker's
    /// parked queue moves too). The same prefix is refused only when
    /// `from_url` reaches this broker and vhost.
    pub async fn open_from(
        settings: &Settings,
        from_url: Option<&SecretString>,
        from_prefix: &str,
        from_levels: u8,
    ) -> Result<Self, OpsError> {
        let to = settings.ladder()?;
        let from = Ladder::new(from_prefix, from_levels)?;
        let name = "order-expiry ladder migrate";
        let target = Admin::open(settings, name).await?;
        let mut old = settings.clone();
        if let Some(url) = from_url {
            old.amqp.url = url.clone();
        }
        let source = match Admin::open(&old, &format!("{name} (old ladder)")).await {
            Ok(source) => source,
            Err(error) => {
                target.close().await;
                return Err(error);
            }
        };
        let mut migration = Self {
            target,
            source,
            from_url: from_url.map(redact_url),
            from,
            settings: settings.clone(),
        };
        if migration.from.prefix() == to.prefix() {
            let refused = match migration.same_broker().await {
                Ok(false) => None,
                Ok(true) if migration.from.levels() == to.levels() => Some(
                    LadderMigrationRefused::Same(to.levels(), to.prefix().to_owned()),
                ),
                Ok(true) => Some(LadderMigrationRefused::SharedPrefix {
                    prefix: to.prefix().to_owned(),
                    old: migration.from.levels(),
                    new: to.levels(),
                }),
                Err(error) => {
                    migration.close().await;
                    return Err(error);
                }
            };
            if let Some(refused) = refused {
                migration.close().await;
                return Err(OpsError::Refused(refused.to_string()));
            }
        }
        Ok(migration)
    }

    /// Whether the old ladder's connection reaches the current broker and
    /// vhost: always without `--from-url`, else asked of the brokers.
    async fn same_broker(&mut self) -> Result<bool, OpsError> {
        match self.from_url {
            None => Ok(true),
            Some(_) => self.target.reached_by(&mut self.source).await,
        }
    }

    /// The old broker, password redacted, when it is another one.
    pub fn from_url(&self) -> Option<&str> {
        self.from_url.as_deref()
    }

    /// The old queues, highest level first, then the old due queue and its
    /// catch-up queue (a ladder nobody consumes moves everything due there
    /// after `catch_up_after_ms`; one declared before it had none, and a
    /// missing queue is skipped), then (from another broker) the old parked
    /// queue.
    fn sources(&self) -> Vec<(String, Carry)> {
        let mut queues: Vec<(String, Carry)> = (0..self.from.levels())
            .rev()
            .map(|l| (self.from.level_name(l), Carry::Orders))
            .collect();
        queues.push((self.from.due_queue(), Carry::Orders));
        queues.push((self.from.catch_up_queue(), Carry::Orders));
        if self.from_url.is_some() {
            queues.push((self.from.parked_queue(), Carry::Parked));
        }
        queues
    }

    /// Messages in each old queue now (`None`: it does not exist).
    pub async fn count(&mut self) -> Result<Vec<(String, Option<u32>)>, OpsError> {
        let mut resume =
            Resume::connected_already("ladder migrate --dry-run").through(&self.settings.amqp.url);
        loop {
            match self.count_once().await {
                Ok(found) => return Ok(found),
                Err(error) => resume.after(error).await?,
            }
            if let Err(error) = self.reopen().await {
                resume.after(error).await?;
            }
        }
    }

    async fn count_once(&mut self) -> Result<Vec<(String, Option<u32>)>, OpsError> {
        let mut found = Vec::new();
        for (queue, _) in self.sources() {
            let messages = self.source.queue(&queue).await?.map(|s| s.messages);
            found.push((queue, messages));
        }
        Ok(found)
    }

    /// Moves everything (see the module docs). When a node it talks to goes
    /// away, it reconnects through another node of `amqp.url` and goes on,
    /// for up to a minute after the loss.
    pub async fn run(&mut self) -> Result<LadderMigrationReport, OpsError> {
        let start = Instant::now();
        let mut report = LadderMigrationReport::default();
        let mut resume =
            Resume::connected_already("ladder migrate").through(&self.settings.amqp.url);
        let mut lost = false;
        loop {
            match self.attempt(lost, &mut report).await {
                Ok(()) => break,
                Err(error) => resume.after(error).await?,
            }
            lost = true;
        }
        report.elapsed = start.elapsed();
        Ok(report)
    }

    /// One attempt at [`Self::run`], on new connections after a loss.
    async fn attempt(
        &mut self,
        lost: bool,
        report: &mut LadderMigrationReport,
    ) -> Result<(), OpsError> {
        if lost {
            self.reopen().await?;
        }
        if report.found.is_empty() {
            report.found = self.count_once().await?;
        }
        let republisher = self.republisher().await?;
        let result = self.until_empty(&republisher, report).await;
        let _ = amqp::bounded(
            "channel.close",
            self.target.timeout,
            republisher.confirm.channel().close(200, "migrated".into()),
        )
        .await;
        result
    }

    /// Deletes the old ladder: first its exchanges, so that nothing can enter
    /// its queues any more; then one more migration of what entered them
    /// meanwhile; then its queues, each once it is empty (quorum queues do
    /// not take `if-empty`), and last the catch-up exchange (deleted before
    /// the due queue, it would drop what that queue dead-letters). Its parked
    /// queue stays. Returns what was deleted and what that last migration
    /// moved.
    /// Each step can be done again, so a lost node is resumed as in
    /// [`Self::run`].
    pub async fn delete_old(&mut self) -> Result<(Vec<String>, LadderMigrationReport), OpsError> {
        let mut resume = Resume::connected_already("ladder migrate --delete-old")
            .through(&self.settings.amqp.url);
        let mut lost = false;
        loop {
            match self.delete_old_once(lost).await {
                Ok(done) => return Ok(done),
                Err(error) => resume.after(error).await?,
            }
            lost = true;
        }
    }

    async fn delete_old_once(
        &mut self,
        lost: bool,
    ) -> Result<(Vec<String>, LadderMigrationReport), OpsError> {
        if lost {
            self.reopen().await?;
        }
        let timeout = self.source.timeout;
        let mut deleted = Vec::new();
        let mut exchanges: Vec<String> = (0..self.from.levels())
            .rev()
            .map(|l| self.from.level_name(l))
            .collect();
        exchanges.push(self.from.due_exchange());
        for exchange in exchanges {
            let channel = self.source.channel().await?;
            let options = ExchangeDeleteOptions::default();
            let deleting = channel.exchange_delete(exchange.as_str().into(), options);
            amqp::bounded(format!("deleting exchange {exchange}"), timeout, deleting).await?;
            deleted.push(exchange);
        }
        let last = self.run().await?;
        for (queue, carry) in self.sources() {
            if carry == Carry::Parked {
                continue;
            }
            match self.source.queue(&queue).await? {
                None => continue,
                Some(state) if state.messages > 0 => {
                    return Err(OpsError::Refused(format!(
                        "{queue} is not empty ({} messages) after the old exchanges were deleted; run ladder migrate again",
                        state.messages
                    )));
                }
                Some(_) => {}
            }
            let channel = self.source.channel().await?;
            let deleting =
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
            amqp::bounded(format!("deleting queue {queue}"), timeout, deleting).await?;
            deleted.push(queue);
        }
        let exchange = self.from.catch_up_exchange();
        let channel = self.source.channel().await?;
        let options = ExchangeDeleteOptions::default();
        let deleting = channel.exchange_delete(exchange.as_str().into(), options);
        amqp::bounded(format!("deleting exchange {exchange}"), timeout, deleting).await?;
        deleted.push(exchange);
        Ok((deleted, last))
    }

    /// New connections to both brokers, after a node was lost.
    async fn reopen(&mut self) -> Result<(), OpsError> {
        self.target.reopen().await?;
        self.source.reopen().await
    }

    async fn republisher(&self) -> Result<Republisher, OpsError> {
        Ok(Republisher {
            confirm: self.target.confirm_channel().await?,
            ladder: self.settings.ladder()?,
            lead: self.settings.publisher.lead,
            bundle_lead: self.settings.publisher.bundle_lead(),
            max_body_bytes: self.settings.consumer.max_body_bytes,
            timeout: self.target.timeout,
        })
    }

    /// Passes over the old queues until two in a row, a second apart, find
    /// them all empty.
    async fn until_empty(
        &mut self,
        republisher: &Republisher,
        report: &mut LadderMigrationReport,
    ) -> Result<(), OpsError> {
        let mut empty_passes = 0;
        while empty_passes < 2 {
            report.passes += 1;
            let mut moved = 0;
            for (queue, carry) in self.sources() {
                moved += self.drain(&queue, carry, republisher, report).await?;
            }
            let left: u64 = self
                .count_once()
                .await?
                .iter()
                .map(|(_, n)| u64::from(n.unwrap_or(0)))
                .sum();
            if moved == 0 && left == 0 {
                empty_passes += 1;
                if empty_passes < 2 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            } else {
                empty_passes = 0;
            }
        }
        Ok(())
    }

    /// Moves what `queue` holds now; how many.
    async fn drain(
        &mut self,
        queue: &str,
        carry: Carry,
        republisher: &Republisher,
        report: &mut LadderMigrationReport,
    ) -> Result<u64, OpsError> {
        let Some(state) = self.source.queue(queue).await? else {
            return Ok(0);
        };
        if state.messages == 0 {
            return Ok(0);
        }
        let drain = QueueDrain {
            channel: self.source.own_channel().await?,
            republisher,
        };
        let result = drain.run(queue, state.messages, carry, report).await;
        let closing = drain.channel.close(200, "drained".into());
        let _ = amqp::bounded("channel.close", self.source.timeout, closing).await;
        result
    }

    /// Closes the connections.
    pub async fn close(self) {
        self.source.close().await;
        self.target.close().await;
    }
}
