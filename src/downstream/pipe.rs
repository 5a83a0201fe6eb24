//! The task that owns a message stream to one server (a child's pipes, or the legacy
//! HTTP+SSE transport): it mints ids, keeps the pending calls, restores progress
//! tokens, answers the server's pings, reports what relates to no call, and fails every
//! pending call at once when the stream ends.

use super::{
    encode_request, progress_token, restore_progress, wire_id, Command, Connection, DsError, Incoming, Pending,
};
use crate::message::{self, Kind};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn, Instrument};

/// How long a child gets after its stdin closes, and again after SIGTERM.
const GRACE: Duration = Duration::from_secs(2);

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
}

/// Starts the task that owns `pipe` and returns its handle.
pub fn run_pipe(server: Arc<str>, pipe: Pipe, incoming: mpsc::Sender<Incoming>, span: tracing::Span) -> Connection {
    let (tx, rx) = mpsc::channel(super::COMMAND_QUEUE);
    let actor = Actor {
        server: server.clone(),
        pending: HashMap::new(),
        write: Some(pipe.write),
        incoming,
        pid: pipe.pid,
        stop: pipe.stop,
    };
    tokio::spawn(actor.run(rx, pipe.lines, pipe.exit).instrument(span));
    Connection::new(server, tx)
}

struct Actor {
    server: Arc<str>,
    pending: HashMap<u64, Pending>,
    /// Lines for the child's stdin; `None` once stdin is closed.
    write: Option<mpsc::Sender<Vec<u8>>>,
    incoming: mpsc::Sender<Incoming>,
    pid: Option<u32>,
    stop: Option<tokio_util::sync::CancellationToken>,
}

/// How the child ended, as a sentence.
type Exit = oneshot::Receiver<String>;

impl Actor {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut lines: mpsc::Receiver<bytes::Bytes>,
        mut exit: Exit,
    ) {
        let reason = loop {
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(Command::Shutdown { done }) => {
                        self.shutdown(&mut exit).await;
                        self.fail_all("it was stopped by a gateway shutdown or a config reload");
                        let _ = done.send(());
                        return;
                    }
                    Some(cmd) => self.command(cmd).await,
                    None => {
                        self.shutdown(&mut exit).await;
                        return;
                    }
                },
                line = lines.recv() => match line {
                    Some(line) => self.line(line).await,
                    None => {
                        // Stdout closed: the child is exiting; give it a moment to report.
                        break match tokio::time::timeout(Duration::from_millis(200), &mut exit).await {
                            Ok(Ok(s)) => s,
                            _ => "closed its stdout".to_owned(),
                        };
                    }
                },
                status = &mut exit => break status.unwrap_or_else(|_| "exited".to_owned()),
            }
        };
        warn!(%reason, in_flight = self.pending.len(), "server exited");
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

    async fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Request {
                id,
                method,
                params,
                sink,
                reply,
                ..
            } => {
                let (mut line, progress) = encode_request(id, &method, params);
                line.push(b'\n');
                self.pending.insert(
                    id,
                    Pending {
                        method,
                        sink,
                        progress,
                        reply,
                    },
                );
                self.write(line).await;
            }
            Command::Notify { method, params } => {
                let mut line = message::notification(&method, params.as_deref());
                line.push(b'\n');
                self.write(line).await;
            }
            Command::Cancel { id, reason } => {
                if let Some(p) = self.pending.remove(&id) {
                    debug!(id, method = %p.method, reason, "cancelling downstream request");
                    let params = message::to_raw(&serde_json::json!({ "requestId": id, "reason": reason }));
                    let mut line = message::notification("notifications/cancelled", Some(&params));
                    line.push(b'\n');
                    self.write(line).await;
                }
            }
            // Handled in the run loop; answered here only for completeness.
            Command::Shutdown { done } => {
                let _ = done.send(());
            }
        }
    }

    async fn write(&mut self, line: Vec<u8>) {
        if let Some(w) = &self.write {
            if w.send(line).await.is_err() {
                self.write = None;
            }
        }
    }

    /// One message from the server. A large result stays in the line's buffer.
    async fn line(&mut self, line: bytes::Bytes) {
        let kind = match Kind::parse_shared(&line) {
            Ok(k) => k,
            Err(e) => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(200)]);
                warn!(error = %e, line = %shown, "skipping a stdout line that is not JSON-RPC");
                return;
            }
        };
        match kind {
            Kind::Response { id, outcome } => {
                let Some(n) = id.as_ref().and_then(wire_id) else {
                    debug!(?id, "skipping a response with no usable id");
                    return;
                };
                match self.pending.remove(&n) {
                    Some(p) => {
                        let _ = p.reply.send(Ok(outcome));
                    }
                    None => debug!(id = n, "skipping a response to no pending request"),
                }
            }
            Kind::Notification { method, params } => self.notification(method, params).await,
            Kind::Request { id, method, params } => {
                // Over a shared pipe a request carries no link to the call that caused it:
                // it goes to the caller when exactly one call with a client is in flight.
                let callers: Vec<&Pending> = self.pending.values().filter(|p| p.sink.is_some()).collect();
                let (caller, why) = match callers.as_slice() {
                    [one] => (one.sink.clone(), String::new()),
                    [] => (None, "no call of a client is in flight on this server".to_owned()),
                    many => (
                        None,
                        format!("{} calls of clients are in flight on this server", many.len()),
                    ),
                };
                let Some(write) = self.write.clone() else { return };
                tokio::spawn(
                    async move {
                        let outcome = super::answer_server_request(caller, method, params, &why).await;
                        let mut out = message::response(&id, &outcome);
                        out.push(b'\n');
                        let _ = write.send(out).await;
                    }
                    .in_current_span(),
                );
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
                // The end of a URL-mode elicitation: for the client of the only call in flight.
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
                    info!(
                        message = params.as_deref().map_or("", |p| p.get()),
                        "downstream log message"
                    );
                }
            }
            "notifications/cancelled" => {
                debug!("downstream cancelled a request of ours; ignoring");
            }
            _ => {
                let _ = self.incoming.send(Incoming::Notification { method, params }).await;
            }
        }
    }

    fn fail_all(&mut self, reason: &str) {
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
        self.write = None;
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
            unsafe {
                libc::kill(-pid, signal);
            }
        }
    }
}
