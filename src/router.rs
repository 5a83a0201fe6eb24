//! One request in → answered here or sent to the right downstream → one response out.
//!
//! [`Gateway`] holds a [`Topology`] (config, servers, merged catalog, rate limits) that a
//! reload or a catalog change replaces as one, so a request sees one consistent view.
//! Front ends (HTTP, stdio) are thin adapters: they parse messages, keep a [`Client`] per
//! session and call [`Gateway::request`] / [`Gateway::notification`].
//!
//! A request's method is parsed once ([`Method`]) and [`Gateway::dispatch`] hands it to
//! the file of its concern: [`lists`] (the catalog's lists, paged), [`calls`] (tools,
//! prompts, completions), [`resources`] (reads and subscriptions), [`tasks`], [`logging`];
//! [`forward`] sends a call to its server. [`topology`] builds and swaps what a reload
//! changes, [`initialize`] answers the handshake. What the gateway keeps across
//! sessions has one owner, [`crate::shared::Shared`].

mod budget;
mod calls;
mod consent;
mod forward;
mod forwarded;
pub(crate) mod initialize;
mod lists;
mod logging;
mod replicas;
mod resources;
mod search;
mod tasks;
mod topology;

pub use crate::client::Client;
pub use initialize::{server_info, SUPPORTED_VERSIONS};
pub use topology::Topology;

use crate::auth::Identity;
use crate::catalog::view::{Announcement, View};
use crate::client::Unregister;
use crate::config::Config;
use crate::downstream::Sink;
use crate::error::Error;
use crate::limit::Limited;
use crate::message::{self, id_key, Id, Outcome};
use crate::method::Method;
use crate::metrics::{self, Metrics};
use crate::shared::Shared;
use crate::supervisor::{Event, Server};
use crate::telemetry;
use bytes::Bytes;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

/// How many server-initiated messages may wait for a slow session before it misses some.
const BROADCAST_QUEUE: usize = 256;

/// The gateway's shared state: the current topology, and the fan-out of notifications.
pub struct Gateway {
    topo: RwLock<Arc<Topology>>,
    /// Server-initiated notifications for sessions (list_changed), each with the views
    /// it is about.
    broadcast: broadcast::Sender<Announcement>,
    pub metrics: Metrics,
    /// Where supervisors report; cloned for servers a reload adds.
    events: mpsc::Sender<Event>,
    events_rx: Mutex<Option<mpsc::Receiver<Event>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Counts the reloads applied: whoever holds state a reload may revoke (HTTP
    /// sessions, listen streams) waits for it to change.
    pub reloads: tokio::sync::watch::Sender<u64>,
    /// Set once [`Gateway::start`] is over: every server's first attempt made and the
    /// catalog built.
    started: tokio::sync::watch::Sender<bool>,
    /// Subscriptions, log levels and tasks, by session id.
    shared: Shared,
    /// The sessions of this process that `shared` may name, to deliver to them.
    live: Mutex<HashMap<String, Weak<Client>>>,
    /// `[cluster]`: the replicas' shared Redis, once joined (read at start only).
    cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// Cluster mode: sessions another replica ended, for the fronts to forget.
    ended: broadcast::Sender<String>,
    /// Cluster mode: GET streams opened on another replica (session id, when, in ms since
    /// the epoch), for the fronts to end theirs: one GET stream per session.
    streams_taken: broadcast::Sender<(String, u64)>,
    /// Cluster mode: list_changed lines sent here lately (see `replicas::SAME_CHANGE`).
    announced: Mutex<HashMap<Bytes, Instant>>,
    /// Cluster mode: where notes about parked calls go (see `replicas::on_rounds`).
    rounds: std::sync::OnceLock<mpsc::UnboundedSender<crate::cluster::bus::Note>>,
    /// Cluster mode: calls forwarded to another replica's session process, by correlation id.
    forwarding: Mutex<HashMap<String, mpsc::Sender<crate::stateless::remote::Step>>>,
    /// Cluster mode: calls another replica forwarded here, running, by correlation id.
    serving: Mutex<HashMap<String, CancellationToken>>,
    /// Cluster mode: notes waiting for the other replicas' `Applied`, by correlation id.
    applied: Mutex<HashMap<String, mpsc::UnboundedSender<()>>>,
    /// `auth.token_exchange`: the callers' exchanged tokens (src/upstream/).
    exchanger: crate::upstream::exchange::Exchanger,
    /// `search_model`: the thread that computes the catalogs' vectors.
    search_worker: Arc<crate::search::semantic::Worker>,
}

/// A request as the router takes it: its method parsed once, its params raw.
pub struct Request<'a> {
    pub id: &'a Id,
    pub method: Method,
    /// The method's name as sent: what -32601 names for [`Method::Other`].
    pub name: &'a str,
    pub params: message::Incoming,
}

