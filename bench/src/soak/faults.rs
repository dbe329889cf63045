//! The faults: drawn at random from the seed, in two lanes that run side by
//! side so faults overlap (a node dies while the database route is down).
//!
//! - The broker lane: kill -9, graceful stop or SIGSTOP of one node at a time,
//!   then the node back, or one node cut off from the other two by a network
//!   partition, then healed; at most one node is ever down or cut off.
//! - The service lane: kill -9 of a `serve` (restarted), a restart of the
//!   http world's PostgreSQL, a failover of the sql world's (its primary
//!   killed, its synchronous standby promoted a few seconds later, as a
//!   failover manager would; drawn again, a switchback, a planned switchover
//!   back to the first node), the sql world's database routes blackholed,
//!   the http world's order service or payment gateway failing (503s, or
//!   hanging past the client's timeout), a `parked replay --all` while
//!   traffic runs, and a `ladder migrate`: the sql world's order service
//!   schedules into an old ladder (another prefix, which nothing consumes)
//!   for a while, as a publisher not yet moved to the new prefix would, then
//!   `ladder migrate --from-prefix` moves what it holds into the current
//!   ladder while traffic runs. Every other migration overlaps a node stop
//!   on purpose: the node it is given first is stopped as it starts, and it
//!   must carry on through another (issue 33).
//!
//! Each fault is recorded with when it started and when it was repaired
//! (`recovered`): the checker measures lateness from max(due, recovered) for
//! the orders whose wait it overlapped, against the fault's [`Kind::bound`].

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use order_expiry_testkit::{Reply, cluster, pg_pair};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use super::world::{SERVES, SoakWorld, Which};

/// One fault, with what it needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// kill -9 of a node's beam, the node started again after `down`.
    NodeKill { node: usize, down: Duration },
    /// Graceful stop of a node, started again after `down`.
    NodeStop { node: usize, down: Duration },
    /// SIGSTOP of a node's beam for `hung`, then SIGCONT.
    NodePause { node: usize, hung: Duration },
    /// A node cut off from the other two (`cluster.sh isolate`: its
    /// distribution links dropped, AMQP still reachable) for `lasting`.
    NodePartition { node: usize, lasting: Duration },
    /// kill -9 of `serve` slot `slot`, started again after `down`.
    ServeKill { slot: usize, down: Duration },
    /// `pg_ctlcluster ... restart` of the http world's PostgreSQL (fast
    /// shutdown: connections cut).
    PostgresRestart,
    /// kill -9 of the sql world's primary (node 1 of the pair); its
    /// synchronous standby promoted after `detect`.
    DatabaseFailover { detect: Duration },
    /// After a failover: node 1 back as node 2's standby, then a planned
    /// switchover to it (`pg-pair.sh switchback`).
    DatabaseSwitchback,
    /// The sql world's database routes blackholed for `lasting`.
    DatabaseBlackhole { lasting: Duration },
    /// The http world's order service answers 503 to every expire.
    OrderServiceDown { lasting: Duration },
    /// The payment gateway answers 503, or hangs past the check's timeout.
    GatewayDown { lasting: Duration, hangs: bool },
    /// `order-expiry parked replay --all` on the sql world.
    ParkedReplay,
    /// The sql world's library calls go to the old ladder for `lasting`,
    /// then `order-expiry ladder migrate --from-prefix` moves them; with
    /// `stop`, that node is given first and stopped as the migration starts
    /// (recorded as a [`Kind::NodeStop`] of its own as well).
    LadderMigrate {
        lasting: Duration,
        stop: Option<usize>,
    },
}

/// No fault, no excuse: an order is cancelled within this of its due time.
pub(super) const BASE_BOUND: Duration = Duration::from_secs(5);

/// Which world's orders a fault can delay.
#[derive(Debug, Clone, Copy)]
enum Reach {
    Both,
    Only(Which),
    /// The world of `serve` slot N.
    Slot(usize),
}

