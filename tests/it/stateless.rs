//! The 2026-07-28 (stateless) era on the public endpoint: server/discover, stateless
//! calls and lists, the binding's validation errors (HTTP status and JSON-RPC code),
//! removed methods, result decoration, logging only with logLevel, servers' questions
//! refused without the capability, and a handshake session working side by side.

use crate::common::*;
use serde_json::{json, Value};

const V: &str = "2026-07-28";

fn meta() -> Value {
    stateless_meta("stateless-test")
}

/// The headers a conforming client derives from the body.
fn headers(method: &str, params: &Value) -> Vec<(String, String)> {
    let mut h = vec![
        ("mcp-protocol-version".to_string(), V.to_string()),
        ("mcp-method".to_string(), method.to_string()),
    ];
    let name = match method {
        "tools/call" | "prompts/get" => params.get("name"),
        "resources/read" => params.get("uri"),
        _ => None,
    };
    if let Some(Value::String(n)) = name {
        h.push(("mcp-name".to_string(), n.clone()));
    }
    h
}

/// POSTs one request with exactly `hdrs`; returns the HTTP status and every message.
async fn raw(gw: &Gateway, hdrs: &[(String, String)], body: Value) -> (u16, Vec<Value>) {
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream");
    for (k, v) in hdrs {
        req = req.header(k.as_str(), v.as_str());
    }
    let r = req.json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, read_messages(r).await)
}

/// A well-formed stateless request; `params` gets the standard `_meta` unless it has one.
async fn stateless(gw: &Gateway, id: Value, method: &str, mut params: Value) -> (u16, Vec<Value>) {
    if params.get("_meta").is_none() {
        params["_meta"] = meta();
    }
    let h = headers(method, &params);
    raw(
        gw,
        &h,
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
    )
    .await
}

fn last(msgs: &[Value]) -> &Value {
    msgs.last().expect("a response")
}

fn assert_error(status: u16, msgs: &[Value], want_status: u16, want_code: i64, id: Value) {
    let r = last(msgs);
    assert_eq!(status, want_status, "{r}");
    assert_eq!(r["error"]["code"], want_code, "{r}");
    assert_eq!(r["id"], id, "{r}");
}

fn decorated(r: &Value) {
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-gateway",
        "{r}"
    );
}

