//! The soak's order services, payer and poison producer, and the ledger of
//! everything they did: the history the checker judges the database by.
//!
//! - The sql world's order service places `rate` orders a second, due in
//!   3-40 s: half through the library (`schedule`, retried every 200 ms until
//!   confirmed, as a real order service does), half through the outbox (the
//!   order and its outbox row in one transaction), and one in a hundred not
//!   scheduled at all (a crash between commit and publish: the sweeper's job).
//!   Every 1-2.5 minutes a burst of 300-800 orders due within 500 ms, paid
//!   and extended like the rest: their bundles settle each order its own way.
//! - The http world's order service places a quarter of that, through the
//!   library; the gateway answers `paid` for one in ten, `pending` then
//!   `unpaid` for another one in ten.
//! - The payer pays one in five, one in twenty close to its deadline (the last
//!   300 ms); one in twelve is extended by 5-15 s shortly before it is due (and
//!   scheduled again for the new deadline).
//! - Every 30-90 s a poison message (a body that is not a message) goes to the
//!   sql world's due queue; the consumer must park it, once.
//!
//! Every random choice comes from the seed: the same seed places the same
//! orders with the same deadlines (their times follow the machine's pace).

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use order_expiry::Scheduler;
use order_expiry::service::PgOrderStore;
use order_expiry_testkit::{Placed, Reply, cluster, wire_due};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::world::{SoakWorld, VHOST, Which};

/// How an order reached (or did not reach) the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// `Scheduler::schedule`.
    Library,
    /// An outbox row in the order's transaction, relayed by `serve`.
    Outbox,
    /// Never scheduled: only the sweeper can cancel it.
    Unscheduled,
}

/// What the http world's payment gateway answers for an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gateway {
    /// Not asked (the sql world), or `unpaid`: cancel.
    Unpaid,
    /// `paid`: the order must be left alone.
    Paid,
    /// `pending`, then `unpaid` on the next step (1 s later).
    PendingThenUnpaid,
}

/// One order, as its order service saw it: what the testkit's ledger keeps
/// of every placed order (its id, its deadline now, after an extension;
/// whether its message or outbox row for it was confirmed or committed;
/// whether the payer's `UPDATE ... WHERE status = 'unpaid'` hit), and the
/// soak's own facts about it.
#[derive(Debug, Clone)]
pub(super) struct Order {
    pub(super) placed: Placed,
    pub(super) which: Which,
    pub(super) route: Route,
    pub(super) burst: bool,
    pub(super) created: DateTime<Utc>,
    /// The deadline before an extension.
    pub(super) extended_from: Option<DateTime<Utc>>,
    pub(super) gateway: Gateway,
}

impl Order {
    /// An order about to be placed: created now, not scheduled, unpaid, not
    /// in a burst, the gateway answering `unpaid`.
    fn new(id: String, which: Which, route: Route, due_at: DateTime<Utc>) -> Self {
        Self {
            placed: Placed {
                id,
                due_at,
                scheduled: false,
                paid: false,
            },
            which,
            route,
            burst: false,
            created: Utc::now(),
            extended_from: None,
            gateway: Gateway::Unpaid,
        }
    }
}

impl Deref for Order {
    type Target = Placed;

    fn deref(&self) -> &Placed {
        &self.placed
    }
}

/// Everything the order services did: every order, every `schedule` call.
pub(super) type Ledger = order_expiry_testkit::Ledger<Order>;

/// What the poison producer sent.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Poison {
    /// Poison messages confirmed into the sql world's due queue.
    pub(super) confirmed: u64,
    /// Publishes that went out and got no confirm (a node cut off or gone
    /// before it answered): each may have reached the queue all the same, so
    /// the attempt that followed may have sent a second copy.
    pub(super) unsure: u64,
}

impl Poison {
    /// What `queue` should hold at the end: in the sql world's parked queue,
    /// every confirmed poison message and perhaps a copy of each unsure
    /// publish; nothing anywhere else.
    pub(super) fn expected(&self, parked: &str, queue: &str) -> std::ops::RangeInclusive<u64> {
        match queue == parked {
            true => self.confirmed..=self.confirmed + self.unsure,
            false => 0..=0,
        }
    }
}

