//! A Streamable HTTP downstream (2025-03-26 … 2025-11-25, and 2026-07-28's stateless
//! requests: no session, the `Mcp-*` request metadata headers).
//!
//! The task that owns the connection keeps the session (`Mcp-Session-Id`, negotiated
//! `MCP-Protocol-Version`) and runs each request as its own small task: POST, then read
//! a JSON answer or an SSE stream (progress and log messages on it belong to that call).
//! A 404 on the session means the server forgot it: the gateway re-initializes and
//! resends, once. A stream that ends before its answer is resumed with GET and
//! `Last-Event-ID` when the server gave event ids. A GET stream carries the server's
//! own notifications and reconnects with backoff. Shutdown sends DELETE.

use super::{encode_request, restore_progress, wire_id, Command, Connection, DsError, Incoming, Params, Sink};
use crate::config::HttpSpec;
use crate::message::{self, Id, Kind, Outcome};
use crate::sse;
use crate::sync;
use crate::telemetry::TraceHeaders;

use super::client::{HttpClient, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use http::{Method, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

const SESSION: &str = "mcp-session-id";
const VERSION: &str = "mcp-protocol-version";
/// Longest pause between GET stream reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How many times a broken response stream is resumed before the call fails.
const MAX_RESUMES: usize = 5;
/// The shortest wait a server's `retry:` sets before a stream is opened again.
const RETRY_FLOOR_MS: u64 = 500;
/// How much of an error answer's body is read (200 characters of it are shown).
const ERROR_BODY_MAX: usize = 64 << 10;
use super::client::POOL_MAX_IDLE;
/// After a call's answer arrived on its SSE stream, the rest of the stream is read (in
/// the background: the answer is already on its way) for up to this long, so that the
/// connection goes back to the pool instead of being closed.
const DRAIN_TIME: Duration = Duration::from_secs(2);
/// … and up to this many bytes.
const DRAIN_BYTES: usize = 1 << 20;
/// At most this many such streams per server at a time (each holds a connection): past
/// it, an unfinished stream is dropped and its connection closed.
const MAX_DRAINS: usize = POOL_MAX_IDLE;

/// Builds the HTTP client for one server ([`HttpClient`]).
pub fn client(spec: &HttpSpec) -> Result<HttpClient, String> {
    let url = reqwest::Url::parse(spec.url.expose()).map_err(|e| format!("{} is not a URL: {e}", spec.url_display))?;
    HttpClient::new(&url, spec.ca_file.as_deref())
}

/// The configured headers, marked sensitive so they never show in debug output.
pub fn headers(spec: &HttpSpec) -> Result<HeaderMap, String> {
    let mut h = HeaderMap::new();
    for (k, v) in &spec.headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| format!("bad header name {k}"))?;
        let mut value = HeaderValue::from_str(v.expose()).map_err(|_| format!("bad value for header {k}"))?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    Ok(h)
}

/// What must never be shown of a server's configuration, should the server (or an
/// error about it) repeat it: each header's value, and the credential after its scheme
/// (`Bearer …`); the URL's password and query values, decoded and as written.
pub(super) fn secret_values(spec: &HttpSpec) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, v) in &spec.headers {
        let v = v.expose();
        out.push(v.to_owned());
        if let Some((_, credential)) = v.trim().rsplit_once(' ') {
            out.push(credential.to_owned());
        }
    }
    if let Ok(url) = reqwest::Url::parse(spec.url.expose()) {
        if let Some(p) = url.password() {
            out.push(p.to_owned());
            out.extend(percent_decoded(p));
        }
        for part in url.query().unwrap_or_default().split('&') {
            if let Some((_, v)) = part.split_once('=') {
                out.push(v.to_owned());
                out.extend(percent_decoded(v));
            }
        }
    }
    out.retain(|v| v.len() >= super::MASKED_MIN);
    // Longest first, so a value that holds a shorter one is masked whole.
    out.sort_by_key(|v| std::cmp::Reverse(v.len()));
    out.dedup();
    out
}

