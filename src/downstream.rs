//! A connection to one downstream server, whatever its transport.
//!
//! One task owns each connection (the child's pipes, later an HTTP session). Everyone
//! else holds a cheap [`Connection`] handle and talks to it through a bounded channel,
//! getting answers on oneshot channels. The owner mints the ids the downstream sees
//! (the handle allocates them from a per-connection counter so that a dropped call
//! can cancel its id without a round trip), keeps the pending map, and turns each
//! `notifications/progress` back into the caller's own token.
//!
//! The handshake and listing are not done here: they are plain requests sent through
//! the handle by the server's supervisor, so every transport shares them.

pub mod client;
pub mod elicit;
pub mod fair;
pub mod http;
pub mod pipe;
pub mod questions;
pub mod sse;
pub mod stateless;
pub mod stdio;
pub mod values;

use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::telemetry::Carrier;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How many commands may wait for a connection's owner before senders wait too.
pub const COMMAND_QUEUE: usize = 256;
/// How many messages related to one call may queue for its client before they are dropped.
pub const SINK_QUEUE: usize = 256;

/// Where messages related to one call go (progress, log messages): serialized JSON-RPC
/// messages for the calling client. Sends never wait; a client that cannot keep up
/// loses these notifications rather than slowing the shared downstream.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Bytes>,
    /// The client the call came from, when it can be asked questions (sampling,
    /// elicitation, roots) on this same stream.
    peer: Option<Arc<dyn Peer>>,
    /// Cancelled when the call ends (answered, cancelled, timed out): a question still
    /// waiting for the client is withdrawn then.
    call_over: Option<tokio_util::sync::CancellationToken>,
}

impl Sink {
    pub fn new(tx: mpsc::Sender<Bytes>) -> Sink {
        Sink {
            tx,
            peer: None,
            call_over: None,
        }
    }

    /// The same sink, answering for `peer`.
    pub fn with_peer(mut self, peer: Arc<dyn Peer>) -> Sink {
        self.peer = Some(peer);
        self
    }

    /// Queues a message for the client without waiting; false when it was dropped.
    pub fn try_send(&self, message: Bytes) -> bool {
        self.tx.try_send(message).is_ok()
    }

    /// Queues a message, waiting for room (for requests, which must not be dropped).
    pub async fn send(&self, message: Bytes) -> bool {
        self.tx.send(message).await.is_ok()
    }

    pub fn peer(&self) -> Option<&Arc<dyn Peer>> {
        self.peer.as_ref()
    }

    /// The same sink, for a call that is over when `token` is cancelled.
    pub fn until(mut self, token: tokio_util::sync::CancellationToken) -> Sink {
        self.call_over = Some(token);
        self
    }

    /// The same sink for one question of a server: over when its call is, or when the
    /// returned token is cancelled (the server withdrew the question).
    pub fn for_question(mut self) -> (Sink, tokio_util::sync::CancellationToken) {
        let token = match &self.call_over {
            Some(t) => t.child_token(),
            None => tokio_util::sync::CancellationToken::new(),
        };
        self.call_over = Some(token.clone());
        (self, token)
    }

    /// Whether the call this sink belongs to is over (false, if not known).
    pub fn is_over(&self) -> bool {
        self.call_over
            .as_ref()
            .is_some_and(tokio_util::sync::CancellationToken::is_cancelled)
    }

