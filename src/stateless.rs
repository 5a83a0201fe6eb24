//! The 2026-07-28 revision (stateless): its whole request flow, for any front.
//!
//! A request of this revision needs no session: the protocol version and the client's
//! capabilities come with every request, in `params._meta`. A front adapts its transport
//! and calls [`Stateless::serve`] once per request: HTTP gives its headers (an
//! [`envelope::Headers`] adapter), stdio gives none. The front then sends the [`Answer`]:
//! an error or an outcome at once, a [`Call`] it runs the way it runs any request, the
//! [`rounds`] of a call whose server may ask questions, or a [`listen`] stream.
//!
//! The flow: [`envelope::check`] validates the request (`_meta`, and the `Mcp-*` headers
//! against the body where there are headers); `server/discover` is answered at once;
//! `subscriptions/listen` becomes a [`listen::Listen`] stream (`server/discover` advertises
//! `listChanged` and `subscribe` as `initialize` does); `tools/call`, `prompts/get` and
//! `resources/read` run as [`rounds::Round`]s: servers' questions come back as
//! `input_required`, and a retry with the `requestState` resumes the parked call (a
//! 2026-07-28 server's own `input_required` and `requestState` pass through untouched,
//! see [`crate::downstream::stateless`]); anything else is one call to the router. Every
//! result is decorated the revision's way ([`Finish`]).
//!
//! Each request runs as an ephemeral [`Client`] named by the front (after the caller's
//! identity with auth, or its address), so rate limits and per-session server processes
//! key on that. On a transport that cancels by id (stdio: `notifications/cancelled`), the
//! requests in flight are kept by id ([`Stateless::cancel`]); over HTTP a request is
//! cancelled by closing its connection.

pub mod envelope;
pub mod listen;
pub mod remote;
mod results;
pub mod rounds;

pub use envelope::Headers;
pub use results::Finish;

use crate::auth::Identity;
use crate::catalog::view::ViewKey;
use crate::error::Error;
use crate::message::{self, id_key, Id, Outcome};
use crate::method::Method;
use crate::router::{Client, Gateway};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The one stateless revision served.
pub use crate::message::meta::VERSION;

/// Every version the gateway serves: this one statelessly, the rest with `initialize`.
pub fn supported_versions() -> Vec<&'static str> {
    let mut all = vec![VERSION];
    all.extend_from_slice(crate::router::SUPPORTED_VERSIONS);
    all
}

/// What the flow needs to know of a front's transport.
pub struct Transport {
    /// `network.transport` on its clients' spans: `tcp` or `pipe`.
    pub name: &'static str,
    /// Requests are cancelled with `notifications/cancelled` naming their id (so an id is
    /// in flight once at most), not by closing a connection.
    pub cancel_by_id: bool,
}

/// One request of this revision, as a front read it.
pub struct Request<'a> {
    pub id: Id,
    pub method: String,
    pub params: crate::message::Incoming,
    /// The transport's headers, checked against the body; none: a transport without any.
    pub headers: Option<&'a dyn Headers>,
    /// Who the caller is, when auth is configured.
    pub identity: Option<Arc<Identity>>,
    /// Who may resume a parked call.
    pub principal: Principal,
    /// The id of the request's ephemeral client (logs and spans).
    pub client: String,
    /// The caller's trace context.
    pub parent: Option<opentelemetry::Context>,
    /// The transport can answer with a stream (over HTTP: Accept admits it).
    pub streams: bool,
    /// The view of the endpoint it came to (a profile, a tag query); none: the whole
    /// catalog.
    pub view: Option<ViewKey>,
}

/// Who may resume a request's parked call: the identity's name, or what the transport
/// knows of the caller. Made into text only for a call that runs in rounds.
pub enum Principal {
    Named(String),
    /// The request's client id, from this byte on.
    InClient(usize),
}

