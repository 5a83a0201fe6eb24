//! One request in → answered here or sent to the right downstream → one response out.
//!
//! [`Gateway`] holds a [`Topology`] (config, servers, merged catalog, rate limits) that a
//! reload or a catalog change replaces as one, so a request sees one consistent view.
//! Front ends (HTTP, stdio) are thin adapters: they parse messages, keep a [`Client`] per
//! session and call [`Gateway::request`] / [`Gateway::notification`].

mod sessions;

use crate::auth::{Authenticator, Identity};
use crate::catalog::{Catalog, Source};
pub use crate::client::Client;
use crate::client::Unregister;
use crate::config::Config;
use crate::downstream::{OpenParams, Params, Sink};
use crate::limit::{Limited, Limits};
use crate::message::{self, code, id_key, Id, Outcome};
use crate::metrics::{self, Metrics};
use crate::supervisor::{Event, ListKind, Server, Status};
use crate::telemetry::{self, DownstreamSpan};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use sessions::supports_tasks;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

/// Protocol revisions the public endpoint speaks in the handshake era, newest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// How many server-initiated messages may wait for a slow session before it misses some.
const BROADCAST_QUEUE: usize = 256;

/// The gateway's shared state: the current topology, and the fan-out of notifications.
pub struct Gateway {
    topo: RwLock<Arc<Topology>>,
    /// Server-initiated notifications for every session (list_changed).
    broadcast: broadcast::Sender<Bytes>,
    pub metrics: Metrics,
    /// Where supervisors report; cloned for servers a reload adds.
    events: mpsc::Sender<Event>,
    events_rx: Mutex<Option<mpsc::Receiver<Event>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Resource subscriptions: (server, uri) → the sessions subscribed. The downstream is
    /// subscribed while at least one session is.
    subscriptions: Mutex<HashMap<(Arc<str>, String), Subscribers>>,
    /// Sessions that chose a log level, and the level every downstream now runs at: the
    /// most verbose any session wants.
    log_clients: Mutex<HashMap<String, Weak<Client>>>,
    downstream_log: Mutex<Option<usize>>,
    /// Tasks (2025-11-25) created through the gateway, and the sessions that own them.
    tasks: crate::tasks::Tasks,
    task_owners: Mutex<HashMap<String, Weak<Client>>>,
}

/// The sessions subscribed to one (server, uri), by session id.
type Subscribers = HashMap<String, Weak<Client>>;

/// Everything a reload may replace, swapped as one. Catalog routes index `servers`.
pub struct Topology {
    /// Some server runs a process per session (so calls carry their session).
    pub isolated: bool,
    pub config: Arc<Config>,
    pub servers: Vec<Arc<Server>>,
    pub catalog: Arc<Catalog>,
    pub limits: Arc<Limits>,
    /// `[clients.*]` and `[auth.oauth]`: tokens to identities, identities to policies.
    pub auth: Arc<Authenticator>,
}

fn limits_for(config: &Config) -> Limits {
    let per_server: Vec<_> = config
        .servers
        .iter()
        .map(|s| (s.name.clone(), s.rate_limits.clone()))
        .collect();
    Limits::new(&config.rate_limits, &per_server)
}

fn same_limits(a: &Config, b: &Config) -> bool {
    a.rate_limits == b.rate_limits
        && a.servers.len() == b.servers.len()
        && a.servers
            .iter()
            .zip(&b.servers)
            .all(|(x, y)| x.name == y.name && x.rate_limits == y.rate_limits)
}

fn err(code: i64, msg: impl AsRef<str>) -> Outcome {
    Outcome::Error(message::error_object(code, msg.as_ref(), None))
}

impl Gateway {
    pub fn new(config: Config) -> Arc<Gateway> {
        let servers: Vec<Arc<Server>> = config
            .servers
            .iter()
            .cloned()
            .map(|s| Arc::new(Server::new(s)))
            .collect();
        let (broadcast, _) = broadcast::channel(BROADCAST_QUEUE);
        let (events, events_rx) = mpsc::channel(64);
        let limits = Arc::new(limits_for(&config));
        let auth = Arc::new(Authenticator::new(&config.auth));
        let topo = Topology {
            isolated: any_isolated(&servers),
            config: Arc::new(config),
            servers,
            catalog: Arc::new(Catalog::default()),
            limits,
            auth,
        };
        Arc::new(Gateway {
            topo: RwLock::new(Arc::new(topo)),
            broadcast,
            metrics: Metrics::default(),
            events,
            events_rx: Mutex::new(Some(events_rx)),
            reloading: tokio::sync::Mutex::new(()),
            subscriptions: Mutex::new(HashMap::new()),
            log_clients: Mutex::new(HashMap::new()),
            downstream_log: Mutex::new(None),
            tasks: crate::tasks::Tasks::default(),
            task_owners: Mutex::new(HashMap::new()),
        })
    }