impl<'a> Request<'a> {
    /// The request named `name`, its method parsed.
    pub fn new(id: &'a Id, name: &'a str, params: impl Into<message::Incoming>) -> Request<'a> {
        Request {
            id,
            method: Method::parse(name),
            name,
            params: params.into(),
        }
    }

    /// A request of a known method, its params raw or opened already.
    pub fn of(id: &'a Id, method: Method, params: impl Into<message::Incoming>) -> Request<'a> {
        Request {
            id,
            method,
            name: method.as_str(),
            params: params.into(),
        }
    }
}

/// One request on its way through the router: what every handler needs.
pub(crate) struct Call<'a> {
    pub topo: &'a Topology,
    pub client: &'a Arc<Client>,
    pub identity: Option<&'a Identity>,
    /// The view of the client's endpoint (a profile, a tag query); none: the whole
    /// catalog. Everything outside it is answered as if it did not exist.
    pub view: Option<Arc<View>>,
    /// Where related notifications go; taken by the one call that goes downstream.
    pub sink: Option<Sink>,
    pub info: CallInfo,
    /// Cluster mode: the client's limits, until spent with the route's (see [`budget`]).
    pub budget: Option<budget::Budget<'a>>,
    /// The limits of its route (`per_server`, `per_tool`) were spent (or it has none).
    pub route_spent: bool,
}

impl Call<'_> {
    /// `identity`'s allowlist hides names and URIs: a hidden one is answered exactly
    /// like one that does not exist.
    pub fn visible(&self, name: &str) -> bool {
        self.identity.is_none_or(|i| i.permits_in(&self.topo.catalog, name))
    }

    /// Whether the caller sees `name` (a public tool or prompt name, a resource URI) of
    /// server `server`: its allowlist and its view (with a profile's tool globs when
    /// `tool`) both show it. Anything else is answered like a name that does not exist.
    pub fn sees(&self, name: &str, server: usize, tool: bool) -> bool {
        self.visible(name)
            && self.view.as_ref().is_none_or(|v| {
                if tool {
                    v.has_tool(&self.topo.catalog, name, server)
                } else {
                    v.has_server(server)
                }
            })
    }

    /// Whether server `server` is in the caller's view.
    pub fn in_view(&self, server: usize) -> bool {
        self.view.as_ref().is_none_or(|v| v.has_server(server))
    }
}

/// What the router learned about a request on its way, for metrics and traces.
#[derive(Default)]
pub struct CallInfo {
    /// The server it went to.
    pub server: Option<Arc<str>>,
    /// That server's index in the call's topology (its console ring is found by it).
    pub index: Option<usize>,
    /// The session it came from (picks a server's per-session process).
    pub session: Option<String>,
    /// The public tool name, for tools/call.
    pub tool: Option<String>,
    pub rate_limited: bool,
    /// The client's progress token as it wrote it, read before its params were opened
    /// into a map (not for tools/call and prompts/get, whose params stay raw).
    pub progress: Option<Id>,
}

/// `{}` as a successful result.
fn empty() -> Outcome {
    Outcome::Result(message::empty_object().into())
}

impl Gateway {
    pub fn new(config: Config) -> Arc<Gateway> {
        let (broadcast, _) = broadcast::channel(BROADCAST_QUEUE);
        let (events, events_rx) = mpsc::channel(64);
        Arc::new(Gateway {
            topo: RwLock::new(Arc::new(Topology::first(config))),
            broadcast,
            metrics: Metrics::default(),
            events,
            events_rx: Mutex::new(Some(events_rx)),
            reloading: tokio::sync::Mutex::new(()),
            reloads: tokio::sync::watch::Sender::new(0),
            started: tokio::sync::watch::Sender::new(false),
            shared: Shared::default(),
            live: Mutex::new(HashMap::new()),
            cluster: std::sync::OnceLock::new(),
            ended: broadcast::channel(BROADCAST_QUEUE).0,
            streams_taken: broadcast::channel(BROADCAST_QUEUE).0,
            announced: Mutex::new(HashMap::new()),
            rounds: std::sync::OnceLock::new(),
            forwarding: Mutex::new(HashMap::new()),
            serving: Mutex::new(HashMap::new()),
            applied: Mutex::new(HashMap::new()),
            exchanger: crate::upstream::exchange::Exchanger::new(),
            search_worker: Arc::default(),
        })
    }

