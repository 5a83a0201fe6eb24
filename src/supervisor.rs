//! One downstream server's life: start its transport, run the MCP handshake, list
//! what it offers (every page), re-list on `list_changed`, and keep the state that
//! routing and `/status` read. Transport-neutral: it only talks through a
//! [`Connection`].

use crate::catalog::{Hint, Lists};
use crate::config;
use crate::downstream::{self, stateless, Connection, DsError, Incoming, Params};
use crate::message::{self, Outcome};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The newest handshake-era revision; offered to every downstream.
pub const DOWNSTREAM_VERSION: &str = "2025-11-25";
/// A bound on pages followed per list, against servers that repeat a cursor forever.
const MAX_PAGES: usize = 1000;

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
/// The longest wait for an answer to the `server/discover` probe (`protocol = "auto"`):
/// a handshake-era server may ignore requests before `initialize`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// A listen stream has no answer to wait for; this only bounds the wait.
const LISTEN_FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
enum Handshake {
    #[error("{0}")]
    Call(DsError),
    #[error("{0}")]
    Refused(String),
}

fn conn_kind(t: &config::Transport) -> &'static str {
    t.kind()
}

/// What a reload may change on a running server.
#[derive(Debug)]
pub struct Settings {
    pub prefix: String,
    pub timeout: Duration,
    pub tools: config::Filter,
}

