//! `mcp-gateway-bench`: `tools/call` round trips, four ways.
//!
//! - `direct`: the fixture as our own stdio child, requests id-multiplexed over its
//!   stdin/stdout (the baseline the gateway cannot beat).
//! - `gateway`: the real gateway binary with that fixture behind it; one MCP session,
//!   one keep-alive HTTP/1.1 connection per worker.
//! - `stateless`: the same, sent as a 2026-07-28 client sends it: no session, the `_meta`
//!   envelope in params, `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers;
//!   each answer must be a `resultType: "complete"` result. With `gateway` in the same
//!   run, the stateless/session targets (issue #19) are printed.
//! - `stateless-ab`: one gateway, the `gateway` and `stateless` calls in alternating slices
//!   of `--warmup` + `--duration` each (`--ab-pairs` pairs per concurrency level, the order
//!   swapped every pair), so that a noisy machine moves both halves of a pair alike; the
//!   stateless/session targets are judged on the median pair.
//! - `baseline`: a bare hyper server (own runtime, same process) answering fixed
//!   JSON-RPC bytes to every POST: the cost of the HTTP hop alone.
//!
//! Target cases (opt-in with `--mode`), each printing PASS/FAIL against the issue's target:
//! - `idle-rss`: gateway RSS with `--idle-servers` (10) stdio servers, idle.
//! - `sessions`: open `--sessions` (10,000) sessions; RSS growth per session.
//! - `soak`: `--soak-calls` (1,000,000) calls at c=`--soak-concurrency` (64), RSS sampled
//!   every 10 % of the calls; the bound holds and RSS plateaus.
//! - `list`: merged `tools/list` of `--list-servers` (20) mock servers × `--list-tools` (50)
//!   extra tools, served from the catalog; p50/p99 at c=1.
//! - `startup`: `--startup-servers` (20) servers that each take `--init-delay-ms` (200) to
//!   initialize: time from spawning the gateway to the first complete `tools/list`. The
//!   servers are this binary's own minimal stdio server (the hidden `fixture` subcommand,
//!   see `fixture.rs`), or with `--startup-fixture python` the Python mock.
//! - `remote-json`, `remote-sse`: a remote (Streamable HTTP) server, this binary's own
//!   (the hidden `remote-fixture` subcommand, see `remote.rs`), answering in JSON
//!   or SSE: the bench's client straight to it over HTTP with a session (`json-direct`,
//!   `sse-direct`) against the same calls through the gateway configured with
//!   `url = …` to it (`json-gateway`, `sse-gateway`), alternating per concurrency level;
//!   targets: added p50 at c=1 ≤ 100 µs, throughput at c=64 ≥ 0.9× direct.
//! - `remote-url`: the same comparison against any running Streamable HTTP server
//!   (`--remote-url`, e.g. the TypeScript SDK's server-everything or a Python SDK server):
//!   `--remote-tool` (echo) called with `{ --remote-arg: text }`, the direct client at
//!   `--remote-version` (default the version the gateway speaks to its servers), the
//!   gateway's server table extended by `--remote-server-toml`.
//!
//! - `search`: the gateway's tool search in process (`search.rs`): recall@1 and @5 on the
//!   fixture's tuned and held-out requests, search p50/p99 and index rebuild on a
//!   1,000-tool catalog; targets: recall@5 ≥ 0.90, recall@1 ≥ 0.70, p50 ≤ 1 ms, rebuild
//!   ≤ 20 ms.
//!
//! Each (mode, concurrency) case: warm up, then run for `--duration` (or `--calls`),
//! with `concurrency` workers each keeping one request in flight. Latencies are kept
//! whole (one `u64` per call) and sorted; percentiles are nearest-rank.
//! Exits non-zero if any call fails.
//!
//! The HTTP cases' measured calls (gateway, baseline, soak) use `--client raw` (the default,
//! `rawhttp.rs`: one write and usually one read per call, every answer checked) or
//! `--client hyper`; session set-up uses hyper.
//! The bench runs on a current-thread runtime by default (`--bench-threads 1`): on a
//! 2-core box its CPU per call is CPU the gateway and the fixture don't get.

/// The report goes to stdout: this is a command-line tool, not the stdio gateway.
macro_rules! outln {
    ($($t:tt)*) => {{ println!($($t)*); }}; // stdout-ok
}

mod rawhttp;

use mcp_gateway_bench::{exit_when_stdin_closes, fixture, remote};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};

const PROTOCOL_VERSION: &str = "2025-06-18";
const SERVER: &str = "fast";