/// The order services' shared parts.
#[derive(Debug)]
pub(super) struct Traffic {
    world: Arc<SoakWorld>,
    sql_scheduler: Scheduler,
    /// The sql world's library calls while the old ladder is open.
    old_ladder_scheduler: Scheduler,
    http_scheduler: Scheduler,
    ledger: Mutex<Ledger>,
    poison: Mutex<Poison>,
}

impl Traffic {
    pub(super) fn new(world: Arc<SoakWorld>) -> anyhow::Result<Arc<Self>> {
        let scheduler = |mut settings: order_expiry::Settings| {
            settings.amqp.timeout = Duration::from_secs(5);
            Scheduler::from_settings(&settings)
        };
        Ok(Arc::new(Self {
            sql_scheduler: scheduler(world.settings(Which::Sql, 3))?,
            old_ladder_scheduler: scheduler(world.old_ladder_settings(3))?,
            http_scheduler: scheduler(world.settings(Which::Http, 3))?,
            world,
            ledger: Mutex::new(Ledger::default()),
            poison: Mutex::new(Poison::default()),
        }))
    }

    /// Runs the order services, the bursts and the poison producer until
    /// `stop`; then waits for every order's task (its payment, extension and
    /// retries) and returns the ledger and the poison sent. Unscheduled orders stop at
    /// `unscheduled_until`, so the sweeper's grace passes before the soak checks.
    pub(super) async fn run(
        self: Arc<Self>,
        seed: u64,
        rate: f64,
        unscheduled_until: tokio::time::Instant,
        stop: CancellationToken,
    ) -> (Ledger, Poison) {
        let mut tasks = JoinSet::new();
        tasks.spawn(Arc::clone(&self).place(
            seed,
            Which::Sql,
            rate,
            unscheduled_until,
            stop.clone(),
        ));
        tasks.spawn(Arc::clone(&self).place(
            seed ^ 0x6874,
            Which::Http,
            rate / 4.0,
            unscheduled_until,
            stop.clone(),
        ));
        tasks.spawn(Arc::clone(&self).bursts(seed ^ 0x6275, stop.clone()));
        tasks.spawn(Arc::clone(&self).poison(seed ^ 0x706f, stop.clone()));
        while tasks.join_next().await.is_some() {}
        let ledger = std::mem::take(&mut *self.ledger.lock().await);
        (ledger, *self.poison.lock().await)
    }