    /// Completes when the call this sink belongs to is over (never, if not known).
    pub async fn call_over(&self) {
        match &self.call_over {
            Some(t) => t.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Delivers a server's `notifications/message` unless the client asked for a less
    /// verbose level (`logging/setLevel`).
    pub fn log(&self, params: Option<&RawValue>) {
        #[derive(serde::Deserialize)]
        struct P<'a> {
            #[serde(borrow, default)]
            level: Option<&'a str>,
        }
        let level = params
            .and_then(|p| serde_json::from_str::<P>(p.get()).ok())
            .and_then(|p| p.level);
        if self.peer.as_ref().is_none_or(|p| p.wants_log(level.unwrap_or("info"))) {
            self.try_send(Bytes::from(message::notification("notifications/message", params)));
        }
    }
}

/// The syslog levels of MCP logging, least severe first.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// A log level's rank in [`LOG_LEVELS`].
pub fn log_rank(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

/// A client as a downstream's own requests see it: it can be asked `sampling/*`,
/// `elicitation/*` or `roots/list` on the stream of the call that caused the question.
pub trait Peer: Send + Sync {
    /// Sends `method` to the client through `sink` and waits for its answer.
    fn ask(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
        sink: Sink,
    ) -> futures::future::BoxFuture<'static, Outcome>;

    /// Whether the client wants a log message of this level (its `logging/setLevel`).
    fn wants_log(&self, _level: &str) -> bool {
        true
    }

    /// Sends a notification that outlived its call (a URL elicitation's completion) to the
    /// client's own stream: false when it has none (a stateless client).
    fn tell(&self, _line: Bytes) -> bool {
        false
    }
}

/// Answers a request a downstream sent us (server→client): ping here; anything else
/// goes to the client of the call it relates to (`caller`), or is refused with a
/// sentence saying why when that client cannot be known.
pub async fn answer_server_request(
    caller: Option<Sink>,
    method: String,
    params: Option<Box<RawValue>>,
    why_unknown: &str,
) -> Outcome {
    if method == "ping" {
        return Outcome::Result(message::empty_object().into());
    }
    match caller {
        Some(sink) => match sink.peer().cloned() {
            Some(peer) => peer.ask(method, params, sink).await,
            None => Outcome::Error(
                Error::client(
                    code::METHOD_NOT_FOUND,
                    format!("mcp-gateway cannot forward {method}: the call it relates to has no client to ask"),
                )
                .object(),
            ),
        },
        None => Outcome::Error(
            Error::client(
                code::METHOD_NOT_FOUND,
                format!("mcp-gateway cannot tell which client {method} is for: {why_unknown}"),
            )
            .object(),
        ),
    }
}

/// Why a downstream call failed. Every variant names the server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DsError {
    #[error("server '{server}' did not answer {method} within {}", fmt_duration(*after))]
    Timeout {
        server: Arc<str>,
        method: String,
        after: Duration,
    },
    #[error("server '{server}' exited ({reason}) before answering {method}")]
    Exited {
        server: Arc<str>,
        method: String,
        reason: String,
    },
    #[error("server '{server}' is not available: {reason}")]
    Unavailable { server: Arc<str>, reason: String },
    #[error(
        "server '{server}' is busy: {queued} messages ({kib} KiB) are already waiting to be written to it (the gateway's bound); try again shortly"
    )]
    Busy {
        server: Arc<str>,
        queued: usize,
        kib: usize,
    },
    /// The calling client has `limit` calls in flight to the server's process already.
    #[error(
        "server '{server}' already has {limit} calls of this client in flight, the gateway's limit (servers.{server}.max_calls_per_client); wait for one to finish"
    )]
    TooManyCalls { server: Arc<str>, limit: usize },
    #[error("server '{server}' answered HTTP {status}: {detail}")]
    Status {
        server: Arc<str>,
        status: u16,
        detail: String,
    },
    /// An answer line the gateway could read the id of, but not parse.
    #[error("server '{server}' answered {method} with a line that is not valid JSON ({why})")]
    Malformed {
        server: Arc<str>,
        method: String,
        why: String,
    },
}

impl DsError {
    pub fn code(&self) -> i64 {
        match self {
            DsError::Timeout { .. } => code::REQUEST_TIMEOUT,
            _ => code::INTERNAL_ERROR,
        }
    }

    pub fn server(&self) -> &str {
        match self {
            DsError::Timeout { server, .. }
            | DsError::Exited { server, .. }
            | DsError::Unavailable { server, .. }
            | DsError::Busy { server, .. }
            | DsError::TooManyCalls { server, .. }
            | DsError::Status { server, .. }
            | DsError::Malformed { server, .. } => server,
        }
    }

