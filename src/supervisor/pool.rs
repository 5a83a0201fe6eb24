//! The per-caller processes of a server with `isolation = "session"` (one per client
//! session) or `isolation = "client"` (one per client identity, shared by its sessions;
//! also a remote server whose `headers` use `${client:…}`: a connection per identity).
//! Each is started on its caller's first call, stopped when the session ends (session
//! isolation) or after `idle_timeout` unused; at most `max_sessions` run at once. A slot
//! is keyed by the session id or the identity's name, never both in one pool.

use crate::downstream::{Connection, DsError, Incoming};
use crate::sync;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// How long the calls in flight on a process replaced for changed secrets may take to
/// finish before it is stopped.
const REPLACED_DRAIN: Duration = Duration::from_secs(60);

/// A started process: its connection and what it says on its own.
pub(super) type Started = (Connection, mpsc::Receiver<Incoming>);

/// One server's session processes.
pub(super) struct Pool {
    server: Arc<str>,
    max: usize,
    /// Keyed by session id (`isolation = "session"`), which logs show only as its tag.
    by_session: bool,
    /// Each client session's slot for its own process, by session id. The map's lock is
    /// held only briefly; a process starts under its session's slot lock, so a slow
    /// start holds up no other session.
    sessions: Mutex<HashMap<String, Arc<Slot>>>,
    /// Session processes running or starting: one [`Seat`] each, at most `max`.
    seats: Arc<AtomicUsize>,
    next_instance: AtomicU64,
    /// The server's stop: no process is started once it is cancelled.
    stop: CancellationToken,
}

/// A session's place for its own process.
type Slot = tokio::sync::Mutex<SlotState>;

#[derive(Default)]
enum SlotState {
    #[default]
    Empty,
    Running(Instance),
    /// The session ended: no process is started for it any more.
    Ended,
}

/// One client session's own process.
struct Instance {
    id: u64,
    /// The SHA-256 of the secrets it was started with: a call with other
    /// values replaces it.
    fingerprint: [u8; 32],
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

impl Pool {
    pub(super) fn new(server: Arc<str>, max_sessions: usize, by_session: bool, stop: CancellationToken) -> Pool {
        Pool {
            server,
            max: max_sessions,
            by_session,
            sessions: Mutex::default(),
            seats: Arc::default(),
            next_instance: AtomicU64::new(0),
            stop,
        }
    }

    /// How logs name the caller of key `key`: an identity by its name (and an OAuth one's
    /// issuer digest, never the NUL of its principal), a session by its tag
    /// ([`crate::client::session_tag`]), never by its id.
    fn shown(&self, key: &str) -> String {
        match key.strip_prefix('\0') {
            Some(rest) => match rest.split_once(':') {
                Some((kind, principal)) => format!("{kind}:{}", crate::auth::Shown(principal)),
                None => rest.to_owned(),
            },
            None if self.by_session => crate::client::session_tag(key),
            None => crate::auth::Shown(key).to_string(),
        }
    }

    fn unavailable(&self, reason: String) -> DsError {
        DsError::Unavailable {
            server: self.server.clone(),
            reason,
        }
    }

    fn slot(&self, session: &str) -> Option<Arc<Slot>> {
        sync::lock(&self.sessions).get(session).cloned()
    }