/// What the front sends for a request.
pub enum Answer {
    /// Refused before anything ran.
    Refused(Id, Error),
    /// The whole answer, now.
    Now(Id, Outcome),
    /// A call to the router, run by the front.
    Call(Call),
    /// A call whose server may ask questions: what to send, in order (related messages,
    /// then the response). Dropping it before its end cancels the call.
    Rounds(rounds::Rounds),
    /// A `subscriptions/listen` stream, for [`listen::run`].
    Listen(listen::Listen),
}

/// A call the front runs (related messages to its sink), then answers with
/// `finish` applied to its outcome.
pub struct Call {
    pub client: Arc<Client>,
    pub id: Id,
    pub method: Method,
    /// Opened already, the envelope's `_meta` members taken out.
    pub params: message::Incoming,
    pub parent: Option<opentelemetry::Context>,
    pub finish: Finish,
    /// Its entry in the table of requests in flight, until it is answered.
    pub held: Option<Tracked>,
    /// Its place among its caller's requests in flight ([`Slot`]), until it is answered.
    pub _slot: Slot,
}

/// Requests in flight by caller (its principal: the identity's name, or the address a
/// stateless client is named after), held from a request's start to its answer.
type Callers = Arc<Mutex<HashMap<String, usize>>>;

/// One request's place among its caller's requests in flight: `gateway.max_in_flight`
/// bounds a stateless caller's as it bounds a session's (one address, or one identity,
/// cannot start unbounded calls at once by not keeping a session).
pub struct Slot {
    callers: Callers,
    caller: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut callers = crate::sync::lock(&self.callers);
        if let Some(n) = callers.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                callers.remove(&self.caller);
            }
        }
    }
}

/// A request in flight on a transport that cancels by id.
enum InFlight {
    /// Cancelled through its client (the router cancels the downstream call).
    Call(Arc<Client>),
    /// A listen stream, or a call that may ask questions: ends when cancelled.
    Stop(CancellationToken),
}

type Table = Arc<Mutex<HashMap<String, InFlight>>>;

/// A request's entry in the table of requests in flight, removed when dropped.
pub struct Tracked {
    table: Table,
    key: String,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        crate::sync::lock(&self.table).remove(&self.key);
    }
}

/// One open listen stream, counted while it lives.
pub(crate) struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A listen request, between its checks and its stream.
struct Listening {
    id: Id,
    params: Option<Box<RawValue>>,
    capabilities: serde_json::Map<String, Value>,
    /// The request's client id; the stream's own client is named after it.
    client: String,
    identity: Option<Arc<Identity>>,
    finish: Finish,
    streams: bool,
    /// Its key in the table of requests in flight.
    key: Option<String>,
    view: Option<ViewKey>,
}

/// One thing a call's rounds send: a related message, or (last) the response.
pub enum Sent {
    Related(bytes::Bytes),
    Answer(crate::message::Answer),
}

/// The flow's state on one front: calls parked between rounds, open listen streams,
/// requests in flight by id.
pub struct Stateless {
    gw: Arc<Gateway>,
    transport: Transport,
    parked: Arc<rounds::Parked>,
    /// Cancelled when the front closes: listen streams end gracefully.
    closing: CancellationToken,
    listening: Arc<AtomicUsize>,
    inflight: Table,
    callers: Callers,
}

impl Stateless {
    pub fn new(gw: Arc<Gateway>, transport: Transport, closing: CancellationToken) -> Stateless {
        // Read once: a reload's input_timeout applies after a restart.
        let parked = rounds::Parked::new(gw.config().gateway.input_timeout, gw.cluster().cloned());
        if gw.cluster().is_some() {
            // Other replicas' retries of calls parked here, and steps of those driven from here.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            gw.on_rounds(tx);
            let weak = Arc::downgrade(&parked);
            crate::background::spawn(async move {
                while let Some(note) = rx.recv().await {
                    let Some(parked) = weak.upgrade() else { return };
                    remote::handle(&parked, note);
                }
            });
        }
        Stateless {
            gw,
            transport,
            parked,
            closing,
            listening: Arc::new(AtomicUsize::new(0)),
            inflight: Arc::default(),
            callers: Arc::default(),
        }
    }