    /// The JSON-RPC error object a client receives.
    pub fn to_error_object(&self) -> Box<RawValue> {
        Error::from(self).object()
    }
}

impl From<&DsError> for Error {
    /// The named server's fault, but for a client's own bound (its calls in flight),
    /// which `data.server` still names.
    fn from(e: &DsError) -> Error {
        let server = Arc::from(e.server());
        match e {
            // A limit, as a rate limit is (no `retryAfterMs`: it ends when a call does).
            DsError::TooManyCalls { .. } => Error {
                source: crate::error::Source::Client,
                ..Error::server(&server, code::RATE_LIMITED, e.to_string())
            },
            _ => Error::server(&server, e.code(), e.to_string()),
        }
    }
}

impl crate::telemetry::Failure for DsError {
    fn error_type(&self) -> &'static str {
        match self {
            DsError::Timeout { .. } => "timeout",
            DsError::Exited { .. } => "server_exited",
            DsError::Unavailable { .. } => "unavailable",
            DsError::Busy { .. } => "busy",
            DsError::TooManyCalls { .. } => "too_many_calls",
            DsError::Status { .. } => "http_status",
            DsError::Malformed { .. } => "malformed_answer",
        }
    }
}

pub fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The params of a call on its way downstream.
pub enum Params {
    /// Forwarded byte-for-byte.
    Raw(Option<Box<RawValue>>),
    /// Already opened by the router (to strip a namespace); `progress` is the client's
    /// progress token, which the owner replaces with one of its own.
    Object {
        params: Map<String, Value>,
        progress: Option<Id>,
    },
    /// Like `Object`, opened one level only (`tools/call`, `prompts/get`): values the
    /// router did not touch are written back as the client sent them.
    Members {
        params: message::Members,
        progress: Option<Id>,
    },
}

/// Params the router opened and may edit on their way downstream: what forwarding
/// needs of them, for a full map ([`Map`]) and a one-level one ([`message::Members`]).
/// Their `_meta` is reached through [`Carrier`].
pub trait OpenParams: Carrier {
    /// `name`, if it is a string.
    fn name(&self) -> Option<std::borrow::Cow<'_, str>>;
    /// Removes `_meta.progressToken` and returns it (as the client wrote it where the
    /// params are still raw: [`message::Members`]).
    fn take_progress(&mut self) -> Option<Id>;
    /// The params to send, with the caller's progress token.
    fn into_params(self, progress: Option<Id>) -> Params;
    /// The whole params as a map, for code that edits more than `_meta` (for
    /// [`message::Members`] this parses every value: use it only where needed).
    fn into_map(self) -> Map<String, Value>;
}

impl OpenParams for Map<String, Value> {
    fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.get("name").and_then(Value::as_str).map(std::borrow::Cow::Borrowed)
    }

    fn take_progress(&mut self) -> Option<Id> {
        match self.get_mut("_meta") {
            Some(Value::Object(m)) => m.remove("progressToken").map(|v| Id::from_value(&v)),
            _ => None,
        }
    }

    fn into_params(self, progress: Option<Id>) -> Params {
        Params::Object { params: self, progress }
    }

    fn into_map(self) -> Map<String, Value> {
        self
    }
}

impl OpenParams for message::Members {
    fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.get_str("name")
    }

    fn take_progress(&mut self) -> Option<Id> {
        message::Members::take_progress(self)
    }

    fn into_params(self, progress: Option<Id>) -> Params {
        Params::Members { params: self, progress }
    }

    fn into_map(self) -> Map<String, Value> {
        message::Members::into_map(self)
    }
}

