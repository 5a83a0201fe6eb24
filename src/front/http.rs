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

use super::replay::{self, Replay, Resumed};
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
use crate::error::code::REQUEST_CANCELLED;

// Parsed once: looking a header up by `&str` parses and validates the name every time.
static SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
static VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// One handshake-era client session.
pub struct Session {
    client: Arc<Client>,
    /// The identity that opened it, when auth is configured; nobody else may use it.
    owner: Option<String>,
    /// Whose share of `gateway.max_sessions_per_client` it is (see [`share_of`]).
    share: Arc<str>,
    protocol_version: String,
    /// Milliseconds since the gateway started, at the last request.
    last_seen: AtomicU64,
    /// A GET stream is open; server-initiated messages go to exactly one stream.
    get_open: AtomicBool,
    /// The open GET stream's connection: its number, and how to end it (a GET resuming
    /// the stream takes it over from a connection the gateway has not seen die yet).
    get_conn: std::sync::Mutex<Option<(u64, CancellationToken)>>,
    /// Its SSE streams' events, for `Last-Event-ID`; made by its first SSE stream.
    replay: std::sync::OnceLock<Arc<Replay>>,
    /// Its protocol version (2025-11-25 or later) has priming events and `retry`.
    priming: bool,
}

impl Session {
    fn replay(&self) -> Arc<Replay> {
        self.replay.get_or_init(Default::default).clone()
    }
}

