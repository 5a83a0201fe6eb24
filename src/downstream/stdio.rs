//! A stdio child: spawned in its own process group with a clean environment, its
//! stdout framed into lines, its stderr logged under the server's name. The task that
//! owns it ([`super::pipe`]) maps ids and shuts it down (stdin closed, then SIGTERM,
//! then SIGKILL to the whole group). A child that exits fails every pending call at once.

use super::pipe::{run_pipe, Pipe, Watch};
use super::{Connection, Incoming};
use crate::config::{Secret, StdioSpec};
use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::sync;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::io;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn, Instrument};

/// How much of an over-long line is kept, to find the id of the call it answers.
const LONG_LINE_PREFIX: usize = 256;

/// Spawns the child and the task that owns it. Returns its handle; what the child
/// says on its own (notifications, its exit) arrives on `incoming`.
pub fn spawn(
    server: Arc<str>,
    spec: &StdioSpec,
    incoming: mpsc::Sender<Incoming>,
    watch: Watch,
) -> io::Result<Connection> {
    let mut cmd = tokio::process::Command::new(&spec.command);
    cmd.args(spec.args.iter().map(Secret::expose))
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
    let (line_tx, line_rx) = mpsc::channel::<Bytes>(64);
    let unwritten = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    crate::background::spawn(write_lines(stdin, write_rx, unwritten.clone()).instrument(span.clone()));
    let reader = read_lines(LineReader::new(stdout), line_tx, server.clone(), spec.max_line);
    crate::background::spawn(reader.instrument(span.clone()));
    let tail = Arc::new(StderrTail::default());
    let secrets = secret_values(spec);
    let exited = tokio_util::sync::CancellationToken::new();
    crate::background::spawn(
        log_stderr(
            LineReader::new(stderr),
            server.clone(),
            tail.clone(),
            secrets,
            exited.clone(),
        )
        .instrument(span.clone()),
    );
    let (exit_tx, exit_rx) = oneshot::channel();
    let group = pid.and_then(|p| libc::pid_t::try_from(p).ok());
    if let Some(g) = group {
        live_groups().insert(g);
    }
    crate::background::spawn(async move {
        let status = child
            .wait()
            .await
            .map(describe)
            .unwrap_or_else(|e| format!("wait failed: {e}"));
        if let Some(g) = group {
            live_groups().remove(&g);
        }
        exited.cancel();
        let _ = exit_tx.send(status);
    });
    let pipe = Pipe {
        write: write_tx,
        lines: line_rx,
        exit: exit_rx,
        pid,
        stop: None,
        unwritten,
        secrets: secret_values(spec),
        per_client: spec.max_calls_per_client,
    };
    Ok(run_pipe(server, pipe, incoming, watch, span)
        .with_pid(pid)
        .with_stderr(tail))
}

/// How long a child's stderr is still read after it exited: what it wrote before is in
/// the pipe already; what comes later is a process it left behind, which may hold the
/// pipe open for ever (its descriptor would never be closed).
const STDERR_AFTER_EXIT: Duration = Duration::from_secs(1);

/// How many of a child's last stderr lines are kept, to say why it failed.
const TAIL_LINES: usize = 5;
/// The longest kept line, in characters.
const TAIL_LINE_MAX: usize = 300;
use super::{shown_line, MASKED_MIN};

/// A child's last stderr lines (secrets masked): shown in `/status` `lastError` and by
/// `check --connect` when it exits, for example before answering `initialize`.
#[derive(Default)]
pub struct StderrTail {
    lines: Mutex<std::collections::VecDeque<String>>,
    ended: std::sync::atomic::AtomicBool,
    end: tokio::sync::Notify,
}

impl StderrTail {
    fn push(&self, line: String) {
        let mut lines = sync::lock(&self.lines);
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn close(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Release);
        self.end.notify_waiters();
    }

