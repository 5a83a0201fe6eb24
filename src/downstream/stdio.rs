//! The task that owns one stdio child: spawns it in its own process group with a
//! clean environment, frames its stdout into lines, logs its stderr under the server's
//! name, maps ids, and shuts it down (stdin closed, then SIGTERM, then SIGKILL to the
//! whole group). A child that exits fails every pending call at once.

use super::{
    encode_request, progress_token, restore_progress, wire_id, Command, Connection, DsError, Incoming, Pending,
};
use crate::config::StdioSpec;
use crate::message::{self, Kind, Outcome};
use bytes::Bytes;
use std::collections::HashMap;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn, Instrument};

/// Longest stdout line accepted from a child; a longer one is skipped and logged.
pub const MAX_LINE: usize = 256 << 20;
/// How long a child gets after its stdin closes, and again after SIGTERM.
const GRACE: Duration = Duration::from_secs(2);

/// Spawns the child and the task that owns it. Returns its handle; what the child
/// says on its own (notifications, its exit) arrives on `incoming`.
pub fn spawn(server: Arc<str>, spec: &StdioSpec, incoming: mpsc::Sender<Incoming>) -> io::Result<Connection> {
    let mut cmd = tokio::process::Command::new(&spec.command);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.inherited.iter().map(|(k, v)| (k, v)))
        .envs(spec.env.iter().map(|(k, v)| (k, v.expose())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot start `{}` in {}: {e}", spec.command, spec.cwd.display()),
        )
    })?;
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(io::Error::other("child pipes missing"));
    };
    let span = tracing::info_span!("downstream", server = %server, pid = pid.unwrap_or(0));

    let (write_tx, write_rx) = mpsc::channel::<Vec<u8>>(super::COMMAND_QUEUE);
    let (line_tx, line_rx) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(write_lines(stdin, write_rx).instrument(span.clone()));
    tokio::spawn(read_lines(BufReader::with_capacity(64 << 10, stdout), line_tx).instrument(span.clone()));
    tokio::spawn(log_stderr(BufReader::new(stderr)).instrument(span.clone()));
    let (exit_tx, exit_rx) = oneshot::channel();
    tokio::spawn(async move {
        let status = child
            .wait()
            .await
            .map(describe)
            .unwrap_or_else(|e| format!("wait failed: {e}"));
        let _ = exit_tx.send(status);
    });
    let pipe = Pipe {
        write: write_tx,
        lines: line_rx,
        exit: exit_rx,
        pid,
        stop: None,
    };
    Ok(run_pipe(server, pipe, incoming, span))
}

/// A message stream to a server: lines out, lines in, and word of its end. A child's
/// pipes are one; the legacy HTTP+SSE transport (a GET stream plus POSTs) is another.
pub(super) struct Pipe {
    /// Each message for the server, ending in a newline.
    pub write: mpsc::Sender<Vec<u8>>,
    /// Each message from the server.
    pub lines: mpsc::Receiver<Vec<u8>>,
    /// Completes with a sentence when the server is gone.
    pub exit: oneshot::Receiver<String>,
    /// The child's process group, to signal on shutdown.
    pub pid: Option<u32>,
    /// Cancelled when shutdown starts, for transports that must be told to stop.
    pub stop: Option<tokio_util::sync::CancellationToken>,
}