/// `s` with its `%XX` escapes decoded, if it has any and they make UTF-8.
fn percent_decoded(s: &str) -> Option<String> {
    if !s.contains('%') && !s.contains('+') {
        return None;
    }
    let b = s.as_bytes();
    let (mut out, mut i) = (Vec::with_capacity(b.len()), 0);
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).ok()?, 16) {
                    Ok(x) => out.push(x),
                    Err(_) => return None,
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Starts the task that owns a Streamable HTTP session with one server.
pub fn spawn(server: Arc<str>, spec: &HttpSpec, incoming: mpsc::Sender<Incoming>) -> Result<Connection, String> {
    spawn_as(server, spec, incoming, None)
}

/// [`spawn`], for one caller: with `bearer`, every request carries its current value as
/// `Authorization` instead of any configured one (`auth.token_exchange`).
pub fn spawn_as(
    server: Arc<str>,
    spec: &HttpSpec,
    incoming: mpsc::Sender<Incoming>,
    bearer: Option<crate::upstream::exchange::Bearer>,
) -> Result<Connection, String> {
    let mut configured = headers(spec)?;
    if bearer.is_some() {
        configured.remove(http::header::AUTHORIZATION);
    }
    let shared = Arc::new(Shared {
        server: server.clone(),
        http: client(spec)?,
        secrets: secret_values(spec),
        url_display: spec.url_display.clone(),
        headers: configured,
        bearer,
        session: RwLock::new(None),
        version: RwLock::new(None),
        init_params: Mutex::new(None),
        reinit: tokio::sync::Mutex::new(()),
        incoming,
        stop: CancellationToken::new(),
        listening: std::sync::atomic::AtomicBool::new(false),
        stateless: std::sync::atomic::AtomicBool::new(false),
        drains: Arc::new(tokio::sync::Semaphore::new(MAX_DRAINS)),
        calls: super::fair::FairSlots::new(spec.max_connections),
        max_connections: spec.max_connections,
        max_message: spec.max_message,
        questions: Default::default(),
        elicitations: Mutex::default(),
    });
    let (tx, rx) = mpsc::channel(super::COMMAND_QUEUE);
    let span = tracing::info_span!("downstream", server = %server, url = %spec.url_display);
    crate::background::spawn(run(shared, rx).instrument(span));
    Ok(Connection::new(server, tx).fair())
}

/// What the owner and its request tasks share.
struct Shared {
    server: Arc<str>,
    /// The client, with the URL parsed once; it may carry a credential, so it is never
    /// shown.
    http: HttpClient,
    /// What is masked in a server's error texts and answers ([`secret_values`]).
    secrets: Vec<String>,
    url_display: String,
    headers: HeaderMap,
    /// One caller's connection: its `Authorization`, swapped on refresh.
    bearer: Option<crate::upstream::exchange::Bearer>,
    session: RwLock<Option<String>>,
    version: RwLock<Option<String>>,
    /// The params of the first `initialize`, replayed when the server forgets the session.
    init_params: Mutex<Option<Box<RawValue>>>,
    /// One re-initialization at a time.
    reinit: tokio::sync::Mutex<()>,
    incoming: mpsc::Sender<Incoming>,
    stop: CancellationToken,
    /// The GET stream task is running.
    listening: std::sync::atomic::AtomicBool,
    /// The server answered `server/discover` naming 2026-07-28: no session, and every
    /// request carries the request metadata headers.
    stateless: std::sync::atomic::AtomicBool,
    /// The longest answer or SSE event taken from the server (`gateway.max_line`).
    max_message: usize,
    /// Bodies being read to their end in the background ([`MAX_DRAINS`] at most).
    drains: Arc<tokio::sync::Semaphore>,
    /// Requests in flight (`max_connections` at most): over HTTP/1.1 each holds a
    /// connection from its POST to its answer. Only requests wait for a permit: a
    /// notification, or the answer to a question the server asked during a call, goes at
    /// once, since the call that holds a permit may be waiting for it. Waiting callers
    /// get freed slots in turn ([`super::fair`]).
    ///
    /// Over HTTP/2 the calls share one connection, and those past the server's stream
    /// limit would wait in hyper's queue, first come, first served, whoever sent them. So
    /// each POST's response sets the number of slots again: over HTTP/2 no more than the
    /// streams the server allows ([`Response::h2_streams`]), and the calls past them wait
    /// here, in turn; over HTTP/1.1 `max_connections`. Why not open more connections
    /// instead: hyper's pool keeps one HTTP/2 connection per server. Why the GET stream,
    /// the answers to the server's questions and the bodies being drained (streams
    /// without slots) are not subtracted: they come and go, and a call that waits in hyper
    /// for one of them to end waits only behind calls handed their slots in turn before it.
    calls: super::fair::FairSlots,
    /// The most slots [`Shared::calls`] has (`max_connections`).
    max_connections: usize,
    /// The server's own requests being answered ([`super::questions`]).
    questions: super::questions::Questions,
    /// The URL-mode elicitations it asked, for their completion ([`super::elicit`]).
    elicitations: Mutex<super::elicit::Elicitations>,
}

impl Shared {
    fn session(&self) -> Option<String> {
        sync::read(&self.session).clone()
    }

    /// An SSE line or event over [`Shared::max_message`].
    fn too_long(&self, n: sse::TooLong) -> DsError {
        self.unavailable(format!("sent {n}"))
    }

    fn unavailable(&self, reason: impl Into<String>) -> DsError {
        DsError::Unavailable {
            server: self.server.clone(),
            reason: self.masked(reason.into()),
        }
    }

    /// `text` with the server's secrets in it replaced by `***`: the configured ones, and
    /// the caller's current bearer token.
    fn masked(&self, text: String) -> String {
        let bearer = self.bearer.as_ref().and_then(|b| sync::read(b).clone());
        let bearer: Vec<String> = bearer
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                let mut b = vec![v.to_owned()];
                b.extend(v.trim().rsplit_once(' ').map(|(_, t)| t.to_owned()));
                b.retain(|t| t.len() >= super::MASKED_MIN);
                b
            })
            .unwrap_or_default();
        let text = super::masked(text.into(), &bearer);
        super::masked(text.into(), &self.secrets)
    }

    /// The configured headers and the session's.
    fn headers(&self, with_session: bool) -> HeaderMap {
        let mut h = self.headers.clone();
        if let Some(v) = self.bearer.as_ref().and_then(|b| sync::read(b).clone()) {
            h.insert(http::header::AUTHORIZATION, v);
        }
        if with_session {
            if let Some(v) = self.session().and_then(|s| HeaderValue::from_str(&s).ok()) {
                h.insert(SESSION, v);
            }
            if let Some(v) = sync::read(&self.version)
                .as_deref()
                .and_then(|v| HeaderValue::from_str(v).ok())
            {
                h.insert(VERSION, v);
            }
        }
        h
    }

    /// A GET (of an SSE stream) or a DELETE, with the session's headers and `extra`.
    async fn get_or_delete(&self, method: Method, extra: &[(&'static str, &str)]) -> Result<Response, DsError> {
        let mut h = self.headers(true);
        for (k, v) in extra {
            if let Ok(v) = HeaderValue::from_str(v) {
                h.insert(*k, v);
            }
        }
        self.http
            .send(method, h, Bytes::new())
            .await
            .map_err(|e| self.unavailable(e.to_string()))
    }

    /// POSTs one JSON-RPC message.
    async fn post(&self, body: Bytes, with_session: bool) -> Result<Response, DsError> {
        self.post_traced(body, with_session, None, &[]).await
    }

    fn is_stateless(&self) -> bool {
        self.stateless.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends a response body the caller is done with, so that its connection is reused:
    /// an HTTP/1.1 connection whose body is dropped unread is closed, and the next call
    /// pays for a new one. Usually the end is already there (the server closed the stream
    /// right after the answer) and this is synchronous; otherwise the rest is read in the
    /// background, bounded by [`DRAIN_TIME`], [`DRAIN_BYTES`] and [`MAX_DRAINS`], and
    /// then dropped.
    fn finish<S, E>(&self, mut body: S)
    where
        S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin + Send + 'static,
    {
        use futures::FutureExt;
        let mut read = 0usize;
        loop {
            match body.next().now_or_never() {
                Some(Some(Ok(chunk))) => {
                    read += chunk.len();
                    if read > DRAIN_BYTES {
                        return;
                    }
                }
                Some(None) | Some(Some(Err(_))) => return,
                None => break,
            }
        }
        let Ok(permit) = self.drains.clone().try_acquire_owned() else {
            return; // Enough connections are lingering already: close this one.
        };
        crate::background::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                while let Some(Ok(chunk)) = body.next().await {
                    read += chunk.len();
                    if read > DRAIN_BYTES {
                        return;
                    }
                }
            })
            .await;
        });
    }

    /// POSTs one JSON-RPC message with the call's W3C trace context as headers.
    async fn post_traced(
        &self,
        body: Bytes,
        with_session: bool,
        trace: Option<&TraceHeaders>,
        extra: &[(String, String)],
    ) -> Result<Response, DsError> {
        let mut h = self.headers(with_session);
        for (k, v) in extra {
            match (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                (Ok(k), Ok(v)) => {
                    h.append(k, v);
                }
                _ => return Err(self.unavailable(format!("cannot send header {k}: not a valid header"))),
            }
        }
        if let Some(t) = trace {
            if let Ok(v) = HeaderValue::from_str(&t.traceparent) {
                h.insert("traceparent", v);
            }
            if let Some(v) = t.tracestate.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert("tracestate", v);
            }
        }
        h.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let resp = self
            .http
            .send(Method::POST, h, body)
            .await
            .map_err(|e| self.unavailable(e.to_string()))?;
        let streams = resp.h2_streams().unwrap_or(usize::MAX);
        self.calls.limit(streams.min(self.max_connections));
        Ok(resp)
    }

    /// Sends a message that expects no answer (a notification or a response).
    async fn send(&self, body: Vec<u8>) {
        match self.post(Bytes::from(body), true).await {
            // Read the (normally empty) body, so the connection goes back to the pool.
            Ok(r) if r.status().is_success() => self.finish(r.bytes_stream()),
            Ok(r) => debug!(status = %r.status(), "notification not accepted"),
            Err(e) => debug!(error = %e, "notification not sent"),
        }
    }

    /// The server forgot session `failed`: initialize again (once, however many calls
    /// noticed) with the original params.
    async fn reinitialize(self: &Arc<Self>, failed: Option<String>) -> Result<(), DsError> {
        let _one = self.reinit.lock().await;
        if self.session() != failed {
            return Ok(());
        }
        let params = sync::lock(&self.init_params).clone();
        let Some(params) = params else {
            return Err(self.unavailable("session lost before initialize"));
        };
        info!("server forgot the session; initializing again");
        *sync::write(&self.session) = None;
        let body = message::request(&Id::from(0), "initialize", Some(&params));
        let resp = self.post(Bytes::from(body), false).await?;
        self.keep_session(&resp);
        let outcome = self.read_answer(resp, 0, None, None).await?;
        if let Outcome::Error(e) = outcome {
            return Err(self.unavailable(format!("re-initialize failed: {}", message::error_summary(&e).1)));
        }
        self.send(message::notification("notifications/initialized", None))
            .await;
        let _ = self.incoming.send(Incoming::Reinitialized).await;
        Ok(())
    }

    fn keep_session(&self, resp: &Response) {
        if let Some(s) = resp.headers().get(SESSION).and_then(|v| v.to_str().ok()) {
            *sync::write(&self.session) = Some(s.to_owned());
        }
    }

    /// Reads the answer to request `id` from a successful POST (JSON or SSE), resuming a
    /// broken stream when the server allows it.
    async fn read_answer(
        self: &Arc<Self>,
        resp: Response,
        id: u64,
        sink: Option<&Sink>,
        progress: Option<&Id>,
    ) -> Result<Outcome, DsError> {
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        let max = self.max_message;
        if !is_sse {
            return self.read_values(resp, id, sink, progress).await;
        }
        let mut first = Some(resp);
        let mut parser = sse::Parser::with_limit(max);
        let mut retry = Duration::from_millis(1000);
        for _ in 0..=MAX_RESUMES {
            let resp = match first.take() {
                Some(r) => r,
                None => {
                    let Some(last) = parser.last_id.clone() else {
                        return Err(self.unavailable("the response stream ended before the answer (not resumable)"));
                    };
                    tokio::time::sleep(retry).await;
                    debug!(last_event_id = %last, "resuming the response stream");
                    let r = self
                        .get_or_delete(
                            Method::GET,
                            &[("accept", "text/event-stream"), ("last-event-id", &last)],
                        )
                        .await?;
                    if !r.status().is_success() {
                        return Err(self.unavailable(format!(
                            "the response stream broke and resuming it failed with HTTP {}",
                            r.status()
                        )));
                    }
                    r
                }
            };
            let mut body = resp.bytes_stream();
            loop {
                let (events, more) = match body.next().await {
                    Some(Ok(chunk)) => (parser.feed(&chunk).map_err(|n| self.too_long(n))?, true),
                    // The end (or a break): a lone CR it ended with ends an event too.
                    _ => (parser.finish(), false),
                };
                for ev in events {
                    if let Some(r) = ev.retry {
                        retry = Duration::from_millis(r.max(RETRY_FLOOR_MS));
                    }
                    if let Some(outcome) = self.stream_message(&ev.data, id, sink, progress).await {
                        self.finish(body);
                        return outcome;
                    }
                }
                if !more {
                    break;
                }
            }
        }
        Err(self.unavailable("the response stream kept breaking before the answer"))
    }

    /// Reads the answer to request `id` from a body that is not SSE: one JSON-RPC message,
    /// or messages one after another (NDJSON, as some servers stream `subscriptions/listen`),
    /// each handled as it completes: notifications and questions before the answer go
    /// where a stream's do ([`super::values`]).
    async fn read_values(
        self: &Arc<Self>,
        resp: Response,
        id: u64,
        sink: Option<&Sink>,
        progress: Option<&Id>,
    ) -> Result<Outcome, DsError> {
        let max = self.max_message;
        let too_long = || {
            self.unavailable(format!(
                "answered with more than {max} bytes, the gateway's limit (gateway.max_line)"
            ))
        };
        let declared = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut values = super::values::Values::new(max, declared);
        let mut body = resp.bytes_stream();
        // The first message, when it is an answer to another id or not an answer: a body
        // of that one message only is answered with it (or an error saying what it is).
        let mut first: Option<Result<Outcome, String>> = None;
        let mut seen = 0usize;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.unavailable(e.to_string()))?;
            for value in values.feed(&chunk).map_err(|_| too_long())? {
                seen += 1;
                let kind = Kind::parse_shared(&value);
                match kind {
                    Ok(Kind::Response { id: Some(rid), outcome }) if wire_id(&rid) == Some(id) => {
                        self.finish(body);
                        return Ok(outcome);
                    }
                    Ok(Kind::Response { outcome, .. }) if seen == 1 => first = Some(Ok(outcome)),
                    Ok(Kind::Response { .. }) => {}
                    Ok(Kind::Notification { method, params }) => {
                        self.notification(method, params, sink, progress.map(|p| (id, p))).await;
                    }
                    Ok(Kind::Request { id, method, params }) => self.question(id, method, params.into_raw(), sink),
                    Err(e) if super::id_of_broken_answer(&value) == Some(id) => {
                        return Err(self.unavailable(format!("answered with invalid JSON-RPC: {e}")));
                    }
                    Err(e) if seen == 1 => first = Some(Err(format!("answered with invalid JSON-RPC: {e}"))),
                    Err(e) => warn!(error = %e, "skipping a message that is not JSON-RPC"),
                }
                if seen == 1 && first.is_none() {
                    first = Some(Err("answered a request with something other than a response".into()));
                }
            }
        }
        if let Some(rest) = values.finish() {
            if seen == 0 {
                // Not a message that could be framed (or cut off): said as it parses.
                return match Kind::parse_shared(&rest) {
                    Ok(Kind::Response { outcome, .. }) => Ok(outcome),
                    Ok(_) => Err(self.unavailable("answered a request with something other than a response")),
                    Err(e) => Err(self.unavailable(format!("answered with invalid JSON-RPC: {e}"))),
                };
            }
            warn!(
                bytes = rest.len(),
                "the answer's body ended with bytes that are no whole message"
            );
        }
        match first {
            Some(first) if seen == 1 => first.map_err(|why| self.unavailable(why)),
            _ if seen == 0 => Err(self.unavailable("answered with an empty body")),
            _ => Err(self.unavailable("the answer's body ended without the response")),
        }
    }

    /// Handles one message from a stream; returns the outcome if it answers `id` (an error
    /// if it is an answer to `id` that does not parse: the call fails at once, rather than
    /// wait for the stream's end or its timeout).
    async fn stream_message(
        self: &Arc<Self>,
        data: &str,
        id: u64,
        sink: Option<&Sink>,
        progress: Option<&Id>,
    ) -> Option<Result<Outcome, DsError>> {
        if data.trim().is_empty() {
            return None;
        }
        match Kind::parse(data.as_bytes()) {
            Ok(Kind::Response { id: Some(rid), outcome }) if wire_id(&rid) == Some(id) => Some(Ok(outcome)),
            Err(e) if super::id_of_broken_answer(data.as_bytes()) == Some(id) => {
                Some(Err(self.unavailable(format!("answered with invalid JSON-RPC: {e}"))))
            }
            Ok(Kind::Response { .. }) => None,
            Ok(Kind::Notification { method, params }) => {
                self.notification(method, params, sink, progress.map(|p| (id, p))).await;
                None
            }
            Ok(Kind::Request { id, method, params }) => {
                self.question(id, method, params.into_raw(), sink);
                None
            }
            Err(e) => {
                warn!(error = %e, "skipping an event that is not JSON-RPC");
                None
            }
        }
    }

    /// A server's request (a question for a client): on a call's own stream it belongs to
    /// that call's client. It is answered in the background, so the stream goes on being
    /// read: the server may withdraw it (`notifications/cancelled`), send progress, or
    /// ask more ([`super::questions`]).
    fn question(self: &Arc<Self>, id: Id, method: String, params: Option<Box<RawValue>>, sink: Option<&Sink>) {
        let why = "it arrived on the server's GET stream, outside any call";
        // The client knows a task by the gateway's name for it.
        let (_, params) = super::question_task(params, &self.server);
        if let Some(sink) = sink {
            sync::lock(&self.elicitations).request(&method, params.as_deref(), sink);
        }
        let shared = self.clone();
        self.questions.answer(
            id,
            (method, params),
            sink.cloned(),
            why.to_owned(),
            move |out| async move {
                shared.send(out).await;
            },
        );
    }

    async fn notification(
        &self,
        method: String,
        params: Option<Box<RawValue>>,
        sink: Option<&Sink>,
        progress: Option<(u64, &Id)>,
    ) {
        match method.as_str() {
            // Progress for the token the gateway put in this call (its wire id) only: one
            // the server made up is not the caller's.
            "notifications/progress" => {
                let ours = progress.filter(|(id, _)| super::progress_token(params.as_deref()) == Some(*id));
                if let (Some(sink), Some((_, token)), Some(p)) = (sink, ours, params.as_deref()) {
                    if let Some(bytes) = restore_progress(p, token) {
                        let _ = sink.try_send(bytes);
                    }
                }
            }
            // On a call's own stream a log message belongs to that call.
            "notifications/message" => match sink {
                Some(sink) => sink.log(params.as_deref()),
                None => super::log_message(&self.server, params.as_deref(), &self.secrets),
            },
            // Of a question the server asked a client: withdrawn there too.
            "notifications/cancelled" => self.questions.withdraw(params.as_deref()),
            // The end of a URL-mode elicitation, for the client it was asked of (on this
            // call's stream or the GET stream, during the call or after it); one the gateway
            // did not see asked belongs to the call whose stream it came on, if any.
            "notifications/elicitation/complete" => {
                let asked = sync::lock(&self.elicitations).complete(params.as_deref());
                let line = bytes::Bytes::from(message::notification(&method, params.as_deref()));
                let delivered = match (asked, sink) {
                    (Some(asked), _) => super::elicit::deliver(&asked, line),
                    (None, Some(sink)) => sink.try_send(line),
                    (None, None) => false,
                };
                if !delivered {
                    debug!("dropping notifications/elicitation/complete: its client cannot be known or has gone");
                }
            }
            _ => {
                let _ = self.incoming.send(Incoming::Notification { method, params }).await;
            }
        }
    }

    /// Follows the session's GET stream of server notifications, reconnecting with backoff.
    async fn listen(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(500);
        let mut last_id: Option<String> = None;
        loop {
            let session = self.session();
            let mut extra = vec![("accept", "text/event-stream")];
            if let Some(id) = &last_id {
                extra.push(("last-event-id", id.as_str()));
            }
            let resp = tokio::select! {
                r = self.get_or_delete(Method::GET, &extra) => r,
                _ = self.stop.cancelled() => return,
            };
            match resp {
                Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                    debug!("the server offers no GET stream");
                    return;
                }
                Ok(r) if r.status().is_success() => {
                    let mut parser = sse::Parser::with_limit(self.max_message);
                    parser.last_id = last_id.clone();
                    let mut body = r.bytes_stream();
                    // The backoff starts over only once the stream carried something: a
                    // server that closes it at once (or says `retry: 0`) is not reopened
                    // in a loop.
                    let mut heard = false;
                    loop {
                        let chunk = tokio::select! {
                            c = body.next() => c,
                            _ = self.stop.cancelled() => return,
                        };
                        let (events, more) = match chunk {
                            Some(Ok(chunk)) => match parser.feed(&chunk) {
                                Ok(evs) => (evs, true),
                                Err(n) => {
                                    warn!(error = %self.too_long(n), "dropping the GET stream");
                                    break;
                                }
                            },
                            _ => (parser.finish(), false),
                        };
                        for ev in events {
                            if !heard {
                                heard = true;
                                backoff = Duration::from_millis(500);
                            }
                            if let Some(r) = ev.retry {
                                backoff = Duration::from_millis(r.max(RETRY_FLOOR_MS));
                            }
                            self.stream_message(&ev.data, u64::MAX, None, None).await;
                        }
                        if !more {
                            break;
                        }
                    }
                    last_id = parser.last_id;
                    debug!("GET stream ended; reconnecting");
                }
                Ok(r) => {
                    debug!(status = %r.status(), "GET stream refused");
                    if r.status() == StatusCode::NOT_FOUND {
                        // Re-initialize only if nobody has since replaced the session we sent.
                        let _ = self.reinitialize(session).await;
                    }
                }
                Err(e) => {
                    // The server is gone: report it so the supervisor reconnects.
                    let reason = match e {
                        DsError::Unavailable { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    let _ = self.incoming.send(Incoming::Closed { reason, clean: false }).await;
                    return;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// A request's task, and whether its POST went out (it may still be waiting for a slot).
type InFlight = (AbortHandle, Arc<AtomicBool>);

async fn run(shared: Arc<Shared>, mut commands: mpsc::Receiver<Command>) {
    let inflight: Arc<Mutex<HashMap<u64, InFlight>>> = Arc::default();
    while let Some(cmd) = commands.recv().await {
        match cmd {
            Command::Request {
                id,
                method,
                params,
                sink,
                reply,
                headers,
                caller,
            } => {
                // 2026-07-28: the request metadata headers, mirrored from the body.
                let stateless = method == "server/discover" || shared.is_stateless();
                let mut extra = Vec::new();
                if stateless {
                    extra.push((VERSION.to_owned(), super::stateless::VERSION.to_owned()));
                    extra.push(("mcp-method".to_owned(), method.clone()));
                    if let Params::Object { params, .. } = &params {
                        if let Some(n) = super::stateless::name_header(&method, params) {
                            extra.push(("mcp-name".to_owned(), n));
                        }
                    }
                    extra.extend(headers);
                }
                if method == "initialize" {
                    if let Params::Raw(Some(p)) = &params {
                        *sync::lock(&shared.init_params) = Some(p.clone());
                    }
                }
                // The downstream span's context, put in params._meta by the router.
                let mut params = params;
                let trace = match &mut params {
                    Params::Object { params, .. } if crate::telemetry::exporting() => {
                        crate::telemetry::Carrier::trace(params)
                    }
                    Params::Members { params, .. } if crate::telemetry::exporting() => {
                        crate::telemetry::Carrier::trace(params)
                    }
                    _ => None,
                };
                let (body, progress) = encode_request(id, &method, params);
                let sent = Arc::new(AtomicBool::new(false));
                let task = {
                    let (shared, inflight, sent) = (shared.clone(), inflight.clone(), sent.clone());
                    crate::background::spawn(async move {
                        // Waiting is bounded by the call's own timeout, whose cancellation
                        // aborts this task (and gives up its place in line).
                        let _slot = shared.calls.acquire(caller).await;
                        sent.store(true, Ordering::Release);
                        let out = call(
                            &shared,
                            id,
                            &method,
                            body,
                            sink.as_ref(),
                            progress.as_ref(),
                            trace.as_ref(),
                            &extra,
                        )
                        .await;
                        sync::lock(&inflight).remove(&id);
                        if let Err(DsError::Unavailable { reason, .. }) = &out {
                            if reason.starts_with("cannot connect") {
                                let _ = shared
                                    .incoming
                                    .send(Incoming::Closed {
                                        reason: reason.clone(),
                                        clean: false,
                                    })
                                    .await;
                            }
                        }
                        let _ = reply.send(out);
                    })
                };
                sync::lock(&inflight).insert(id, (task.abort_handle(), sent));
            }
            Command::Notify { method, params } => {
                let body = message::notification(&method, params.as_deref());
                let shared = shared.clone();
                let start_listening = method == "notifications/initialized";
                crate::background::spawn(async move {
                    shared.send(body).await;
                    if start_listening && !shared.listening.swap(true, std::sync::atomic::Ordering::AcqRel) {
                        crate::background::spawn(shared.clone().listen().in_current_span());
                    }
                });
            }
            Command::Cancel { id, reason } => {
                if let Some((task, sent)) = sync::lock(&inflight).remove(&id) {
                    task.abort();
                    // A request still waiting for a slot never reached the server: there is
                    // nothing to cancel there (and a flood of timed-out waiters would
                    // otherwise be a flood of notifications).
                    if shared.is_stateless() || !sent.load(Ordering::Acquire) {
                        // 2026-07-28: closing the response stream is the cancellation.
                        continue;
                    }
                    let params = message::to_raw(&serde_json::json!({ "requestId": id, "reason": reason }));
                    let body = message::notification("notifications/cancelled", Some(&params));
                    let shared = shared.clone();
                    crate::background::spawn(async move { shared.send(body).await });
                }
            }
            Command::Shutdown { done } => {
                shared.stop.cancel();
                for (_, (t, _)) in sync::lock(&inflight).drain() {
                    t.abort();
                }
                if shared.session().is_some() {
                    let delete = shared.get_or_delete(Method::DELETE, &[]);
                    let _ = tokio::time::timeout(Duration::from_secs(2), delete).await;
                }
                info!("session closed");
                let _ = done.send(());
                return;
            }
        }
    }
    shared.stop.cancel();
}

/// The longest wait a `Retry-After` is shown with; a longer one is shown as this.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 3600);

/// When a 429 or 503 asks to be tried again (`Retry-After`: seconds, or an HTTP date), in
/// words: "in 30s", "now"; none when the header is absent or unreadable. The gateway does
/// not retry the call itself (its caller may be a person waiting): it says so.
fn retry_after(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v)
            .ok()?
            .duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    };
    Some(match wait.min(RETRY_AFTER_MAX) {
        Duration::ZERO => "now".to_owned(),
        w if w == RETRY_AFTER_MAX && wait > w => format!("in more than {}", super::fmt_duration(w)),
        w => format!("in {}", super::fmt_duration(Duration::from_secs(w.as_secs()))),
    })
}

/// One request: POST, read the answer, re-initialize once on a forgotten session.
#[allow(clippy::too_many_arguments)]
async fn call(
    shared: &Arc<Shared>,
    id: u64,
    method: &str,
    body: Vec<u8>,
    sink: Option<&Sink>,
    progress: Option<&Id>,
    trace: Option<&TraceHeaders>,
    extra: &[(String, String)],
) -> Result<Outcome, DsError> {
    let body = Bytes::from(body);
    let is_init = method == "initialize";
    let stateless = !extra.is_empty();
    for attempt in 0..2 {
        let session = shared.session();
        let resp = shared
            .post_traced(body.clone(), !is_init && !stateless, trace, extra)
            .await?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND && session.is_some() && !is_init && attempt == 0 {
            shared.reinitialize(session).await?;
            continue;
        }
        if is_init {
            shared.keep_session(&resp);
        }
        if status == StatusCode::ACCEPTED {
            return Err(shared.unavailable(format!("answered {method} with 202 and no response")));
        }
        if !status.is_success() {
            let retry = matches!(status.as_u16(), 429 | 503)
                .then(|| retry_after(resp.headers()))
                .flatten();
            // Enough of it to show (200 characters are), never the whole of a huge body.
            let text = match resp.bytes_up_to(ERROR_BODY_MAX).await {
                Ok(Some(b)) => shared.masked(String::from_utf8_lossy(&b).into_owned()),
                Ok(None) => format!("(a body of more than {} KiB, not read)", ERROR_BODY_MAX >> 10),
                Err(_) => String::new(),
            };
            // A JSON-RPC error body is the server's answer; pass it on.
            if let Ok(Kind::Response {
                outcome: o @ Outcome::Error(_),
                ..
            }) = Kind::parse(text.as_bytes())
            {
                if !matches!(status.as_u16(), 401 | 403) {
                    let outcome = super::masked_error(&shared.server, o, |t| shared.masked(t.to_owned()));
                    if let Some(sink) = sink {
                        sync::lock(&shared.elicitations).answer(&outcome, sink);
                    }
                    return Ok(outcome);
                }
            }
            return Err(DsError::Status {
                server: shared.server.clone(),
                status: status.as_u16(),
                detail: match status.as_u16() {
                    401 | 403 => "the server refused the credentials (check `headers` in gateway.toml)".to_owned(),
                    _ => {
                        let shown = super::controls_escaped(text.chars().take(200));
                        match retry {
                            Some(r) => format!("{shown} (it asks to be tried again {r})"),
                            None => shown,
                        }
                    }
                },
            });
        }
        let outcome = super::masked_error(
            &shared.server,
            shared.read_answer(resp, id, sink, progress).await?,
            |t| shared.masked(t.to_owned()),
        );
        // Only an error may require a URL elicitation: a result takes no lock here.
        if let (Some(sink), Outcome::Error(_)) = (sink, &outcome) {
            sync::lock(&shared.elicitations).answer(&outcome, sink);
        }
        if method == "server/discover" {
            if let Outcome::Result(r) = &outcome {
                if super::stateless::discovered(r.get()).is_some() {
                    shared.stateless.store(true, std::sync::atomic::Ordering::Release);
                }
            }
        }
        if is_init {
            if let Outcome::Result(r) = &outcome {
                let v: Option<String> = serde_json::from_str::<Value>(r.get())
                    .ok()
                    .and_then(|v| v.get("protocolVersion").and_then(Value::as_str).map(str::to_owned));
                *sync::write(&shared.version) = v;
            }
        }
        return Ok(outcome);
    }
    Err(shared.unavailable(format!(
        "forgot the session again after re-initializing ({})",
        shared.url_display
    )))
}
