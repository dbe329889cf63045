//! The soak's world on the local three-node cluster: two isolated worlds (each
//! its own topology prefix and PostgreSQL schema) in the soak's vhost, and the
//! processes that serve them.
//!
//! - **sql**: the SQL action, two `serve` (connected to node 1 and node 2
//!   first), the outbox relay on, the sweeper on with a grace longer than every
//!   fault's bound (so a sweep is a finding, not a repair). Its orders live on
//!   the primary and synchronous standby of `scripts/lib/pg-pair.sh`, which
//!   the failover faults promote and switch back; the `serve` reach them
//!   through a [`Proxy`] each, both in a multi-host URL
//!   (`target_session_attrs=read-write`), which the database-route fault
//!   blackholes together.
//!   Its sweep statement marks what it cancels (`cancelled_by = 'sweeper'`),
//!   so the checker tells the ladder's cancels from the sweeper's. Beside its
//!   ladder, an [`OldLadder`] that nothing consumes, for the `ladder migrate`
//!   fault.
//! - **http**: the HTTP action and the payment check, one `serve` (node 3
//!   first), against an [`Endpoint`] that is the order service (its expire
//!   cancels in the world's orders table) and the payment gateway.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use order_expiry::Settings;
use order_expiry_testkit::pg_pair::{self, PairLock, Replication};
use order_expiry_testkit::{Child, Endpoint, Launch, Proxy, World, cluster, try_poll, try_run_cli};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Mutex;

/// The vhost the soak's worlds live in, made on the cluster when missing.
pub(super) const VHOST: &str = "order-expiry-soak";

/// Ladder levels: delays up to 63 s.
const LEVELS: u8 = 6;

/// The sweeper's grace in the sql world: longer than the largest bound of
/// [`super::faults::Kind::bound`] (a hung node, 90 s), so that the sweeper
/// cancels only what the ladder failed to deliver within its bound, and every
/// sweep the checker cannot explain is a violation.
pub(super) const SWEEP_GRACE: Duration = Duration::from_secs(120);

/// The default sweep statement, marking what it cancels.
const SWEEP_SQL: &str = "UPDATE orders SET status = 'cancelled', cancelled_at = now(), \
     cancelled_by = 'sweeper' WHERE id IN (SELECT id FROM orders WHERE status = 'unpaid' \
     AND pay_deadline < now() - make_interval(secs => $1) ORDER BY pay_deadline LIMIT $2 \
     FOR UPDATE SKIP LOCKED) AND status = 'unpaid' RETURNING id";

/// Which world a process or an order belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    /// The SQL action, library and outbox, sweeper on.
    Sql,
    /// The HTTP action with the payment check.
    Http,
}

/// The `serve` processes the soak keeps running: each one's name, its world
/// and the node its URL list names first.
pub(super) const SERVES: [(&str, Which, usize); 3] = [
    ("serve-sql-1", Which::Sql, 1),
    ("serve-sql-2", Which::Sql, 2),
    ("serve-http-3", Which::Http, 3),
];

/// One of [`SERVES`]: the running process (none while a fault has killed
/// it), how often it was started, where its `/metrics` and `/readyz` answer.
#[derive(Debug, Default)]
struct Slot {
    child: Option<Child>,
    starts: u32,
    port: u16,
}

/// The worlds, the proxy, the endpoint and the `serve` processes.
#[derive(Debug)]
pub(super) struct SoakWorld {
    pub(super) sql: World,
    pub(super) http: World,
    /// The http world's order service and payment gateway.
    pub(super) endpoint: Endpoint,
    /// The sql world's `serve` processes reach each node of the PostgreSQL
    /// pair through one of these.
    db_proxies: [Proxy; 2],
    /// The sql world's old ladder, for the `ladder migrate` fault.
    pub(super) old_ladder: OldLadder,
    /// Held by whatever takes a node down, so that at most one is down.
    pub(super) nodes: Mutex<()>,
    /// Node 2 of the PostgreSQL pair is the primary and node 1 is down (a
    /// failover happened and no switchback yet).
    pub(super) failed_over: AtomicBool,
    binary: PathBuf,
    logs: PathBuf,
    slots: Mutex<Vec<Slot>>,
    /// The PostgreSQL pair is the soak's until it ends.
    _pair: PairLock,
}

