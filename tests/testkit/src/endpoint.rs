//! A real local HTTP server standing in for an order service's expire endpoint
//! (`POST /orders/{id}/expire`) and a payment gateway's check
//! (`GET /orders/{id}/payment`): each order answers from a script, every
//! request is recorded with its headers, body and arrival time. As
//! [`Endpoint::order_service`] it is a whole order service: an unscripted
//! expire cancels the order in its orders table, as a real one would.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use order_expiry::service::PgOrderStore;
use tokio_util::sync::CancellationToken;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// This status and body.
    Status(u16, String),
    /// 200 with `{"status": "<status>"}` (a check answer).
    Payment(&'static str),
    /// Answer 200 only after this long (longer than the client's timeout: a hang).
    Hang(Duration),
}

/// One request the endpoint received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `POST` or `GET`.
    pub method: String,
    /// `expire` or `payment`.
    pub kind: String,
    /// The order id, percent-decoded from the path.
    pub order_id: String,
    /// Headers, names in lower case.
    pub headers: HashMap<String, String>,
    /// The body, as text.
    pub body: String,
    /// When it arrived.
    pub at: DateTime<Utc>,
    /// What the order service answered ([`Endpoint::order_service`]'s own
    /// expires only; `None` for scripted answers).
    pub status: Option<u16>,
}

#[derive(Debug, Default)]
struct State {
    /// By `"<kind> <order id>"`: answered in order; the last one repeats.
    scripts: HashMap<String, VecDeque<Reply>>,
    requests: Vec<Request>,
    /// By kind: while set, every request of that kind answers this, whatever
    /// its script ([`Endpoint::fail`]).
    outages: HashMap<String, Reply>,
    /// The orders table an unscripted expire cancels in ([`Endpoint::order_service`]).
    orders: Option<Arc<PgOrderStore>>,
}

/// The server; stops when dropped.
#[derive(Debug)]
pub struct Endpoint {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl Endpoint {
    /// Starts it on a free port of 127.0.0.1. Unscripted orders answer 200
    /// (expire) or `{"status":"unpaid"}` (payment).
    pub async fn start() -> Self {
        Self::start_on(0).await
    }

    /// An order service on a free port whose unscripted `expire` cancels the
    /// order in `orders` as the contract asks ([`expire_order`]): 200 when it
    /// cancelled, 409 when the order is not unpaid or its deadline is later
    /// than the request's `due_at`, 404 when unknown, 425 while `due_at` is
    /// ahead of its clock, 503 when the database fails. Tests audit its table
    /// as they audit the SQL action's. Its expires are recorded once
    /// answered, so a test that has seen one ([`Endpoint::wait_for`]) sees
    /// its effect in the table.
    pub async fn order_service(orders: Arc<PgOrderStore>) -> Self {
        Self::order_service_on(orders, 0).await
    }

    /// [`Endpoint::order_service`] on `port` of 127.0.0.1 (0: a free one).
    pub async fn order_service_on(orders: Arc<PgOrderStore>, port: u16) -> Self {
        // Its table is set before it listens: a request in between would be
        // answered as by a plain endpoint (200, nothing cancelled), and a
        // consumer retrying as the port opens takes that for a cancel.
        let state = State {
            orders: Some(orders),
            ..State::default()
        };
        Self::serve_on(port, state).await
    }

    /// [`Endpoint::start`] on `port` of 127.0.0.1 (0: a free one).
    pub async fn start_on(port: u16) -> Self {
        Self::serve_on(port, State::default()).await
    }

    /// Listens on `port` of 127.0.0.1 and answers from `state`.
    async fn serve_on(port: u16, state: State) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the port is free");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(Mutex::new(state));
        let stop = CancellationToken::new();
        let shared = Arc::clone(&state);
        let app = axum::Router::new().fallback(move |request: HttpRequest<Body>| {
            let state = Arc::clone(&shared);
            async move { answer(state, request).await }
        });
        serve_until(listener, app, stop.clone());
        Self { addr, state, stop }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Scripts what `kind` (`expire` or `payment`) answers for `order_id`.
    pub fn script(&self, kind: &str, order_id: &str, replies: Vec<Reply>) {
        let mut state = self.state.lock().unwrap();
        state
            .scripts
            .insert(format!("{kind} {order_id}"), replies.into());
    }

    /// Until [`Endpoint::recover`], every request of `kind` answers `reply`
    /// (for example a 503, or a hang past the client's timeout), whatever the
    /// order's script: the whole order service or gateway failing.
    pub fn fail(&self, kind: &str, reply: Reply) {
        let mut state = self.state.lock().unwrap();
        state.outages.insert(kind.to_owned(), reply);
    }

    /// Ends [`Endpoint::fail`] of `kind`: scripts and defaults answer again.
    pub fn recover(&self, kind: &str) {
        self.state.lock().unwrap().outages.remove(kind);
    }

    /// Every request so far, in arrival order; an order service's expire
    /// ([`Endpoint::order_service`]) once it has answered.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The requests of `kind` for `order_id`, in arrival order.
    pub fn requests_for(&self, kind: &str, order_id: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.kind == kind && r.order_id == order_id)
            .collect()
    }

