//! 2026-07-28 downstreams: the gateway probes each server with `server/discover`, speaks
//! the stateless era to those that answer it (the caller's own capabilities in `_meta`,
//! `Mcp-Param-*` headers over HTTP, tools with an invalid `x-mcp-header` dropped, a listen
//! stream for list_changed) and falls back to `initialize` for the rest; and the bridge
//! that lets a handshake-era client answer a stateless server's `input_required` questions.

use crate::common::*;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn python() -> String {
    path_str(&repo().join(".venv/bin/python"))
}

/// The dual-era Python SDK fixture as a stdio server named `everything`, plus `extra` toml.
fn fixture_stdio(args: &[&str], extra: &str) -> String {
    let mut a = vec![path_str(&repo().join("tests/fixtures/conformance_server.py"))];
    a.extend(args.iter().map(|s| s.to_string()));
    format!(
        "[servers.everything]\ncommand = {:?}\nargs = {}\n{extra}\n",
        python(),
        toml_list(&a)
    )
}

#[tokio::test]
async fn servers_are_probed_and_each_keeps_its_era() {
    let config = format!(
        "{}\n[servers.legacy]\n{}\n[servers.pinned]\ncommand = {:?}\nargs = [{:?}]\nprotocol = \"handshake\"\n",
        fixture_stdio(&[], ""),
        mock("legacy", &[]),
        python(),
        path_str(&repo().join("tests/fixtures/conformance_server.py")),
    );
    let gw = Gateway::start(&config);
    let stateless = gw.server_status("everything").await;
    assert_eq!(stateless["protocolVersion"], "2026-07-28", "{stateless}");
    let legacy = gw.server_status("legacy").await;
    assert_eq!(legacy["protocolVersion"], "2025-11-25", "{legacy}");
    let pinned = gw.server_status("pinned").await;
    assert_eq!(pinned["protocolVersion"], "2025-11-25", "{pinned}");
    // Every era's tools are in the one catalog and callable from a handshake session.
    let s = gw.session().await;
    let simple = s.call("everything__test_simple_text", json!({})).await;
    assert!(text(&simple).contains("simple text"), "{simple}");
    let legacy_call = s.call("legacy__add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&legacy_call), "5", "{legacy_call}");
    let pinned_call = s.call("pinned__test_simple_text", json!({})).await;
    assert!(text(&pinned_call).contains("simple text"), "{pinned_call}");
}

#[tokio::test]
async fn the_callers_own_capabilities_reach_a_stateless_server() {
    let gw = Gateway::start(&fixture_stdio(&[], "prefix = \"\""));
    // The session declared no sampling: the server itself refuses with -32021.
    let bare = gw.session().await;
    let refused = bare.call("test_missing_capability", json!({})).await;
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
    assert_eq!(
        refused["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}})
    );
    // Another session that declared it is served by the same process.
    let able = Session::open_with(&gw.url, json!({"sampling": {}})).await;
    let ok = able.call("test_missing_capability", json!({})).await;
    assert_eq!(text(&ok), "Success", "{ok}");
}

#[tokio::test]
async fn a_tool_with_an_invalid_x_mcp_header_is_not_offered() {
    let gw = Gateway::start(&fixture_stdio(&["--invalid-header-tool"], "prefix = \"\""));
    let names = gw.session().await.tool_names().await;
    assert!(names.iter().any(|n| n == "test_x_mcp_header"), "{names:?}");
    assert!(!names.iter().any(|n| n == "test_invalid_x_mcp_header"), "{names:?}");
    assert!(
        gw.wait_log("test_invalid_x_mcp_header", WAIT).await,
        "the drop is logged with the tool's name:\n{}",
        gw.logs()
    );
}

/// The fixture over Streamable HTTP on port 0, and its URL.
async fn http_fixture() -> (Proc, String) {
    let fixture = path_str(&repo().join("tests/fixtures/conformance_server.py"));
    let child = Proc::start(&python(), &[&fixture, "--http", "0"], &[]).await;
    let url = format!("http://127.0.0.1:{}/mcp", child.port);
    (child, url)
}

#[tokio::test]
async fn a_stateless_http_server_gets_the_request_metadata_headers() {
    let (fixture, url) = http_fixture().await;
    let gw = Gateway::start(&format!("[servers.remote]\nurl = {url:?}\nprefix = \"\"\n"));
    let st = gw.server_status("remote").await;
    assert_eq!(st["protocolVersion"], "2026-07-28", "{st}");
    let s = gw.session().await;
    // The fixture checks Mcp-Param-Region against the body (-32020 if it is missing or
    // wrong); a non-ASCII value goes Base64-encoded.
    let plain = s.call("test_x_mcp_header", json!({"region": "eu-west-1"})).await;
    assert_eq!(text(&plain), "region=eu-west-1", "{plain}");
    let encoded = s.call("test_x_mcp_header", json!({"region": "Zürich"})).await;
    assert_eq!(text(&encoded), "region=Zürich", "{encoded}");
    drop(fixture);
}

#[tokio::test]
async fn a_stateless_servers_list_changed_arrives_on_its_listen_stream() {
    let gw = Gateway::start(&fixture_stdio(&[], "prefix = \"\""));
    let s = gw.session().await;
    // The fixture adds a tool, removes it again and announces the change: only on a
    // listen stream in its 2026-07-28 era. The gateway re-lists (the merged list is the
    // same again, so sessions are not told).
    let out = s.call("test_trigger_tool_change", json!({})).await;
    assert_eq!(text(&out), "Mutation triggered", "{out}");
    assert!(
        gw.wait_log("re-listed after list_changed server=everything kind=Tools", WAIT)
            .await,
        "{}",
        gw.logs()
    );
    // Subscribing to a resource of a stateless server goes onto its listen stream.
    let sub = s
        .request(
            json!(7),
            "resources/subscribe",
            json!({"uri": "test://watched-resource"}),
        )
        .await;
    assert_eq!(sub["result"], json!({}), "{sub}");
}

/// Runs the TypeScript SDK 1.x client against `url`, answering questions with `answer`.
async fn ts_call(url: &str, tool: &str, answer: Value) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(repo().join("node_modules/node/bin/node"))
            .arg("tests/interop/ts_client.mjs")
            .args(["--tool", tool, "--answer", &answer.to_string(), "--url", url])
            .current_dir(repo())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ts client finished")
    .expect("ts client ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ts client failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).expect("a JSON line");
    serde_json::from_str(line).expect("JSON")
}

#[tokio::test]
async fn a_handshake_client_answers_a_stateless_servers_input_required_questions() {
    let gw = Gateway::start(&fixture_stdio(&[], "prefix = \"\""));
    let answers = json!({
        "elicit": {"name": "Ada", "color": "teal"},
        "sample": "Bonjour",
        "roots": [{"uri": "file:///work", "name": "work"}],
    });
    // Two rounds, each one real elicitation/create on the call's stream.
    let out = ts_call(&gw.url, "test_input_required_result_multi_round", answers.clone()).await;
    assert_eq!(
        out["result"][0]["text"], "Multi-round complete for Ada who likes teal",
        "{out}"
    );
    assert_eq!(
        out["asked"],
        json!(["elicitation/create", "elicitation/create"]),
        "{out}"
    );
    // Three questions of three kinds in one round, then the answer.
    let out = ts_call(&gw.url, "test_input_required_result_multiple_inputs", answers.clone()).await;
    assert_eq!(
        out["result"][0]["text"], "Name: Ada; Greeting: Bonjour; Roots: 1",
        "{out}"
    );
    let mut asked: Vec<String> = serde_json::from_value(out["asked"].clone()).unwrap();
    asked.sort();
    assert_eq!(
        asked,
        ["elicitation/create", "roots/list", "sampling/createMessage"],
        "{out}"
    );
    // A client without the capability: the question is refused, the call fails naming it.
    let s = gw.session().await;
    let refused = s.call("test_input_required_result_elicitation", json!({})).await;
    let msg = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("elicitation"), "{refused}");
}

#[tokio::test]
async fn handshake_servers_that_mishandle_the_probe_still_start() {
    // One ignores requests before initialize, one exits on them (status 3).
    let config = format!(
        "[servers.silent]\n{}\n[servers.touchy]\n{}\n",
        mock("silent", &["--quirk", "silent-before-init"]),
        mock("touchy", &["--quirk", "exit-before-init"]),
    );
    let gw = Gateway::start(&config);
    for name in ["silent", "touchy"] {
        let st = gw.server_status(name).await;
        assert_eq!(st["state"], "ready", "{st}\n{}", gw.logs());
        assert_eq!(st["protocolVersion"], "2025-11-25", "{st}");
    }
    // The touchy one was started again at once without the probe, not after a backoff.
    assert_eq!(gw.server_status("touchy").await["restarts"], 0);
    assert!(
        gw.logs().contains("exited on the server/discover probe"),
        "{}",
        gw.logs()
    );
    let s = gw.session().await;
    assert_eq!(text(&s.call("silent__add", json!({"a": 1, "b": 2})).await), "3");
    assert_eq!(text(&s.call("touchy__add", json!({"a": 2, "b": 2})).await), "4");
}

#[test]
fn the_bridge_asks_a_handshake_client_on_stdout_too() {
    let mut gw = StdioGateway::start(&fixture_stdio(&[], "prefix = \"\""), &[]);
    gw.request(
        json!(0),
        "initialize",
        json!({"protocolVersion":"2025-11-25","capabilities":{"elicitation":{}},
               "clientInfo":{"name":"stdio-test","version":"1"}}),
    );
    gw.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    gw.send(&json!({"jsonrpc":"2.0","id":"call-1","method":"tools/call",
        "params":{"name":"test_input_required_result_request_state","arguments":{}}}));
    // The question arrives as a real request, under an id the gateway minted.
    let ask = loop {
        let m = gw
            .recv(WAIT)
            .unwrap_or_else(|| panic!("no question on stdout\n{}", gw.logs()));
        if m["method"] == "elicitation/create" {
            break m;
        }
    };
    assert_eq!(ask["params"]["message"], "Please confirm", "{ask}");
    gw.send(&json!({"jsonrpc":"2.0","id":ask["id"],"result":{"action":"accept","content":{"ok":true}}}));
    // The server saw its requestState echoed with the answer: one ordinary result.
    let (_, done) = gw.until_response(&json!("call-1"), WAIT);
    assert_eq!(text(&done), "state-ok: requestState validated", "{done}");
}

/// A 2026-07-28 request to the gateway, as a conforming client sends it.
async fn stateless(gw: &Gateway, method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = params.get("uri").or(params.get("name")).and_then(Value::as_str) {
        req = req.header("mcp-name", n);
    }
    let resp = req
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .expect("POST");
    read_messages(resp).await.pop().expect("a response")
}

fn py_server(name: &str, args: &[&str]) -> String {
    let mut a = vec![path_str(&repo().join("tests/fixtures/py_sdk_server.py"))];
    a.extend(args.iter().map(|s| s.to_string()));
    format!("[servers.{name}]\ncommand = {:?}\nargs = {}\n", python(), toml_list(&a))
}

#[tokio::test]
async fn merged_lists_carry_the_smallest_ttl_and_any_private_scope() {
    let config = format!(
        "{}{}",
        py_server("long", &["--cache-ttl-ms", "30000"]),
        py_server("short", &["--cache-ttl-ms", "10000", "--cache-private"]),
    );
    let gw = Gateway::start(&config);
    let tools = stateless(&gw, "tools/list", json!({})).await;
    assert_eq!(tools["result"]["tools"].as_array().map(Vec::len), Some(4), "{tools}");
    assert_eq!(tools["result"]["ttlMs"], 10000, "{tools}");
    assert_eq!(tools["result"]["cacheScope"], "private", "{tools}");
    // A server's own resources/read hint passes through.
    let read = stateless(&gw, "resources/read", json!({"uri": "py://info"})).await;
    assert_eq!(read["result"]["ttlMs"], 30000, "{read}");
    assert_eq!(read["result"]["cacheScope"], "public", "{read}");

    // A handshake-era server promises nothing: with one in the merge, nothing is fresh.
    let config = format!(
        "{}[servers.legacy]\n{}\n",
        py_server("long", &["--cache-ttl-ms", "30000"]),
        mock("legacy", &[])
    );
    let gw = Gateway::start(&config);
    let tools = stateless(&gw, "tools/list", json!({})).await;
    assert_eq!(tools["result"]["ttlMs"], 0, "{tools}");
    assert_eq!(tools["result"]["cacheScope"], "public", "{tools}");
}

#[tokio::test]
async fn a_stateless_servers_log_messages_reach_the_caller_at_its_level() {
    let gw = Gateway::start(&fixture_stdio(&[], "prefix = \"\""));
    let s = gw.session().await;
    // Without logging/setLevel the call carries no logLevel: the server logs nothing.
    let quiet = s
        .request_all(
            json!(1),
            "tools/call",
            json!({"name": "test_tool_with_logging", "arguments": {}}),
        )
        .await;
    assert_eq!(quiet.len(), 1, "{quiet:?}");
    let set = s.request(json!(2), "logging/setLevel", json!({"level": "info"})).await;
    assert_eq!(set["result"], json!({}), "{set}");
    // With it, the three messages come on the call's stream (its listen stream, always
    // pending on the same pipe, does not count as another call).
    let all = s
        .request_all(
            json!(3),
            "tools/call",
            json!({"name": "test_tool_with_logging", "arguments": {}}),
        )
        .await;
    let logs: Vec<&Value> = all.iter().filter(|m| m["method"] == "notifications/message").collect();
    assert_eq!(logs.len(), 3, "{all:?}\n{}", gw.logs());
    assert_eq!(logs[0]["params"]["data"], "Tool execution started", "{all:?}");
    assert_eq!(text(all.last().unwrap()), "Tool with logging executed successfully");
}

/// A stateless server that answers `input_required` but asks nothing is a protocol error
/// at once, naming it: the bridge used to send the call again, round after round.
#[tokio::test]
async fn an_input_required_with_only_request_state_is_sent_again_with_it_a_bounded_number_of_times() {
    let gw = Gateway::start(&fixture_stdio(&["--asks-nothing-tool"], "prefix = \"\""));
    let s = gw.session().await;
    // Load shedding: the server answers twice with only requestState, then the result.
    // A handshake client sees one ordinary call.
    let r = s.call("test_sheds_twice", json!({})).await;
    assert_eq!(text(&r), "served after shedding twice", "{r}");
    // A server that never stops asking to be called again is given up on, naming it.
    let r = s.call("test_asks_nothing", json!({})).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'everything'") && msg.contains("rounds"), "{r}");
}

/// A server that answers without SSE, as the reference everything-server does: its
/// `subscriptions/listen` is a never-ending `application/json` body of one message a line
/// (NDJSON), and a call's JSON body may carry notifications before its answer. Each
/// message is handled as its line arrives (`tests/fixtures/ndjson_server.py`).
#[tokio::test]
async fn a_server_streaming_ndjson_instead_of_sse_is_heard_line_by_line() {
    let script = path_str(&repo().join("tests/fixtures/ndjson_server.py"));
    let fixture = Proc::start(&python(), &[&script], &[]).await;
    let url = format!("http://127.0.0.1:{}/mcp", fixture.port);
    let gw = Gateway::start(&format!("[servers.nd]\nurl = {url:?}\nprefix = \"\"\n"));
    let st = gw.server_status("nd").await;
    assert_eq!(st["protocolVersion"], "2026-07-28", "{st}");
    let s = gw.session().await;
    // One answer, compact or pretty-printed over many lines.
    assert_eq!(text(&s.call("hello", json!({})).await), "hello");
    assert_eq!(text(&s.call("pretty", json!({})).await), "pretty");
    // A body with the call's progress and a log message before its answer.
    let mut m = s
        .start(
            json!(5),
            "tools/call",
            json!({"name": "chatty", "arguments": {}, "_meta": {"progressToken": "p-1"}}),
        )
        .await;
    let (before, answer) = m.response(WAIT).await;
    assert_eq!(text(&answer), "chatty", "{answer}");
    assert!(
        before
            .iter()
            .any(|n| n["method"] == "notifications/progress" && n["params"]["progressToken"] == "p-1"),
        "the progress sent before the answer reaches the caller with its own token: {before:?}"
    );
    // The listen stream: what the server sends on it arrives while the body goes on.
    let sub = s
        .request(json!(6), "resources/subscribe", json!({"uri": "test://watched"}))
        .await;
    assert_eq!(sub["result"], json!({}), "{sub}");
    // The subscription opens the listen stream again with the URI in its filter.
    assert!(
        until(WAIT, || fixture.output().matches("listen opened").count() >= 2).await,
        "{}",
        fixture.output()
    );
    let mut get = s.get_stream().await;
    assert_eq!(text(&s.call("change", json!({})).await), "changed 1");
    let (mut listed, mut updated) = (false, false);
    while !(listed && updated) {
        let Some(msg) = get.next(WAIT).await else {
            panic!(
                "list_changed {listed}, resources/updated {updated} on the GET stream\n{}",
                gw.logs()
            )
        };
        match msg["method"].as_str() {
            Some("notifications/tools/list_changed") => listed = true,
            Some("notifications/resources/updated") => {
                assert_eq!(msg["params"]["uri"], "test://watched", "{msg}");
                updated = true;
            }
            _ => {}
        }
    }
    assert!(s.tool_names().await.contains(&"added_1".to_owned()));
}