    /// Completes once [`Gateway::start`] is over.
    pub async fn started(&self) {
        if *self.started.borrow() {
            return;
        }
        let mut rx = self.started.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The current topology: config, servers, catalog and limits that belong together.
    pub fn topology(&self) -> Arc<Topology> {
        crate::sync::read(&self.topo).clone()
    }

    /// The current config.
    pub fn config(&self) -> Arc<Config> {
        self.topology().config.clone()
    }

    /// Starts every enabled server concurrently and waits until each is ready or has
    /// failed; then builds the catalog. Servers keep being watched in the background.
    pub async fn start(self: &Arc<Gateway>) {
        let servers = self.topology().servers.clone();
        self.start_servers(&servers).await;
        self.rebuild_catalog(false);
        self.started.send_replace(true);
        let rx = crate::sync::lock(&self.events_rx).take();
        if let Some(mut events_rx) = rx {
            let gw = Arc::downgrade(self);
            crate::background::spawn(async move {
                while let Some(ev) = events_rx.recv().await {
                    let Some(gw) = gw.upgrade() else { return };
                    gw.event(ev).await;
                }
            });
        }
    }

    /// Spawns the supervisors of `servers` and waits for each one's first attempt.
    async fn start_servers(&self, servers: &[Arc<Server>]) {
        let starts: Vec<_> = servers
            .iter()
            .filter(|s| s.cfg.enabled)
            .map(|s| {
                let (started, first_done) = tokio::sync::oneshot::channel();
                crate::background::spawn(s.clone().run(self.events.clone(), started));
                first_done
            })
            .collect();
        futures::future::join_all(starts).await;
    }

    pub fn catalog(&self) -> Arc<crate::catalog::Catalog> {
        self.topology().catalog.clone()
    }

    /// Server-initiated messages for sessions (list_changed), as serialized lines with
    /// whom they are for ([`Announcement::reaches`]).
    pub fn subscribe(&self) -> broadcast::Receiver<Announcement> {
        self.broadcast.subscribe()
    }

    /// Closes every server.
    pub async fn stop(&self) {
        let topo = self.topology();
        futures::future::join_all(topo.servers.iter().map(|s| s.stop())).await;
    }

    /// True when every enabled server is ready.
    pub fn ready(&self) -> bool {
        self.topology().servers.iter().filter(|s| s.cfg.enabled).all(|s| {
            let st = s.state();
            st.status == crate::supervisor::Status::Ready && !st.degraded()
        })
    }

    /// Keeps `client` reachable by its [`Shared::key`], for what [`Shared`] and the
    /// other replicas deliver to it.
    pub(crate) fn remember(&self, client: &Arc<Client>) {
        let key = self.shared.key(&client.id);
        let mut live = crate::sync::lock(&self.live);
        live.retain(|_, c| c.strong_count() > 0);
        live.insert(key, Arc::downgrade(client));
    }

    /// The session of this process whose [`Shared::key`] is `key`.
    fn live(&self, key: &str) -> Option<Arc<Client>> {
        crate::sync::lock(&self.live).get(key).and_then(Weak::upgrade)
    }

    /// Sends `line` to the session whose [`Shared::key`] is `key`: here, if it lives in
    /// this process, and in cluster mode wherever its GET stream is held.
    fn deliver(&self, key: &str, line: Bytes) {
        if let Some(c) = self.live(key) {
            c.send_own(line.clone());
        }
        self.deliver_elsewhere(key, line);
    }
}

impl crate::upstream::consent::Notify for Gateway {
    fn to_session(&self, session: &str, line: Bytes) {
        self.deliver(&self.shared.key(session), line);
    }

    fn to_session_elsewhere(&self, session: &str, line: Bytes) {
        self.deliver_elsewhere(&self.shared.key(session), line);
    }

