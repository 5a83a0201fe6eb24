//! The task that owns a message stream to one server (a child's pipes, or the legacy
//! HTTP+SSE transport): it mints ids, keeps the pending calls, restores progress
//! tokens, answers the server's pings, reports what relates to no call, and fails every
//! pending call at once when the stream ends.

use super::{
    encode_request, progress_token, restore_progress, wire_id, Command, Connection, DsError, Incoming, Pending,
};
use crate::message::{self, Kind};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

/// How long a child gets after its stdin closes, and again after SIGTERM.
const GRACE: Duration = Duration::from_secs(2);

/// How many bytes of messages may wait for the server's input in the owner's outbox.
/// Past it a request is refused at once as busy ([`DsError::Busy`]); one message alone
/// is always admitted, however large.
pub const OUTBOX_BYTES: usize = 16 << 20;
/// How many messages may wait in the outbox, whatever their size.
pub const OUTBOX_MESSAGES: usize = 4096;

/// When a server that owes answers and says nothing counts as stuck: first degraded
/// (shown in `/status`, and pinged), then stalled (ended, as if it had exited).
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// No word from the server this long while it owes answers: degraded, and pinged.
    pub degraded_after: Duration,
    /// This long: killed (and started again by its supervisor).
    pub stall_after: Duration,
}

impl Watch {
    /// No watch (a stream whose server cannot be restarted from here).
    pub const OFF: Watch = Watch {
        degraded_after: Duration::MAX,
        stall_after: Duration::MAX,
    };
}

/// A message stream to a server: lines out, lines in, and word of its end. A child's
/// pipes are one; the legacy HTTP+SSE transport (a GET stream plus POSTs) is another.
pub struct Pipe {
    /// Each message for the server, ending in a newline.
    pub write: mpsc::Sender<Vec<u8>>,
    /// Each message from the server.
    pub lines: mpsc::Receiver<bytes::Bytes>,
    /// Completes with a sentence when the server is gone.
    pub exit: oneshot::Receiver<String>,
    /// The child's process group, to signal on shutdown.
    pub pid: Option<u32>,
    /// Cancelled when shutdown starts, for transports that must be told to stop.
    pub stop: Option<tokio_util::sync::CancellationToken>,
    /// Bytes of messages not yet written: the owner adds a message's length when it
    /// queues it, the writer takes it off once written. Bounds the outbox and the
    /// writer's channel together ([`OUTBOX_BYTES`]).
    pub unwritten: Arc<AtomicUsize>,
    /// Values masked (`***`) in what the server says that the gateway shows: a line it
    /// logs, an error the server answers (its configured env values, for a child).
    pub secrets: Vec<String>,
    /// One client's calls in flight at most (a child's `max_calls_per_client`); more are
    /// refused at once. `usize::MAX`: no bound, and no caller is told apart.
    pub per_client: usize,
}

/// Starts the task that owns `pipe` and returns its handle.
pub fn run_pipe(
    server: Arc<str>,
    pipe: Pipe,
    incoming: mpsc::Sender<Incoming>,
    watch: Watch,
    span: tracing::Span,
) -> Connection {
    let (tx, rx) = mpsc::channel(super::COMMAND_QUEUE);
    let mut conn = Connection::new(server.clone(), tx);
    if pipe.per_client != usize::MAX {
        conn = conn.per_client();
    }
    let actor = Actor {
        server,
        pending: HashMap::new(),
        listens: 0,
        outbox: VecDeque::new(),
        unwritten: pipe.unwritten,
        incoming,
        pid: pipe.pid,
        stop: pipe.stop,
        watch,
        owed_since: None,
        degraded: conn.degraded.clone(),
        questions: Default::default(),
        elicitations: Default::default(),
        next_id: Arc::downgrade(&conn.next_id),
        secrets: pipe.secrets,
        per_client: pipe.per_client,
        calls: HashMap::default(),
    };
    crate::background::spawn(actor.run(rx, pipe.write, pipe.lines, pipe.exit).instrument(span));
    conn
}

