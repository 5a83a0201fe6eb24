//! One client session as the router sees it: its requests in flight (for cancellation
//! and limits), what it declared in `initialize`, the questions servers asked it, its
//! log level and its own channel for messages meant for it alone.

use crate::auth::Identity;
use crate::catalog::view::ViewKey;
use crate::downstream::Sink;
use crate::error::{code, Error};
use crate::message::{self, id_key, Id, Outcome};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// One client session as the router sees it: its in-flight requests, for cancellation.
pub struct Client {
    /// Session id (HTTP) or "stdio"; used in logs.
    pub id: String,
    /// `network.transport` on spans: `tcp` (HTTP) or `pipe` (stdio).
    pub transport: &'static str,
    /// The protocol version the session negotiated, once known (for spans).
    pub protocol_version: OnceLock<std::borrow::Cow<'static, str>>,
    /// Who the session belongs to, when clients are configured: its allowlist and rate
    /// limits apply. Front ends refresh it (same name) so a reload's policy takes effect.
    pub(crate) identity: RwLock<Option<Arc<Identity>>>,
    pub(crate) inflight: Mutex<HashMap<String, CancellationToken>>,
    /// Woken whenever a request of this client finishes.
    pub(crate) finished: tokio::sync::Notify,
    /// The capabilities it declared in `initialize` (sampling, elicitation, roots).
    pub(crate) capabilities: RwLock<Option<Map<String, Value>>>,
    /// Questions of servers put to this client, waiting for its answer, by the id we minted.
    pub(crate) asked: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Outcome>>>,
    pub(crate) next_ask: std::sync::atomic::AtomicU64,
    /// Server-initiated messages for this session only (resources/updated it subscribed to).
    /// Made by the first [`Client::subscribe_own`] (a stream that listens): a stateless
    /// request's client, which never listens, makes none. Until then nothing is sent,
    /// which is what a channel without receivers does too.
    own: OnceLock<broadcast::Sender<Bytes>>,
    /// The least severe log level it wants (`logging/setLevel`), as a rank; none: all.
    pub(crate) log_level: RwLock<Option<usize>>,
    /// The servers its calls went to (its roots/list_changed goes to these).
    pub(crate) used: Mutex<std::collections::HashSet<Arc<str>>>,
    /// A 2026-07-28 (stateless) client: one request, no session. Servers' questions
    /// reach it only through `questions` (multi round-trip requests), and it gets log
    /// messages only when its request named a level.
    pub(crate) stateless: bool,
    /// Where a stateless client's call hands servers' questions (the stateless flow's rounds);
    /// none: they are refused.
    pub(crate) questions: Option<tokio::sync::mpsc::Sender<Question>>,
    /// No log messages at all (a stateless request without `logLevel`).
    pub(crate) silent: bool,
    /// The view of its endpoint (a profile, a tag query); none: the whole catalog. Fixed
    /// for the session's life: a session belongs to the endpoint that opened it.
    pub(crate) view: Option<ViewKey>,
    /// Its row in the console (a session's: set when it opens); none: not shown.
    pub(crate) stats: OnceLock<Arc<crate::console::ClientStats>>,
    /// A session's owner, as `gateway.max_sessions_per_client` counts sessions: `client
    /// 'NAME'`, else [`ADDRESS_SHARE`] and the address. What a stdio server's
    /// `max_calls_per_client` counts by ([`counted_as`]); none (stdio, stateless): the
    /// client's id.
    pub(crate) share: Option<Arc<str>>,
}

/// What a session's share without an identity starts with (the address follows).
pub const ADDRESS_SHARE: &str = "address ";
/// What a stateless request's client id starts with (the principal, its identity or its
/// address, follows).
pub const STATELESS_ID: &str = "stateless:";

/// Whom a caller without an identity counts as for a per-client bound: the address of a
/// session's share (`address IP`) or of a stateless caller's id (`stateless:IP`), so that
/// an address's sessions and its stateless calls count as one client; else its id.
pub fn counted_as<'a>(share: Option<&'a str>, id: &'a str) -> &'a str {
    match share {
        Some(share) => share.strip_prefix(ADDRESS_SHARE).unwrap_or(share),
        None => id.strip_prefix(STATELESS_ID).unwrap_or(id),
    }
}