    fn server(&self, name: &str) -> Option<Arc<crate::supervisor::Server>> {
        self.topology().servers.iter().find(|s| &*s.name == name).cloned()
    }
}

impl Gateway {
    /// Answers one request. Related notifications (progress, log messages) go to `sink`
    /// before the answer. Returns `None` when the client cancelled the request.
    /// `parent` is the client's trace context from transport headers, if any.
    pub async fn request(
        &self,
        client: &Arc<Client>,
        req: Request<'_>,
        sink: Option<Sink>,
        parent: Option<opentelemetry::Context>,
    ) -> Option<Outcome> {
        let Request {
            id,
            method: parsed,
            name: method,
            params,
        } = req;
        let origin = telemetry::Origin {
            session: &client.id,
            protocol_version: client.protocol_version.get().map_or("", |v| v),
            transport: client.transport,
            parent,
        };
        // Opened params are written out for the span only when spans are exported.
        let span = if telemetry::exporting() {
            telemetry::request_span(origin, id, method, params.to_raw().as_deref())
        } else {
            telemetry::request_span(origin, id, method, None)
        };
        // Servers' questions about this call (sampling, elicitation, roots) go back to this client.
        // A question still unanswered when this request ends is withdrawn then.
        let call_over = CancellationToken::new();
        let _call_over = call_over.clone().drop_guard();
        let sink = sink.map(|s| s.with_peer(client.clone()).until(call_over));
        let key = id_key(id);
        let token = CancellationToken::new();
        // One view of the topology for the whole request (its limits, routes and servers).
        let topo = self.topology();
        {
            let mut inflight = client.inflight();
            if inflight.contains_key(&key) {
                let e = Error::invalid_request(format!("request id {key} is already in use in this session"));
                return Some(e.into());
            }
            let max = topo.config.gateway.max_in_flight;
            if inflight.len() >= max {
                return Some(Error::invalid_request(format!("this session already has {max} requests in flight (gateway.max_in_flight); wait for some to finish")).into());
            }
            inflight.insert(key.clone(), token.clone());
        }
        let _unregister = Unregister { client, key };
        let started = Instant::now();
        let _in_flight = self.metrics.in_flight();
        let identity = client.identity();
        let mut call = Call {
            topo: &topo,
            client,
            identity: identity.as_deref(),
            // The whole catalog (nearly every request): no lookup at all.
            view: client.view.as_ref().map(|k| topo.view(k)),
            sink,
            info: CallInfo {
                session: topo.isolated.then(|| client.id.clone()),
                ..CallInfo::default()
            },
            budget: None,
            route_spent: false,
        };
        // Once clients are configured, a client is its name: all its sessions share a budget.
        let rate_key = identity.as_ref().map_or(client.id.as_str(), |i| i.name.as_str());
        let admitted = match self.cluster() {
            None => check_client_rates(&topo, rate_key, identity.as_deref())
                .map_err(|l| self.limited(parsed, &l, &mut call.info, call.client)),
            // A cluster spends the client's limits with the route's, in one round trip.
            Some(_) => {
                call.budget = Some(budget::Budget {
                    key: rate_key,
                    identity: identity.as_deref(),
                });
                if budget::defers(parsed) {
                    Ok(())
                } else {
                    self.spend_budget(&mut call, parsed).await
                }
            }
        };
        let out = match admitted {
            Err(out) => Some(out),
            Ok(()) => {
                // The span is current while dispatching: forward() parents its child on it.
                // Pinned where it is: instrumenting the future itself would move (copy)
                // all of it, kilobytes, into the wrapper.
                let out = {
                    let work = std::pin::pin!(async {
                        tokio::select! {
                            out = self.dispatch(&mut call, parsed, method, params) => Some(out),
                            _ = token.cancelled() => None,
                        }
                    });
                    work.instrument(span.clone()).await
                };
                match out {
                    // Answered before any route spent the budget (an unknown name...).
                    Some(out) if call.budget.is_some() => Some(match self.spend_budget(&mut call, parsed).await {
                        Ok(()) => out,
                        Err(refused) => refused,
                    }),
                    out => out,
                }
            }
        };
        let info = call.info;
        // (A stateless request's client lives for that request alone: nobody asks it
        // later which servers it used.)
        if let Some(server) = info.server.as_ref().filter(|_| !client.stateless) {
            crate::sync::lock(&client.used).insert(server.clone());
        }
        let ended = Instant::now();
        let took = ended.duration_since(started);
        let outcome = self.observe(parsed, &info, out.as_ref(), took);
        if let Some(s) = info.index.and_then(|i| topo.servers.get(i)) {
            if outcome != metrics::Outcome::Cancelled {
                let second = crate::console::second(ended);
                s.series().record(second, outcome != metrics::Outcome::Ok, took);
            }
        }
        console(client.stats.get(), parsed, &info, out.as_ref(), outcome);
        telemetry::finish_request(&span, method, out.as_ref(), info.rate_limited);
        out
    }