/// A message waiting for the server's input; `id` when it is a request.
struct Out {
    id: Option<u64>,
    line: Vec<u8>,
}

struct Actor {
    server: Arc<str>,
    pending: HashMap<u64, Pending>,
    /// Pending `subscriptions/listen` streams: open for good, so no answer is owed.
    listens: usize,
    /// Messages the writer has no room for yet, oldest first.
    outbox: VecDeque<Out>,
    /// See [`Pipe::unwritten`].
    unwritten: Arc<AtomicUsize>,
    incoming: mpsc::Sender<Incoming>,
    pid: Option<u32>,
    stop: Option<tokio_util::sync::CancellationToken>,
    watch: Watch,
    /// Since when the server owes answers and has said nothing (`None`: owes none).
    owed_since: Option<Instant>,
    /// Shared with the handles: shown in `/status`, read by `/readyz`.
    degraded: Arc<AtomicBool>,
    /// The server's own requests being answered ([`super::questions`]).
    questions: super::questions::Questions,
    /// The client asked each URL-mode elicitation ([`super::elicit`]): the server's
    /// `notifications/elicitation/complete` goes there, whatever else is in flight by then.
    elicitations: super::elicit::Elicitations,
    /// The handles' id counter, for the owner's own pings. Weak: the number of strong
    /// references is the number of handles ([`Connection::handles`]), which tells an idle
    /// session's process from a busy one.
    next_id: std::sync::Weak<std::sync::atomic::AtomicU64>,
    /// See [`Pipe::secrets`].
    secrets: Vec<String>,
    /// See [`Pipe::per_client`].
    per_client: usize,
    /// Each client's calls in flight (those in `pending` of a caller other than 0); a
    /// client with none has no entry. Kept by this task alone: the bound costs a call a
    /// hash lookup here, and no lock.
    calls: HashMap<u64, usize, foldhash::fast::FixedState>,
}

/// How the child ended, as a sentence.
type Exit = oneshot::Receiver<String>;

