//! `order-expiry parked list|replay|purge`: what is in `P.parked`, re-driving
//! what can now be processed, and emptying it.
//!
//! Every message is read unacked on one channel, through a consumer
//! ([`Sweep`]); what is not acked (not selected, still malformed, listed)
//! goes back to the queue when that channel closes. A replayed message is
//! published afresh and confirmed before its parked copy is acked
//! ([`Republisher`]). So each command can be made again, and when its node
//! goes away it is, through another node (`Resume`); that attempt does not
//! end before the broker has given back what the lost channel held
//! (`Parked::given_back_by`).

use chrono::{DateTime, Utc};
use std::time::{Duration, Instant};

use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::QueuePurgeOptions;
use lapin::types::AMQPValue;

use super::admin::{Admin, OpsError, Resume};
use super::republish::Republisher;
use super::sweep::{Sweep, WINDOW};
use crate::amqp;
use crate::settings::Settings;
use crate::topology::Route;

/// One parked message, as `parked list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedMessage {
    /// `order_id` from the body, when the body has one.
    pub order_id: Option<String>,
    /// Its `x-parked-reason`.
    pub reason: Option<String>,
    /// When it was parked (`x-parked-at`, else its timestamp).
    pub parked_at: Option<DateTime<Utc>>,
    /// The first 120 characters of the body, lossy UTF-8, control characters
    /// escaped.
    pub excerpt: String,
}

/// Which parked messages `parked replay` re-drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaySelection {
    /// Every one.
    All,
    /// Those whose `x-parked-reason` contains this text.
    Reason(String),
    /// Those whose body's `order_id` is this.
    OrderId(String),
}

/// What `parked replay` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Sent to the due exchange: their due time had passed.
    pub to_due: usize,
    /// Sent through the ladder for the time left.
    pub to_ladder: usize,
    /// Selected, but still not a message the consumer can process: left
    /// parked with their reason (order id or excerpt, why).
    pub still_malformed: Vec<(String, String)>,
    /// Not selected: left parked.
    pub not_selected: usize,
}

/// The parked queue of `settings`, read over one admin connection.
pub struct Parked {
    admin: Admin,
    queue: String,
    settings: Settings,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("queue", &self.queue)
            .finish()
    }
}

impl Parked {
    /// Connects to the broker of `settings`.
    pub async fn open(settings: &Settings) -> Result<Self, OpsError> {
        let ladder = settings.ladder()?;
        let admin = Admin::open(settings, "order-expiry parked").await?;
        Ok(Self {
            admin,
            queue: ladder.parked_queue(),
            settings: settings.clone(),
        })
    }

    /// Messages in the queue now; an error when it does not exist.
    pub async fn depth(&mut self) -> Result<u32, OpsError> {
        let mut resume = Resume::connected_already("parked").through(&self.settings.amqp.url);
        loop {
            match self.depth_once().await {
                Ok(depth) => return Ok(depth),
                Err(error) => resume.after(error).await?,
            }
            if let Err(error) = self.admin.reopen().await {
                resume.after(error).await?;
            }
        }
    }

    async fn depth_once(&mut self) -> Result<u32, OpsError> {
        match self.admin.queue(&self.queue).await? {
            Some(state) => Ok(state.messages),
            None => Err(OpsError::Missing(self.queue.clone())),
        }
    }

    /// Up to `limit` messages, oldest first; they all stay parked.
    pub async fn list(&mut self, limit: u32) -> Result<Vec<ParkedMessage>, OpsError> {
        let mut resume = Resume::connected_already("parked list").through(&self.settings.amqp.url);
        let mut settle_by = None;
        loop {
            match self.list_once(limit, settle_by).await {
                Ok(listed) => return Ok(listed),
                Err(error) => {
                    settle_by = Some(self.given_back_by());
                    resume.after(error).await?;
                }
            }
            if let Err(error) = self.admin.reopen().await {
                resume.after(error).await?;
            }
        }
    }

    async fn list_once(
        &mut self,
        limit: u32,
        settle_by: Option<Instant>,
    ) -> Result<Vec<ParkedMessage>, OpsError> {
        self.depth_once().await?;
        let channel = self.admin.own_channel().await?;
        let window = u16::try_from(limit).unwrap_or(WINDOW).min(WINDOW);
        let mut sweep = Sweep::new(&mut self.admin, &channel, &self.queue, window, settle_by);
        let mut listed = Vec::new();
        let read = async {
            while listed.len() < usize::try_from(limit).unwrap_or(usize::MAX) {
                let Some(delivery) = sweep.next().await? else {
                    break;
                };
                listed.push(describe(&delivery));
                sweep.hold();
            }
            Ok::<_, OpsError>(())
        }
        .await;
        self.release(channel).await;
        read.map(|()| listed)
    }

    /// When the broker will have given back what a channel held, for an
    /// attempt after that channel's node was lost now: a quorum queue's
    /// `x-consumer-disconnected-timeout` after the node is seen gone
    /// (`topology.consumer_disconnected_timeout_ms`; 0 leaves RabbitMQ
    /// 4.3's default, 60 s), and 2 s for the cluster to see it. A node that
    /// hangs rather than dies is seen gone only after `net_ticktime`: what
    /// its channel held can come back after the attempt ended, still parked.
    fn given_back_by(&self) -> Instant {
        let timeout = match self.settings.topology.consumer_disconnected_timeout {
            Duration::ZERO => Duration::from_secs(60),
            set => set,
        };
        Instant::now() + timeout + Duration::from_secs(2)
    }

