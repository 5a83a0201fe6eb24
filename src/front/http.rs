//! The public Streamable HTTP endpoint (handshake era: 2025-03-26 … 2025-11-25; a
//! sessionless request with 2026-07-28 `_meta` goes to [`super::modern`] instead).
//!
//! POST carries one JSON-RPC message. `initialize` opens a session with a random
//! `Mcp-Session-Id`; every other message needs that header (400 without it, 404 for an
//! unknown or ended session). A request is answered with JSON, or with an SSE stream
//! when progress or log messages for it must flow first. GET opens the session's stream
//! for server-initiated notifications; DELETE ends the session. Origin and Host are
//! checked (403), bodies are bounded (413). Health: `/healthz`, `/readyz`, `/status`.
//!
//! With `[clients.*]` or `[auth.oauth]`, every request to the endpoint needs a bearer
//! token (401 with `WWW-Authenticate` otherwise) and a session belongs to the identity
//! that opened it (404 for anyone else). The RFC 9728 metadata is served with OAuth.

use super::{listen, modern};
use crate::auth::{self, Identity};
use crate::downstream::{Sink, SINK_QUEUE};
use crate::message::{self, code, Id, Kind, Outcome};
use crate::router::{Client, Gateway, SUPPORTED_VERSIONS};
use crate::supervisor::Status;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use dashmap::DashMap;
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// Comment lines sent on idle SSE streams so dead peers are noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// JSON-RPC code for a request the client cancelled (as in LSP).
const REQUEST_CANCELLED: i64 = -32800;

// Parsed once: looking a header up by `&str` parses and validates the name every time.
static SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
static VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// One handshake-era client session.
pub struct Session {
    client: Arc<Client>,
    /// The identity that opened it, when auth is configured; nobody else may use it.
    owner: Option<String>,
    protocol_version: String,
    /// Milliseconds since the gateway started, at the last request.
    last_seen: AtomicU64,
    /// A GET stream is open; server-initiated messages go to exactly one stream.
    get_open: AtomicBool,
}

/// What every handler shares: one `Arc`, since axum clones the state for every request
/// (cloning the fields one by one took a lock, in the `CancellationToken`).
#[derive(Clone)]
pub struct Http(Arc<Shared>);

impl std::ops::Deref for Http {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    gw: Arc<Gateway>,
    /// Keyed by 128-bit random ids the gateway mints, so foldhash (seeded per process) is
    /// safe here and cheaper than SipHash for the lookup every request makes.
    sessions: Arc<DashMap<String, Arc<Session>, foldhash::fast::RandomState>>,
    started: Instant,
    /// Cancelled when shutdown begins: GET streams end then, since they never finish
    /// on their own and would hold the graceful shutdown for its whole grace period.
    closing: CancellationToken,
    /// Stateless calls waiting for their client's answers (multi round-trip requests).
    parked: Arc<crate::mrtr::Parked>,
    /// Open `subscriptions/listen` streams, at most `gateway.max_sessions`.
    listening: Arc<AtomicUsize>,
}

