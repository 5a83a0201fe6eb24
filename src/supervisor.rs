//! One downstream server's life: start it, follow what it says, restart it as its
//! `restart` policy says, stop it; and the state that routing and `/status` read.
//! Transport-neutral: it only talks through a [`Connection`].
//!
//! Its parts, one file each: `handshake` (open the transport, learn the era), `lists`
//! (list and re-list what it offers), `listen` (the 2026-07-28 `subscriptions/listen`
//! stream) and `pool` (with `isolation = "session"`, each session's own process).

mod handshake;
mod listen;
mod lists;
mod pool;

pub use handshake::InitInfo;
pub use lists::ListKind;

use crate::catalog::Lists;
use crate::config;
use crate::downstream::{Connection, DsError, Incoming};
use crate::sync;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// First wait before starting a server again, doubled up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// A server up this long is healthy again: its backoff starts over.
const STABLE: Duration = Duration::from_secs(10);
/// This many failures of a child within [`CRASH_WINDOW`] make a crash loop.
const CRASH_LOOP: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How often a crash-looping child is tried.
const SLOW_RETRY: Duration = Duration::from_secs(60);
/// The shortest time between two re-lists of a server's lists after its list_changed.
const RELIST_EVERY: Duration = Duration::from_millis(250);

/// What a reload may change on a running server.
#[derive(Debug)]
pub struct Settings {
    pub prefix: String,
    pub timeout: Duration,
    pub tools: config::Filter,
    /// `[servers.NAME.overrides.*]`, by the server's own tool name.
    pub overrides: indexmap::IndexMap<String, config::Override>,
}

impl Settings {
    fn of(cfg: &config::Server) -> Settings {
        Settings {
            prefix: cfg.prefix.clone(),
            timeout: cfg.timeout,
            tools: cfg.tools.clone(),
            overrides: cfg.overrides.clone(),
        }
    }
}

/// Where a server is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Disabled,
    Starting,
    Ready,
    /// Could not start, or exited; the sentence says why.
    Down(String),
    /// Crash-looping: retried slowly.
    Failed(String),
    Stopped,
}

#[derive(Debug)]
pub struct State {
    pub status: Status,
    pub conn: Option<Connection>,
    pub info: Option<InitInfo>,
    pub lists: Lists,
    pub since: Option<Instant>,
    /// Why the server last failed, kept after it recovers.
    pub last_error: Option<String>,
}

impl State {
    /// Ready, but owing answers it has not given for its timeout (see
    /// [`crate::downstream::pipe`]): shown as `degraded`, and not ready for `/readyz`.
    pub fn degraded(&self) -> bool {
        self.status == Status::Ready && self.conn.as_ref().is_some_and(Connection::degraded)
    }
}

/// What comes between why a server failed and its last stderr lines.
const STDERR_TAIL: &str = "; its last stderr: ";

/// `why`, followed by the child's last stderr lines when it wrote any.
async fn with_stderr(why: String, conn: &Connection) -> String {
    match conn.stderr_tail().await {
        Some(tail) => format!("{why}{STDERR_TAIL}{tail}"),
        None => why,
    }
}

/// A configured server and its live state.
pub struct Server {
    /// As configured. Its `prefix`, `timeout` and `tools` may be retuned by a reload
    /// without a restart: read those through [`Server::settings`].
    pub cfg: config::Server,
    settings: RwLock<Arc<Settings>>,
    pub name: Arc<str>,
    state: RwLock<State>,
    /// Cancelled by [`Server::stop`]; ends the reconnect loop.
    stop: CancellationToken,
    /// Start attempts after the first, failed ones included.
    pub restarts: AtomicU64,
    /// Calls sent to it and not answered yet (the console's in-flight).
    pub in_flight: std::sync::atomic::AtomicI64,
    /// The console's last 15 minutes of its calls, made on its first call.
    series: std::sync::OnceLock<Box<crate::console::Series>>,
    /// With `isolation = "session"` or `"client"` (or `${client:…}` values): each
    /// session's or client identity's own process or connection.
    pool: pool::Pool,
    /// A 2026-07-28 server: what its listen stream asks for.
    subscriptions: listen::Subscriptions,
    /// The child exited while the `server/discover` probe was pending: later starts go
    /// straight to `initialize`.
    skip_probe: AtomicBool,
    /// Ends the wait before the next start (a user consented to a server with `auth.oauth`).
    wake: tokio::sync::Notify,
    /// Set by [`Server::reconnect`]: its connection closed on purpose, to be opened again
    /// at once.
    reconnect: AtomicBool,
}