impl SoakWorld {
    /// Makes the vhost, both worlds (topology declared through the URL list),
    /// the proxy and the endpoint, and starts the three `serve`.
    pub(super) async fn start(
        base: &Settings,
        binary: PathBuf,
        logs: PathBuf,
    ) -> anyhow::Result<Self> {
        ensure_vhost().await?;
        let pair = pg_pair::lock().await;
        pg_pair::up(Replication::Sync).await;
        let mut on_pair = base.clone();
        on_pair.database.url = SecretString::from(pg_pair::url());
        let sql = world(&on_pair, "soak-sql").await?;
        let http = world(base, "soak-http").await?;
        sql.store
            .client()
            .await?
            .batch_execute("ALTER TABLE orders ADD COLUMN cancelled_by text")
            .await
            .context("adding orders.cancelled_by")?;
        let old_ladder = OldLadder::new(format!("{}-old", sql.settings.topology.prefix));
        let mut old = sql.settings.clone();
        old.topology.prefix.clone_from(&old_ladder.prefix);
        sql.declare(&old).await.context("the old ladder")?;
        let db_proxies = [
            Proxy::start(SocketAddr::from(([127, 0, 0, 1], pg_pair::PORTS[0]))).await,
            Proxy::start(SocketAddr::from(([127, 0, 0, 1], pg_pair::PORTS[1]))).await,
        ];
        let endpoint = Endpoint::order_service(std::sync::Arc::clone(&http.store)).await;
        std::fs::create_dir_all(&logs).context("the log directory")?;
        let world = Self {
            sql,
            http,
            endpoint,
            db_proxies,
            old_ladder,
            binary,
            logs,
            nodes: Mutex::new(()),
            failed_over: AtomicBool::new(false),
            slots: Mutex::new(SERVES.map(|_| Slot::default()).into()),
            _pair: pair,
        };
        for i in 0..SERVES.len() {
            world.start_serve(i).await?;
        }
        Ok(world)
    }

    /// The sql world's multi-host URL with each host through its proxy: its
    /// `serve` find the writable one themselves.
    fn database_url_via_proxies(&self) -> String {
        let [a, b] = self.db_proxies.each_ref().map(Proxy::addr);
        let [p, q] = pg_pair::PORTS;
        let direct = format!("127.0.0.1:{p},127.0.0.1:{q}");
        let url = self.sql.settings.database.url.expose_secret();
        assert!(
            url.contains(&direct),
            "the sql world is not on the pair: {url}"
        );
        url.replace(&direct, &format!("{a},{b}"))
    }

    /// Both routes to the sql world's database blackholed.
    pub(super) fn blackhole_database(&self) {
        self.db_proxies.iter().for_each(Proxy::blackhole);
    }

    /// Both routes to the sql world's database forward again.
    pub(super) fn restore_database(&self) {
        self.db_proxies.iter().for_each(Proxy::restore);
    }

    /// The settings of `which`'s world with the URL list (node `first` first).
    pub(super) fn settings(&self, which: Which, first: usize) -> Settings {
        let mut settings = match which {
            Which::Sql => self.sql.settings.clone(),
            Which::Http => self.http.settings.clone(),
        };
        settings.amqp.url = SecretString::from(cluster::url_list(first, VHOST));
        settings
    }

    /// The settings of the sql world's old ladder (node `first` first).
    pub(super) fn old_ladder_settings(&self, first: usize) -> Settings {
        let mut settings = self.settings(Which::Sql, first);
        settings.topology.prefix.clone_from(&self.old_ladder.prefix);
        settings
    }