    /// The current topology: config, servers, catalog and limits that belong together.
    pub fn topology(&self) -> Arc<Topology> {
        self.topo.read().unwrap_or_else(|e| e.into_inner()).clone()
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
        let rx = self.events_rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut events_rx) = rx {
            let gw = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(ev) = events_rx.recv().await {
                    let Some(gw) = gw.upgrade() else { return };
                    gw.event(ev);
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
                tokio::spawn(s.clone().run(self.events.clone(), started));
                first_done
            })
            .collect();
        futures::future::join_all(starts).await;
    }

    /// Applies a new config: servers that are new or whose entry changed are started
    /// (and the old ones of changed entries stopped); removed ones are stopped; unchanged
    /// ones, and calls in flight to them, are untouched. Clients get list_changed when
    /// the merged lists change. The listen address and path need a restart.
    pub async fn reload(self: &Arc<Gateway>, config: Config) {
        let _one = self.reloading.lock().await;
        let old = self.topology();
        if config.gateway.listen != old.config.gateway.listen || config.gateway.path != old.config.gateway.path {
            warn!("gateway.listen and gateway.path changes take effect after a restart");
        }
        if config.gateway.worker_threads != old.config.gateway.worker_threads {
            warn!("gateway.worker_threads changes take effect after a restart");
        }
        let mut servers = Vec::with_capacity(config.servers.len());
        let mut added = Vec::new();
        for cfg in &config.servers {
            match old.servers.iter().find(|s| s.same_process(cfg)) {
                Some(same) => {
                    // Same process: keep it (and its calls in flight); new prefix, timeout
                    // and tool filter apply from the swap on. Rate limits live in the topology.
                    same.retune(cfg);
                    servers.push(same.clone());
                }
                None => {
                    let s = Arc::new(Server::new(cfg.clone()));
                    added.push(s.clone());
                    servers.push(s);
                }
            }
        }
        let gone: Vec<_> = old
            .servers
            .iter()
            .filter(|s| !servers.iter().any(|n| Arc::ptr_eq(n, s)))
            .cloned()
            .collect();
        info!(
            kept = servers.len() - added.len(),
            started = added.len(),
            stopped = gone.len(),
            "reloading gateway.toml"
        );
        self.start_servers(&added).await;
        let limits = if same_limits(&old.config, &config) {
            old.limits.clone()
        } else {
            Arc::new(limits_for(&config))
        };
        // Unchanged auth keeps its JWKS cache and the clients' rate budgets.
        let auth = if old.config.auth == config.auth {
            old.auth.clone()
        } else {
            info!("[clients] or [auth.oauth] changed");
            Arc::new(Authenticator::new(&config.auth))
        };
        let (old_catalog, catalog) = {
            // The catalog routes by position in `servers`: both change in one swap.
            let mut topo = self.topo.write().unwrap_or_else(|e| e.into_inner());
            let catalog = Arc::new(build_catalog(&config, &servers));
            let old = topo.catalog.clone();
            *topo = Arc::new(Topology {
                isolated: any_isolated(&servers),
                config: Arc::new(config),
                servers,
                catalog: catalog.clone(),
                limits,
                auth,
            });
            (old, catalog)
        };
        self.announce(&old_catalog, &catalog, true, None);
        // A changed server's new process takes over its sessions' subscriptions and log level.
        for s in added.iter().filter(|s| old.servers.iter().any(|o| o.name == s.name)) {
            self.restore(s.name.clone());
        }
        futures::future::join_all(gone.iter().map(|s| s.stop())).await;
        info!("reload done");
    }

    fn event(&self, ev: Event) {
        match ev {
            Event::ListsChanged { announced, .. } => self.rebuild(true, announced),
            Event::Restarted { server } => self.restore(server),
            Event::Notification { server, method, params } if method == "notifications/resources/updated" => {
                self.resource_updated(&server, &method, params.as_deref());
            }
            Event::Notification { server, method, params } if method == "notifications/tasks/status" => {
                self.task_status(&server, &method, params.as_deref());
            }
            Event::Notification { server, method, .. } => {
                debug!(%server, %method, "dropping a server notification no client asked for");
            }
        }
    }

    /// Rebuilds the merged catalog; with `notify`, tells every session which lists changed.
    pub fn rebuild_catalog(&self, notify: bool) {
        self.rebuild(notify, None)
    }

    /// [`Gateway::rebuild_catalog`]; a server's own list_changed (`announced`) is passed on
    /// even when the merged list looks the same (the server may have changed and changed
    /// back: its clients should look again).
    fn rebuild(&self, notify: bool, announced: Option<ListKind>) {
        let (old, new) = {
            // Built under the lock, so a concurrent reload or rebuild cannot be lost.
            let mut topo = self.topo.write().unwrap_or_else(|e| e.into_inner());
            let new = Arc::new(build_catalog(&topo.config, &topo.servers));
            let old = topo.catalog.clone();
            *topo = Arc::new(Topology {
                isolated: topo.isolated,
                config: topo.config.clone(),
                servers: topo.servers.clone(),
                catalog: new.clone(),
                limits: topo.limits.clone(),
                auth: topo.auth.clone(),
            });
            (old, new)
        };
        self.announce(&old, &new, notify, announced);
    }

    /// Logs a new catalog's notes and, with `notify`, tells every session which lists changed.
    fn announce(&self, old: &Catalog, new: &Catalog, notify: bool, announced: Option<ListKind>) {
        for note in &new.notes {
            warn!("{note}");
        }
        if !notify {
            return;
        }
        let changes = [
            (ListKind::Tools, old.tools_result.get() != new.tools_result.get()),
            (ListKind::Prompts, old.prompts_result.get() != new.prompts_result.get()),
            (
                ListKind::Resources,
                old.resources_result.get() != new.resources_result.get()
                    || old.templates_result.get() != new.templates_result.get(),
            ),
        ];
        for (kind, changed) in changes {
            if changed || announced == Some(kind) {
                info!(notification = kind.notification(), "catalog changed; notifying clients");
                let _ = self
                    .broadcast
                    .send(Bytes::from(message::notification(kind.notification(), None)));
            }
        }
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.topology().catalog.clone()
    }

    /// Server-initiated messages for sessions (list_changed), as serialized lines.
    pub fn subscribe(&self) -> broadcast::Receiver<Bytes> {
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
            st.status == Status::Ready && !st.degraded()
        })
    }

    /// The `initialize` result: the negotiated version, the union of the downstream
    /// capabilities, the servers' instructions under headings, and the gateway's own info.
    pub fn initialize_result(&self, params: Option<&RawValue>) -> Outcome {
        self.initialize_result_for(params, None)
    }

    /// The `initialize` result as `identity` sees it: the instructions of a server whose
    /// tools, prompts and resources its allowlist hides entirely are left out.
    pub fn initialize_result_for(&self, params: Option<&RawValue>, identity: Option<&Identity>) -> Outcome {
        let topo = self.topology();
        let shown = |server: &str| {
            identity.is_none_or(|i| {
                topo.catalog
                    .entries
                    .iter()
                    .any(|e| &*e.server == server && i.permits(&e.public))
            })
        };
        let requested = message::params_object(params)
            .ok()
            .and_then(|p| p.get("protocolVersion").and_then(Value::as_str).map(str::to_owned));
        let version = match requested.as_deref() {
            Some(v) if SUPPORTED_VERSIONS.contains(&v) => v,
            _ => SUPPORTED_VERSIONS[0],
        };
        let mut caps = Map::new();
        caps.insert("tools".into(), json!({ "listChanged": true }));
        caps.insert("prompts".into(), json!({ "listChanged": true }));
        caps.insert("resources".into(), json!({ "listChanged": true }));
        let mut instructions = String::new();
        let subscribable = self.topology().servers.iter().any(|s| {
            s.state()
                .info
                .as_ref()
                .and_then(|i| i.capabilities.as_ref())
                .is_some_and(|c| {
                    c.get("resources")
                        .and_then(|r| r.get("subscribe"))
                        .and_then(Value::as_bool)
                        == Some(true)
                })
        });
        if subscribable {
            caps.insert("resources".into(), json!({ "listChanged": true, "subscribe": true }));
        }
        if self.topology().servers.iter().any(|s| supports_tasks(s, "call")) {
            caps.insert(
                "tasks".into(),
                json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } }),
            );
        }
        for s in &self.topology().servers {
            let state = s.state();
            let Some(info) = &state.info else { continue };
            for (cap, value) in [("completions", json!({})), ("logging", json!({}))] {
                if info.has(cap) {
                    caps.insert(cap.into(), value);
                }
            }
            if let Some(text) = info
                .instructions
                .as_deref()
                .filter(|t| !t.trim().is_empty() && shown(&s.name))
            {
                if !instructions.is_empty() {
                    instructions.push_str("\n\n");
                }
                instructions.push_str(&format!("## {}\n{}", s.name, text.trim()));
            }
        }
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": caps,
            "serverInfo": { "name": "mcp-gateway", "title": "MCP Gateway", "version": env!("CARGO_PKG_VERSION") },
        });
        if !instructions.is_empty() {
            result["instructions"] = Value::String(instructions);
        }
        Outcome::Result(message::to_raw(&result).into())
    }

    /// Answers one request. Related notifications (progress, log messages) go to `sink`
    /// before the answer. Returns `None` when the client cancelled the request.
    /// `parent` is the client's trace context from transport headers, if any.
    pub async fn request(
        &self,
        client: &Arc<Client>,
        id: &Id,
        method: &str,
        params: Option<Box<RawValue>>,
        sink: Option<Sink>,
        parent: Option<opentelemetry::Context>,
    ) -> Option<Outcome> {
        let origin = telemetry::Origin {
            session: &client.id,
            protocol_version: client.protocol_version.get().map_or("", String::as_str),
            transport: client.transport,
            parent,
        };
        let span = telemetry::request_span(origin, id, method, params.as_deref());
        // Servers' questions about this call (sampling, elicitation, roots) go back to this client.
        // A question still unanswered when this request ends is withdrawn then.
        let call_over = CancellationToken::new();
        let _call_over = call_over.clone().drop_guard();
        let sink = sink.map(|s| s.with_peer(client.clone()).until(call_over));
        let key = id_key(id);
        let token = CancellationToken::new();
        {
            let mut inflight = client.inflight();
            if inflight.contains_key(&key) {
                return Some(err(
                    code::INVALID_REQUEST,
                    format!("request id {key} is already in use in this session"),
                ));
            }
            let max = self.config().gateway.max_in_flight;
            if inflight.len() >= max {
                return Some(err(
                    code::INVALID_REQUEST,
                    format!("this session already has {max} requests in flight (gateway.max_in_flight); wait for some to finish"),
                ));
            }
            inflight.insert(key.clone(), token.clone());
        }
        let _unregister = Unregister { client, key };
        let started = Instant::now();
        let _in_flight = self.metrics.in_flight();
        let mut info = CallInfo::default();
        let topo = self.topology();
        if topo.isolated {
            info.session = Some(client.id.clone());
        }
        let identity = client.identity();
        // Once clients are configured, a client is its name: all its sessions share a budget.
        let rate_key = identity.as_ref().map_or(client.id.as_str(), |i| i.name.as_str());
        let allowed = check_client_rates(&topo, rate_key, identity.as_deref());
        let out = match allowed {
            Err(l) => Some(self.limited(method, &l, &mut info)),
            Ok(()) => {
                // The span is current while dispatching: forward() parents its child on it.
                let work = async {
                    tokio::select! {
                        out = self.dispatch(&topo, client, identity.as_deref(), method, params, sink, &mut info) => Some(out),
                        _ = token.cancelled() => None,
                    }
                };
                work.instrument(span.clone()).await
            }
        };
        if let Some(server) = &info.server {
            client
                .used
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(server.clone());
        }
        self.observe(method, &info, out.as_ref(), started.elapsed());
        telemetry::finish_request(&span, method, out.as_ref(), info.rate_limited);
        out
    }

    fn observe(&self, method: &str, info: &CallInfo, out: Option<&Outcome>, took: std::time::Duration) {
        let outcome = match (info.rate_limited, out) {
            (true, _) => metrics::Outcome::RateLimited,
            (false, None) => metrics::Outcome::Cancelled,
            (false, Some(Outcome::Error(_))) => metrics::Outcome::Error,
            (false, Some(Outcome::Result(r))) if method == "tools/call" && message::is_tool_error(r.get()) => {
                metrics::Outcome::ToolError
            }
            (false, Some(Outcome::Result(_))) => metrics::Outcome::Ok,
        };
        let server = info.server.as_deref().unwrap_or("");
        self.metrics
            .record(method, server, info.tool.as_deref().unwrap_or(""), outcome, took);
    }

    /// The answer to a request over a rate limit. A tool call gets a tool result with
    /// `isError`, whose text a model can act on; anything else a JSON-RPC error with
    /// `data.retryAfterMs`.
    fn limited(&self, method: &str, l: &Limited, info: &mut CallInfo) -> Outcome {
        info.rate_limited = true;
        self.rate_limited(method, l)
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
            .map_err(|l| self.rate_limited("initialize", &l))
    }

    /// The answer to a request over a rate limit (see [`Gateway::limited`]), counted.
    fn rate_limited(&self, method: &str, l: &Limited) -> Outcome {
        debug!(method, limit = %l.what, "rate limited");
        self.metrics.rate_limited(&l.what);
        if method == "tools/call" {
            Outcome::Result(
                message::to_raw(&json!({
                    "content": [{ "type": "text", "text": l.message() }],
                    "isError": true,
                }))
                .into(),
            )
        } else {
            Outcome::Error(message::error_object(
                code::RATE_LIMITED,
                &l.message(),
                Some(json!({ "retryAfterMs": l.retry_after_ms(), "limit": l.what })),
            ))
        }
    }

    /// Handles a notification from a client.
    pub fn notification(&self, client: &Client, method: &str, params: Option<&RawValue>) {
        match method {
            "notifications/cancelled" => {
                let Some(id) = message::cancelled_request_id(params) else {
                    return;
                };
                if let Some(t) = client.inflight().get(&id_key(&id)) {
                    debug!(session = %client.id, request = %id, "client cancelled a request");
                    t.cancel();
                }
            }
            "notifications/roots/list_changed" => {
                // The servers this session's calls went to may cache its roots.
                let used: Vec<Arc<str>> = client
                    .used
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                let topo = self.topology();
                for s in topo.servers.iter().filter(|s| used.contains(&s.name)) {
                    if let Ok(conn) = s.connection() {
                        tokio::spawn(async move { conn.notify("notifications/roots/list_changed", None).await });
                    }
                }
            }
            "notifications/initialized" | "notifications/progress" => {}
            other => debug!(session = %client.id, method = other, "ignoring client notification"),
        }
    }

    /// `identity`'s allowlist hides names and URIs: a hidden one is answered exactly like
    /// one that does not exist.
    #[allow(clippy::too_many_arguments)]
    async fn dispatch(
        &self,
        topo: &Topology,
        client: &Arc<Client>,
        identity: Option<&Identity>,
        method: &str,
        params: Option<Box<RawValue>>,
        sink: Option<Sink>,
        info: &mut CallInfo,
    ) -> Outcome {
        let catalog = &topo.catalog;
        let visible = |name: &str| identity.is_none_or(|i| i.permits(name));
        let views = match method {
            "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
                identity.and_then(|i| i.views(catalog))
            }
            _ => None,
        };
        let page_size = topo.config.gateway.page_size;
        if !matches!(method, "tools/call" | "prompts/get") {
            info.progress = message::progress_token_of(params.as_deref());
        }
        let list = |result: &RawValue| -> Outcome {
            match message::params_object(params.as_deref()) {
                Ok(p) => page(result, method, p.get("cursor").filter(|c| !c.is_null()), page_size),
                Err(e) => err(code::INVALID_PARAMS, e),
            }
        };
        match method {
            "ping" => Outcome::Result(message::empty_object().into()),
            "tools/list" => list(views.as_ref().map_or(&catalog.tools_result, |v| &v.tools)),
            "prompts/list" => list(views.as_ref().map_or(&catalog.prompts_result, |v| &v.prompts)),
            "resources/list" => list(views.as_ref().map_or(&catalog.resources_result, |v| &v.resources)),
            "resources/templates/list" => list(views.as_ref().map_or(&catalog.templates_result, |v| &v.templates)),
            "logging/setLevel" => {
                let level = message::params_object(params.as_deref())
                    .ok()
                    .and_then(|p| p.get("level").and_then(Value::as_str).map(str::to_owned));
                let Some(rank) = level.as_deref().and_then(crate::downstream::log_rank) else {
                    return err(
                        code::INVALID_PARAMS,
                        format!(
                            "logging/setLevel needs params.level, one of {}",
                            crate::downstream::LOG_LEVELS.join(", ")
                        ),
                    );
                };
                *client.log_level.write().unwrap_or_else(|e| e.into_inner()) = Some(rank);
                self.log_clients
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(client.id.clone(), Arc::downgrade(client));
                self.apply_log_level(topo).await;
                Outcome::Result(message::empty_object().into())
            }
            "tools/call" | "prompts/get" => {
                let (table, what) = if method == "tools/call" {
                    (&catalog.tools, "tool")
                } else {
                    (&catalog.prompts, "prompt")
                };
                // Opened one level only: `arguments` goes on as the client wrote it.
                let mut p = match message::Members::parse(params) {
                    Ok(p) => p,
                    Err(e) => return err(code::INVALID_PARAMS, e),
                };
                let name = p.get_str("name");
                let Some(name) = name.as_deref() else {
                    return err(code::INVALID_PARAMS, format!("{method} needs params.name"));
                };
                if name.len() > message::MAX_NAME_LEN {
                    return err(
                        code::INVALID_PARAMS,
                        format!(
                            "{method}: params.name is {} bytes, longer than the {} allowed",
                            name.len(),
                            message::MAX_NAME_LEN
                        ),
                    );
                }
                // The schema says an object when present (the TS SDK refuses anything
                // else, null included); a server must never see another shape.
                if let Some(kind) = p.get_raw("arguments").and_then(not_an_object) {
                    return err(
                        code::INVALID_PARAMS,
                        format!("{method}: params.arguments must be an object when present, not {kind}"),
                    );
                }
                let Some(route) = table.get(name).filter(|_| visible(name)) else {
                    // A name under the prefix of a server that is down is that server's
                    // problem, not an unknown name: say so (unless the name is hidden).
                    if let Some(e) = down_server_for(topo, name).filter(|_| visible(name)) {
                        return Outcome::Error(e.to_error_object());
                    }
                    return Outcome::Error(message::error_object(
                        code::INVALID_PARAMS,
                        &format!("unknown {what}: {name}"),
                        Some(json!({ what: name })),
                    ));
                };
                if method == "tools/call" {
                    info.tool = Some(name.to_owned());
                }
                // Known from here on, so a limited call counts under its server too.
                info.server = Some(topo.servers[route.server].name.clone());
                let tool = (method == "tools/call").then_some(route.name.as_str());
                if let Err(l) = topo.limits.check_server(route.server, tool) {
                    return self.limited(method, &l, info);
                }
                p.insert_str("name", &route.name);
                // A task-augmented call goes as one only to a server that declared it can.
                let as_task = method == "tools/call" && p.contains_key("task");
                let server = &topo.servers[route.server];
                if as_task && !supports_tasks(server, "call") {
                    p.remove("task");
                }
                let out = self.forward(topo, client, route.server, method, p, sink, info).await;
                match out {
                    Outcome::Result(r) if as_task => self
                        .created_task(&server.name, client, r.get())
                        .unwrap_or(Outcome::Result(r)),
                    other => other,
                }
            }
            "tasks/get" | "tasks/result" | "tasks/cancel" => {
                let mut p = match message::params_object(params.as_deref()) {
                    Ok(p) => p,
                    Err(e) => return err(code::INVALID_PARAMS, e),
                };
                let public = p.get("taskId").and_then(Value::as_str).unwrap_or_default().to_owned();
                let found = self
                    .tasks
                    .resolve(&public, &client.id)
                    .and_then(|r| topo.servers.iter().position(|s| s.name == r.server).map(|i| (i, r)));
                let Some((server, route)) = found else {
                    return err(code::INVALID_PARAMS, format!("unknown task: {public}"));
                };
                p.insert("taskId".into(), Value::String(route.task_id));
                match self.forward(topo, client, server, method, p, sink, info).await {
                    Outcome::Result(r) => {
                        let mut body = crate::tasks::open(r.get());
                        crate::tasks::rewrite_task_object(&mut body, &route.server);
                        Outcome::Result(crate::tasks::close(body).into())
                    }
                    other => other,
                }
            }
            "tasks/list" => self.list_tasks(topo, client).await,
            "resources/read" => {
                let p = match message::params_object(params.as_deref()) {
                    Ok(p) => p,
                    Err(e) => return err(code::INVALID_PARAMS, e),
                };
                let Some(uri) = p.get("uri").and_then(Value::as_str) else {
                    return err(code::INVALID_PARAMS, "resources/read needs params.uri");
                };
                match resource_owner(topo, uri).filter(|_| visible(uri)) {
                    Some(server) => self.forward(topo, client, server, method, p, sink, info).await,
                    None => Outcome::Error(message::error_object(
                        code::RESOURCE_NOT_FOUND,
                        &format!("unknown resource: {uri}"),
                        Some(json!({ "uri": uri })),
                    )),
                }
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let p = match message::params_object(params.as_deref()) {
                    Ok(p) => p,
                    Err(e) => return err(code::INVALID_PARAMS, e),
                };
                let Some(uri) = p.get("uri").and_then(Value::as_str).map(str::to_owned) else {
                    return err(code::INVALID_PARAMS, format!("{method} needs params.uri"));
                };
                let Some(server) = resource_owner(topo, &uri).filter(|_| visible(&uri)) else {
                    return Outcome::Error(message::error_object(
                        code::RESOURCE_NOT_FOUND,
                        &format!("unknown resource: {uri}"),
                        Some(json!({ "uri": uri })),
                    ));
                };
                let key = (topo.servers[server].name.clone(), uri);
                let first_or_last = {
                    let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
                    if method == "resources/subscribe" {
                        let sessions = subs.entry(key.clone()).or_default();
                        sessions.retain(|_, c| c.strong_count() > 0);
                        let first = sessions.is_empty();
                        sessions.insert(client.id.clone(), Arc::downgrade(client));
                        first
                    } else {
                        let last = match subs.get_mut(&key) {
                            Some(sessions) if sessions.contains_key(&client.id) => {
                                sessions.remove(&client.id);
                                sessions.retain(|_, c| c.strong_count() > 0);
                                sessions.is_empty()
                            }
                            _ => false,
                        };
                        if last {
                            subs.remove(&key);
                        }
                        last
                    }
                };
                if !first_or_last {
                    // Refcounted: the downstream already is (or still must stay) subscribed.
                    return Outcome::Result(message::empty_object().into());
                }
                if topo.servers[server].stateless() {
                    // 2026-07-28 has no resources/subscribe: the URI joins the server's listen stream.
                    topo.servers[server].listen_uri(&key.1, method == "resources/subscribe");
                    return Outcome::Result(message::empty_object().into());
                }
                let out = self.forward(topo, client, server, method, p, sink, info).await;
                if method == "resources/subscribe" && matches!(out, Outcome::Error(_)) {
                    let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(sessions) = subs.get_mut(&key) {
                        sessions.remove(&client.id);
                        if sessions.is_empty() {
                            subs.remove(&key);
                        }
                    }
                }
                out
            }
            "completion/complete" => {
                let mut p = match message::params_object(params.as_deref()) {
                    Ok(p) => p,
                    Err(e) => return err(code::INVALID_PARAMS, e),
                };
                let Some(Value::Object(r)) = p.get_mut("ref") else {
                    return err(code::INVALID_PARAMS, "completion/complete needs params.ref");
                };
                let server = match r.get("type").and_then(Value::as_str) {
                    Some("ref/prompt") => {
                        let name = r.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                        let Some(route) = catalog.prompts.get(&name).filter(|_| visible(&name)) else {
                            return err(code::INVALID_PARAMS, format!("unknown prompt: {name}"));
                        };
                        r.insert("name".into(), Value::String(route.name.clone()));
                        route.server
                    }
                    Some("ref/resource") => {
                        let uri = r.get("uri").and_then(Value::as_str).unwrap_or_default().to_owned();
                        match resource_owner(topo, &uri).filter(|_| visible(&uri)) {
                            Some(s) => s,
                            None => return err(code::INVALID_PARAMS, format!("unknown resource: {uri}")),
                        }
                    }
                    other => {
                        return err(
                            code::INVALID_PARAMS,
                            format!("unknown ref type: {}", other.unwrap_or("(none)")),
                        )
                    }
                };
                self.forward(topo, client, server, method, p, sink, info).await
            }
            "initialize" => err(code::INVALID_REQUEST, "this session is already initialized"),
            other => err(code::METHOD_NOT_FOUND, format!("method not found: {other}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        topo: &Topology,
        client: &Arc<Client>,
        server: usize,
        method: &str,
        mut params: impl OpenParams,
        sink: Option<Sink>,
        info: &mut CallInfo,
    ) -> Outcome {
        let s = &topo.servers[server];
        info.server = Some(s.name.clone());
        if method != "tools/call" && method != "prompts/get" {
            // Those two were checked with their names already.
            if let Err(l) = topo.limits.check_server(server, None) {
                return self.limited(method, &l, info);
            }
        }
        let conn = match &info.session {
            // Boxed: starting a per-session process (probe, handshake, lists) is a large
            // future, and inline it would make every request's future that large.
            Some(session) => Box::pin(s.connection_for(session)).await,
            None => s.connection(),
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => return Outcome::Error(e.to_error_object()),
        };
        let progress = params.take_progress().map(|t| info.progress.take().unwrap_or(t));
        let sink = if progress.is_some() || sink.is_some() {
            sink
        } else {
            None
        };
        let stateless = s.state().info.as_ref().is_some_and(|i| i.stateless);
        if !stateless {
            // Handshake era: no envelope, no bridge; the params go on as opened (for
            // tools/call and prompts/get, Members: untouched values stay raw).
            return self.forward_plain(s, &conn, method, params, progress, sink).await;
        }
        // The 2026-07-28 envelope and the input_required retry work on the whole map.
        let mut params = params.into_map();
        let mut headers = Vec::new();
        self.stamp(s, client, method, &mut params, &mut headers);
        // A handshake-era client cannot take an input_required result: the gateway asks
        // it itself and retries (the first bridge). Only these methods may return one.
        let bridge =
            stateless && !client.stateless && matches!(method, "tools/call" | "prompts/get" | "resources/read");
        let retry = bridge.then(|| (params.clone(), headers.clone(), progress.clone(), sink.clone()));
        let ds = downstream_span(s, method, params.name().as_deref());
        ds.inject(&mut params);
        let timeout = s.settings().timeout;
        let res = conn
            .call_with_headers(method, Params::Object { params, progress }, sink, timeout, headers)
            .instrument(ds.span.clone())
            .await;
        ds.finish(&res);
        let out = match res {
            Ok(out) => out,
            Err(e) => {
                warn!(server = %s.name, method, error = %e, "downstream call failed");
                return Outcome::Error(e.to_error_object());
            }
        };
        match retry {
            Some((params, headers, progress, sink)) => {
                crate::downstream::stateless::bridge_input_required(
                    &conn, &s.name, method, out, params, headers, progress, sink, timeout,
                )
                .await
            }
            None => out,
        }
    }

    /// A call to a handshake-era server: trace context in, params out as they are.
    async fn forward_plain(
        &self,
        s: &Server,
        conn: &crate::downstream::Connection,
        method: &str,
        mut params: impl OpenParams,
        progress: Option<message::Id>,
        sink: Option<Sink>,
    ) -> Outcome {
        let ds = downstream_span(s, method, params.name().as_deref());
        ds.inject(&mut params);
        let res = conn
            .call(method, params.into_params(progress), sink, s.settings().timeout)
            .instrument(ds.span.clone())
            .await;
        ds.finish(&res);
        match res {
            Ok(out) => out,
            Err(e) => {
                warn!(server = %s.name, method, error = %e, "downstream call failed");
                Outcome::Error(e.to_error_object())
            }
        }
    }

    /// The 2026-07-28 envelope for a call to a modern server: the calling client's own
    /// capabilities and log level (a handshake-era client's from its `initialize` and
    /// `logging/setLevel`), and for a Streamable HTTP server the `Mcp-Param-*` headers the
    /// tool's schema asks for.
    fn stamp(
        &self,
        s: &Server,
        client: &Client,
        method: &str,
        params: &mut Map<String, Value>,
        headers: &mut Vec<(String, String)>,
    ) {
        let caps = client.capabilities.read().unwrap_or_else(|e| e.into_inner()).clone();
        let level = client
            .log_level
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .and_then(|r| crate::downstream::LOG_LEVELS.get(r).copied())
            .filter(|_| !client.silent);
        crate::downstream::stateless::stamp(params, caps, level);
        if method == "tools/call" && matches!(s.cfg.transport, crate::config::Transport::Http(_)) {
            let name = params.get("name").and_then(Value::as_str);
            let state = s.state();
            let schema = state
                .lists
                .tools
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == name)
                .and_then(|t| t.get("inputSchema"));
            if let Some(schema) = schema {
                crate::downstream::stateless::param_headers(schema, params.get("arguments"), headers);
            }
        }
    }
}