#[derive(Parser, Debug)]
#[command(
    name = "mcp-gateway-bench",
    about = "tools/call round trips: direct stdio vs gateway vs bare HTTP"
)]
struct Args {
    /// Modes to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,gateway,stateless,baseline"
    )]
    mode: Vec<Mode>,
    /// Concurrency levels (requests in flight), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Measured time per case (e.g. 5s, 500ms, 2.5).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    duration: Duration,
    /// Measured calls per case instead of a duration.
    #[arg(long)]
    calls: Option<u64>,
    /// Unmeasured warmup per case.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    warmup: Duration,
    /// Smoke test: 0.5 s per case, 0.1 s warmup.
    #[arg(long)]
    quick: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The gateway binary (gateway mode).
    #[arg(long, default_value = "target/release/mcp-gateway")]
    gateway_bin: PathBuf,
    /// The stdio MCP fixture (a Python script with an `echo` tool).
    #[arg(long, default_value = "tests/fixtures/echo_server.py")]
    fixture: PathBuf,
    /// Extra arguments for the fixture (e.g. --fixture-arg=--name --fixture-arg=fast).
    #[arg(long = "fixture-arg", allow_hyphen_values = true)]
    fixture_args: Vec<String>,
    /// The Python interpreter.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Internal: run the baseline HTTP server (used by `--mode baseline`).
    #[arg(long, hide = true)]
    serve_baseline: bool,
    /// The text each echo call sends.
    #[arg(long, default_value = "hi")]
    text: String,
    /// A call taking longer than this counts as failed.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    call_timeout: Duration,
    /// The full mock fixture (list and startup modes: `--tools`, `--init-delay-ms`).
    #[arg(long, default_value = "tests/fixtures/mock_server.py")]
    mock: PathBuf,
    /// idle-rss: how many stdio servers (the `--fixture`) the gateway runs.
    #[arg(long, default_value_t = 10)]
    idle_servers: usize,
    /// sessions: how many sessions to open.
    #[arg(long, default_value_t = 10_000)]
    sessions: u64,
    /// soak: how many measured calls.
    #[arg(long, default_value_t = 1_000_000)]
    soak_calls: u64,
    /// soak: concurrency.
    #[arg(long, default_value_t = 64)]
    soak_concurrency: usize,
    /// soak: the stated RSS bound, MiB (VmRSS must stay at or below it at every sample).
    #[arg(long, default_value_t = 32.0)]
    soak_bound_mib: f64,
    /// list: how many mock servers.
    #[arg(long, default_value_t = 20)]
    list_servers: usize,
    /// list: `--tools N` for each mock (extra tools on top of its built-in ones).
    #[arg(long, default_value_t = 50)]
    list_tools: usize,
    /// list: how many measured tools/list calls (c=1).
    #[arg(long, default_value_t = 2000)]
    list_calls: u64,
    /// startup: how many mock servers.
    #[arg(long, default_value_t = 20)]
    startup_servers: usize,
    /// startup: each mock's `--init-delay-ms`.
    #[arg(long, default_value_t = 200)]
    init_delay_ms: u64,
    /// startup: which servers. `native` is this binary's own minimal stdio server
    /// (`mcp-gateway-bench fixture`, starts in about a millisecond); `python` is `--mock`
    /// (each a CPython interpreter, which on 2 cores dominates the time).
    #[arg(long, value_enum, default_value = "native")]
    startup_fixture: StartupFixture,
    /// The HTTP client of the measured calls (gateway, baseline, soak): `raw` is a minimal
    /// keep-alive HTTP/1.1 client (one write and usually one read per call, buffers
    /// reused); `hyper` is hyper's `client::conn::http1` (its connection a separate task).
    /// Session set-up always uses hyper.
    #[arg(long, value_enum, default_value = "raw")]
    client: Client,
    /// Threads of the bench's own tokio runtime: 1 is a current-thread runtime (no
    /// cross-thread wakeups: the least bench CPU per call, which on a small box is CPU
    /// the gateway gets), N > 1 a multi-thread runtime with N workers, 0 one worker per CPU.
    #[arg(long, default_value_t = 1)]
    bench_threads: usize,
    /// remote-json, remote-sse: the remote fixture's runtime threads (1: current-thread,
    /// like a single-threaded Node or Python server; 0: one per CPU).
    #[arg(long, default_value_t = 1)]
    remote_threads: usize,
    /// remote-json, remote-sse: the fixture answers each tools/call this many ms late
    /// (a timer, no CPU), so that the server, not this machine's CPU, bounds c=64.
    #[arg(long, default_value_t = 0)]
    remote_delay_ms: u64,
    /// remote-json, remote-sse: each delay is `--remote-delay-ms` ± up to this many ms
    /// (uniform): answers spread over time, as a real server's are.
    #[arg(long, default_value_t = 0)]
    remote_jitter_ms: u64,
    /// `gateway.busy_poll` of every gateway the bench starts (`0s`: off), to measure what
    /// the busy poll does to a figure (default: the gateway's own).
    #[arg(long)]
    busy_poll: Option<String>,
    /// remote-json, remote-sse: `gateway.worker_threads` for the gateway (default: its own
    /// default, half the CPUs).
    #[arg(long)]
    remote_gateway_threads: Option<usize>,
    /// remote-url: the server's Streamable HTTP endpoint (`http://IP:PORT/PATH`).
    #[arg(long)]
    remote_url: Option<String>,
    /// remote-url: the tool to call.
    #[arg(long, default_value = "echo")]
    remote_tool: String,
    /// remote-url: the tool's argument that gets `--text`.
    #[arg(long, default_value = "message")]
    remote_arg: String,
    /// remote-url: the protocol version of the direct client's session (the gateway speaks
    /// 2025-11-25 to its servers unless the server's table pins one).
    #[arg(long, default_value = "2025-11-25")]
    remote_version: String,
    /// remote-url: TOML lines added to the gateway's table of that server
    /// (e.g. `protocol = "handshake"`).
    #[arg(long, default_value = "")]
    remote_server_toml: String,
    /// stateless-ab: pairs of slices (session, stateless) per concurrency level.
    #[arg(long, default_value_t = 6)]
    ab_pairs: usize,
    #[command(flatten)]
    search: mcp_gateway_bench::search::Opts,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Client {
    Raw,
    Hyper,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum StartupFixture {
    Native,
    Python,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Direct,
    Gateway,
    /// The `gateway` fixture and call, sent as a 2026-07-28 client sends it: no session,
    /// the `_meta` envelope and the `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` headers.
    Stateless,
    /// `gateway` and `stateless` through one gateway, in alternating slices (issue #19's
    /// targets on a noisy machine).
    StatelessAb,
    /// The `gateway` case with `[cluster]`: one replica and a real `redis-server` (issue
    /// #16's cost: no Redis round trip on a call without limits).
    Cluster,
    /// `cluster` with a `per_client` limit no call reaches: one Redis round trip per call.
    ClusterLimited,
    Baseline,
    IdleRss,
    Sessions,
    Soak,
    List,
    Startup,
    RemoteJson,
    RemoteSse,
    /// Any running Streamable HTTP server (`--remote-url`), direct against through the gateway.
    RemoteUrl,
    /// Tool search (issue #17), in process: recall on the fixture, search latency and
    /// index rebuild on a 1,000-tool catalog.
    Search,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Gateway => "gateway",
            Mode::Stateless => "stateless",
            Mode::StatelessAb => "stateless-ab",
            Mode::Cluster => "cluster",
            Mode::ClusterLimited => "cluster-limited",
            Mode::Baseline => "baseline",
            Mode::IdleRss => "idle-rss",
            Mode::Sessions => "sessions",
            Mode::Soak => "soak",
            Mode::List => "list",
            Mode::Startup => "startup",
            Mode::RemoteJson => "remote-json",
            Mode::RemoteSse => "remote-sse",
            Mode::RemoteUrl => "remote-url",
            Mode::Search => "search",
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

// ---------------------------------------------------------------- process stats

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// User + system CPU time of a process so far.
fn cpu_time(pid: &str) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// Direct children of a process (needs CONFIG_PROC_CHILDREN; empty otherwise).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// CPU time of the processes whose cost a case's per-call CPU columns show.
#[derive(Clone, Default)]
struct Procs {
    gateway: Option<u32>,
    fixture: Option<u32>,
}

#[derive(Clone, Copy, Default)]
struct CpuSnap {
    bench: Option<Duration>,
    gateway: Option<Duration>,
    fixture: Option<Duration>,
}

impl Procs {
    fn snap(&self) -> CpuSnap {
        CpuSnap {
            bench: cpu_time("self"),
            gateway: self.gateway.and_then(|p| cpu_time(&p.to_string())),
            fixture: self.fixture.and_then(|p| cpu_time(&p.to_string())),
        }
    }
}

// ---------------------------------------------------------------- JSON-RPC helpers

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

fn call_body(id: u64, tool: &str, text: &str) -> Vec<u8> {
    let args = json!({ "text": text });
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#)
        .into_bytes()
}

/// `call_body` is `CALL_HEAD`, the id, then `call_tail` (the raw client writes it so).
const CALL_HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;

fn call_tail(tool: &str, text: &str) -> Vec<u8> {
    call_tail_with(tool, "text", text)
}

/// `call_tail` with the text in argument `key`.
fn call_tail_with(tool: &str, key: &str, text: &str) -> Vec<u8> {
    let tool = serde_json::to_string(tool).unwrap_or_default();
    let tool = &tool[1..tool.len() - 1];
    let args = json!({ key: text });
    format!(r#","method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#).into_bytes()
}

/// The revision a stateless call names, in `_meta` and in `MCP-Protocol-Version`.
const STATELESS_VERSION: &str = "2026-07-28";

/// `call_tail` of a 2026-07-28 call: the same params with the `_meta` envelope.
fn stateless_tail(tool: &str, text: &str) -> Vec<u8> {
    let params = json!({
        "name": tool,
        "arguments": { "text": text },
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": { "name": "mcp-gateway-bench", "version": env!("CARGO_PKG_VERSION") },
        },
    });
    format!(r#","method":"tools/call","params":{params}}}"#).into_bytes()
}

/// The headers a 2026-07-28 client sends with a `tools/call` of `tool`.
fn stateless_headers(tool: &str) -> [(&'static str, &[u8]); 3] {
    [
        ("mcp-protocol-version", STATELESS_VERSION.as_bytes()),
        ("mcp-method", b"tools/call"),
        ("mcp-name", tool.as_bytes()),
    ]
}

fn initialize_body(id: u64) -> Vec<u8> {
    initialize_body_at(id, PROTOCOL_VERSION)
}

/// `initialize` at `version`.
fn initialize_body_at(id: u64, version: &str) -> Vec<u8> {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": { "name": "mcp-gateway-bench", "version": env!("CARGO_PKG_VERSION") },
        },
    })
    .to_string()
    .into_bytes()
}

/// Checks one JSON-RPC answer: a result, the right id (when `id` is given), the echoed
/// text; with `complete`, a 2026-07-28 result (`resultType: "complete"`).
fn check_reply(body: &[u8], id: Option<u64>, expect: &str, complete: bool) -> Result<()> {
    let r: Reply = serde_json::from_slice(body).with_context(|| format!("bad JSON: {}", show(body)))?;
    if let Some(e) = r.error {
        bail!("JSON-RPC error: {}", e.get());
    }
    let Some(result) = r.result else {
        bail!("no result: {}", show(body));
    };
    if let Some(want) = id {
        let got = r.id.map(|v| v.get()).unwrap_or("null");
        if got != want.to_string() {
            bail!("answer for id {got}, expected {want}");
        }
    }
    if !result.get().contains(expect) {
        bail!("result without the echoed text: {}", result.get());
    }
    if complete && !result.get().contains(r#""resultType":"complete""#) {
        bail!(
            "a stateless result without resultType complete: {}",
            show(result.get().as_bytes())
        );
    }
    Ok(())
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > 300 {
        format!("{}…", s.chars().take(300).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// The JSON of an SSE-framed answer: the last `data:` event (progress events come first).
fn sse_last_data(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let mut last = String::new();
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            last = data.join("\n");
        }
    }
    last.into_bytes()
}

// ---------------------------------------------------------------- direct: stdio child

/// Our own id-multiplexed stdio MCP client: one writer task, one reader task.
struct StdioClient {
    lines: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>>,
    child: tokio::sync::Mutex<Child>,
    pid: u32,
}

impl StdioClient {
    /// `quiet`: the child's stderr goes to /dev/null instead of ours.
    async fn spawn(program: &Path, pargs: &[String], quiet: bool) -> Result<Arc<StdioClient>> {
        let mut child = Command::new(program)
            .args(pargs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if quiet { Stdio::null() } else { Stdio::inherit() })
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} {}", program.display(), pargs.join(" ")))?;
        let pid = child.id().context("child has no pid")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::unbounded_channel();
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>> = Arc::default();
        tokio::spawn(write_lines(stdin, rx));
        tokio::spawn(read_lines(stdout, pending.clone()));
        let client = Arc::new(StdioClient {
            lines: tx,
            pending,
            child: tokio::sync::Mutex::new(child),
            pid,
        });
        let init = tokio::time::timeout(Duration::from_secs(30), client.request(0, initialize_body(0)))
            .await
            .context("initialize timed out")??;
        let r: Reply = serde_json::from_slice(&init)?;
        if r.result.is_none() {
            bail!("initialize failed: {}", show(&init));
        }
        client.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec())?;
        Ok(client)
    }

    fn send(&self, mut line: Vec<u8>) -> Result<()> {
        line.push(b'\n');
        self.lines.send(line).map_err(|_| anyhow!("child stdin is closed"))
    }

    async fn request(&self, id: u64, line: Vec<u8>) -> Result<Vec<u8>> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.send(line)?;
        rx.await
            .map_err(|_| anyhow!("child closed stdout with request {id} pending"))
    }

    async fn stop(&self) {
        let mut child = self.child.lock().await;
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

async fn write_lines(stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut w = BufWriter::new(stdin);
    while let Some(line) = rx.recv().await {
        if w.write_all(&line).await.is_err() {
            return;
        }
        while let Ok(more) = rx.try_recv() {
            if w.write_all(&more).await.is_err() {
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

async fn read_lines(stdout: ChildStdout, pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>>) {
    #[derive(Deserialize)]
    struct IdOnly {
        #[serde(default)]
        id: Option<u64>,
    }
    let mut r = BufReader::with_capacity(64 << 10, stdout);
    loop {
        let mut line = Vec::with_capacity(128);
        match r.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(IdOnly { id: Some(id) }) = serde_json::from_slice::<IdOnly>(&line) else {
            continue;
        };
        if let Some(tx) = pending.lock().unwrap().remove(&id) {
            let _ = tx.send(line);
        }
    }
    pending.lock().unwrap().clear();
}

// ---------------------------------------------------------------- HTTP client

#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    path: String,
    host: HeaderValue,
    session: Option<HeaderValue>,
    /// A 2026-07-28 target: no session, and the stateless headers for this tool.
    stateless: Option<String>,
    /// The session's protocol version (`MCP-Protocol-Version` and its `initialize`).
    version: &'static str,
}

async fn connect(addr: SocketAddr) -> Result<http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One POST; returns the status, the session header and the JSON-RPC answer.
async fn post(
    sender: &mut http1::SendRequest<Full<Bytes>>,
    t: &Target,
    body: Vec<u8>,
) -> Result<(StatusCode, Option<HeaderValue>, Vec<u8>)> {
    let mut req = Request::post(t.path.as_str())
        .header(HOST, t.host.clone())
        .header(ACCEPT, "application/json, text/event-stream")
        .header(CONTENT_TYPE, "application/json");
    if let Some(s) = &t.session {
        req = req
            .header("mcp-session-id", s.clone())
            .header("mcp-protocol-version", t.version);
    }
    if let Some(tool) = &t.stateless {
        for (name, value) in stateless_headers(tool) {
            req = req.header(name, value);
        }
    }
    let req = req.body(Full::new(Bytes::from(body)))?;
    sender.ready().await.context("connection closed")?;
    let resp: Response<hyper::body::Incoming> = sender.send_request(req).await?;
    let status = resp.status();
    let sse = resp
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let session = resp.headers().get("mcp-session-id").cloned();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let body = if sse { sse_last_data(&bytes) } else { bytes.to_vec() };
    Ok((status, session, body))
}

// ---------------------------------------------------------------- workers

// One per worker, made once per case: its size costs nothing per call.
#[allow(clippy::large_enum_variant)]
enum Worker {
    Direct {
        client: Arc<StdioClient>,
    },
    Http {
        target: Target,
        conn: HttpConn,
        check_id: bool,
    },
}

/// One worker's HTTP connection.
enum HttpConn {
    Hyper(Option<http1::SendRequest<Full<Bytes>>>),
    /// The raw client and its reused request body.
    Raw {
        conn: Box<rawhttp::Conn>,
        body: Vec<u8>,
    },
}

impl HttpConn {
    /// A connected `client` for `target` (its session, if any, in every request).
    async fn open(client: Client, target: &Target) -> Result<HttpConn> {
        Ok(match client {
            Client::Hyper => HttpConn::Hyper(Some(connect(target.addr).await?)),
            Client::Raw => {
                let mut headers: Vec<(&str, &[u8])> = vec![
                    ("Accept", b"application/json, text/event-stream"),
                    ("Content-Type", b"application/json"),
                ];
                if let Some(s) = &target.session {
                    headers.push(("mcp-session-id", s.as_bytes()));
                    headers.push(("mcp-protocol-version", target.version.as_bytes()));
                }
                if let Some(tool) = &target.stateless {
                    headers.extend(stateless_headers(tool));
                }
                let mut conn = rawhttp::Conn::new(target.addr, &target.path, target.host.as_bytes(), &headers);
                conn.connect().await?;
                HttpConn::Raw {
                    conn: Box::new(conn),
                    body: Vec::with_capacity(256),
                }
            }
        })
    }
}

struct Shared {
    next_id: AtomicU64,
    /// Successful calls so far (warmup included).
    done: AtomicU64,
    tool: String,
    text: String,
    expect: String,
    /// `call_tail(tool, text)` (or `stateless_tail`).
    tail: Vec<u8>,
    /// Stateless calls: each answer must be a 2026-07-28 result.
    stateless: bool,
}

impl Shared {
    fn new(tool: String, text: &str) -> Shared {
        Shared {
            next_id: AtomicU64::new(1),
            done: AtomicU64::new(0),
            tail: call_tail(&tool, text),
            tool,
            text: text.to_owned(),
            expect: expected_text(text),
            stateless: false,
        }
    }

    /// The same call, as a 2026-07-28 client sends it.
    fn stateless(tool: String, text: &str) -> Shared {
        Shared {
            tail: stateless_tail(&tool, text),
            stateless: true,
            ..Shared::new(tool, text)
        }
    }

    /// `call_body(id, tool, text)`, written into `out`.
    fn call_body_into(&self, out: &mut Vec<u8>, id: u64) {
        out.clear();
        out.extend_from_slice(CALL_HEAD);
        rawhttp::push_decimal(out, id);
        out.extend_from_slice(&self.tail);
    }
}

impl Worker {
    async fn call(&mut self, sh: &Shared) -> Result<()> {
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        match self {
            Worker::Direct { client } => {
                let line = client.request(id, call_body(id, &sh.tool, &sh.text)).await?;
                check_reply(&line, Some(id), &sh.expect, false)
            }
            Worker::Http {
                conn: HttpConn::Raw { conn, body },
                check_id,
                ..
            } => {
                sh.call_body_into(body, id);
                let a = conn.post(body).await?;
                let sse_body;
                let answer = if a.sse {
                    sse_body = sse_last_data(a.body);
                    &sse_body[..]
                } else {
                    a.body
                };
                if a.status != 200 {
                    let status =
                        StatusCode::from_u16(a.status).map_or_else(|_| a.status.to_string(), |s| s.to_string());
                    bail!("HTTP {status}: {}", show(answer));
                }
                check_reply(answer, check_id.then_some(id), &sh.expect, sh.stateless)
            }
            Worker::Http {
                target,
                conn: HttpConn::Hyper(sender),
                check_id,
            } => {
                let mut body = Vec::new();
                sh.call_body_into(&mut body, id);
                if sender.is_none() {
                    *sender = Some(connect(target.addr).await?);
                }
                let Some(s) = sender.as_mut() else {
                    bail!("not connected");
                };
                let r = post(s, target, body).await;
                let (status, _, answer) = match r {
                    Ok(r) => r,
                    Err(e) => {
                        *sender = None;
                        return Err(e);
                    }
                };
                if status != StatusCode::OK {
                    bail!("HTTP {status}: {}", show(&answer));
                }
                check_reply(&answer, check_id.then_some(id), &sh.expect, sh.stateless)
            }
        }
    }

    /// After a timeout the connection is mid-request: start over on a new one.
    fn reset(&mut self) {
        match self {
            Worker::Http {
                conn: HttpConn::Hyper(sender),
                ..
            } => *sender = None,
            Worker::Http {
                conn: HttpConn::Raw { conn, .. },
                ..
            } => conn.reset(),
            Worker::Direct { .. } => {}
        }
    }
}

#[derive(Default)]
struct WorkerOut {
    lat_ns: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    last_done: Option<Instant>,
}

struct Plan {
    warm_end: Instant,
    end: Option<Instant>,
    budget: Option<Arc<AtomicU64>>,
    call_timeout: Duration,
}

async fn run_worker(mut w: Worker, sh: Arc<Shared>, plan: Arc<Plan>) -> WorkerOut {
    let mut out = WorkerOut::default();
    loop {
        let t0 = Instant::now();
        let measured = t0 >= plan.warm_end;
        if plan.end.is_some_and(|e| t0 >= e) {
            break;
        }
        if measured {
            if let Some(b) = &plan.budget {
                if b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_err()
                {
                    break;
                }
            }
        }
        let r = match tokio::time::timeout(plan.call_timeout, w.call(&sh)).await {
            Ok(r) => r,
            Err(_) => {
                w.reset();
                Err(anyhow!("no answer within {:?}", plan.call_timeout))
            }
        };
        let done = Instant::now();
        if r.is_ok() {
            sh.done.fetch_add(1, Ordering::Relaxed);
        }
        match r {
            Ok(()) if measured => {
                out.lat_ns
                    .push(u64::try_from((done - t0).as_nanos()).unwrap_or(u64::MAX));
                out.last_done = Some(done);
            }
            Ok(()) => {}
            Err(e) => {
                out.errors += 1;
                if out.first_error.is_none() {
                    out.first_error = Some(format!("{e:#}"));
                }
                if out.errors >= 1000 && out.lat_ns.is_empty() {
                    break; // Nothing works; don't spin.
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------- results

#[derive(Clone, Debug, serde::Serialize)]
struct CaseResult {
    mode: &'static str,
    concurrency: usize,
    calls: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    calls_per_sec: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    max_us: f64,
    mean_us: f64,
    /// CPU time per measured call, in microseconds, of the bench process itself.
    bench_cpu_us_per_call: Option<f64>,
    gateway_cpu_us_per_call: Option<f64>,
    fixture_cpu_us_per_call: Option<f64>,
    /// Gateway `VmRSS` and `VmHWM` after the case, KiB.
    gateway_rss_kib: Option<u64>,
    gateway_hwm_kib: Option<u64>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How long a case runs: a warmup, then a duration or a number of calls.
#[derive(Clone, Copy)]
struct Span {
    warmup: Duration,
    duration: Duration,
    calls: Option<u64>,
    call_timeout: Duration,
}

impl Span {
    fn of(args: &Args) -> Span {
        Span {
            warmup: args.warmup,
            duration: args.duration,
            calls: args.calls,
            call_timeout: args.call_timeout,
        }
    }
}

async fn run_case(
    mode: &'static str,
    concurrency: usize,
    workers: Vec<Worker>,
    sh: Arc<Shared>,
    args: &Args,
    procs: &Procs,
) -> CaseResult {
    run_case_span(mode, concurrency, workers, sh, Span::of(args), procs).await
}

async fn run_case_span(
    mode: &'static str,
    concurrency: usize,
    workers: Vec<Worker>,
    sh: Arc<Shared>,
    span: Span,
    procs: &Procs,
) -> CaseResult {
    let start = Instant::now();
    let warm_end = start + span.warmup;
    let plan = Arc::new(Plan {
        warm_end,
        end: if span.calls.is_some() {
            None
        } else {
            Some(warm_end + span.duration)
        },
        budget: span.calls.map(|n| Arc::new(AtomicU64::new(n))),
        call_timeout: span.call_timeout,
    });
    // Snapshot CPU when the measured window starts.
    let cpu0 = {
        let procs = procs.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(warm_end.into()).await;
            procs.snap()
        })
    };
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(run_worker(w, sh.clone(), plan.clone())))
        .collect();
    let mut lat = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    let mut last = warm_end;
    for t in tasks {
        match t.await {
            Ok(o) => {
                lat.extend_from_slice(&o.lat_ns);
                errors += o.errors;
                if first_error.is_none() {
                    first_error = o.first_error;
                }
                if let Some(d) = o.last_done {
                    last = last.max(d);
                }
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("worker panicked: {e}"));
            }
        }
    }
    let cpu1 = procs.snap();
    let cpu0 = cpu0.await.unwrap_or_default();
    lat.sort_unstable();
    let calls = lat.len() as u64;
    let seconds = last.saturating_duration_since(warm_end).as_secs_f64();
    let us = |ns: u64| ns as f64 / 1000.0;
    let per_call = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) if calls > 0 => Some(b.saturating_sub(a).as_secs_f64() * 1e6 / calls as f64),
        _ => None,
    };
    let rss = procs.gateway.and_then(rss_kib);
    CaseResult {
        mode,
        concurrency,
        calls,
        errors,
        first_error,
        seconds,
        calls_per_sec: if seconds > 0.0 { calls as f64 / seconds } else { 0.0 },
        p50_us: us(percentile(&lat, 50.0)),
        p90_us: us(percentile(&lat, 90.0)),
        p99_us: us(percentile(&lat, 99.0)),
        max_us: us(lat.last().copied().unwrap_or(0)),
        mean_us: if calls > 0 {
            lat.iter().map(|&n| n as f64).sum::<f64>() / calls as f64 / 1000.0
        } else {
            0.0
        },
        bench_cpu_us_per_call: per_call(cpu0.bench, cpu1.bench),
        gateway_cpu_us_per_call: per_call(cpu0.gateway, cpu1.gateway),
        fixture_cpu_us_per_call: per_call(cpu0.fixture, cpu1.fixture),
        gateway_rss_kib: rss.map(|r| r.0),
        gateway_hwm_kib: rss.map(|r| r.1),
    }
}

// ---------------------------------------------------------------- modes

async fn bench_direct(args: &Args, out: &mut Vec<CaseResult>) -> Result<()> {
    let mut pargs = vec![args.fixture.to_string_lossy().into_owned()];
    pargs.extend(args.fixture_args.iter().cloned());
    let client = StdioClient::spawn(Path::new(&args.python), &pargs, false).await?;
    let sh = Arc::new(Shared::new("echo".into(), &args.text));
    let procs = Procs {
        gateway: None,
        fixture: Some(client.pid),
    };
    for &c in &args.concurrency {
        let workers = (0..c).map(|_| Worker::Direct { client: client.clone() }).collect();
        let r = run_case(Mode::Direct.name(), c, workers, sh.clone(), args, &procs).await;
        progress(&r);
        out.push(r);
    }
    client.stop().await;
    Ok(())
}

/// The gateway's idle RSS (after startup and one session), KiB, reported separately.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct GatewayInfo {
    idle_rss_kib: Option<u64>,
    peak_rss_kib: Option<u64>,
    final_rss_kib: Option<u64>,
    warnings: Vec<String>,
    shutdown: String,
}

/// `gateway` or `stateless` mode: the gateway in front of the fixture.
async fn bench_gateway(args: &Args, mode: Mode, out: &mut Vec<CaseResult>) -> Result<GatewayInfo> {
    let dir = std::env::temp_dir().join(format!("mcp-gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let fixture = std::fs::canonicalize(&args.fixture)
        .with_context(|| format!("fixture {} not found", args.fixture.display()))?;
    let mut fargs = vec![toml_str(&fixture.to_string_lossy())];
    fargs.extend(args.fixture_args.iter().map(|a| toml_str(a)));
    let config = format!(
        "{}\n[servers.{SERVER}]\ncommand = {}\nargs = [{}]\n",
        gateway_table(args),
        toml_str(&args.python),
        fargs.join(", ")
    );
    let mut config = config;
    let _redis = match mode {
        Mode::Cluster | Mode::ClusterLimited => {
            let redis = Redis::start(&dir)?;
            config.push_str(&format!(
                "\n[cluster]\nredis = \"{}\"\nkey = \"bench-cluster-key-0123456789abcdef0123456789\"\n",
                redis.url
            ));
            if mode == Mode::ClusterLimited {
                config.push_str("\n[rate_limits]\nper_client = \"1000000/s\"\n");
            }
            Some(redis)
        }
        _ => None,
    };
    let config_path = dir.join("gateway.toml");
    std::fs::write(&config_path, config)?;
    let result = run_gateway(args, mode, &config_path, out).await;
    drop(_redis);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// A `redis-server` on a unix socket in `dir`, for the cluster cases; killed on drop.
struct Redis {
    child: std::process::Child,
    url: String,
}

impl Redis {
    fn start(dir: &Path) -> Result<Redis> {
        let sock = dir.join("redis.sock");
        let child = std::process::Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&sock)
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("redis-server (the cluster cases need it: apt-get install redis-server)")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if Instant::now() > deadline {
                anyhow::bail!("redis-server did not start");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Redis {
            child,
            url: format!("redis+unix://{}", sock.display()),
        })
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

async fn run_gateway(args: &Args, mode: Mode, config: &Path, out: &mut Vec<CaseResult>) -> Result<GatewayInfo> {
    let Spawned {
        mut child,
        pid,
        addr,
        path,
        said,
        drain,
    } = spawn_gateway(args, config).await?;
    let tool = format!("{SERVER}__echo");
    let (target, sh) = match mode {
        Mode::Stateless => checked_stateless(addr, &path, &tool, args).await?,
        // One session for the whole run.
        _ => checked_session(addr, &path, &tool, args).await?,
    };
    // The other half of an interleaved run.
    let stateless = match mode {
        Mode::StatelessAb => Some(checked_stateless(addr, &path, &tool, args).await?),
        _ => None,
    };

    let fixture = children(pid).first().copied();
    let procs = Procs {
        gateway: Some(pid),
        fixture,
    };
    let mut info = GatewayInfo {
        idle_rss_kib: rss_kib(pid).map(|r| r.0),
        ..GatewayInfo::default()
    };
    for &c in &args.concurrency {
        let Some((st_target, st_sh)) = &stateless else {
            let workers = http_workers(args, &target, c, true).await?;
            let r = run_case(mode.name(), c, workers, sh.clone(), args, &procs).await;
            progress(&r);
            out.push(r);
            continue;
        };
        for pair in 0..args.ab_pairs {
            let halves = [(AB_SESSION, &target, &sh), (AB_STATELESS, st_target, st_sh)];
            // The order swaps every pair, so a drifting machine favours neither half.
            let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let (name, t, s) = halves[i];
                let workers = http_workers(args, t, c, true).await?;
                let r = run_case(name, c, workers, s.clone(), args, &procs).await;
                progress(&r);
                out.push(r);
            }
        }
    }
    if let Some((rss, hwm)) = rss_kib(pid) {
        info.final_rss_kib = Some(rss);
        info.peak_rss_kib = Some(hwm);
    }

    // Graceful stop: SIGTERM, then wait (drain_delay = "0s": no balancer to drain from,
    // so the time is the shutdown's own).
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let t0 = Instant::now();
    info.shutdown = match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
        Ok(Ok(st)) => format!(
            "exited after SIGTERM in {:.0} ms ({st})",
            t0.elapsed().as_secs_f64() * 1e3
        ),
        Ok(Err(e)) => format!("wait failed: {e}"),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            "did not exit within 20 s of SIGTERM; killed".to_owned()
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    info.warnings = said.lock().unwrap().clone();
    Ok(info)
}

/// The two halves of a `stateless-ab` run, as their results are named.
const AB_SESSION: &str = "ab-session";
const AB_STATELESS: &str = "ab-stateless";

/// `c` workers, each on a keep-alive connection of its own to `target` (`check_id`: each
/// answer must carry its request's id).
async fn http_workers(args: &Args, target: &Target, c: usize, check_id: bool) -> Result<Vec<Worker>> {
    let mut workers = Vec::with_capacity(c);
    for _ in 0..c {
        workers.push(Worker::Http {
            conn: HttpConn::open(args.client, target).await?,
            target: target.clone(),
            check_id,
        });
    }
    Ok(workers)
}

/// The echoed text as it appears inside the JSON result (escaped).
fn expected_text(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted[1..quoted.len() - 1].to_owned()
}

/// The baseline server: a bare hyper HTTP/1.1 server answering fixed JSON-RPC bytes
/// to every request. Runs as a separate process (this binary with `--serve-baseline`)
/// on a default multi-thread runtime, like the gateway.
async fn serve_baseline(text: &str) -> Result<()> {
    let answer = Bytes::from(
        json!({
            "jsonrpc": "2.0",
            "id": 1,
            "result": { "content": [{ "type": "text", "text": text }] },
        })
        .to_string(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    eprintln!("baseline listening on http://{}/mcp", listener.local_addr()?);
    exit_when_stdin_closes();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let answer = answer.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = answer.clone();
                async move {
                    let _ = req.into_body().collect().await;
                    let mut resp = Response::new(Full::new(answer));
                    resp.headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Spawns a child that prints `PREFIX http://ADDR/PATH` on stderr when ready; returns
/// the child, its address and path, and the rest of its stderr.
/// A gateway started on `config` and listening.
struct Spawned {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    path: String,
    /// Its first 50 stderr lines.
    said: Arc<Mutex<Vec<String>>>,
    /// Ends when its stderr does.
    drain: tokio::task::JoinHandle<()>,
}

/// Starts the gateway on `config` (port 0, warnings only) and keeps draining its stderr,
/// so it never blocks on it, keeping what it says.
async fn spawn_gateway(args: &Args, config: &Path) -> Result<Spawned> {
    let mut cmd = Command::new(&args.gateway_bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("MCP_GATEWAY_LOG", "warn");
    let (child, addr, path, mut stderr) = spawn_listening(cmd, "mcp-gateway listening on ")
        .await
        .with_context(|| format!("gateway {}", args.gateway_bin.display()))?;
    let pid = child.id().context("gateway has no pid")?;
    let said: Arc<Mutex<Vec<String>>> = Arc::default();
    let drain = {
        let said = said.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                let mut s = said.lock().unwrap();
                if s.len() < 50 {
                    s.push(line);
                }
            }
        })
    };
    Ok(Spawned {
        child,
        pid,
        addr,
        path,
        said,
        drain,
    })
}

async fn spawn_listening(
    mut cmd: Command,
    prefix: &str,
) -> Result<(
    Child,
    SocketAddr,
    String,
    tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
)> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.as_std().get_program()))?;
    let mut stderr = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await? {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok(rest.to_owned());
            }
            eprintln!("child: {line}");
        }
        bail!("exited before listening")
    })
    .await
    .context("did not start listening within 60 s")??;
    let url = url.strip_prefix("http://").unwrap_or(&url);
    let (hostport, path) = url.split_once('/').unwrap_or((url, ""));
    let addr: SocketAddr = hostport
        .parse()
        .with_context(|| format!("bad listen address {hostport}"))?;
    Ok((child, addr, format!("/{path}"), stderr))
}

async fn bench_baseline(args: &Args, out: &mut Vec<CaseResult>) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--serve-baseline").arg("--text").arg(&args.text);
    let (mut child, addr, path, _stderr) = spawn_listening(cmd, "baseline listening on ").await?;
    let procs = Procs {
        gateway: None,
        fixture: child.id(),
    };
    let target = Target {
        addr,
        path,
        host: HeaderValue::from_str(&addr.to_string())?,
        session: Some(HeaderValue::from_static("0123456789abcdef0123456789abcdef")),
        stateless: None,
        version: PROTOCOL_VERSION,
    };
    let sh = Arc::new(Shared::new(format!("{SERVER}__echo"), &args.text));
    for &c in &args.concurrency {
        // The baseline answers fixed bytes: no ids to check.
        let workers = http_workers(args, &target, c, false).await?;
        let r = run_case(Mode::Baseline.name(), c, workers, sh.clone(), args, &procs).await;
        progress(&r);
        out.push(r);
    }
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    Ok(())
}

fn progress(r: &CaseResult) {
    eprintln!(
        "  {:<12} c={:<4} {:>9.0} calls/s  p50 {:>8.1} us  p99 {:>8.1} us  errors {}",
        r.mode, r.concurrency, r.calls_per_sec, r.p50_us, r.p99_us, r.errors
    );
}

// ---------------------------------------------------------------- target cases

/// One line of the targets table: what the issue asks, what was measured, PASS/FAIL.
#[derive(Clone, Debug, serde::Serialize)]
struct TargetRow {
    target: String,
    goal: String,
    measured: String,
    pass: bool,
}

/// Set by `--quick`: a smoke run's figures (often of a debug build) are not judged.
static QUICK: AtomicBool = AtomicBool::new(false);

fn verdict(pass: bool) -> &'static str {
    match (QUICK.load(Ordering::Relaxed), pass) {
        (true, _) => "not judged (--quick)",
        (false, true) => "PASS",
        (false, false) => "FAIL",
    }
}