/// A server's question during a stateless call, for the client: what the call's rounds
/// (the stateless flow) turn into an `input_required` result.
pub struct Question {
    pub method: String,
    pub params: Option<Box<RawValue>>,
    pub answer: tokio::sync::oneshot::Sender<Outcome>,
}

/// Six random base-36 characters, chosen once per process.
/// How logs and traces name session `id`: the first 16 hex digits of its SHA-256 (the
/// start of its digest in Redis keys). A session id works as a bearer credential for
/// whoever holds it, so it is never written out itself; an operator who has one finds
/// its lines by `printf %s "$ID" | sha256sum | cut -c1-16`.
pub fn session_tag(id: &str) -> String {
    let mut tag = crate::cluster::digest(id);
    tag.truncate(16);
    tag
}

pub(crate) fn process_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..6)
            .map(|_| char::from_digit(rng.random_range(0..36), 36).unwrap_or('0'))
            .collect()
    })
}

/// A client's answer as a server may read it: an error that is no JSON-RPC error object
/// (`code` an integer, `message` a string) would be dropped by the server, which then
/// waits for an answer until its own timeout; it goes as the gateway's error instead.
fn well_formed(outcome: Outcome) -> Outcome {
    let Outcome::Error(e) = &outcome else { return outcome };
    let ok = serde_json::from_str::<serde_json::Value>(e.get()).is_ok_and(|v| {
        v.get("code").is_some_and(serde_json::Value::is_i64)
            && v.get("message").is_some_and(serde_json::Value::is_string)
    });
    if ok {
        return outcome;
    }
    debug!("a client answered a server's question with a malformed error; the server gets the gateway's");
    Outcome::from(Error::client(
        code::INTERNAL_ERROR,
        "the client answered with an error that is not a JSON-RPC error object (an integer code and a string message)",
    ))
}

/// How long a client gets to answer a server's question (a person may be answering).
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

impl crate::downstream::Peer for Client {
    fn tell(&self, line: Bytes) -> bool {
        if self.stateless {
            return false;
        }
        self.send_own(line.clone());
        // In a cluster the session's stream may be held by another replica.
        if let Some(n) = crate::upstream::consent::get().and_then(|c| c.notifier()) {
            n.to_session_elsewhere(&self.id, line);
        }
        true
    }

    fn wants_log(&self, level: &str) -> bool {
        if self.silent {
            return false;
        }
        let wanted = *crate::sync::read(&self.log_level);
        match (wanted, crate::downstream::log_rank(level)) {
            (Some(min), Some(rank)) => rank >= min,
            _ => true,
        }
    }

