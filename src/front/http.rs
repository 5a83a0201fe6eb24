//! The public Streamable HTTP endpoint (handshake era: 2025-03-26 … 2025-11-25; a
//! sessionless request of 2026-07-28 goes to the one flow of that revision,
//! [`crate::stateless`], through the adapter in `http/stateless.rs`).
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
//!
//! The parts, under `http/`: `checks` (what every request passes first: limits,
//! Origin/Host, media types, auth), `post` (a POST, batches), `session` (the session
//! table, `initialize`, DELETE), `answer` (a request's answer as JSON or SSE), `get` (the
//! session's GET stream and its resumption), `stateless` (the 2026-07-28 adapter),
//! `status` (health, `/metrics`, OAuth metadata), `console` (the console at `/` and
//! `/status*`); `timed` (a connection's read deadlines) and `per_address` (its address's
//! count, `gateway.max_connections_per_address`).

mod answer;
mod checks;
mod console;
mod get;
mod oauth;
mod per_address;
mod post;
mod session;
mod stateless;
mod status;
mod timed;

use crate::auth;
use crate::catalog::view::{tags_param, TagRefusal, ViewKey};
use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::router::Gateway;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use dashmap::DashMap;
use session::Session;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Comment lines sent on idle SSE streams so dead peers are noticed.
const KEEPALIVE: Duration = Duration::from_secs(15);

// Parsed once: looking a header up by `&str` parses and validates the name every time.
static SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
static VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");

/// What every handler shares: one `Arc`, since axum clones the state for every request.
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
    /// graceful shutdown for its whole grace period; so do listen streams.
    closing: CancellationToken,
    /// The 2026-07-28 flow: its parked calls and open listen streams.
    stateless: crate::stateless::Stateless,
    /// Open sessions per identity (see [`session::share_of`]), at most
    /// `gateway.max_sessions_per_client` each; an identity with none has no entry.
    shares: DashMap<Arc<str>, usize>,
    /// Cluster mode: when the records of sessions served here were last refreshed (ms).
    refreshed: std::sync::atomic::AtomicU64,
    /// Cluster mode: sessions ended here while Redis was unreachable, whose record and
    /// tombstone are written once it is back (see [`Http::reconcile_records`]).
    unended: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Set when the drain begins (SIGTERM with a `drain_delay`): `/readyz` answers 503
    /// and responses carry `Connection: close`, while everything is still served.
    draining: AtomicBool,
    /// `gateway.path` (read at start; a change needs a restart): the whole catalog's
    /// endpoint. Profiles are served below it, at `{base}/{NAME}`.
    path: Arc<str>,
    base: Arc<str>,
    /// Cluster mode: this process's part of SSE event ids (see [`crate::front::replay`]).
    origin: Option<Arc<str>>,
    /// What all sessions' replays keep, together (see [`crate::front::replay`]).
    replay_budget: Arc<crate::front::replay::Budget>,
}