/// One open listen stream, counted while it lives.
struct Listening(Arc<AtomicUsize>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Http {
    pub fn new(gw: Arc<Gateway>) -> Http {
        // Read once: a reload's input_timeout applies after a restart.
        let parked = crate::mrtr::Parked::new(gw.config().gateway.input_timeout);
        Http(Arc::new(Shared {
            gw,
            sessions: Arc::new(DashMap::default()),
            started: Instant::now(),
            closing: CancellationToken::new(),
            parked,
            listening: Arc::new(AtomicUsize::new(0)),
        }))
    }

    /// Ends every open GET stream; called when shutdown begins.
    pub fn close_streams(&self) {
        self.closing.cancel();
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Ends sessions idle for longer than `gateway.session_idle`; run periodically.
    pub fn expire_idle(&self) {
        let now = self.now_ms();
        let idle = u64::try_from(self.gw.config().gateway.session_idle.as_millis()).unwrap_or(u64::MAX);
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|s| {
                !s.get_open.load(Ordering::Relaxed) && now.saturating_sub(s.last_seen.load(Ordering::Relaxed)) >= idle
            })
            .map(|s| s.key().clone())
            .collect();
        for id in expired {
            info!(session = %id, "session expired");
            self.end_session(&id);
        }
    }

    /// Ends a session: its requests are cancelled and its subscriptions dropped.
    pub fn end_session(&self, sid: &str) {
        if let Some((_, s)) = self.sessions.remove(sid) {
            s.client.cancel_all();
            let (gw, client) = (self.gw.clone(), s.client.clone());
            tokio::spawn(async move { gw.forget_client(&client).await });
        }
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

/// The axum app: the MCP endpoint at the configured path plus health routes.
pub fn app(http: Http) -> Router {
    let path = http.gw.config().gateway.path.clone();
    let limit = http.gw.config().gateway.max_body;
    let mcp = axum::routing::MethodRouter::new()
        .get(get_stream)
        .post(post)
        .delete(delete);
    Router::new()
        .route(&path, mcp)
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route(auth::METADATA_PATH, get(resource_metadata))
        .route(&format!("{}{path}", auth::METADATA_PATH), get(resource_metadata))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(http)
}

/// The per-IP limit, checked first by each MCP endpoint handler, before a body is read
/// or parsed: 429 with `Retry-After`. (A plain call rather than a middleware layer, which
/// cloned a boxed service and boxed a future for every request.)
#[allow(clippy::result_large_err)]
fn per_ip(http: &Http, extensions: &axum::http::Extensions) -> Result<(), Response> {
    let peer = extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
    if let Some(axum::extract::ConnectInfo(addr)) = peer {
        if let Err(l) = http.gw.topology().limits.check_ip(addr.ip()) {
            http.gw.metrics.rate_limited(&l.what);
            let secs = l.retry_after.as_secs_f64().ceil().max(1.0);
            let mut resp = rpc_error(StatusCode::TOO_MANY_REQUESTS, code::RATE_LIMITED, &l.message());
            if let Ok(v) = HeaderValue::from_str(&format!("{secs:.0}")) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return Err(resp);
        }
    }
    Ok(())
}

/// A JSON-RPC error as an HTTP response with no id.
fn rpc_error(status: StatusCode, code: i64, msg: &str) -> Response {
    Reject {
        status,
        code,
        message: msg.to_owned(),
        data: None,
    }
    .answer(&Id::NULL)
}

/// A request refused before it reaches the router: an HTTP status plus a JSON-RPC error.
struct Reject {
    status: StatusCode,
    code: i64,
    message: String,
    data: Option<Value>,
}

impl Reject {
    fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Reject {
        Reject {
            status,
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The error response, echoing the request's id when there is one.
    fn answer(self, id: &Id) -> Response {
        let body = message::response(
            id,
            &Outcome::Error(message::error_object(self.code, &self.message, self.data)),
        );
        (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        self.answer(&Id::NULL)
    }
}

fn json_response(body: impl Into<Body>) -> Response {
    let body: Body = body.into();
    // A static header value: a `&str` here would be copied into a new buffer per response.
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

/// Checks Origin (when present) and Host against localhost and the configured lists.
fn check_origin_host(gw: &Gateway, headers: &HeaderMap) -> Result<(), Reject> {
    let config = gw.config();
    let g = &config.gateway;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let ok = g.allowed_origins.iter().any(|o| o == origin)
            || origin
                .split_once("://")
                .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && is_local_host(rest));
        if !ok {
            return Err(Reject::new(
                StatusCode::FORBIDDEN,
                code::INVALID_REQUEST,
                format!("origin {origin} is not allowed"),
            ));
        }
    }
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().unwrap_or("");
        let ok = is_local_host(host)
            || g.allowed_hosts
                .iter()
                .any(|h| h == host || host.rsplit_once(':').is_some_and(|(name, _)| name == h));
        if !ok {
            return Err(Reject::new(
                StatusCode::FORBIDDEN,
                code::INVALID_REQUEST,
                format!("host {host} is not allowed"),
            ));
        }
    }
    Ok(())
}

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_local_host(hostport: &str) -> bool {
    let host = if let Some(rest) = hostport.strip_prefix('[') {
        rest.split_once(']').map_or("", |(h, _)| h)
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

/// The public URL of the MCP endpoint, for OAuth metadata and challenges.
fn resource_url(http: &Http, headers: &HeaderMap) -> String {
    let config = http.gw.config();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    auth::resource_url(config.auth.oauth.as_ref(), host, &config.gateway.path)
}

/// Who is calling: `Ok(None)` when no auth is configured; a 401 response (echoing the
/// request's id, if `body` is one) when a token is needed and missing or not accepted.
async fn identify(http: &Http, headers: &HeaderMap, body: &[u8]) -> Result<Option<Arc<Identity>>, Response> {
    let authn = http.gw.topology().auth.clone();
    if !authn.required() {
        return Ok(None);
    }
    let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match authn.authenticate(value).await {
        Ok(identity) => Ok(Some(identity)),
        Err(denied) => {
            debug!(reason = %denied, "request refused: not authenticated");
            let id = match Kind::parse(body) {
                Ok(Kind::Request { id, .. }) => id,
                _ => Id::NULL,
            };
            let mut resp = Reject::new(StatusCode::UNAUTHORIZED, code::INVALID_REQUEST, denied.to_string()).answer(&id);
            let challenge = authn.challenge(&denied, &resource_url(http, headers));
            if let Ok(v) = HeaderValue::from_str(&challenge) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            Err(resp)
        }
    }
}

/// `GET /.well-known/oauth-protected-resource`: RFC 9728 metadata (404 without OAuth).
async fn resource_metadata(State(http): State<Http>, headers: HeaderMap) -> Response {
    let authn = http.gw.topology().auth.clone();
    match authn.metadata(&resource_url(&http, &headers)) {
        Some(doc) => json_response(doc.to_string().into_bytes()),
        None => rpc_error(StatusCode::NOT_FOUND, code::INVALID_REQUEST, "no OAuth configured"),
    }
}

/// Finds the session a request names: 400 without the header, 404 when unknown or
/// when it belongs to another identity (not found, for them).
fn session(http: &Http, headers: &HeaderMap, who: Option<&Arc<Identity>>) -> Result<(String, Arc<Session>), Reject> {
    let Some(id) = headers.get(&SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        return Err(Reject::new(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "missing Mcp-Session-Id header: send initialize first",
        ));
    };
    match http.sessions.get(id) {
        Some(s) if s.owner.as_deref() == who.map(|i| i.name.as_str()) => {
            s.last_seen.store(http.now_ms(), Ordering::Relaxed);
            if who.is_some() {
                // The same name, with the policy of the config now in force.
                s.client.set_identity(who.cloned());
            }
            Ok((id.to_owned(), s.clone()))
        }
        _ => Err(Reject::new(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "unknown or ended session",
        )),
    }
}

fn check_version(headers: &HeaderMap) -> Result<(), Reject> {
    match headers.get(&VERSION_HEADER).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(()),
        Some(v) if SUPPORTED_VERSIONS.contains(&v) => Ok(()),
        Some(v) => Err(Reject::new(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            format!(
                "unsupported MCP-Protocol-Version {v:?}; supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        )),
    }
}

/// 128 bits from the OS CSPRNG, as 32 hex characters.
fn new_session_id() -> String {
    use rand::RngCore;
    // ThreadRng is a CSPRNG (ChaCha12) seeded from the OS.
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn post(State(http): State<Http>, req: axum::extract::Request) -> Response {
    // Taken apart, not extracted: the `HeaderMap` and `Extensions` extractors clone.
    let (parts, body) = req.into_parts();
    let (headers, extensions) = (parts.headers, parts.extensions);
    if let Err(r) = per_ip(&http, &extensions) {
        return r;
    }
    if let Err(r) = check_origin_host(&http.gw, &headers) {
        return r.into_response();
    }
    let limits = &http.gw.config().gateway;
    // A client that trickles its body is cut off; one that sends too much gets 413.
    let body = match tokio::time::timeout(limits.body_timeout, axum::body::to_bytes(body, limits.max_body)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return rpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                code::INVALID_REQUEST,
                &format!("the request body is over the {} byte limit", limits.max_body),
            )
        }
        Err(_) => {
            return rpc_error(
                StatusCode::REQUEST_TIMEOUT,
                code::INVALID_REQUEST,
                "the request body took too long to arrive",
            )
        }
    };
    let who = match identify(&http, &headers, &body).await {
        Ok(w) => w,
        Err(resp) => return resp,
    };
    let msg = match Kind::parse(&body) {
        Ok(m) => m,
        Err(e) => {
            let msg = if body.first() == Some(&b'[') {
                "batches are not supported: send one JSON-RPC message per POST".to_owned()
            } else {
                e.to_string()
            };
            return rpc_error(StatusCode::BAD_REQUEST, e.code(), &msg);
        }
    };
    if !headers.contains_key(&SESSION_HEADER) {
        let stateless = match &msg {
            Kind::Request { method, params, .. } => modern::is_modern(&headers, method, params.as_deref()),
            _ => {
                headers
                    .get(&VERSION_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    == Some(modern::VERSION)
            }
        };
        if stateless {
            let peer = extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip());
            return serve_stateless(http, &headers, msg, who, peer).await;
        }
    }
    if let Kind::Request { id, method, params } = &msg {
        if method == "initialize" {
            return initialize(&http, id, params.as_deref(), who);
        }
    }
    let id = match &msg {
        Kind::Request { id, .. } => id.clone(),
        _ => Id::NULL,
    };
    let (sid, session) = match session(&http, &headers, who.as_ref()) {
        Ok(s) => s,
        Err(r) => return r.answer(&id),
    };
    if let Err(r) = check_version(&headers) {
        return r.answer(&id);
    }
    match msg {
        Kind::Notification { method, params } => {
            http.gw.notification(&session.client, &method, params.as_deref());
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Response { id, outcome } => {
            if !session.client.answer(id.as_ref(), outcome) {
                debug!(session = %sid, "dropping a client response: no server→client request has its id");
            }
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Request { id, method, params } => {
            let parent = crate::telemetry::from_headers(&headers);
            request(http, session.client.clone(), id, method, params, parent, None).await
        }
    }
}

/// A 2026-07-28 (stateless) request: validated and decorated by [`modern`], run as an
/// ephemeral client named after the caller's identity (with auth) or IP address.
async fn serve_stateless(
    http: Http,
    headers: &HeaderMap,
    msg: Kind,
    who: Option<Arc<Identity>>,
    peer: Option<std::net::IpAddr>,
) -> Response {
    let (id, method, params) = match msg {
        Kind::Request { id, method, params } => (id, method, params),
        // No client notification is defined for 2026-07-28 over HTTP: accepted, ignored.
        Kind::Notification { .. } => return StatusCode::ACCEPTED.into_response(),
        Kind::Response { .. } => {
            return Reject::new(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                "a 2026-07-28 client sends no responses (servers ask nothing of it here)",
            )
            .into_response()
        }
    };
    let topo = http.gw.topology();
    // A tool the caller's allowlist hides is not looked at (it is answered as unknown).
    let tool_schema = |name: &str| -> Option<Value> {
        if !who.as_ref().is_none_or(|i| i.permits(name)) {
            return None;
        }
        let route = topo.catalog.tools.get(name)?;
        let state = topo.servers.get(route.server)?.state();
        let tool = state
            .lists
            .tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(&route.name))?;
        tool.get("inputSchema").cloned()
    };
    let prepared = match modern::prepare(Some(headers), &method, params.as_deref(), tool_schema) {
        Ok(p) => p,
        Err(r) => {
            return Reject {
                status: r.status,
                code: r.code,
                message: r.message,
                data: r.data,
            }
            .answer(&id)
        }
    };
    let private = topo.auth.required();
    let init = http.gw.initialize_result_for(None, who.as_deref());
    if method == "server/discover" {
        return json_response(message::response(&id, &modern::discover(&init, private)));
    }
    let key = match (&who, peer) {
        (Some(i), _) => i.name.clone(),
        (None, Some(ip)) => ip.to_string(),
        (None, None) => "unknown".to_owned(),
    };
    if method == "subscriptions/listen" {
        return listen(&http, headers, id, prepared, who, &key, init, private);
    }
    let client = Client::new(format!("stateless:{key}")).stateless(prepared.capabilities, prepared.log_rank);
    let _ = client.protocol_version.set(modern::VERSION.to_owned());
    client.set_identity(who);
    let parent = crate::telemetry::from_headers(headers);
    if crate::mrtr::may_ask(&method) {
        return multi_round(
            http,
            client,
            id,
            method,
            prepared.params,
            key,
            parent,
            init,
            private,
            prepared.uri,
        )
        .await;
    }
    let uri = prepared.uri;
    let name = method.clone();
    let hint = topo.catalog.hint(&method);
    let finish: Finish = Box::new(move |out| modern::finish_cached(&name, out, &init, private, uri.as_deref(), hint));
    request(
        http,
        Arc::new(client),
        id,
        method,
        prepared.params,
        parent,
        Some(finish),
    )
    .await
}

/// An answer as SSE: `first`, then the rest of the messages (the response last).
fn sse_answer(first: bytes::Bytes, rest: impl futures::Stream<Item = bytes::Bytes> + Send + 'static) -> Response {
    let events = futures::stream::once(async move { first })
        .chain(rest)
        .map(|m| Ok::<_, std::io::Error>(bytes::Bytes::from(event(&m))));
    sse_response(Body::from_stream(events))
}

fn task_failed() -> Response {
    rpc_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        code::INTERNAL_ERROR,
        "request task failed",
    )
}

/// A stateless answer as JSON. -32020, -32021 and -32022 (a server's own included) are
/// 400 on HTTP in 2026-07-28.
fn stateless_json(answer: bytes::Bytes) -> Response {
    let status = match Kind::parse(&answer) {
        Ok(Kind::Response {
            outcome: Outcome::Error(e),
            ..
        }) if matches!(message::error_summary(&e).0, -32022..=-32020) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    (status, json_response(answer)).into_response()
}

/// A stateless `tools/call`, `prompts/get` or `resources/read`, whose server may ask the
/// client questions: they come back as `input_required`, and a retry with `requestState`
/// resumes the parked call (see [`crate::mrtr`]). Closing the response cancels the call.
#[allow(clippy::too_many_arguments)]
async fn multi_round(
    http: Http,
    client: Client,
    id: Id,
    method: String,
    params: Option<Box<serde_json::value::RawValue>>,
    principal: String,
    parent: Option<opentelemetry::Context>,
    init: Outcome,
    private: bool,
    uri: Option<String>,
) -> Response {
    let started = crate::mrtr::Round {
        gw: http.gw.clone(),
        parked: http.parked.clone(),
        id: id.clone(),
        method,
        principal,
        init,
        private,
        uri,
    }
    .start(client, params, parent);
    let rounds = match started {
        Ok(r) => r,
        Err(refused) => return json_response(message::response(&id, &refused)),
    };
    let mut rounds = Box::pin(rounds);
    match rounds.next().await {
        Some((true, answer)) => stateless_json(answer),
        Some((false, first)) => sse_answer(first, rounds.map(|(_, m)| m)),
        None => task_failed(),
    }
}

/// `subscriptions/listen`: an SSE stream of the notifications asked for (see
/// [`super::listen`]), with keep-alive comments; it ends gracefully at shutdown.
#[allow(clippy::too_many_arguments)]
fn listen(
    http: &Http,
    headers: &HeaderMap,
    id: Id,
    prepared: modern::Prepared,
    who: Option<Arc<Identity>>,
    key: &str,
    init: Outcome,
    private: bool,
) -> Response {
    static LISTENS: AtomicU64 = AtomicU64::new(1);
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream") || a.contains("*/*"));
    if !sse {
        return Reject::new(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "subscriptions/listen answers with a stream: send Accept: text/event-stream",
        )
        .answer(&id);
    }
    let filter = match message::params_object(prepared.params.as_deref()).and_then(|p| listen::Filter::parse(&p)) {
        Ok(f) => f,
        Err(e) => {
            return json_response(message::response(
                &id,
                &Outcome::Error(message::error_object(code::INVALID_PARAMS, &e, None)),
            ))
        }
    };
    let max = http.gw.config().gateway.max_sessions;
    if http.listening.fetch_add(1, Ordering::Relaxed) >= max {
        http.listening.fetch_sub(1, Ordering::Relaxed);
        return Reject::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            format!(
                "the gateway has {max} open listen streams, its limit (gateway.max_sessions); close one or try later"
            ),
        )
        .answer(&id);
    }
    let counted = Listening(http.listening.clone());
    let n = LISTENS.fetch_add(1, Ordering::Relaxed);
    let client = Client::new(format!("stateless:{key}:listen-{n}")).stateless(prepared.capabilities, None);
    let _ = client.protocol_version.set(modern::VERSION.to_owned());
    client.set_identity(who);
    let l = listen::Listen {
        gw: http.gw.clone(),
        client: Arc::new(client),
        id,
        filter,
        closing: http.closing.clone(),
        cancel: CancellationToken::new(),
        finish: Box::new(move |out| modern::finish("subscriptions/listen", out, &init, private, None)),
    };
    let (tx, rx) = mpsc::channel::<bytes::Bytes>(SINK_QUEUE);
    let keepalive = Some((KEEPALIVE, bytes::Bytes::from_static(b": keep-alive\n\n")));
    let run = listen::run(l, tx, |m| bytes::Bytes::from(event(m)), keepalive);
    tokio::spawn(async move {
        let _counted = counted;
        run.await
    });
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        let m = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(m), rx))
    });
    sse_response(Body::from_stream(frames))
}

/// Rewrites a request's outcome before it is sent (the stateless era decorates results).
type Finish = Box<dyn FnOnce(Outcome) -> Outcome + Send>;

fn initialize(
    http: &Http,
    id: &Id,
    params: Option<&serde_json::value::RawValue>,
    who: Option<Arc<Identity>>,
) -> Response {
    let max = http.gw.config().gateway.max_sessions;
    if http.sessions.len() >= max {
        return Reject::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            format!("the gateway has {max} open sessions, its limit (gateway.max_sessions); end one or try later"),
        )
        .answer(id);
    }
    let outcome = http.gw.initialize_result_for(params, who.as_deref());
    let version = match &outcome {
        Outcome::Result(r) => serde_json::from_str::<Value>(r.get())
            .ok()
            .and_then(|v| v.get("protocolVersion").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default(),
        Outcome::Error(_) => String::new(),
    };
    let sid = new_session_id();
    let owner = who.as_ref().map(|i| i.name.clone());
    let client_name = owner.clone();
    let session = Session {
        client: {
            let c = Arc::new(Client::new(sid.clone()));
            c.set_capabilities(params);
            let _ = c.protocol_version.set(version.clone());
            c.set_identity(who);
            c
        },
        owner,
        protocol_version: version.clone(),
        last_seen: AtomicU64::new(http.now_ms()),
        get_open: AtomicBool::new(false),
    };
    http.sessions.insert(sid.clone(), Arc::new(session));
    match &client_name {
        Some(client) => info!(session = %sid, %version, %client, "session opened"),
        None => info!(session = %sid, %version, "session opened"),
    }
    let mut resp = json_response(message::response(id, &outcome));
    if let Ok(v) = HeaderValue::from_str(&sid) {
        resp.headers_mut().insert(SESSION_HEADER.clone(), v);
    }
    resp
}

/// Runs one request; answers with JSON if nothing else has to be sent first, else SSE.
async fn request(
    http: Http,
    client: Arc<Client>,
    id: Id,
    method: String,
    params: Option<Box<serde_json::value::RawValue>>,
    parent: Option<opentelemetry::Context>,
    finish: Option<Finish>,
) -> Response {
    let (sink, mut related) = mpsc::channel::<bytes::Bytes>(SINK_QUEUE);
    let gw = http.gw.clone();
    let stateless = finish.is_some();
    let mut task = Detached(Some(Box::pin(async move {
        let out = gw
            .request(&client, &id, &method, params, Some(Sink::new(sink)), parent)
            .await;
        let out = out.unwrap_or_else(|| {
            Outcome::Error(message::error_object(
                REQUEST_CANCELLED,
                "request cancelled by the client",
                None,
            ))
        });
        let out = match finish {
            Some(f) => f(out),
            None => out,
        };
        message::Answer::new(&id, out)
    })));
    // The request runs right here, without a task of its own, until the first thing to
    // send is known: the answer (the usual case: plain JSON), or a related message (then
    // it moves to a task, and the answer follows on an SSE stream).
    enum First {
        Answer(message::Answer),
        Related(bytes::Bytes),
    }
    let first = {
        let Some(fut) = task.0.as_mut() else {
            return task_failed();
        };
        let mut open = true;
        loop {
            tokio::select! {
                biased;
                m = related.recv(), if open => match m {
                    Some(m) => break First::Related(m),
                    None => open = false,
                },
                out = &mut *fut => break First::Answer(out),
            }
        }
    };
    match first {
        First::Answer(answer) => {
            task.0 = None;
            match related.try_recv() {
                // (A large answer is a result, never one of the errors that change the status.)
                Err(_) if stateless && matches!(answer, message::Answer::Whole(_)) => {
                    stateless_json(answer.into_vec().into())
                }
                Err(_) => json_response(answer_body(answer)),
                // Related messages queued before the answer go out before it, on SSE.
                Ok(m) => {
                    let rest = std::iter::from_fn(move || related.try_recv().ok());
                    let answer = answer.into_vec().into();
                    let rest = futures::stream::iter(rest.chain(std::iter::once(answer)));
                    sse_answer(m, rest)
                }
            }
        }
        First::Related(m) => {
            let (done_tx, done) = oneshot::channel::<Vec<u8>>();
            if let Some(fut) = task.0.take() {
                tokio::spawn(async move {
                    let _ = done_tx.send(fut.await.into_vec());
                });
            }
            sse_answer(m, outgoing(related, done).map(|(_, m)| m))
        }
    }
}

/// A request still running, with the answer it will make. Dropped unfinished (the client
/// went away), it goes on in a task of its own, as if it had been spawned.
struct Detached(Option<std::pin::Pin<Box<dyn std::future::Future<Output = message::Answer> + Send>>>);

/// A JSON answer's body. A large result goes to the socket from its own buffer, after the
/// head and before the closing brace, with its length known (Content-Length).
fn answer_body(answer: message::Answer) -> Body {
    match answer {
        message::Answer::Whole(v) => Body::from(v),
        message::Answer::Parts(head, result) => Body::new(Chunks::new([
            bytes::Bytes::from(head),
            result,
            bytes::Bytes::from_static(b"}"),
        ])),
    }
}

/// A body of a few buffers sent as they are, with their total length known.
struct Chunks {
    parts: std::collections::VecDeque<bytes::Bytes>,
    left: u64,
}

impl Chunks {
    fn new<const N: usize>(parts: [bytes::Bytes; N]) -> Chunks {
        let left = parts.iter().map(|b| b.len() as u64).sum();
        Chunks {
            parts: parts.into_iter().filter(|b| !b.is_empty()).collect(),
            left,
        }
    }
}

impl axum::body::HttpBody for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let next = this.parts.pop_front().map(|b| {
            this.left -= b.len() as u64;
            Ok(hyper::body::Frame::data(b))
        });
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(fut) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    fut.await;
                });
            }
        }
    }
}

/// What one request sends back, in order: related messages, then the answer (flagged
/// `true`). Related messages queued before the answer always go out before it.
fn outgoing(
    related: mpsc::Receiver<bytes::Bytes>,
    done: oneshot::Receiver<Vec<u8>>,
) -> impl futures::Stream<Item = (bool, bytes::Bytes)> {
    enum Answer {
        Pending(oneshot::Receiver<Vec<u8>>),
        Ready(Vec<u8>),
        Sent,
    }
    futures::stream::unfold((related, Answer::Pending(done)), |(mut rx, answer)| async move {
        match answer {
            Answer::Sent => None,
            Answer::Ready(out) => match rx.try_recv() {
                Ok(m) => Some(((false, m), (rx, Answer::Ready(out)))),
                Err(_) => Some(((true, bytes::Bytes::from(out)), (rx, Answer::Sent))),
            },
            Answer::Pending(mut done) => tokio::select! {
                biased;
                Some(m) = rx.recv() => Some(((false, m), (rx, Answer::Pending(done)))),
                out = &mut done => {
                    let out = out.ok()?;
                    match rx.try_recv() {
                        Ok(m) => Some(((false, m), (rx, Answer::Ready(out)))),
                        Err(_) => Some(((true, bytes::Bytes::from(out)), (rx, Answer::Sent))),
                    }
                }
            },
        }
    })
}

/// One JSON-RPC message framed as an SSE `message` event.
fn event(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + 24);
    out.extend_from_slice(b"event: message\n");
    for line in json.split(|&b| b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// The checks every bodyless MCP request passes first (GET, DELETE): the per-IP limit,
/// Origin and Host, and who the caller is. Returns its headers and identity.
async fn admit_bodyless(
    http: &Http,
    req: axum::extract::Request,
) -> Result<(HeaderMap, Option<Arc<Identity>>), Response> {
    let (parts, _) = req.into_parts();
    let (headers, extensions) = (parts.headers, parts.extensions);
    per_ip(http, &extensions)?;
    check_origin_host(&http.gw, &headers).map_err(IntoResponse::into_response)?;
    let who = identify(http, &headers, b"").await?;
    Ok((headers, who))
}

/// GET: the session's stream of server-initiated messages (list_changed).
async fn get_stream(State(http): State<Http>, req: axum::extract::Request) -> Response {
    let (headers, who) = match admit_bodyless(&http, req).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let accepts = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream") || a.contains("*/*"));
    if !accepts {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "GET needs Accept: text/event-stream",
        );
    }
    let (sid, session) = match session(&http, &headers, who.as_ref()) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_version(&headers) {
        return r.into_response();
    }
    if session.get_open.swap(true, Ordering::AcqRel) {
        return rpc_error(
            StatusCode::CONFLICT,
            code::INVALID_REQUEST,
            "this session already has an open GET stream",
        );
    }
    struct Open(Arc<Session>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.get_open.store(false, Ordering::Release);
        }
    }
    let open = Open(session);
    let rx = http.gw.subscribe();
    let own = open.0.client.subscribe_own();
    let closing = http.closing.clone();
    let ender = http.clone();
    let stream = futures::stream::unfold((rx, own, open), move |(mut rx, mut own, open)| {
        let closing = closing.clone();
        let ender = ender.clone();
        let sid = sid.clone();
        async move {
            let next = tokio::select! {
                _ = closing.cancelled() => return None,
                next = tokio::time::timeout(KEEPALIVE, rx.recv()) => next,
                // This session's own messages (resources it subscribed to).
                next = own.recv() => Ok(next),
            };
            match next {
                Ok(Ok(m)) => Some((Ok::<_, std::io::Error>(bytes::Bytes::from(event(&m))), (rx, own, open))),
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(n))) => {
                    // Its queue is full: this client cannot keep up. End its session (it
                    // will initialize again) rather than let it fall behind silently.
                    tracing::warn!(session = %sid, missed = n, "GET stream cannot keep up; ending the session");
                    ender.end_session(&sid);
                    None
                }
                Ok(Err(_)) => None,
                Err(_) => Some((Ok(bytes::Bytes::from_static(b": keep-alive\n\n")), (rx, own, open))),
            }
        }
    });
    sse_response(Body::from_stream(stream))
}

async fn delete(State(http): State<Http>, req: axum::extract::Request) -> Response {
    let (headers, who) = match admit_bodyless(&http, req).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    let (sid, _) = match session(&http, &headers, who.as_ref()) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    info!(session = %sid, "session ended by the client");
    http.end_session(&sid);
    StatusCode::OK.into_response()
}

async fn readyz(State(http): State<Http>) -> Response {
    if http.gw.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Per-server state as JSON. Never includes env values, headers or expanded URLs.
fn status_json(http: &Http) -> Value {
    let servers: Vec<Value> = http
        .gw
        .topology()
        .servers
        .iter()
        .map(|s| {
            let st = s.state();
            let state = match &st.status {
                Status::Disabled => "disabled",
                Status::Starting => "starting",
                Status::Ready => "ready",
                Status::Down(_) => "down",
                Status::Failed(_) => "failed",
                Status::Stopped => "stopped",
            };
            let url = match &s.cfg.transport {
                crate::config::Transport::Http(h) => Some(h.url_display.clone()),
                crate::config::Transport::Stdio(_) => None,
            };
            json!({
                "name": s.cfg.name,
                "state": state,
                "transport": s.cfg.transport.kind(),
                "url": url,
                "prefix": s.settings().prefix.clone(),
                "pid": st.conn.as_ref().and_then(|c| c.pid()),
                "protocolVersion": st.info.as_ref().map(|i| i.protocol_version.clone()),
                "uptimeSeconds": st.since.filter(|_| st.status == Status::Ready).map(|t| t.elapsed().as_secs()),
                "tools": st.lists.tools.len(),
                "prompts": st.lists.prompts.len(),
                "resources": st.lists.resources.len(),
                "restarts": s.restarts.load(Ordering::Relaxed),
                "isolation": match s.cfg.isolation {
                    crate::config::Isolation::Shared => "shared",
                    crate::config::Isolation::Session => "session",
                },
                "sessionProcesses": s.session_processes(),
                "lastError": st.last_error,
            })
        })
        .collect();
    let mut by_version: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for s in http.sessions.iter() {
        *by_version.entry(s.protocol_version.clone()).or_default() += 1;
    }
    json!({ "servers": servers, "sessions": http.sessions.len(), "sessionsByVersion": by_version })
}

async fn status(State(http): State<Http>) -> Response {
    json_response(status_json(&http).to_string().into_bytes())
}

/// A small HTML page showing what `/status` shows.
async fn status_page(State(http): State<Http>) -> Response {
    let status = status_json(&http);
    let mut rows = String::new();
    for s in status["servers"].as_array().into_iter().flatten() {
        let cell = |k: &str| match &s[k] {
            Value::Null => String::new(),
            Value::String(v) => html_escape(v),
            other => html_escape(&other.to_string()),
        };
        rows.push_str(&format!(
            "<tr class=\"{state}\"><td>{name}</td><td>{state}</td><td>{transport}</td><td>{pid}</td><td>{up}</td><td>{tools}</td><td>{prompts}</td><td>{resources}</td><td>{restarts}</td><td>{err}</td></tr>\n",
            name = cell("name"),
            state = cell("state"),
            transport = cell("transport"),
            pid = cell("pid"),
            up = cell("uptimeSeconds"),
            tools = cell("tools"),
            prompts = cell("prompts"),
            resources = cell("resources"),
            restarts = cell("restarts"),
            err = cell("lastError"),
        ));
    }
    let page = format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>mcp-gateway</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
tr.ready td:nth-child(2){{color:#070}}tr.down td:nth-child(2){{color:#b00}}</style></head>
<body><h1>mcp-gateway {version}</h1>
<p>Endpoint <code>{path}</code> · {sessions} session(s) · <a href="/status">/status</a> · <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a></p>
<table><tr><th>server</th><th>state</th><th>transport</th><th>pid</th><th>uptime (s)</th><th>tools</th><th>prompts</th><th>resources</th><th>restarts</th><th>last error</th></tr>
{rows}</table></body></html>
"#,
        version = env!("CARGO_PKG_VERSION"),
        path = html_escape(&http.gw.config().gateway.path),
        sessions = status["sessions"],
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Prometheus text exposition.
async fn metrics(State(http): State<Http>) -> Response {
    let topo = http.gw.topology();
    let servers: Vec<_> = topo
        .servers
        .iter()
        .map(|s| {
            let up = s.state().status == Status::Ready;
            let restarts = s.restarts.load(Ordering::Relaxed);
            (s.cfg.name.as_str(), s.cfg.transport.kind(), up, restarts)
        })
        .collect();
    let snap = crate::metrics::Snapshot {
        sessions: http.sessions.len(),
        servers,
    };
    let body = http.gw.metrics.render(&snap);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Accepts connections and serves the gateway on each (HTTP/1.1, keep-alive,
/// `TCP_NODELAY`) until `stop` turns true; then stops accepting, lets requests in flight
/// finish, and returns once every connection has closed. A client gets `header_timeout`
/// to send its request headers.
///
/// A POST to the MCP path, nearly all of the traffic, goes straight to its handler; the
/// axum router (routing, boxing, response mapping: about a tenth of a call's
/// instructions) serves everything else.
pub async fn serve(
    listener: tokio::net::TcpListener,
    http: Http,
    header_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use futures::future::{Either, FutureExt};
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let path: Arc<str> = http.gw.config().gateway.path.as_str().into();
    let app = app(http.clone());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let _ = stream.set_nodelay(true);
        let (app, http, path) = (app.clone(), http.clone(), path.clone());
        let service = hyper::service::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
            let direct = req.method() == axum::http::Method::POST && req.uri().path() == &*path;
            let req = req.map(Body::new);
            if direct {
                Either::Left(post(State(http.clone()), req).map(Ok::<_, std::convert::Infallible>))
            } else {
                Either::Right(app.clone().oneshot(req))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