    fn ask(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
        sink: Sink,
    ) -> futures::future::BoxFuture<'static, Outcome> {
        Box::pin(async move {
            // A server may ask a client only these (the spec's server→client requests; a
            // ping is the gateway's to answer): anything else, such as tools/call or a
            // notification sent with an id, reaches no client.
            let Some(cap) = ASKED_FOR.iter().find(|(m, _)| *m == method).map(|(_, cap)| *cap) else {
                return Outcome::from(Error::client(
                    code::METHOD_NOT_FOUND,
                    format!("Method not found: {method} (mcp-gateway asks its clients sampling/createMessage, elicitation/create and roots/list for servers, nothing else)"),
                ));
            };
            if let Some((code, why)) = self.refusal(cap, &method, params.as_deref()) {
                return Outcome::from(Error::client(code, why));
            }
            let mut params = params;
            if method == "sampling/createMessage" {
                params = without_context(params);
            }
            if self.stateless {
                let Some(questions) = &self.questions else {
                    return Outcome::from(Error::client(code::METHOD_NOT_FOUND, format!(
                            "the client speaks 2026-07-28 (stateless): it can be asked {method} only during tools/call, prompts/get or resources/read, and only for a capability it declared (sampling, elicitation, roots)"
                        )));
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                let q = Question {
                    method: method.clone(),
                    params,
                    answer: tx,
                };
                if questions.send(q).await.is_err() {
                    return Outcome::from(Error::gateway(format!("the call {method} was asked for has ended")));
                }
                debug!(session = %session_tag(&self.id), %method, "a server's question goes to the client as input_required");
                return tokio::select! {
                    a = rx => a.unwrap_or_else(|_| Outcome::from(Error::gateway(format!("the client did not answer {method} (its call ended)")))),
                    _ = sink.call_over() => Outcome::from(Error::gateway(format!("the call {method} was asked for ended before the client answered"))),
                };
            }
            let n = self.next_ask.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // The process's tag keeps ids of two replicas serving one session apart.
            let id = Id::string(&format!("mcp-gateway-{}-{n}", process_tag()));
            let (tx, rx) = tokio::sync::oneshot::channel();
            // Taken out of `asked` however this ends, a dropped ask included (the server
            // withdrew its question while it waited).
            let _asked = Asked::insert(&self, id_key(&id), tx);
            debug!(session = %session_tag(&self.id), %method, request = %id, "asking the client for a server");
            // A client that does not read its stream leaves the send waiting: the call's
            // end (its server's timeout, a cancel) ends the wait too.
            let sent = tokio::select! {
                sent = sink.send(Bytes::from(message::request(&id, &method, params.as_deref()))) => sent,
                _ = sink.call_over() => {
                    return Outcome::from(Error::gateway(format!(
                        "the call {method} was asked for ended before the question could be sent (the client does not read its stream)"
                    )));
                }
            };
            if !sent {
                return Outcome::from(Error::gateway(format!(
                    "the client's stream closed before {method} could be sent"
                )));
            }
            // The question lives as long as the call it was asked for: once that call is
            // over (cancelled, timed out) nobody will read the answer.
            let answer = tokio::select! {
                a = tokio::time::timeout(ASK_TIMEOUT, rx) => Some(a),
                _ = sink.call_over() => None,
            };
            let withdraw = |reason: &str| {
                let params = message::to_raw(&json!({ "requestId": id, "reason": reason }));
                sink.try_send(Bytes::from(message::notification(
                    "notifications/cancelled",
                    Some(&params),
                )));
            };
            match answer {
                Some(Ok(Ok(outcome))) => outcome,
                Some(Ok(Err(_))) => Outcome::from(Error::gateway(format!(
                    "the client's session ended before it answered {method}"
                ))),
                Some(Err(_)) => {
                    withdraw("timed out in mcp-gateway");
                    Outcome::from(Error::client(
                        code::REQUEST_TIMEOUT,
                        format!("the client did not answer {method} in time"),
                    ))
                }
                None => {
                    withdraw("the call it was asked for has ended");
                    Outcome::from(Error::gateway(format!(
                        "the call {method} was asked for ended before the client answered"
                    )))
                }
            }
        })
    }
}

/// A question's entry in [`Client::asked`], removed when this is dropped.
struct Asked<'a> {
    client: &'a Client,
    key: String,
}

impl<'a> Asked<'a> {
    fn insert(client: &'a Client, key: String, answer: tokio::sync::oneshot::Sender<Outcome>) -> Self {
        crate::sync::lock(&client.asked).insert(key.clone(), answer);
        Asked { client, key }
    }
}

impl Drop for Asked<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.client.asked).remove(&self.key);
    }
}

/// The mode of an `elicitation/create`: `form` when it names none (as clients must read it).
fn elicitation_mode(params: Option<&RawValue>) -> String {
    #[derive(serde::Deserialize)]
    struct P {
        mode: Option<Value>,
    }
    match params
        .and_then(|p| serde_json::from_str::<P>(p.get()).ok())
        .and_then(|p| p.mode)
    {
        None | Some(Value::Null) => "form".to_owned(),
        Some(Value::String(m)) => m,
        Some(other) => other.to_string(),
    }
}

/// Whether a client's `elicitation` capability covers `mode`: an empty object (or one
/// that is no object) is form mode only, for backwards compatibility (2025-11-25).
fn elicitation_supports(declared: &Value, mode: &str) -> bool {
    match declared.as_object() {
        Some(modes) if !modes.is_empty() => modes.contains_key(mode),
        _ => mode == "form",
    }
}