impl Http {
    pub fn new(gw: Arc<Gateway>) -> Http {
        let closing = CancellationToken::new();
        let transport = crate::stateless::Transport {
            name: "tcp",
            cancel_by_id: false,
        };
        let stateless = crate::stateless::Stateless::new(gw.clone(), transport, closing.clone());
        let mut ended = gw.ended();
        let path: Arc<str> = gw.config().gateway.path.as_str().into();
        let base: Arc<str> = path.trim_end_matches('/').into();
        let origin = gw.cluster().is_some().then(crate::front::replay::new_origin);
        let http = Http(Arc::new(Shared {
            gw,
            sessions: Arc::new(DashMap::default()),
            started: Instant::now(),
            closing,
            stateless,
            shares: DashMap::new(),
            refreshed: std::sync::atomic::AtomicU64::new(0),
            unended: std::sync::Mutex::default(),
            draining: AtomicBool::new(false),
            path,
            base,
            origin,
            replay_budget: Arc::new(crate::front::replay::Budget::new(
                crate::front::replay::REPLAY_TOTAL_BYTES,
            )),
        }));
        // Cluster mode: a Redis back from an outage, or a bus listened to again (notes sent
        // meanwhile are lost), gets this replica's sessions again, and the ends it missed.
        if let Some(cluster) = http.gw.cluster() {
            let mut recovered = cluster.recovered();
            let weak = Arc::downgrade(&http.0);
            crate::background::spawn(async move {
                loop {
                    match recovered.recv().await {
                        // Several at once are one reconciliation.
                        Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                    let Some(shared) = weak.upgrade() else { return };
                    Http(shared).reconcile_records().await;
                }
            });
        }
        // Cluster mode: a session's GET stream opened on another replica ends the one here.
        if http.gw.cluster().is_some() {
            let mut taken = http.gw.streams_taken();
            let weak = Arc::downgrade(&http.0);
            crate::background::spawn(async move {
                loop {
                    let (sid, at) = match taken.recv().await {
                        Ok(t) => t,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(_) => return,
                    };
                    let Some(shared) = weak.upgrade() else { return };
                    let session = shared.sessions.get(&sid).map(|s| s.clone());
                    if session.is_some_and(|s| s.stream_taken(at)) {
                        tracing::debug!(session = %crate::client::session_tag(&sid), "its GET stream opened on another replica: ended here");
                    }
                }
            });
        }
        // Cluster mode: sessions another replica ended are forgotten here too.
        let weak = Arc::downgrade(&http.0);
        crate::background::spawn(async move {
            loop {
                let sid = match ended.recv().await {
                    Ok(sid) => sid,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let Some(shared) = weak.upgrade() else { return };
                Http(shared).drop_copy(&sid);
            }
        });
        http
    }

    /// Ends every open GET stream once its session has no call in flight (its client may
    /// need the stream until its answers are in); called when shutdown begins.
    pub fn close_streams(&self) {
        self.closing.cancel();
    }

    /// Begins the drain: `/readyz` answers 503 from now on, and each response carries
    /// `Connection: close`, so balancers (and clients holding a keep-alive connection)
    /// move to other replicas while this one still serves everything.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }

    /// Whether `path` is an MCP endpoint: the whole catalog's, or one below it (a profile's).
    fn is_endpoint(&self, path: &str) -> bool {
        path == &*self.path
            || path
                .strip_prefix(&*self.base)
                .and_then(|p| p.strip_prefix('/'))
                .is_some_and(|name| !name.is_empty() && !name.contains('/'))
    }

    /// Which view the endpoint of `uri` shows: none for `{gateway.path}` itself (a
    /// string comparison, nothing looked up: nearly every request), a profile's for
    /// `{gateway.path}/{NAME}` (a hash lookup), a tag query's for `?tags=`. An unknown
    /// profile or tag is 404, its body naming the profiles or tags there are.
    fn endpoint(&self, uri: &axum::http::Uri) -> Result<Option<ViewKey>, Error> {
        let tags = uri
            .query()
            .map(tags_param)
            .transpose()
            .map_err(|why| reject(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why))?
            .flatten();
        if uri.path() == &*self.path {
            let Some(raw) = tags else { return Ok(None) };
            let topo = self.gw.topology();
            return match topo.views.tags(raw, &topo.config.servers, &topo.catalog) {
                Ok(v) => Ok(Some(v.key.clone())),
                Err(TagRefusal::Malformed(why)) => Err(reject(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why)),
                Err(TagRefusal::Unknown(why)) => Err(reject(
                    StatusCode::NOT_FOUND,
                    code::INVALID_REQUEST,
                    format!("?tags=: {why}"),
                )),
            };
        }
        let name = uri
            .path()
            .strip_prefix(&*self.base)
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or_default();
        let topo = self.gw.topology();
        let Some(view) = topo.views.profile(name) else {
            let names = topo.views.names();
            let shown = if names.is_empty() {
                "there are none".to_owned()
            } else {
                format!("the profiles are {}", names.join(", "))
            };
            return Err(reject(
                StatusCode::NOT_FOUND,
                code::INVALID_REQUEST,
                format!("unknown profile {name:?}: {shown} (at {}/NAME)", self.base),
            )
            .with_data(serde_json::json!({ "profiles": names })));
        };
        if tags.is_some() {
            return Err(reject(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!(
                    "?tags= applies to {} only; a profile chooses its servers in [profiles.{name}]",
                    self.path
                ),
            ));
        }
        Ok(Some(view.key.clone()))
    }
}

/// The axum app: the MCP endpoint at the configured path plus health routes.
pub fn app(http: Http) -> Router {
    let path = http.gw.config().gateway.path.clone();
    let limit = http.gw.config().gateway.max_body;
    let mcp = axum::routing::MethodRouter::new()
        .get(get::get_stream)
        .post(post::post)
        .delete(session::delete);
    // Profiles: `{path}/{NAME}`, the same handlers (they read the name from the URI). Every
    // other path under `{path}/` (`/mcp/`, `/mcp/a/b`, `/mcp//a`) goes to them too, so it is
    // answered as an unknown profile is: after the caller's credential, under the
    // request's id.
    let base = path.trim_end_matches('/');
    let profiles = format!("{base}/{{profile}}");
    let under = format!("{base}/{{*rest}}");
    let mut router = Router::new().route(&path, mcp.clone()).route(&under, mcp.clone());
    if format!("{base}/") != path {
        router = router.route(&format!("{base}/"), mcp);
    }
    router
        .route("/status", get(console::status))
        .route("/status/events", get(console::events))
        .route("/status/catalog", get(console::catalog))
        .route("/status/stream", get(console::stream))
        .route("/", get(console::page))
        .route("/console.js", get(console::script))
        .route("/console.css", get(console::style))
        .route("/metrics", get(status::metrics))
        .route("/oauth/start", get(oauth::start).post(oauth::prove_and_start))
        .route("/oauth/callback", get(oauth::callback))
        .route("/oauth/tokens/{server}", axum::routing::delete(oauth::revoke))
        .route(auth::METADATA_PATH, get(status::resource_metadata))
        .route(
            &format!("{}{path}", auth::METADATA_PATH),
            get(status::resource_metadata),
        )
        .route(
            &format!("{}{profiles}", auth::METADATA_PATH),
            get(status::resource_metadata),
        )
        // While the servers make their first attempt (a remote one that hangs takes its
        // `timeout`), requests wait for the catalog as they did in the listener's backlog;
        // the probes below answer at once (/readyz: 503, not ready).
        .route_layer(axum::middleware::from_fn_with_state(http.clone(), after_start))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(status::readyz))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(http)
}

/// Waits until the gateway has started ([`crate::router::Gateway::started`]).
async fn after_start(State(http): State<Http>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    http.gw.started().await;
    next.run(req).await
}

/// Any other path: 404 (those under `{gateway.path}/` are the endpoint's, [`app`]).
async fn not_found() -> Response {
    StatusCode::NOT_FOUND.into_response()
}

/// The one rendering of an [`Error`] on this front: its status (see [`Error::status`])
/// and the JSON-RPC error, under the request's id when there is one.
fn refuse(id: &Id, e: Error) -> Response {
    e.log();
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = message::response(id, &Outcome::from(e));
    (status, json_response(body)).into_response()
}

/// A client's error with an explicit HTTP status.
fn reject(status: StatusCode, code: i64, message: impl Into<String>) -> Error {
    Error::client(code, message).with_status(status.as_u16())
}

impl IntoResponse for Error {
    /// The error answering a message whose id is not known (or not read).
    fn into_response(self) -> Response {
        refuse(&Id::NULL, self)
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

/// Client connections open at once at most: each holds a descriptor and a task. Past it
/// the accept loop waits for one to close, and new ones queue in the kernel's backlog.
const MAX_CONNECTIONS: usize = 16_384;
/// A failing `accept` (out of descriptors: it fails 20 times a second while it lasts), or
/// a connection refused past `gateway.max_connections_per_address` (a flood's every
/// connection), is logged at most this often.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// A warning said at most once every [`ACCEPT_WARN_EVERY`], with how often it was not
/// said since.
#[derive(Default)]
struct Throttled {
    said: Option<Instant>,
    unsaid: u64,
}

impl Throttled {
    /// How often the warning went unsaid since it was last said, when it is due now;
    /// `None` (and counted) when not.
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.said.is_none_or(|at| now.duration_since(at) >= ACCEPT_WARN_EVERY) {
            self.said = Some(now);
            Some(std::mem::take(&mut self.unsaid))
        } else {
            self.unsaid += 1;
            None
        }
    }
}

/// How many client connections may be open at once: [`MAX_CONNECTIONS`], or half the
/// open-file limit if that is less (the limit is first raised, up to twice
/// `MAX_CONNECTIONS`, if the hard limit allows). The other half is for what the gateway
/// itself opens: a restarted child's pipes, a remote server's connections, a log file.
/// Without it, clients that only hold connections open (idle keep-alives, say) take
/// every descriptor, and a child that exits cannot be started again (EMFILE).
fn connection_slots() -> usize {
    let want = 2 * MAX_CONNECTIONS as u64;
    match crate::runtime::raise_open_files(want) {
        Some(limit) if limit < want => {
            let slots = usize::try_from(limit / 2).unwrap_or(MAX_CONNECTIONS).max(1);
            tracing::info!(
                open_files = limit,
                connections = slots,
                "client connections at most half the open-file limit (ulimit -n), so the gateway keeps descriptors for its servers"
            );
            slots
        }
        _ => MAX_CONNECTIONS,
    }
}

/// Accepts connections and serves the gateway on each (HTTP/1.1, keep-alive,
/// `TCP_NODELAY`) until `stop` turns true; then stops accepting, lets requests in flight
/// finish, and returns once every connection has closed. A client gets `header_timeout`
/// to send a request's head, and a connection may sit idle `keep_alive` between two
/// requests ([`timed`]).
///
/// Stopping loses no request a client has sent: a connection the kernel completed before
/// the stop (still in the listener's queue, or accepted but its request not read yet) is
/// served its first request, answered with `Connection: close`. Only a connection idle
/// between two requests is closed at once, as HTTP/1.1 allows (its client retries).
///
/// A POST to the MCP path, nearly all of the traffic, goes straight to its handler; the
/// axum router serves everything else.
pub async fn serve(
    listener: tokio::net::TcpListener,
    http: Http,
    header_timeout: Duration,
    keep_alive: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let max_connections = connection_slots();
    let per_address = http.gw.topology().config.gateway.max_connections_per_address;
    if per_address >= max_connections {
        tracing::warn!(
            max_connections_per_address = per_address,
            connections = max_connections,
            "gateway.max_connections_per_address is not below the connections the gateway takes, so it bounds nothing: one address may take every connection (lower it, or raise ulimit -n)"
        );
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let conns = Connections {
        app: app(http.clone()),
        http,
        header_timeout,
        keep_alive,
        slots: timed::Slots {
            free: slots.clone(),
            total: max_connections,
        },
        stop: stop.clone(),
        open,
        per_address: Arc::default(),
    };
    let (mut accept_failed, mut refused) = (Throttled::default(), Throttled::default());
    // A slot taken for a connection that was then refused: the next accept's.
    let mut spare = None;
    loop {
        // A slot before each accept: past max_connections new connections wait in the
        // kernel's backlog until one closes.
        let slot = match spare.take() {
            Some(slot) => slot,
            None => tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly, keep serving;
                    // said once every ACCEPT_WARN_EVERY, with how often it failed since.
                    if let Some(since) = accept_failed.due() {
                        tracing::warn!(error = %e, failed_since_last_warning = since, "accept failed");
                    }
                    spare = Some(slot);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        match conns.admit(peer.ip()) {
            Ok(held) => conns.serve(stream, peer, Some(slot), held),
            Err((key, max)) => {
                conns.http.gw.metrics.connection_refused();
                if let Some(since) = refused.due() {
                    tracing::warn!(
                        address = %key,
                        limit = max,
                        refused_since_last_warning = since,
                        "refused a connection: its address has gateway.max_connections_per_address open"
                    );
                }
                refuse_connection(stream, max);
                spare = Some(slot);
            }
        }
    }
    // Connections the kernel completed meanwhile wait in the listener's queue: closing it
    // would reset them, requests sent included. Each is served its first request. New
    // connection attempts are refused first (Linux), so none completes between the last
    // accept and the close; handshakes under way get a moment to complete and queue.
    #[cfg(target_os = "linux")]
    match refuse_new_connections(&listener) {
        Ok(()) => tokio::time::sleep(HANDSHAKES).await,
        Err(e) => debug!(error = %e, "cannot refuse new connections before closing the listener"),
    }
    let listener = listener.into_std()?;
    let mut late = 0usize;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                late += 1;
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream));
                // Not counted per address either: the listener is closing, and these
                // are at most its backlog, each served one request.
                match stream {
                    Ok(stream) => conns.serve(stream, peer, None, None),
                    Err(e) => debug!(error = %e, "a connection queued at shutdown is lost"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    drop(listener);
    if late > 0 {
        debug!(
            connections = late,
            "served the connections queued when the listener closed"
        );
    }
    drop(conns);
    // Every connection's task holds a sender: all are gone once every connection closed.
    let _ = all_closed.recv().await;
    Ok(())
}

/// Answers a connection refused past `gateway.max_connections_per_address` with a 503 and
/// `Connection: close`, and closes it, all at once: no task, no slot, no wait. The answer
/// is one write of a fresh connection's first bytes, which its send buffer takes whole;
/// whatever the client sent already is read first, so the close is a FIN, not a reset
/// that could discard the answer before the client reads it. A client that has not sent
/// its request yet reads the answer when it looks (HTTP/1.1 allows an early response).
fn refuse_connection(stream: tokio::net::TcpStream, max: usize) {
    use std::io::{Read, Write};
    let Ok(mut stream) = stream.into_std() else {
        return;
    };
    let body = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{{\"code\":{},\"message\":\"this address has {max} connections open to the gateway, its limit (gateway.max_connections_per_address); close one or try later\"}}}}",
        code::INTERNAL_ERROR
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut sent = [0u8; 4096];
    for _ in 0..4 {
        if !matches!(stream.read(&mut sent), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = stream.write(answer.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// How long after its accept a connection's first request is still awaited at shutdown:
/// a client sends it right after the handshake (one round trip), so one still silent after
/// this is a spare the client keeps for later, and is closed at once like an idle one.
const FIRST_REQUEST: Duration = Duration::from_secs(2);

/// How long a handshake under way when the listener stops taking new ones has to
/// complete: a round trip between the balancer and this replica, with room to spare.
#[cfg(target_os = "linux")]
const HANDSHAKES: Duration = Duration::from_millis(25);

/// Drops every new connection attempt to `listener` from now on, with a socket filter
/// that discards TCP segments with SYN set and ACK not, while the handshakes under way
/// complete and queue. A client whose SYN was dropped sends it again a second later, gets
/// a reset from the closed port, and (a balancer) tries another replica: its request is
/// never sent here, so it is not lost. Without this, a connection completing between the
/// last accept and the close would be reset with its request sent.
#[cfg(target_os = "linux")]
fn refuse_new_connections(listener: &tokio::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // Classic BPF; a TCP socket's filter sees the segment from its TCP header, whose
    // byte 13 holds the flags (0x02 SYN, 0x10 ACK).
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let mut program = [
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 13),
        op(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, 0x12),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, 0x02),
        // A SYN: dropped (0 bytes kept).
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
        // Anything else: kept whole.
        op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    #[allow(unsafe_code)]
    // SAFETY: setsockopt(2) on a descriptor `listener` owns, with a pointer to a
    // sock_fprog and its size; the kernel copies the program before returning.
    let r = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What each connection's task needs (see [`serve`]).
struct Connections {
    app: Router,
    http: Http,
    header_timeout: Duration,
    keep_alive: Duration,
    slots: timed::Slots,
    stop: tokio::sync::watch::Receiver<bool>,
    /// Held by every connection's task until its connection closes.
    open: tokio::sync::mpsc::Sender<()>,
    /// The connections each address holds open (`gateway.max_connections_per_address`).
    per_address: Arc<per_address::PerAddress>,
}

impl Connections {
    /// Whether a connection from `ip` may be served: its place in its address's count,
    /// `None` for a peer in `gateway.trusted_proxies` (all clients come through a
    /// balancer, so it is not counted); its key and the limit when the address holds
    /// `gateway.max_connections_per_address` open already. Both settings follow reloads.
    fn admit(&self, ip: std::net::IpAddr) -> Result<Option<per_address::Held>, (per_address::Key, usize)> {
        let topo = self.http.gw.topology();
        let gateway = &topo.config.gateway;
        if gateway.trusted_proxies.iter().any(|c| c.contains(ip)) {
            return Ok(None);
        }
        let max = gateway.max_connections_per_address;
        self.per_address.take(ip, max).map(Some).map_err(|key| (key, max))
    }

    /// Serves one connection on its own task, holding `slot` and `held` (its place in its
    /// address's count) while it is open.
    fn serve(
        &self,
        stream: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
        held: Option<per_address::Held>,
    ) {
        use futures::future::{Either, FutureExt};
        use hyper_util::rt::{TokioIo, TokioTimer};
        use tower::ServiceExt;
        let _ = stream.set_nodelay(true);
        let accepted = tokio::time::Instant::now();
        let (app, http) = (self.app.clone(), self.http.clone());
        // Set (and notified, once) when the connection's first request arrives.
        let asked = Arc::new((AtomicBool::new(false), tokio::sync::Notify::new()));
        let first = asked.clone();
        // Where the connection is between its requests, for its reads' deadlines.
        let phase = Arc::new(timed::Phase::default());
        let served = phase.clone();
        let mut stop = self.stop.clone();
        let stopping = self.stop.clone();
        let service = hyper::service::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
            if !first.0.swap(true, Ordering::AcqRel) {
                first.1.notify_one();
            }
            served.serving();
            let served = served.clone();
            req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
            if let Some(refused) = checks::host_problem(&req) {
                return Either::Left(futures::future::ready(Ok(
                    refused.map(|b| timed::Tracked::new(b, served))
                )));
            }
            let direct = req.method() == axum::http::Method::POST && http.is_endpoint(req.uri().path());
            // Draining, or stopping: this connection closes after its answer.
            let close = http.draining() || *stopping.borrow();
            let req = req.map(Body::new);
            let answer = if direct {
                Either::Left(post::post(State(http.clone()), req).map(Ok::<_, std::convert::Infallible>))
            } else {
                Either::Right(app.clone().oneshot(req))
            };
            Either::Right(answer.map(move |r| {
                r.map(|mut resp| {
                    if close {
                        resp.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    resp.map(|b| timed::Tracked::new(b, served))
                })
            }))
        });
        // hyper's own header_read_timeout would also close a connection idle that long:
        // the stream times both instead ([`timed`]).
        let stream = timed::Timed::new(stream, phase, self.header_timeout, self.keep_alive, self.slots.clone());
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let open = self.open.clone();
        crate::background::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                () = stop.wait_for(|s| *s).map(drop) => {
                    // hyper's graceful shutdown closes a connection that has not read a
                    // byte yet at once, though its client may have sent a request already
                    // (it was accepted a moment ago): that request would be lost, unanswered
                    // and not retried. So such a connection gets its first request, answered
                    // with `Connection: close`, if it comes within FIRST_REQUEST of the
                    // accept. One silent longer is a client's spare connection (reqwest and
                    // browsers open them), idle as one between two requests is: closed now,
                    // not holding the shutdown for header_timeout.
                    let early = if asked.0.load(Ordering::Acquire) {
                        None
                    } else {
                        let spare = tokio::time::sleep_until(accepted + FIRST_REQUEST);
                        tokio::select! {
                            r = conn.as_mut() => Some(r),
                            () = asked.1.notified() => None,
                            () = spare => None,
                        }
                    };
                    match early {
                        Some(r) => r,
                        None => {
                            conn.as_mut().graceful_shutdown();
                            conn.await
                        }
                    }
                }
            };
            if let Err(e) = ended {
                debug!(error = %e, "connection ended with an error");
            }
            drop((slot, held, open));
        });
    }
}
