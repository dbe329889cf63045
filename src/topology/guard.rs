//! The change `topology apply` refuses: another `topology.levels` under a
//! prefix that already has a ladder.
//!
//! Level `L`'s binding patterns count the routing key's words from its start,
//! so they depend on the number of levels. Applied in place, a new level count
//! binds each existing level exchange a second time for keys of the other
//! length, and a key then matches both a hold and a pass binding somewhere:
//! copies of messages, some of them early. The way to change the count is a new
//! prefix and `ladder migrate`.
//!
//! The broker does not say how a ladder was bound, but its level exchanges say
//! how many levels it has: [`Topology::describe`](super::Topology::describe)
//! lists them highest first, so even an apply interrupted midway made level
//! `levels - 1` before level 0. A ladder whose level 0 exists and whose top
//! level does not, or one with a level above the top, has another count.
//!
//! Each look is a passive declare, and the broker answers "absent" by closing
//! the channel with 404, which lapin logs at ERROR. That answer is expected
//! here, so the exchanges being looked for are listed in [`is_probe_miss`],
//! and the service's log filter drops lapin's line for exactly those.

use std::sync::Mutex;
use std::time::Duration;

use lapin::Connection;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::FieldTable;

use super::ladder::{Ladder, MAX_LEVELS};
use crate::amqp::{self, BrokerError};

/// The number of levels of the ladder the broker has under `ladder`'s prefix:
/// `None` when it has none, else the count from level 0 up to the first level
/// exchange missing. Two looks when it matches `ladder`, up to 30 otherwise.
pub(super) async fn levels_on_broker(
    connection: &Connection,
    ladder: &Ladder,
    timeout: Duration,
) -> Result<Option<u8>, BrokerError> {
    let top = ladder.levels() - 1;
    let exists = |level| exchange_exists(connection, ladder.level_name(level), timeout);
    if !exists(0).await? {
        return Ok(None);
    }
    if exists(top).await? && (top == MAX_LEVELS - 1 || !exists(top + 1).await?) {
        return Ok(Some(ladder.levels()));
    }
    for level in 1..MAX_LEVELS {
        if !exists(level).await? {
            return Ok(Some(level));
        }
    }
    Ok(Some(MAX_LEVELS))
}

/// The exchanges a look is waiting on now.
static PROBING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether `log_text` (a lapin "Channel closed" event's fields) is the broker's
/// 404 for an exchange a look is waiting on: the answer "absent", not a fault.
#[cfg_attr(not(feature = "service"), allow(dead_code))]
pub(crate) fn is_probe_miss(log_text: &str) -> bool {
    let probing = PROBING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    probing.iter().any(|name| {
        log_text.contains("NOT_FOUND") && log_text.contains(&format!("no exchange '{name}'"))
    })
}

/// One exchange listed in [`PROBING`] while its look lasts.
struct Probing(String);

impl Probing {
    fn start(name: &str) -> Self {
        let mut probing = PROBING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        probing.push(name.to_owned());
        Self(name.to_owned())
    }
}

impl Drop for Probing {
    fn drop(&mut self) {
        let mut probing = PROBING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = probing.iter().position(|name| *name == self.0) {
            probing.swap_remove(at);
        }
    }
}

/// A passive declare, on a channel of its own (a 404 closes the channel).
async fn exchange_exists(
    connection: &Connection,
    name: String,
    timeout: Duration,
) -> Result<bool, BrokerError> {
    let _probing = Probing::start(&name);
    let channel = amqp::bounded("channel.open", timeout, connection.create_channel()).await?;
    let options = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let declaring = channel.exchange_declare(
        name.as_str().into(),
        lapin::ExchangeKind::Topic,
        options,
        FieldTable::default(),
    );
    match amqp::bounded(format!("looking for exchange {name}"), timeout, declaring).await {
        Ok(()) => {
            let _ = amqp::bounded("channel.close", timeout, channel.close(200, "".into())).await;
            Ok(true)
        }
        Err(BrokerError::Failed { source, .. }) if amqp::is_not_found(&source) => Ok(false),
        Err(other) => Err(other),
    }
}
