//! `mcp-gateway stdio` serving a 2026-07-28 client: no initialize, `_meta` validated,
//! results decorated, `notifications/cancelled` cancels, `subscriptions/listen` streams
//! tagged lines and ends gracefully at the end of input; only JSON-RPC on stdout.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const V: &str = "2026-07-28";
const T: Duration = Duration::from_secs(30);
const SUB: &str = "io.modelcontextprotocol/subscriptionId";

fn meta() -> Value {
    stateless_meta("stdio-stateless")
}

fn with_meta(mut params: Value) -> Value {
    if params.get("_meta").is_none() {
        params["_meta"] = meta();
    }
    params
}

fn wait_log(gw: &StdioGateway, needle: &str) -> bool {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if gw.logs().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The next message that is not a response, skipping nothing: it must be a notification.
fn next_note(gw: &StdioGateway) -> Value {
    let m = gw.recv(T).expect("a line on stdout");
    assert!(m.get("method").is_some() && m.get("id").is_none(), "{m}");
    m
}

#[test]
fn stdio_serves_stateless_requests_and_listen() {
    let n = unique("stdio-stateless");
    let mut gw = StdioGateway::start(&server("s0", &n, &["--two-way"], ""), &[]);
    let readme = format!("mock://{n}/readme");

    // No initialize: server/discover, a call and a list, decorated.
    let (_, r) = gw.request(json!("d"), "server/discover", with_meta(json!({})));
    assert_eq!(r["result"]["supportedVersions"][0], V, "{r}");
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-gateway"
    );
    let (_, r) = gw.request(
        json!(1),
        "tools/call",
        with_meta(json!({"name": "s0__echo", "arguments": {"text": "stateless stdio"}})),
    );
    assert_eq!(text(&r), "stateless stdio");
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let (_, r) = gw.request(json!(2), "tools/list", with_meta(json!({})));
    assert_eq!(r["result"]["ttlMs"], 0, "{r}");
    assert_eq!(r["result"]["cacheScope"], "public", "{r}");
    let (_, r) = gw.request(json!(3), "resources/read", with_meta(json!({"uri": "nope://x"})));
    assert_eq!(r["error"]["code"], -32602, "{r}");

    // The _meta rules hold; headers are not asked for.
    let mut no_caps = meta();
    no_caps
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let (_, r) = gw.request(json!(4), "tools/list", json!({"_meta": no_caps}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let mut old = meta();
    old["io.modelcontextprotocol/protocolVersion"] = json!("v999");
    let (_, r) = gw.request(json!(5), "tools/list", json!({"_meta": old}));
    assert_eq!(r["error"]["code"], -32022, "{r}");
    assert_eq!(r["error"]["data"]["requested"], "v999", "{r}");
    let (_, r) = gw.request(json!(6), "ping", with_meta(json!({})));
    assert_eq!(r["error"]["code"], -32601, "{r}");

    // notifications/cancelled cancels a stateless call: it gets no answer, the server hears it.
    let mut md = meta();
    md["progressToken"] = json!("p");
    gw.send(&json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
        "params": {"name": "s0__slow", "arguments": {"seconds": 30, "steps": 30}, "_meta": md}}));
    let progress = next_note(&gw);
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    assert_eq!(progress["params"]["progressToken"], "p", "{progress}");
    gw.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}}));
    assert!(
        wait_log(&gw, "[mock] cancelled"),
        "the server saw the cancellation: {}",
        gw.logs()
    );
    let (others, r) = gw.request(
        json!(7),
        "tools/call",
        with_meta(json!({"name": "s0__echo", "arguments": {"text": "after"}})),
    );
    assert_eq!(text(&r), "after");
    assert!(!others.iter().any(|m| m["id"] == "slow"), "{others:?}");

    // subscriptions/listen: the ack, then tagged notifications of the kinds asked for.
    gw.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen",
        "params": with_meta(json!({"notifications": {"toolsListChanged": true, "resourceSubscriptions": [readme]}}))}));
    let ack = next_note(&gw);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["_meta"][SUB], 9);
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": [readme]})
    );
    gw.send(&json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call",
        "params": with_meta(json!({"name": "s0__update_resource", "arguments": {"uri": readme}}))}));
    let (notes, _) = gw.until_response(&json!(10), T);
    let mut notes = notes.into_iter();
    let updated = match notes.next() {
        Some(u) => u,
        None => next_note(&gw),
    };
    assert_eq!(updated["method"], "notifications/resources/updated", "{updated}");
    assert_eq!(updated["params"]["uri"], readme.as_str());
    assert_eq!(updated["params"]["_meta"][SUB], 9);

    // A second stream, then the first is cancelled: its downstream subscription goes.
    gw.send(
        &json!({"jsonrpc": "2.0", "id": "second", "method": "subscriptions/listen",
        "params": with_meta(json!({"notifications": {"promptsListChanged": true}}))}),
    );
    let ack = next_note(&gw);
    assert_eq!(ack["params"]["_meta"][SUB], "second", "{ack}");
    gw.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}));
    assert!(wait_log(&gw, &format!("unsubscribe {readme}")), "{}", gw.logs());

    // End of input: the open stream gets its graceful response, and the process exits.
    gw.close_stdin();
    let (others, done) = gw.until_response(&json!("second"), T);
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["_meta"][SUB], "second", "{done}");
    let status = gw.wait_exit(T).expect("exits");
    assert!(status.success(), "{status:?}");
    let lines = gw.stdout.lock().unwrap().clone();
    assert!(
        !lines.iter().any(|l| l.contains("\"id\":9,") && l.contains("result")),
        "a cancelled stream gets no response"
    );
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l:.200}"));
        assert_eq!(v["jsonrpc"], "2.0", "{l:.200}");
    }
}