/// A request for the connection's owner.
// `Request` is nearly every command sent: boxing it to shrink the rare others would cost
// an allocation per call.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    Request {
        id: u64,
        method: String,
        params: Params,
        /// Related notifications for the caller (progress, log messages).
        sink: Option<Sink>,
        reply: oneshot::Sender<Result<Outcome, DsError>>,
        /// Extra HTTP headers for a Streamable HTTP server (2026-07-28 `Mcp-Param-*`).
        headers: Vec<(String, String)>,
        /// Whose call it is: for a remote server's fair share of its connections, a
        /// child's calls in flight per client (0: the gateway's own, never counted).
        caller: fair::Caller,
    },
    Notify {
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// The caller gave up on request `id`: forget it and tell the downstream.
    Cancel { id: u64, reason: &'static str },
    /// Close the connection (stdin, then SIGTERM, then SIGKILL for a child).
    Shutdown { done: oneshot::Sender<()> },
}

/// What a connection reports to its supervisor.
#[derive(Debug)]
pub enum Incoming {
    /// A notification that relates to no call (list_changed, resources/updated, ...).
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// The connection is gone; every pending call has already failed. `clean` when a
    /// child exited with status 0.
    Closed { reason: String, clean: bool },
    /// A Streamable HTTP server forgot its session and was initialized again: what
    /// sessions asked of it (resource subscriptions, the log level) must be asked again.
    Reinitialized,
}

/// A cheap, clonable handle to one downstream connection.
#[derive(Clone)]
pub struct Connection {
    server: Arc<str>,
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// The child's pid, for a stdio server.
    pid: Option<u32>,
    /// Set by the owner while the server owes answers and has said nothing for its timeout.
    degraded: Arc<std::sync::atomic::AtomicBool>,
    /// A child's last stderr lines.
    stderr: Option<Arc<stdio::StderrTail>>,
    /// Whose calls this handle sends ([`Connection::for_caller`]).
    caller: fair::Caller,
    /// Whether, and how, its owner tells callers apart, so that a caller's key is worth
    /// making.
    keyed: Keyed,
}

/// How a connection's owner tells callers apart.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keyed {
    /// It does not.
    No,
    /// A remote server's slots go to callers in turn ([`fair`]): clients (by identity,
    /// else by address) in turn, then each client's sessions.
    BySession,
    /// A child's calls in flight are bounded per client (`max_calls_per_client`): by
    /// identity, else by address (a session's share), so that many sessions of one
    /// address count as one client.
    ByClient,
}

/// Who sends a call, for [`Connection::for_caller`].
pub struct Who<'a> {
    /// Its `[clients.NAME]` or OAuth identity.
    pub identity: Option<&'a str>,
    /// Its session (a stateless caller's name).
    pub session: &'a str,
    /// Whose share of the sessions its session is (`client 'NAME'`, `address IP`).
    pub share: Option<&'a str>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("server", &self.server).finish()
    }
}

impl Connection {
    pub fn new(server: Arc<str>, tx: mpsc::Sender<Command>) -> Self {
        Connection {
            server,
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            pid: None,
            degraded: Arc::default(),
            stderr: None,
            caller: fair::Caller::NONE,
            keyed: Keyed::No,
        }
    }

    /// The same handle, to an owner that shares its slots among callers ([`fair`]).
    pub fn fair(mut self) -> Self {
        self.keyed = Keyed::BySession;
        self
    }

    /// The same handle, to an owner that bounds each client's calls in flight.
    pub fn per_client(mut self) -> Self {
        self.keyed = Keyed::ByClient;
        self
    }