/// What kind of JSON value `raw` (a value's text, no leading whitespace) is, unless an object.
fn not_an_object(raw: &str) -> Option<&'static str> {
    Some(match raw.as_bytes().first()? {
        b'{' => return None,
        b'[' => "an array",
        b'"' => "a string",
        b'n' => "null",
        b't' | b'f' => "a boolean",
        _ => "a number",
    })
}

/// The span of one call to server `s`, a child of the current (request) span.
fn downstream_span(s: &Server, method: &str, name: Option<&str>) -> DownstreamSpan {
    let version = telemetry::exporting()
        .then(|| s.state().info.as_ref().map(|i| i.protocol_version.clone()))
        .flatten();
    let transport = match s.cfg.transport {
        crate::config::Transport::Stdio(_) => "pipe",
        crate::config::Transport::Http(_) => "tcp",
    };
    DownstreamSpan::new(
        &tracing::Span::current(),
        &s.name,
        transport,
        version.as_deref(),
        method,
        name,
    )
}

/// The error of a server that is not ready and whose prefix `name` carries.
fn down_server_for(topo: &Topology, name: &str) -> Option<crate::downstream::DsError> {
    let sep = &topo.config.gateway.separator;
    topo.servers.iter().find_map(|s| {
        let prefix = s.settings().prefix.clone();
        let prefixed = !prefix.is_empty()
            && name
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with(sep.as_str()));
        if !prefixed {
            return None;
        }
        s.connection().err()
    })
}