    /// The last lines, one ` | ` apart, once stderr has ended (waiting briefly for the
    /// reader to catch up with a child that just exited); `None` if there were none.
    pub async fn text(&self) -> Option<String> {
        let ended = self.end.notified();
        if !self.ended.load(std::sync::atomic::Ordering::Acquire) {
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), ended).await;
        }
        let lines = sync::lock(&self.lines);
        (!lines.is_empty()).then(|| lines.iter().map(String::as_str).collect::<Vec<_>>().join(" | "))
    }
}

/// The child's env values worth masking in its stderr (the short ones would mask
/// ordinary words).
fn secret_values(spec: &StdioSpec) -> Vec<String> {
    spec.env
        .iter()
        .map(|(_, v)| v)
        .chain(&spec.masked)
        .map(|v| v.expose())
        .filter(|v| v.len() >= MASKED_MIN)
        .map(str::to_owned)
        .collect()
}

/// The process groups of the children alive now. The one piece of global state in the
/// gateway, for one reason: the last step of a shutdown ([`kill_all`]) must reach every
/// child whatever the tasks that own them are doing.
fn live_groups() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<libc::pid_t>> {
    static GROUPS: std::sync::Mutex<std::collections::BTreeSet<libc::pid_t>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    sync::lock(&GROUPS)
}

/// Sends SIGKILL to the process group of every child still alive: what a shutdown does
/// once `shutdown_grace` is over, whatever state the pipes are in. Returns how many.
pub fn kill_all() -> usize {
    let groups = live_groups();
    for g in groups.iter() {
        // SAFETY: kill(2) with a negative pid signals a process group we created for a
        // child (process_group(0) made its pid the group id). No memory is touched.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(-g, libc::SIGKILL);
        }
    }
    groups.len()
}

/// How [`describe`] puts a clean exit.
pub const CLEAN_EXIT: &str = "exit status 0";

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => CLEAN_EXIT.to_owned(),
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "exited".to_owned(),
    }
}

async fn write_lines(
    stdin: ChildStdin,
    mut rx: mpsc::Receiver<Vec<u8>>,
    unwritten: Arc<std::sync::atomic::AtomicUsize>,
) {
    // Lines queued behind one another collect here and reach the pipe in one write(2);
    // a line longer than the buffer goes straight through.
    let mut stdin = tokio::io::BufWriter::with_capacity(64 << 10, stdin);
    while let Some(mut line) = rx.recv().await {
        // The one place that writes to a child: whatever a client put in a message,
        // it reaches the child as exactly one line.
        let queued = line.len();
        message::frame_line(&mut line);
        let written = stdin.write_all(&line).await;
        unwritten.fetch_sub(queued, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = written {
            debug!(error = %e, "child stdin closed");
            return;
        }
        if rx.is_empty() {
            // Before the write(2), let every task that is ready now run once: under load
            // the calls arriving on other connections in the same tick queue their lines
            // behind this one and share its write (and the child's wake-up). Alone, the
            // line waits only for the scheduler's next turn.
            tokio::task::yield_now().await;
        }
        // Flush only when nothing else is queued, so bursts go out in few writes.
        if rx.is_empty() && stdin.flush().await.is_err() {
            return;
        }
    }
}

async fn read_lines<R: AsyncRead + Unpin>(
    mut reader: LineReader<R>,
    tx: mpsc::Sender<Bytes>,
    server: Arc<str>,
    max: usize,
) {
    loop {
        // Once nobody takes its lines (the child exited and its pipe's owner is done),
        // stdout is let go of, though a process the child left behind holds it open.
        let next = tokio::select! {
            next = reader.next(max) => next,
            () = tx.closed() => return,
        };
        let line = match next {
            Ok(Next::Eof) => return,
            Ok(Next::TooLong(n, prefix)) => {
                warn!(bytes = n, max, "skipping an over-long stdout line");
                // Fail the call it answers now, rather than let it time out.
                match too_long_answer(&prefix, &server, n, max) {
                    Some(answer) => Bytes::from(answer),
                    None => continue,
                }
            }
            Ok(Next::Line(line)) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                line
            }
            Err(e) => {
                warn!(error = %e, "reading stdout failed");
                return;
            }
        };
        if tx.send(line).await.is_err() {
            return;
        }
    }
}