    /// The same handle, sending its calls as `who`'s: a remote server's
    /// `max_connections` slots go to waiting callers in turn ([`fair`]), and a child
    /// takes at most `max_calls_per_client` of one client's calls. The key (a hash) is
    /// made only for such an owner.
    pub fn for_caller<'a>(mut self, who: impl FnOnce() -> Who<'a>) -> Self {
        self.caller = match self.keyed {
            Keyed::No => fair::Caller::NONE,
            Keyed::BySession | Keyed::ByClient => {
                let w = who();
                fair::caller(w.identity, crate::client::counted_as(w.share, w.session), w.session)
            }
        };
        self
    }

    /// The same handle, noting the child's pid (shown in `/status`).
    pub fn with_pid(mut self, pid: Option<u32>) -> Self {
        self.pid = pid;
        self
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The same handle, keeping the child's last stderr lines.
    pub fn with_stderr(mut self, tail: Arc<stdio::StderrTail>) -> Self {
        self.stderr = Some(tail);
        self
    }

    /// The child's last stderr lines (secrets masked), once its stderr has ended.
    pub async fn stderr_tail(&self) -> Option<String> {
        match &self.stderr {
            Some(t) => t.text().await,
            None => None,
        }
    }

    /// Whether the server owes answers and has said nothing for its timeout.
    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Sends a request and waits for its answer for at most `timeout`. If the wait ends
    /// early (timeout, or the caller's future is dropped) the downstream is sent
    /// `notifications/cancelled` for it.
    pub async fn call(
        &self,
        method: &str,
        params: Params,
        sink: Option<Sink>,
        timeout: Duration,
    ) -> Result<Outcome, DsError> {
        self.call_with_headers(method, params, sink, timeout, Vec::new()).await
    }

    /// [`Connection::call`] with extra HTTP headers (ignored by stdio servers).
    pub async fn call_with_headers(
        &self,
        method: &str,
        params: Params,
        sink: Option<Sink>,
        timeout: Duration,
        headers: Vec<(String, String)>,
    ) -> Result<Outcome, DsError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::record_wire_id(id);
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Request {
            id,
            method: method.to_owned(),
            params,
            sink,
            reply,
            headers,
            caller: self.caller,
        };
        let gone = || DsError::Unavailable {
            server: self.server.clone(),
            reason: "connection closed".into(),
        };
        // Waiting here for room in the queue is the backpressure; it counts against the timeout.
        let mut guard = CancelOnDrop {
            id,
            tx: &self.tx,
            armed: false,
            reason: "request cancelled by the client",
        };
        let wait = async {
            self.tx.send(cmd).await.map_err(|_| gone())?;
            guard.armed = true;
            rx.await.map_err(|_| gone())?
        };
        let res = tokio::time::timeout(timeout, wait).await;
        let out = match res {
            Ok(r) => r,
            Err(_) => {
                guard.reason = "timed out in mcp-gateway";
                Err(DsError::Timeout {
                    server: self.server.clone(),
                    method: method.to_owned(),
                    after: timeout,
                })
            }
        };
        if !matches!(out, Err(DsError::Timeout { .. })) {
            guard.armed = false;
        }
        out
    }

    /// Sends a notification; it is dropped if the connection is gone.
    pub async fn notify(&self, method: &str, params: Option<Box<RawValue>>) {
        let _ = self
            .tx
            .send(Command::Notify {
                method: method.to_owned(),
                params,
            })
            .await;
    }

    /// Asks the owner to close the connection and waits until it has.
    pub async fn shutdown(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Command::Shutdown { done }).await.is_ok() {
            let _ = rx.await;
        }
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// How many handles to this connection exist, this one included.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.next_id)
    }
}

/// A configured value this long or longer is masked in what a server says back (a
/// child's stderr, a remote server's error texts); shorter ones would mask ordinary words.
pub(crate) const MASKED_MIN: usize = 6;

/// `text` with every secret in it replaced by `***`.
pub(crate) fn masked(text: std::borrow::Cow<'_, str>, secrets: &[String]) -> String {
    let mut text = text.into_owned();
    for s in secrets {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "***");
        }
    }
    text
}

