//! Interop: the official MCP SDK clients (Python `mcp` 2.x, TypeScript 1.x) talk to the real
//! gateway binary, which fronts three real downstreams: the stdlib mock fixture, a Python SDK
//! server and a TypeScript SDK server. The Python client also speaks 2026-07-28 to it
//! (multi round-trip requests and `subscriptions/listen`, `tests/interop/py_stateless.py`).
//!
//! Needs `.venv/` and `node_modules/`: run `scripts/setup-test-deps` first. The tests panic
//! (never skip) when those are missing.

use crate::common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Upper bound for one client run (the clients time out on their own well before this).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

/// The SDK client's `server/discover` probe must not fall back by timeout (the SDK's is 10 s).
const AUTO_MODE_BUDGET: Duration = Duration::from_secs(8);

pub(crate) fn venv_python() -> PathBuf {
    repo().join(".venv/bin/python")
}

/// Panics with setup instructions when a test dependency is missing.
pub(crate) fn require_deps() {
    let setup = "run scripts/setup-test-deps (creates .venv and node_modules) before `cargo test --test it interop::`";
    let py = venv_python();
    assert!(py.exists(), "interop tests need {} — {setup}", py.display());
    let sdk = repo().join("node_modules/@modelcontextprotocol/sdk");
    assert!(sdk.is_dir(), "interop tests need {} — {setup}", sdk.display());
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        matches!(&node, Ok(o) if o.status.success()),
        "interop tests need `node` on PATH ({node:?}) — {setup}"
    );
}

/// gateway.toml with the mock (prefix calc), Python SDK (py) and TypeScript SDK (ts) servers.
fn three_servers() -> String {
    let repo = path_str(&repo());
    format!(
        "[servers.calc]\n{}\n\
         [servers.py]\ncommand = {:?}\nargs = [\"tests/fixtures/py_sdk_server.py\"]\ncwd = {repo:?}\n\n\
         [servers.ts]\ncommand = \"node\"\nargs = [\"tests/fixtures/ts_sdk_server.mjs\"]\ncwd = {repo:?}\n",
        mock("calc", &[]),
        path_str(&venv_python()),
    )
}

/// One tool call per downstream: (public name, arguments, expected text).
fn calls() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("calc__add", json!({"a": 2, "b": 3}), "5"),
        ("py__py_add", json!({"a": 40, "b": 2}), "42"),
        ("ts__ts_add", json!({"a": 6, "b": 7}), "13"),
        ("py__py_echo", json!({"text": "héllo ✓ \"py\""}), "héllo ✓ \"py\""),
        (
            "ts__ts_echo",
            json!({"text": "wörld ✓ \"ts\"\nline2"}),
            "wörld ✓ \"ts\"\nline2",
        ),
    ]
}

/// Runs a client command to completion; returns its one JSON output line and the wall time.
pub(crate) async fn run_client(
    what: &str,
    program: &str,
    args: &[String],
    context: &dyn Fn() -> String,
) -> (Value, Duration) {
    let start = Instant::now();
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot spawn {program}: {e}"));
    let out = match tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output()).await {
        Ok(r) => r.unwrap_or_else(|e| panic!("{what}: wait: {e}")),
        Err(_) => panic!("{what}: no answer within {CLIENT_TIMEOUT:?}\n{}", context()),
    };
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what}: client failed ({}) after {took:?}\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        out.status,
        context()
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no JSON line on stdout:\n{stdout}\nstderr:\n{stderr}\n{}",
                context()
            )
        });
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: bad JSON ({e}): {line}"));
    (v, took)
}

/// Checks one client's output: the merged list and the called tool's answer.
fn check_output(what: &str, out: &Value, expect_text: &str) {
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no tools in {out}"))
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for name in [
        "calc__add",
        "calc__echo",
        "py__py_add",
        "py__py_echo",
        "ts__ts_add",
        "ts__ts_echo",
    ] {
        assert!(
            tools.contains(&name),
            "{what}: {name} missing from tools/list: {tools:?}"
        );
    }
    let mut dedup = tools.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), tools.len(), "{what}: duplicate tool names: {tools:?}");
    assert_eq!(out["serverInfo"]["name"], "mcp-gateway", "{what}: serverInfo in {out}");
    assert_eq!(out["isError"], false, "{what}: tool call errored: {out}");
    assert_eq!(out["result"][0]["type"], "text", "{what}: {out}");
    assert_eq!(out["result"][0]["text"], expect_text, "{what}: wrong result: {out}");
}