fn target_row(out: &mut Vec<TargetRow>, target: &str, goal: &str, measured: String, pass: bool) {
    eprintln!("  TARGET {target}: {measured} (target {goal}): {}", verdict(pass));
    out.push(TargetRow {
        target: target.to_owned(),
        goal: goal.to_owned(),
        measured,
        pass,
    });
}

const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// `initialize` + `notifications/initialized` on an open connection; the session's target.
async fn init_session(s: &mut http1::SendRequest<Full<Bytes>>, base: &Target) -> Result<Target> {
    let mut target = base.clone();
    target.session = None;
    let (status, sid, body) = post(s, &target, initialize_body_at(0, target.version)).await?;
    if status != StatusCode::OK {
        bail!("initialize: HTTP {status}: {}", show(&body));
    }
    target.session = Some(sid.context("initialize answered without mcp-session-id")?);
    let (status, _, _) = post(s, &target, INITIALIZED.to_vec()).await?;
    if status != StatusCode::ACCEPTED {
        bail!("notifications/initialized: HTTP {status}");
    }
    Ok(target)
}

/// A new connection and a new session on it.
/// Opens one session and makes one checked call on it, so a broken setup fails loudly
/// before any timing; returns the session's target and the shared call state.
async fn checked_session(addr: SocketAddr, path: &str, tool: &str, args: &Args) -> Result<(Target, Arc<Shared>)> {
    let (target, s) = open_session(addr, path).await?;
    let sh = Arc::new(Shared::new(tool.to_owned(), &args.text));
    let mut probe = Worker::Http {
        target: target.clone(),
        conn: HttpConn::Hyper(Some(s)),
        check_id: true,
    };
    probe.call(&sh).await.context("first tools/call through the gateway")?;
    Ok((target, sh))
}

