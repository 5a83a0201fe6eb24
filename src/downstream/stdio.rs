//! A stdio child: spawned in its own process group with a clean environment, its
//! stdout framed into lines, its stderr logged under the server's name. The task that
//! owns it ([`super::pipe`]) maps ids and shuts it down (stdin closed, then SIGTERM,
//! then SIGKILL to the whole group). A child that exits fails every pending call at once.

use super::pipe::{run_pipe, Pipe};
use super::{Connection, Incoming};
use crate::config::StdioSpec;
use std::io;
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn, Instrument};

/// How much of an over-long line is kept, to find the id of the call it answers.
const LONG_LINE_PREFIX: usize = 256;

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
    let reader = read_lines(
        BufReader::with_capacity(64 << 10, stdout),
        line_tx,
        server.clone(),
        spec.max_line,
    );
    tokio::spawn(reader.instrument(span.clone()));
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
    Ok(run_pipe(server, pipe, incoming, span).with_pid(pid))
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

async fn write_lines(stdin: ChildStdin, mut rx: mpsc::Receiver<Vec<u8>>) {
    // Lines queued behind one another collect here and reach the pipe in one write(2);
    // a line longer than the buffer goes straight through.
    let mut stdin = tokio::io::BufWriter::with_capacity(64 << 10, stdin);
    while let Some(line) = rx.recv().await {
        if let Err(e) = stdin.write_all(&line).await {
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

async fn read_lines<R: AsyncBufRead + Unpin>(mut reader: R, tx: mpsc::Sender<Vec<u8>>, server: Arc<str>, max: usize) {
    loop {
        let mut line = Vec::new();
        let line = match read_line_limited(&mut reader, &mut line, max).await {
            Ok(LineRead::Eof) => return,
            Ok(LineRead::TooLong(n)) => {
                warn!(bytes = n, max, "skipping an over-long stdout line");
                // Fail the call it answers now, rather than let it time out.
                match too_long_answer(&line, &server, n, max) {
                    Some(answer) => answer,
                    None => continue,
                }
            }
            Ok(LineRead::Line) => {
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
        "server '{server}' sent a message of {bytes} bytes, over the gateway's limit of {max} (gateway.max_line)"
    );
    let error = crate::message::error_object(crate::message::code::INTERNAL_ERROR, &message, None);
    Some(crate::message::response(&id, &crate::message::Outcome::Error(error)))
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
            // Keep only the start of an over-long line (where its id usually is).
            let room = LONG_LINE_PREFIX.saturating_sub(out.len());
            out.truncate(LONG_LINE_PREFIX);
            out.extend_from_slice(&chunk[..room.min(chunk.len())]);
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
    // SIMD: a 20 MB line is scanned in a few milliseconds, not byte by byte.
    memchr::memchr(b'\n', buf)
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