impl Kind {
    /// What each fault is: its family (for the plot's colours and the
    /// totals); its bound in seconds (see [`Self::bound`]); whether that
    /// counts from the order's due time alone, not from max(due, recovered)
    /// (a cluster node that dies or hangs must not hold orders for as long
    /// as it is gone, issue 33); and which world's orders it can delay.
    fn spec(&self) -> (&'static str, u64, bool, Reach) {
        use Which::{Http, Sql};
        match self {
            // tests/cluster/node_gone.rs and hung_node.rs: from the order's
            // due time, whenever the node returns.
            Kind::NodeKill { .. } => ("node kill -9", 10, true, Reach::Both),
            Kind::NodeStop { .. } => ("node stop", 10, true, Reach::Both),
            Kind::NodePause { .. } => ("node SIGSTOP", 30, true, Reach::Both),
            // tests/cluster/partition.rs: 30 s for what falls due while the
            // majority has not yet seen the node go (net_ticktime), 10 s
            // after that; the checker holds every order to the longer one.
            Kind::NodePartition { .. } => ("node cut off", 30, true, Reach::Both),
            // Redelivery to the other serve, or this one's restart.
            Kind::ServeKill { slot, .. } => ("serve kill -9", 10, false, Reach::Slot(*slot)),
            // The consumer's retry backoff (up to 10 s) and a reconnect.
            Kind::PostgresRestart => ("PostgreSQL restart", 15, false, Reach::Only(Http)),
            Kind::OrderServiceDown { .. } => ("order service down", 15, false, Reach::Only(Http)),
            Kind::GatewayDown { .. } => ("gateway down", 15, false, Reach::Only(Http)),
            // tests/faults/failover: within 10 s of the promotion (`recovered`).
            Kind::DatabaseFailover { .. } => ("PostgreSQL failover", 10, false, Reach::Only(Sql)),
            Kind::DatabaseSwitchback => ("PostgreSQL switchback", 10, false, Reach::Only(Sql)),
            // query_timeout (6 s) to notice, then the backoff.
            Kind::DatabaseBlackhole { .. } => ("database blackhole", 20, false, Reach::Only(Sql)),
            Kind::ParkedReplay => ("parked replay", 0, false, Reach::Only(Sql)),
            // What was due in the old ladder goes to the due queue at once.
            Kind::LadderMigrate { .. } => ("ladder migrate", 10, false, Reach::Only(Sql)),
        }
    }

    /// How late past max(due, recovered) (or past due, see
    /// [`Self::counts_from_due`]) an order whose wait this fault overlapped
    /// may be cancelled. Each is the bound the fault's own test asserts
    /// (tests/cluster, tests/faults), or what the service's retry settings
    /// imply (retry_max_ms 10 s, query_timeout_ms 6 s), plus the
    /// [`BASE_BOUND`] of a loaded machine; but a node fault's bound is its
    /// test's own, without that allowance: those tests hold it.
    pub(super) fn bound(&self) -> Duration {
        let (_, secs, from_due, _) = self.spec();
        let allowance = if from_due { Duration::ZERO } else { BASE_BOUND };
        Duration::from_secs(secs) + allowance
    }

    /// Whether [`Self::bound`] counts from the order's due time alone.
    pub(super) fn counts_from_due(&self) -> bool {
        self.spec().2
    }

    /// Whether it can delay `which`'s orders.
    pub(super) fn affects(&self, which: Which, slot_world: impl Fn(usize) -> Which) -> bool {
        match self.spec().3 {
            Reach::Both => true,
            Reach::Only(world) => world == which,
            Reach::Slot(slot) => slot_world(slot) == which,
        }
    }