/// Who a call is for, which picks the process of a server that is not shared and fills
/// its `${client:…}` values.
pub struct Caller<'a> {
    /// The client session (a stateless request's own id).
    pub session: Option<&'a str>,
    /// The caller's identity (its `[clients.*]` name or OAuth subject) and its secrets.
    pub client: Option<(&'a str, &'a [(String, config::Secret)])>,
    /// The key of the caller's own process or connection (`isolation = "client"`,
    /// `${client:…}`): `auth::Identity::process_key`; `None`: its name.
    pub principal: Option<&'a str>,
}

/// What a supervisor tells the rest of the gateway.
#[derive(Debug)]
pub enum Event {
    /// A server's lists changed (or it became ready); the catalog must be rebuilt.
    /// `announced`: the server and the kind it said changed (a list_changed of its own),
    /// passed on to the clients that see the server even when the merged list looks the same.
    ListsChanged { announced: Option<(Arc<str>, ListKind)> },
    /// A server was started again, or a Streamable HTTP server initialized again after
    /// forgetting its session: what sessions asked of the old one (resource
    /// subscriptions, the log level) must be asked again.
    Restarted { server: Arc<str> },
    /// A notification from a server that is not about lists (e.g. resources/updated).
    Notification {
        server: Arc<str>,
        method: String,
        params: Option<Box<serde_json::value::RawValue>>,
    },
}

impl Server {
    pub fn new(cfg: config::Server) -> Server {
        let status = if cfg.enabled {
            Status::Starting
        } else {
            Status::Disabled
        };
        let name: Arc<str> = Arc::from(cfg.name.as_str());
        let stop = CancellationToken::new();
        Server {
            pool: pool::Pool::new(
                name.clone(),
                cfg.max_sessions,
                cfg.isolation == config::Isolation::Session,
                stop.clone(),
            ),
            name,
            settings: RwLock::new(Arc::new(Settings::of(&cfg))),
            cfg,
            state: RwLock::new(State {
                status,
                conn: None,
                info: None,
                lists: Lists::default(),
                since: None,
                last_error: None,
            }),
            stop,
            restarts: AtomicU64::new(0),
            in_flight: std::sync::atomic::AtomicI64::new(0),
            series: std::sync::OnceLock::new(),
            subscriptions: Default::default(),
            skip_probe: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            reconnect: AtomicBool::new(false),
        }
    }

    /// Starts it again now if it is waiting to (its catalog can be listed now).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Closes its connection so that it is opened again at once (`auth.oauth`: the one
    /// listing the catalog was opened with a user's token that is now revoked, and is
    /// opened again with another user's).
    pub async fn reconnect(&self) {
        self.reconnect.store(true, Ordering::Release);
        let conn = self.state().conn.clone();
        match conn {
            Some(c) => c.shutdown().await,
            None => self.wake(),
        }
    }

    /// Whether it offers only the placeholder tool, waiting for a first user's consent.
    pub fn awaiting_consent(&self) -> bool {
        self.oauth().is_some() && self.state().conn.is_none()
    }

    /// Whether callers get processes (or connections) of their own: `isolation =
    /// "session"` or `"client"`, or `${client:…}` in its `env` or `headers`.
    pub fn pooled(&self) -> bool {
        self.cfg.isolation != config::Isolation::Shared || self.cfg.transport.per_client()
    }

    /// Whether callers' calls go to connections of their own (see [`Server::pooled`]), or
    /// carry their own credential (`auth.token_exchange`, `auth.oauth`): the shared
    /// connection only lists.
    pub fn per_caller(&self) -> bool {
        self.pooled() || self.token_exchange().is_some() || self.oauth().is_some()
    }

