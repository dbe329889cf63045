//! A test world on the cluster: the shared isolated world of
//! `order_expiry_testkit` (its prefix in the test vhost, its schema), with its
//! topology declared through the list of the three nodes' URLs, and `serve`
//! processes started on a chosen node.

use std::ops::Deref;
use std::time::Duration;

use order_expiry::Scheduler;
use order_expiry_testkit::{Served, cluster, vhost};
use secrecy::SecretString;

/// The URL of node `n` (1-3) in the test vhost.
pub fn node_url(n: usize) -> String {
    cluster::node_url(n, &vhost())
}

/// The three nodes' URLs in the test vhost, node `first` first.
pub fn url_list(first: usize) -> String {
    cluster::url_list(first, &vhost())
}

/// `serve` without the sweeper: every cancel is then a message the ladder
/// delivered.
pub const NO_SWEEPER: [(&str, &str); 1] = [("ORDER_EXPIRY__SWEEPER__ENABLED", "false")];

/// The two nodes after `n` (1-3), in turn.
pub fn others(n: usize) -> (usize, usize) {
    (n % 3 + 1, (n + 1) % 3 + 1)
}

/// The node (1-3) with the most of `leaders` (per node, as
/// [`ClusterWorld::leaders`] counts them).
pub fn busiest(leaders: [usize; 3]) -> usize {
    (1..=3).max_by_key(|n| leaders[n - 1]).expect("three nodes")
}

/// One scenario's world on the cluster; derefs to the shared world.
pub struct ClusterWorld {
    world: order_expiry_testkit::World,
}

impl Deref for ClusterWorld {
    type Target = order_expiry_testkit::World;

    fn deref(&self) -> &Self::Target {
        &self.world
    }
}

impl ClusterWorld {
    /// A world with `levels` ladder levels, its topology declared through the
    /// URL list (node 1 first); its admin link is on node 1.
    pub async fn new(name: &'static str, levels: u8) -> Self {
        let mut world = order_expiry_testkit::World::builder()
            .amqp_url(&node_url(1))
            .kind("cluster")
            .levels(levels)
            .declare(false)
            .scenario("cluster", name)
            .build()
            .await
            .unwrap_or_else(|e| {
                panic!("a world on the cluster (is it up? scripts/lib/cluster.sh up): {e:#}")
            });
        world.settings.amqp.url = SecretString::from(url_list(1));
        world.settings.amqp.reconnect_max = Duration::from_millis(500);
        // `..._MS=0` declares the queues without the queue argument (the
        // broker's 60 s), to see a scenario fail.
        if let Ok(ms) = std::env::var("ORDER_EXPIRY__TOPOLOGY__CONSUMER_DISCONNECTED_TIMEOUT_MS") {
            let ms = ms
                .parse()
                .expect("..._CONSUMER_DISCONNECTED_TIMEOUT_MS in ms");
            world.settings.topology.consumer_disconnected_timeout = Duration::from_millis(ms);
        }
        let settings = world.settings.clone();
        world
            .declare(&settings)
            .await
            .expect("topology on the cluster");
        Self { world }
    }

    /// Starts `order-expiry serve` connected to node `first` (the URL list with
    /// that node first); `env` adds variables. The outbox relay is off, so the
    /// consumer's session is the process's only broker connection, and so on
    /// `first` while it runs.
    pub async fn serve(&self, first: usize, env: &[(&str, &str)]) -> Served {
        let urls = url_list(first);
        let mut all = vec![
            ("ORDER_EXPIRY__AMQP__URL", urls.as_str()),
            ("ORDER_EXPIRY__AMQP__RECONNECT_MAX_MS", "500"),
            ("ORDER_EXPIRY__OUTBOX__ENABLED", "false"),
        ];
        all.extend_from_slice(env);
        let label = format!("-node{first}");
        self.world.serve_labelled(&label, &all).await
    }

    /// A ready `serve` ([`ClusterWorld::serve`]) on each of `nodes`.
    pub async fn serves_on(&self, nodes: &[usize], env: &[(&str, &str)]) -> Vec<Served> {
        let mut serves = Vec::new();
        for &n in nodes {
            serves.push(self.serve(n, env).await);
        }
        for served in &serves {
            served.wait_ready(Duration::from_secs(30)).await;
        }
        serves
    }

    /// A publisher on the URL list with node `first` first, each confirm
    /// bounded by `timeout`.
    pub fn scheduler_on(&self, first: usize, timeout: Duration) -> Scheduler {
        let mut settings = self.settings.clone();
        settings.amqp.url = SecretString::from(url_list(first));
        settings.amqp.timeout = timeout;
        Scheduler::from_settings(&settings).expect("scheduler")
    }

    /// `[node 1, node 2, node 3]`: how many of this world's queues whose name
    /// contains `part` each node leads.
    pub async fn leaders(&self, part: &str) -> [usize; 3] {
        cluster::leaders(&vhost(), &self.settings.topology.prefix, part).await
    }

    /// Moves every queue's leader to node `n`.
    pub async fn lead_all_on(&self, n: usize) {
        cluster::lead_all_on(&vhost(), &self.settings.topology.prefix, n).await;
    }

    /// The nodes the consumers of the due queue are connected to (one entry per
    /// consumer), from their channels' process ids.
    pub async fn due_consumer_nodes(&self) -> Vec<usize> {
        let vhost = vhost();
        let args = [
            "list_consumers",
            "-p",
            &vhost,
            "--no-table-headers",
            "queue_name",
            "channel_pid",
        ];
        let listing = cluster::ctl_any(&args).await;
        let due = self.ladder().due_queue();
        let pairs = listing.lines().filter_map(|l| l.split_once('\t'));
        let pids = pairs.filter(|(queue, _)| queue.trim() == due);
        pids.filter_map(|(_, pid)| cluster::node_of_pid(pid))
            .collect()
    }

    /// Deletes the world (queues, exchanges, schema) and its logs unless
    /// `CLUSTER_KEEP_LOGS` is set.
    pub async fn cleanup(self) {
        self.world.cleanup().await;
    }
}