/// Text a child or server wrote, as the gateway logs or shows it: at most `max` bytes of
/// it, masked before it is cut (so a secret across the cut is masked too), with every
/// control character but tab escaped (`\u{d}`), so it can neither forge a log line (CR,
/// LF) nor drive an operator's terminal (ESC, C1). The flag: whether it was cut.
pub(crate) fn shown_line(line: &[u8], max: usize, secrets: &[String]) -> (String, bool) {
    let longest = secrets.iter().map(String::len).max().unwrap_or(0);
    let head = &line[..line.len().min(max.saturating_add(longest))];
    let text = masked(String::from_utf8_lossy(head), secrets);
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.chars() {
        if out.len() >= max {
            return (out, true);
        }
        push_shown(&mut out, c);
    }
    (out, line.len() > head.len())
}

/// Logs a server's `notifications/message` that no client takes: with the server's name,
/// masked, escaped and cut as a stderr line is ([`stdio::STDERR_SHOWN_MAX`]), and within
/// the server's budget of log lines, shared with its stderr: a server that floods its
/// log messages fills the gateway's log no faster than one that floods its stderr.
pub(crate) fn log_message(server: &Arc<str>, params: Option<&RawValue>, secrets: &[String]) {
    let raw = params.map_or("", |p| p.get());
    if !stdio::take(&stdio::budget_of(server)) {
        tracing::debug!(server = %server, bytes = raw.len(), "a downstream log message over the server's budget, not logged");
        return;
    }
    let (text, cut) = shown_line(raw.as_bytes(), stdio::STDERR_SHOWN_MAX, secrets);
    if cut {
        tracing::info!(server = %server, message = %text, bytes = raw.len(), "downstream log message (cut)");
    } else {
        tracing::info!(server = %server, message = %text, "downstream log message");
    }
}

/// `text` with its control characters but tab escaped, as [`shown_line`] shows them.
pub(crate) fn controls_escaped(text: impl IntoIterator<Item = char>) -> String {
    let mut out = String::new();
    for c in text {
        push_shown(&mut out, c);
    }
    out
}

fn push_shown(out: &mut String, c: char) {
    if c.is_control() && c != '\t' {
        out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
    } else {
        out.push(c);
    }
}

