//! More of the harness: unique fixture names, incremental SSE reading, raw HTTP,
//! waiting for log lines, `check` runs, and the gateway as a stdio server.

use super::{mock, pids_matching, Gateway, Session, BIN};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A name no other test (in this process or another) uses: for `--name`, so
/// [`mock_pids`] finds exactly this test's children.
pub fn unique(base: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{base}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Pids of mock servers started with `--name name` (exactly that name).
pub fn mock_pids(name: &str) -> Vec<i32> {
    pids_matching(&format!("mock_server.py --name {name} "))
}

/// A `[servers.NAME]` table for the mock with `name` as its `--name`, plus extra TOML lines.
pub fn server(table: &str, mock_name: &str, args: &[&str], extra_toml: &str) -> String {
    format!("[servers.{table}]\n{}{extra_toml}\n", mock(mock_name, args))
}

/// Waits until `f` holds, checking every 10 ms; false when `timeout` passes first.
pub async fn until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Gateway {
    /// Writes `config` over the gateway's config file, as an editor would, and waits until
    /// the reload that follows is done.
    pub async fn rewrite_config(&self, config: &str) {
        let before = self.logs().matches("reload done").count();
        std::fs::write(self.config_path(), config).unwrap();
        let log = self.stderr.clone();
        let done = until(Duration::from_secs(10), || {
            log.lock().unwrap().matches("reload done").count() > before
        })
        .await;
        assert!(done, "no reload: {}", self.logs());
    }

    /// Waits until the gateway's stderr contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let log = self.stderr.clone();
        until(timeout, || log.lock().unwrap().contains(needle)).await
    }

    /// `mcp_gateway_requests_in_flight` from /metrics.
    pub async fn in_flight(&self) -> i64 {
        self.get_text("/metrics")
            .await
            .lines()
            .find_map(|l| l.strip_prefix("mcp_gateway_requests_in_flight "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    }

    /// Polls `/metrics` until `mcp_gateway_requests_in_flight` is `n` (true) or 10 s pass.
    pub async fn in_flight_is(&self, n: i64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.in_flight().await == n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// GET on a path of the gateway.
    async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(format!("{}{path}", self.base)).await.unwrap()
    }

    /// GET on a path of the gateway (e.g. `/metrics`), its body as text.
    pub async fn get_text(&self, path: &str) -> String {
        self.get(path).await.text().await.unwrap()
    }

    /// GET on a path of the gateway (e.g. `/status`), as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).await.json().await.unwrap()
    }

    /// GET on a path of the gateway as JSON, with `token` as the bearer (an admin's, for
    /// `/status` once `[clients.*]` are configured).
    pub async fn get_json_as(&self, path: &str, token: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A server's entry in /status, read with an admin's `token`.
    pub async fn server_status_as(&self, name: &str, token: &str) -> Value {
        let st = self.get_json_as("/status", token).await;
        st["servers"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// A state of a server by name from /status.
    pub async fn server_status(&self, name: &str) -> Value {
        let st = self.get_json("/status").await;
        st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    }
}

/// Messages arriving on one HTTP response (JSON or SSE), read as they come.
pub struct Messages {
    resp: Option<reqwest::Response>,
    pub content_type: String,
    buf: Vec<u8>,
    /// Parsed events not yet returned: their id, and their message (none: priming).
    ready: VecDeque<(Option<String>, Option<Value>)>,
    /// Every SSE data payload or JSON body seen, in order.
    pub seen: Vec<Value>,
    /// The last SSE event id read (priming events included), for `Last-Event-ID`.
    pub last_id: Option<String>,
    /// Every SSE event id read, in order, priming events included.
    pub ids: Vec<String>,
    /// A `retry` field was read.
    pub retry: Option<u64>,
}

impl Messages {
    pub fn new(resp: reqwest::Response) -> Messages {
        let content_type = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Messages {
            resp: Some(resp),
            content_type,
            buf: Vec::new(),
            ready: VecDeque::new(),
            seen: Vec::new(),
            last_id: None,
            ids: Vec::new(),
            retry: None,
        }
    }

    fn is_sse(&self) -> bool {
        self.content_type.starts_with("text/event-stream")
    }

    /// Whether the body ended (not merely that nothing came for a while).
    pub fn ended(&self) -> bool {
        self.resp.is_none() && self.ready.is_empty()
    }

    /// The next message, or `None` when the body ended or `timeout` passed.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some((id, v)) = self.ready.pop_front() {
                if let Some(id) = id {
                    self.last_id = Some(id.clone());
                    self.ids.push(id);
                }
                let Some(v) = v else { continue };
                self.seen.push(v.clone());
                return Some(v);
            }
            let resp = self.resp.as_mut()?;
            let chunk = match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Err(_) => return None,
                Ok(Ok(Some(c))) => c,
                Ok(_) => {
                    self.resp = None;
                    if !self.is_sse() && !self.buf.is_empty() {
                        let body = std::mem::take(&mut self.buf);
                        let v = serde_json::from_slice(&body)
                            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&body)));
                        self.ready.push_back((None, Some(v)));
                    }
                    continue;
                }
            };
            self.buf.extend_from_slice(&chunk);
            if self.is_sse() {
                while let Some(end) = find(&self.buf, b"\n\n") {
                    let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                    let block = String::from_utf8(block).expect("utf-8 SSE");
                    let data: Vec<&str> = block
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                        .collect();
                    let mut id = None;
                    for l in block.lines() {
                        if let Some(i) = l.strip_prefix("id:") {
                            id = Some(i.trim().to_string());
                        }
                        if let Some(r) = l.strip_prefix("retry:") {
                            self.retry = r.trim().parse().ok();
                        }
                    }
                    // A priming event (an id and empty data) carries no message.
                    let v = (!data.join("").trim().is_empty())
                        .then(|| serde_json::from_str(&data.join("\n")).expect("SSE data is JSON"));
                    if id.is_some() || v.is_some() {
                        self.ready.push_back((id, v));
                    }
                }
            }
        }
    }

    /// Reads until a message with an `id` (the response) arrives; returns everything read
    /// on the way (notifications) and the response.
    pub async fn response(&mut self, timeout: Duration) -> (Vec<Value>, Value) {
        let mut notes = Vec::new();
        loop {
            let m = self
                .next(timeout)
                .await
                .unwrap_or_else(|| panic!("no response; got {notes:?}"));
            if m.get("id").is_some() {
                return (notes, m);
            }
            notes.push(m);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Session {
    /// Sends a request and returns its answer as a stream, to read as messages arrive.
    pub async fn start(&self, id: Value, method: &str, params: Value) -> Messages {
        let r = self
            .post()
            .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .send()
            .await
            .unwrap();
        Messages::new(r)
    }

    /// Opens the session's GET stream.
    pub async fn get_stream(&self) -> Messages {
        let r = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "GET stream");
        Messages::new(r)
    }

    pub async fn call_id(&self, id: Value, tool: &str, args: Value) -> Value {
        self.request(id, "tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    /// `method`'s list (e.g. "prompts/list" with key "prompts").
    pub async fn list(&self, method: &str, key: &str) -> Vec<Value> {
        let r = self.request(json!(method), method, json!({})).await;
        r["result"][key]
            .as_array()
            .unwrap_or_else(|| panic!("{method}: {r}"))
            .clone()
    }
}

/// The error object of a response, panicking when it is a result.
pub fn error_of(resp: &Value) -> &Value {
    resp.get("error")
        .unwrap_or_else(|| panic!("expected an error, got {resp}"))
}

/// Result of `mcp-gateway check`.
pub struct CheckRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Writes `config` to a temp dir and runs `mcp-gateway check [extra] --config F`.
/// Returns the run and the config path.
pub fn check(config: &str, extra: &[&str], env: &[(&str, &str)]) -> (CheckRun, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("check")
        .args(extra)
        .arg("--config")
        .arg(&path)
        .env_remove("MCP_GATEWAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run check");
    let run = CheckRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (run, dir)
}

/// `check` of `config` with no variables set: a config error (exit 64) saying `want`.
pub fn check_refuses(config: &str, want: &str) {
    let (run, _dir) = check(config, &[], &[]);
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    assert!(run.stderr.contains(want), "{want}\nnot in:\n{}", run.stderr);
}

/// `mcp-gateway stdio` with its stdin/stdout as the MCP channel.
pub struct StdioGateway {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every stdout line so far.
    pub stdout: Arc<Mutex<Vec<String>>>,
    pub stderr: Arc<Mutex<String>>,
    /// The config's temp dir, kept while the gateway runs.
    _dir: tempfile::TempDir,
}

impl StdioGateway {
    pub fn start(config: &str, env: &[(&str, &str)]) -> StdioGateway {
        let (dir, mut cmd) = super::gateway_command(config, &["stdio"], env);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn gateway stdio");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        {
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                for line in BufReader::with_capacity(1 << 20, out).lines() {
                    let Ok(line) = line else { break };
                    stdout.lock().unwrap().push(line.clone());
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    let mut s = stderr.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        StdioGateway {
            child,
            stdin,
            lines,
            stdout,
            stderr,
            _dir: dir,
        }
    }

    pub fn send_raw(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("stdin open");
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
        w.flush().unwrap();
    }

    pub fn send(&mut self, msg: &Value) {
        self.send_raw(&msg.to_string());
    }

    /// The next stdout line as JSON, or `None` after `timeout` or at EOF.
    pub fn recv(&self, timeout: Duration) -> Option<Value> {
        let line = self.lines.recv_timeout(timeout).ok()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:.200}")))
    }

    /// Reads until the response with `id`; returns the messages read before it too.
    pub fn until_response(&self, id: &Value, timeout: Duration) -> (Vec<Value>, Value) {
        let deadline = Instant::now() + timeout;
        let mut others = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = self.recv(left).unwrap_or_else(|| {
                panic!(
                    "no response to {id}; got {others:?}; stderr:\n{}",
                    self.stderr.lock().unwrap()
                )
            });
            if m.get("id") == Some(id) && m.get("method").is_none() {
                return (others, m);
            }
            others.push(m);
        }
    }

    pub fn request(&mut self, id: Value, method: &str, params: Value) -> (Vec<Value>, Value) {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        self.until_response(&id, Duration::from_secs(30))
    }

    /// initialize + notifications/initialized.
    pub fn initialize(&mut self) -> Value {
        let (_, r) = self.request(
            json!(0),
            "initialize",
            json!({"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"1"}}),
        );
        self.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        r
    }

    /// Closes stdin (EOF for the gateway).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (blocking the thread) until the gateway's stderr contains `needle`: the reader
    /// thread may lag what the gateway did, its exit too.
    pub fn wait_log_blocking(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.logs().contains(needle) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

impl Drop for StdioGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads one HTTP/1.1 response from a raw connection with a Content-Length body: status code, head and body.
pub async fn read_response(s: &mut tokio::net::TcpStream) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::io::AsyncReadExt::read(s, &mut chunk)
            .await
            .expect("read response");
        assert!(
            n > 0,
            "connection closed mid-response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    while buf.len() < head_end + len {
        let n = tokio::io::AsyncReadExt::read(s, &mut chunk).await.expect("read body");
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
    (status, head, body)
}

/// `GET url` as JSON (a fixture's own counters: `/stats`, `/seen`).
pub async fn fetch_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

/// `POST url` with the JSON `body`, which must answer 200 (a fixture's `/control`).
pub async fn post_ok(url: &str, body: &Value) {
    let r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "POST {url}");
}