impl Settings {
    fn of(cfg: &config::Server) -> Settings {
        Settings {
            prefix: cfg.prefix.clone(),
            timeout: cfg.timeout,
            tools: cfg.tools.clone(),
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

/// What a server said about itself in the handshake.
#[derive(Debug, Clone, Default)]
pub struct InitInfo {
    pub protocol_version: String,
    /// `None` when the server sent no `capabilities` at all.
    pub capabilities: Option<Map<String, Value>>,
    pub server_info: Value,
    pub instructions: Option<String>,
    /// Speaks 2026-07-28: every request carries the `_meta` envelope, no session.
    pub stateless: bool,
}

impl InitInfo {
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.as_ref().is_some_and(|c| c.contains_key(capability))
    }
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
    /// [`downstream::pipe`]): shown as `degraded`, and not ready for `/readyz`.
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
    pub restarts: std::sync::atomic::AtomicU64,
    /// With `isolation = "session"`: each client session's slot for its own process, by
    /// session id. The map's lock is held only briefly; a process starts under its
    /// session's slot lock, so a slow start holds up no other session.
    sessions: std::sync::Mutex<std::collections::HashMap<String, Arc<Slot>>>,
    /// Session processes running or starting: one [`Seat`] each, at most `max_sessions`.
    seats: Arc<AtomicUsize>,
    next_instance: AtomicU64,
    /// A 2026-07-28 server: the resource URIs its `subscriptions/listen` asks for (the
    /// clients' refcounted `resources/subscribe`s); kept across restarts.
    listen_uris: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Wakes the listen loop to open a new stream with the current URIs.
    relisten: tokio::sync::Notify,
    /// The child exited while the `server/discover` probe was pending: later starts go
    /// straight to `initialize`.
    skip_probe: std::sync::atomic::AtomicBool,
}

/// A session's place for its own process of an isolated server.
type Slot = tokio::sync::Mutex<SlotState>;

#[derive(Default)]
enum SlotState {
    #[default]
    Empty,
    Running(Instance),
    /// The session ended: no process is started for it any more.
    Ended,
}

/// One client session's own process of an isolated server.
struct Instance {
    id: u64,
    conn: Connection,
    last_used: Instant,
    _seat: Seat,
}

/// One of `max_sessions`, given back when dropped.
struct Seat(Arc<AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Which list a `list_changed` notification refers to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
}

impl ListKind {
    pub fn from_notification(method: &str) -> Option<ListKind> {
        match method {
            "notifications/tools/list_changed" => Some(ListKind::Tools),
            "notifications/prompts/list_changed" => Some(ListKind::Prompts),
            "notifications/resources/list_changed" => Some(ListKind::Resources),
            _ => None,
        }
    }

    pub fn notification(self) -> &'static str {
        match self {
            ListKind::Tools => "notifications/tools/list_changed",
            ListKind::Prompts => "notifications/prompts/list_changed",
            ListKind::Resources => "notifications/resources/list_changed",
        }
    }
}

/// What a supervisor tells the rest of the gateway.
#[derive(Debug)]
pub enum Event {
    /// A server's lists changed (or it became ready); the catalog must be rebuilt.
    /// `announced`: the kind the server itself said changed (a list_changed of its own),
    /// passed on to clients even when the merged list looks the same.
    ListsChanged {
        server: Arc<str>,
        announced: Option<ListKind>,
    },
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
        Server {
            name: Arc::from(cfg.name.as_str()),
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
            stop: CancellationToken::new(),
            restarts: std::sync::atomic::AtomicU64::new(0),
            sessions: std::sync::Mutex::new(std::collections::HashMap::new()),
            seats: Arc::new(AtomicUsize::new(0)),
            next_instance: AtomicU64::new(0),
            listen_uris: Default::default(),
            relisten: tokio::sync::Notify::new(),
            skip_probe: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The connection that serves `session`: the shared one, or with
    /// `isolation = "session"` the session's own process, started on first use (the
    /// shared process then only provides the catalog).
    pub async fn connection_for(&self, session: &str) -> Result<Connection, DsError> {
        if self.cfg.isolation == config::Isolation::Shared {
            return self.connection();
        }
        // Only a server whose catalog process is up is offered to sessions.
        self.connection()?;
        let unavailable = |reason: String| DsError::Unavailable {
            server: self.name.clone(),
            reason,
        };
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session.to_owned())
            .or_default()
            .clone();
        let mut state = slot.lock().await;
        if self.stop.is_cancelled() {
            return Err(unavailable("stopped".into()));
        }
        match &mut *state {
            SlotState::Ended => return Err(unavailable("this session has ended".into())),
            // A process that exited (crashed) is replaced: its connection closes at once.
            SlotState::Running(i) if !i.conn.is_closed() => {
                i.last_used = Instant::now();
                return Ok(i.conn.clone());
            }
            _ => {}
        }
        // A dead process gives its seat back here.
        *state = SlotState::Empty;
        let max = self.cfg.max_sessions;
        if self
            .seats
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .is_err()
        {
            return Err(unavailable(format!(
                "it already runs {max} session processes, its max_sessions; try again when a session ends"
            )));
        }
        // Given back if the start fails or the call is cancelled meanwhile.
        let seat = Seat(self.seats.clone());
        let (conn, _info, mut incoming) = self
            .connect()
            .await
            .map_err(|reason| unavailable(format!("cannot start a process for this session: {reason}")))?;
        info!(server = %self.name, session, "started a process for a session");
        let id = self.next_instance.fetch_add(1, Ordering::Relaxed);
        // Its own notifications (list_changed...) do not change the shared catalog. When it
        // exits, its slot is emptied (and its seat given back) without waiting for a call.
        let watched = slot.clone();
        tokio::spawn(async move {
            while let Some(m) = incoming.recv().await {
                if matches!(m, Incoming::Closed { .. }) {
                    let mut s = watched.lock().await;
                    if matches!(&*s, SlotState::Running(i) if i.id == id) {
                        *s = SlotState::Empty;
                    }
                    return;
                }
            }
        });
        *state = SlotState::Running(Instance {
            id,
            conn: conn.clone(),
            last_used: Instant::now(),
            _seat: seat,
        });
        Ok(conn)
    }

    /// The connection already serving `session`, without starting a process for it.
    pub async fn existing_connection_for(&self, session: &str) -> Option<Connection> {
        if self.cfg.isolation == config::Isolation::Shared {
            return self.connection().ok();
        }
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            .cloned()?;
        let state = slot.lock().await;
        match &*state {
            SlotState::Running(i) if !i.conn.is_closed() => Some(i.conn.clone()),
            _ => None,
        }
    }

