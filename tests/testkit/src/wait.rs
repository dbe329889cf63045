//! Waiting for a condition instead of sleeping.

use std::time::{Duration, Instant};

/// Polls `check` every `every` until it returns `Ok`: its value, or its
/// last `Err` once `limit` has passed. For callers that report rather than
/// panic (the soak); tests use [`poll`]. (`FnMut` returning a future rather
/// than `AsyncFnMut`, so that the wait is `Send` inside a spawned task.)
pub async fn try_poll<T, E, Fut: Future<Output = Result<T, E>>>(
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> Fut,
) -> Result<T, E> {
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// [`try_poll`] every `every_ms`, panicking with the last `Err`.
pub async fn poll<T, E: std::fmt::Display, Fut: Future<Output = Result<T, E>>>(
    limit: Duration,
    every_ms: u64,
    check: impl FnMut() -> Fut,
) -> T {
    let every = Duration::from_millis(every_ms);
    let polled = try_poll(limit, every, check).await;
    polled.unwrap_or_else(|what| panic!("{what}"))
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `timeout`.
pub async fn eventually<Fut: Future<Output = bool>>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Fut,
) {
    let what = &format!("{what} within {timeout:?}");
    poll(timeout, 50, || {
        let held = check();
        async move { held.await.then_some(()).ok_or(what) }
    })
    .await
}