    /// Validates one request and says what to send for it.
    pub fn serve(&self, r: Request<'_>) -> Answer {
        let Request {
            id,
            method,
            params,
            headers,
            identity,
            principal,
            client,
            parent,
            streams,
            view,
        } = r;
        let m = Method::parse(&method);
        let topo = self.gw.topology();
        let shown = view.as_ref().map(|k| topo.view(k));
        // A schema is given only when it asks for param headers (the catalog keeps those:
        // usually none, so no lookup at all); a tool the caller's allowlist or view hides
        // is not looked at (it is answered as unknown).
        let tool_schema = |name: &str| -> Option<Value> {
            let schema = topo.catalog.param_schemas.get(name)?;
            if !identity.as_ref().is_none_or(|i| i.permits_in(&topo.catalog, name)) {
                return None;
            }
            let route = topo.catalog.tools.get(name)?;
            if !shown
                .as_ref()
                .is_none_or(|v| v.has_tool(&topo.catalog, name, route.server))
            {
                return None;
            }
            Some(schema.clone())
        };
        let env = match envelope::check(headers, &method, m, params, tool_schema) {
            Ok(e) => e,
            Err(e) => return Answer::Refused(id, e),
        };
        let private = topo.auth.required();
        if m == Method::ServerDiscover {
            let init = self.gw.initialize_result_for(None, identity.as_deref(), view.as_ref());
            return Answer::Now(id, results::discover(&init, private));
        }
        let key = self.transport.cancel_by_id.then(|| id_key(&id));
        if let Some(key) = &key {
            if crate::sync::lock(&self.inflight).contains_key(key) {
                return Answer::Refused(
                    id,
                    Error::invalid_request(format!("request id {key} is already in use")),
                );
            }
        }
        let finish = Finish {
            method: m,
            private,
            uri: env.uri,
            hint: topo.catalog.hint(m),
        };
        if m == Method::SubscriptionsListen {
            let listen = Listening {
                id,
                params: env.params.into_raw(),
                capabilities: env.capabilities,
                client,
                identity,
                finish,
                streams,
                key,
                view,
            };
            return self.listen(listen);
        }
        let max = topo.config.gateway.max_in_flight;
        let Some(slot) = self.slot(&client, max) else {
            return Answer::Refused(
                id,
                Error::invalid_request(format!(
                    "this caller already has {max} requests in flight (gateway.max_in_flight); wait for some to finish"
                )),
            );
        };
        // A call parked on one endpoint is resumed on the same endpoint only: its state
        // is issued for the principal there.
        let rounds = env.rounds;
        let principal = rounds.then(|| {
            let named = match principal {
                Principal::Named(p) => p,
                Principal::InClient(at) => client.get(at..).unwrap_or_default().to_owned(),
            };
            match &view {
                None => named,
                Some(k) => format!("{named} at {}", k.encode()),
            }
        });
        let client = self.client(client, env.capabilities, env.log_rank, identity, view);
        if let Some(principal) = principal {
            let stop = key.is_some().then(CancellationToken::new);
            let held = stop
                .as_ref()
                .and_then(|s| self.track(key, || InFlight::Stop(s.clone())));
            let round = rounds::Round {
                gw: self.gw.clone(),
                parked: self.parked.clone(),
                id: id.clone(),
                principal,
                finish,
                stop,
                _held: held,
                _slot: slot,
            };
            return match round.start(client, env.params, env.retry, parent) {
                Ok(rounds) => Answer::Rounds(rounds),
                Err(e) => Answer::Refused(id, e),
            };
        }
        let client = Arc::new(client);
        let held = self.track(key, || InFlight::Call(client.clone()));
        Answer::Call(Call {
            client,
            id,
            method: m,
            params: env.params,
            parent,
            finish,
            held,
            _slot: slot,
        })
    }