/// The stateless target (no session) and one checked 2026-07-28 call, as
/// [`checked_session`] does for a session.
async fn checked_stateless(addr: SocketAddr, path: &str, tool: &str, args: &Args) -> Result<(Target, Arc<Shared>)> {
    let target = Target {
        addr,
        path: path.to_owned(),
        host: HeaderValue::from_str(&addr.to_string())?,
        session: None,
        stateless: Some(tool.to_owned()),
        version: PROTOCOL_VERSION,
    };
    let sh = Arc::new(Shared::stateless(tool.to_owned(), &args.text));
    let mut probe = Worker::Http {
        target: target.clone(),
        conn: HttpConn::Hyper(Some(connect(addr).await?)),
        check_id: true,
    };
    probe
        .call(&sh)
        .await
        .context("first stateless tools/call through the gateway")?;
    Ok((target, sh))
}

async fn open_session(addr: SocketAddr, path: &str) -> Result<(Target, http1::SendRequest<Full<Bytes>>)> {
    open_session_at(addr, path, PROTOCOL_VERSION).await
}

/// [`open_session`] at protocol `version`.
async fn open_session_at(
    addr: SocketAddr,
    path: &str,
    version: &'static str,
) -> Result<(Target, http1::SendRequest<Full<Bytes>>)> {
    let base = Target {
        addr,
        path: path.to_owned(),
        host: HeaderValue::from_str(&addr.to_string())?,
        session: None,
        stateless: None,
        version,
    };
    let mut s = connect(addr).await?;
    let target = init_session(&mut s, &base).await?;
    Ok((target, s))
}