    /// Whose process serves `caller`: its session's (`isolation = "session"`), else its
    /// identity's. `Err`: a caller without an identity, which a process per identity
    /// cannot serve. `Ok(None)`: the shared connection.
    fn pool_key<'a>(&self, caller: &Caller<'a>) -> Result<Option<&'a str>, DsError> {
        if !self.pooled() {
            return Ok(None);
        }
        if self.cfg.isolation == config::Isolation::Session {
            // Without a session (none of the topology's servers is session-isolated, so
            // never here) the shared process serves, unless it would need a caller's secret.
            return match caller.session {
                None if self.cfg.transport.per_client() => Err(DsError::Unavailable {
                    server: self.name.clone(),
                    reason: "it needs the caller's secrets in a process of its session, and this call has no session"
                        .into(),
                }),
                session => Ok(session),
            };
        }
        let why = if self.cfg.isolation == config::Isolation::Client {
            "it has isolation = \"client\" (a process per client identity)"
        } else {
            "its headers use ${client:…} (a connection per client identity)"
        };
        match caller.client {
            Some((name, _)) => Ok(Some(caller.principal.unwrap_or(name))),
            None => Err(DsError::Unavailable {
                server: self.name.clone(),
                reason: format!("{why}, and this caller has no identity: send a bearer token of a [clients.*] table or of [auth.oauth]"),
            }),
        }
    }

    /// Checks that `caller` has every secret the server's `${client:…}` values use (and,
    /// for headers, that each can be one), and returns their fingerprint. `Err` names the
    /// secret and the key, never a value.
    fn check_secrets(&self, caller: &Caller<'_>) -> Result<[u8; 32], DsError> {
        let secrets = caller.client.map_or(&[][..], |(_, s)| s);
        let (kind, templates) = self.cfg.transport.templates();
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for (key, t) in templates {
            for name in t.secrets() {
                let Some((_, value)) = secrets.iter().find(|(n, _)| n == name) else {
                    return Err(self.lacks(caller, name, &format!("{kind}.{key}")));
                };
                let value = value.expose();
                if kind == "headers" && value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                    return Err(DsError::Unavailable {
                        server: self.name.clone(),
                        reason: format!(
                            "the secret {name} of this client holds control characters, so servers.{}.{kind}.{key} cannot carry it",
                            self.name
                        ),
                    });
                }
                for part in [name.as_bytes(), value.as_bytes()] {
                    ctx.update(&(part.len() as u64).to_le_bytes());
                    ctx.update(part);
                }
            }
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Ok(out)
    }

    /// The error of a caller without secret `missing`, which `key` needs.
    fn lacks(&self, caller: &Caller<'_>, missing: &str, key: &str) -> DsError {
        DsError::Unavailable {
            server: self.name.clone(),
            reason: match caller.client {
                Some((name, _)) => format!(
                    "client {name:?} has no secret {missing} (servers.{}.{key} uses ${{client:{missing}}}); add it to [clients.{name}] secrets",
                    self.name
                ),
                None => format!(
                    "servers.{}.{key} uses ${{client:{missing}}}, and this caller has no identity (so no secret {missing}): send a bearer token of a [clients.*] table",
                    self.name
                ),
            },
        }
    }

    /// The transport as it is for `caller`: its `${client:…}` values filled from the
    /// caller's secrets ([`Server::check_secrets`] found them all).
    fn transport_for(&self, caller: &Caller<'_>) -> Result<config::Transport, String> {
        let secrets = caller.client.map_or(&[][..], |(_, s)| s);
        let secret = |n: &str| secrets.iter().find(|(k, _)| k == n).map(|(_, v)| v.expose().to_owned());
        let filled = match &self.cfg.transport {
            config::Transport::Stdio(spec) if spec.per_client() => {
                spec.for_client(&secret).map(config::Transport::Stdio)
            }
            config::Transport::Http(spec) if spec.per_client() => spec.for_client(&secret).map(config::Transport::Http),
            other => Ok(other.clone()),
        };
        filled.map_err(|(missing, key)| format!("the caller has no usable secret {missing} for {key}"))
    }

    /// The connection that serves `caller`: the shared one, or (see [`Server::pooled`])
    /// the caller's own process or connection, started on first use with the caller's
    /// secrets (the shared one then only provides the catalog).
    pub async fn connection_for(&self, caller: &Caller<'_>) -> Result<Connection, DsError> {
        let Some(key) = self.pool_key(caller)? else {
            return self.connection();
        };
        // Only a server whose catalog process is up is offered to sessions.
        self.connection()?;
        let fingerprint = self.check_secrets(caller)?;
        let start = || async {
            let transport = self.transport_for(caller)?;
            self.connect(&transport)
                .await
                .map(|(conn, _info, incoming)| (conn, incoming))
        };
        self.pool.connection_for(key, fingerprint, start).await
    }

    /// The connection of one caller (`auth.token_exchange`), by its principal
    /// (`auth::Identity::principal`): its own session with the server, whose requests
    /// carry `bearer`. Kept like a session's process (bounded by `max_sessions`, stopped
    /// after `idle_timeout` unused).
    pub async fn connection_as(
        &self,
        principal: &str,
        bearer: crate::upstream::exchange::Bearer,
    ) -> Result<Connection, DsError> {
        // Only a server whose own connection (handshake, lists) is up is offered.
        self.connection()?;
        // A NUL cannot start a session id: these keys never meet a session's.
        let key = format!("\0identity:{principal}");
        let start = || async {
            self.connect_as(bearer)
                .await
                .map(|(conn, _info, incoming)| (conn, incoming))
        };
        // The token is swapped in place on refresh: no secrets to fingerprint.
        self.pool.connection_for(&key, [0; 32], start).await
    }

    /// The connection of one user (`auth.oauth`), by its principal: its own session with
    /// the server, whose requests carry `bearer`, the user's own token. Kept like a
    /// session's process (bounded by `max_sessions`, stopped after `idle_timeout` unused).
    pub async fn user_connection(
        &self,
        principal: &str,
        bearer: crate::upstream::exchange::Bearer,
    ) -> Result<Connection, DsError> {
        // A NUL cannot start a session id: these keys never meet a session's (nor a
        // token exchange caller's).
        let key = format!("\0user:{principal}");
        let start = || async {
            self.connect_as(bearer)
                .await
                .map(|(conn, _info, incoming)| (conn, incoming))
        };
        // The token is swapped in place on refresh: no secrets to fingerprint.
        self.pool.connection_for(&key, [0; 32], start).await
    }

    /// Stops one user's connection, by its principal (its tokens were revoked).
    pub async fn end_user(&self, principal: &str) {
        self.pool.end(&format!("\0user:{principal}")).await;
    }

    /// The connection already serving `caller`, without starting a process for it.
    pub async fn existing_connection_for(&self, caller: &Caller<'_>) -> Option<Connection> {
        match self.pool_key(caller) {
            Ok(None) => self.connection().ok(),
            Ok(Some(key)) => self.pool.existing(key).await,
            Err(_) => None,
        }
    }

    /// Stops the process of `session`, if it has one; none is started for it afterwards.
    /// (A process per client identity outlives its sessions: only `idle_timeout` stops it.)
    pub async fn end_session(&self, session: &str) {
        if self.cfg.isolation == config::Isolation::Session {
            self.pool.end(session).await;
        }
    }

    /// Its console ring (allocated on first use).
    pub fn series(&self) -> &crate::console::Series {
        self.series.get_or_init(Box::default)
    }

    /// Its last 15 minutes, for the console (nothing is allocated for a server never called).
    pub fn summary(&self) -> crate::console::Summary {
        self.series.get().map(|s| s.summary()).unwrap_or_default()
    }

    /// How many session processes run (or are starting).
    pub fn session_processes(&self) -> usize {
        self.pool.running()
    }

    /// The settings a reload may change without restarting the server.
    pub fn settings(&self) -> Arc<Settings> {
        sync::read(&self.settings).clone()
    }

    /// Whether `other` describes the same process (or remote session): only then can a
    /// reload keep this server running and just retune it.
    pub fn same_process(&self, other: &config::Server) -> bool {
        self.cfg.name == other.name
            && self.cfg.transport == other.transport
            && self.cfg.isolation == other.isolation
            && self.cfg.max_sessions == other.max_sessions
            && self.cfg.idle_timeout == other.idle_timeout
            && self.cfg.enabled == other.enabled
            && self.cfg.restart == other.restart
            && self.cfg.protocol == other.protocol
            && self.cfg.catalog_secrets == other.catalog_secrets
    }

    /// Applies a reload's prefix, timeout, tool filter and overrides.
    pub fn retune(&self, cfg: &config::Server) {
        *sync::write(&self.settings) = Arc::new(Settings::of(cfg));
    }

    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        sync::read(&self.state)
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut sync::write(&self.state));
    }

    /// Its `auth.oauth`, if it has one: each user's own consent (`upstream::consent`).
    pub fn oauth(&self) -> Option<&config::OAuthClient> {
        match &self.cfg.transport {
            config::Transport::Http(config::HttpSpec {
                auth: Some(config::UpstreamAuth::OAuth(o)),
                ..
            }) => Some(o),
            _ => None,
        }
    }

    /// Its `auth.token_exchange`, if it has one.
    pub fn token_exchange(&self) -> Option<&config::TokenExchange> {
        match &self.cfg.transport {
            config::Transport::Http(config::HttpSpec {
                auth: Some(config::UpstreamAuth::TokenExchange(t)),
                ..
            }) => Some(t),
            _ => None,
        }
    }

    /// The connection to call, or an error naming the server and why it can't be called.
    pub fn connection(&self) -> Result<Connection, DsError> {
        let s = self.state();
        match (&s.status, &s.conn) {
            (Status::Ready, Some(c)) => Ok(c.clone()),
            (status, _) => Err(DsError::Unavailable {
                server: self.name.clone(),
                reason: match status {
                    Status::Disabled => "disabled in gateway.toml".into(),
                    Status::Starting => "still starting".into(),
                    Status::Down(why) | Status::Failed(why) => why.clone(),
                    Status::Stopped => "stopped".into(),
                    Status::Ready if self.oauth().is_some() => handshake::NEEDS_CONSENT.into(),
                    Status::Ready => "no connection".into(),
                },
            }),
        }
    }

    /// Starts the server and runs the handshake and the first listing. Returns the
    /// receiver of what the server says on its own, for [`Server::watch`].
    async fn start(&self) -> Option<mpsc::Receiver<Incoming>> {
        // A server with `${client:…}` values lists with its `catalog_secrets` (or without them).
        let transport = self.cfg.transport.for_catalog(&self.cfg.catalog_secrets);
        let (conn, info, rx) = match self.connect(&transport).await {
            Ok(c) => c,
            Err(why) if why == handshake::NEEDS_CONSENT => {
                // Calls go on each user's own connection; meanwhile the one tool asks for
                // consent (upstream::consent).
                self.update(|s| {
                    s.status = Status::Ready;
                    s.conn = None;
                    s.lists = crate::upstream::consent::placeholder_lists(&self.name);
                    s.since = Some(Instant::now());
                    s.last_error = Some(why);
                });
                return None;
            }
            Err(why) => {
                self.fail(why);
                return None;
            }
        };
        info!(server = %self.name, version = %info.protocol_version, transport = self.cfg.transport.kind(), "initialized");
        let lists = self.list_all(&conn, &info).await;
        if self.reconnect.load(Ordering::Acquire) {
            // Asked to reconnect while this connected (its user's token was revoked
            // meanwhile): not kept; `run` opens it again at once.
            conn.shutdown().await;
            return None;
        }
        info!(
            server = %self.name,
            tools = lists.tools.len(),
            prompts = lists.prompts.len(),
            resources = lists.resources.len(),
            templates = lists.templates.len(),
            "listed"
        );
        self.update(|s| {
            s.status = Status::Ready;
            s.conn = Some(conn);
            s.info = Some(info);
            s.lists = lists;
            s.since = Some(Instant::now());
        });
        Some(rx)
    }

    /// Runs the server for the gateway's lifetime: start, follow, and start again
    /// after it goes away as its `restart` policy says, with capped exponential backoff.
    /// A child that keeps crashing ([`CRASH_LOOP`] failures within [`CRASH_WINDOW`],
    /// none of them up for [`STABLE`]) is marked failed and retried every
    /// [`SLOW_RETRY`]. `started` fires after the first attempt, whatever its outcome.
    pub async fn run(self: Arc<Self>, events: mpsc::Sender<Event>, started: oneshot::Sender<()>) {
        let mut started = Some(started);
        let mut backoff = RETRY_MIN;
        if self.per_caller() {
            let me = self.clone();
            crate::background::spawn(async move { me.pool.reap_until_stopped(me.cfg.idle_timeout).await });
        }
        let mut failures: VecDeque<Instant> = VecDeque::new();
        loop {
            let began = Instant::now();
            // A reconnect asked before this start is this start; one asked during it is not.
            self.reconnect.store(false, Ordering::Release);
            let incoming = tokio::select! {
                i = self.start() => i,
                _ = self.stop.cancelled() => return,
            };
            match started.take() {
                Some(s) => {
                    let _ = s.send(());
                }
                None => {
                    // Every attempt after the first is a restart, failed ones included: a
                    // crash-looping server shows how often it was tried.
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                    if incoming.is_some() {
                        crate::console::events().push("restart", Some(&self.name), "started again");
                        let _ = events
                            .send(Event::Restarted {
                                server: self.name.clone(),
                            })
                            .await;
                        let _ = events.send(Event::ListsChanged { announced: None }).await;
                    } else if self.awaiting_consent() {
                        // Its catalog connection's user was forgotten and nobody else has
                        // consented: the placeholder replaces the tools listed before.
                        let _ = events.send(Event::ListsChanged { announced: None }).await;
                    }
                }
            }
            let clean = match incoming {
                Some(incoming) => {
                    // A 2026-07-28 server tells of changes only on a listen stream.
                    let listener = self
                        .stateless()
                        .then(|| crate::background::spawn(self.clone().listen()));
                    let clean = self.watch(incoming, events.clone()).await;
                    if let Some(l) = listener {
                        l.abort();
                    }
                    clean
                }
                None => false,
            };
            if self.stop.is_cancelled() {
                return;
            }
            if self.reconnect.swap(false, Ordering::AcqRel) {
                // Closed on purpose (Server::reconnect): again at once, no backoff.
                continue;
            }
            let again = match self.cfg.restart {
                config::Restart::Never => false,
                config::Restart::OnFailure => !clean,
                config::Restart::Always => true,
            };
            if !again {
                return;
            }
            if began.elapsed() >= STABLE {
                backoff = RETRY_MIN;
                failures.clear();
            }
            let stdio = matches!(self.cfg.transport, config::Transport::Stdio(_));
            let now = Instant::now();
            failures.push_back(now);
            while failures.front().is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW) {
                failures.pop_front();
            }
            let delay = if stdio && failures.len() >= CRASH_LOOP {
                let why = crate::console::clip(
                    format!(
                        "crash loop: {} failures within {}s; retrying every {}s (last: {})",
                        failures.len(),
                        CRASH_WINDOW.as_secs(),
                        SLOW_RETRY.as_secs(),
                        self.state().last_error.clone().unwrap_or_default()
                    ),
                    crate::console::TEXT,
                );
                warn!(server = %self.name, "{why}");
                crate::console::events().push("crash_loop", Some(&self.name), why.clone());
                self.update(|s| {
                    s.status = Status::Failed(why.clone());
                    s.last_error = Some(why);
                });
                SLOW_RETRY
            } else {
                backoff
            };
            info!(server = %self.name, retry_in = ?delay, "will start again");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.wake.notified() => {}
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Whether the server speaks 2026-07-28.
    pub fn stateless(&self) -> bool {
        self.state().info.as_ref().is_some_and(|i| i.stateless)
    }

    fn fail(&self, why: String) {
        // A server's own words may be megabytes (an initialize error): shown cut.
        let why = crate::console::clip(why, crate::console::TEXT);
        // The stderr lines were logged as they came; the log line need not repeat them.
        let logged = why.split_once(STDERR_TAIL).map_or(why.as_str(), |(w, _)| w);
        warn!(server = %self.name, error = %logged, "server unavailable");
        crate::console::events().push("down", Some(&self.name), format!("unavailable: {why}"));
        self.update(|s| {
            s.status = Status::Down(why.clone());
            s.last_error = Some(why);
            s.conn = None;
        });
    }

    /// Follows what a ready server says on its own until its connection closes.
    /// Returns whether it ended cleanly (a child's exit status 0, or a stop).
    ///
    /// A re-list runs while `incoming` is still read: the connection's task, which must
    /// read the re-list's answer, may be waiting to queue more notifications. list_changed
    /// notifications that arrive meanwhile are coalesced into one more re-list per kind.
    async fn watch(&self, mut incoming: mpsc::Receiver<Incoming>, events: mpsc::Sender<Event>) -> bool {
        let mut dirty: Vec<ListKind> = Vec::new();
        type Relist<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ListKind> + Send + 'a>>;
        let mut relisting: Option<Relist<'_>> = None;
        // A server that says list_changed without pause is re-listed at most every
        // RELIST_EVERY (what it says meanwhile is coalesced into the next re-list).
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            if relisting.is_none() && !dirty.is_empty() {
                let kind = dirty.remove(0);
                let at = last.map_or_else(tokio::time::Instant::now, |l| l + RELIST_EVERY);
                last = Some(at.max(tokio::time::Instant::now()));
                relisting = Some(Box::pin(async move {
                    tokio::time::sleep_until(at).await;
                    self.relist(kind).await;
                    kind
                }));
            }
            let msg = tokio::select! {
                kind = async { relisting.as_mut().expect("a re-list is running").await }, if relisting.is_some() => {
                    relisting = None;
                    // Announced even when the list came back the same: the server may
                    // have changed it and changed it back, and says so (the conformance
                    // suite's SEP-2575 checks do exactly that).
                    let _ = events
                        .send(Event::ListsChanged {
                            announced: Some((self.name.clone(), kind)),
                        })
                        .await;
                    continue;
                }
                msg = incoming.recv() => match msg {
                    Some(m) => m,
                    None => return true,
                },
            };
            match msg {
                Incoming::Notification { method, params } => match ListKind::from_notification(&method) {
                    Some(kind) => {
                        if !dirty.contains(&kind) {
                            dirty.push(kind);
                        }
                    }
                    None => {
                        let _ = events
                            .send(Event::Notification {
                                server: self.name.clone(),
                                method,
                                params,
                            })
                            .await;
                    }
                },
                Incoming::Reinitialized => {
                    let _ = events
                        .send(Event::Restarted {
                            server: self.name.clone(),
                        })
                        .await;
                }
                Incoming::Closed { reason, clean } => {
                    let stopped = matches!(self.state().status, Status::Stopped);
                    if !stopped {
                        let old = sync::write(&self.state).conn.take();
                        let why = match (&self.cfg.transport, &old) {
                            (config::Transport::Stdio(_), Some(c)) if !clean => {
                                with_stderr(format!("exited ({reason})"), c).await
                            }
                            (config::Transport::Stdio(_), _) => format!("exited ({reason})"),
                            (config::Transport::Http(_), _) => format!("connection lost ({reason})"),
                        };
                        self.fail(why);
                        if let Some(old) = old {
                            crate::background::spawn(async move { old.shutdown().await });
                        }
                        // A remote server comes back by reconnecting: until then its tools,
                        // prompts and resources leave the catalog (clients get list_changed
                        // now and again when they return).
                        if matches!(self.cfg.transport, config::Transport::Http(_)) {
                            self.update(|s| s.lists = Lists::default());
                            let _ = events.send(Event::ListsChanged { announced: None }).await;
                        }
                    }
                    return clean || stopped;
                }
            }
        }
    }

    /// Closes the connection (stdin, SIGTERM, SIGKILL) and marks the server stopped.
    pub async fn stop(&self) {
        self.stop.cancel();
        self.pool.stop().await;
        let conn = {
            let mut s = sync::write(&self.state);
            if matches!(s.status, Status::Ready | Status::Starting) {
                s.status = Status::Stopped;
            }
            s.conn.take()
        };
        if let Some(c) = conn {
            c.shutdown().await;
        }
    }
}