/// The id of an answer in a line that does not parse (a byte that is not UTF-8, a raw
/// control character in a string), when it can still be told: a top-level `"id"` that
/// is digits, or digits in quotes (an id the gateway minted, echoed either way), in an
/// object with a top-level `"result"` or `"error"` (a server's own request has ids of
/// its own). Strings are skipped whatever they hold; nothing else is checked.
pub(crate) fn id_of_broken_answer(line: &[u8]) -> Option<u64> {
    let ws = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t' | b'\r' | b'\n'));
    let (mut depth, mut i) = (0usize, 0usize);
    let (mut id, mut answer) = (None, false);
    while let Some(&b) = line.get(i) {
        match b {
            b'"' => {
                let start = i + 1;
                i = start;
                while *line.get(i)? != b'"' {
                    i += if line[i] == b'\\' { 2 } else { 1 };
                }
                let text = line.get(start..i)?;
                i += 1;
                let mut at = i;
                while ws(line.get(at)) {
                    at += 1;
                }
                if depth != 1 || line.get(at) != Some(&b':') {
                    continue;
                }
                match text {
                    b"result" | b"error" => answer = true,
                    b"id" => {
                        at += 1;
                        while ws(line.get(at)) {
                            at += 1;
                        }
                        let quoted = line.get(at) == Some(&b'"');
                        let from = at + usize::from(quoted);
                        let len = line.get(from..)?.iter().take_while(|c| c.is_ascii_digit()).count();
                        let end = from + len;
                        let closed = !quoted || line.get(end) == Some(&b'"');
                        id = (len > 0 && closed)
                            .then(|| std::str::from_utf8(&line[from..end]).ok()?.parse().ok())
                            .flatten();
                    }
                    _ => {}
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            _ => {}
        }
        i += 1;
    }
    id.filter(|_| answer)
}

/// An error `server` answered, with `mask` applied to its text (a result is passed on as
/// the server wrote it). An escape can hide a secret from a search of the raw text (`\/`
/// for `/`, as PHP writes it, or any `\u0041`): an error with a backslash in it is masked
/// string by string, decoded. Masking inside an escape can leave text that is no JSON:
/// then the gateway's own words, never the unmasked error.
pub(crate) fn masked_error(server: &str, outcome: Outcome, mask: impl Fn(&str) -> String) -> Outcome {
    let Outcome::Error(e) = outcome else { return outcome };
    let decoded = match e.get().contains('\\') {
        true => serde_json::from_str::<Value>(e.get()).ok(),
        false => None,
    };
    let text = match decoded {
        Some(mut v) => {
            if !mask_strings(&mut v, &mask) {
                return Outcome::Error(e);
            }
            v.to_string()
        }
        None => mask(e.get()),
    };
    if text == e.get() {
        return Outcome::Error(e);
    }
    Outcome::Error(RawValue::from_string(text).unwrap_or_else(|_| {
        Error::gateway(format!(
            "server '{server}' answered an error that cannot be shown with its secrets masked"
        ))
        .object()
    }))
}

/// Applies `mask` to every string in `v` (keys too); whether any changed.
fn mask_strings(v: &mut Value, mask: &impl Fn(&str) -> String) -> bool {
    match v {
        Value::String(s) => {
            let m = mask(s);
            let changed = m != *s;
            *s = m;
            changed
        }
        Value::Array(a) => a.iter_mut().fold(false, |c, x| mask_strings(x, mask) | c),
        Value::Object(o) => {
            let mut changed = false;
            let entries: Vec<(String, Value)> = std::mem::take(o).into_iter().collect();
            for (k, mut x) in entries {
                changed |= mask_strings(&mut x, mask);
                let key = mask(&k);
                changed |= key != k;
                o.insert(key, x);
            }
            changed
        }
        _ => false,
    }
}

/// Cancels a request downstream when its caller stops waiting for it.
struct CancelOnDrop<'a> {
    id: u64,
    tx: &'a mpsc::Sender<Command>,
    armed: bool,
    reason: &'static str,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let cmd = Command::Cancel {
            id: self.id,
            reason: self.reason,
        };
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.tx.try_send(cmd) {
            let tx = self.tx.clone();
            crate::background::spawn(async move {
                let _ = tx.send(cmd).await;
            });
        }
    }
}

/// A call waiting for its answer, as the owner of a connection keeps it.
pub struct Pending {
    pub method: String,
    /// For `tasks/*`: the server's id of the task it is about (a server's question
    /// related to that task goes to the caller waiting on it).
    pub task: Option<String>,
    pub sink: Option<Sink>,
    /// The caller's own progress token, restored on each `notifications/progress`.
    pub progress: Option<Id>,
    pub reply: oneshot::Sender<Result<Outcome, DsError>>,
    /// Whose call it is (see [`Command::Request`]).
    pub caller: fair::Caller,
}

/// The task a `tasks/*` request is about (its `taskId`), as the server knows it.
pub fn task_of(method: &str, params: &Params) -> Option<String> {
    if !method.starts_with("tasks/") {
        return None;
    }
    match params {
        Params::Object { params, .. } => params.get("taskId").and_then(Value::as_str).map(str::to_owned),
        Params::Members { params, .. } => params.get_str("taskId").map(|t| t.into_owned()),
        Params::Raw(raw) => raw
            .as_deref()
            .and_then(|r| serde_json::from_str::<Map<String, Value>>(r.get()).ok())
            .and_then(|mut m| match m.remove("taskId") {
                Some(Value::String(t)) => Some(t),
                _ => None,
            }),
    }
}