/// One server entry of a generated gateway.toml: `command` with `args`.
struct Spec {
    name: String,
    command: PathBuf,
    args: Vec<String>,
}

impl Spec {
    /// A Python fixture: the interpreter runs the script (made absolute) with `extra`.
    fn python(args: &Args, name: String, script: &Path, extra: &[String]) -> Result<Spec> {
        let script =
            std::fs::canonicalize(script).with_context(|| format!("fixture {} not found", script.display()))?;
        let mut a = vec![script.to_string_lossy().into_owned()];
        a.extend(extra.iter().cloned());
        Ok(Spec {
            name,
            command: PathBuf::from(&args.python),
            args: a,
        })
    }

    /// This binary's own native fixture (`mcp-gateway-bench fixture …`).
    fn native(name: String, extra: &[String]) -> Result<Spec> {
        let exe = std::env::current_exe().context("cannot find the bench binary for its native fixture")?;
        let mut a = vec!["fixture".to_owned(), "--name".to_owned(), name.clone()];
        a.extend(extra.iter().cloned());
        Ok(Spec {
            name,
            command: exe,
            args: a,
        })
    }
}

/// A gateway started for one target case, with its own config directory.
struct Gw {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    path: String,
    dir: PathBuf,
    said: Arc<Mutex<Vec<String>>>,
}

/// `extra`: more `[gateway]` lines (e.g. `max_sessions = 20000\n`).
async fn start_gateway(args: &Args, tag: &str, servers: &[Spec], extra: &str) -> Result<Gw> {
    let mut tables = String::new();
    for s in servers {
        let fargs: Vec<String> = s.args.iter().map(|a| toml_str(a)).collect();
        tables.push_str(&format!(
            "\n[servers.{}]\ncommand = {}\nargs = [{}]\n",
            s.name,
            toml_str(&s.command.to_string_lossy()),
            fargs.join(", ")
        ));
    }
    start_gateway_toml(args, tag, &tables, extra).await
}

/// The `[gateway]` table every gateway the bench starts has (`--busy-poll` included).
fn gateway_table(args: &Args) -> String {
    let mut t = String::from(
        "[gateway]\nlisten = \"127.0.0.1:0\"\npath = \"/mcp\"\nseparator = \"__\"\nrequest_timeout = \"60s\"\ndrain_delay = \"0s\"\n",
    );
    if let Some(d) = &args.busy_poll {
        t.push_str(&format!("busy_poll = {}\n", toml_str(d)));
    }
    t
}

