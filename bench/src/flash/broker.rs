//! The broker's own process, for its CPU time: the `beam.smp` given, or the
//! one that listens on the broker URL's port (found through `/proc/net/tcp*`
//! and the processes' socket descriptors), and its version.

use lapin::uri::AMQPUri;
use order_expiry::Settings;
use order_expiry_testkit::procfs;
use secrecy::ExposeSecret;

/// The broker process, if it could be found on this host.
#[derive(Debug, Clone)]
pub(super) struct Broker {
    /// Its process id.
    pub(super) pid: Option<u32>,
    /// The version the broker of the URL announces when a connection opens
    /// (its `server_properties`), or why not.
    pub(super) version: String,
}

impl Broker {
    /// The `beam.smp` of `pid`, or the one listening on the AMQP port of
    /// `settings` (the first URL of a list).
    pub(super) async fn find(pid: Option<u32>, settings: &Settings) -> Self {
        let port = amqp_port(settings.amqp.url.expose_secret());
        Self {
            pid: pid.or_else(|| listening_beam(port)),
            version: version(port).await,
        }
    }

    /// Its user + system CPU seconds so far.
    pub(super) fn cpu_seconds(&self) -> Option<f64> {
        procfs::cpu_seconds(&self.pid?.to_string(), false)
    }
}

/// The port of the first `amqp://` or `amqps://` URL (5672 or 5671 unless given).
fn amqp_port(urls: &str) -> u16 {
    let first = urls.split(',').next().unwrap_or("").trim();
    first
        .parse::<AMQPUri>()
        .map_or(5672, |uri| uri.authority.port)
}

/// The `beam.smp` owning a socket that listens on `port`; the only
/// `beam.smp` when no socket matches (descriptors unreadable).
fn listening_beam(port: u16) -> Option<u32> {
    let inodes = listening_inodes(port);
    let beams = crate::pids_named("beam.smp");
    let owns = |pid: &u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| {
                inodes
                    .iter()
                    .any(|i| target.to_string_lossy() == format!("socket:[{i}]"))
            })
    };
    match beams.iter().copied().find(owns) {
        Some(pid) => Some(pid),
        None if beams.len() == 1 => beams.first().copied(),
        None => None,
    }
}

/// Inodes of the sockets listening on `port` (`/proc/net/tcp` and `tcp6`).
fn listening_inodes(port: u16) -> Vec<String> {
    let port = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let local_port = f.get(1)?.rsplit(':').next()?;
                    (local_port == port && *f.get(3)? == "0A")
                        .then(|| f.get(9).map(|s| (*s).to_owned()))?
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The version the broker on the first URL's port of this host announces in
/// `connection.start` (`rabbitmqctl status` would ask the local 3.10 node,
/// whatever port the URL names), or why not.
async fn version(port: u16) -> String {
    let asking = tokio::spawn(order_expiry_testkit::announced_version(port));
    match tokio::time::timeout(std::time::Duration::from_secs(10), asking).await {
        Ok(Ok(version)) => version.to_string(),
        Ok(Err(_)) => format!("unknown (no version from 127.0.0.1:{port})"),
        Err(_) => format!("unknown (no answer from 127.0.0.1:{port} within 10 s)"),
    }
}

#[cfg(test)]
mod tests {
    use super::amqp_port;

    #[test]
    fn the_port_of_the_first_url() {
        assert_eq!(amqp_port("amqp://guest:guest@127.0.0.1:5673/x"), 5673);
        assert_eq!(amqp_port("amqp://127.0.0.1/%2f"), 5672);
        assert_eq!(amqp_port("amqps://u:p@h/v"), 5671);
        assert_eq!(amqp_port("amqp://h:5680/v,amqp://h:5681/v"), 5680);
    }
}