    /// Re-drives the `selection` (see the module docs). Every message is
    /// read until the queue has no more ready ones (not up to a count: the
    /// count a passive declare gives lags behind messages just returned).
    /// After a lost node, the next attempt reads again what the last one
    /// had not moved.
    pub async fn replay(&mut self, selection: &ReplaySelection) -> Result<ReplayReport, OpsError> {
        let mut resume =
            Resume::connected_already("parked replay").through(&self.settings.amqp.url);
        let mut report = ReplayReport::default();
        let mut settle_by = None;
        loop {
            match self.replay_once(selection, &mut report, settle_by).await {
                Ok(()) => return Ok(report),
                Err(error) => {
                    settle_by = Some(self.given_back_by());
                    resume.after(error).await?;
                }
            }
            if let Err(error) = self.admin.reopen().await {
                resume.after(error).await?;
            }
        }
    }

    async fn replay_once(
        &mut self,
        selection: &ReplaySelection,
        report: &mut ReplayReport,
        settle_by: Option<Instant>,
    ) -> Result<(), OpsError> {
        self.depth_once().await?;
        // What was left parked comes back to the queue and is seen again.
        report.still_malformed.clear();
        report.not_selected = 0;
        let republisher = Republisher {
            confirm: self.admin.confirm_channel().await?,
            ladder: self.settings.ladder()?,
            lead: self.settings.publisher.lead,
            bundle_lead: self.settings.publisher.bundle_lead(),
            max_body_bytes: self.settings.consumer.max_body_bytes,
            timeout: self.admin.timeout,
        };
        let channel = self.admin.own_channel().await?;
        let mut sweep = Sweep::new(&mut self.admin, &channel, &self.queue, WINDOW, settle_by);
        let result = replay_from(&mut sweep, &republisher, selection, report).await;
        let _ = amqp::bounded(
            "channel.close",
            self.admin.timeout,
            republisher.confirm.channel().close(200, "replayed".into()),
        )
        .await;
        self.release(channel).await;
        result
    }

    /// Deletes every parked message; how many there were.
    pub async fn purge(&mut self) -> Result<u32, OpsError> {
        let mut resume = Resume::connected_already("parked purge").through(&self.settings.amqp.url);
        loop {
            match self.purge_once().await {
                Ok(purged) => return Ok(purged),
                Err(error) => resume.after(error).await?,
            }
            if let Err(error) = self.admin.reopen().await {
                resume.after(error).await?;
            }
        }
    }

    async fn purge_once(&mut self) -> Result<u32, OpsError> {
        self.depth_once().await?;
        let channel = self.admin.channel().await?;
        let purging = channel.queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default());
        Ok(amqp::bounded(
            format!("purging {}", self.queue),
            self.admin.timeout,
            purging,
        )
        .await?)
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.admin.close().await;
    }

    /// Closes `channel`: what it read and did not ack goes back to the queue.
    async fn release(&self, channel: Channel) {
        let closing = channel.close(200, "released".into());
        let _ = amqp::bounded("channel.close", self.admin.timeout, closing).await;
    }
}

/// Moves the selected messages the sweep reads; holds the others.
async fn replay_from(
    sweep: &mut Sweep<'_>,
    republisher: &Republisher,
    selection: &ReplaySelection,
    report: &mut ReplayReport,
) -> Result<(), OpsError> {
    while let Some(delivery) = sweep.next().await? {
        let seen = describe(&delivery);
        let selected = match selection {
            ReplaySelection::All => true,
            ReplaySelection::Reason(text) => seen
                .reason
                .as_deref()
                .is_some_and(|r| r.contains(text.as_str())),
            ReplaySelection::OrderId(id) => body_order_ids(&delivery.data).contains(id),
        };
        if !selected {
            report.not_selected += 1;
            sweep.hold();
            continue;
        }
        match republisher.decode(&delivery) {
            Err(malformed) => {
                let who = seen.order_id.unwrap_or(seen.excerpt);
                report.still_malformed.push((who, malformed));
                sweep.hold();
            }
            Ok(messages) => {
                let route: Route = republisher.move_one(&delivery, &messages).await?;
                match route.exchange == republisher.ladder.due_exchange() {
                    true => report.to_due += 1,
                    false => report.to_ladder += 1,
                }
            }
        }
    }
    Ok(())
}

/// The `order_id`s a body names, read leniently (a parked body may break
/// any rule): a v1 message's, or each of a v2 bundle's orders.
fn body_order_ids(body: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let id = |v: &serde_json::Value| v.get("order_id")?.as_str().map(str::to_owned);
    match value.get("orders").and_then(|o| o.as_array()) {
        Some(orders) => orders.iter().filter_map(id).collect(),
        None => id(&value).into_iter().collect(),
    }
}

/// What `parked list` shows of a message.
fn describe(delivery: &Delivery) -> ParkedMessage {
    let properties = &delivery.properties;
    let reason =
        properties
            .headers()
            .as_ref()
            .and_then(|h| match h.inner().get("x-parked-reason") {
                Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                _ => None,
            });
    let ids = body_order_ids(&delivery.data);
    let order_id = match ids.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        [first, rest @ ..] => Some(format!("{first} (+{} more in its bundle)", rest.len())),
    };
    let text = String::from_utf8_lossy(&delivery.data);
    let excerpt: String = text
        .chars()
        .take(120)
        .flat_map(char::escape_debug)
        .collect();
    ParkedMessage {
        order_id,
        reason,
        parked_at: super::parked_at(properties),
        excerpt,
    }
}
