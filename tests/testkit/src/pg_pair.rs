//! The PostgreSQL primary and standby of `scripts/lib/pg-pair.sh` (node 1 on
//! 5433, node 2 on 5434, beside the system cluster on 5432), driven through
//! that script as `scripts/test` and a person would, each call bounded by
//! `timeout`. For the failover tests (`tests/faults/failover`).
//!
//! A test that breaks the pair holds [`PairLock`] from its `up` to its end:
//! two runs on one machine (two checkouts) would otherwise kill each other's
//! primary.

use std::fs::File;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The pair's ports, node 1 first.
pub const PORTS: [u16; 2] = [5433, 5434];

/// The database every failover test's schema lives in (the script makes it
/// afresh at every `up`).
pub const DATABASE: &str = "order_expiry_failover";

/// The lock file a test holds while it breaks the pair.
const LOCK: &str = "/tmp/order-expiry-pg-pair.lock";

/// How node 1 replicates to node 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names` names node 2: a commit returns once node 2
    /// flushed it.
    Sync,
    /// A commit returns once node 1 flushed it; node 2 follows when it can.
    Async,
}

/// The URL the services use: both hosts, `target_session_attrs=read-write`.
pub fn url() -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{DATABASE}?target_session_attrs=read-write",
        PORTS[0], PORTS[1]
    )
}

/// Node `n` alone (1 or 2), whatever its role.
pub fn node_url(n: usize) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", PORTS[n - 1])
}

/// The pair to this test alone until dropped (an exclusive `flock`; the
/// descriptor is close-on-exec, so no server the script starts keeps it).
#[derive(Debug)]
pub struct PairLock {
    _file: File,
}

/// Waits for the pair (at most an hour) and takes it.
pub async fn lock() -> PairLock {
    tokio::task::spawn_blocking(|| {
        let file = File::create(LOCK).unwrap_or_else(|e| panic!("{LOCK}: {e}"));
        file.lock().unwrap_or_else(|e| panic!("flock {LOCK}: {e}"));
        PairLock { _file: file }
    })
    .await
    .expect("lock task")
}

/// Runs `scripts/lib/pg-pair.sh ARGS`, at most `limit`; its stdout, or why it
/// failed.
pub fn pg_pair_sh(args: &[&str], limit: Duration) -> Result<String, String> {
    crate::services::run_script("pg-pair.sh", args, &[], limit)
}

/// [`pg_pair_sh`] in a blocking task, for callers that report a failure
/// rather than panic (the soak).
pub async fn script(args: &[&str], limit: Duration) -> anyhow::Result<String> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pg_pair_sh(&args, limit)
    });
    out.await?.map_err(anyhow::Error::msg)
}

/// [`script`], panicking on failure; the wall-clock time it returned at.
async fn pair(args: Vec<String>, limit: Duration) -> DateTime<Utc> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    script(&args, limit).await.unwrap_or_else(|e| panic!("{e}"));
    Utc::now()
}

/// Node 1 a writable primary with an empty database, node 2 its standby,
/// replicating as `mode` says (made or rebuilt as needed).
pub async fn up(mode: Replication) {
    let mode = match mode {
        Replication::Sync => "sync",
        Replication::Async => "async",
    };
    pair(vec!["up".into(), mode.into()], Duration::from_secs(180)).await;
}

/// `kill -9` of node `n`'s postmaster and every process of it: a crashed host.
pub async fn kill(n: usize) -> DateTime<Utc> {
    pair(vec!["kill".into(), n.to_string()], Duration::from_secs(30)).await
}

/// Graceful (fast) stop of node `n`; when it returned.
pub async fn stop(n: usize) -> DateTime<Utc> {
    pair(vec!["stop".into(), n.to_string()], Duration::from_secs(60)).await
}

/// Promotes standby `n`; when it took writes.
pub async fn promote(n: usize) -> DateTime<Utc> {
    pair(
        vec!["promote".into(), n.to_string()],
        Duration::from_secs(90),
    )
    .await
}

/// After a failover to node 2, back to the start state with the data kept:
/// node 1 rebuilt as node 2's standby, a planned switchover to it, node 2
/// rebuilt as its synchronous standby. When node 1 took writes.
pub async fn switchback() -> Result<DateTime<Utc>, String> {
    let said = script(&["switchback"], Duration::from_secs(300)).await;
    let said = said.map_err(|e| e.to_string())?;
    let promoted = said.lines().last().unwrap_or_default().trim();
    let secs: f64 = promoted
        .parse()
        .map_err(|_| format!("switchback printed {said:?}, not when node 1 took writes"))?;
    DateTime::from_timestamp_micros((secs * 1e6) as i64)
        .ok_or_else(|| format!("switchback printed {promoted}, not a time"))
}

/// Node `n` refuses writes from now on, its open sessions included.
pub async fn fence(n: usize) -> DateTime<Utc> {
    pair(vec!["fence".into(), n.to_string()], Duration::from_secs(30)).await
}

/// Node 1's walsenders stopped (SIGSTOP): node 2 receives nothing more.
pub async fn pause_replication() -> DateTime<Utc> {
    pair(vec!["pause-replication".into()], Duration::from_secs(30)).await
}

/// Node 1's walsenders continued.
pub async fn resume_replication() -> DateTime<Utc> {
    pair(vec!["resume-replication".into()], Duration::from_secs(30)).await
}

/// The pair's state, as `pg-pair.sh status` prints it (for a failure's story).
pub fn status() -> String {
    pg_pair_sh(&["status"], Duration::from_secs(30)).unwrap_or_else(|e| e)
}