#[test]
fn stdio_questions_become_input_required() {
    let n = unique("stdio-mrtr");
    let mut gw = StdioGateway::start(&server("s0", &n, &["--two-way"], ""), &[]);
    let mut md = meta();
    md["io.modelcontextprotocol/clientCapabilities"] = json!({"elicitation": {}});
    let params = json!({"name": "s0__ask_elicit", "arguments": {"message": "Name?"}, "_meta": md});
    let (others, r) = gw.request(json!(1), "tools/call", params.clone());
    assert!(
        !others
            .iter()
            .any(|m| m.get("method").is_some() && m.get("id").is_some()),
        "no server request on stdout: {others:?}"
    );
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let reqs = r["result"]["inputRequests"].as_object().unwrap().clone();
    assert_eq!(reqs.len(), 1, "{r}");
    let (key, q) = reqs.iter().next().unwrap();
    assert_eq!(q["method"], "elicitation/create");
    let state = r["result"]["requestState"].as_str().unwrap().to_string();

    let mut bad = params.clone();
    bad["requestState"] = json!(format!("{state}0"));
    let (_, r) = gw.request(json!(2), "tools/call", bad);
    assert_eq!(r["error"]["code"], -32602, "{r}");

    let mut retry = params;
    retry["requestState"] = json!(state);
    retry["inputResponses"] = json!({key.clone(): {"action": "accept", "content": {"name": "stdio"}}});
    let (_, r) = gw.request(json!(3), "tools/call", retry.clone());
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(text(&r), r#"{"action":"accept","content":{"name":"stdio"}}"#);
    let (_, r) = gw.request(json!(4), "tools/call", retry);
    assert_eq!(r["error"]["code"], -32602, "a state is used once: {r}");
}

/// `gateway.max_sessions` bounds the listen streams open at once on stdio as it does over
/// HTTP: past it a listen is refused with an error naming the limit (each stream is a
/// task, a client and its subscriptions: a client opening them in a loop grew the
/// gateway without end), and a stream that ends gives its place back.
#[test]
fn stdio_listen_streams_are_bounded_by_max_sessions() {
    let n = unique("stdio-listens");
    let cfg = format!("[gateway]\nmax_sessions = 3\n\n{}", server("s0", &n, &[], ""));
    let mut gw = StdioGateway::start(&cfg, &[]);
    let listen = |id: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
            "params": with_meta(json!({"notifications": {"toolsListChanged": true}}))})
    };
    for id in 1..=3 {
        gw.send(&listen(json!(id)));
        let ack = next_note(&gw);
        assert_eq!(ack["params"]["_meta"][SUB], id, "{ack}");
    }
    gw.send(&listen(json!(4)));
    let (notes, refused) = gw.until_response(&json!(4), T);
    assert!(notes.is_empty(), "{notes:?}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("gateway.max_sessions"), "{refused}");

    // The first stream ends: a new one takes its place (once the stream's task is gone,
    // which the refusals until then say).
    gw.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}));
    let deadline = Instant::now() + T;
    let mut id = 100;
    loop {
        gw.send(&listen(json!(id)));
        let m = gw.recv(T).expect("an answer to the listen");
        if m["method"] == "notifications/subscriptions/acknowledged" {
            assert_eq!(m["params"]["_meta"][SUB], id, "{m}");
            break;
        }
        assert_eq!(m["id"], id, "{m}");
        assert!(
            Instant::now() < deadline,
            "the cancelled stream's place never came back: {m}"
        );
        id += 1;
    }
    gw.close_stdin();
    assert!(gw.wait_exit(T).expect("exits").success());
}