    /// Which family it belongs to, for the plot's colours and the totals.
    pub(super) fn family(&self) -> &'static str {
        self.spec().0
    }

    /// A short name for the report.
    pub(super) fn label(&self) -> String {
        let s = |d: &Duration| format!("{:.0} s", d.as_secs_f64());
        match self {
            Kind::NodeKill { node, down } => format!("kill -9 node {node}, down {}", s(down)),
            Kind::NodeStop { node, down } => format!("stop node {node}, down {}", s(down)),
            Kind::NodePause { node, hung } => format!("SIGSTOP node {node} {}", s(hung)),
            Kind::NodePartition { node, lasting } => {
                format!("node {node} cut off {}", s(lasting))
            }
            Kind::ServeKill { slot, down } => {
                format!("kill -9 serve {}, down {}", slot + 1, s(down))
            }
            Kind::PostgresRestart => "PostgreSQL restart (http world)".into(),
            Kind::DatabaseFailover { detect } => {
                format!(
                    "kill -9 of the primary, standby promoted after {}",
                    s(detect)
                )
            }
            Kind::DatabaseSwitchback => "switchback to the first primary".into(),
            Kind::DatabaseBlackhole { lasting } => {
                format!("database route blackholed {}", s(lasting))
            }
            Kind::OrderServiceDown { lasting } => format!("order service 503 {}", s(lasting)),
            Kind::GatewayDown { lasting, hangs } => format!(
                "payment gateway {} {}",
                if *hangs { "hangs" } else { "503" },
                s(lasting)
            ),
            Kind::ParkedReplay => "parked replay --all".into(),
            Kind::LadderMigrate { lasting, stop } => match stop {
                None => format!("old ladder {}, then ladder migrate", s(lasting)),
                Some(node) => format!(
                    "old ladder {}, then ladder migrate through node {node} as it stops",
                    s(lasting)
                ),
            },
        }
    }
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) kind: Kind,
    pub(super) started: DateTime<Utc>,
    /// When it was repaired (the node answering again, the route restored).
    pub(super) recovered: DateTime<Utc>,
    /// What went wrong injecting or repairing it (a finding about the soak's
    /// own machinery, reported as such).
    pub(super) error: Option<String>,
}

/// Which lane draws a fault.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lane {
    Broker,
    Service,
}

/// The lane's faults, one after another, until `stop`; the records.
pub(super) async fn lane(
    world: &SoakWorld,
    lane: Lane,
    seed: u64,
    postgres_restarts: bool,
    soak_started: DateTime<Utc>,
    stop: CancellationToken,
) -> Vec<Record> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut records = Vec::new();
    loop {
        let (gap, mut kind) = draw(&mut rng, lane, SERVES.len());
        if kind == Kind::PostgresRestart && !postgres_restarts {
            // Drawn all the same, so the rest of the schedule stays the seed's.
            kind = Kind::DatabaseBlackhole {
                lasting: Duration::from_secs(5),
            };
        }
        // Failover and switchback take turns: after a failover the pair has
        // no standby to promote until the switchback.
        if matches!(kind, Kind::DatabaseFailover { .. }) && world.failed_over.load(Ordering::SeqCst)
        {
            kind = Kind::DatabaseSwitchback;
        }
        tokio::select! {
            () = stop.cancelled() => return records,
            () = tokio::time::sleep(gap) => {}
        }
        // A node fault waits for any other to end (at most one node down),
        // and starts, and is recorded, once it may.
        let _one_down = match kind.counts_from_due() {
            true => Some(world.nodes.lock().await),
            false => None,
        };
        let started = Utc::now();
        let at = (started - soak_started).num_seconds();
        println!("soak +{:02}:{:02}: {}", at / 60, at % 60, kind.label());
        let mut caused = Vec::new();
        let (error, recovered) = match inject(world, kind, &mut caused).await {
            Ok(recovered) => (None, recovered),
            Err(e) => (Some(format!("{e:#}")), None),
        };
        if let Some(e) = &error {
            println!("soak: {} failed: {e}", kind.label());
        }
        records.push(Record {
            kind,
            started,
            recovered: recovered.unwrap_or_else(Utc::now),
            error,
        });
        records.extend(caused);
    }
}