    /// One world's order service: an order every `1/rate` s until `stop`,
    /// each in its own task; waits for them all.
    async fn place(
        self: Arc<Self>,
        seed: u64,
        which: Which,
        rate: f64,
        unscheduled_until: tokio::time::Instant,
        stop: CancellationToken,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut orders = JoinSet::new();
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0u64;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            n += 1;
            let delay_ms = rng.random_range(3_000..40_000);
            let due_at = wire_due(Utc::now() + TimeDelta::milliseconds(delay_ms));
            let route = match which {
                Which::Sql if n % 100 == 99 && tokio::time::Instant::now() < unscheduled_until => {
                    Route::Unscheduled
                }
                Which::Sql if n.is_multiple_of(2) => Route::Outbox,
                _ => Route::Library,
            };
            let pay_after = payment(&mut rng, delay_ms);
            let extend_by = rng
                .random_bool(1.0 / 12.0)
                .then(|| Duration::from_millis(rng.random_range(5_000..15_000)));
            let id = format!("{}-{n}", if which == Which::Sql { "s" } else { "h" });
            let mut order = Order::new(id, which, route, due_at);
            order.gateway = match (which, rng.random_range(0..10)) {
                (Which::Http, 0) => Gateway::Paid,
                (Which::Http, 1) => Gateway::PendingThenUnpaid,
                _ => Gateway::Unpaid,
            };
            // An extension schedules a message: an unscheduled order keeps
            // none (seed 2's first 30-minute run extended 11, and the
            // checker found them cancelled by the ladder).
            let extend_by = extend_by.filter(|_| route != Route::Unscheduled);
            orders.spawn(Arc::clone(&self).order(order, pay_after, extend_by));
        }
        while orders.join_next().await.is_some() {}
    }

    /// A flash sale every 1-2.5 minutes: 300-800 orders due within 500 ms
    /// (0.6-1.6 a millisecond: `publisher.bundle_span_ms`, 10 ms, bundles them
    /// by 6-16), 20 s ahead, half through the library, half through the outbox; paid (one in
    /// five, some in the last 300 ms) and extended (one in twenty) like the
    /// rest, so that one bundle carries orders to cancel, paid and extended.
    async fn bursts(self: Arc<Self>, seed: u64, stop: CancellationToken) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut orders = JoinSet::new();
        let mut b = 0u64;
        loop {
            let gap = Duration::from_secs(rng.random_range(60..150));
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(gap) => {}
            }
            b += 1;
            let count = rng.random_range(300..800);
            let now = Utc::now();
            let base = now + TimeDelta::seconds(20);
            for i in 0..count {
                let due_at =
                    wire_due(base + TimeDelta::milliseconds(i64::from(i) * 500 / i64::from(count)));
                let pay_after = payment(&mut rng, (due_at - now).num_milliseconds());
                let extend_by = rng
                    .random_bool(1.0 / 20.0)
                    .then(|| Duration::from_millis(rng.random_range(5_000..15_000)));
                let route = [Route::Library, Route::Outbox][(i % 2) as usize];
                let order = Order {
                    burst: true,
                    ..Order::new(format!("b{b}-{i}"), Which::Sql, route, due_at)
                };
                orders.spawn(Arc::clone(&self).order(order, pay_after, extend_by));
            }
        }
        while orders.join_next().await.is_some() {}
    }

    /// One order's life: created, scheduled, perhaps paid `pay_after` its
    /// creation or extended by `extend_by` 1.5 s before due; then into the
    /// ledger.
    async fn order(
        self: Arc<Self>,
        mut order: Order,
        pay_after: Option<Duration>,
        extend_by: Option<Duration>,
    ) {
        let world = &self.world;
        let store = match order.which {
            Which::Sql => &world.sql.store,
            Which::Http => &world.http.store,
        };
        if order.gateway != Gateway::Unpaid {
            let replies = match order.gateway {
                Gateway::Paid => vec![Reply::Payment("paid")],
                _ => vec![Reply::Payment("pending"), Reply::Payment("unpaid")],
            };
            world.endpoint.script("payment", &order.id, replies);
        }
        let (id, due_at) = (order.id.clone(), order.due_at);
        let give_up = due_at + TimeDelta::seconds(60);
        order.placed.scheduled = match order.route {
            Route::Outbox => {
                self.create_with_outbox_row(store, &id, due_at, give_up)
                    .await
            }
            Route::Library | Route::Unscheduled => {
                let created_row = retry(give_up, || store.create_unpaid(&id, due_at));
                created_row.await.is_some()
                    && order.route == Route::Library
                    && self.schedule(&order, due_at).await
            }
        };
        if let Some(after) = pay_after {
            sleep_until(order.created + TimeDelta::from_std(after).unwrap_or_default()).await;
            let paying = retry(due_at + TimeDelta::seconds(5), || store.pay(&id));
            order.placed.paid = paying.await.unwrap_or(false);
        } else if let Some(by) = extend_by {
            sleep_until(due_at - TimeDelta::milliseconds(1500)).await;
            let later = due_at + TimeDelta::from_std(by).unwrap_or_default();
            if extend(store, &id, later).await {
                order.extended_from = Some(due_at);
                order.placed.due_at = later;
                order.placed.scheduled = self.schedule(&order, later).await;
            }
        }
        self.ledger.lock().await.orders.push(order);
    }

    /// The order and its outbox row in one transaction, retried until it
    /// commits or `give_up`.
    async fn create_with_outbox_row(
        &self,
        store: &PgOrderStore,
        id: &str,
        due_at: DateTime<Utc>,
        give_up: DateTime<Utc>,
    ) -> bool {
        retry(give_up, || async {
            let mut client = store.client().await?;
            let tx = client.transaction().await?;
            let insert = "INSERT INTO orders (id, pay_deadline) VALUES ($1, $2) \
                          ON CONFLICT (id) DO NOTHING";
            tx.execute(insert, &[&id, &due_at]).await?;
            self.sql_scheduler.schedule_in_tx(&tx, id, due_at).await?;
            tx.commit().await?;
            Ok::<_, anyhow::Error>(())
        })
        .await
        .is_some()
    }

    /// `schedule`, retried every 200 ms until confirmed or a minute past
    /// `due_at`; each try of the sql world's into the old ladder while it
    /// is open.
    async fn schedule(&self, order: &Order, due_at: DateTime<Utc>) -> bool {
        while Utc::now() < due_at + TimeDelta::seconds(60) {
            let old = match order.which {
                Which::Sql => self.world.old_ladder.enter(),
                Which::Http => None,
            };
            let scheduler = match (order.which, &old) {
                (Which::Sql, Some(_)) => &self.old_ladder_scheduler,
                (Which::Sql, None) => &self.sql_scheduler,
                (Which::Http, _) => &self.http_scheduler,
            };
            let started = std::time::Instant::now();
            let scheduled = scheduler.schedule(order.id.as_str(), due_at).await;
            drop(old);
            self.ledger.lock().await.call(started, &scheduled);
            if scheduled.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// A poison message into the sql world's due queue every 30-90 s, each
    /// confirmed (retried on another node when one is down).
    async fn poison(self: Arc<Self>, seed: u64, stop: CancellationToken) {
        let mut rng = StdRng::seed_from_u64(seed);
        let due_queue = self.world.sql.ladder().due_queue();
        let mut n = 0;
        loop {
            let gap = Duration::from_secs(rng.random_range(30..90));
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(gap) => {}
            }
            n += 1;
            let body = format!("poison {n}: this is not an expiry message");
            let mut unsure = 0;
            for attempt in 0..30 {
                match publish_confirmed(attempt % 3 + 1, &due_queue, body.as_bytes()).await {
                    Published::Confirmed => {
                        self.poison.lock().await.confirmed += 1;
                        break;
                    }
                    Published::Unsure => unsure += 1,
                    Published::NotSent => {}
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            self.poison.lock().await.unsure += unsure;
        }
    }
}

/// One in five paid: one in four of those in the last 300 ms before the
/// deadline, the rest at a random time before it.
fn payment(rng: &mut StdRng, delay_ms: i64) -> Option<Duration> {
    if !rng.random_bool(0.2) {
        return None;
    }
    let at_ms = if rng.random_bool(0.25) {
        delay_ms - rng.random_range(0..300)
    } else {
        rng.random_range(500..(delay_ms - 1_000).max(501))
    };
    Some(Duration::from_millis(
        u64::try_from(at_ms.max(0)).unwrap_or(0),
    ))
}

/// Moves the deadline of `id` to `later` if it is still unpaid.
async fn extend(store: &PgOrderStore, id: &str, later: DateTime<Utc>) -> bool {
    retry(later, || async {
        let update = "UPDATE orders SET pay_deadline = $2 WHERE id = $1 AND status = 'unpaid'";
        let updated = store
            .client()
            .await?
            .execute(update, &[&id, &later])
            .await?;
        Ok::<_, anyhow::Error>(updated == 1)
    })
    .await
    .unwrap_or(false)
}

/// How one confirmed publish ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Published {
    /// The broker confirmed it.
    Confirmed,
    /// It never left (no connection, no channel) or the broker refused it.
    NotSent,
    /// It was sent and no confirm came: it may be in the queue or not.
    Unsure,
}

/// Publishes `body` to `queue` through node `n` with a confirm, within 10 s.
async fn publish_confirmed(n: usize, queue: &str, body: &[u8]) -> Published {
    let sent = AtomicBool::new(false);
    let attempt = async {
        let url = cluster::node_url(n, VHOST);
        let connection = Connection::connect(&url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        sent.store(true, Ordering::SeqCst);
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?
            .await?;
        let _ = connection.close(200, "published".into()).await;
        Ok::<_, lapin::Error>(confirm.is_ack())
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Ok(true)) => Published::Confirmed,
        Ok(Ok(false)) => Published::NotSent,
        _ if sent.load(Ordering::SeqCst) => Published::Unsure,
        _ => Published::NotSent,
    }
}

/// Runs `op` every 200 ms until it succeeds (its value) or `give_up` passes
/// (`None`).
async fn retry<F, Fut, T, E>(give_up: DateTime<Utc>, op: F) -> Option<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    loop {
        if let Ok(Ok(value)) = tokio::time::timeout(Duration::from_secs(10), op()).await {
            return Some(value);
        }
        if Utc::now() > give_up {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn sleep_until(at: DateTime<Utc>) {
    if let Ok(wait) = (at - Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
}
