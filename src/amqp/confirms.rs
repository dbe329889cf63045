//! Publisher confirms on one channel, each publish told its own `basic.return`.
//!
//! lapin hands the oldest waiting `basic.return` to whichever confirm it
//! resolves next, and resolves the tags of a multiple-ack in hash-map order.
//! RabbitMQ only promises that a message's return comes before its own ack,
//! so with several publishes in flight one publish's return can ride on
//! another's confirm: a message the broker dropped would be told
//! "confirmed", and one a queue took "unroutable" (reproduced by
//! `tests/integration/returns.rs`). Here every publish on the channel goes
//! through one task that owns every confirm; it matches returns to publishes
//! by what a return carries (`message_id`, exchange, routing key), and
//! judges a confirm only once every confirm that could carry its return has
//! been read.
//!
//! When can a confirm be judged? A message's return arrives before its ack,
//! so lapin pops it from its queue of waiting returns no later than while it
//! handles the ack frame that resolves the message's confirm (RabbitMQ sends
//! a batch's returns before its acks, and its acks in ascending order, so the
//! waiting queue is empty after each batch). lapin resolves the confirms of
//! one ack frame under one lock. So once a confirm is seen resolved, taking
//! that lock (the barrier) waits out the frame, and every confirm that could
//! carry the return is then resolved too: reading all of them after the
//! barrier finds the return wherever it rode. Confirms read after the barrier
//! may belong to a newer frame, so they are judged after the next barrier.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, poll_fn};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, ChannelState, Confirmation, ErrorKind, PublisherConfirm};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::{BrokerError, bounded};

/// The broker's answer to one mandatory publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Confirmed {
    /// A queue took it.
    Taken,
    /// No queue took it: the broker returned it.
    Returned { reply_code: u16, reply_text: String },
    /// The broker refused it.
    Nacked,
}

/// A confirm-mode channel whose publishes go through its confirm task.
/// Clones share the channel and the task; the task ends once every clone is
/// gone and every publish answered.
#[derive(Clone)]
pub(crate) struct Confirms {
    channel: Channel,
    requests: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Confirms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confirms")
            .field("channel", &self.channel.id())
            .finish_non_exhaustive()
    }
}

impl Confirms {
    /// Puts `channel` in confirm mode (bounded by `timeout`) and publishes on
    /// it through a task of its own, spawned on the current tokio runtime.
    pub(crate) async fn select(channel: Channel, timeout: Duration) -> Result<Self, BrokerError> {
        let selecting = channel.confirm_select(ConfirmSelectOptions::default());
        bounded("confirm.select", timeout, selecting).await?;
        Ok(Self::spawn(channel))
    }

    fn spawn(channel: Channel) -> Self {
        let (requests, incoming) = mpsc::unbounded_channel();
        let task = ConfirmTask {
            channel: channel.clone(),
            incoming,
            open: true,
            sending: Vec::new(),
            confirming: Vec::new(),
            resolved: Vec::new(),
            returns: HashMap::new(),
        };
        tokio::spawn(task.run());
        Self { channel, requests }
    }

    /// The channel (to close it, or to see whether it is open).
    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `body` `mandatory` to `exchange` with `routing_key`. The
    /// publish is on its way when this returns; the future is its answer
    /// (unbounded: the caller bounds it).
    pub(crate) fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: Vec<u8>,
        properties: BasicProperties,
    ) -> Confirming {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            key: Key {
                message_id: properties.message_id().as_ref().map(|id| id.to_string()),
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
            },
            body,
            properties,
            reply,
        };
        // A send fails only when the task ended (its runtime shut down): the
        // dropped reply answers the publish as a closed channel.
        let _ = self.requests.send(request);
        Confirming(answer)
    }
}

/// The answer to one publish.
#[derive(Debug)]
pub(crate) struct Confirming(oneshot::Receiver<lapin::Result<Confirmed>>);

impl Future for Confirming {
    type Output = lapin::Result<Confirmed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| {
                let gone =
                    ErrorKind::InvalidChannelState(ChannelState::Closed, "publisher confirm");
                Err(gone.into())
            })
        })
    }
}

/// What a return says of the publish it belongs to. Two publishes alike in
/// all three share their fate (a route takes both or neither).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    message_id: Option<String>,
    exchange: String,
    routing_key: String,
}

impl Key {
    fn of_return(returned: &BasicReturnMessage) -> Self {
        let delivery = &returned.delivery;
        Self {
            message_id: delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string()),
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
        }
    }
}

struct Request {
    key: Key,
    body: Vec<u8>,
    properties: BasicProperties,
    reply: oneshot::Sender<lapin::Result<Confirmed>>,
}

/// Who waits for a publish's answer, and what its return would say.
struct Entry {
    key: Key,
    reply: oneshot::Sender<lapin::Result<Confirmed>>,
}

/// A confirm lapin resolved: ack or nack (its attached return, whoever it
/// belongs to, is in the task's `returns` by then), or the channel's error.
type Resolved = lapin::Result<bool>;

