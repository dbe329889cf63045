//! The local three-node cluster of `scripts/lib/cluster.sh`, driven through that
//! script (as `scripts/test` and a person would), each call bounded by
//! `timeout`: its nodes (kill, pause, stop, start, who leads what) and their
//! URLs. Shared by the cluster tests (`tests/cluster`) and the soak
//! (`order-expiry-bench soak`).
//!
//! The script's `ORDER_EXPIRY_RMQ4_SUITE` picks the cluster; when it is not set,
//! every call here passes `forky`: the RabbitMQ 4.3 cluster, the primary tested
//! broker.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The cluster `scripts/lib/cluster.sh` runs: its node names and AMQP ports,
/// node 1 first, as `cluster.sh env` prints them. That depends on
/// `ORDER_EXPIRY_RMQ4_SUITE` (forky: the 4.3 cluster `rabbit43c1..3` on
/// 5695-5697; trixie: the 4.0 one, `rabbit4c1..3` on 5691-5693), which every
/// `cluster.sh` call here passes on, `forky` when it is not set ([`suite`]).
#[derive(Debug)]
pub struct Layout {
    /// `rabbit43c1@localhost`, ...
    pub nodes: [String; 3],
    /// Their AMQP ports.
    pub ports: [u16; 3],
}

/// The [`Layout`], read once.
pub fn layout() -> &'static Layout {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        let env = cluster_sh(&["env"], Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
        let field = |key: &str| -> Vec<String> {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key} in cluster.sh env: {env}"))
                .trim_matches('"')
                .split(' ')
                .map(str::to_owned)
                .collect()
        };
        let nodes: [String; 3] = field("CLUSTER_NODES").try_into().expect("three nodes");
        let ports = field("CLUSTER_PORTS")
            .iter()
            .map(|p| p.parse().expect("a port"))
            .collect::<Vec<u16>>()
            .try_into()
            .expect("three ports");
        Layout { nodes, ports }
    })
}

/// The node number (1-3) of `name` (`rabbit43c2@localhost`, or a process id's
/// node part, is 2 on the 4.3 cluster).
pub fn node_number(name: &str) -> Option<usize> {
    let name = name.split('@').next()?;
    layout()
        .nodes
        .iter()
        .position(|n| n.split('@').next() == Some(name))
        .map(|i| i + 1)
}

/// The node number (1-3) of an Erlang process id (`<rabbit43c2@localhost.1.2.0>`).
pub fn node_of_pid(pid: &str) -> Option<usize> {
    node_number(pid.trim().trim_start_matches('<').split('.').next()?)
}

/// How many of the cluster's nodes `field` (a `members` column) names.
pub fn nodes_named(field: &str) -> usize {
    layout()
        .nodes
        .iter()
        .filter(|n| field.contains(n.as_str()))
        .count()
}

/// The suite `cluster.sh` is run with: `ORDER_EXPIRY_RMQ4_SUITE`, else `forky`.
pub fn suite() -> String {
    std::env::var("ORDER_EXPIRY_RMQ4_SUITE").unwrap_or_else(|_| "forky".to_owned())
}

/// Runs `scripts/lib/cluster.sh ARGS`, at most `limit`; its stdout, or why it failed.
pub fn cluster_sh(args: &[&str], limit: Duration) -> Result<String, String> {
    let env = [("ORDER_EXPIRY_RMQ4_SUITE", suite())];
    crate::services::run_script("cluster.sh", args, &env, limit)
}

/// [`cluster_sh`] in a blocking task, for callers that report a failure
/// rather than panic (the soak).
pub async fn script(args: &[&str], limit: Duration) -> anyhow::Result<String> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cluster_sh(&args, limit)
    });
    out.await?.map_err(anyhow::Error::msg)
}

/// [`script`], panicking on failure.
async fn cluster(args: &[&str], limit: Duration) -> String {
    let out = script(args, limit).await;
    out.unwrap_or_else(|e| panic!("{e}"))
}

/// `cluster.sh ACTION n`, at most 30 s.
async fn on_node(action: &str, n: usize) {
    cluster(&[action, &n.to_string()], Duration::from_secs(30)).await;
}

/// `kill -9` of node `n`'s beam.
pub async fn kill(n: usize) {
    on_node("kill", n).await;
}

/// SIGSTOP of node `n`'s beam: hung, not dead.
pub async fn pause(n: usize) {
    on_node("pause", n).await;
}

/// SIGCONT of node `n`'s beam.
pub async fn resume(n: usize) {
    on_node("resume", n).await;
}

/// A network partition between nodes `a` and `b` (`cluster.sh cut`): their
/// distribution packets dropped both ways; AMQP and the CLI still reach both.
pub async fn cut(a: usize, b: usize) {
    let (a, b) = (a.to_string(), b.to_string());
    cluster(&["cut", &a, &b], Duration::from_secs(30)).await;
}

/// Node `n` cut from the other two (`cluster.sh isolate`); with `amqp`, no
/// client reaches it either.
pub async fn isolate(n: usize, amqp: bool) {
    let n = n.to_string();
    let args = ["isolate", &n, "--amqp"];
    cluster(&args[..2 + usize::from(amqp)], Duration::from_secs(30)).await;
}

/// Every cut removed (`cluster.sh heal`).
pub async fn heal() {
    cluster(&["heal"], Duration::from_secs(30)).await;
}