/// A gateway with these `[servers.*]` tables (TOML text) and `extra` `[gateway]` lines.
async fn start_gateway_toml(args: &Args, tag: &str, servers: &str, extra: &str) -> Result<Gw> {
    let dir = std::env::temp_dir().join(format!("mcp-gateway-bench-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut config = gateway_table(args);
    config.push_str(extra);
    config.push_str(servers);
    let config_path = dir.join("gateway.toml");
    std::fs::write(&config_path, config)?;
    let Spawned {
        child,
        pid,
        addr,
        path,
        said,
        ..
    } = spawn_gateway(args, &config_path).await?;
    Ok(Gw {
        child,
        pid,
        addr,
        path,
        dir,
        said,
    })
}

impl Gw {
    fn rss(&self) -> Option<u64> {
        rss_kib(self.pid).map(|r| r.0)
    }

    async fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        for w in self.said.lock().unwrap().iter() {
            eprintln!("  gateway said: {w}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn echo_specs(args: &Args, n: usize) -> Result<Vec<Spec>> {
    (0..n)
        .map(|i| {
            let name = if n == 1 { SERVER.to_owned() } else { format!("s{i:02}") };
            Spec::python(args, name, &args.fixture, &args.fixture_args)
        })
        .collect()
}

/// `n` servers `s00`…: the Python mock (`--mock`), or with `native` this binary's fixture.
/// `extra` are arguments both understand (`--tools`, `--init-delay-ms`).
fn mock_specs(args: &Args, n: usize, extra: &[String], native: bool) -> Result<Vec<Spec>> {
    (0..n)
        .map(|i| {
            let name = format!("s{i:02}");
            if native {
                Spec::native(name, extra)
            } else {
                let mut a = vec!["--name".to_owned(), name.clone()];
                a.extend(extra.iter().cloned());
                Spec::python(args, name, &args.mock, &a)
            }
        })
        .collect()
}

/// The tool names of a `tools/list` answer (an error if it is not a result).
fn tool_names(body: &[u8]) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Tool {
        name: String,
    }
    #[derive(Deserialize)]
    struct Tools {
        tools: Vec<Tool>,
    }
    #[derive(Deserialize)]
    struct ListReply {
        result: Option<Tools>,
    }
    let r: ListReply = serde_json::from_slice(body).with_context(|| format!("bad tools/list: {}", show(body)))?;
    let r = r.result.with_context(|| format!("tools/list failed: {}", show(body)))?;
    Ok(r.tools.into_iter().map(|t| t.name).collect())
}

/// Complete: every server `s00`… is present, each with the same number of tools.
fn complete(names: &[String], servers: usize) -> bool {
    let mut per = vec![0usize; servers];
    for n in names {
        if let Some(i) = n
            .strip_prefix('s')
            .and_then(|r| r.split_once("__"))
            .and_then(|(i, _)| i.parse::<usize>().ok())
        {
            if i < servers {
                per[i] += 1;
            }
        }
    }
    per[0] > 0 && per.iter().all(|&c| c == per[0])
}

fn list_body(id: u64) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#).into_bytes()
}

/// idle-rss: the gateway with N stdio servers, one session and one call, then idle.
async fn bench_idle_rss(args: &Args, targets: &mut Vec<TargetRow>) -> Result<()> {
    let n = args.idle_servers;
    let gw = start_gateway(args, "idle", &echo_specs(args, n)?, "").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = gw.rss();
    let (target, s) = open_session(gw.addr, &gw.path).await?;
    let sh = Shared::new(
        if n == 1 {
            format!("{SERVER}__echo")
        } else {
            "s00__echo".to_owned()
        },
        &args.text,
    );
    let mut w = Worker::Http {
        target,
        conn: HttpConn::Hyper(Some(s)),
        check_id: true,
    };
    w.call(&sh).await.context("tools/call through the gateway")?;
    if let Worker::Http {
        target,
        conn: HttpConn::Hyper(Some(s)),
        ..
    } = &mut w
    {
        let (_, _, body) = post(s, target, list_body(99)).await?;
        let names = tool_names(&body)?;
        if !complete(&names, n) {
            bail!("tools/list is missing servers: {} tools", names.len());
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = gw.rss().context("no /proc status for the gateway")?;
    eprintln!(
        "  idle-rss: {n} stdio servers: VmRSS {:.1} MiB after startup, {:.1} MiB idle after one session, a call and a tools/list",
        mib(started.unwrap_or(0)),
        mib(idle)
    );
    target_row(
        targets,
        &format!("idle RSS, {n} stdio servers"),
        "≤ 15 MiB",
        format!("{:.1} MiB", mib(idle)),
        mib(idle) <= 15.0,
    );
    drop(w);
    gw.stop().await;
    Ok(())
}

/// sessions: open N sessions (initialize + initialized each), RSS growth per session.
async fn bench_sessions(args: &Args, targets: &mut Vec<TargetRow>) -> Result<()> {
    let n = args.sessions;
    let gw = start_gateway(
        args,
        "sessions",
        &echo_specs(args, 1)?,
        // Every session is from this one address: its share is the whole gateway.
        &format!("max_sessions = {0}\nmax_sessions_per_client = {0}\n", n + 1000),
    )
    .await?;
    // Warm the allocator and the session map's first buckets.
    let (base, mut s) = open_session(gw.addr, &gw.path).await?;
    for _ in 0..20 {
        init_session(&mut s, &base).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = gw.rss().context("no /proc status for the gateway")?;
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let conns = 16;
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let next = next.clone();
        let base = base.clone();
        let mut s = connect(gw.addr).await?;
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                init_session(&mut s, &base).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = gw.rss().context("no /proc status for the gateway")?;
    // The gateway's own count, from /status.
    let mut st = connect(gw.addr).await?;
    let req = Request::get("/status")
        .header(HOST, base.host.clone())
        .body(Full::new(Bytes::new()))?;
    let resp = st.send_request(req).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    let open = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["sessions"].as_u64())
        .unwrap_or(0);
    let per = after.saturating_sub(before) as f64 / n as f64;
    eprintln!(
        "  sessions: opened {n} in {:.2} s; gateway reports {open} open; VmRSS {:.1} → {:.1} MiB",
        took.as_secs_f64(),
        mib(before),
        mib(after)
    );
    if open < n {
        bail!("the gateway reports {open} sessions, expected at least {n}");
    }
    target_row(
        targets,
        &format!("RSS per idle session ({n} open)"),
        "≤ 30 KiB",
        format!("{per:.2} KiB"),
        per <= 30.0,
    );
    gw.stop().await;
    Ok(())
}

/// soak: many calls at high concurrency; RSS sampled every 10 % of the calls.
async fn bench_soak(args: &Args, out: &mut Vec<CaseResult>, targets: &mut Vec<TargetRow>) -> Result<()> {
    let total = args.soak_calls;
    let c = args.soak_concurrency;
    let gw = start_gateway(args, "soak", &echo_specs(args, 1)?, "").await?;
    let (target, sh) = checked_session(gw.addr, &gw.path, &format!("{SERVER}__echo"), args).await?;
    let start_done = sh.done.load(Ordering::Relaxed);
    let mut samples: Vec<(u64, u64)> = vec![(0, gw.rss().unwrap_or(0))];
    let workers = http_workers(args, &target, c, true).await?;
    let procs = Procs {
        gateway: Some(gw.pid),
        fixture: children(gw.pid).first().copied(),
    };
    let span = Span {
        warmup: Duration::ZERO,
        duration: Duration::ZERO,
        calls: Some(total),
        call_timeout: args.call_timeout,
    };
    let step = (total / 10).max(1);
    let sampler = async {
        let mut mark = step;
        let mut got = Vec::new();
        while mark <= total {
            let d = sh.done.load(Ordering::Relaxed) - start_done;
            if d >= mark {
                got.push((d, rss_kib(gw.pid).map_or(0, |r| r.0)));
                mark += step;
            } else {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        got
    };
    let run = run_case_span(Mode::Soak.name(), c, workers, sh.clone(), span, &procs);
    let (r, got) = tokio::join!(run, async {
        tokio::time::timeout(Duration::from_secs(3600), sampler)
            .await
            .unwrap_or_default()
    });
    samples.extend(got);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = gw.rss().unwrap_or(0);
    progress(&r);
    for (calls, rss) in &samples {
        eprintln!("    after {calls:>9} calls: VmRSS {:.1} MiB", mib(*rss));
    }
    let hwm = rss_kib(gw.pid).map_or(0, |r| r.1);
    eprintln!(
        "  soak: {} calls, {} errors; VmRSS 0.5 s after the load {:.1} MiB; VmHWM {:.1} MiB",
        r.calls,
        r.errors,
        mib(settled),
        mib(hwm)
    );
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    // Plateau: the second half of the run grows no more than 1 MiB over the first half's peak.
    let half = samples.len() / 2;
    let first = samples[1..=half.max(1).min(samples.len() - 1)]
        .iter()
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    let second = samples[half..].iter().map(|s| s.1).max().unwrap_or(0);
    let growth = second.saturating_sub(first);
    let ok = r.errors == 0 && r.calls >= total && mib(max) <= args.soak_bound_mib && growth <= 1024;
    target_row(
        targets,
        &format!("RSS bounded under load ({} calls, c={c})", r.calls),
        &format!(
            "VmRSS ≤ {:.0} MiB at every sample; second half ≤ first half + 1 MiB",
            args.soak_bound_mib
        ),
        format!(
            "max {:.1} MiB; second half {:+.2} MiB; HWM {:.1} MiB; {:.0} calls/s, p99 {:.0} us",
            mib(max),
            growth as f64 / 1024.0,
            mib(hwm),
            r.calls_per_sec,
            r.p99_us
        ),
        ok,
    );
    out.push(r);
    gw.stop().await;
    Ok(())
}

/// list: a merged tools/list of many mock servers' tools, from the catalog, at c=1.
async fn bench_list(args: &Args, targets: &mut Vec<TargetRow>) -> Result<()> {
    let n = args.list_servers;
    let extra = vec!["--tools".to_owned(), args.list_tools.to_string()];
    let gw = start_gateway(args, "list", &mock_specs(args, n, &extra, false)?, "").await?;
    let (target, mut s) = open_session(gw.addr, &gw.path).await?;
    let (_, _, body) = post(&mut s, &target, list_body(1)).await?;
    let names = tool_names(&body)?;
    if !complete(&names, n) {
        bail!("tools/list is incomplete: {} tools", names.len());
    }
    let want = names.len();
    for i in 0..100 {
        post(&mut s, &target, list_body(2 + i)).await?;
    }
    let mut lat = Vec::with_capacity(args.list_calls as usize);
    let mut last = Vec::new();
    for i in 0..args.list_calls {
        let body = list_body(1000 + i);
        let t0 = Instant::now();
        let (status, _, answer) = post(&mut s, &target, body).await?;
        lat.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        if status != StatusCode::OK {
            bail!("tools/list: HTTP {status}");
        }
        last = answer;
    }
    let got = tool_names(&last)?.len();
    if got != want {
        bail!("tools/list changed size: {got} tools, first {want}");
    }
    lat.sort_unstable();
    let p50 = percentile(&lat, 50.0) as f64 / 1000.0;
    let p99 = percentile(&lat, 99.0) as f64 / 1000.0;
    eprintln!(
        "  list: {want} tools ({n} servers), {} bytes per answer; {} calls at c=1: p50 {p50:.0} us, p99 {p99:.0} us",
        last.len(),
        lat.len()
    );
    target_row(
        targets,
        &format!("tools/list of {want} tools from cache, p50"),
        "≤ 1 ms",
        format!("p50 {p50:.0} us (p99 {p99:.0} us)"),
        p50 <= 1000.0 && want >= 1000,
    );
    gw.stop().await;
    Ok(())
}

/// search: `mcp-gateway-search-bench` (beside this binary), which runs the gateway's tool
/// search in process with the gateway's allocator; its target rows join ours.
fn bench_search(args: &Args, targets: &mut Vec<TargetRow>) -> Result<()> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("mcp-gateway-search-bench");
    let o = &args.search;
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--json")
        .arg("--search-fixture")
        .arg(&o.search_fixture)
        .arg(format!("--search-rounds={}", o.search_rounds))
        .arg(format!("--search-rebuilds={}", o.search_rebuilds));
    if o.search_misses {
        cmd.arg("--search-misses");
    }
    if o.tuned_only {
        cmd.arg("--tuned-only");
    }
    if o.no_fresh {
        cmd.arg("--no-fresh");
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", bin.display(), out.status);
    }
    let rows: Vec<mcp_gateway_bench::search::Row> = serde_json::from_slice(&out.stdout)?;
    for r in rows {
        targets.push(TargetRow {
            target: r.target,
            goal: r.goal,
            measured: r.measured,
            pass: r.pass,
        });
    }
    Ok(())
}

/// startup: time from spawning the gateway to the first complete tools/list.
async fn bench_startup(args: &Args, targets: &mut Vec<TargetRow>) -> Result<()> {
    let n = args.startup_servers;
    let extra = vec!["--init-delay-ms".to_owned(), args.init_delay_ms.to_string()];
    // The floor: the same fixtures spawned and initialized directly, all at once.
    let native = args.startup_fixture == StartupFixture::Native;
    let kind = if native { "native" } else { "Python" };
    let specs = mock_specs(args, n, &extra, native)?;
    let t0 = Instant::now();
    let clients =
        futures::future::try_join_all(specs.iter().map(|s| StdioClient::spawn(&s.command, &s.args, true))).await?;
    let floor = t0.elapsed();
    for c in clients {
        c.stop().await;
    }

    let t0 = Instant::now();
    let gw = start_gateway(args, "startup", &specs, "").await?;
    let listening = t0.elapsed();
    let mut tries = 0;
    let first = loop {
        tries += 1;
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("no complete tools/list within 60 s");
        }
        let attempt = async {
            let (target, mut s) = open_session(gw.addr, &gw.path).await?;
            let (_, _, body) = post(&mut s, &target, list_body(1)).await?;
            tool_names(&body)
        };
        match attempt.await {
            Ok(names) if complete(&names, n) => break (t0.elapsed(), names.len()),
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "  startup: {n} {kind} servers × {} ms init: listening after {:.0} ms, first complete tools/list ({} tools, try {tries}) after {:.0} ms; floor (the fixtures alone, spawned and initialized in parallel): {:.0} ms",
        args.init_delay_ms,
        ms(listening),
        first.1,
        ms(first.0),
        ms(floor)
    );
    target_row(
        targets,
        &format!(
            "startup, {n} {kind} servers × {} ms init → first complete tools/list",
            args.init_delay_ms
        ),
        "≤ 300 ms",
        format!(
            "{:.0} ms (the fixtures alone: {:.0} ms; gateway adds {:.0} ms)",
            ms(first.0),
            ms(floor),
            ms(first.0) - ms(floor)
        ),
        ms(first.0) <= 300.0,
    );
    gw.stop().await;
    Ok(())
}

/// remote-json / remote-sse: the bench's client straight to the remote fixture
/// (`remote-fixture`, JSON or SSE answers) over HTTP with a session, against the same
/// calls through the gateway configured with `url = …` to that same fixture. The two
/// alternate per concurrency level, on one fixture process.
async fn bench_remote(args: &Args, sse: bool, out: &mut Vec<CaseResult>, targets: &mut Vec<TargetRow>) -> Result<()> {
    let (kind, dname, gname) = if sse {
        ("SSE", "sse-direct", "sse-gateway")
    } else {
        ("JSON", "json-direct", "json-gateway")
    };
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("remote-fixture")
        .arg("--threads")
        .arg(args.remote_threads.to_string())
        .arg("--delay-ms")
        .arg(args.remote_delay_ms.to_string())
        .arg("--jitter-ms")
        .arg(args.remote_jitter_ms.to_string());
    if sse {
        cmd.arg("--sse");
    }
    let (mut fix, faddr, fpath, _stderr) = spawn_listening(cmd, "remote fixture listening on ").await?;
    let url = format!("http://{faddr}{fpath}");
    let servers = format!("\n[servers.{SERVER}]\nurl = {}\ntimeout = \"60s\"\n", toml_str(&url));
    let extra = args
        .remote_gateway_threads
        .map_or_else(String::new, |n| format!("worker_threads = {n}\n"));
    let gw = start_gateway_toml(args, &format!("remote-{}", kind.to_lowercase()), &servers, &extra).await?;
    let direct = checked_session(faddr, &fpath, "echo", args).await?;
    let through = checked_session(gw.addr, &gw.path, &format!("{SERVER}__echo"), args).await?;
    let dprocs = Procs {
        gateway: None,
        fixture: fix.id(),
    };
    let gprocs = Procs {
        gateway: Some(gw.pid),
        fixture: fix.id(),
    };
    for &c in &args.concurrency {
        for (name, (target, sh), procs) in [(dname, &direct, &dprocs), (gname, &through, &gprocs)] {
            let workers = http_workers(args, target, c, true).await?;
            let before = fixture_connections(faddr).await?;
            let r = run_case(name, c, workers, sh.clone(), args, procs).await;
            let after = fixture_connections(faddr).await?;
            progress(&r);
            if name == gname {
                // The stats request itself is one connection.
                eprintln!(
                    "    connections the gateway opened to the fixture during the case: {}",
                    after.saturating_sub(before + 1)
                );
            }
            out.push(r);
        }
    }
    remote_targets(out, targets, &format!("remote {kind} server"), dname, gname);
    gw.stop().await;
    drop(fix.stdin.take());
    if tokio::time::timeout(Duration::from_secs(5), fix.wait()).await.is_err() {
        let _ = fix.start_kill();
        let _ = fix.wait().await;
    }
    Ok(())
}

/// Issue #20's two targets for a remote server `what`, from its direct and gateway cases:
/// added p50 at c=1 ≤ 100 µs, throughput at c=64 ≥ 0.9× direct.
fn remote_targets(out: &[CaseResult], targets: &mut Vec<TargetRow>, what: &str, dname: &str, gname: &str) {
    if let (Some(d), Some(g)) = (find(out, dname, 1), find(out, gname, 1)) {
        let added = g.p50_us - d.p50_us;
        target_row(
            targets,
            &format!("{what}, tools/call c=1: added p50 (gateway − direct)"),
            "≤ 100 us",
            format!("{added:.1} us ({:.1} − {:.1})", g.p50_us, d.p50_us),
            added <= 100.0,
        );
    }
    if let (Some(d), Some(g)) = (find(out, dname, 64), find(out, gname, 64)) {
        let ratio = per(g.calls_per_sec, d.calls_per_sec);
        target_row(
            targets,
            &format!("{what}, tools/call c=64, one session: gateway / direct throughput"),
            "≥ 0.9×",
            format!("{ratio:.2}× ({:.0} / {:.0} calls/s)", g.calls_per_sec, d.calls_per_sec),
            ratio >= 0.9,
        );
    }
}

/// remote-url: the bench's client straight to `--remote-url` with a session of its own
/// (at `--remote-version`), against the same calls through the gateway configured with
/// `url = …` to that server; the two alternate per concurrency level.
async fn bench_remote_url(args: &Args, out: &mut Vec<CaseResult>, targets: &mut Vec<TargetRow>) -> Result<()> {
    let url = args.remote_url.as_deref().context("remote-url needs --remote-url")?;
    let rest = url
        .strip_prefix("http://")
        .context("--remote-url must be http://IP:PORT/PATH")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr: SocketAddr = tokio::net::lookup_host(authority)
        .await
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to nothing"))?;
    let path = if path.is_empty() { "/" } else { path };
    let servers = format!(
        "\n[servers.{SERVER}]\nurl = {}\ntimeout = \"60s\"\n{}\n",
        toml_str(url),
        args.remote_server_toml
    );
    let extra = args
        .remote_gateway_threads
        .map_or_else(String::new, |n| format!("worker_threads = {n}\n"));
    let gw = start_gateway_toml(args, "remote-url", &servers, &extra).await?;
    let shared = |tool: String| {
        Arc::new(Shared {
            tail: call_tail_with(&tool, &args.remote_arg, &args.text),
            ..Shared::new(tool, &args.text)
        })
    };
    let direct = {
        // Once per run: the version lives as long as the targets that name it.
        let version: &'static str = Box::leak(args.remote_version.clone().into_boxed_str());
        let (target, s) = open_session_at(addr, path, version).await?;
        let sh = shared(args.remote_tool.clone());
        let mut probe = Worker::Http {
            target: target.clone(),
            conn: HttpConn::Hyper(Some(s)),
            check_id: true,
        };
        probe
            .call(&sh)
            .await
            .context("first tools/call straight to the server")?;
        (target, sh)
    };
    let through = {
        let (target, s) = open_session(gw.addr, &gw.path).await?;
        let sh = shared(format!("{SERVER}__{}", args.remote_tool));
        let mut probe = Worker::Http {
            target: target.clone(),
            conn: HttpConn::Hyper(Some(s)),
            check_id: true,
        };
        probe.call(&sh).await.context("first tools/call through the gateway")?;
        (target, sh)
    };
    let dprocs = Procs {
        gateway: None,
        fixture: None,
    };
    let gprocs = Procs {
        gateway: Some(gw.pid),
        fixture: None,
    };
    for &c in &args.concurrency {
        for (name, (target, sh), procs) in [("url-direct", &direct, &dprocs), ("url-gateway", &through, &gprocs)] {
            let workers = http_workers(args, target, c, true).await?;
            let r = run_case(name, c, workers, sh.clone(), args, procs).await;
            progress(&r);
            out.push(r);
        }
    }
    remote_targets(out, targets, &format!("server at {url}"), "url-direct", "url-gateway");
    gw.stop().await;
    Ok(())
}

/// Connections the remote fixture has accepted so far (`GET /stats`, itself one more).
async fn fixture_connections(addr: SocketAddr) -> Result<u64> {
    let mut s = connect(addr).await?;
    let req = Request::get("/stats")
        .header(HOST, HeaderValue::from_str(&addr.to_string())?)
        .body(Full::new(Bytes::new()))?;
    let resp = s.send_request(req).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["connections"].as_u64())
        .context("bad /stats from the remote fixture")
}

/// `a / b`, 0 when `b` is.
fn per(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The throughput and latency targets, from the direct and gateway cases of this run.
fn call_targets(rs: &[CaseResult], targets: &mut Vec<TargetRow>) {
    if let (Some(d), Some(g)) = (find(rs, "direct", 64), find(rs, "gateway", 64)) {
        let ratio = per(g.calls_per_sec, d.calls_per_sec);
        target_row(
            targets,
            "tools/call c=64, one session: gateway / direct throughput",
            "≥ 0.35×",
            format!("{ratio:.2}× ({:.0} / {:.0} calls/s)", g.calls_per_sec, d.calls_per_sec),
            ratio >= 0.35,
        );
        target_row(
            targets,
            "tools/call c=64: gateway p99",
            "≤ 3 ms",
            format!("{:.2} ms", g.p99_us / 1000.0),
            g.p99_us <= 3000.0,
        );
    }
    if let (Some(d), Some(g)) = (find(rs, "direct", 1), find(rs, "gateway", 1)) {
        let added = g.p50_us - d.p50_us;
        target_row(
            targets,
            "tools/call c=1: added p50 (gateway − direct)",
            "≤ 80 us",
            format!("{added:.1} us ({:.1} − {:.1})", g.p50_us, d.p50_us),
            added <= 80.0,
        );
    }
    // Issue #19: a 2026-07-28 client pays nothing for having no session.
    if let (Some(g), Some(s)) = (find(rs, "gateway", 64), find(rs, "stateless", 64)) {
        let ratio = per(s.calls_per_sec, g.calls_per_sec);
        target_row(
            targets,
            "tools/call c=64: stateless / session throughput",
            "≥ 0.95×",
            format!("{ratio:.2}× ({:.0} / {:.0} calls/s)", s.calls_per_sec, g.calls_per_sec),
            ratio >= 0.95,
        );
    }
    // Issue #16: one replica plus Redis costs next to nothing.
    for name in ["cluster", "cluster-limited"] {
        if let (Some(g), Some(k)) = (find(rs, "gateway", 64), find(rs, name, 64)) {
            let ratio = per(k.calls_per_sec, g.calls_per_sec);
            target_row(
                targets,
                &format!("tools/call c=64: {name} / single-process throughput"),
                "≥ 0.85×",
                format!("{ratio:.2}× ({:.0} / {:.0} calls/s)", k.calls_per_sec, g.calls_per_sec),
                ratio >= 0.85,
            );
        }
        if let (Some(g), Some(k)) = (find(rs, "gateway", 1), find(rs, name, 1)) {
            let added = k.p50_us - g.p50_us;
            target_row(
                targets,
                &format!("tools/call c=1: {name} added p50 ({name} − single-process)"),
                "≤ 100 us",
                format!("{added:+.1} us ({:.1} − {:.1})", k.p50_us, g.p50_us),
                added <= 100.0,
            );
        }
    }
    if let (Some(g), Some(s)) = (find(rs, "gateway", 1), find(rs, "stateless", 1)) {
        let added = s.p50_us - g.p50_us;
        target_row(
            targets,
            "tools/call c=1: stateless added p50 (stateless − session)",
            "≤ 10 us",
            format!("{added:+.1} us ({:.1} − {:.1})", s.p50_us, g.p50_us),
            added <= 10.0,
        );
    }
    ab_targets(rs, targets);
}

/// Issue #19's targets on a `stateless-ab` run: each pair's stateless/session throughput
/// ratio and p50 difference, judged on the median pair (min and max shown).
fn ab_targets(rs: &[CaseResult], targets: &mut Vec<TargetRow>) {
    let pairs = |c: usize| -> Vec<(&CaseResult, &CaseResult)> {
        let of = |name: &'static str| rs.iter().filter(move |r| r.mode == name && r.concurrency == c);
        of(AB_SESSION).zip(of(AB_STATELESS)).collect()
    };
    let median = |mut v: Vec<f64>| -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mid = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        (mid, v[0], v[n - 1])
    };
    let p = pairs(64);
    if !p.is_empty() {
        let (mid, lo, hi) = median(p.iter().map(|(g, s)| per(s.calls_per_sec, g.calls_per_sec)).collect());
        target_row(
            targets,
            &format!(
                "tools/call c=64: stateless / session throughput, interleaved (median of {} pairs)",
                p.len()
            ),
            "≥ 0.95×",
            format!("{mid:.2}× (pairs {lo:.2}–{hi:.2}×)"),
            mid >= 0.95,
        );
    }
    let p = pairs(1);
    if !p.is_empty() {
        let (mid, lo, hi) = median(p.iter().map(|(g, s)| s.p50_us - g.p50_us).collect());
        target_row(
            targets,
            &format!(
                "tools/call c=1: stateless added p50, interleaved (median of {} pairs)",
                p.len()
            ),
            "≤ 10 us",
            format!("{mid:+.1} us (pairs {lo:+.1} to {hi:+.1} us)"),
            mid <= 10.0,
        );
    }
}

// ---------------------------------------------------------------- output

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, m)| m.trim())
        .to_owned();
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": model,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
    })
}