/// The first read buffer's size, and the smallest.
const READ: usize = 64 << 10;
/// The largest read buffer, for a long line.
const READ_MAX: usize = 8 << 20;

/// What [`LineReader::next`] found.
pub(crate) enum Next {
    Line(Bytes),
    /// A line over the limit: its length so far and its first bytes. Reported once, as
    /// soon as it is over (a line that never ends is reported all the same); the rest
    /// of it is skipped.
    TooLong(usize, Vec<u8>),
    Eof,
}

/// Splits a stream (a child's stdout or stderr, the stdio front's stdin) into
/// `\n`-terminated lines (without the newline or a `\r` before it), reading straight
/// from the pipe into buffers of its own. A line within one
/// read is a slice of that buffer; a longer one is joined once from the buffers it
/// filled (each read bigger than the last, up to 8 MiB). So a 20 MB message is copied
/// once on its way in: no reader's buffer to copy out of, no buffer growing by copies.
pub(crate) struct LineReader<R> {
    inner: R,
    /// Read, not yet returned. Its first `scanned` bytes hold no newline.
    cur: BytesMut,
    scanned: usize,
    /// Full buffers of the line being read, before `cur`.
    parts: Vec<Bytes>,
    /// The bytes in `parts`.
    in_parts: usize,
    /// Over the limit: the line's first bytes and its length so far; nothing else is kept.
    over: Option<(Vec<u8>, usize)>,
    /// The line over the limit was reported already: its end is skipped, not reported.
    reported: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R) -> LineReader<R> {
        LineReader {
            inner,
            cur: BytesMut::with_capacity(READ),
            scanned: 0,
            parts: Vec::new(),
            in_parts: 0,
            over: None,
            reported: false,
        }
    }

    /// The next line of at most `max` bytes. A longer one is reported once it is over
    /// the limit, and consumed, so the stream stays in step. Cancel-safe: what was read
    /// stays in the reader.
    pub(crate) async fn next(&mut self, max: usize) -> io::Result<Next> {
        loop {
            if let Some(i) = memchr(&self.cur[self.scanned..]) {
                let end = self.scanned + i;
                let mut tail = self.cur.split_to(end + 1);
                tail.truncate(end);
                self.scanned = 0;
                if self.cur.capacity() > 2 * READ && self.cur.len() <= READ {
                    // After a long line, what follows it moves to a buffer of the usual
                    // size, so the long line's buffer is freed with the line.
                    let mut rest = BytesMut::with_capacity(READ);
                    rest.extend_from_slice(&self.cur);
                    self.cur = rest;
                }
                match self.finish(tail, max) {
                    Some(next) => return Ok(next),
                    None => continue,
                }
            }
            self.scanned = self.cur.len();
            if self.cur.capacity() - self.cur.len() < READ / 4 {
                if self.cur.len() >= READ / 2 {
                    // (Nearly) full, and no newline: the buffer becomes part of the line,
                    // and the next read goes to a new one, bigger as the line grows.
                    let full = self.cur.split().freeze();
                    self.scanned = 0;
                    self.keep(full, max);
                    if let (Some((prefix, n)), false) = (&self.over, self.reported) {
                        // Over the limit with no end in sight: said now, not at its end,
                        // which may be far off or never come.
                        self.reported = true;
                        return Ok(Next::TooLong(*n, prefix.clone()));
                    }
                    let size = (self.in_parts + self.over.as_ref().map_or(0, |o| o.1)).clamp(READ, READ_MAX);
                    self.cur.reserve(size);
                } else {
                    // The short start of a line at the end of a buffer moves to a new one.
                    self.cur.reserve(READ);
                }
            }
            if self.inner.read_buf(&mut self.cur).await? == 0 {
                // End of stream: a last line without a newline still counts.
                let tail = self.cur.split();
                self.scanned = 0;
                if tail.is_empty() && self.parts.is_empty() && self.over.is_none() {
                    return Ok(Next::Eof);
                }
                if let Some(next) = self.finish(tail, max) {
                    return Ok(next);
                }
            }
        }
    }

    /// Adds a buffer of the current line, or, past the limit, keeps only its start.
    fn keep(&mut self, part: Bytes, max: usize) {
        if part.is_empty() {
            return;
        }
        if let Some((_, n)) = &mut self.over {
            *n += part.len();
            return;
        }
        self.in_parts += part.len();
        self.parts.push(part);
        if self.in_parts > max {
            let mut prefix = Vec::with_capacity(LONG_LINE_PREFIX);
            for p in self.parts.drain(..) {
                let room = LONG_LINE_PREFIX - prefix.len();
                prefix.extend_from_slice(&p[..room.min(p.len())]);
            }
            self.over = Some((prefix, self.in_parts));
            self.in_parts = 0;
        }
    }

    /// The line whose last piece is `tail`; `None` for the end of one over the limit
    /// that was reported already.
    fn finish(&mut self, tail: BytesMut, max: usize) -> Option<Next> {
        let tail = tail.freeze();
        self.keep(tail, max);
        let line = match self.over.take() {
            Some(_) if std::mem::take(&mut self.reported) => return None,
            Some((prefix, n)) => return Some(Next::TooLong(n, prefix)),
            None if self.parts.len() == 1 => self.parts.pop().unwrap_or_default(),
            None => {
                // The one copy of a long line: its buffers joined.
                let mut joined = Vec::with_capacity(self.in_parts);
                for p in self.parts.drain(..) {
                    joined.extend_from_slice(&p);
                }
                Bytes::from(joined)
            }
        };
        self.parts.clear();
        self.in_parts = 0;
        Some(Next::Line(match line.last() {
            Some(b'\r') => line.slice(..line.len() - 1),
            _ => line,
        }))
    }
}

