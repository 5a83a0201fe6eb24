//! Test harness: runs the real `mcp-gateway` binary on a temporary config, on port 0,
//! against real child processes, and talks to it as an MCP client would.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod ext;
pub use ext::*;
mod nginx;
pub use nginx::*;
mod redis;
pub use redis::*;
mod remote;
pub use remote::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_mcp-gateway");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The mock fixture server as a `[servers.NAME]` table body.
pub fn mock(name: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "tests/fixtures/mock_server.py".to_string(),
        "--name".into(),
        name.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    format!(
        "command = \"python3\"\nargs = {}\ncwd = {:?}\n",
        toml_list(&args),
        repo().display().to_string()
    )
}

pub fn toml_list(items: &[String]) -> String {
    format!(
        "[{}]",
        items.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
    )
}

/// The gateway binary with `args`, `--config` of `config` written to a fresh temp dir
/// (kept alive by the returned guard), `MCP_GATEWAY_LOG=info` unless set, and `env`.
pub fn gateway_command(config: &str, args: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Command) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--config").arg(&path);
    if std::env::var_os("MCP_GATEWAY_LOG").is_none() {
        cmd.env("MCP_GATEWAY_LOG", "info");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    (dir, cmd)
}

/// What [`Gateway::logs`] ends with once the gateway's stderr is closed (it exited): all
/// it wrote is there.
pub const STDERR_CLOSED: &str = "(the gateway's stderr closed)\n";

/// A running gateway. Killed (SIGKILL) on drop if still running.
pub struct Gateway {
    pub child: Child,
    pub url: String,
    pub base: String,
    pub dir: tempfile::TempDir,
    /// Everything the gateway wrote to stderr so far.
    pub stderr: Arc<Mutex<String>>,
}

impl Gateway {
    /// Writes `config` (TOML, without a [gateway] listen key needed) and starts `serve`.
    pub fn start(config: &str) -> Gateway {
        Self::start_with_env(config, &[])
    }

    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Gateway {
        Self::start_listening(config, "127.0.0.1:0", env)
    }

    /// As [`Gateway::start_with_env`], listening on `listen` (`--listen`): a fixed port, for
    /// a replica that must come back where a balancer's fixed upstream expects it. Hold
    /// the port with a [`ReservedPort`] meanwhile, so nothing else takes it (the gateway
    /// binds it with `SO_REUSEADDR`, which a bound socket that does not listen allows).
    pub fn start_listening(config: &str, listen: &str, env: &[(&str, &str)]) -> Gateway {
        let (dir, cmd) = gateway_command(config, &["serve", "--listen", listen], env);
        Self::spawn(dir, cmd)
    }

