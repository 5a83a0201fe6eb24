//! Bad input to the HTTP endpoint: each gets the right status and JSON-RPC error, and
//! the gateway keeps serving.

use crate::common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};

fn gateway() -> Gateway {
    let name = unique("in");
    Gateway::start(&format!(
        "[gateway]\nmax_body = \"1KiB\"\n\n{}",
        server("m", &name, &[], "")
    ))
}

/// POSTs a raw body with the session header (when given); returns status and JSON body.
async fn post_raw(gw: &Gateway, session: Option<&str>, body: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    let r = req.body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

#[tokio::test]
async fn malformed_and_wrong_shape_messages() {
    let gw = gateway();
    let s = gw.session().await;
    let (st, v) = post_raw(&gw, Some(&s.id), "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":").await;
    assert_eq!((st, code(&v)), (400, -32700), "{v}");
    assert_eq!(v["id"], Value::Null);
    for bad in [
        r#"{"jsonrpc":"2.0","id":1}"#,
        "[]",
        r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
        r#"{"id":1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#,
        "42",
    ] {
        let (st, v) = post_raw(&gw, Some(&s.id), bad).await;
        assert_eq!((st, code(&v)), (400, -32600), "{bad} → {v}");
    }
    // Still serving the same session.
    assert_eq!(s.request(json!(1), "ping", json!({})).await["result"], json!({}));
}

#[tokio::test]
async fn session_header_rules() {
    let gw = gateway();
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let (st, v) = post_raw(&gw, None, ping).await;
    assert_eq!((st, code(&v)), (400, -32600), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("Mcp-Session-Id"),
        "{v}"
    );
    let (st, _) = post_raw(&gw, Some("0123456789abcdef0123456789abcdef"), ping).await;
    assert_eq!(st, 404);

    let s = gw.session().await;
    let (st, v) = post_raw(&gw, Some(&s.id), ping).await;
    assert_eq!((st, &v["result"]), (200, &json!({})));
    assert_eq!(s.end().await, 200);
    let (st, _) = post_raw(&gw, Some(&s.id), ping).await;
    assert_eq!(st, 404, "a deleted session must be gone");
    assert_eq!(s.end().await, 404);
    let get = s
        .http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 404);
}

#[tokio::test]
async fn origin_and_host_are_checked() {
    let gw = gateway();
    let s = gw.session().await;
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let r = s
        .post()
        .header("origin", "http://evil.example")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("evil.example"), "{v}");
    // initialize from a bad origin opens no session.
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("origin", "http://evil.example")
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("mcp-session-id").is_none());

    let r = s
        .post()
        .header("origin", "http://localhost:1234")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["result"], json!({}));

    // Host: written by hand so the client library cannot fix it up.
    let body = ping.to_string();
    let addr = gw.base.strip_prefix("http://").unwrap().to_string();
    let path = gw.url.strip_prefix(&gw.base).unwrap().to_string();
    let raw = |host: &str| {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            c,
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            s.id,
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let evil = raw("evil.example.com");
    assert!(evil.starts_with("HTTP/1.1 403"), "{evil}");
    let local = raw(&addr);
    assert!(local.starts_with("HTTP/1.1 200"), "{local}");
}