/// The first protocol version whose SSE streams start with a priming event.
const PRIMING_SINCE: &str = "2025-11-25";
/// A call of a 2025-11-25 session not answered within this long is answered on SSE (it
/// starts with the priming event), so a dropped connection can be resumed.
const SSE_AFTER: Duration = Duration::from_millis(100);

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
    /// Cancelled when shutdown begins: GET streams end then (each once its session's
    /// calls are answered), since they never finish on their own and would hold the
    /// graceful shutdown for its whole grace period.
    closing: CancellationToken,
    /// Stateless calls waiting for their client's answers (multi round-trip requests).
    parked: Arc<crate::mrtr::Parked>,
    /// Open `subscriptions/listen` streams, at most `gateway.max_sessions`.
    listening: Arc<AtomicUsize>,
    /// Open sessions per identity (see [`share_of`]), at most
    /// `gateway.max_sessions_per_client` each; an identity with none has no entry.
    shares: DashMap<Arc<str>, usize>,
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
            shares: DashMap::new(),
        }))
    }

    /// Ends every open GET stream once its session has no call in flight (its client may
    /// need the stream until its answers are in); called when shutdown begins.
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
            self.release_share(&s.share);
            s.client.cancel_all();
            let (gw, client) = (self.gw.clone(), s.client.clone());
            tokio::spawn(async move { gw.forget_client(&client).await });
        }
    }

    /// Counts one more session for `share`, unless it already has `max`.
    fn take_share(&self, share: &Arc<str>, max: usize) -> bool {
        let mut n = self.shares.entry(share.clone()).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn release_share(&self, share: &Arc<str>) {
        if let Some(mut n) = self.shares.get_mut(share) {
            *n = n.saturating_sub(1);
        }
        self.shares.remove_if(share, |_, n| *n == 0);
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

/// Past `gateway.max_body`, at least this much more of a body is read and dropped
/// before the 413 (see [`post`]).
const DRAIN_MIN: usize = 1 << 20;

/// Reads `body` to its end, dropping it; false when it is longer than `max` (or fails):
/// then the connection is left for hyper to close.
async fn drain(body: &mut Body, max: usize) -> bool {
    let mut left = max;
    while let Some(frame) = http_body_util::BodyExt::frame(body).await {
        let Ok(frame) = frame else { return false };
        if let Some(data) = frame.data_ref() {
            match left.checked_sub(data.len()) {
                Some(l) => left = l,
                None => return false,
            }
        }
    }
    true
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

/// Headers an MCP request may carry at most once. A second copy is refused (400) rather
/// than one of them picked: which one wins would depend on who reads them (a proxy in
/// front may check the last `Authorization`, the gateway the first).
fn check_single(headers: &HeaderMap) -> Result<(), Reject> {
    // Nothing repeated at all, the usual case: no lookups.
    if headers.len() == headers.keys_len() {
        return Ok(());
    }
    let single: [(&HeaderName, &str); 5] = [
        (&header::AUTHORIZATION, "Authorization"),
        (&header::ORIGIN, "Origin"),
        (&header::CONTENT_TYPE, "Content-Type"),
        (&SESSION_HEADER, "Mcp-Session-Id"),
        (&VERSION_HEADER, "MCP-Protocol-Version"),
    ];
    for (name, shown) in single {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(Reject::new(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("more than one {shown} header: send it once"),
            ));
        }
    }
    Ok(())
}

/// An HTTP/1.1 request needs exactly one Host header (RFC 9112 §3.2): 400 otherwise, on
/// every route. HTTP/1.0 has no such rule, and a request without one is still served
/// (old health checkers); the MCP endpoint then has no Host to check.
fn host_problem<B>(req: &axum::http::Request<B>) -> Option<Response> {
    if req.version() < axum::http::Version::HTTP_11 {
        return None;
    }
    let why = match req.headers().get_all(header::HOST).iter().count() {
        1 => return None,
        0 => "no Host header: HTTP/1.1 requires one",
        _ => "more than one Host header: send it once",
    };
    Some(rpc_error(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why))
}

/// Checks Origin (when present) and Host against localhost and the configured lists,
/// after taking each value apart (see [`Authority`]): `http://localhost:1@evil.com` is
/// not a localhost origin, it is not an origin at all.
fn check_origin_host(gw: &Gateway, headers: &HeaderMap) -> Result<(), Reject> {
    check_single(headers)?;
    let config = gw.config();
    let g = &config.gateway;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let ok = match WebOrigin::parse(origin) {
            Some(o) => {
                (o.web() && o.authority.is_local())
                    || g.allowed_origins
                        .iter()
                        .any(|a| WebOrigin::parse(a).is_some_and(|a| a == o))
            }
            None => false,
        };
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
        let Some(a) = Authority::parse(host) else {
            return Err(Reject::new(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("Host {host:?} is not a host[:port]"),
            ));
        };
        let ok = a.is_local()
            || g.allowed_hosts.iter().any(|h| {
                Authority::parse(h)
                    .is_some_and(|allowed| allowed.host == a.host && allowed.port.is_none_or(|p| a.port == Some(p)))
            });
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

/// `host[:port]` taken apart: a DNS name or IPv4 address (letters, digits, `-`, `.`,
/// `_`), or an IPv6 literal in brackets; the port, when given, digits that fit a u16.
/// Anything else (userinfo `a@b`, a path, `%`, spaces, an empty host) does not parse.
#[derive(Debug, PartialEq)]
struct Authority {
    /// Lowercased; an IPv6 literal without its brackets.
    host: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(s: &str) -> Option<Authority> {
        let (host, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (h, after) = rest.split_once(']')?;
                let v6 = !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':')?),
                };
                (v6.then_some(h)?, port)
            }
            None => {
                let (h, port) = match s.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (s, None),
                };
                let name = !h.is_empty()
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
                (name.then_some(h)?, port)
            }
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
            Some(_) => return None,
        };
        Some(Authority {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// `localhost`, `127.0.0.1` or `::1`, on any port.
    fn is_local(&self) -> bool {
        matches!(self.host.as_str(), "localhost" | "127.0.0.1" | "::1")
    }
}

/// An origin, `scheme://host[:port]` (RFC 6454), with the scheme lowercased and a port
/// equal to the scheme's default dropped, so `https://App.example.com:443` and
/// `https://app.example.com` are the same origin. A configured value may end in `/`.
#[derive(Debug, PartialEq)]
struct WebOrigin {
    scheme: String,
    authority: Authority,
}

impl WebOrigin {
    fn parse(s: &str) -> Option<WebOrigin> {
        let (scheme, rest) = s.split_once("://")?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return None;
        }
        let scheme = scheme.to_ascii_lowercase();
        let mut authority = Authority::parse(rest.strip_suffix('/').unwrap_or(rest))?;
        let default = match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        if authority.port.is_some() && authority.port == default {
            authority.port = None;
        }
        Some(WebOrigin { scheme, authority })
    }

    /// http or https: the only schemes a localhost origin is accepted with.
    fn web(&self) -> bool {
        matches!(self.scheme.as_str(), "http" | "https")
    }
}