    /// Starts `cmd` (from [`gateway_command`], with `dir` its guard, a `serve` that may
    /// be changed first) and waits until it listens.
    pub fn spawn(dir: tempfile::TempDir, mut cmd: Command) -> Gateway {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn gateway");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rest) = line.strip_prefix("mcp-gateway listening on ") {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(rest.to_string());
                        }
                    }
                    log.lock().unwrap().push_str(&line);
                    log.lock().unwrap().push('\n');
                }
                log.lock().unwrap().push_str(STDERR_CLOSED);
            });
        }
        let url = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                panic!("gateway did not start; stderr:\n{}", log.lock().unwrap());
            }
        };
        let base = url.rsplit_once('/').map(|(b, _)| b.to_string()).unwrap_or_default();
        Gateway {
            child,
            url,
            base,
            dir,
            stderr: log,
        }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Opens an initialized session.
    pub async fn session(&self) -> Session {
        Session::open(&self.url).await
    }

    /// Sends SIGTERM and waits for exit, skipping the drain (see [`Gateway::sigterm`]).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sigterm();
        self.child.wait().expect("wait")
    }

    /// Sends SIGTERM, and a second one once `/readyz` says `draining`, which ends the
    /// drain at once: the shutdown then goes on as with `drain_delay = "0s"` (the listener
    /// closes, requests in flight get `shutdown_grace`). Returns once the second signal is
    /// sent, or once the listener is closed (no drain).
    pub fn sigterm(&self) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on a pid this test spawned; no memory is touched.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let addr = self.base.trim_start_matches("http://").to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            match readyz_blocking(&addr) {
                None => return,
                Some(body) if body.contains("draining") => {
                    // SAFETY: as above.
                    unsafe {
                        libc::kill(pid, libc::SIGTERM);
                    }
                    return;
                }
                Some(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// `GET /readyz` on `addr` (`host:port`) over a new connection: the answer's text, or
/// `None` when the connection is refused or cut (the listener is closed).
fn readyz_blocking(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    (!out.is_empty()).then_some(out)
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client session over Streamable HTTP.
pub struct Session {
    pub http: reqwest::Client,
    pub url: String,
    pub id: String,
    pub init: Value,
}

impl Session {
    pub async fn open(url: &str) -> Session {
        Session::open_with(url, json!({})).await
    }

    /// A session whose `initialize` declares `capabilities`.
    pub async fn open_with(url: &str, capabilities: Value) -> Session {
        Session::open_on(reqwest::Client::new(), url, capabilities).await
    }

    /// A session opened with `Authorization: Bearer token` on every request.
    pub async fn open_as(url: &str, token: &str) -> Session {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header value"),
        );
        let http = reqwest::Client::builder().default_headers(headers).build().unwrap();
        Session::open_on(http, url, json!({})).await
    }

    /// A session opened with `http`, its `initialize` declaring `capabilities`.
    pub async fn open_on(http: reqwest::Client, url: &str, capabilities: Value) -> Session {
        let resp = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-11-25","capabilities":capabilities,"clientInfo":{"name":"test","version":"1"}}}))
            .send()
            .await
            .expect("initialize");
        assert_eq!(resp.status(), 200);
        let id = resp
            .headers()
            .get("mcp-session-id")
            .expect("session id")
            .to_str()
            .unwrap()
            .to_string();
        let init: Value = resp.json().await.unwrap();
        let s = Session {
            http,
            url: url.to_string(),
            id,
            init,
        };
        s.notify("notifications/initialized", json!({})).await;
        s
    }

    pub fn post(&self) -> reqwest::RequestBuilder {
        self.http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
    }

    /// POSTs `body` as it is (`Content-Type: application/json`): the status and the
    /// answer's text (JSON, or SSE events).
    pub async fn post_text(&self, body: impl Into<reqwest::Body>) -> (u16, String) {
        let r = self
            .post()
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post");
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    /// DELETEs the session; the status.
    pub async fn end(&self) -> u16 {
        let r = self
            .http
            .delete(&self.url)
            .header("mcp-session-id", &self.id)
            .send()
            .await
            .expect("delete");
        r.status().as_u16()
    }

    /// Whether a request of the session is answered 404 (it ended) within 10 s.
    pub async fn until_gone(&self) -> bool {
        for _ in 0..500 {
            let (status, _) = self
                .post_text(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}"#)
                .await;
            if status == 404 {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        false
    }

    pub async fn notify(&self, method: &str, params: Value) {
        let r = self
            .post()
            .json(&json!({"jsonrpc":"2.0","method":method,"params":params}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }

    /// Sends a request with the given id; returns every message received for it, in
    /// order (notifications first when the answer came as SSE, the response last).
    pub async fn request_all(&self, id: Value, method: &str, params: Value) -> Vec<Value> {
        let r = self
            .post()
            .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .send()
            .await
            .unwrap();
        read_messages(r).await
    }

    /// Sends a request and returns its response message.
    pub async fn request(&self, id: Value, method: &str, params: Value) -> Value {
        let all = self.request_all(id, method, params).await;
        all.into_iter().last().expect("a response")
    }

    pub async fn call(&self, tool: &str, args: Value) -> Value {
        self.request(json!(1), "tools/call", json!({"name": tool, "arguments": args}))
            .await
    }

    pub async fn tool_names(&self) -> Vec<String> {
        let r = self.request(json!("list"), "tools/list", json!({})).await;
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Reads a POST answer: JSON, or SSE events with one JSON-RPC message each.
pub async fn read_messages(r: reqwest::Response) -> Vec<Value> {
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = r.text().await.unwrap();
    if ct.starts_with("text/event-stream") {
        parse_sse(&body)
    } else {
        vec![serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))]
    }
}

pub fn parse_sse(body: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .collect();
        if !data.is_empty() && !data.join("").trim().is_empty() {
            out.push(serde_json::from_str(&data.join("\n")).unwrap());
        }
    }
    out
}

/// The text of the first content item of a tools/call response.
pub fn text(resp: &Value) -> String {
    resp["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {resp}"))
        .to_string()
}

/// Whether a process with this pid exists.
pub fn alive(pid: i32) -> bool {
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Pids of processes whose command line contains `needle`.
pub fn pids_matching(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).replace('\0', " ").contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// A 2026-07-28 (stateless) `tools/call` of `tool` POSTed to `url` as if through a
/// balancer for the address `from` (`X-Forwarded-For`; the gateway must trust 127.0.0.1):
/// its JSON answer.
pub async fn stateless_call_from(url: String, from: &str, id: Value, tool: &str, arguments: Value) -> Value {
    stateless_tool_call(&url, Some(from), stateless_meta("caller"), id, tool, arguments).await
}

/// A 2026-07-28 `tools/call` of `tool` with `_meta` `meta` (from `from`, through a trusted
/// balancer's `X-Forwarded-For`, when given): the response.
pub async fn stateless_tool_call(
    url: &str,
    from: Option<&str>,
    meta: Value,
    id: Value,
    tool: &str,
    arguments: Value,
) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments, "_meta": meta,
    }});
    let mut req = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool);
    if let Some(from) = from {
        req = req.header("x-forwarded-for", from);
    }
    req.json(&body)
        .send()
        .await
        .expect("post")
        .json::<Value>()
        .await
        .expect("json")
}

/// The 2026-07-28 `_meta` envelope of a request from a client named `client`.
pub fn stateless_meta(client: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}