    /// Stops the process of `session`, if it has one; none is started for it afterwards.
    pub async fn end_session(&self, session: &str) {
        let slot = self.sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(session);
        let Some(slot) = slot else { return };
        let old = std::mem::replace(&mut *slot.lock().await, SlotState::Ended);
        if let SlotState::Running(i) = old {
            info!(server = %self.name, session, "stopping a session's process");
            i.conn.shutdown().await;
        }
    }

    /// Stops session processes unused for longer than `idle_timeout`. A process with a
    /// call in flight (someone holds a handle besides its slot) is in use, not idle.
    pub async fn reap_idle(&self) {
        let idle = self.cfg.idle_timeout;
        let slots: Vec<Arc<Slot>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for slot in slots {
            // Locked: a call of that session is looking it up or starting it.
            let Ok(mut state) = slot.try_lock() else { continue };
            let stale = match &mut *state {
                SlotState::Running(i) if i.conn.handles() > 1 => {
                    i.last_used = Instant::now();
                    false
                }
                SlotState::Running(i) => i.last_used.elapsed() >= idle || i.conn.is_closed(),
                _ => false,
            };
            if !stale {
                continue;
            }
            let old = std::mem::take(&mut *state);
            drop(state);
            if let SlotState::Running(i) = old {
                info!(server = %self.name, "stopping an idle session's process");
                i.conn.shutdown().await;
            }
        }
    }

    /// How many session processes run (or are starting).
    pub fn session_processes(&self) -> usize {
        self.seats.load(Ordering::SeqCst)
    }

    /// The settings a reload may change without restarting the server.
    /// When the owner of a child's pipes counts it degraded, and stalled.
    fn pipe_watch(&self) -> downstream::pipe::Watch {
        let timeout = self.settings().timeout;
        downstream::pipe::Watch {
            degraded_after: timeout.min(self.cfg.stall_timeout),
            stall_after: self.cfg.stall_timeout,
        }
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.settings.read().unwrap_or_else(|e| e.into_inner()).clone()
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
    }