/// The body of a POST must be JSON: `application/json`, any parameters (`; charset=utf-8`),
/// the media type case-insensitive (RFC 9110 §8.3.1). A missing Content-Type is refused
/// too: the official SDK clients always send it (and the SDKs' own servers refuse
/// requests without it), and a form post or `text/plain` is how a browser page sends a
/// request to localhost without a CORS preflight.
fn check_content_type(headers: &HeaderMap) -> Result<(), Reject> {
    let value = headers.get(header::CONTENT_TYPE);
    let ok = value.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if ok {
        return Ok(());
    }
    let got = match value {
        None => "none".to_owned(),
        Some(v) => format!("{:?}", String::from_utf8_lossy(v.as_bytes())),
    };
    Err(Reject::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        code::INVALID_REQUEST,
        format!(
            "a POST carries one JSON-RPC message: send it with Content-Type: application/json (this one has {got})"
        ),
    ))
}

/// What the Accept headers admit of `json` (`application/json`) and `sse`
/// (`text/event-stream`); `None` without an Accept header (or only empty ones). For each,
/// the most specific matching range decides (`type/subtype`, then `type/*`, then `*/*`;
/// the highest q among equals), and `q=0` refuses.
fn accepted(headers: &HeaderMap) -> Option<Accepted> {
    const MEDIA: [(&str, &str); 2] = [("application", "json"), ("text", "event-stream")];
    let mut best = [(0u8, false); 2];
    let mut any = false;
    for v in headers.get_all(header::ACCEPT) {
        let v = String::from_utf8_lossy(v.as_bytes());
        for range in v.split(',') {
            let mut parts = range.split(';');
            let Some((rt, rs)) = parts.next().and_then(|r| r.trim().split_once('/')) else {
                continue;
            };
            any = true;
            let (rt, rs) = (rt.trim(), rs.trim());
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, q)| q.trim().parse::<f32>().unwrap_or(0.0));
            for (i, (t, sub)) in MEDIA.iter().enumerate() {
                let rank = match (rt.eq_ignore_ascii_case(t), rs.eq_ignore_ascii_case(sub)) {
                    (true, true) => 3,
                    (true, false) if rs == "*" => 2,
                    _ if rt == "*" && rs == "*" => 1,
                    _ => continue,
                };
                let (r, ok) = &mut best[i];
                if rank > *r {
                    (*r, *ok) = (rank, q > 0.0);
                } else if rank == *r {
                    *ok |= q > 0.0;
                }
            }
        }
    }
    any.then_some(Accepted {
        json: best[0].1,
        sse: best[1].1,
    })
}

/// See [`accepted`].
#[derive(Clone, Copy)]
struct Accepted {
    json: bool,
    sse: bool,
}

/// A POST must admit JSON or SSE (either answer may come); a missing Accept is fine.
fn check_accept(accept: Option<Accepted>) -> Result<(), Reject> {
    match accept {
        Some(a) if !a.json && !a.sse => Err(Reject::new(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "the answer is application/json or text/event-stream: send Accept: application/json, text/event-stream",
        )),
        _ => Ok(()),
    }
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
    let accept = accepted(&headers);
    if let Err(r) = check_origin_host(&http.gw, &headers)
        .and_then(|()| check_content_type(&headers))
        .and_then(|()| check_accept(accept))
    {
        return r.into_response();
    }
    let limits = &http.gw.config().gateway;
    let too_large = || {
        rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            &format!("the request body is over the {} byte limit", limits.max_body),
        )
    };
    // A Content-Length over the limit is refused as soon as the headers are in, before
    // any of the body is read (or, with `Expect: 100-continue`, sent). The body is not
    // read, so the connection closes, and the answer says so.
    let max = u64::try_from(limits.max_body).unwrap_or(u64::MAX);
    if axum::body::HttpBody::size_hint(&body).lower() > max {
        let mut resp = too_large();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    // A client that trickles its body is cut off; one that sends too much gets 413, after
    // the rest of its body is read (up to as much again, within body_timeout) and
    // dropped, so its connection can carry the next request: hyper would close a
    // connection with unread body behind the 413's back, and the client, told nothing,
    // would send its next request into the closed connection.
    let mut body = body;
    let read = async {
        match http_body_util::BodyExt::collect(http_body_util::Limited::new(&mut body, limits.max_body)).await {
            Ok(c) => Ok(c.to_bytes()),
            Err(_) => Err(drain(&mut body, limits.max_body.max(DRAIN_MIN)).await),
        }
    };
    let body = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
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
    let is_array = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let mut version = None;
    if is_array && headers.contains_key(&SESSION_HEADER) {
        // A batch: JSON-RPC batching is part of 2025-03-26 only.
        let (_, session) = match session(&http, &headers, who.as_ref()) {
            Ok(s) => s,
            Err(r) => return r.into_response(),
        };
        if let Err(r) = check_version(&headers) {
            return r.into_response();
        }
        if session.protocol_version == BATCH_VERSION {
            return batch(&http, &headers, &session, &body).await;
        }
        version = Some(session.protocol_version.clone());
    }
    let msg = match Kind::parse(&body) {
        Ok(m) => m,
        Err(e) => {
            let msg = match version {
                Some(v) if is_array => format!(
                    "batches are not supported in protocol version {v} (JSON-RPC batching is in {BATCH_VERSION} only; 2025-06-18 removed it): send one JSON-RPC message per POST"
                ),
                None if is_array => "batches are not supported: send one JSON-RPC message per POST".to_owned(),
                _ => e.to_string(),
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
            let peer = extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip());
            return initialize(&http, id, params.as_deref(), who, peer);
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
            let sse_ok = accept.is_none_or(|a| a.sse);
            let client = session.client.clone();
            request(http, client, id, method, params, parent, None, Some((&session, sse_ok))).await
        }
    }
}

