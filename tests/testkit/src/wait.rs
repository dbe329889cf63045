//! Waiting for a condition instead of sleeping.

use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it holds; panics with `what` after `timeout`.
pub async fn eventually<F: AsyncFnMut() -> bool>(timeout: Duration, what: &str, mut check: F) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