/// A server's question as the client is to see it: the task it relates to (`_meta`'s
/// related-task `taskId`, the server's own id), and its params with that id replaced by
/// the gateway's public name for the task, which is how the client knows it.
pub(crate) fn question_task(params: Option<Box<RawValue>>, server: &str) -> (Option<String>, Option<Box<RawValue>>) {
    let Some(raw) = params else { return (None, None) };
    if !raw.get().contains("related-task") {
        return (None, Some(raw));
    }
    let Ok(mut v) = serde_json::from_str::<Value>(raw.get()) else {
        return (None, Some(raw));
    };
    let id = v
        .get_mut("_meta")
        .and_then(|m| m.get_mut(message::meta::META_RELATED_TASK))
        .and_then(|r| r.get_mut("taskId"));
    let Some(Value::String(task)) = id else {
        return (None, Some(raw));
    };
    let own = std::mem::replace(task, crate::shared::public_task_id(server, task));
    (Some(own), Some(message::to_raw(&v)))
}

/// Serializes a request for the wire, putting the owner's progress token in place of
/// the caller's. Returns the bytes and the caller's token.
pub fn encode_request(id: u64, method: &str, params: Params) -> (Vec<u8>, Option<Id>) {
    match params {
        Params::Raw(p) => (message::request(&Id::from(id), method, p.as_deref()), None),
        Params::Object { mut params, progress } => {
            if progress.is_some() {
                let meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = meta {
                    m.insert("progressToken".into(), Value::from(id));
                }
            }
            // Straight into the line: no intermediate string, no re-validation.
            (message::request_with_object(id, method, &params), progress)
        }
        Params::Members { mut params, progress } => {
            if progress.is_some() {
                // `_meta`'s other members go on as the client wrote them.
                params.edit_meta(true, |m| {
                    m.insert_raw("progressToken", &id.to_string());
                    true
                });
            }
            (message::request_with_members(id, method, &params), progress)
        }
    }
}

/// Reads a downstream's id back: ours are integers, some servers echo them as strings.
pub fn wire_id(id: &Id) -> Option<u64> {
    if id.is_string() {
        id.as_str()?.parse().ok()
    } else {
        id.as_u64()
    }
}

/// Rewrites a `notifications/progress` from the downstream for the caller: the token
/// becomes the caller's own again, byte for byte; the rest goes on as the server wrote it.
pub fn restore_progress(params: &RawValue, token: &Id) -> Option<Bytes> {
    let mut p = message::Members::parse(Some(params.to_owned())).ok()?;
    p.insert_id("progressToken", token);
    Some(Bytes::from(message::notification_with_members(
        "notifications/progress",
        &p,
    )))
}

/// The progress token a downstream put in a `notifications/progress`, as our id.
pub fn progress_token(params: Option<&RawValue>) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct P<'a> {
        #[serde(borrow, rename = "progressToken")]
        token: &'a RawValue,
    }
    let p: P = serde_json::from_str(params?.get()).ok()?;
    wire_id(&Id::from_raw(p.token))
}

#[cfg(test)]
mod tests {
    use super::id_of_broken_answer;

    #[test]
    fn a_broken_answers_id_is_read_past_what_breaks_it() {
        let cases: [(&[u8], Option<u64>); 9] = [
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"t\":\"\xff\x01\"}}",
                Some(5),
            ),
            (
                b"{\"result\":{\"id\":9,\"t\":\"\\\"id\\\":3\x00\"},\"id\" : \"12\"}",
                Some(12),
            ),
            (b"{ \"error\": {\"message\": \"\xfe\"}, \"id\": 7 }", Some(7)),
            // A request of the server's, an id that is not the gateway's, no id at all.
            (b"{\"id\":5,\"method\":\"x\",\"params\":{\"t\":\"\xff\"}}", None),
            (b"{\"id\":\"abc\",\"result\":\"\xff\"}", None),
            (b"{\"id\":-1,\"result\":\"\xff\"}", None),
            (b"{\"result\":\"\xff\"}", None),
            // Unterminated, or unbalanced.
            (b"{\"id\":5,\"result\":\"\xff", None),
            (b"]}{\"id\":5,\"result\":1}", None),
        ];
        for (line, want) in cases {
            assert_eq!(id_of_broken_answer(line), want, "{}", String::from_utf8_lossy(line));
        }
    }
}
