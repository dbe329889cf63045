//! The HTTP client the OTLP exporter sends with: the service's own reqwest
//! (0.12, rustls), its requests run on the service's tokio runtime.
//!
//! Why not the exporter's built-in clients: its `reqwest-client` is reqwest
//! 0.13, a second HTTP stack beside the service's; its blocking client is a
//! third. And the SDK's batch processor exports from a thread of its own with
//! `futures_executor::block_on`, where an async client finds no tokio reactor.
//! So each request is spawned onto the runtime that built the exporter and the
//! processor's thread only waits for its answer.

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use tokio::runtime::Handle;

/// Sends the exporter's requests through reqwest on a tokio runtime.
#[derive(Debug, Clone)]
pub(super) struct RuntimeHttpClient {
    client: reqwest::Client,
    runtime: Handle,
}

impl RuntimeHttpClient {
    /// A client whose requests run on `runtime`.
    pub(super) fn new(client: reqwest::Client, runtime: Handle) -> Self {
        Self { client, runtime }
    }
}

#[async_trait]
impl HttpClient for RuntimeHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = client.execute(request).await?;
            let mut answer = Response::builder().status(response.status());
            if let Some(headers) = answer.headers_mut() {
                headers.extend(response.headers().clone());
            }
            let body = response.bytes().await?;
            Ok::<_, HttpError>(answer.body(body)?)
        });
        sent.await?
    }
}