/// An error response standing in for an over-long message, if its first bytes show
/// which request it answers.
fn too_long_answer(prefix: &[u8], server: &str, bytes: usize, max: usize) -> Option<Vec<u8>> {
    let at = prefix.windows(4).position(|w| w == b"\"id\"")?;
    let rest = &prefix[at + 4..];
    let colon = rest.iter().position(|&b| b == b':')?;
    let id: serde_json::Value = serde_json::Deserializer::from_slice(&rest[colon + 1..])
        .into_iter()
        .next()?
        .ok()?;
    if !(id.is_number() || id.is_string()) {
        return None;
    }
    let message = format!(
        "server '{server}' sent a message of more than {max} bytes, the gateway's limit (gateway.max_line; {bytes} bytes read when it was refused)"
    );
    // The server's fault, with no `data` (its answer stands in for the server's own).
    let error = Error {
        data: None,
        ..Error::server(&Arc::from(server), code::INTERNAL_ERROR, message)
    };
    Some(message::response(&Id::from_value(&id), &Outcome::Error(error.object())))
}

fn memchr(buf: &[u8]) -> Option<usize> {
    // SIMD, not byte by byte: a long line is scanned once, fast.
    memchr::memchr(b'\n', buf)
}

/// The longest stderr line read whole; a longer one is skipped (its length logged).
const STDERR_LINE_MAX: usize = 64 << 10;
/// Of a line logged, at most this many bytes are shown.
pub(crate) const STDERR_SHOWN_MAX: usize = 4 << 10;
/// Stderr lines logged per second per server, on average, …
const STDERR_RATE: f64 = 100.0;
/// … and at once after a quiet spell. Lines over the budget are counted, not logged.
const STDERR_BURST: f64 = 200.0;
/// How often, at most, the count of lines not logged is.
const STDERR_REPORT: Duration = Duration::from_secs(1);

/// A token bucket: [`STDERR_BURST`] lines at once, refilled at [`STDERR_RATE`] a second.
#[derive(Debug)]
pub(crate) struct Budget {
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn new(now: Instant) -> Budget {
        Budget {
            tokens: STDERR_BURST,
            at: now,
        }
    }