/// The next fault of `lane` and the pause before it.
fn draw(rng: &mut StdRng, lane: Lane, serves: usize) -> (Duration, Kind) {
    let secs = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_secs(rng.random_range(lo..=hi));
    match lane {
        Lane::Broker => {
            let gap = secs(rng, 10, 40);
            let node = rng.random_range(1..=3);
            let kind = match rng.random_range(0..7) {
                0 | 1 => Kind::NodeKill {
                    node,
                    down: secs(rng, 5, 20),
                },
                2 | 3 => Kind::NodeStop {
                    node,
                    down: secs(rng, 5, 20),
                },
                4 => Kind::NodePause {
                    node,
                    hung: secs(rng, 5, 30),
                },
                // Shorter than net_ticktime (a stall) to well past it.
                _ => Kind::NodePartition {
                    node,
                    lasting: secs(rng, 5, 40),
                },
            };
            (gap, kind)
        }
        Lane::Service => {
            let gap = secs(rng, 5, 25);
            let kind = match rng.random_range(0..13) {
                0..=2 => Kind::ServeKill {
                    slot: rng.random_range(0..serves),
                    down: secs(rng, 0, 10),
                },
                3 => Kind::PostgresRestart,
                4 | 5 => Kind::DatabaseBlackhole {
                    lasting: secs(rng, 5, 30),
                },
                6 | 7 => Kind::OrderServiceDown {
                    lasting: secs(rng, 5, 30),
                },
                8 | 9 => Kind::GatewayDown {
                    lasting: secs(rng, 5, 30),
                    hangs: rng.random_bool(0.5),
                },
                10 => Kind::ParkedReplay,
                // Seconds a failover manager takes to see the primary gone.
                11 => Kind::DatabaseFailover {
                    detect: secs(rng, 2, 10),
                },
                _ => {
                    let lasting = secs(rng, 5, 20);
                    let node = rng.random_range(1..=3);
                    Kind::LadderMigrate {
                        lasting,
                        stop: rng.random_bool(0.5).then_some(node),
                    }
                }
            };
            (gap, kind)
        }
    }
}

/// Injects `kind` and repairs it; when it was repaired, if before it
/// returned (a promotion, before the new standby is made). The faults it
/// caused go to `caused`.
async fn inject(
    world: &SoakWorld,
    kind: Kind,
    caused: &mut Vec<Record>,
) -> anyhow::Result<Option<DateTime<Utc>>> {
    // The caller holds the node lock.
    let node_fault = |down: &'static str, up: &'static str, node: usize, lasting, limit| async move {
        cluster::script(&[down, &node.to_string()], Duration::from_secs(limit)).await?;
        tokio::time::sleep(lasting).await;
        cluster::script(&[up, &node.to_string()], Duration::from_secs(180))
            .await
            .map(drop)
    };
    let unavailable = Reply::Status(503, "down for the soak".into());
    match kind {
        Kind::NodeKill { node, down } => node_fault("kill", "start", node, down, 30).await?,
        Kind::NodeStop { node, down } => node_fault("stop", "start", node, down, 90).await?,
        Kind::NodePause { node, hung } => node_fault("pause", "resume", node, hung, 30).await?,
        Kind::NodePartition { node, lasting } => {
            cluster::script(&["isolate", &node.to_string()], Duration::from_secs(30)).await?;
            tokio::time::sleep(lasting).await;
            cluster::script(&["heal"], Duration::from_secs(30)).await?;
        }
        Kind::ServeKill { slot, down } => {
            world.kill_serve(slot).await;
            tokio::time::sleep(down).await;
            world.start_serve(slot).await?;
        }
        Kind::PostgresRestart => restart_postgres().await?,
        Kind::DatabaseFailover { detect } => {
            pg_pair::script(&["kill", "1"], Duration::from_secs(30)).await?;
            tokio::time::sleep(detect).await;
            pg_pair::script(&["promote", "2"], Duration::from_secs(90)).await?;
            world.failed_over.store(true, Ordering::SeqCst);
        }
        Kind::DatabaseSwitchback => {
            let promoted = pg_pair::switchback().await.map_err(anyhow::Error::msg)?;
            world.failed_over.store(false, Ordering::SeqCst);
            return Ok(Some(promoted));
        }
        Kind::DatabaseBlackhole { lasting } => {
            world.blackhole_database();
            tokio::time::sleep(lasting).await;
            world.restore_database();
        }
        Kind::OrderServiceDown { lasting } | Kind::GatewayDown { lasting, .. } => {
            let (path, reply) = match kind {
                // Past action.check.timeout_ms (2 s in the soak).
                Kind::GatewayDown { hangs: true, .. } => {
                    ("payment", Reply::Hang(Duration::from_secs(3)))
                }
                Kind::GatewayDown { .. } => ("payment", unavailable),
                _ => ("expire", unavailable),
            };
            world.endpoint.fail(path, reply);
            tokio::time::sleep(lasting).await;
            world.endpoint.recover(path);
        }
        Kind::ParkedReplay => {
            let args = ["parked", "replay", "--all"];
            let limit = Duration::from_secs(60);
            world.cli(Which::Sql, 1, &args, limit).await?;
        }
        Kind::LadderMigrate { lasting, stop } => {
            world.old_ladder.open();
            tokio::time::sleep(lasting).await;
            world.old_ladder.close();
            // No call may still be on its way into the old ladder when the
            // migration has read past it: what it left there nothing consumes.
            world.old_ladder.settled(Duration::from_secs(90)).await?;
            let from = world.old_ladder.prefix.clone();
            let args = ["ladder", "migrate", "--from-prefix", &from];
            let limit = Duration::from_secs(120);
            let said = match stop {
                None => world.cli(Which::Sql, 1, &args, limit).await?,
                Some(node) => {
                    let (said, stopped) = migrate_as_node_stops(world, node, &args, limit).await;
                    caused.push(stopped);
                    said?
                }
            };
            // What went where, for the run's story: the calls the old ladder
            // took (retries included) and what the migration moved.
            let moved = said.lines().find(|l| l.starts_with("moved ")).unwrap_or("");
            println!(
                "soak: {} schedule calls went to the old ladder; {moved}",
                world.old_ladder.taken()
            );
            // Each node the migration lost and carried on from.
            for lost in said.lines().filter(|l| l.contains("carrying on through")) {
                println!("soak: ladder migrate: {lost}");
            }
        }
    }
    Ok(None)
}