/// Runs `client_args(tool, args)` once per entry of [`calls`], all at once; returns outputs.
async fn run_all(
    label: &str,
    program: &str,
    client_args: impl Fn(&str, &Value) -> Vec<String>,
    context: &dyn Fn() -> String,
) -> Vec<(Value, Duration)> {
    let calls = calls();
    let runs = calls.iter().map(|(tool, args, _)| {
        let argv = client_args(tool, args);
        let what = format!("{label} calling {tool}");
        async move { run_client(&what, program, &argv, context).await }
    });
    let outs = futures::future::join_all(runs).await;
    for ((tool, _, expect), (out, _)) in calls.iter().zip(&outs) {
        check_output(&format!("{label} calling {tool}"), out, expect);
    }
    outs
}

fn py_client(url: &str, mode: &str) -> impl Fn(&str, &Value) -> Vec<String> {
    let url = url.to_string();
    let mode = mode.to_string();
    move |tool, args| {
        vec![
            "tests/interop/py_client.py".into(),
            url.clone(),
            "--mode".into(),
            mode.clone(),
            "--tool".into(),
            tool.into(),
            "--args".into(),
            args.to_string(),
        ]
    }
}

#[tokio::test]
async fn python_sdk_client_legacy_mode() {
    require_deps();
    let gw = Gateway::start(&three_servers());
    let ctx = || format!("gateway stderr:\n{}", gw.logs());
    let outs = run_all(
        "py client (legacy)",
        &path_str(&venv_python()),
        py_client(&gw.url, "legacy"),
        &ctx,
    )
    .await;
    for (out, _) in &outs {
        assert_eq!(out["mode"], "legacy");
        assert_eq!(out["protocolVersion"], "2025-11-25", "{out}");
    }
    // The Python SDK server's int result also comes back structured, untouched.
    let py_add = calls().iter().position(|c| c.0 == "py__py_add").unwrap();
    assert_eq!(
        outs[py_add].0["structuredContent"],
        json!({"result": 42}),
        "{}",
        outs[py_add].0
    );
}

#[tokio::test]
async fn python_sdk_client_auto_mode_is_served_statelessly() {
    require_deps();
    let gw = Gateway::start(&three_servers());
    let ctx = || format!("gateway stderr:\n{}", gw.logs());
    let outs = run_all(
        "py client (auto)",
        &path_str(&venv_python()),
        py_client(&gw.url, "auto"),
        &ctx,
    )
    .await;
    for (out, took) in &outs {
        assert_eq!(out["mode"], "auto");
        // Connect + probe + handshake, measured inside the client (its start-up, which can
        // take seconds on a loaded machine, is not counted).
        let connect = out["connectSeconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no connectSeconds in {out}"));
        // The gateway serves 2026-07-28 statelessly: the discover probe succeeds and the
        // client stays stateless (no initialize).
        eprintln!("auto mode: connect {connect} s, whole run {took:?}");
        assert_eq!(out["protocolVersion"], "2026-07-28", "{out}");
        assert_eq!(out["serverInfo"]["name"], "mcp-gateway", "{out}");
        assert!(
            connect < AUTO_MODE_BUDGET.as_secs_f64(),
            "auto mode needed {connect} s to connect (whole run {took:?}): the server/discover probe \
             probably waited for its timeout\n{}",
            ctx()
        );
    }
}

/// A session-less `server/discover` without the 2026-07-28 `_meta` gets an immediate 4xx
/// with a JSON-RPC error body (a client's cue to fix the request or fall back), not a hang.
#[tokio::test]
async fn discover_probe_is_refused_at_once() {
    let gw = Gateway::start(&format!("[servers.calc]\n{}", mock("calc", &[])));
    let start = Instant::now();
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}))
        .send()
        .await
        .expect("server/discover");
    let status = r.status();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body: Value = r.json().await.expect("a JSON body");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "probe answered after {:?}",
        start.elapsed()
    );
    assert!(status.is_client_error(), "server/discover got {status}: {body}");
    assert!(ct.starts_with("application/json"), "content-type {ct:?}");
    assert!(body["error"]["code"].is_i64(), "not a JSON-RPC error: {body}");
    assert!(body.get("result").is_none(), "{body}");
}

#[tokio::test]
async fn typescript_sdk_client_over_streamable_http() {
    require_deps();
    let gw = Gateway::start(&three_servers());
    let ctx = || format!("gateway stderr:\n{}", gw.logs());
    let url = gw.url.clone();
    let argv = |tool: &str, args: &Value| {
        let mut v: Vec<String> = vec!["tests/interop/ts_client.mjs".into()];
        v.extend([
            "--tool".into(),
            tool.into(),
            "--args".into(),
            args.to_string(),
            "--url".into(),
            url.clone(),
        ]);
        v
    };
    let outs = run_all("ts client (http)", "node", argv, &ctx).await;
    for (out, _) in &outs {
        assert_eq!(out["protocolVersion"], "2025-11-25", "{out}");
    }
}