    /// Takes one line's token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * STDERR_RATE).min(STDERR_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A server's stderr budget, shared by its processes.
pub(crate) type Shared = Arc<Mutex<Budget>>;

/// The stderr budget of each server by name, shared by its processes (one per session
/// with `isolation = "session"`, and the next one after a restart).
static BUDGETS: std::sync::LazyLock<Mutex<HashMap<Arc<str>, Shared>>> = std::sync::LazyLock::new(Default::default);

pub(crate) fn budget_of(server: &Arc<str>) -> Shared {
    let mut all = sync::lock(&BUDGETS);
    all.entry(server.clone())
        .or_insert_with(|| Arc::new(Mutex::new(Budget::new(Instant::now()))))
        .clone()
}

/// Forgets a server's budget once no process of it is left.
fn release_budget(server: &Arc<str>, budget: Shared) {
    let mut all = sync::lock(&BUDGETS);
    drop(budget);
    if all.get(server).is_some_and(|b| Arc::strong_count(b) == 1) {
        all.remove(server);
    }
}

/// Logs a child's stderr, line by line, within its server's [`Budget`]: a child writing
/// as fast as it can fills the log at [`STDERR_RATE`] lines a second, not at its own
/// pace. Lines over the budget are still read (the child never waits on its pipe) and
/// counted; the count is logged at most every [`STDERR_REPORT`], and at the end.
async fn log_stderr<R: AsyncRead + Unpin>(
    mut reader: LineReader<R>,
    server: Arc<str>,
    tail: Arc<StderrTail>,
    secrets: Vec<String>,
    exited: tokio_util::sync::CancellationToken,
) {
    let budget = budget_of(&server);
    let mut dropped: u64 = 0;
    let report = tokio::time::sleep(STDERR_REPORT);
    tokio::pin!(report);
    let after_exit = async {
        exited.cancelled().await;
        tokio::time::sleep(STDERR_AFTER_EXIT).await;
    };
    tokio::pin!(after_exit);
    loop {
        let next = tokio::select! {
            next = reader.next(STDERR_LINE_MAX) => next,
            _ = &mut report, if dropped > 0 => {
                suppressed(&mut dropped);
                continue;
            }
            () = &mut after_exit => {
                debug!("stderr still open after the server exited (a process it started holds it); no longer read");
                break;
            }
        };
        let line = match next {
            Ok(Next::Line(line)) => Ok(line),
            Ok(Next::TooLong(n, _)) => Err(n),
            Ok(Next::Eof) | Err(_) => break,
        };
        if !take(&budget) {
            if dropped == 0 {
                // The first line of a count: the count is due one period on (not at once,
                // which would be one report per refill), so reports come a period apart.
                report.as_mut().reset(tokio::time::Instant::now() + STDERR_REPORT);
            }
            dropped += 1;
            continue;
        }
        let line = match line {
            Ok(line) => line,
            Err(n) => {
                info!(target: "downstream::stderr", "(a stderr line of more than {STDERR_LINE_MAX} bytes skipped; {n} read)");
                continue;
            }
        };
        let (text, cut) = shown_line(&line, STDERR_SHOWN_MAX, &secrets);
        if cut {
            info!(target: "downstream::stderr", "{text} … ({} bytes)", line.len());
        } else {
            info!(target: "downstream::stderr", "{text}");
        }
        tail.push(text.chars().take(TAIL_LINE_MAX).collect());
    }
    tail.close();
    suppressed(&mut dropped);
    release_budget(&server, budget);
}

pub(crate) fn take(budget: &Mutex<Budget>) -> bool {
    sync::lock(budget).take(Instant::now())
}

/// Logs how many stderr lines went unlogged, and starts counting again.
fn suppressed(dropped: &mut u64) {
    if *dropped > 0 {
        warn!(
            target: "downstream::stderr",
            suppressed = *dropped,
            "suppressed {} stderr lines (over {STDERR_RATE} lines/s, bursts of {STDERR_BURST})",
            *dropped
        );
        *dropped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that gives at most `step` bytes a read.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let n = self.step.min(buf.remaining()).min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            std::task::Poll::Ready(Ok(()))
        }
    }