/// Starts the task that owns `pipe` and returns its handle.
pub(super) fn run_pipe(
    server: Arc<str>,
    pipe: Pipe,
    incoming: mpsc::Sender<Incoming>,
    span: tracing::Span,
) -> Connection {
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
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, mut lines: mpsc::Receiver<Vec<u8>>, mut exit: Exit) {
        let reason = loop {
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    Some(Command::Shutdown { done }) => {
                        self.shutdown(&mut exit).await;
                        self.fail_all("the gateway is shutting down");
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
                    Some(line) => self.line(&line).await,
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
        self.fail_all(&reason);
        self.kill_group(libc::SIGKILL);
        let _ = self.incoming.send(Incoming::Closed { reason }).await;
        // Keep answering commands with errors until every handle is gone.
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

    async fn line(&mut self, line: &[u8]) {
        let kind = match Kind::parse(line) {
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
            Kind::Request { id, method, .. } => {
                // Server→client requests: the gateway answers ping itself; routing
                // sampling, elicitation and roots to clients is not built yet.
                let outcome = if method == "ping" {
                    Outcome::Result(message::empty_object())
                } else {
                    Outcome::Error(message::error_object(
                        message::code::METHOD_NOT_FOUND,
                        &format!("mcp-gateway does not forward {method} to clients"),
                        None,
                    ))
                };
                let mut out = message::response(&id, &outcome);
                out.push(b'\n');
                self.write(out).await;
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
                        let _ = sink.try_send(bytes);
                    }
                }
            }
            "notifications/message" => {
                // Over a shared pipe a log message carries no link to a call. It goes to the
                // caller only when exactly one call is in flight; otherwise the gateway logs it.
                let mut only = self.pending.values().filter(|p| p.sink.is_some());
                if let (1, Some(p)) = (self.pending.len(), only.next()) {
                    if let Some(sink) = &p.sink {
                        let _ = sink.try_send(Bytes::from(message::notification(&method, params.as_deref())));
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

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "exited".to_owned(),
    }
}

async fn write_lines(mut stdin: ChildStdin, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = rx.recv().await {
        if let Err(e) = stdin.write_all(&line).await {
            debug!(error = %e, "child stdin closed");
            return;
        }
        // Flush only when nothing else is queued, so bursts go out in few writes.
        if rx.is_empty() && stdin.flush().await.is_err() {
            return;
        }
    }
}

async fn read_lines<R: AsyncBufRead + Unpin>(mut reader: R, tx: mpsc::Sender<Vec<u8>>) {
    loop {
        let mut line = Vec::new();
        match read_line_limited(&mut reader, &mut line, MAX_LINE).await {
            Ok(LineRead::Eof) => return,
            Ok(LineRead::TooLong(n)) => warn!(bytes = n, max = MAX_LINE, "skipping an over-long stdout line"),
            Ok(LineRead::Line) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if tx.send(line).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(error = %e, "reading stdout failed");
                return;
            }
        }
    }
}

pub(crate) enum LineRead {
    Line,
    TooLong(usize),
    Eof,
}

/// Reads one `\n`-terminated line (without the newline) of at most `max` bytes. A longer
/// line is consumed and reported, so the stream stays in step.
pub(crate) async fn read_line_limited<R: AsyncBufRead + Unpin>(
    r: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> io::Result<LineRead> {
    let mut seen = 0usize;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if seen == 0 {
                LineRead::Eof
            } else if seen > max {
                LineRead::TooLong(seen)
            } else {
                LineRead::Line
            });
        }
        let (chunk, done) = match memchr(buf) {
            Some(i) => (&buf[..i], i + 1),
            None => (buf, 0),
        };
        seen += chunk.len();
        if seen <= max {
            out.extend_from_slice(chunk);
        } else {
            out.clear();
        }
        if done > 0 {
            r.consume(done);
            if out.last() == Some(&b'\r') {
                out.pop();
            }
            return Ok(if seen > max {
                LineRead::TooLong(seen)
            } else {
                LineRead::Line
            });
        }
        let n = buf.len();
        r.consume(n);
    }
}

fn memchr(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

async fn log_stderr<R: AsyncBufRead + Unpin>(mut reader: R) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line_limited(&mut reader, &mut line, 64 << 10).await {
            Ok(LineRead::Line) => info!(target: "downstream::stderr", "{}", String::from_utf8_lossy(&line)),
            Ok(LineRead::TooLong(n)) => info!(target: "downstream::stderr", "({n} byte stderr line skipped)"),
            Ok(LineRead::Eof) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_limited_and_stay_in_step() {
        let data: &[u8] = b"short\r\nthis line is far too long\nok\n\nlast";
        let mut r = BufReader::with_capacity(4, data);
        let mut out = Vec::new();
        let mut got = Vec::new();
        loop {
            out.clear();
            match read_line_limited(&mut r, &mut out, 10).await.unwrap() {
                LineRead::Eof => break,
                LineRead::TooLong(n) => got.push(format!("too long {n}")),
                LineRead::Line => got.push(String::from_utf8(out.clone()).unwrap()),
            }
        }
        assert_eq!(got, ["short", "too long 25", "ok", "", "last"]);
    }
}