    /// The connection of `session`'s own process; `start` starts one when it has none
    /// (or its process exited).
    pub(super) async fn connection_for<F>(
        &self,
        session: &str,
        fingerprint: [u8; 32],
        start: impl FnOnce() -> F,
    ) -> Result<Connection, DsError>
    where
        F: Future<Output = Result<Started, String>>,
    {
        let slot = sync::lock(&self.sessions)
            .entry(session.to_owned())
            .or_default()
            .clone();
        let mut state = slot.lock().await;
        if self.stop.is_cancelled() {
            return Err(self.unavailable("stopped".into()));
        }
        match &mut *state {
            SlotState::Ended => return Err(self.unavailable("this session has ended".into())),
            // A process that exited (crashed) is replaced: its connection closes at once.
            SlotState::Running(i) if !i.conn.is_closed() && i.fingerprint == fingerprint => {
                i.last_used = Instant::now();
                return Ok(i.conn.clone());
            }
            SlotState::Running(i) if !i.conn.is_closed() => {
                // Started with other secrets (a reload changed them): no new call goes to
                // it; the calls in flight on it get up to REPLACED_DRAIN to finish.
                info!(server = %self.server, "the caller's secrets changed; replacing its process");
                let old = i.conn.clone();
                crate::background::spawn(async move {
                    let deadline = Instant::now() + REPLACED_DRAIN;
                    // Its calls in flight hold handles besides this one (and the slot's,
                    // which is dropped right below).
                    while old.handles() > 1 && Instant::now() < deadline && !old.is_closed() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    old.shutdown().await;
                });
            }
            _ => {}
        }
        // A dead process gives its seat back here.
        *state = SlotState::Empty;
        let max = self.max;
        if self
            .seats
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .is_err()
        {
            return Err(self.unavailable(format!(
                "it already runs {max} processes of its own for callers (sessions or clients), its max_sessions; try again when one stops"
            )));
        }
        // Given back if the start fails or the call is cancelled meanwhile.
        let seat = Seat(self.seats.clone());
        let (conn, mut incoming) = start()
            .await
            .map_err(|reason| self.unavailable(format!("cannot start a process for this caller: {reason}")))?;
        info!(server = %self.server, caller = %self.shown(session), "started a process for a caller");
        let id = self.next_instance.fetch_add(1, Ordering::Relaxed);
        // Its own notifications (list_changed...) do not change the shared catalog. When it
        // exits, its slot is emptied (and its seat given back) without waiting for a call.
        let watched = slot.clone();
        crate::background::spawn(async move {
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
            fingerprint,
            conn: conn.clone(),
            last_used: Instant::now(),
            _seat: seat,
        });
        Ok(conn)
    }

    /// The connection of `session`'s running process, without starting one.
    pub(super) async fn existing(&self, session: &str) -> Option<Connection> {
        let slot = self.slot(session)?;
        let state = slot.lock().await;
        match &*state {
            SlotState::Running(i) if !i.conn.is_closed() => Some(i.conn.clone()),
            _ => None,
        }
    }

    /// Stops the process of `session`, if it has one; none is started for it afterwards.
    pub(super) async fn end(&self, session: &str) {
        let Some(slot) = sync::lock(&self.sessions).remove(session) else {
            return;
        };
        if let Some(i) = end(&slot).await {
            info!(server = %self.server, caller = %self.shown(session), "stopping a session's process");
            i.conn.shutdown().await;
        }
    }

    /// Stops processes unused for `idle` or longer. A process with a call in flight
    /// (someone holds a handle besides its slot) is in use, not idle.
    async fn reap_idle(&self, idle: Duration) {
        let slots: Vec<Arc<Slot>> = sync::lock(&self.sessions).values().cloned().collect();
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
                info!(server = %self.server, "stopping an idle session's process");
                i.conn.shutdown().await;
            }
        }
    }

    /// Looks for idle processes every `idle / 2` (between 100 ms and 30 s) until the
    /// server stops.
    pub(super) async fn reap_until_stopped(&self, idle: Duration) {
        let every = (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => self.reap_idle(idle).await,
                _ = self.stop.cancelled() => return,
            }
        }
    }

    /// How many session processes run (or are starting).
    pub(super) fn running(&self) -> usize {
        self.seats.load(Ordering::SeqCst)
    }

    /// Stops every session's process; none is started afterwards.
    pub(super) async fn stop(&self) {
        let slots: Vec<Arc<Slot>> = sync::lock(&self.sessions).drain().map(|(_, s)| s).collect();
        let mut instances = Vec::new();
        for slot in slots {
            instances.extend(end(&slot).await);
        }
        futures::future::join_all(instances.iter().map(|i| i.conn.shutdown())).await;
    }
}

/// Marks a slot ended; its process, if it had one, for the caller to stop.
async fn end(slot: &Slot) -> Option<Instance> {
    match std::mem::replace(&mut *slot.lock().await, SlotState::Ended) {
        SlotState::Running(i) => Some(i),
        _ => None,
    }
}