    async fn lines(data: &[u8], step: usize, max: usize) -> Vec<String> {
        let mut r = LineReader::new(Trickle {
            data: data.to_vec(),
            at: 0,
            step,
        });
        let mut got = Vec::new();
        loop {
            match r.next(max).await.unwrap() {
                Next::Eof => break,
                Next::TooLong(n, prefix) => got.push(format!("too long {n} {}", String::from_utf8_lossy(&prefix))),
                Next::Line(l) => got.push(String::from_utf8(l.to_vec()).unwrap()),
            }
        }
        got
    }

    #[test]
    fn the_stderr_budget_gives_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let burst = (0..1000).filter(|_| b.take(t0)).count();
        assert_eq!(burst, STDERR_BURST as usize);
        // Half a second later: half a second's worth, no more.
        let later = t0 + Duration::from_millis(500);
        let refilled = (0..1000).filter(|_| b.take(later)).count();
        assert_eq!(refilled, (STDERR_RATE / 2.0) as usize);
        // A long quiet spell refills up to the burst only.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!((0..1000).filter(|_| b.take(much_later)).count(), STDERR_BURST as usize);
    }

    #[tokio::test]
    async fn line_reader_splits_limits_and_stays_in_step() {
        let data = b"short\r\nthis line is far too long\nok\n\nlast";
        for step in [1, 3, 7, 64 << 10] {
            assert_eq!(
                lines(data, step, 10).await,
                ["short", "too long 25 this line is far too long", "ok", "", "last"],
                "step {step}"
            );
        }
    }

    #[tokio::test]
    async fn line_reader_lets_go_of_a_long_lines_buffers() {
        let data = format!("{}\nsmall\n", "z".repeat(40 * READ));
        let mut r = LineReader::new(Trickle {
            data: data.into_bytes(),
            at: 0,
            step: 4 << 20,
        });
        let Next::Line(long) = r.next(usize::MAX).await.unwrap() else {
            panic!("no line")
        };
        assert_eq!(long.len(), 40 * READ);
        assert!(
            r.cur.capacity() <= 2 * READ,
            "kept {} bytes of buffer",
            r.cur.capacity()
        );
        assert!(matches!(r.next(usize::MAX).await.unwrap(), Next::Line(l) if l == "small"));
    }

    #[tokio::test]
    async fn line_reader_joins_long_lines_once_and_keeps_the_rest() {
        let long = "x".repeat(3 * READ + 123);
        let data = format!("a\n{long}\r\nb\n{long}\nc");
        for step in [1000, 5000, 64 << 10, 1 << 20] {
            let got = lines(data.as_bytes(), step, 1 << 20).await;
            assert_eq!(got.len(), 5, "step {step}");
            assert_eq!((got[0].as_str(), got[2].as_str(), got[4].as_str()), ("a", "b", "c"));
            assert!(got[1] == long && got[3] == long, "step {step}");
        }
        // Over the limit: only the start is kept, and the next line is whole.
        let data = format!("{{\"id\":7,\"result\":\"{long}\"}}\nafter\n");
        let got = lines(data.as_bytes(), 64 << 10, READ).await;
        assert_eq!(got.len(), 2);
        let (n, prefix) = got[0]
            .strip_prefix("too long ")
            .and_then(|r| r.split_once(' '))
            .unwrap();
        assert!(n.parse::<usize>().unwrap() > READ, "{n}");
        assert!(prefix.starts_with("{\"id\":7,"), "{}", &prefix[..40]);
        assert_eq!(got[1], "after");
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_reported_before_it_ends_and_once() {
        // Ten times the limit before its end: said when it is over, not at its end.
        let data = format!("{{\"id\":7,\"x\":\"{}\"}}\nafter\n", "x".repeat(10 * READ));
        let got = lines(data.as_bytes(), 64 << 10, READ).await;
        assert_eq!(
            got.len(),
            2,
            "{:?}",
            got.iter().map(|l| &l[..l.len().min(40)]).collect::<Vec<_>>()
        );
        let n: usize = got[0]
            .strip_prefix("too long ")
            .and_then(|r| r.split_once(' '))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap();
        assert!(n > READ && n < 5 * READ, "reported after {n} bytes");
        assert_eq!(got[1], "after");
    }
}