/// The one protocol version with JSON-RPC batches.
const BATCH_VERSION: &str = "2025-03-26";

/// A JSON-RPC batch of a 2025-03-26 session: its requests run at once and are answered
/// together as one JSON array, each response under its request's id (an element that is
/// not a message gets an error with a null id); a batch of notifications and responses
/// only is 202. `initialize` is refused in a batch (2025-03-26 forbids it there). The
/// requests' progress and log messages are not sent (there is no stream to send them on),
/// and servers' questions about them are refused.
async fn batch(http: &Http, headers: &HeaderMap, session: &Arc<Session>, body: &[u8]) -> Response {
    let items: Vec<&serde_json::value::RawValue> = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return rpc_error(StatusCode::BAD_REQUEST, code::PARSE_ERROR, &e.to_string()),
    };
    if items.is_empty() {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "an empty batch: send at least one JSON-RPC message",
        );
    }
    let client = &session.client;
    let error = |id: &Id, code: i64, msg: &str| {
        Some(message::response(
            id,
            &Outcome::Error(message::error_object(code, msg, None)),
        ))
    };
    let mut calls = Vec::new();
    for item in items {
        let answer = match Kind::parse(item.get().as_bytes()) {
            Err(e) => error(&Id::NULL, e.code(), &e.to_string()),
            Ok(Kind::Request { id, method, .. }) if method == "initialize" => error(
                &id,
                code::INVALID_REQUEST,
                "initialize must not be part of a batch: send it alone",
            ),
            Ok(Kind::Request { id, method, params }) => {
                let (gw, client) = (http.gw.clone(), client.clone());
                let parent = crate::telemetry::from_headers(headers);
                calls.push(futures::future::Either::Left(async move {
                    let out = gw.request(&client, &id, &method, params, None, parent).await;
                    let out = out.unwrap_or_else(|| {
                        Outcome::Error(message::error_object(
                            REQUEST_CANCELLED,
                            "request cancelled by the client",
                            None,
                        ))
                    });
                    Some(message::response(&id, &out))
                }));
                continue;
            }
            Ok(Kind::Notification { method, params }) => {
                http.gw.notification(client, &method, params.as_deref());
                None
            }
            Ok(Kind::Response { id, outcome }) => {
                client.answer(id.as_ref(), outcome);
                None
            }
        };
        calls.push(futures::future::Either::Right(futures::future::ready(answer)));
    }
    let answers: Vec<Vec<u8>> = futures::future::join_all(calls).await.into_iter().flatten().collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    let mut out = Vec::with_capacity(answers.iter().map(|a| a.len() + 1).sum::<usize>() + 1);
    out.push(b'[');
    for (i, a) in answers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(a);
    }
    out.push(b']');
    json_response(out)
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
        None,
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
        }) if matches!(
            message::error_summary(&e).0,
            crate::error::code::UNSUPPORTED_VERSION..=crate::error::code::HEADER_MISMATCH
        ) =>
        {
            StatusCode::BAD_REQUEST
        }
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
    if !accepted(headers).is_some_and(|a| a.sse) {
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

/// Whose share of the sessions one belongs to: the authenticated client's name, or with
/// no auth the caller's address (behind a proxy, every caller has the proxy's).
fn share_of(who: Option<&Identity>, peer: Option<std::net::IpAddr>) -> Arc<str> {
    match (who, peer) {
        (Some(i), _) => format!("client '{}'", i.name).into(),
        (None, Some(ip)) => format!("address {ip}").into(),
        (None, None) => "an unknown address".into(),
    }
}

fn initialize(
    http: &Http,
    id: &Id,
    params: Option<&serde_json::value::RawValue>,
    who: Option<Arc<Identity>>,
    peer: Option<std::net::IpAddr>,
) -> Response {
    // Like any other request of the client: over its rate limits, the same -32029.
    if let Err(limited) = http.gw.admit_initialize(who.as_deref()) {
        return json_response(message::response(id, &limited));
    }
    let config = http.gw.config();
    let max = config.gateway.max_sessions;
    if http.sessions.len() >= max {
        return Reject::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            format!("the gateway has {max} open sessions, its limit (gateway.max_sessions); end one or try later"),
        )
        .answer(id);
    }
    let share = share_of(who.as_deref(), peer);
    let per_client = config.gateway.max_sessions_per_client;
    if !http.take_share(&share, per_client) {
        return Reject::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            format!(
                "{share} has {per_client} open sessions, its limit (gateway.max_sessions_per_client); end one or try later"
            ),
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
        share,
        protocol_version: version.clone(),
        last_seen: AtomicU64::new(http.now_ms()),
        get_open: AtomicBool::new(false),
        get_conn: std::sync::Mutex::new(None),
        replay: std::sync::OnceLock::new(),
        priming: version.as_str() >= PRIMING_SINCE,
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
/// With `session`, an SSE answer is resumable (see [`session_sse`]); `sse_ok`: its Accept
/// admits `text/event-stream`, so a slow call of a 2025-11-25 session may switch to SSE.
#[allow(clippy::too_many_arguments)]
async fn request(
    http: Http,
    client: Arc<Client>,
    id: Id,
    method: String,
    params: Option<Box<serde_json::value::RawValue>>,
    parent: Option<opentelemetry::Context>,
    finish: Option<Finish>,
    session: Option<(&Arc<Session>, bool)>,
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
    // it moves to a task, and the answer follows on an SSE stream). A 2025-11-25 session's
    // call still running after SSE_AFTER moves too: its stream starts with the priming
    // event, so the client can resume it. Other sessions never arm the timer.
    enum First {
        Answer(message::Answer),
        Related(bytes::Bytes),
        Slow,
    }
    let slow = session.is_some_and(|(s, sse_ok)| sse_ok && s.priming);
    let first = {
        let Some(fut) = task.0.as_mut() else {
            return task_failed();
        };
        let mut open = true;
        let wait = async {
            if slow {
                tokio::time::sleep(SSE_AFTER).await
            }
        };
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                m = related.recv(), if open => match m {
                    Some(m) => break First::Related(m),
                    None => open = false,
                },
                out = &mut *fut => break First::Answer(out),
                () = &mut wait, if slow => break First::Slow,
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
                    match session {
                        Some((s, _)) => session_sse(s, Some(m), rest),
                        None => sse_answer(m, rest),
                    }
                }
            }
        }
        First::Related(_) | First::Slow => {
            let (done_tx, done) = oneshot::channel::<Vec<u8>>();
            if let Some(fut) = task.0.take() {
                tokio::spawn(async move {
                    let _ = done_tx.send(fut.await.into_vec());
                });
            }
            let m = match first {
                First::Related(m) => Some(m),
                _ => None,
            };
            let rest = outgoing(related, done).map(|(_, m)| m);
            match (session, m) {
                (Some((s, _)), m) => session_sse(s, m, rest),
                (None, Some(m)) => sse_answer(m, rest),
                (None, None) => task_failed(),
            }
        }
    }
}