    /// Applies a reload's prefix, timeout and tool filter.
    pub fn retune(&self, cfg: &config::Server) {
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Settings::of(cfg));
    }

    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
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
                    Status::Ready => "no connection".into(),
                },
            }),
        }
    }

    /// Starts the server and runs the handshake and the first listing. Returns the
    /// receiver of what the server says on its own, for [`Server::watch`].
    pub async fn start(&self) -> Option<mpsc::Receiver<Incoming>> {
        let (conn, info, rx) = match self.connect().await {
            Ok(c) => c,
            Err(why) => {
                self.fail(why);
                return None;
            }
        };
        info!(server = %self.name, version = %info.protocol_version, transport = conn_kind(&self.cfg.transport), "initialized");
        let lists = self.list_all(&conn, &info).await;
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

    /// Opens the transport and runs the handshake. For `transport = "auto"` a server
    /// that refuses the Streamable HTTP `initialize` with 400, 404 or 405 is tried again
    /// as a legacy HTTP+SSE server, as the spec's backwards-compatibility section says.
    async fn connect(&self) -> Result<(Connection, InitInfo, mpsc::Receiver<Incoming>), String> {
        let (tx, rx) = mpsc::channel(64);
        let spec = match &self.cfg.transport {
            config::Transport::Stdio(spec) => {
                let probed = !self.skip_probe.load(Ordering::Relaxed);
                let conn = downstream::stdio::spawn(self.name.clone(), spec, tx, self.pipe_watch())
                    .map_err(|e| format!("failed to start: {e}"))?;
                let out = self.handshake_or_close(conn).await.map(|(c, i)| (c, i, rx));
                if out.is_ok() || !probed || !self.skip_probe.load(Ordering::Relaxed) {
                    return out;
                }
                // It exited on the probe: at once again, with initialize alone.
                let (tx, rx) = mpsc::channel(64);
                let conn = downstream::stdio::spawn(self.name.clone(), spec, tx, self.pipe_watch())
                    .map_err(|e| format!("failed to start: {e}"))?;
                return self.handshake_or_close(conn).await.map(|(c, i)| (c, i, rx));
            }
            config::Transport::Http(spec) => spec,
        };
        if spec.mode != config::HttpMode::Sse {
            let conn = downstream::http::spawn(self.name.clone(), spec, tx)?;
            match self.handshake(&conn).await {
                Ok(info) => return Ok((conn, info, rx)),
                Err(Handshake::Call(DsError::Status {
                    status: 400 | 404 | 405,
                    ..
                })) if spec.mode == config::HttpMode::Auto => {
                    conn.shutdown().await;
                    info!(server = %self.name, "Streamable HTTP refused; trying the legacy HTTP+SSE transport");
                }
                Err(e) => {
                    conn.shutdown().await;
                    return Err(format!("initialize failed: {e}"));
                }
            }
        }
        let (tx, rx) = mpsc::channel(64);
        let conn = downstream::sse::spawn(self.name.clone(), spec, tx)?;
        // HTTP+SSE is a handshake-era transport only: no probe.
        match self.initialize(&conn).await {
            Ok(info) => Ok((conn, info, rx)),
            Err(e) => {
                conn.shutdown().await;
                Err(format!("initialize failed: {e}"))
            }
        }
    }

    async fn handshake_or_close(&self, conn: Connection) -> Result<(Connection, InitInfo), String> {
        match self.handshake(&conn).await {
            Ok(info) => Ok((conn, info)),
            Err(e) => {
                conn.shutdown().await;
                Err(with_stderr(format!("initialize failed: {e}"), &conn).await)
            }
        }
    }

    /// Runs the server for the gateway's lifetime: start, follow, and start again
    /// after it goes away as its `restart` policy says, with capped exponential backoff.
    /// A child that keeps crashing ([`CRASH_LOOP`] failures within [`CRASH_WINDOW`],
    /// none of them up for [`STABLE`]) is marked failed and retried every
    /// [`SLOW_RETRY`]. `started` fires after the first attempt, whatever its outcome.
    pub async fn run(self: Arc<Self>, events: mpsc::Sender<Event>, started: oneshot::Sender<()>) {
        let mut started = Some(started);
        let mut backoff = RETRY_MIN;
        if self.cfg.isolation == config::Isolation::Session {
            let me = self.clone();
            tokio::spawn(async move {
                let every = (me.cfg.idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(every) => me.reap_idle().await,
                        _ = me.stop.cancelled() => return,
                    }
                }
            });
        }
        let mut failures: std::collections::VecDeque<Instant> = std::collections::VecDeque::new();
        loop {
            let began = Instant::now();
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
                    self.restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if incoming.is_some() {
                        let _ = events
                            .send(Event::Restarted {
                                server: self.name.clone(),
                            })
                            .await;
                        let _ = events
                            .send(Event::ListsChanged {
                                server: self.name.clone(),
                                announced: None,
                            })
                            .await;
                    }
                }
            }
            let clean = match incoming {
                Some(incoming) => {
                    // A 2026-07-28 server tells of changes only on a listen stream.
                    let listener = self.stateless().then(|| tokio::spawn(self.clone().listen()));
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
                let why = format!(
                    "crash loop: {} failures within {}s; retrying every {}s (last: {})",
                    failures.len(),
                    CRASH_WINDOW.as_secs(),
                    SLOW_RETRY.as_secs(),
                    self.state().last_error.clone().unwrap_or_default()
                );
                warn!(server = %self.name, "{why}");
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
                _ = self.stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Whether the server speaks 2026-07-28.
    pub fn stateless(&self) -> bool {
        self.state().info.as_ref().is_some_and(|i| i.stateless)
    }

    /// Adds (or removes) a resource URI to the server's listen stream, which is opened
    /// again with the new set.
    pub fn listen_uri(&self, uri: &str, add: bool) {
        let changed = {
            let mut uris = self.listen_uris.lock().unwrap_or_else(|e| e.into_inner());
            if add {
                uris.insert(uri.to_owned())
            } else {
                uris.remove(uri)
            }
        };
        if changed {
            self.relisten.notify_one();
        }
    }

    /// Keeps one `subscriptions/listen` open to a 2026-07-28 server for as long as its
    /// connection lives: every list_changed it offers, and `resources/updated` for the
    /// URIs clients subscribed to. Its notifications arrive like any server notification
    /// (the supervisor re-lists; the router fans `resources/updated` out). A stream that
    /// ends is opened again after a pause; a change of URIs replaces it.
    async fn listen(self: Arc<Self>) {
        let mut pause = RETRY_MIN;
        loop {
            let (conn, caps) = {
                let s = self.state();
                match (&s.conn, &s.info) {
                    (Some(c), Some(i)) => (c.clone(), i.capabilities.clone().unwrap_or_default()),
                    _ => return,
                }
            };
            let mut filter = Map::new();
            for (cap, key) in [
                ("tools", "toolsListChanged"),
                ("prompts", "promptsListChanged"),
                ("resources", "resourcesListChanged"),
            ] {
                if caps
                    .get(cap)
                    .and_then(|c| c.get("listChanged"))
                    .and_then(Value::as_bool)
                    == Some(true)
                {
                    filter.insert(key.into(), Value::Bool(true));
                }
            }
            let uris: Vec<Value> = self
                .listen_uris
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|u| Value::String(u.clone()))
                .collect();
            if !uris.is_empty() {
                filter.insert("resourceSubscriptions".into(), Value::Array(uris));
            }
            let changed = self.relisten.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if filter.is_empty() {
                changed.await;
                continue;
            }
            let mut p = Map::new();
            p.insert("notifications".into(), Value::Object(filter));
            let params = Params::Object {
                params: stateless::own_params(p),
                progress: None,
            };
            let began = Instant::now();
            tokio::select! {
                out = conn.call("subscriptions/listen", params, None, LISTEN_FOREVER) => {
                    if conn.is_closed() {
                        return;
                    }
                    match out {
                        Ok(Outcome::Error(e)) => {
                            warn!(server = %self.name, error = %message::error_summary(&e).1, "subscriptions/listen refused")
                        }
                        Err(e) => debug!(server = %self.name, error = %e, "subscriptions/listen ended"),
                        Ok(Outcome::Result(_)) => debug!(server = %self.name, "subscriptions/listen closed by the server"),
                    }
                    if began.elapsed() >= STABLE {
                        pause = RETRY_MIN;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = &mut changed => {}
                    }
                    pause = (pause * 2).min(RETRY_MAX);
                }
                _ = &mut changed => debug!(server = %self.name, "resource subscriptions changed; listening again"),
            }
        }
    }

    fn fail(&self, why: String) {
        // The stderr lines were logged as they came; the log line need not repeat them.
        let logged = why.split_once(STDERR_TAIL).map_or(why.as_str(), |(w, _)| w);
        warn!(server = %self.name, error = %logged, "server unavailable");
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
    pub async fn watch(&self, mut incoming: mpsc::Receiver<Incoming>, events: mpsc::Sender<Event>) -> bool {
        let mut dirty: Vec<ListKind> = Vec::new();
        let mut relisting: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ListKind> + Send + '_>>> = None;
        loop {
            if relisting.is_none() && !dirty.is_empty() {
                let kind = dirty.remove(0);
                relisting = Some(Box::pin(async move {
                    self.relist(kind).await;
                    kind
                }));
            }
            let msg = tokio::select! {
                kind = async { relisting.as_mut().expect("a re-list is running").await }, if relisting.is_some() => {
                    relisting = None;
                    let _ = events
                        .send(Event::ListsChanged {
                            server: self.name.clone(),
                            announced: Some(kind),
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
                        let old = self.state.write().unwrap_or_else(|e| e.into_inner()).conn.take();
                        let why = match (&self.cfg.transport, &old) {
                            (config::Transport::Stdio(_), Some(c)) if !clean => {
                                with_stderr(format!("exited ({reason})"), c).await
                            }
                            (config::Transport::Stdio(_), _) => format!("exited ({reason})"),
                            (config::Transport::Http(_), _) => format!("connection lost ({reason})"),
                        };
                        self.fail(why);
                        if let Some(old) = old {
                            tokio::spawn(async move { old.shutdown().await });
                        }
                        // A remote server comes back by reconnecting: until then its tools,
                        // prompts and resources leave the catalog (clients get list_changed
                        // now and again when they return).
                        if matches!(self.cfg.transport, config::Transport::Http(_)) {
                            self.update(|s| s.lists = Lists::default());
                            let _ = events
                                .send(Event::ListsChanged {
                                    server: self.name.clone(),
                                    announced: None,
                                })
                                .await;
                        }
                    }
                    return clean || stopped;
                }
            }
        }
    }

    async fn relist(&self, kind: ListKind) {
        let (conn, info) = {
            let s = self.state();
            match (&s.conn, &s.info) {
                (Some(c), Some(i)) => (c.clone(), i.clone()),
                _ => return,
            }
        };
        let timeout = self.settings().timeout;
        match kind {
            ListKind::Tools => {
                let (tools, hint) = self.list(&conn, &info, "tools/list", "tools", timeout).await;
                let tools = self.usable_tools(&info, tools);
                self.update(|s| {
                    s.lists.tools = tools;
                    s.lists.hints[0] = hint;
                });
            }
            ListKind::Prompts => {
                let (prompts, hint) = self.list(&conn, &info, "prompts/list", "prompts", timeout).await;
                self.update(|s| {
                    s.lists.prompts = prompts;
                    s.lists.hints[1] = hint;
                });
            }
            ListKind::Resources => {
                let (resources, rh) = self.list(&conn, &info, "resources/list", "resources", timeout).await;
                let (templates, th) = self
                    .list(&conn, &info, "resources/templates/list", "resourceTemplates", timeout)
                    .await;
                self.update(|s| {
                    s.lists.resources = resources;
                    s.lists.templates = templates;
                    s.lists.hints[2] = rh;
                    s.lists.hints[3] = th;
                });
            }
        }
        info!(server = %self.name, ?kind, "re-listed after list_changed");
    }

    /// Closes the connection (stdin, SIGTERM, SIGKILL) and marks the server stopped.
    pub async fn stop(&self) {
        self.stop.cancel();
        let slots: Vec<Arc<Slot>> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        let mut instances = Vec::new();
        for slot in slots {
            if let SlotState::Running(i) = std::mem::replace(&mut *slot.lock().await, SlotState::Ended) {
                instances.push(i);
            }
        }
        futures::future::join_all(instances.iter().map(|i| i.conn.shutdown())).await;
        let conn = {
            let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
            if matches!(s.status, Status::Ready | Status::Starting) {
                s.status = Status::Stopped;
            }
            s.conn.take()
        };
        if let Some(c) = conn {
            c.shutdown().await;
        }
    }

    /// Learns the server's era and what it offers. `protocol = "auto"` probes with
    /// `server/discover` at 2026-07-28 and falls back to `initialize` on anything but a
    /// discover result naming that version (the spec's rule: no particular error code).
    /// Over stdio the `initialize` is sent right behind the probe, so a handshake-era
    /// server costs no extra round trip; a dual-era server that took the probe refuses it.
    async fn handshake(&self, conn: &Connection) -> Result<InitInfo, Handshake> {
        match self.cfg.protocol {
            config::Era::Handshake => self.initialize(conn).await,
            config::Era::Modern => match self.discover(conn, self.settings().timeout).await? {
                Some(info) => Ok(info),
                None => Err(Handshake::Refused(format!(
                    "server/discover did not name {} (protocol = \"2026-07-28\" in gateway.toml)",
                    stateless::VERSION
                ))),
            },
            config::Era::Auto if self.skip_probe.load(Ordering::Relaxed) => self.initialize(conn).await,
            config::Era::Auto if matches!(self.cfg.transport, config::Transport::Stdio(_)) => {
                // A child may take long to start; a handshake-era one that ignores the probe
                // answers the initialize meanwhile, so the probe gets the whole timeout.
                let discover = self.discover(conn, self.settings().timeout);
                tokio::pin!(discover);
                // Polled first, so the probe is queued before the initialize.
                let first = futures::poll!(&mut discover);
                let initialize = self.initialize_call(conn);
                tokio::pin!(initialize);
                let mut init_out = None;
                let probed = match first {
                    std::task::Poll::Ready(p) => p,
                    std::task::Poll::Pending => loop {
                        tokio::select! {
                            biased;
                            p = &mut discover => break p,
                            i = &mut initialize, if init_out.is_none() => match i? {
                                // Accepted the handshake before answering the probe: a
                                // handshake-era server.
                                ok @ Outcome::Result(_) => return self.initialized(conn, ok).await,
                                // Refused it (a dual-era server the probe made modern): wait.
                                refused => init_out = Some(refused),
                            }
                        }
                    },
                };
                match probed {
                    Ok(Some(info)) => Ok(info),
                    Ok(None) | Err(Handshake::Refused(_)) | Err(Handshake::Call(DsError::Timeout { .. })) => {
                        let out = match init_out {
                            Some(o) => o,
                            None => initialize.await?,
                        };
                        self.initialized(conn, out).await
                    }
                    Err(Handshake::Call(e @ DsError::Exited { .. })) => {
                        // Some handshake-era servers exit on any request before initialize.
                        self.skip_probe.store(true, Ordering::Relaxed);
                        warn!(server = %self.name, "exited on the server/discover probe; starting it again without one");
                        Err(Handshake::Call(e))
                    }
                    Err(e) => Err(e),
                }
            }
            config::Era::Auto => match self.discover(conn, self.settings().timeout.min(PROBE_TIMEOUT)).await {
                Ok(Some(info)) => Ok(info),
                Ok(None) | Err(Handshake::Refused(_)) | Err(Handshake::Call(DsError::Timeout { .. })) => {
                    self.initialize(conn).await
                }
                // A modern server refuses a malformed probe with 400; a legacy one may
                // refuse the sessionless POST with 400/404/405 too: try the handshake.
                Err(Handshake::Call(DsError::Status {
                    status: 400 | 404 | 405,
                    ..
                })) => self.initialize(conn).await,
                Err(e) => Err(e),
            },
        }
    }

    /// `server/discover` at 2026-07-28. `Ok(None)`: the answer was not a discover result
    /// naming that version (a handshake-era server).
    async fn discover(&self, conn: &Connection, timeout: Duration) -> Result<Option<InitInfo>, Handshake> {
        let params = stateless::own_params(Map::new());
        let out = conn
            .call(
                "server/discover",
                Params::Object { params, progress: None },
                None,
                timeout,
            )
            .await
            .map_err(Handshake::Call)?;
        let Outcome::Result(r) = out else {
            return Ok(None);
        };
        Ok(stateless::discovered(r.get()).map(|d| InitInfo {
            protocol_version: stateless::VERSION.to_owned(),
            capabilities: d.capabilities,
            server_info: d.server_info,
            instructions: d.instructions,
            stateless: true,
        }))
    }

    async fn initialize(&self, conn: &Connection) -> Result<InitInfo, Handshake> {
        let out = self.initialize_call(conn).await?;
        self.initialized(conn, out).await
    }

    async fn initialize_call(&self, conn: &Connection) -> Result<Outcome, Handshake> {
        let params = json!({
            "protocolVersion": DOWNSTREAM_VERSION,
            // Questions a server asks go to the client of the call that caused them; a
            // client that lacks the capability gets the question refused with a reason.
            "capabilities": { "sampling": {}, "elicitation": {}, "roots": { "listChanged": true } },
            "clientInfo": stateless::client_info(),
        });
        conn.call(
            "initialize",
            Params::Raw(Some(message::to_raw(&params))),
            None,
            self.settings().timeout,
        )
        .await
        .map_err(Handshake::Call)
    }

    async fn initialized(&self, conn: &Connection, out: Outcome) -> Result<InitInfo, Handshake> {
        let result = match out {
            Outcome::Result(r) => r,
            Outcome::Error(e) => {
                return Err(Handshake::Refused(format!(
                    "server answered {}",
                    message::error_summary(&e).1
                )))
            }
        };
        let mut r: Map<String, Value> = serde_json::from_str(result.get())
            .map_err(|e| Handshake::Refused(format!("initialize result is not an object: {e}")))?;
        let info = InitInfo {
            protocol_version: r
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("2024-11-05")
                .to_owned(),
            capabilities: match r.remove("capabilities") {
                Some(Value::Object(c)) => Some(c),
                _ => None,
            },
            server_info: r.remove("serverInfo").unwrap_or(Value::Null),
            instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
            stateless: false,
        };
        conn.notify("notifications/initialized", None).await;
        Ok(info)
    }

    async fn list_all(&self, conn: &Connection, info: &InitInfo) -> Lists {
        let t = self.settings().timeout;
        let (tools, prompts, resources, templates) = tokio::join!(
            self.list(conn, info, "tools/list", "tools", t),
            self.list(conn, info, "prompts/list", "prompts", t),
            self.list(conn, info, "resources/list", "resources", t),
            self.list(conn, info, "resources/templates/list", "resourceTemplates", t),
        );
        let (tools, tools_hint) = tools;
        Lists {
            tools: self.usable_tools(info, tools),
            prompts: prompts.0,
            resources: resources.0,
            templates: templates.0,
            hints: [tools_hint, prompts.1, resources.1, templates.1],
        }
    }

    /// 2026-07-28: a tool whose x-mcp-header annotations break the rules is not offered.
    fn usable_tools(&self, info: &InitInfo, mut tools: Vec<Map<String, Value>>) -> Vec<Map<String, Value>> {
        if info.stateless {
            tools.retain(|t| match stateless::check_x_mcp_headers(t.get("inputSchema")) {
                Ok(()) => true,
                Err(why) => {
                    let tool = t.get("name").and_then(Value::as_str).unwrap_or("");
                    warn!(server = %self.name, tool, reason = %why, "dropping a tool with an invalid x-mcp-header");
                    false
                }
            });
        }
        tools
    }

    /// Lists one kind through all its pages. A server that declared no capabilities at
    /// all is asked anyway; any error counts as an empty list.
    async fn list(
        &self,
        conn: &Connection,
        info: &InitInfo,
        method: &str,
        key: &str,
        timeout: Duration,
    ) -> (Vec<Map<String, Value>>, Option<Hint>) {
        let capability = method.split('/').next().unwrap_or(method);
        if info.capabilities.is_some() && !info.has(capability) {
            // Nothing to change, nothing to cache against.
            return (
                Vec::new(),
                info.stateless.then_some(Hint {
                    ttl_ms: u64::MAX,
                    private: false,
                }),
            );
        }
        let mut hint: Option<Hint> = None;
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = if info.stateless {
                let mut p = Map::new();
                if let Some(c) = &cursor {
                    p.insert("cursor".into(), Value::String(c.clone()));
                }
                Params::Object {
                    params: stateless::own_params(p),
                    progress: None,
                }
            } else {
                Params::Raw(cursor.as_ref().map(|c| message::to_raw(&json!({ "cursor": c }))))
            };
            let page = match conn.call(method, params, None, timeout).await {
                Ok(Outcome::Result(r)) => r,
                Ok(Outcome::Error(e)) => {
                    if info.capabilities.is_some() {
                        warn!(server = %self.name, method, error = %message::error_summary(&e).1, "listing failed");
                    }
                    break;
                }
                Err(e) => {
                    warn!(server = %self.name, method, error = %e, "listing failed");
                    break;
                }
            };
            let mut page: Map<String, Value> = match serde_json::from_str(page.get()) {
                Ok(p) => p,
                Err(e) => {
                    warn!(server = %self.name, method, error = %e, "listing result is not an object");
                    break;
                }
            };
            if info.stateless {
                let h = Hint::of(&page);
                hint = Some(hint.map_or(h, |o| o.and(h)));
            }
            if let Some(Value::Array(list)) = page.remove(key) {
                items.extend(list.into_iter().filter_map(|v| match v {
                    Value::Object(m) => Some(m),
                    _ => None,
                }));
            }
            match page.remove("nextCursor") {
                Some(Value::String(c)) if !c.is_empty() && cursor.as_deref() != Some(&c) => cursor = Some(c),
                _ => return (items, hint),
            }
        }
        (items, hint)
    }
}