/// The cluster nodes node `n` has a distribution connection to (`nodes()`),
/// or `None` when it does not answer. A cut link shows here once the
/// distribution gives up on it: net_ticktime of silence (7.5-12.5 s with the
/// deployed 10 s).
pub async fn peers_of(n: usize) -> Option<Vec<usize>> {
    let out = ctl(n, &["eval", "nodes()."]).await.ok()?;
    let mut peers: Vec<usize> = out
        .split(|c: char| !(c.is_alphanumeric() || c == '@' || c == '_'))
        .filter_map(node_number)
        .collect();
    peers.sort_unstable();
    peers.dedup();
    Some(peers)
}

/// Graceful stop of node `n` (the whole node).
pub async fn stop(n: usize) {
    cluster(&["stop", &n.to_string()], Duration::from_secs(90)).await;
}

/// Starts node `n` again and waits until it runs and is a member; returns when.
pub async fn start(n: usize) -> Instant {
    cluster(&["start", &n.to_string()], Duration::from_secs(180)).await;
    Instant::now()
}

/// `rabbitmqctl -q ARGS` on node `n`.
pub async fn ctl(n: usize, args: &[&str]) -> Result<String, String> {
    let n = n.to_string();
    let all = [&["ctl", n.as_str(), "-q"], args].concat();
    let out = script(&all, Duration::from_secs(60)).await;
    out.map_err(|e| e.to_string())
}

/// `rabbitmqctl -q ARGS` on the first node that answers.
pub async fn ctl_any(args: &[&str]) -> String {
    let mut errors = Vec::new();
    for n in 1..=3 {
        match ctl(n, args).await {
            Ok(out) => return out,
            Err(e) => errors.push(e),
        }
    }
    panic!("no node answered {args:?}: {errors:?}")
}

/// Queue name -> column values of `list_queues -p vhost name COLUMNS`, for the
/// queues of `prefix`.
pub async fn queues(vhost: &str, prefix: &str, columns: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut args = vec!["list_queues", "-p", vhost, "--no-table-headers", "name"];
    args.extend(columns);
    let listing = ctl_any(&args).await;
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?.trim();
            name.starts_with(&format!("{prefix}.")).then(|| {
                (
                    name.to_owned(),
                    fields.map(|f| f.trim().to_owned()).collect(),
                )
            })
        })
        .collect()
}

/// How many of the queues of `prefix` whose name contains `part` each node
/// leads: `[node 1, node 2, node 3]`.
pub async fn leaders(vhost: &str, prefix: &str, part: &str) -> [usize; 3] {
    let mut counts = [0; 3];
    for (name, fields) in queues(vhost, prefix, &["leader"]).await {
        if let Some(n) = fields.first().and_then(|f| node_number(f))
            && name.contains(part)
        {
            counts[n - 1] += 1;
        }
    }
    counts
}

/// Moves the leader of every quorum queue of `prefix` to node `n` (Ra's
/// leadership transfer, through `rabbitmqctl eval` on that node), and waits
/// until the listing shows it, at most 60 s: the worst placement for a fault
/// on that node.
pub async fn lead_all_on(vhost: &str, prefix: &str, n: usize) {
    let node = &layout().nodes[n - 1];
    let transfer = format!(
        "[begin {{Ra, _}} = amqqueue:get_pid(Q), \
           {{ok, _, Leader}} = ra:members(amqqueue:get_pid(Q)), \
           ra:transfer_leadership(Leader, {{Ra, '{node}'}}) end \
         || Q <- rabbit_amqqueue:list(<<\"{vhost}\">>), \
            amqqueue:get_type(Q) =:= rabbit_quorum_queue, \
            lists:prefix(\"{prefix}.\", binary_to_list(element(4, amqqueue:get_name(Q))))]."
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Err(e) = ctl(n, &["eval", &transfer]).await {
            eprintln!("moving the leaders of {prefix} to node {n}: {e}");
        }
        let placed = queues(vhost, prefix, &["leader", "type"]).await;
        let elsewhere: Vec<_> = placed
            .iter()
            .filter(|(_, f)| f.get(1).is_some_and(|t| t == "quorum"))
            .filter(|(_, f)| f.first().and_then(|l| node_number(l)) != Some(n))
            .map(|(name, _)| name.clone())
            .collect();
        if elsewhere.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the leaders of {elsewhere:?} did not move to node {n} within 60 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Heals every cut and starts every node that is not running when dropped (a
/// scenario that failed midway), so that the next one finds three nodes that
/// see each other.
#[derive(Debug)]
pub struct NodesBack;

impl Drop for NodesBack {
    fn drop(&mut self) {
        if let Err(e) = cluster_sh(&["heal"], Duration::from_secs(30)) {
            eprintln!("healing the cuts failed: {e}");
        }
        if let Err(e) = cluster_sh(&["up"], Duration::from_secs(240)) {
            eprintln!("bringing the nodes back failed: {e}");
        }
    }
}

/// The URL of node `n` (1-3) in `vhost`.
pub fn node_url(n: usize, vhost: &str) -> String {
    let vhost = vhost.replace('%', "%25").replace('/', "%2f");
    format!(
        "amqp://guest:guest@127.0.0.1:{}/{vhost}",
        layout().ports[n - 1]
    )
}

/// The three nodes' URLs in `vhost`, comma-separated, node `first` first (then
/// the others in order): a process given it connects to `first` when that node
/// runs.
pub fn url_list(first: usize, vhost: &str) -> String {
    (0..3)
        .map(|i| node_url((first - 1 + i) % 3 + 1, vhost))
        .collect::<Vec<_>>()
        .join(",")
}