/// `order-expiry ARGS` given node `node` first, as that node is stopped
/// (the stop begins half a second before the command, whose connection the
/// node then closes, or refuses); the node is started again once both are
/// done. Its output, and the node stop's record.
async fn migrate_as_node_stops(
    world: &SoakWorld,
    node: usize,
    args: &[&str],
    limit: Duration,
) -> (anyhow::Result<String>, Record) {
    let _one_down = world.nodes.lock().await;
    let started = Utc::now();
    let name = node.to_string();
    let stop_args = ["stop", name.as_str()];
    let stopping = cluster::script(&stop_args, Duration::from_secs(90));
    let command = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        world.cli(Which::Sql, node, args, limit).await
    };
    let (stopped, said) = tokio::join!(stopping, command);
    let started_again = cluster::script(&["start", &name], Duration::from_secs(180)).await;
    let error = stopped.and(started_again).err().map(|e| format!("{e:#}"));
    let record = Record {
        kind: Kind::NodeStop {
            node,
            down: (Utc::now() - started).to_std().unwrap_or_default(),
        },
        started,
        recovered: Utc::now(),
        error,
    };
    (said, record)
}

/// Restarts the local PostgreSQL (every cluster of it, as the machine's
/// services script starts it), its output away from ours: a server started
/// here must not hold our stdout or stderr open.
async fn restart_postgres() -> anyhow::Result<()> {
    let status = tokio::process::Command::new("bash")
        .args([
            "-c",
            "for v in $(ls /etc/postgresql); do \
             pg_ctlcluster --skip-systemctl-redirect \"$v\" main restart || exit 1; done",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "pg_ctlcluster restart exited {status}");
    Ok(())
}

/// Brings every node back (a fault that failed midway), continuing a paused
/// one, and repairs every injected fault: the end of a soak.
pub(super) async fn repair_all(world: &SoakWorld) -> anyhow::Result<()> {
    world.restore_database();
    world.endpoint.recover("expire");
    world.endpoint.recover("payment");
    cluster::script(&["heal"], Duration::from_secs(30)).await?;
    for slot in 0..SERVES.len() {
        if !world.serve_running(slot).await {
            world.start_serve(slot).await?;
        }
    }
    cluster::script(&["up"], Duration::from_secs(240))
        .await
        .map(drop)
}