#[tokio::test]
async fn body_limit_and_protocol_version() {
    let gw = gateway();
    let s = gw.session().await;
    let big = "y".repeat(2048);
    let r = s.post().json(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"m__echo","arguments":{"text": big}}})).send().await.unwrap();
    assert_eq!(r.status(), 413);
    // Just under the limit is fine.
    let small = "y".repeat(600);
    assert_eq!(text(&s.call("m__echo", json!({"text": small})).await), small);

    let r = s
        .http
        .post(&s.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", "1999-01-01")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("1999-01-01"), "{v}");
    // An older supported revision is accepted.
    let r = s
        .http
        .post(&s.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", "2025-03-26")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn unknown_tool_and_method() {
    let gw = gateway();
    let s = gw.session().await;
    let r = s.call_id(json!("u1"), "m__no_such_tool", json!({})).await;
    assert_eq!(r["id"], "u1");
    let e = error_of(&r);
    assert!(e["message"].as_str().unwrap().contains("m__no_such_tool"), "{r}");
    assert_eq!(e["code"], -32602);
    let r = s.call("nobody__echo", json!({})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("nobody__echo"),
        "{r}"
    );
    let r = s.request(json!(3), "tools/frobnicate", json!({})).await;
    assert_eq!(r["id"], 3);
    assert_eq!(error_of(&r)["code"], -32601, "{r}");
    let r = s.request(json!(4), "prompts/get", json!({"name": "m__nope"})).await;
    assert!(error_of(&r)["message"].as_str().unwrap().contains("m__nope"), "{r}");
}

/// Accept, parsed as a list of media ranges with q-values (q=0 refuses): a POST must
/// admit application/json or text/event-stream (`*/*` and `application/*` do; a missing
/// Accept is fine), else 406 saying what to send; a GET must admit text/event-stream
/// (`*/*` and `text/*` do), else 406.
#[tokio::test]
async fn accept_must_admit_what_the_answer_is() {
    let gw = gateway();
    let s = gw.session().await;
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let post = |accept: Option<&str>| {
        let mut req = s.http.post(&s.url).header("mcp-session-id", &s.id).json(&ping);
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        req.send()
    };
    for refused in [
        "text/html",
        "application/json;q=0, text/event-stream;q=0",
        "image/*, text/plain",
        "*/*;q=0",
    ] {
        let r = post(Some(refused)).await.unwrap();
        assert_eq!(r.status(), 406, "Accept: {refused}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(code(&v), -32600, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("Accept: application/json, text/event-stream"), "{msg}");
    }
    for admitted in [
        None,
        Some("*/*"),
        Some("application/*"),
        Some("Application/JSON; charset=utf-8"),
        Some("text/event-stream"),
        Some("text/event-stream;q=0, */*;q=0.1"),
    ] {
        let r = post(admitted).await.unwrap();
        assert_eq!(r.status(), 200, "Accept: {admitted:?}");
    }
    // A POST with no Accept header at all (raw: reqwest would add one) is served.
    let (host, path) = gw.url.trim_start_matches("http://").split_once('/').unwrap();
    let body = ping.to_string();
    let mut c = std::net::TcpStream::connect(host).unwrap();
    write!(
        c,
        "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nMcp-Session-Id: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.id,
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let get = |accept: Option<&'static str>| {
        let mut req = s.http.get(&s.url).header("mcp-session-id", &s.id);
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        req.send()
    };
    // (reqwest sends `Accept: */*` when none is set, so `None` is not a missing Accept.)
    for refused in [
        Some("application/json"),
        Some("text/event-stream;q=0"),
        Some("text/*;q=0, application/*"),
    ] {
        let r = get(refused).await.unwrap();
        assert_eq!(r.status(), 406, "GET Accept: {refused:?}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains("text/event-stream"),
            "{v}"
        );
    }
    for admitted in ["text/*", "*/*", "text/event-stream; q=0.5"] {
        // One GET stream per session: each in a session of its own.
        let other = gw.session().await;
        let r = other
            .http
            .get(&other.url)
            .header("mcp-session-id", &other.id)
            .header("accept", admitted)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "GET Accept: {admitted}");
    }
}

/// JSON-RPC batches in a 2025-03-26 session (the one revision that has them): the answer
/// is an array of the requests' responses, each by its id; a batch of notifications only
/// is 202; an empty batch is -32600, `initialize` in a batch is refused with an error, and
/// an element that is no message gets an error with a null id. Later sessions keep
/// refusing batches (400, -32600), saying why.
#[tokio::test]
async fn batches_in_a_2025_03_26_session() {
    let gw = gateway();
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"batch","version":"1"}}});
    let r = http
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["result"]["protocolVersion"], "2025-03-26");
    let post = |body: Value| {
        http.post(&gw.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", "2025-03-26")
            .json(&body)
            .send()
    };
    let by_id = |answers: &Value, id: Value| -> Value {
        answers
            .as_array()
            .unwrap_or_else(|| panic!("not an array: {answers}"))
            .iter()
            .find(|a| a["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no answer with id {id} in {answers}"))
    };
    let r = post(json!([
        {"jsonrpc":"2.0","method":"notifications/initialized"},
        {"jsonrpc":"2.0","id":1,"method":"ping"},
        {"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"m__echo","arguments":{"text":"in a batch"}}},
    ]))
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let answers: Value = r.json().await.unwrap();
    assert_eq!(answers.as_array().map(Vec::len), Some(2), "{answers}");
    assert_eq!(by_id(&answers, json!(1))["result"], json!({}));
    assert_eq!(text(&by_id(&answers, json!("b"))), "in a batch");

    let r = post(json!([{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}]))
        .await
        .unwrap();
    assert_eq!(r.status(), 202);

    let r = post(json!([])).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(code(&v), -32600, "{v}");

    let r = post(json!([
        {"jsonrpc":"2.0","id":9,"method":"initialize","params":init["params"]},
        {"jsonrpc":"2.0","id":10,"method":"ping"},
        42,
    ]))
    .await
    .unwrap();
    let answers: Value = r.json().await.unwrap();
    let refused = by_id(&answers, json!(9));
    assert_eq!(code(&refused), -32600, "{refused}");
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("initialize"),
        "{refused}"
    );
    assert_eq!(by_id(&answers, json!(10))["result"], json!({}));
    assert_eq!(code(&by_id(&answers, Value::Null)), -32600, "{answers}");

    // A 2025-11-25 session: still refused, with the reason.
    let s = gw.session().await;
    let (st, v) = post_raw(&gw, Some(&s.id), r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).await;
    assert_eq!((st, code(&v)), (400, -32600), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("2025-03-26 only"), "{msg}");
}