fn find<'a>(rs: &'a [CaseResult], mode: &str, c: usize) -> Option<&'a CaseResult> {
    rs.iter().find(|r| r.mode == mode && r.concurrency == c)
}

/// (direct, through the gateway) case names compared in the report.
const PAIRS: &[(&str, &str)] = &[
    ("direct", "gateway"),
    ("gateway", "stateless"),
    ("gateway", "cluster"),
    ("gateway", "cluster-limited"),
    ("json-direct", "json-gateway"),
    ("sse-direct", "sse-gateway"),
];

fn comparisons(rs: &[CaseResult], concurrency: &[usize]) -> Vec<Value> {
    PAIRS
        .iter()
        .flat_map(|p| concurrency.iter().map(move |&c| (p, c)))
        .filter_map(|(&(dn, gn), c)| {
            let d = find(rs, dn, c)?;
            let g = find(rs, gn, c)?;
            Some(json!({
                "direct": dn,
                "gateway": gn,
                "concurrency": c,
                "added_p50_us": g.p50_us - d.p50_us,
                "added_p99_us": g.p99_us - d.p99_us,
                "throughput_ratio": per(g.calls_per_sec, d.calls_per_sec),
            }))
        })
        .collect()
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn print_table(args: &Args, rs: &[CaseResult], gw: Option<&GatewayInfo>) {
    let m = machine();
    outln!(
        "machine: {} CPUs, {}; fixture {}; warmup {:?}, {}",
        m["nproc"],
        m["cpu"].as_str().unwrap_or(""),
        args.fixture.display(),
        args.warmup,
        args.calls.map_or(format!("{:?} per case", args.duration), |n| format!(
            "{n} calls per case"
        ))
    );
    outln!();
    outln!(
        "{:<12} {:>5} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>14} {:>14} {:>14}",
        "mode",
        "conc",
        "calls",
        "calls/s",
        "p50 us",
        "p90 us",
        "p99 us",
        "max us",
        "errors",
        "bench cpu/call",
        "gw cpu/call",
        "child cpu/call"
    );
    for r in rs {
        outln!(
            "{:<12} {:>5} {:>9} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6} {:>14} {:>14} {:>14}",
            r.mode,
            r.concurrency,
            r.calls,
            r.calls_per_sec,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            r.max_us,
            r.errors,
            opt(r.bench_cpu_us_per_call),
            opt(r.gateway_cpu_us_per_call),
            opt(r.fixture_cpu_us_per_call),
        );
    }
    outln!("(cpu/call: us of user+system CPU per measured call; child = the fixture, or the baseline server)");
    if let Some(g) = gw {
        let kib = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.1} MiB", v as f64 / 1024.0));
        outln!();
        outln!(
            "gateway RSS: idle {}, peak (VmHWM) {}, after load {}; {}",
            kib(g.idle_rss_kib),
            kib(g.peak_rss_kib),
            kib(g.final_rss_kib),
            g.shutdown
        );
        for w in &g.warnings {
            outln!("gateway said: {w}");
        }
    }
    let cmp = comparisons(rs, &args.concurrency);
    if !cmp.is_empty() {
        outln!();
    }
    for c in cmp {
        outln!(
            "{} vs {} at c={}: p50 {:+.1} us, p99 {:+.1} us, throughput x{:.2}",
            c["gateway"].as_str().unwrap_or(""),
            c["direct"].as_str().unwrap_or(""),
            c["concurrency"],
            c["added_p50_us"].as_f64().unwrap_or(0.0),
            c["added_p99_us"].as_f64().unwrap_or(0.0),
            c["throughput_ratio"].as_f64().unwrap_or(0.0)
        );
    }
    for r in rs.iter().filter(|r| r.errors > 0) {
        outln!(
            "ERRORS {} c={}: {} failed; first: {}",
            r.mode,
            r.concurrency,
            r.errors,
            r.first_error.as_deref().unwrap_or("?")
        );
    }
}

