//! Which RabbitMQ the tests talk to: its version, as the broker announces it
//! in the `server-properties` of `connection.start`, for the tests that assert
//! each version's own behaviour (`scripts/test` runs them on 3.10 and 4.3).
//!
//! lapin does not keep the server's properties, so this opens a TCP connection
//! of its own, sends the AMQP 0-9-1 protocol header, parses the first frame
//! with lapin's own parser and closes without logging in.
//!
//! [`Imported`]: definitions imported into that broker for one test.

use std::time::Duration;

use lapin::protocol::{AMQPClass, connection::AMQPMethod};
use lapin::types::AMQPValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::services::{amqp_port, rabbitmqctl, try_rabbitmqctl};

/// A RabbitMQ version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BrokerVersion {
    /// 3 or 4.
    pub major: u32,
    /// The minor release: 3.10, 4.3.
    pub minor: u32,
    /// The patch release.
    pub patch: u32,
}

impl BrokerVersion {
    /// This version is `major.minor` or later.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(['.', '-', '+']).map(|p| p.parse().ok());
        Some(Self {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next().flatten().unwrap_or(0),
        })
    }
}

impl std::fmt::Display for BrokerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The test broker's version (`ORDER_EXPIRY_TEST_AMQP_PORT`), read once per
/// process; panics when the broker does not answer or says no version.
pub async fn broker_version() -> BrokerVersion {
    static VERSION: tokio::sync::OnceCell<BrokerVersion> = tokio::sync::OnceCell::const_new();
    *VERSION
        .get_or_init(|| async {
            let port = amqp_port();
            tokio::time::timeout(Duration::from_secs(10), announced_version(port))
                .await
                .unwrap_or_else(|_| panic!("no connection.start from 127.0.0.1:{port} within 10 s"))
        })
        .await
}

/// The version the broker on `127.0.0.1:port` announces; panics when it
/// does not answer or says no version.
pub async fn announced_version(port: u16) -> BrokerVersion {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    stream
        .write_all(b"AMQP\x00\x00\x09\x01")
        .await
        .expect("protocol header sent");
    // Frame: type (1), channel (2), payload size (4), payload, frame-end.
    let mut header = [0u8; 7];
    stream
        .read_exact(&mut header)
        .await
        .expect("a frame header");
    assert_eq!(header[0], 1, "the broker's first frame is a method frame");
    let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
    let mut payload = vec![0u8; size];
    stream.read_exact(&mut payload).await.expect("the frame");
    let (_, class) = lapin::protocol::parse_class(payload.as_slice()).expect("an AMQP method");
    let AMQPClass::Connection(AMQPMethod::Start(start)) = class else {
        panic!("the broker's first method is not connection.start: {class:?}");
    };
    let version = match start.server_properties.inner().get("version") {
        Some(AMQPValue::LongString(text)) => text.to_string(),
        other => panic!("server-properties version: {other:?}"),
    };
    BrokerVersion::parse(&version).unwrap_or_else(|| panic!("a version like 4.3.6: {version:?}"))
}

/// Definitions (users, vhosts, permissions...) imported into the test
/// broker with `rabbitmqctl import_definitions`; their users and vhosts are
/// deleted again on drop, also when the test fails.
#[derive(Debug)]
pub struct Imported {
    users: Vec<String>,
    vhosts: Vec<String>,
}

impl Imported {
    /// Imports `definitions`, the JSON of a definitions file.
    pub fn new(definitions: &serde_json::Value) -> Self {
        let names = |section: &str| {
            let objects = definitions[section].as_array().into_iter().flatten();
            let names = objects.filter_map(|o| o["name"].as_str().map(str::to_owned));
            names.collect()
        };
        let imported = Self {
            users: names("users"),
            vhosts: names("vhosts"),
        };
        let id = uuid::Uuid::new_v4().simple();
        let file = std::env::temp_dir().join(format!("order-expiry-definitions-{id}.json"));
        std::fs::write(&file, definitions.to_string()).expect("a temporary file");
        rabbitmqctl(&["-q", "import_definitions", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        imported
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        let vhosts = self.vhosts.iter().map(|vhost| ("delete_vhost", vhost));
        let users = self.users.iter().map(|user| ("delete_user", user));
        for (what, name) in vhosts.chain(users) {
            let _ = try_rabbitmqctl(&["-q", what, name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BrokerVersion;

    #[test]
    fn versions_parse_and_compare() {
        let v = |s| BrokerVersion::parse(s).unwrap();
        assert_eq!(v("3.10.8").to_string(), "3.10.8");
        assert_eq!(v("4.3.6").to_string(), "4.3.6");
        assert_eq!(v("4.3.0-rc.1").patch, 0);
        assert!(v("4.3.6").at_least(4, 3) && !v("3.10.8").at_least(4, 3));
        assert!(v("3.10.8").at_least(3, 10) && !v("3.9.29").at_least(3, 10));
        assert!(BrokerVersion::parse("unknown").is_none());
    }
}