impl Actor {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        write: mpsc::Sender<Vec<u8>>,
        mut lines: mpsc::Receiver<bytes::Bytes>,
        mut exit: Exit,
    ) {
        // Lines for the child's stdin; `None` once stdin is closed.
        let mut write = Some(write);
        let check = (self.watch.degraded_after.min(self.watch.stall_after) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut tick = tokio::time::interval(check);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            self.flush(&mut write);
            // Only when the outbox holds what the writer had no room for (rare: a clone).
            let writer = if self.outbox.is_empty() { None } else { write.clone() };
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(Command::Shutdown { done }) => {
                        // Dropping the writer's sender closes the child's stdin.
                        drop(write.take());
                        self.shutdown(&mut exit).await;
                        self.fail_all("it was stopped by a gateway shutdown or a config reload");
                        let _ = done.send(());
                        return;
                    }
                    Some(Command::Request { id, method, params, sink, reply, caller, .. }) => {
                        self.request(id, method, params, sink, reply, caller, &write)
                    }
                    Some(Command::Notify { method, params }) => self.notify(&method, params.as_deref(), &write),
                    Some(Command::Cancel { id, reason }) => self.cancel(id, reason),
                    None => {
                        drop(write.take());
                        self.shutdown(&mut exit).await;
                        return;
                    }
                },
                permit = async { writer.as_ref()?.reserve().await.ok() }, if writer.is_some() => match permit {
                    Some(permit) => {
                        if let Some(out) = self.outbox.pop_front() {
                            permit.send(out.line);
                        }
                    }
                    None => {
                        // The writer is gone (the child closed its stdin).
                        write = None;
                        self.clear_outbox();
                    }
                },
                line = lines.recv() => match line {
                    Some(line) => self.line(line, &write).await,
                    None => {
                        // Stdout closed: the child is exiting; give it a moment to report.
                        break match tokio::time::timeout(Duration::from_millis(200), &mut exit).await {
                            Ok(Ok(s)) => s,
                            _ => "closed its stdout".to_owned(),
                        };
                    }
                },
                status = &mut exit => break status.unwrap_or_else(|_| "exited".to_owned()),
                _ = tick.tick(), if self.owed_since.is_some() => {
                    if let Some(why) = self.check_stall() {
                        break why;
                    }
                }
            }
        };
        warn!(%reason, in_flight = self.pending.len(), "server exited");
        self.degraded.store(false, Ordering::Relaxed);
        // Handles see the connection closed before any caller hears of the exit, so the
        // next call of an isolated session starts a new process instead of using this one.
        commands.close();
        self.fail_all(&reason);
        self.kill_group(libc::SIGKILL);
        let clean = reason == super::stdio::CLEAN_EXIT;
        let _ = self.incoming.send(Incoming::Closed { reason, clean }).await;
        // Commands queued before the close still get their errors.
        while let Some(cmd) = commands.recv().await {
            match cmd {
                Command::Request { reply, .. } => {
                    let _ = reply.send(Err(DsError::Unavailable {
                        server: self.server.clone(),
                        reason: "exited".into(),
                    }));
                }
                Command::Shutdown { done } => {
                    let _ = done.send(());
                }
                _ => {}
            }
        }
    }

    /// Moves what the writer has room for from the outbox into its channel, never waiting.
    fn flush(&mut self, write: &mut Option<mpsc::Sender<Vec<u8>>>) {
        let Some(w) = write.as_ref() else { return };
        while let Some(out) = self.outbox.pop_front() {
            match w.try_send(out.line) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(line)) => {
                    self.outbox.push_front(Out { id: out.id, line });
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(line)) => {
                    self.unwritten.fetch_sub(line.len(), Ordering::Relaxed);
                    *write = None;
                    self.clear_outbox();
                    return;
                }
            }
        }
    }

    fn clear_outbox(&mut self) {
        let bytes: usize = self.outbox.drain(..).map(|o| o.line.len()).sum();
        self.unwritten.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Queues a message for the server's input.
    fn queue(&mut self, id: Option<u64>, line: Vec<u8>) {
        self.unwritten.fetch_add(line.len(), Ordering::Relaxed);
        self.outbox.push_back(Out { id, line });
    }

    /// Whether there is room for one more request: nothing unwritten at all (one message
    /// alone is always admitted), or less than the bounds.
    fn has_room(&self) -> bool {
        let bytes = self.unwritten.load(Ordering::Relaxed);
        bytes == 0 || (bytes < OUTBOX_BYTES && self.outbox.len() < OUTBOX_MESSAGES)
    }

    /// Answers are owed for every pending call but the listen streams.
    fn owes(&self) -> bool {
        self.pending.len() > self.listens
    }

    /// The server said something: whatever it owes, it is not stuck.
    fn heard(&mut self) {
        self.owed_since = self.owes().then(Instant::now);
        if self.degraded.load(Ordering::Relaxed) {
            self.degraded.store(false, Ordering::Relaxed);
            info!("server is answering again");
        }
    }

    /// Degraded after `degraded_after` without a word while answers are owed (and a
    /// `ping` goes out, which a live server answers even when it forgot a cancelled
    /// call); stalled after `stall_after`: the reason to end it.
    fn check_stall(&mut self) -> Option<String> {
        let silent = self.owed_since?.elapsed();
        if silent >= self.watch.stall_after {
            return Some(format!(
                "stalled: no word from it for {} while {} answers were owed (stall_timeout)",
                super::fmt_duration(self.watch.stall_after),
                self.pending.len() - self.listens,
            ));
        }
        if silent >= self.watch.degraded_after && !self.degraded.swap(true, Ordering::Relaxed) {
            warn!(
                silent = %super::fmt_duration(silent),
                owed = self.pending.len() - self.listens,
                "server is not answering: degraded"
            );
            // No handle left: nobody waits for an answer, and no id is to be had.
            let id = self.next_id.upgrade().map(|n| n.fetch_add(1, Ordering::Relaxed))?;
            let (reply, _) = oneshot::channel();
            self.pending.insert(
                id,
                Pending {
                    method: "ping".to_owned(),
                    task: None,
                    sink: None,
                    progress: None,
                    reply,
                    caller: super::fair::Caller::NONE,
                },
            );
            let (mut line, _) = encode_request(id, "ping", super::Params::Raw(None));
            line.push(b'\n');
            self.queue(Some(id), line);
        }
        None
    }

    /// Forgets a pending call, keeping the count of listen streams.
    fn take(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        if p.method == "subscriptions/listen" {
            self.listens -= 1;
        }
        if p.caller.group != 0 {
            if let std::collections::hash_map::Entry::Occupied(mut n) = self.calls.entry(p.caller.group) {
                *n.get_mut() -= 1;
                if *n.get() == 0 {
                    n.remove();
                }
            }
        }
        Some(p)
    }

    /// A caller's request: queued for the server, or refused at once when its input is
    /// closed or full, or its client has `per_client` calls in flight already.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &mut self,
        id: u64,
        method: String,
        params: super::Params,
        sink: Option<super::Sink>,
        reply: oneshot::Sender<Result<message::Outcome, DsError>>,
        caller: super::fair::Caller,
        write: &Option<mpsc::Sender<Vec<u8>>>,
    ) {
        if write.is_none() {
            let _ = reply.send(Err(DsError::Unavailable {
                server: self.server.clone(),
                reason: "its input is closed".into(),
            }));
            return;
        }
        if !self.has_room() {
            // Those in the outbox, and those handed to the writer but not yet written.
            let handed = write.as_ref().map_or(0, |w| w.max_capacity() - w.capacity());
            let _ = reply.send(Err(DsError::Busy {
                server: self.server.clone(),
                queued: self.outbox.len() + handed,
                kib: self.unwritten.load(Ordering::Relaxed).div_ceil(1024),
            }));
            return;
        }
        if caller.group != 0 {
            let n = self.calls.entry(caller.group).or_insert(0);
            if *n >= self.per_client {
                debug!(
                    limit = self.per_client,
                    "refusing a call: its client has its calls in flight"
                );
                let _ = reply.send(Err(DsError::TooManyCalls {
                    server: self.server.clone(),
                    limit: self.per_client,
                }));
                return;
            }
            *n += 1;
        }
        let task = super::task_of(&method, &params);
        let (mut line, progress) = encode_request(id, &method, params);
        line.push(b'\n');
        if method == "subscriptions/listen" {
            self.listens += 1;
        } else if self.owed_since.is_none() {
            self.owed_since = Some(Instant::now());
        }
        self.pending.insert(
            id,
            Pending {
                method,
                task,
                sink,
                progress,
                reply,
                caller,
            },
        );
        self.queue(Some(id), line);
    }

    /// A caller's notification: dropped when the server's input is closed or full.
    fn notify(
        &mut self,
        method: &str,
        params: Option<&serde_json::value::RawValue>,
        write: &Option<mpsc::Sender<Vec<u8>>>,
    ) {
        if write.is_none() || !self.has_room() {
            debug!(%method, "dropping a notification: the server's input is closed or full");
            return;
        }
        let mut line = message::notification(method, params);
        line.push(b'\n');
        self.queue(None, line);
    }

    /// A caller gave up on request `id`: forgotten, and the server told unless it never
    /// saw the request.
    fn cancel(&mut self, id: u64, reason: &str) {
        let Some(p) = self.take(id) else { return };
        debug!(id, method = %p.method, reason, "cancelling downstream request");
        // Still in the outbox: the server never sees it, nor its cancellation.
        if let Some(at) = self.outbox.iter().position(|o| o.id == Some(id)) {
            if let Some(out) = self.outbox.remove(at) {
                self.unwritten.fetch_sub(out.line.len(), Ordering::Relaxed);
            }
            return;
        }
        let params = message::to_raw(&serde_json::json!({ "requestId": id, "reason": reason }));
        let mut line = message::notification("notifications/cancelled", Some(&params));
        line.push(b'\n');
        self.queue(None, line);
    }

    /// One message from the server. A large result stays in the line's buffer.
    async fn line(&mut self, line: bytes::Bytes, write: &Option<mpsc::Sender<Vec<u8>>>) {
        let kind = Kind::parse_shared(&line);
        // Whatever it is, the server is alive; after the answer is taken off `pending`.
        let kind = match kind {
            Ok(k) => k,
            Err(e) => {
                let (shown, _) = super::shown_line(&line, 200, &self.secrets);
                warn!(error = %e, line = %shown, "skipping a stdout line that is not JSON-RPC");
                self.heard();
                // An answer whose id can still be read fails its call now, rather than
                // leaving it to wait for request_timeout.
                if let Some(p) = super::id_of_broken_answer(&line).and_then(|n| self.take(n)) {
                    let _ = p.reply.send(Err(DsError::Malformed {
                        server: self.server.clone(),
                        method: p.method.to_string(),
                        why: e.to_string(),
                    }));
                }
                return;
            }
        };
        match kind {
            Kind::Response { id, outcome } => {
                let Some(n) = id.as_ref().and_then(wire_id) else {
                    debug!(?id, "skipping a response with no usable id");
                    self.heard();
                    return;
                };
                // Only an id the gateway minted and still waits on is answered.
                match self.take(n) {
                    Some(p) => {
                        let outcome =
                            super::masked_error(&self.server, outcome, |t| super::masked(t.into(), &self.secrets));
                        if let Some(sink) = &p.sink {
                            self.elicitations.answer(&outcome, sink);
                        }
                        let _ = p.reply.send(Ok(outcome));
                    }
                    None => debug!(id = n, "skipping a response to no pending request"),
                }
                self.heard();
            }
            Kind::Notification { method, params } => {
                self.heard();
                self.notification(method, params).await
            }
            Kind::Request { id, method, params } => {
                self.heard();
                // Over a shared pipe a request carries no link to the call that caused it:
                // it goes to the caller when exactly one call with a client is in flight.
                // One about a task (`_meta` related-task) goes only to the caller waiting
                // on that task (tasks/result), whose session owns it: whoever else has a
                // call in flight is not the one to answer it.
                let (related, params) = super::question_task(params.into_raw(), &self.server);
                let callers: Vec<&Pending> = self
                    .pending
                    .values()
                    .filter(|p| p.sink.is_some() && related.as_ref().is_none_or(|t| p.task.as_ref() == Some(t)))
                    .collect();
                let (caller, why) = match (callers.as_slice(), &related) {
                    ([one], _) => (one.sink.clone(), String::new()),
                    ([], Some(t)) => (
                        None,
                        format!("no call of a client waits on its task {t} (tasks/result)"),
                    ),
                    ([], None) => (None, "no call of a client is in flight on this server".to_owned()),
                    (many, _) => (
                        None,
                        format!("{} calls of clients are in flight on this server", many.len()),
                    ),
                };
                let Some(write) = write.clone() else { return };
                if let Some(sink) = &caller {
                    self.elicitations.request(&method, params.as_deref(), sink);
                }
                let unwritten = self.unwritten.clone();
                self.questions
                    .answer(id, (method, params), caller, why, move |mut out| async move {
                        out.push(b'\n');
                        // Counted like the outbox's lines: the writer subtracts what it writes.
                        let len = out.len();
                        unwritten.fetch_add(len, Ordering::Relaxed);
                        if write.send(out).await.is_err() {
                            unwritten.fetch_sub(len, Ordering::Relaxed);
                        }
                    });
            }
        }
    }

    async fn notification(&mut self, method: String, params: Option<Box<serde_json::value::RawValue>>) {
        match method.as_str() {
            "notifications/progress" => {
                let Some(p) = progress_token(params.as_deref()).and_then(|t| self.pending.get(&t)) else {
                    debug!("dropping progress for no pending request");
                    return;
                };
                if let (Some(sink), Some(token), Some(raw)) = (&p.sink, &p.progress, params.as_deref()) {
                    if let Some(bytes) = restore_progress(raw, token) {
                        sink.try_send(bytes);
                    }
                }
            }
            "notifications/elicitation/complete" => {
                // The end of a URL-mode elicitation: for the client it was asked of; else
                // (one the gateway did not see asked) for the client of the only call in flight.
                if let Some(sink) = self.elicitations.complete(params.as_deref()) {
                    let line = bytes::Bytes::from(message::notification(&method, params.as_deref()));
                    if !super::elicit::deliver(&sink, line) {
                        debug!("dropping notifications/elicitation/complete: its client has gone");
                    }
                    return;
                }
                let mut callers = self.pending.values().filter_map(|p| p.sink.as_ref());
                match (callers.next(), callers.next()) {
                    (Some(sink), None) => {
                        sink.try_send(bytes::Bytes::from(message::notification(&method, params.as_deref())));
                    }
                    _ => debug!("dropping notifications/elicitation/complete: its client cannot be known"),
                }
            }
            "notifications/message" => {
                // Over a shared pipe a log message carries no link to a call. It goes to the
                // caller only when exactly one call is in flight; otherwise the gateway logs it.
                // A 2026-07-28 server's listen stream stays pending for good; it is not a call.
                let calls = self.pending.values().filter(|p| p.method != "subscriptions/listen");
                let mut only = self.pending.values().filter(|p| p.sink.is_some());
                if let (1, Some(p)) = (calls.count(), only.next()) {
                    if let Some(sink) = &p.sink {
                        sink.log(params.as_deref());
                    }
                } else {
                    super::log_message(&self.server, params.as_deref(), &self.secrets);
                }
            }
            "notifications/cancelled" => {
                // On stdio a 2026-07-28 server ends a subscriptions/listen stream this way
                // (the only request of ours it may cancel): the stream is over, closed as
                // if it had answered, and its owner opens it again. Otherwise it names a
                // question the server asked a client: withdrawn there too.
                let listen = message::cancelled_request_id(params.as_deref())
                    .as_ref()
                    .and_then(wire_id)
                    .filter(|n| self.pending.get(n).is_some_and(|p| p.method == "subscriptions/listen"));
                match listen.and_then(|n| self.take(n)) {
                    Some(p) => {
                        debug!("the server ended its subscriptions/listen stream");
                        let closed = message::to_raw(&serde_json::json!({ "resultType": "complete" }));
                        let _ = p.reply.send(Ok(message::Outcome::Result(closed.into())));
                    }
                    None => self.questions.withdraw(params.as_deref()),
                }
            }
            _ => {
                let _ = self.incoming.send(Incoming::Notification { method, params }).await;
            }
        }
    }

    fn fail_all(&mut self, reason: &str) {
        self.listens = 0;
        self.calls.clear();
        for (_, p) in self.pending.drain() {
            let _ = p.reply.send(Err(DsError::Exited {
                server: self.server.clone(),
                method: p.method,
                reason: reason.to_owned(),
            }));
        }
    }

    /// Closes stdin, waits, then SIGTERM, waits, then SIGKILL, to the whole process group.
    async fn shutdown(&mut self, exit: &mut Exit) {
        self.clear_outbox();
        if let Some(stop) = &self.stop {
            stop.cancel();
        }
        if tokio::time::timeout(GRACE, &mut *exit).await.is_err() {
            self.kill_group(libc::SIGTERM);
            if tokio::time::timeout(GRACE, &mut *exit).await.is_err() {
                self.kill_group(libc::SIGKILL);
                let _ = exit.await;
            }
        }
        // Whatever the child left behind in its group goes too.
        self.kill_group(libc::SIGKILL);
        info!("server stopped");
    }

    fn kill_group(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) with a negative pid signals the process group we created for
            // the child (process_group(0) made its pid the group id). No memory is touched.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(-pid, signal);
            }
        }
    }
}