impl Client {
    /// Why this client cannot be asked `method` (one of [`ASKED_FOR`], whose capability is
    /// `cap`) with `params`, if it cannot: the capability undeclared (-32601), an
    /// elicitation mode or sampling with tools it did not declare (-32602, as the client's
    /// own error for one would be).
    pub fn refusal(&self, cap: &str, method: &str, params: Option<&RawValue>) -> Option<(i64, String)> {
        let declared = crate::sync::read(&self.capabilities)
            .as_ref()
            .and_then(|c| c.get(cap).cloned());
        let Some(declared) = declared else {
            return Some((
                code::METHOD_NOT_FOUND,
                format!("the client did not declare the {cap} capability, so it cannot answer {method}"),
            ));
        };
        if method == "sampling/createMessage" {
            if let Some(why) = sampling_refusal(&declared, params) {
                return Some((code::INVALID_PARAMS, why));
            }
        }
        if method == "elicitation/create" {
            let mode = elicitation_mode(params);
            if !elicitation_supports(&declared, &mode) {
                // Servers MUST NOT send a mode the client does not support; the client's
                // error for one is -32602 (2025-11-25).
                return Some((
                    code::INVALID_PARAMS,
                    format!(
                        "the client did not declare elicitation.{}, so it cannot answer a {}-mode elicitation/create",
                        crate::error::echo(&mode),
                        crate::error::echo(&mode)
                    ),
                ));
            }
        }
        None
    }
}

/// Why a server's `sampling/createMessage` may not reach a client that declared sampling
/// as `declared`, if it may not: `tools` to a client that did not declare `sampling.tools`
/// (servers MUST NOT send them).
fn sampling_refusal(declared: &Value, params: Option<&RawValue>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct P {
        tools: Option<Value>,
    }
    let p = params.and_then(|p| serde_json::from_str::<P>(p.get()).ok())?;
    let tools = p.tools.is_some_and(|t| !t.is_null());
    (tools && declared.get("tools").is_none()).then(|| {
        "the client did not declare sampling.tools, so it cannot answer a sampling/createMessage with tools".to_owned()
    })
}

/// A server's `sampling/createMessage` params with `includeContext` "none": through the
/// gateway a client's context of "this server" (or of all servers) is every server behind
/// it, so the asking server would get the others' context back in the answer. The client
/// MAY ignore the request (2025-11-25), so the gateway, the server's client, does.
pub fn without_context(params: Option<Box<RawValue>>) -> Option<Box<RawValue>> {
    let raw = params?;
    if !raw.get().contains("includeContext") {
        return Some(raw);
    }
    let Ok(mut p) = serde_json::from_str::<Map<String, Value>>(raw.get()) else {
        return Some(raw);
    };
    match p.get("includeContext") {
        None | Some(Value::Null) => Some(raw),
        Some(Value::String(s)) if s == "none" => Some(raw),
        Some(_) => {
            debug!(
                "a server's sampling/createMessage asked for context; it goes to the client with includeContext none"
            );
            p.insert("includeContext".into(), Value::String("none".into()));
            Some(message::to_raw(&Value::Object(p)))
        }
    }
}

/// The questions a server may ask a client, each with the client capability it needs.
pub const ASKED_FOR: [(&str, &str); 3] = [
    ("sampling/createMessage", "sampling"),
    ("elicitation/create", "elicitation"),
    ("roots/list", "roots"),
];

/// What a stateless request's client is made of ([`Client::stateless`]).
pub struct StatelessClient {
    pub id: String,
    pub transport: &'static str,
    pub version: &'static str,
    pub capabilities: Map<String, Value>,
    pub log_rank: Option<usize>,
    pub identity: Option<Arc<Identity>>,
    pub view: Option<ViewKey>,
}

impl Client {
    /// Keeps the capabilities from the client's `initialize` params.
    pub fn set_capabilities(&self, params: Option<&RawValue>) {
        let caps = message::params_object(params)
            .ok()
            .and_then(|mut p| match p.remove("capabilities") {
                Some(Value::Object(c)) => Some(c),
                _ => None,
            });
        *crate::sync::write(&self.capabilities) = caps;
    }

    /// Delivers the client's answer to a question a server asked it. False when no
    /// question has that id.
    pub fn answer(&self, id: Option<&Id>, outcome: Outcome) -> bool {
        let Some(id) = id else { return false };
        match crate::sync::lock(&self.asked).remove(&id_key(id)) {
            Some(tx) => tx.send(well_formed(outcome)).is_ok(),
            None => false,
        }
    }