    /// The one `match` on a request's method: each arm is its concern's handler.
    async fn dispatch(&self, cx: &mut Call<'_>, method: Method, name: &str, params: message::Incoming) -> Outcome {
        use Method::*;
        if matches!(method, ToolsCall | PromptsGet) {
            return self.call_named(cx, method, params).await;
        }
        let params = params.into_raw();
        cx.info.progress = message::progress_token_of(params.as_deref());
        match method {
            Ping => empty(),
            ToolsList | PromptsList | ResourcesList | ResourcesTemplatesList => self.list(cx, method, params),
            CompletionComplete => self.complete(cx, params).await,
            ResourcesRead => self.read(cx, params).await,
            // Boxed, as the other rare large futures: every request's future is as large as
            // its largest arm (a subscription waits on the other replicas too).
            ResourcesSubscribe | ResourcesUnsubscribe => Box::pin(self.subscription(cx, method, params)).await,
            LoggingSetLevel => self.set_level(cx, params).await,
            TasksGet | TasksResult | TasksCancel => Box::pin(self.task_request(cx, method, params)).await,
            TasksList => self.list_tasks(cx).await,
            Initialize => Error::invalid_request("this session is already initialized").into(),
            _ => Error::method_not_found(name).into(),
        }
    }

    fn observe(
        &self,
        method: Method,
        info: &CallInfo,
        out: Option<&Outcome>,
        took: std::time::Duration,
    ) -> metrics::Outcome {
        let outcome = match (info.rate_limited, out) {
            (true, _) => metrics::Outcome::RateLimited,
            (false, None) => metrics::Outcome::Cancelled,
            (false, Some(Outcome::Error(_))) => metrics::Outcome::Error,
            (false, Some(Outcome::Result(r))) if method == Method::ToolsCall && message::is_tool_error(r.get()) => {
                metrics::Outcome::ToolError
            }
            (false, Some(Outcome::Result(_))) => metrics::Outcome::Ok,
        };
        let server = info.server.as_deref().unwrap_or("");
        self.metrics.record(
            method.as_str(),
            server,
            info.tool.as_deref().unwrap_or(""),
            outcome,
            took,
        );
        outcome
    }

    /// The answer to a request over a rate limit, counted. A tool call gets a tool result
    /// with `isError`, whose text a model can act on; anything else a JSON-RPC error with
    /// `data.retryAfterMs`.
    fn limited(&self, method: Method, l: &Limited, info: &mut CallInfo, client: &Client) -> Outcome {
        info.rate_limited = true;
        if let Some(stats) = client.stats.get() {
            stats.limited(&l.what);
        }
        self.rate_limited(method, l)
    }

    fn rate_limited(&self, method: Method, l: &Limited) -> Outcome {
        debug!(%method, limit = %l.what, "rate limited");
        self.metrics.rate_limited(&l.what);
        crate::console::events().burst("rate_limited", &l.what, None, format!("rate limited by {}", l.what));
        if method == Method::ToolsCall {
            Outcome::Result(
                message::to_raw(&serde_json::json!({
                    "content": [{ "type": "text", "text": l.message() }],
                    "isError": true,
                }))
                .into(),
            )
        } else {
            let data = serde_json::json!({ "retryAfterMs": l.retry_after_ms(), "limit": l.what });
            Error::client(crate::error::code::RATE_LIMITED, l.message())
                .with_data(data)
                .into()
        }
    }