/// A URI's server: listed URIs, then templates; failing both, the only server that
/// offers resources at all (servers may serve URIs they do not list).
fn resource_owner(topo: &Topology, uri: &str) -> Option<usize> {
    topo.catalog.resource_owner(uri).or_else(|| {
        let mut offering = topo.servers.iter().enumerate().filter(|(_, s)| {
            let st = s.state();
            st.status == Status::Ready && st.info.as_ref().is_some_and(|i| i.has("resources"))
        });
        match (offering.next(), offering.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    })
}

/// One page of a merged list result. With `page_size` 0 the whole list is one page.
/// Cursors are opaque to clients: the list's method and the offset, in hex.
fn page(result: &RawValue, method: &str, cursor: Option<&Value>, page_size: usize) -> Outcome {
    let invalid = || err(code::INVALID_PARAMS, "invalid cursor: list again without one");
    let offset = match cursor {
        None => 0,
        Some(Value::String(c)) => match decode_cursor(c) {
            Some((m, offset)) if m == method => offset,
            _ => return invalid(),
        },
        Some(_) => return invalid(),
    };
    if page_size == 0 {
        return if offset == 0 {
            Outcome::Result(result.to_owned().into())
        } else {
            invalid()
        };
    }
    let Ok(Value::Object(mut body)) = serde_json::from_str::<Value>(result.get()) else {
        return Outcome::Result(result.to_owned().into());
    };
    let Some((key, Value::Array(items))) = body
        .iter_mut()
        .find(|(_, v)| v.is_array())
        .map(|(k, v)| (k.clone(), v.take()))
    else {
        return Outcome::Result(result.to_owned().into());
    };
    if offset > items.len() {
        return invalid();
    }
    let end = (offset + page_size).min(items.len());
    let more = end < items.len();
    body.insert(
        key,
        Value::Array(items.into_iter().skip(offset).take(end - offset).collect()),
    );
    if more {
        body.insert("nextCursor".into(), Value::String(encode_cursor(method, end)));
    }
    Outcome::Result(message::to_raw(&Value::Object(body)).into())
}

fn encode_cursor(method: &str, offset: usize) -> String {
    let text = format!("{method}\n{offset}");
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Option<(String, usize)> {
    if cursor.len() % 2 != 0 || cursor.len() > 256 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (method, offset) = text.split_once('\n')?;
    Some((method.to_owned(), offset.parse().ok()?))
}

fn any_isolated(servers: &[Arc<Server>]) -> bool {
    servers
        .iter()
        .any(|s| s.cfg.isolation == crate::config::Isolation::Session)
}

/// The merged catalog of `servers` as they are now.
fn build_catalog(config: &Config, servers: &[Arc<Server>]) -> Catalog {
    let states: Vec<_> = servers
        .iter()
        .map(|s| (s, s.settings(), s.state().lists.clone()))
        .collect();
    let sources: Vec<Source> = states
        .iter()
        .map(|(s, settings, lists)| Source {
            server: &s.cfg.name,
            prefix: &settings.prefix,
            lists,
            filter: &settings.tools,
        })
        .collect();
    Catalog::build(&config.gateway.separator, &sources)
}

/// Checks (and spends) a client's budgets: `[rate_limits] per_client` under `key`, then
/// the identity's own `rate_limit`.
fn check_client_rates(topo: &Topology, key: &str, identity: Option<&Identity>) -> Result<(), Limited> {
    topo.limits
        .check_client(key)
        .and_then(|()| identity.map_or(Ok(()), Identity::check_rate))
}

/// What the router learned about a request on its way, for metrics and traces.
#[derive(Default)]
pub struct CallInfo {
    /// The server it went to.
    pub server: Option<Arc<str>>,
    /// The session it came from (picks a server's per-session process).
    pub session: Option<String>,
    /// The public tool name, for tools/call.
    pub tool: Option<String>,
    pub rate_limited: bool,
    /// The client's progress token as it wrote it, read before its params were opened
    /// into a map (not for tools/call and prompts/get, whose params stay raw).
    pub progress: Option<Id>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> Box<RawValue> {
        message::to_raw(&v)
    }

    #[test]
    fn pages_follow_cursors_to_the_end() {
        let all = raw(json!({ "tools": [1, 2, 3, 4, 5] }));
        let mut cursor: Option<Value> = None;
        let mut seen = Vec::new();
        for _ in 0..10 {
            let Outcome::Result(r) = page(&all, "tools/list", cursor.as_ref(), 2) else {
                panic!("error")
            };
            let v: Value = serde_json::from_str(r.get()).unwrap();
            seen.extend(v["tools"].as_array().unwrap().iter().cloned());
            match v.get("nextCursor") {
                Some(c) => cursor = Some(c.clone()),
                None => break,
            }
        }
        assert_eq!(seen, vec![json!(1), json!(2), json!(3), json!(4), json!(5)]);
        // A cursor of another list, garbage, or a non-string is -32602.
        let other = Value::String(encode_cursor("prompts/list", 2));
        for bad in [other, json!("zz"), json!(7)] {
            assert!(
                matches!(page(&all, "tools/list", Some(&bad), 2), Outcome::Error(_)),
                "{bad}"
            );
        }
        // Without a page size everything is one page, and any cursor is invalid.
        assert!(matches!(page(&all, "tools/list", None, 0), Outcome::Result(_)));
        assert!(matches!(
            page(&all, "tools/list", Some(&json!("00")), 0),
            Outcome::Error(_)
        ));
    }
}