/// The task that owns every confirm of one channel.
struct ConfirmTask {
    channel: Channel,
    incoming: mpsc::UnboundedReceiver<Request>,
    /// Whether a `Confirms` may still send requests.
    open: bool,
    /// Publishes whose frames are being written.
    sending: Vec<(Entry, BoxFuture<'static, lapin::Result<PublisherConfirm>>)>,
    /// Publishes waiting for the broker's confirm.
    confirming: Vec<(Entry, PublisherConfirm)>,
    /// Confirms resolved and read, not yet judged.
    resolved: Vec<(Entry, Resolved)>,
    /// Returns read and not yet matched to their publish.
    returns: HashMap<Key, VecDeque<(u16, String)>>,
}

impl ConfirmTask {
    async fn run(mut self) {
        loop {
            // Until a confirm resolves (or nothing is left to do).
            poll_fn(|cx| {
                self.advance(cx);
                if self.resolved.is_empty() && !self.finished() {
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
            .await;
            if self.finished() && self.resolved.is_empty() {
                return;
            }
            // Rounds: what was read before a barrier is judged after it, with
            // every confirm read that resolved before it.
            while !self.resolved.is_empty() {
                let ready = std::mem::take(&mut self.resolved);
                self.barrier();
                poll_fn(|cx| {
                    self.advance(cx);
                    Poll::Ready(())
                })
                .await;
                for (entry, resolved) in ready {
                    let answer = self.judge(&entry.key, resolved);
                    let _ = entry.reply.send(answer);
                }
            }
        }
    }

    /// Nothing more can come: every `Confirms` is gone and every publish
    /// was read.
    fn finished(&self) -> bool {
        !self.open && self.sending.is_empty() && self.confirming.is_empty()
    }

    /// Starts every request, moves every sent publish to its confirm, and
    /// reads every resolved confirm (its return into `returns`). Registers
    /// `cx` with everything still pending.
    fn advance(&mut self, cx: &mut Context<'_>) {
        while self.open {
            match self.incoming.poll_recv(cx) {
                Poll::Ready(Some(request)) => self.start(request),
                Poll::Ready(None) => self.open = false,
                Poll::Pending => break,
            }
        }
        let mut i = 0;
        while i < self.sending.len() {
            match self.sending[i].1.poll_unpin(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(sent) => {
                    let (entry, _) = self.sending.swap_remove(i);
                    match sent {
                        Ok(confirm) => self.confirming.push((entry, confirm)),
                        Err(error) => {
                            let _ = entry.reply.send(Err(error));
                        }
                    }
                }
            }
        }
        let mut i = 0;
        while i < self.confirming.len() {
            match self.confirming[i].1.poll_unpin(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(confirmation) => {
                    let (entry, _) = self.confirming.swap_remove(i);
                    let resolved = self.read(confirmation);
                    self.resolved.push((entry, resolved));
                }
            }
        }
    }

    /// Starts publishing `request`.
    fn start(&mut self, request: Request) {
        let Request {
            key,
            body,
            properties,
            reply,
        } = request;
        let channel = self.channel.clone();
        let (exchange, routing_key) = (key.exchange.clone(), key.routing_key.clone());
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let sending = async move {
            channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    options,
                    &body,
                    properties,
                )
                .await
        };
        // `advance` polls it next: the first poll gives it its delivery tag
        // and queues its frames.
        self.sending.push((Entry { key, reply }, sending.boxed()));
    }

    /// Keeps the return a resolved confirm carries (whoever it belongs to).
    fn read(&mut self, confirmation: lapin::Result<Confirmation>) -> Resolved {
        let (acked, returned) = match confirmation? {
            Confirmation::Ack(returned) => (true, returned),
            Confirmation::Nack(returned) => (false, returned),
            // Every channel here is in confirm mode: a refusal if not.
            Confirmation::NotRequested => (false, None),
        };
        if let Some(returned) = returned {
            self.keep(&returned);
        }
        Ok(acked)
    }

    fn keep(&mut self, returned: &BasicReturnMessage) {
        let why = (returned.reply_code, returned.reply_text.to_string());
        self.returns
            .entry(Key::of_return(returned))
            .or_default()
            .push_back(why);
    }

    /// Waits until lapin has finished the ack frame it may be handling:
    /// `wait_for_confirms` takes the lock lapin resolves a frame's confirms
    /// under. Polled once, never awaited: it only waits for that lock. The
    /// returns it hands back (of confirms lapin saw dropped) are kept too.
    fn barrier(&mut self) {
        if let Some(Ok(returned)) = self.channel.wait_for_confirms().now_or_never() {
            for r in &returned {
                self.keep(r);
            }
        }
    }

    /// The answer for a publish that is `key`, whose confirm resolved as
    /// `resolved`: every return that could be its own has been read.
    fn judge(&mut self, key: &Key, resolved: Resolved) -> lapin::Result<Confirmed> {
        let acked = resolved?;
        let own = self.returns.get_mut(key).and_then(VecDeque::pop_front);
        if self.returns.get(key).is_some_and(VecDeque::is_empty) {
            self.returns.remove(key);
        }
        Ok(match (own, acked) {
            (Some((reply_code, reply_text)), _) => Confirmed::Returned {
                reply_code,
                reply_text,
            },
            (None, true) => Confirmed::Taken,
            (None, false) => Confirmed::Nacked,
        })
    }
}

impl Drop for ConfirmTask {
    fn drop(&mut self) {
        // A return that matched no publish: its publish failed with the
        // channel after the return came, or (the mistake this task exists to
        // rule out) was judged before its return was read.
        for (key, returns) in &self.returns {
            warn!(
                ?key,
                count = returns.len(),
                "a returned message matched no publish"
            );
        }
    }
}