    /// Starts slot `i`'s `serve` (again); waits until `/readyz` says 200 or
    /// 30 s passed (a serve started during a fault may not be ready yet).
    pub(super) async fn start_serve(&self, i: usize) -> anyhow::Result<()> {
        let (name, which, first) = SERVES[i];
        let mut slots = self.slots.lock().await;
        let slot = &mut slots[i];
        slot.starts += 1;
        let log = self.logs.join(format!("{name}-{}.log", slot.starts));
        let mut settings = self.settings(which, first);
        let port = order_expiry_testkit::free_port();
        slot.port = port;
        settings.http.listen = format!("127.0.0.1:{port}");
        let mut launch = Launch::new(&self.binary, log)
            .args(["serve"])
            .env("ORDER_EXPIRY__AMQP__RECONNECT_MAX_MS", "1000")
            .env("ORDER_EXPIRY__LOG__FORMAT", "json")
            .env("ORDER_EXPIRY__LOG__FILTER", "info");
        match which {
            Which::Sql => {
                settings.database.url = SecretString::from(self.database_url_via_proxies());
                settings.sweeper.enabled = true;
                settings.sweeper.grace = SWEEP_GRACE;
                launch = launch
                    .settings(&settings)
                    .env("ORDER_EXPIRY__SWEEPER__SWEEP_SQL", SWEEP_SQL)
                    .env("ORDER_EXPIRY__OUTBOX__ENABLED", "true");
            }
            Which::Http => {
                settings.sweeper.enabled = false;
                let base = self.endpoint.base_url();
                launch = launch
                    .settings(&settings)
                    .env("ORDER_EXPIRY__ACTION__KIND", "http")
                    .env("ORDER_EXPIRY__ACTION__HTTP__BASE_URL", &base)
                    .env("ORDER_EXPIRY__ACTION__HTTP__TIMEOUT_MS", "2000")
                    .env("ORDER_EXPIRY__ACTION__CHECK__ENABLED", "true")
                    .env("ORDER_EXPIRY__ACTION__CHECK__BASE_URL", &base)
                    .env("ORDER_EXPIRY__ACTION__CHECK__TIMEOUT_MS", "2000")
                    // Within what the soak's 6-level ladder holds (63 s).
                    .env(
                        "ORDER_EXPIRY__ACTION__CHECK__STEPS_MS",
                        "1000,3000,5000,30000",
                    )
                    .env("ORDER_EXPIRY__OUTBOX__ENABLED", "false");
            }
        }
        let child = launch.spawn().context("starting order-expiry serve")?;
        slot.child = Some(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        drop(slots);
        // Not ready within 30 s is no error (a fault may be on); exiting is.
        let ready = try_poll(
            Duration::from_secs(30),
            Duration::from_millis(200),
            async || {
                if let Some((200, _)) = order_expiry_testkit::http_get(addr, "/readyz").await {
                    return Ok(Ok(()));
                }
                if !self.serve_running(i).await {
                    let slots = self.slots.lock().await;
                    let tail = slots[i].child.as_ref().map(|c| c.log_tail(5));
                    let tail = tail.unwrap_or_default();
                    return Ok(Err(anyhow!("{name} exited at start-up: {tail}")));
                }
                Err(())
            },
        );
        ready.await.unwrap_or(Ok(()))
    }

    /// kill -9 of slot `i`'s `serve`.
    pub(super) async fn kill_serve(&self, i: usize) {
        if let Some(child) = self.slots.lock().await[i].child.take() {
            child.signal("-KILL");
            // Dropping it reaps it.
            drop(child);
        }
    }

    /// Whether slot `i`'s `serve` runs.
    pub(super) async fn serve_running(&self, i: usize) -> bool {
        let mut slots = self.slots.lock().await;
        slots[i].child.as_mut().is_some_and(Child::running)
    }

    /// The running `serve` processes: slot name, pid, and where `/metrics`
    /// answers.
    pub(super) async fn running_serves(&self) -> Vec<(String, u32, SocketAddr)> {
        let mut slots = self.slots.lock().await;
        let running = slots.iter_mut().zip(SERVES).filter_map(|(s, (name, ..))| {
            let child = s.child.as_mut()?;
            let pid = child.running().then(|| child.pid())?;
            Some((
                name.to_owned(),
                pid,
                SocketAddr::from(([127, 0, 0, 1], s.port)),
            ))
        });
        running.collect()
    }

    /// Slots whose `serve` exited on its own (not killed by a fault): a finding.
    pub(super) async fn exited(&self) -> Vec<String> {
        let mut slots = self.slots.lock().await;
        let exited = slots.iter_mut().zip(SERVES).filter_map(|(s, (name, ..))| {
            let exited = s.child.as_mut().is_some_and(|c| !c.running());
            exited.then(|| name.to_owned())
        });
        exited.collect()
    }

    /// `order-expiry ARGS` with `which`'s settings (node `first` first); its
    /// output, or why it failed, within `limit`.
    pub(super) async fn cli(
        &self,
        which: Which,
        first: usize,
        args: &[&str],
        limit: Duration,
    ) -> anyhow::Result<String> {
        let settings = self.settings(which, first);
        let out = try_run_cli(&self.binary, &settings, args, &[], limit).await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("order-expiry {args:?} exited {}: {text}", out.status);
        }
        Ok(text)
    }