    /// A `subscriptions/listen` that passed the envelope's checks.
    fn listen(&self, l: Listening) -> Answer {
        let id = l.id;
        if !l.streams {
            let e =
                Error::invalid_request("subscriptions/listen answers with a stream: send Accept: text/event-stream")
                    .with_status(406);
            return Answer::Refused(id, e);
        }
        let filter = match message::params_object(l.params.as_deref()).and_then(|p| listen::Filter::parse(&p)) {
            Ok(f) => f,
            Err(e) => return Answer::Refused(id, Error::invalid_params(e)),
        };
        // Each stream is a task, a client and its subscriptions: at most max_sessions
        // open at once on every front (stdio too, or a client listening in a loop grows
        // the process without end).
        let max = self.gw.config().gateway.max_sessions;
        if self.listening.fetch_add(1, Ordering::Relaxed) >= max {
            self.listening.fetch_sub(1, Ordering::Relaxed);
            let e = Error::gateway(format!(
                "the gateway has {max} open listen streams, its limit (gateway.max_sessions); close one or try later"
            ))
            .with_status(503);
            return Answer::Refused(id, e);
        }
        let counted = Counted(self.listening.clone());
        static LISTENS: AtomicU64 = AtomicU64::new(1);
        let n = LISTENS.fetch_add(1, Ordering::Relaxed);
        // The process tag keeps two replicas' listen streams apart in the shared state.
        let name = format!("{}:listen-{}-{n}", l.client, crate::client::process_tag());
        let client = self.client(name, l.capabilities, None, l.identity, l.view);
        let cancel = CancellationToken::new();
        let tracked = self.track(l.key, || InFlight::Stop(cancel.clone()));
        Answer::Listen(listen::Listen {
            gw: self.gw.clone(),
            client: Arc::new(client),
            id,
            filter,
            closing: self.closing.clone(),
            cancel,
            finish: l.finish,
            _held: (counted, tracked),
        })
    }

    /// A place for one more request of `caller`, unless it has `max` in flight.
    fn slot(&self, caller: &str, max: usize) -> Option<Slot> {
        let mut callers = crate::sync::lock(&self.callers);
        let n = callers.entry(caller.to_owned()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            callers: self.callers.clone(),
            caller: caller.to_owned(),
        })
    }

    /// Enters a request in the table of requests in flight, under `key` (none: this
    /// transport does not cancel by id).
    fn track(&self, key: Option<String>, entry: impl FnOnce() -> InFlight) -> Option<Tracked> {
        let key = key?;
        let table = self.inflight.clone();
        crate::sync::lock(&table).insert(key.clone(), entry());
        Some(Tracked { table, key })
    }

    /// The request's ephemeral client.
    fn client(
        &self,
        id: String,
        capabilities: serde_json::Map<String, Value>,
        log_rank: Option<usize>,
        identity: Option<Arc<Identity>>,
        view: Option<ViewKey>,
    ) -> Client {
        Client::stateless(crate::client::StatelessClient {
            id,
            transport: self.transport.name,
            version: VERSION,
            capabilities,
            log_rank,
            identity,
            view,
        })
    }

    /// Cancels the request in flight that `notifications/cancelled` (its `params`) names;
    /// false when it names none of this flow's.
    pub fn cancel(&self, params: Option<&RawValue>) -> bool {
        let Some(rid) = message::cancelled_request_id(params) else {
            return false;
        };
        let client = {
            let table = crate::sync::lock(&self.inflight);
            match table.get(&id_key(&rid)) {
                None => return false,
                Some(InFlight::Call(c)) => c.clone(),
                Some(InFlight::Stop(t)) => {
                    t.cancel();
                    return true;
                }
            }
        };
        self.gw.notification(&client, "notifications/cancelled", params);
        true
    }
}