    /// `initialize` as a configured client: it counts against the same limits as the
    /// client's other requests (`[rate_limits] per_client` by name, and its own
    /// `rate_limit`), so one client cannot open sessions as fast as it likes. Without an
    /// identity there is no client yet to count against (a client is its session then);
    /// `per_ip` and `gateway.max_sessions_per_client` bound those.
    pub fn admit_initialize(&self, identity: Option<&Identity>) -> Result<(), Outcome> {
        let Some(identity) = identity else {
            return Ok(());
        };
        check_client_rates(&self.topology(), &identity.name, Some(identity))
            .map_err(|l| self.rate_limited(Method::Initialize, &l))
    }

    /// Handles a notification from a client.
    pub fn notification(&self, client: &Client, method: &str, params: Option<&RawValue>) {
        match Method::parse(method) {
            Method::Cancelled => {
                let Some(id) = message::cancelled_request_id(params) else {
                    return;
                };
                if let Some(t) = client.inflight().get(&id_key(&id)) {
                    debug!(session = %crate::client::session_tag(&client.id), request = %id, "client cancelled a request");
                    t.cancel();
                } else {
                    // Cluster mode: the call may run on another replica.
                    self.cancel_elsewhere(client, params);
                }
            }
            Method::RootsListChanged => {
                self.roots_changed(client);
                // Cluster mode: its calls on other replicas reached their children.
                self.roots_changed_elsewhere(client);
            }
            Method::Initialized | Method::Progress => {}
            _ => debug!(session = %crate::client::session_tag(&client.id), method, "ignoring client notification"),
        }
    }

    /// Tells the servers this session's calls went to (here) that its roots changed: they
    /// may cache them.
    fn roots_changed(&self, client: &Client) {
        let used: Vec<Arc<str>> = crate::sync::lock(&client.used).iter().cloned().collect();
        let topo = self.topology();
        for s in topo.servers.iter().filter(|s| used.contains(&s.name)) {
            if let Ok(conn) = s.connection() {
                crate::background::spawn(async move { conn.notify(Method::RootsListChanged.as_str(), None).await });
            }
        }
    }