fn print_targets(targets: &[TargetRow]) {
    if targets.is_empty() {
        return;
    }
    outln!();
    if QUICK.load(Ordering::Relaxed) {
        outln!("targets (a --quick smoke run proves the load tool works; its figures are not judged):");
    } else {
        outln!("targets:");
    }
    for t in targets {
        let v = if QUICK.load(Ordering::Relaxed) {
            "-"
        } else {
            verdict(t.pass)
        };
        outln!("  {:<4} {}: {} (target {})", v, t.target, t.measured, t.goal);
    }
}

fn main() -> Result<()> {
    // Hidden: `mcp-gateway-bench fixture …` is a minimal stdio MCP server (no runtime).
    if std::env::args_os().nth(1).is_some_and(|a| a == "fixture") {
        let fargs = fixture::FixtureArgs::parse_from(std::env::args_os().skip(1));
        return fixture::run(fargs);
    }
    // Hidden: `mcp-gateway-bench remote-fixture …` is a Streamable HTTP MCP server.
    if std::env::args_os().nth(1).is_some_and(|a| a == "remote-fixture") {
        let rargs = remote::RemoteArgs::parse_from(std::env::args_os().skip(1));
        return remote::run(rargs);
    }
    let args = Args::parse();
    if args.serve_baseline {
        // The baseline server runs like the gateway: a default multi-thread runtime.
        return tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(serve_baseline(&args.text));
    }
    let rt = match args.bench_threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    rt.block_on(bench_main(args))
}

async fn bench_main(mut args: Args) -> Result<()> {
    QUICK.store(args.quick, Ordering::Relaxed);
    if args.quick {
        args.duration = Duration::from_millis(500);
        args.warmup = Duration::from_millis(100);
    }
    if args.concurrency.contains(&0) {
        bail!("--concurrency must be at least 1");
    }
    if args.quick {
        args.sessions = args.sessions.min(1000);
        args.soak_calls = args.soak_calls.min(50_000);
        args.list_calls = args.list_calls.min(200);
        args.search.search_rounds = args.search.search_rounds.min(2);
        args.search.search_rebuilds = args.search.search_rebuilds.min(3);
    }
    let mut results = Vec::new();
    let mut targets = Vec::new();
    let mut gw_info = None;
    let mut setup_failed = false;
    for &mode in &args.mode {
        eprintln!("{}:", mode.name());
        let r = match mode {
            Mode::Direct => bench_direct(&args, &mut results).await,
            Mode::Gateway | Mode::Stateless | Mode::StatelessAb | Mode::Cluster | Mode::ClusterLimited => {
                bench_gateway(&args, mode, &mut results).await.map(|g| {
                    gw_info.get_or_insert(g);
                })
            }
            Mode::Baseline => bench_baseline(&args, &mut results).await,
            Mode::IdleRss => bench_idle_rss(&args, &mut targets).await,
            Mode::Sessions => bench_sessions(&args, &mut targets).await,
            Mode::Soak => bench_soak(&args, &mut results, &mut targets).await,
            Mode::List => bench_list(&args, &mut targets).await,
            Mode::Startup => bench_startup(&args, &mut targets).await,
            Mode::RemoteJson => bench_remote(&args, false, &mut results, &mut targets).await,
            Mode::RemoteSse => bench_remote(&args, true, &mut results, &mut targets).await,
            Mode::RemoteUrl => bench_remote_url(&args, &mut results, &mut targets).await,
            Mode::Search => bench_search(&args, &mut targets),
        };
        if let Err(e) = r {
            eprintln!("{} mode failed: {e:#}", mode.name());
            setup_failed = true;
        }
    }
    call_targets(&results, &mut targets);
    if args.json {
        let doc = json!({
            "machine": machine(),
            "fixture": args.fixture.display().to_string(),
            "warmup_s": args.warmup.as_secs_f64(),
            "duration_s": args.calls.is_none().then_some(args.duration.as_secs_f64()),
            "calls": args.calls,
            "results": results,
            "gateway": gw_info,
            "gateway_vs_direct": comparisons(&results, &args.concurrency),
            "targets": targets,
        });
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(&args, &results, gw_info.as_ref());
        print_targets(&targets);
    }
    let errors: u64 = results.iter().map(|r| r.errors).sum();
    let empty = results.iter().any(|r| r.calls == 0);
    if setup_failed || errors > 0 || empty {
        eprintln!(
            "FAILED: {errors} failed calls{}",
            if setup_failed { ", a mode failed to run" } else { "" }
        );
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_body_parts() {
        let sh = Shared::new("fast__echo".into(), "h\"i ü");
        let mut out = Vec::new();
        for id in [0, 1, 99, 123456789] {
            sh.call_body_into(&mut out, id);
            assert_eq!(out, call_body(id, "fast__echo", "h\"i ü"));
        }
    }
}