#[tokio::test]
async fn typescript_sdk_client_over_gateway_stdio() {
    require_deps();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, three_servers()).unwrap();
    let config = path_str(&config);
    let ctx = || String::from("(the gateway's stderr is in the client's stderr above)");
    let argv = |tool: &str, args: &Value| {
        let mut v: Vec<String> = vec!["tests/interop/ts_client.mjs".into()];
        v.extend([
            "--tool".into(),
            tool.into(),
            "--args".into(),
            args.to_string(),
            "--stdio".into(),
        ]);
        v.extend([BIN.into(), "stdio".into(), "--config".into(), config.clone()]);
        v
    };
    let outs = run_all("ts client (stdio)", "node", argv, &ctx).await;
    for (out, _) in &outs {
        assert_eq!(out["protocolVersion"], "2025-11-25", "{out}");
    }
    // Every gateway the client spawned is gone once the client has closed it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids_matching(&config).is_empty() {
        assert!(
            Instant::now() < deadline,
            "stdio gateways still running: {:?}",
            pids_matching(&config)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The official Python SDK client in 2026-07-28: it answers the gateway's `input_required`
/// (a handshake-era server's elicitation/create, bridged) through its elicitation callback
/// and retries with the `requestState`; its `listen()` gets the acknowledgment and a tools
/// list change.
#[tokio::test]
async fn python_sdk_stateless_client_drives_input_required_and_listen() {
    require_deps();
    let n = unique("py-stateless");
    let gw = Gateway::start(&server("s0", &n, &["--two-way"], ""));
    let ctx = || format!("gateway stderr:\n{}", gw.logs());
    let args: Vec<String> = vec![
        "tests/interop/py_stateless.py".into(),
        gw.url.clone(),
        "s0__ask_elicit".into(),
        "s0__add_tool".into(),
    ];
    let (out, _) = run_client("py stateless client", &path_str(&venv_python()), &args, &ctx).await;
    assert_eq!(out["protocolVersion"], "2026-07-28", "{out}");
    assert_eq!(out["elicited"], json!(["Who are you?"]), "{out}");
    assert_eq!(
        out["result"], r#"{"action":"accept","content":{"name":"sdk-user"}}"#,
        "{out}"
    );
    assert_eq!(out["honored"], json!({"toolsListChanged": true}), "{out}");
    assert_eq!(out["event"], "ToolsListChanged", "{out}");
}

/// Drain (issue #14): SIGTERM while the official Python SDK client (legacy mode, with its
/// GET stream open) has a call in flight: the client gets its result and exits without an
/// exception; the session's GET stream stays open until the call is answered. (With mcp
/// 2.3.0 this also passed when every GET stream ended at once: the SDK retries its GET
/// quietly. What does lose the answer, before and after, is a client with no tool cache:
/// call_tool then lists the tools after the answer, on a new connection, which a draining
/// gateway refuses; the script lists them first, as clients do.)
#[tokio::test]
async fn python_sdk_call_in_flight_at_sigterm_gets_its_answer() {
    require_deps();
    use tokio::io::AsyncBufReadExt;
    let mut gw = Gateway::start(&format!("[servers.calc]\n{}", mock("calc", &[])));
    let mut child = tokio::process::Command::new(venv_python())
        .args([
            "tests/interop/py_drain.py",
            gw.url.as_str(),
            "calc__slow",
            r#"{"seconds": 1.5}"#,
        ])
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn py_drain.py");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(CLIENT_TIMEOUT, lines.next_line()).await;
    assert!(
        matches!(&first, Ok(Ok(Some(l))) if l == "calling"),
        "{first:?}\n{}",
        gw.logs()
    );
    // The call has reached the gateway (and its GET stream is open) before SIGTERM.
    let base = gw.base.clone();
    let in_flight = || {
        let base = base.clone();
        async move {
            let m = reqwest::get(format!("{base}/metrics")).await.ok()?.text().await.ok()?;
            let status: Value = reqwest::get(format!("{base}/status")).await.ok()?.json().await.ok()?;
            let calls = m
                .lines()
                .find_map(|l| l.strip_prefix("mcp_gateway_requests_in_flight "))?
                .trim()
                .parse::<f64>()
                .ok()?;
            Some(calls >= 1.0 && status["sessions"] == 1)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight().await != Some(true) {
        assert!(
            Instant::now() < deadline,
            "the call never reached the gateway\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.sigterm();
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("the client ends")
        .unwrap();
    let mut stdout = String::new();
    while let Ok(Some(l)) = lines.next_line().await {
        stdout.push_str(&l);
        stdout.push('\n');
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "client failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}\ngateway:\n{}",
        out.status,
        gw.logs()
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["isError"], false, "{v}");
    assert_eq!(v["result"][0]["text"], "done", "{v}");
    assert!(gw.child.wait().unwrap().success(), "{}", gw.logs());
}