    /// A session ended: forget what [`Shared`] keeps for it, unsubscribe downstreams
    /// nobody else needs, and end its per-session processes.
    pub async fn forget_client(&self, client: &Client) {
        let unneeded = self.shared.forget_session(&client.id).await;
        self.forget_copy(client).await;
        self.unsubscribe_unneeded(&self.topology(), unneeded).await;
        // Its level no longer counts: the downstreams run at the level of those left.
        if let Some(rank) = self.shared.settle_log_level().await {
            self.downstream_level_everywhere(rank).await;
        }
    }
}

/// Checks (and spends) a client's budgets: `[rate_limits] per_client` under `key`, then
/// the identity's own `rate_limit`.
fn check_client_rates(topo: &Topology, key: &str, identity: Option<&Identity>) -> Result<(), Limited> {
    topo.limits
        .check_client(key)
        .and_then(|()| identity.map_or(Ok(()), Identity::check_rate))
}

/// The router in-process: a gateway with no servers, requests as a front would send them.
/// A call as the console sees it: counted on the session's row (with the limit that
/// refused it, or why it failed), and a server's failure as an event naming the server
/// (one per burst). A failure is what the server's card counts too: a JSON-RPC error or
/// an `isError` tool result (a refusal by a rate limit shows as that limit's instead).
/// Only a failure reads the answer; what a peer said is cut to [`crate::console::PEER_TEXT`].
fn console(
    stats: Option<&Arc<crate::console::ClientStats>>,
    method: Method,
    info: &CallInfo,
    out: Option<&Outcome>,
    outcome: metrics::Outcome,
) {
    if let Some(stats) = stats {
        stats.call();
    }
    if info.rate_limited {
        // Counted by the limit that refused it (`Gateway::limited`).
        return;
    }
    let message = match (out, outcome) {
        (Some(Outcome::Error(e)), _) => {
            crate::console::clipped(&message::error_summary(e).1, crate::console::PEER_TEXT)
        }
        // Its content is the server's own text, passed on unmasked: not copied here.
        (Some(Outcome::Result(_)), metrics::Outcome::ToolError) => "the tool answered isError: true".to_owned(),
        _ => return,
    };
    let peer = |s: &str| crate::console::clipped(s, crate::console::PEER_TEXT);
    let what = match (&info.server, &info.tool) {
        (Some(s), Some(t)) => format!("{method} {} (server {s}): {message}", peer(t)),
        (Some(s), None) => format!("{method} (server {s}): {message}"),
        _ => format!("{method}: {message}"),
    };
    if let Some(server) = &info.server {
        crate::console::events().burst("error", &format!("error {server}"), Some(server), what.clone());
    }
    if let Some(stats) = stats {
        stats.error(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn gateway(toml: &str) -> Arc<Gateway> {
        let none = |_: &str| None;
        let config = Config::parse(std::path::Path::new("g.toml"), toml, &none).unwrap();
        Gateway::new(config)
    }

    async fn ask(gw: &Gateway, client: &Arc<Client>, id: u64, method: &str, params: Value) -> Value {
        let id = Id::from(id);
        let params = Some(message::to_raw(&params));
        let out = gw.request(client, Request::new(&id, method, params), None, None).await;
        let text = match out.expect("not cancelled") {
            Outcome::Result(r) => format!(r#"{{"result":{}}}"#, r.get()),
            Outcome::Error(e) => format!(r#"{{"error":{}}}"#, e.get()),
        };
        serde_json::from_str(&text).unwrap()
    }

    #[tokio::test]
    async fn the_router_answers_what_it_can_itself() {
        let gw = gateway("");
        let c = Arc::new(Client::new("s1"));
        assert_eq!(ask(&gw, &c, 1, "ping", json!({})).await, json!({"result": {}}));
        assert_eq!(
            ask(&gw, &c, 2, "tools/list", json!({})).await["result"]["tools"],
            json!([])
        );
        let e = ask(&gw, &c, 3, "tools/call", json!({"name": "nope__x"})).await;
        assert_eq!(e["error"]["code"], -32602);
        assert_eq!(e["error"]["data"], json!({"tool": "nope__x"}));
        let e = ask(&gw, &c, 4, "made/up", json!({})).await;
        assert_eq!(e["error"]["code"], -32601);
        assert_eq!(e["error"]["message"], "method not found: made/up");
        let e = ask(&gw, &c, 5, "initialize", json!({})).await;
        assert_eq!(e["error"]["code"], -32600);
        let e = ask(&gw, &c, 6, "tools/list", json!({"cursor": "zz"})).await;
        assert_eq!(e["error"]["code"], -32602, "a cursor the gateway did not make");
        let e = ask(&gw, &c, 7, "tools/call", json!({"name": "x", "arguments": [1]})).await;
        assert_eq!(
            e["error"]["message"],
            "tools/call: params.arguments must be an object when present, not an array"
        );
    }

    #[tokio::test]
    async fn a_client_over_its_rate_gets_a_tool_result_for_calls_and_an_error_for_the_rest() {
        let gw = gateway("[rate_limits]\nper_client = \"1/m\"\n");
        let c = Arc::new(Client::new("s1"));
        assert_eq!(ask(&gw, &c, 1, "ping", json!({})).await, json!({"result": {}}));
        let r = ask(&gw, &c, 2, "tools/call", json!({"name": "x"})).await;
        assert_eq!(r["result"]["isError"], true);
        let e = ask(&gw, &c, 3, "tools/list", json!({})).await;
        assert_eq!(e["error"]["code"], -32029);
        assert!(e["error"]["data"]["retryAfterMs"].as_u64().is_some());
    }

    #[tokio::test]
    async fn log_levels_and_subscriptions_are_kept_by_session_and_forgotten_with_it() {
        let gw = gateway("");
        let c = Arc::new(Client::new("s1"));
        let e = ask(&gw, &c, 1, "logging/setLevel", json!({"level": "loud"})).await;
        assert_eq!(e["error"]["code"], -32602);
        assert_eq!(
            ask(&gw, &c, 2, "logging/setLevel", json!({"level": "debug"})).await,
            json!({"result": {}})
        );
        assert_eq!(
            gw.shared.downstream_log_level().await,
            crate::downstream::log_rank("debug")
        );
        // No server offers resources: the URI is unknown (-32002), nothing is kept.
        let e = ask(&gw, &c, 3, "resources/subscribe", json!({"uri": "a://1"})).await;
        assert_eq!(e["error"]["code"], -32002);
        gw.forget_client(&c).await;
        assert!(crate::sync::lock(&gw.live).is_empty());
    }
}
