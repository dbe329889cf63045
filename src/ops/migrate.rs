//! `order-expiry ladder migrate`: moves every message in flight from an old
//! ladder (another prefix, and with it any number of levels) into the current
//! one, with the time left until its `due_at`.
//!
//! The old ladder keeps expiring messages while this runs: a message moves
//! down its levels and out into the old due queue. So each pass takes every
//! old holding queue, highest level first, and then the old due queue, and
//! the passes repeat until they all are empty twice in a row, a second apart
//! (a message being dead-lettered between two queues is briefly in neither).
//! Each message is published into the current ladder, confirmed, and only
//! then acked in the old one ([`Republisher`]): an interruption leaves a
//! duplicate, never a loss, and the consumer holds an early arrival until
//! `due_at`, so nothing is cancelled early. A body that is not a message is
//! copied to the current parked queue with its reason, then acked.
//!
//! The old and the current ladder must not share a prefix: with one prefix
//! they share exchange names, and `topology apply` with another level count
//! binds each shared exchange a second time for keys of another length.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation};

use super::admin::{Admin, OpsError};
use super::republish::{Republisher, ack};
use crate::amqp;
use crate::settings::Settings;
use crate::topology::Ladder;

/// What a migration did (or, dry, would find).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Messages found in each old queue at the start: (queue, messages;
    /// `None` when it does not exist).
    pub found: Vec<(String, Option<u32>)>,
    /// Moved into the current ladder.
    pub to_ladder: u64,
    /// Moved to the current due exchange: their due time had passed.
    pub to_due: u64,
    /// Not messages: copied to the current parked queue.
    pub parked: u64,
    /// Passes over the old queues.
    pub passes: u32,
    /// How long it took.
    pub elapsed: Duration,
}

impl MigrationReport {
    /// Messages found at the start, in the queues that exist.
    pub fn found_total(&self) -> u64 {
        self.found
            .iter()
            .map(|(_, n)| u64::from(n.unwrap_or(0)))
            .sum()
    }
}

/// A migration from `from` into the ladder of the settings it was opened with.
pub struct LadderMigration {
    admin: Admin,
    from: Ladder,
    settings: Settings,
}