fn cacheable(r: &Value, scope: &str) {
    assert_eq!(r["result"]["ttlMs"], 0, "{r}");
    assert_eq!(r["result"]["cacheScope"], scope, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_lists_calls_and_decoration() {
    let n = unique("mod");
    let gw = Gateway::start(&server("s0", &n, &["--two-way"], ""));

    let (st, m) = stateless(&gw, json!("d"), "server/discover", json!({})).await;
    assert_eq!(st, 200);
    let r = last(&m);
    assert_eq!(r["id"], "d");
    decorated(r);
    cacheable(r, "public");
    let versions = r["result"]["supportedVersions"].as_array().unwrap();
    assert_eq!(versions[0], V);
    assert!(versions.contains(&json!("2025-11-25")), "{r}");
    let caps = &r["result"]["capabilities"];
    assert!(
        caps["tools"].is_object() && caps["prompts"].is_object() && caps["resources"].is_object(),
        "{r}"
    );
    assert!(caps.get("tasks").is_none(), "{r}");
    // What subscriptions/listen delivers is advertised.
    assert_eq!(caps["resources"]["subscribe"], true, "{r}");
    assert_eq!(caps["tools"]["listChanged"], true, "{r}");

    let (st, m) = stateless(&gw, json!(1), "tools/list", json!({})).await;
    assert_eq!(st, 200);
    let r = last(&m);
    decorated(r);
    cacheable(r, "public");
    assert!(
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "s0__echo"),
        "{r}"
    );

    for (method, key) in [
        ("prompts/list", "prompts"),
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
    ] {
        let (st, m) = stateless(&gw, json!(2), method, json!({})).await;
        assert_eq!(st, 200, "{method}");
        decorated(last(&m));
        cacheable(last(&m), "public");
        assert!(last(&m)["result"][key].is_array(), "{method}: {}", last(&m));
    }

    let (st, m) = stateless(
        &gw,
        json!(3),
        "tools/call",
        json!({"name": "s0__echo", "arguments": {"text": "hi"}}),
    )
    .await;
    assert_eq!(st, 200);
    let r = last(&m);
    decorated(r);
    assert_eq!(text(r), "hi");
    assert!(r["result"].get("ttlMs").is_none(), "tools/call is not cacheable: {r}");

    // The era's own _meta keys stay with the gateway; others (progressToken) go through.
    let (_, m) = stateless(
        &gw,
        json!(4),
        "tools/call",
        json!({"name": "s0__echo_meta", "arguments": {}}),
    )
    .await;
    let seen: Value = serde_json::from_str(&text(last(&m))).unwrap();
    assert!(seen.get("io.modelcontextprotocol/protocolVersion").is_none(), "{seen}");

    // resources/read: private; an unknown URI is -32602 with data.uri.
    let (_, m) = stateless(&gw, json!(5), "resources/list", json!({})).await;
    let uri = last(&m)["result"]["resources"][0]["uri"].as_str().unwrap().to_string();
    let (st, m) = stateless(&gw, json!(6), "resources/read", json!({"uri": uri})).await;
    assert_eq!(st, 200);
    decorated(last(&m));
    cacheable(last(&m), "private");
    let (st, m) = stateless(&gw, json!(7), "resources/read", json!({"uri": "nope://x"})).await;
    assert_error(st, &m, 200, -32602, json!(7));
    assert_eq!(last(&m)["error"]["data"]["uri"], "nope://x");

    // Progress still flows (SSE) with a progress token.
    let mut p = json!({"name": "s0__slow", "arguments": {"seconds": 0.2, "steps": 2}});
    let mut md = meta();
    md["progressToken"] = json!("tok");
    p["_meta"] = md;
    let (st, m) = stateless(&gw, json!(8), "tools/call", p).await;
    assert_eq!(st, 200);
    let progress: Vec<_> = m.iter().filter(|x| x["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 2, "{m:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "tok");
    decorated(last(&m));

    // A server's question cannot reach a stateless client: refused, naming the capability.
    let (_, m) = stateless(
        &gw,
        json!(9),
        "tools/call",
        json!({"name": "s0__ask_sampling", "arguments": {"prompt": "x"}}),
    )
    .await;
    let r = last(&m);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(r).contains("sampling"), "{r}");
    assert!(
        !m.iter().any(|x| x.get("method").is_some() && x.get("id").is_some()),
        "no requests on the stream: {m:?}"
    );
    // With the capability declared, the question comes back as input_required (see
    // tests/it/stateless_rounds.rs), never as a request on the stream.
    let mut p = json!({"name": "s0__ask_sampling", "arguments": {"prompt": "x"}});
    let mut md = meta();
    md["io.modelcontextprotocol/clientCapabilities"] = json!({"sampling": {}});
    p["_meta"] = md;
    let (_, m) = stateless(&gw, json!(10), "tools/call", p).await;
    let r = last(&m);
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    assert!(
        !m.iter().any(|x| x.get("method").is_some() && x.get("id").is_some()),
        "{m:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_and_removed_methods() {
    let n = unique("modv");
    let gw = Gateway::start(&server("s0", &n, &[], ""));
    let d = |params: Value| json!({"jsonrpc": "2.0", "id": 11, "method": "server/discover", "params": params});
    let std_h = headers("server/discover", &json!({}));

    // _meta missing, or without protocolVersion / clientCapabilities: 400, -32602.
    let mut no_version = meta();
    no_version
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/protocolVersion");
    let mut no_caps = meta();
    no_caps
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    for params in [json!({}), json!({"_meta": no_version}), json!({"_meta": no_caps})] {
        let (st, m) = raw(&gw, &std_h, d(params)).await;
        assert_error(st, &m, 400, -32602, json!(11));
    }
    // clientInfo is optional.
    let mut no_info = meta();
    no_info
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientInfo");
    let (st, m) = raw(&gw, &std_h, d(json!({"_meta": no_info}))).await;
    assert_eq!(st, 200, "{m:?}");

    // Unsupported version: 400, -32022, data {supported, requested}.
    let mut old = meta();
    old["io.modelcontextprotocol/protocolVersion"] = json!("v999");
    let h = vec![
        ("mcp-protocol-version".to_string(), "v999".to_string()),
        ("mcp-method".to_string(), "server/discover".to_string()),
    ];
    let (st, m) = raw(&gw, &h, d(json!({"_meta": old.clone()}))).await;
    assert_error(st, &m, 400, -32022, json!(11));
    assert_eq!(last(&m)["error"]["data"]["requested"], "v999");
    assert_eq!(last(&m)["error"]["data"]["supported"][0], V);

    // Header vs _meta version mismatch, missing headers, Mcp-Method / Mcp-Name mismatch: -32020.
    let (st, m) = raw(&gw, &std_h, d(json!({"_meta": old}))).await;
    assert_error(st, &m, 400, -32020, json!(11));
    let only_method = vec![("mcp-method".to_string(), "server/discover".to_string())];
    let (st, m) = raw(&gw, &only_method, d(json!({"_meta": meta()}))).await;
    assert_error(st, &m, 400, -32020, json!(11));
    let only_version = vec![("mcp-protocol-version".to_string(), V.to_string())];
    let (st, m) = raw(&gw, &only_version, d(json!({"_meta": meta()}))).await;
    assert_error(st, &m, 400, -32020, json!(11));
    let wrong_method = vec![
        ("mcp-protocol-version".to_string(), V.to_string()),
        ("mcp-method".to_string(), "tools/list".to_string()),
    ];
    let (st, m) = raw(&gw, &wrong_method, d(json!({"_meta": meta()}))).await;
    assert_error(st, &m, 400, -32020, json!(11));
    let call = json!({"name": "s0__echo", "arguments": {"text": "x"}, "_meta": meta()});
    let body = json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": call});
    let mut h = headers("tools/call", &call);
    h.retain(|(k, _)| k != "mcp-name");
    let (st, m) = raw(&gw, &h, body.clone()).await;
    assert_error(st, &m, 400, -32020, json!("c"));
    h.push(("mcp-name".to_string(), "s0__add".to_string()));
    let (st, m) = raw(&gw, &h, body.clone()).await;
    assert_error(st, &m, 400, -32020, json!("c"));
    // Whitespace around a value is not part of it; the Base64 sentinel form is decoded.
    h.pop();
    h.push(("mcp-name".to_string(), "  s0__echo ".to_string()));
    let (st, _) = raw(&gw, &h, body.clone()).await;
    assert_eq!(st, 200);
    h.pop();
    h.push(("mcp-name".to_string(), "=?base64?czBfX2VjaG8=?=".to_string()));
    let (st, m) = raw(&gw, &h, body.clone()).await;
    assert_eq!(st, 200, "{m:?}");
    h.pop();
    h.push(("mcp-name".to_string(), "=?base64?czBfX2VjaG8?=".to_string()));
    let (st, m) = raw(&gw, &h, body).await;
    assert_error(st, &m, 400, -32020, json!("c"));

    // Removed and unknown methods: 404, -32601 (initialize only with stateless _meta).
    for method in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/list",
        "unknown/method",
    ] {
        let (st, m) = stateless(&gw, json!(500), method, json!({})).await;
        assert_error(st, &m, 404, -32601, json!(500));
    }

    // A legacy request without a session is still refused as before.
    let legacy = vec![("mcp-protocol-version".to_string(), "2025-11-25".to_string())];
    let (st, _) = raw(&gw, &legacy, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})).await;
    assert_eq!(st, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logging_only_with_log_level_and_sessions_side_by_side() {
    let n = unique("modl");
    let gw = Gateway::start(&server("s0", &n, &[], ""));
    let call = |md: Value| json!({"name": "s0__log", "arguments": {"message": "hello"}, "_meta": md});

    let (_, m) = stateless(&gw, json!(1), "tools/call", call(meta())).await;
    assert!(
        !m.iter().any(|x| x["method"] == "notifications/message"),
        "no logLevel, no logs: {m:?}"
    );
    assert_eq!(text(last(&m)), "logged");

    let mut md = meta();
    md["io.modelcontextprotocol/logLevel"] = json!("info");
    let (_, m) = stateless(&gw, json!(2), "tools/call", call(md)).await;
    assert!(
        m.iter().any(|x| x["method"] == "notifications/message"),
        "logLevel info: {m:?}"
    );

    let mut md = meta();
    md["io.modelcontextprotocol/logLevel"] = json!("error");
    let (_, m) = stateless(&gw, json!(3), "tools/call", call(md)).await;
    assert!(
        !m.iter().any(|x| x["method"] == "notifications/message"),
        "info is below error: {m:?}"
    );

    let mut md = meta();
    md["io.modelcontextprotocol/logLevel"] = json!("loud");
    let (st, m) = stateless(&gw, json!(4), "tools/call", call(md)).await;
    assert_error(st, &m, 400, -32602, json!(4));

    // A handshake session works beside stateless clients, undecorated.
    let s = gw.session().await;
    let r = s.call("s0__echo", json!({"text": "old"})).await;
    assert_eq!(text(&r), "old");
    assert!(r["result"].get("resultType").is_none(), "{r}");
    let r = s.request(json!(2), "ping", json!({})).await;
    assert_eq!(r["result"], json!({}));
    let (st, m) = stateless(
        &gw,
        json!(5),
        "tools/call",
        json!({"name": "s0__echo", "arguments": {"text": "new"}}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text(last(&m)), "new");
}