    pub fn new(id: impl Into<String>) -> Client {
        Client {
            id: id.into(),
            transport: "tcp",
            protocol_version: OnceLock::new(),
            identity: RwLock::new(None),
            inflight: Mutex::new(HashMap::new()),
            finished: tokio::sync::Notify::new(),
            capabilities: RwLock::new(None),
            asked: Mutex::new(HashMap::new()),
            next_ask: std::sync::atomic::AtomicU64::new(1),
            own: OnceLock::new(),
            log_level: RwLock::new(None),
            used: Mutex::new(std::collections::HashSet::new()),
            stateless: false,
            questions: None,
            silent: false,
            view: None,
            stats: OnceLock::new(),
            share: None,
        }
    }

    /// Makes it a session of `share`'s (see [`Client::share`]).
    pub fn of_share(mut self, share: Arc<str>) -> Client {
        self.share = Some(share);
        self
    }

    /// Makes it a client of the endpoint of `view` (none: the whole catalog).
    pub fn in_view(mut self, view: Option<ViewKey>) -> Client {
        self.view = view;
        self
    }

    /// The view of its endpoint; none: the whole catalog.
    pub fn view(&self) -> Option<&ViewKey> {
        self.view.as_ref()
    }

    /// A 2026-07-28 (stateless) request's client, made in one step (it is made for every
    /// such request): speaking `version`, with the capabilities its request's `_meta`
    /// declared and the log level it asked for (none: no log messages).
    pub fn stateless(request: StatelessClient) -> Client {
        let StatelessClient {
            id,
            transport,
            version,
            capabilities,
            log_rank,
            identity,
            view,
        } = request;
        Client {
            transport,
            protocol_version: OnceLock::from(std::borrow::Cow::Borrowed(version)),
            identity: RwLock::new(identity),
            capabilities: RwLock::new(Some(capabilities)),
            log_level: RwLock::new(log_rank),
            stateless: true,
            silent: log_rank.is_none(),
            view,
            // Its one request goes in at once: room made now, not grown then.
            inflight: Mutex::new(HashMap::with_capacity(1)),
            ..Client::new(id)
        }
    }

    /// Lets a stateless client's servers ask it questions, through `tx` (the stateless flow's rounds).
    pub fn questions(mut self, tx: tokio::sync::mpsc::Sender<Question>) -> Client {
        self.questions = Some(tx);
        self
    }

    /// Messages meant for this session alone (its resource subscriptions).
    pub fn subscribe_own(&self) -> broadcast::Receiver<Bytes> {
        self.own.get_or_init(|| broadcast::channel(64).0).subscribe()
    }

    /// Sends a message meant for this session alone to its listening streams (none yet:
    /// dropped, as a channel without receivers drops it).
    pub(crate) fn send_own(&self, line: Bytes) {
        if let Some(own) = self.own.get() {
            let _ = own.send(line);
        }
    }

    /// Sets `network.transport` for this session's spans.
    pub fn transport(mut self, transport: &'static str) -> Client {
        self.transport = transport;
        self
    }

    /// The identity whose allowlist and limits apply (`None`: no auth configured).
    pub fn identity(&self) -> Option<Arc<Identity>> {
        crate::sync::read(&self.identity).clone()
    }

    /// Sets (or refreshes) the session's identity.
    pub fn set_identity(&self, identity: Option<Arc<Identity>>) {
        *crate::sync::write(&self.identity) = identity;
    }

    pub(crate) fn inflight(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        crate::sync::lock(&self.inflight)
    }

    /// Completes when no request of this client is in flight.
    pub async fn idle(&self) {
        loop {
            let woken = self.finished.notified();
            if self.inflight().is_empty() {
                return;
            }
            woken.await;
        }
    }

    /// Cancels every request still in flight (the session ended).
    pub fn cancel_all(&self) {
        for (_, t) in self.inflight().drain() {
            t.cancel();
        }
        crate::sync::lock(&self.asked).clear();
    }
}

/// Removes a request from its client's in-flight table when it ends, whatever way.
pub(crate) struct Unregister<'a> {
    pub(crate) client: &'a Client,
    pub(crate) key: String,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        self.client.inflight().remove(&self.key);
        self.client.finished.notify_waiters();
    }
}