impl std::fmt::Debug for LadderMigration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LadderMigration")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// Why a migration cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MigrationRefused {
    /// The old ladder is the current one.
    #[error("the old ladder is the current one ({0} levels under prefix {1}); give --from-prefix")]
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
    /// from the ladder `from_prefix` with `from_levels` levels.
    pub async fn open(
        settings: &Settings,
        from_prefix: &str,
        from_levels: u8,
    ) -> Result<Self, OpsError> {
        let to = settings.ladder()?;
        let from = Ladder::new(from_prefix, from_levels)?;
        if from.prefix() == to.prefix() {
            let refused = match from.levels() == to.levels() {
                true => MigrationRefused::Same(to.levels(), to.prefix().to_owned()),
                false => MigrationRefused::SharedPrefix {
                    prefix: to.prefix().to_owned(),
                    old: from.levels(),
                    new: to.levels(),
                },
            };
            return Err(OpsError::Refused(refused.to_string()));
        }
        let admin = Admin::open(settings, "order-expiry ladder migrate").await?;
        Ok(Self {
            admin,
            from,
            settings: settings.clone(),
        })
    }

    /// The old queues, highest level first, then the old due queue.
    fn sources(&self) -> Vec<String> {
        let mut queues: Vec<String> = (0..self.from.levels())
            .rev()
            .map(|l| self.from.level_name(l))
            .collect();
        queues.push(self.from.due_queue());
        queues
    }

    /// Messages in each old queue now (`None`: it does not exist).
    pub async fn count(&mut self) -> Result<Vec<(String, Option<u32>)>, OpsError> {
        let mut found = Vec::new();
        for queue in self.sources() {
            let messages = self.admin.queue(&queue).await?.map(|s| s.messages);
            found.push((queue, messages));
        }
        Ok(found)
    }

    /// Moves everything (see the module docs).
    pub async fn run(&mut self) -> Result<MigrationReport, OpsError> {
        let start = Instant::now();
        let mut report = MigrationReport {
            found: self.count().await?,
            ..MigrationReport::default()
        };
        let republisher = self.republisher().await?;
        let result = self.until_empty(&republisher, &mut report).await;
        let _ = amqp::bounded(
            "channel.close",
            self.admin.timeout,
            republisher.confirm.close(200, "migrated".into()),
        )
        .await;
        report.elapsed = start.elapsed();
        result.map(|()| report)
    }

    /// Deletes the old ladder: first its exchanges, so that nothing can enter
    /// its queues any more; then one more migration of what entered them
    /// meanwhile; then its queues, each once it is empty (quorum queues do
    /// not take `if-empty`). Its parked queue stays. Returns what was deleted
    /// and what that last migration moved.
    pub async fn delete_old(&mut self) -> Result<(Vec<String>, MigrationReport), OpsError> {
        let timeout = self.admin.timeout;
        let mut deleted = Vec::new();
        let mut exchanges: Vec<String> = (0..self.from.levels())
            .rev()
            .map(|l| self.from.level_name(l))
            .collect();
        exchanges.push(self.from.due_exchange());
        for exchange in exchanges {
            let channel = self.admin.channel().await?;
            let options = ExchangeDeleteOptions::default();
            let deleting = channel.exchange_delete(exchange.as_str().into(), options);
            amqp::bounded(format!("deleting exchange {exchange}"), timeout, deleting).await?;
            deleted.push(exchange);
        }
        let last = self.run().await?;
        for queue in self.sources() {
            match self.admin.queue(&queue).await? {
                None => continue,
                Some(state) if state.messages > 0 => {
                    return Err(OpsError::Refused(format!(
                        "{queue} is not empty ({} messages) after the old exchanges were deleted; run ladder migrate again",
                        state.messages
                    )));
                }
                Some(_) => {}
            }
            let channel = self.admin.channel().await?;
            let deleting =
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
            amqp::bounded(format!("deleting queue {queue}"), timeout, deleting).await?;
            deleted.push(queue);
        }
        Ok((deleted, last))
    }

    async fn republisher(&self) -> Result<Republisher, OpsError> {
        Ok(Republisher {
            confirm: self.admin.confirm_channel().await?,
            ladder: self.settings.ladder()?,
            lead: self.settings.publisher.lead,
            max_body_bytes: self.settings.consumer.max_body_bytes,
            timeout: self.admin.timeout,
        })
    }

    /// Passes over the old queues until two in a row, a second apart, find
    /// them all empty.
    async fn until_empty(
        &mut self,
        republisher: &Republisher,
        report: &mut MigrationReport,
    ) -> Result<(), OpsError> {
        let mut empty_passes = 0;
        while empty_passes < 2 {
            report.passes += 1;
            let mut moved = 0;
            for queue in self.sources() {
                moved += self.drain(&queue, republisher, report).await?;
            }
            let left: u64 = self
                .count()
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
        republisher: &Republisher,
        report: &mut MigrationReport,
    ) -> Result<u64, OpsError> {
        let Some(state) = self.admin.queue(queue).await? else {
            return Ok(0);
        };
        if state.messages == 0 {
            return Ok(0);
        }
        let channel = self.admin.own_channel().await?;
        let result = self.drain_on(&channel, queue, republisher, report).await;
        let _ = amqp::bounded(
            "channel.close",
            self.admin.timeout,
            channel.close(200, "drained".into()),
        )
        .await;
        result
    }

    async fn drain_on(
        &self,
        channel: &Channel,
        queue: &str,
        republisher: &Republisher,
        report: &mut MigrationReport,
    ) -> Result<u64, OpsError> {
        let due_exchange = republisher.ladder.due_exchange();
        let mut moved = 0;
        loop {
            let getting = channel.basic_get(queue.into(), BasicGetOptions { no_ack: false });
            let got =
                amqp::bounded(format!("basic.get {queue}"), self.admin.timeout, getting).await?;
            let Some(got) = got else { break };
            match republisher.decode(&got) {
                Ok(messages) => {
                    let route = republisher.move_one(&got, &messages).await?;
                    match route.exchange == due_exchange {
                        true => report.to_due += 1,
                        false => report.to_ladder += 1,
                    }
                }
                Err(malformed) => {
                    let reason = format!("ladder migrate from {queue}: {malformed}");
                    self.park(republisher, &got, &reason).await?;
                    ack(&got, self.admin.timeout).await?;
                    report.parked += 1;
                }
            }
            moved += 1;
        }
        Ok(moved)
    }

    /// A body that is not a message, to the current parked queue with `reason`.
    async fn park(
        &self,
        republisher: &Republisher,
        got: &lapin::message::BasicGetMessage,
        reason: &str,
    ) -> Result<(), OpsError> {
        let parked = republisher.ladder.parked_exchange();
        let mut headers = FieldTable::default();
        headers.insert(
            "x-parked-reason".into(),
            AMQPValue::LongString(reason.into()),
        );
        let now = chrono::Utc::now().to_rfc3339();
        headers.insert(
            "x-parked-at".into(),
            AMQPValue::LongString(now.as_str().into()),
        );
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(ct) = got.delivery.properties.content_type() {
            properties = properties.with_content_type(ct.clone());
        }
        let publishing = async {
            republisher
                .confirm
                .basic_publish(
                    parked.as_str().into(),
                    "".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &got.delivery.data,
                    properties,
                )
                .await?
                .await
        };
        match amqp::bounded("publisher confirm", self.admin.timeout, publishing).await? {
            Confirmation::Ack(None) => Ok(()),
            other => Err(OpsError::NotTaken {
                what: format!("a malformed message from the old ladder, to {parked}"),
                reason: format!("{other:?}"),
            }),
        }
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.admin.close().await;
    }
}