/// A session's SSE answer, resumable: the priming event first (2025-11-25 and later),
/// then `first` and `rest` as events with ids, kept for replay (see [`replay`]). A task
/// sends them, so a client that drops the connection does not stop the call: it runs on
/// until answered (or its server's timeout, or the session's end), its events kept, and
/// a GET with `Last-Event-ID` picks the stream up where the client lost it.
fn session_sse(
    session: &Arc<Session>,
    first: Option<bytes::Bytes>,
    rest: impl futures::Stream<Item = bytes::Bytes> + Send + 'static,
) -> Response {
    let replay = session.replay();
    let (stream, live) = replay.open_post();
    let priming = session.priming.then(|| replay.priming(stream));
    tokio::spawn(async move {
        if let Some(m) = first {
            replay.record(stream, &m);
        }
        let mut rest = std::pin::pin!(rest);
        while let Some(m) = rest.next().await {
            replay.record(stream, &m);
        }
        replay.finish(stream);
    });
    sse_response(Body::from_stream(live_body(priming, Vec::new(), Some(live))))
}

/// An SSE body: the priming event, `frames`, then whatever arrives on `live`.
fn live_body(
    priming: Option<bytes::Bytes>,
    frames: Vec<bytes::Bytes>,
    live: Option<mpsc::Receiver<bytes::Bytes>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    let head = futures::stream::iter(priming.into_iter().chain(frames));
    let tail = futures::stream::unfold(live, |live| async move {
        let mut rx = live?;
        let m = rx.recv().await?;
        Some((m, Some(rx)))
    });
    head.chain(tail).map(Ok::<_, std::io::Error>)
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
    super::replay::message_event(None, json)
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

/// GET: the session's stream of server-initiated messages (list_changed), or with
/// `Last-Event-ID` the rest of the stream that id belongs to (see [`replay`]).
async fn get_stream(State(http): State<Http>, req: axum::extract::Request) -> Response {
    let (headers, who) = match admit_bodyless(&http, req).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    if !accepted(&headers).is_some_and(|a| a.sse) {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "GET answers with a stream: send Accept: text/event-stream",
        );
    }
    let (sid, session) = match session(&http, &headers, who.as_ref()) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_version(&headers) {
        return r.into_response();
    }
    let mut resumed = None;
    if let Some(last) = headers.get(header::HeaderName::from_static("last-event-id")) {
        let last = String::from_utf8_lossy(last.as_bytes());
        let refused = |why: String| rpc_error(StatusCode::GONE, code::INVALID_REQUEST, &why);
        let Ok((stream, after)) = replay::parse_id(&last) else {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                &format!("Last-Event-ID {last:?} is not an event id of this gateway (STREAM-SEQ)"),
            );
        };
        let kept = session.replay.get().map(|r| r.resume(stream, after));
        match kept {
            Some(Ok(Resumed::Post { frames, live })) => {
                let priming = session.priming.then(|| session.replay().priming(stream));
                return sse_response(Body::from_stream(live_body(priming, frames, live)));
            }
            Some(Ok(Resumed::Get { stream, frames })) => resumed = Some((stream, frames)),
            _ => {
                return refused(format!(
                    "cannot resume after event {last}: its stream is unknown or its events are no longer kept \
                     (a session keeps its last {} events, for at most {} s); start over",
                    replay::REPLAY_EVENTS,
                    replay::REPLAY_AGE.as_secs()
                ))
            }
        }
    }
    static CONNS: AtomicU64 = AtomicU64::new(1);
    let conn = CONNS.fetch_add(1, Ordering::Relaxed);
    let ended = CancellationToken::new();
    {
        let mut current = session.get_conn.lock().unwrap_or_else(|e| e.into_inner());
        match current.take() {
            Some((_, old)) if resumed.is_some() => old.cancel(),
            Some(old) => {
                *current = Some(old);
                return rpc_error(
                    StatusCode::CONFLICT,
                    code::INVALID_REQUEST,
                    "this session already has an open GET stream",
                );
            }
            None => {}
        }
        *current = Some((conn, ended.clone()));
        session.get_open.store(true, Ordering::Release);
    }
    let replay = session.replay();
    let (stream, frames) = match resumed {
        Some((stream, frames)) => {
            replay.reopen(stream);
            (stream, frames)
        }
        None => (replay.open_get(), Vec::new()),
    };
    /// The GET connection `.3` of stream `.2`; when it ends, the stream has no
    /// connection (unless a resuming GET took it over meanwhile).
    struct Open(Arc<Session>, Arc<Replay>, u64, u64);
    impl Drop for Open {
        fn drop(&mut self) {
            let mut current = self.0.get_conn.lock().unwrap_or_else(|e| e.into_inner());
            if current.as_ref().is_some_and(|(c, _)| *c == self.3) {
                *current = None;
                self.0.get_open.store(false, Ordering::Release);
                self.1.finish(self.2);
            }
        }
    }
    let priming = session.priming.then(|| replay.priming(stream));
    let open = Open(session, replay, stream, conn);
    let rx = http.gw.subscribe();
    let own = open.0.client.subscribe_own();
    let closing = http.closing.clone();
    let ender = http.clone();
    let live = futures::stream::unfold((rx, own, open), move |(mut rx, mut own, open)| {
        let closing = closing.clone();
        let ender = ender.clone();
        let sid = sid.clone();
        let ended = ended.clone();
        async move {
            // At shutdown the stream stays open until the session's calls in flight are
            // answered (or shutdown_grace ends): a client may need it until then (the
            // Python SDK's fails its session when its GET stream cannot be reopened).
            let drained = async {
                closing.cancelled().await;
                open.0.client.idle().await;
            };
            let next = tokio::select! {
                () = drained => return None,
                () = ended.cancelled() => return None,
                next = tokio::time::timeout(KEEPALIVE, rx.recv()) => next,
                // This session's own messages (resources it subscribed to).
                next = own.recv() => Ok(next),
            };
            match next {
                Ok(Ok(m)) => {
                    let frame = open.1.record(open.2, &m);
                    Some((frame, (rx, own, open)))
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(n))) => {
                    // Its queue is full: this client cannot keep up. End its session (it
                    // will initialize again) rather than let it fall behind silently.
                    tracing::warn!(session = %sid, missed = n, "GET stream cannot keep up; ending the session");
                    ender.end_session(&sid);
                    None
                }
                Ok(Err(_)) => None,
                Err(_) => Some((bytes::Bytes::from_static(b": keep-alive\n\n"), (rx, own, open))),
            }
        }
    });
    let head = futures::stream::iter(priming.into_iter().chain(frames));
    sse_response(Body::from_stream(head.chain(live).map(Ok::<_, std::io::Error>)))
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
    let topo = http.gw.topology();
    // What clients see (the catalog, after filters and collisions); the server's own
    // totals go beside it as `toolsTotal` and so on.
    let visible = topo.catalog.visible(topo.servers.len());
    let servers: Vec<Value> = topo
        .servers
        .iter()
        .zip(visible)
        .map(|(s, [tools, prompts, resources])| {
            let st = s.state();
            let state = match &st.status {
                Status::Disabled => "disabled",
                Status::Starting => "starting",
                Status::Ready if st.degraded() => "degraded",
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
                "tools": tools,
                "toolsTotal": st.lists.tools.len(),
                "prompts": prompts,
                "promptsTotal": st.lists.prompts.len(),
                "resources": resources,
                "resourcesTotal": st.lists.resources.len(),
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
        // "2 of 9" when the server lists more than clients see.
        let count = |k: &str| match (cell(k), cell(&format!("{k}Total"))) {
            (seen, total) if seen == total => seen,
            (seen, total) => format!("{seen} of {total}"),
        };
        rows.push_str(&format!(
            "<tr class=\"{state}\"><td>{name}</td><td>{state}</td><td>{transport}</td><td>{pid}</td><td>{up}</td><td>{tools}</td><td>{prompts}</td><td>{resources}</td><td>{restarts}</td><td>{err}</td></tr>\n",
            name = cell("name"),
            state = cell("state"),
            transport = cell("transport"),
            pid = cell("pid"),
            up = cell("uptimeSeconds"),
            tools = count("tools"),
            prompts = count("prompts"),
            resources = count("resources"),
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
            if let Some(refused) = host_problem(&req) {
                return Either::Left(Either::Right(futures::future::ready(Ok(refused))));
            }
            let direct = req.method() == axum::http::Method::POST && req.uri().path() == &*path;
            let req = req.map(Body::new);
            if direct {
                Either::Left(Either::Left(
                    post(State(http.clone()), req).map(Ok::<_, std::convert::Infallible>),
                ))
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