    /// Stops every `serve` (SIGTERM; a clean exit within 30 s expected) and
    /// removes both worlds. Logs stay in the report directory.
    pub(super) async fn finish(self) -> Vec<String> {
        let mut problems = Vec::new();
        let slots = std::mem::take(&mut *self.slots.lock().await);
        for (slot, (name, ..)) in slots.into_iter().zip(SERVES) {
            if let Some(mut child) = slot.child {
                let log = child.log_path().to_owned();
                let stopped = match child.running() {
                    true => child.stop_keeping_log(Duration::from_secs(30)).await,
                    false => Err(anyhow::anyhow!("it had exited: {}", child.log_tail(3))),
                };
                if let Err(e) = stopped {
                    problems.push(format!("{name}: {e} ({})", log.display()));
                }
            }
        }
        self.sql.cleanup().await;
        self.http.cleanup().await;
        problems
    }

    /// Where the logs go.
    pub(super) fn logs(&self) -> &Path {
        &self.logs
    }
}

/// The sql world's old ladder: another prefix in the soak's vhost that no
/// `serve` consumes, as after a prefix change, and the switch that sends the
/// order service's library calls there (a publisher not moved yet) until
/// `ladder migrate` moves what it holds.
#[derive(Debug)]
pub(super) struct OldLadder {
    pub(super) prefix: String,
    open: AtomicBool,
    /// Schedule calls into it now.
    calls: AtomicUsize,
    /// Schedule calls it has taken since it was last opened.
    taken: AtomicUsize,
}

impl OldLadder {
    fn new(prefix: String) -> Self {
        Self {
            prefix,
            open: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
        }
    }

    /// Library calls go to the old ladder from now on.
    pub(super) fn open(&self) {
        self.taken.store(0, Ordering::SeqCst);
        self.open.store(true, Ordering::SeqCst);
    }

    /// Schedule calls that went to it since it was opened.
    pub(super) fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    /// No new call goes to the old ladder.
    pub(super) fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }

    /// A schedule call's way in: `Some` while open, counted until dropped.
    /// Counted before the switch is read, so [`OldLadder::settled`] after
    /// [`OldLadder::close`] sees every call that saw it open.
    pub(super) fn enter(&self) -> Option<OldLadderCall<'_>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.open.load(Ordering::SeqCst) {
            self.taken.fetch_add(1, Ordering::SeqCst);
            Some(OldLadderCall(self))
        } else {
            self.calls.fetch_sub(1, Ordering::SeqCst);
            None
        }
    }

    /// Waits until no call is scheduling into the old ladder, at most `limit`.
    pub(super) async fn settled(&self, limit: Duration) -> anyhow::Result<()> {
        let none = async || match self.calls.load(Ordering::SeqCst) {
            0 => Ok(()),
            calls => Err(anyhow!(
                "{calls} calls still scheduling into the old ladder after {limit:?}"
            )),
        };
        try_poll(limit, Duration::from_millis(20), none).await
    }
}

/// One schedule call into the old ladder, counted while it lives.
#[derive(Debug)]
pub(super) struct OldLadderCall<'a>(&'a OldLadder);

impl Drop for OldLadderCall<'_> {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One world on the cluster, its topology declared through the URL list.
async fn world(base: &Settings, kind: &str) -> anyhow::Result<World> {
    let mut settings = base.clone();
    settings.topology.levels = LEVELS;
    settings.sweeper.enabled = false;
    let mut world = World::builder()
        .settings(settings)
        .amqp_url(&cluster::node_url(1, VHOST))
        .kind(kind)
        .declare(false)
        .build()
        .await
        .with_context(|| {
            format!("the {kind} world (is the cluster up? scripts/lib/cluster.sh up)")
        })?;
    world.settings.amqp.url = SecretString::from(cluster::url_list(1, VHOST));
    let settings = world.settings.clone();
    world.declare(&settings).await?;
    Ok(world)
}

/// The soak's vhost on the cluster, with guest's permissions.
async fn ensure_vhost() -> anyhow::Result<()> {
    // Refused when it exists; setting the permissions fails when it does not.
    let _ = cluster::ctl(1, &["add_vhost", VHOST]).await;
    cluster::ctl(
        1,
        &["set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"],
    )
    .await
    .map_err(anyhow::Error::msg)?;
    Ok(())
}