    /// Waits until `n` requests of `kind` for `order_id` arrived.
    pub async fn wait_for(
        &self,
        kind: &str,
        order_id: &str,
        n: usize,
        timeout: Duration,
    ) -> Vec<Request> {
        crate::poll(timeout, 20, || async {
            let got = self.requests_for(kind, order_id);
            match got.len() >= n {
                true => Ok(got),
                false => Err(format!(
                    "only {} of {n} {kind} requests for {order_id} within {timeout:?}",
                    got.len()
                )),
            }
        })
        .await
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(state: Arc<Mutex<State>>, request: HttpRequest<Body>) -> Response {
    let at = Utc::now();
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (encoded, kind) = match parts.as_slice() {
        ["orders", id, kind @ ("expire" | "payment")] => (*id, *kind),
        _ => return (StatusCode::NOT_FOUND, "no such route").into_response(),
    };
    let order_id = percent_encoding::percent_decode_str(encoded)
        .decode_utf8_lossy()
        .into_owned();
    let request = Request {
        method,
        kind: kind.to_owned(),
        order_id: order_id.clone(),
        headers,
        body: body.clone(),
        at,
        status: None,
    };
    let (reply, orders) = {
        let mut state = state.lock().unwrap();
        let scripted = match state.scripts.get_mut(&format!("{kind} {order_id}")) {
            Some(script) if script.len() > 1 => script.pop_front(),
            Some(script) => script.front().cloned(),
            None => None,
        };
        let reply = state.outages.get(kind).cloned().or(scripted);
        (reply, state.orders.clone())
    };
    if let (None, "expire", Some(orders)) = (&reply, kind, orders) {
        // Recorded once its statement has committed (or failed), so that a
        // test which saw the request sees its effect in the table.
        let answer = expire(&orders, &order_id, &body).await;
        let status = answer.status();
        state.lock().unwrap().requests.push(Request {
            status: Some(status.as_u16()),
            ..request
        });
        return answer;
    }
    state.lock().unwrap().requests.push(request);
    let reply = reply.unwrap_or(match kind {
        "payment" => Reply::Payment("unpaid"),
        _ => Reply::Status(200, "{}".into()),
    });
    match reply {
        Reply::Status(status, body) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT);
            (status, body).into_response()
        }
        Reply::Payment(status) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            format!(r#"{{"status":"{status}"}}"#),
        )
            .into_response(),
        Reply::Hang(duration) => {
            tokio::time::sleep(duration).await;
            (StatusCode::OK, "{}").into_response()
        }
    }
}

/// What an order service decided about one expire of an order, by its own
/// clock ([`expire_order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// It was unpaid and due: cancelled.
    Cancelled,
    /// Paid, already cancelled, or its deadline extended past `due_at`.
    NotUnpaid,
    /// No such order.
    Unknown,
    /// `due_at` is still this far ahead of the service's clock: nothing done.
    Early(Duration),
}

/// An order service's expire, as the contract asks of one: in one
/// transaction, so that one reading of its clock (`now()`) decides, the order
/// is locked, judged and cancelled only if it is unpaid, its deadline was not
/// extended past `due_at`, and `due_at` has passed by the service's clock.
/// Two statements with two readings of the clock would take an order that
/// fell due between them for one that is not unpaid, and nothing would ever
/// cancel it. The testkit's order service and event subscriber both expire
/// through this.
pub async fn expire_order(
    orders: &PgOrderStore,
    order_id: &str,
    due_at: DateTime<Utc>,
) -> Result<Expiry, String> {
    let mut client = orders.client().await.map_err(|e| e.to_string())?;
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let row = tx
        .query_opt(
            "SELECT status = 'unpaid', pay_deadline > $2, $2 > now(), \
             ceil(extract(epoch FROM $2 - now()) * 1000)::bigint \
             FROM orders WHERE id = $1 FOR UPDATE",
            &[&order_id, &due_at],
        )
        .await
        .map_err(|e| e.to_string())?;
    let Some(row) = row else {
        return Ok(Expiry::Unknown);
    };
    let (unpaid, extended, early, due_in_ms): (bool, Option<bool>, bool, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if !unpaid || extended == Some(true) {
        return Ok(Expiry::NotUnpaid);
    }
    if early {
        let due_in = Duration::from_millis(u64::try_from(due_in_ms).unwrap_or(1).max(1));
        return Ok(Expiry::Early(due_in));
    }
    tx.execute(
        "UPDATE orders SET status = 'cancelled', cancelled_at = now() WHERE id = $1",
        &[&order_id],
    )
    .await
    .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())?;
    Ok(Expiry::Cancelled)
}

/// The expire endpoint of the order service ([`Endpoint::order_service`]):
/// [`expire_order`], answered as the contract says: 200, 409, 404, or 425
/// Too Early with the time left (`Retry-After` in whole seconds, `due_in_ms`
/// in the body).
async fn expire(orders: &PgOrderStore, order_id: &str, body: &str) -> Response {
    let due_at = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("due_at")?.as_str()?.parse::<DateTime<Utc>>().ok());
    let Some(due_at) = due_at else {
        return (StatusCode::BAD_REQUEST, format!("no due_at in {body}")).into_response();
    };
    let empty = || "{}".to_owned();
    match expire_order(orders, order_id, due_at).await {
        Ok(Expiry::Cancelled) => (StatusCode::OK, empty()).into_response(),
        Ok(Expiry::NotUnpaid) => (StatusCode::CONFLICT, empty()).into_response(),
        Ok(Expiry::Unknown) => (StatusCode::NOT_FOUND, empty()).into_response(),
        Ok(Expiry::Early(due_in)) => {
            let due_in_ms = due_in.as_millis();
            (
                StatusCode::TOO_EARLY,
                [
                    ("retry-after", due_in_ms.div_ceil(1000).to_string()),
                    ("content-type", "application/json".to_owned()),
                ],
                format!(r#"{{"due_in_ms":{due_in_ms}}}"#),
            )
                .into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

/// Serves `app` on `listener` in a task of its own until `stop` is cancelled:
/// the testkit's HTTP endpoints (this one, the OTLP receiver).
pub(crate) fn serve_until(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
}
