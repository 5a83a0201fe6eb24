//! The `[gateway]` hardening limits, each against the real binary and real children:
//! max_body, body_timeout, header_timeout, keep_alive_timeout, max_sessions, max_in_flight, max_line (from a
//! child and from a stdio client) and session_idle. Every limit is hit on purpose, its
//! answer checked, and the gateway shown to keep serving everyone else.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(30);

/// A gateway with one mock server `m` and `gateway` as its `[gateway]` table body.
fn gateway(gateway: &str, server_toml: &str) -> (Gateway, String) {
    let name = unique("hard");
    let gw = Gateway::start(&format!(
        "[gateway]\n{gateway}\n\n{}",
        server("m", &name, &[], server_toml)
    ));
    (gw, name)
}

/// The gateway's `host:port`.
fn hostport(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

/// Reads until the peer closes (EOF or reset); returns what arrived and when it closed.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Instant) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, s.read(&mut chunk)).await {
            Err(_) => panic!(
                "the connection is still open after {limit:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, Instant::now()),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

fn assert_between(what: &str, took: Duration, lo: Duration, hi: Duration) {
    assert!(
        took >= lo && took <= hi,
        "{what} took {took:?}, expected {lo:?}..{hi:?}"
    );
}

/// A session still works: a tools/call through the gateway to the mock.
async fn works(s: &Session, what: &str) {
    let r = s.call("m__echo", json!({"text": what})).await;
    assert_eq!(text(&r), what, "{r}");
}

#[tokio::test]
async fn max_body_answers_413_with_a_json_rpc_error() {
    let (gw, _) = gateway("max_body = \"1KiB\"", "");
    let s = gw.session().await;
    let ping =
        |pad: usize| json!({"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"x".repeat(pad)}}).to_string();

    // Just under the limit: served.
    let small = ping(900);
    assert!(small.len() < 1024);
    let r = s
        .post()
        .header("content-type", "application/json")
        .body(small)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["result"], json!({}));

    // 2 KiB with a Content-Length, then the same without one (chunked): 413 each time.
    let big = ping(2048);
    // A one-chunk stream: reqwest sends it chunked, with no Content-Length.
    let bytes = big.clone().into_bytes();
    let chunked = reqwest::Body::wrap_stream(futures::stream::once(async move { Ok::<_, std::io::Error>(bytes) }));
    for body in [reqwest::Body::from(big.clone()), chunked] {
        let r = s
            .post()
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert_eq!(v["error"]["code"], -32600, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("1024 byte limit"), "{msg}");
    }
    works(&s, "after 413").await;
}

#[tokio::test]
async fn a_body_that_trickles_gets_408_after_body_timeout() {
    let (gw, _) = gateway("body_timeout = \"1s\"", "");
    let mut raw = TcpStream::connect(hostport(&gw)).await.unwrap();
    let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n";
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(br#"{"jsonrpc":"2.0","id":1,"#).await.unwrap();
    let sent = Instant::now();

    // Meanwhile other clients are served.
    let s = gw.session().await;
    works(&s, "while one body trickles").await;

    let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), read_response(&mut raw))
        .await
        .expect("no answer to the stalled body within 5 s");
    assert_between(
        "the 408",
        sent.elapsed(),
        Duration::from_millis(900),
        Duration::from_secs(3),
    );
    assert_eq!(status, 408, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("too long"), "{v}");
    works(&s, "after the 408").await;
}

#[tokio::test]
async fn stalled_headers_and_silent_connections_are_closed_after_header_timeout() {
    let (gw, _) = gateway("header_timeout = \"1s\"\nkeep_alive_timeout = \"30s\"", "");
    let addr = hostport(&gw);
    // Half a request head; nothing at all; half a head on a kept-alive connection.
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        .await
        .unwrap();
    let partial_at = Instant::now();
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    let silent_at = Instant::now();
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut kept).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHo").await.unwrap();
    let kept_at = Instant::now();

    // Other clients are served while those three hang on.
    let s = gw.session().await;
    works(&s, "while three connections stall").await;

    for (what, conn, since) in [
        ("partial head", &mut partial, partial_at),
        ("silent", &mut silent, silent_at),
        ("partial head after a request", &mut kept, kept_at),
    ] {
        let (got, closed) = read_until_closed(conn, Duration::from_secs(5)).await;
        assert_between(what, closed - since, Duration::from_millis(900), Duration::from_secs(3));
        // Closed, and nothing written.
        assert!(got.is_empty(), "{what}: {:?}", String::from_utf8_lossy(&got));
    }
    works(&s, "after the stalled connections").await;
}

#[tokio::test]
async fn a_kept_alive_connection_outlives_header_timeout_until_keep_alive_timeout() {
    // A balancer keeps its connections to the gateway open between requests for as long
    // as its own idle timeout: the gateway must not close them after header_timeout.
    let (gw, _) = gateway("header_timeout = \"1s\"\nkeep_alive_timeout = \"3s\"", "");
    let addr = hostport(&gw);
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    let get = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    idle.write_all(get).await.unwrap();
    let (status, _, _) = read_response(&mut idle).await;
    assert_eq!(status, 200);
    // Idle past header_timeout: the connection is still there, and serves the next one.
    // (Nothing can be awaited here but time itself: the wait is what is tested.)
    let mut chunk = [0u8; 64];
    match tokio::time::timeout(Duration::from_millis(1800), idle.read(&mut chunk)).await {
        Err(_) => {}
        Ok(r) => panic!("the idle connection ended before keep_alive_timeout: {r:?}"),
    }
    idle.write_all(get).await.unwrap();
    let (status, _, body) = read_response(&mut idle).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    // A call served for longer than header_timeout, on the same connection: serving is
    // not timed by either.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
    "name": "m__slow", "arguments": {"seconds": 1.5},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    }}})
    .to_string();
    let post = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: m__slow\r\nContent-Length: {}\r\n\r\n{call}",
        call.len()
    );
    let asked = Instant::now();
    idle.write_all(post.as_bytes()).await.unwrap();
    let (status, _, body) = read_response(&mut idle).await;
    assert_eq!(status, 200, "{body}");
    assert!(asked.elapsed() >= Duration::from_millis(1400), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], 7, "{v}");
    assert!(v["result"]["content"].is_array(), "{v}");
    let idle_at = Instant::now();
    // ... and is closed, writing nothing, once idle for keep_alive_timeout.
    let (got, closed) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert_between(
        "idle keep-alive",
        closed - idle_at,
        Duration::from_millis(2900),
        Duration::from_secs(5),
    );
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
}

#[tokio::test]
async fn max_sessions_refuses_initialize_with_503_until_one_ends() {
    // All from 127.0.0.1: one identity's share must not be what stops them.
    let (gw, _) = gateway("max_sessions = 3\nmax_sessions_per_client = 3", "");
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(gw.session().await);
    }
    let init = json!({"jsonrpc":"2.0","id":"init-4","method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("mcp-session-id").is_none());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], "init-4", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("gateway.max_sessions") && msg.contains('3'), "{msg}");
    assert_eq!(gw.get_json("/status").await["sessions"], 3);

    // The open ones still work.
    for s in &open {
        works(s, "at the limit").await;
    }
    // End one: a new initialize succeeds, and the limit holds again after it.
    let gone = open.remove(0);
    assert_eq!(gone.end().await, 200);
    let fresh = gw.session().await;
    works(&fresh, "in the freed slot").await;
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
}

#[tokio::test]
async fn max_in_flight_bounds_one_session_not_the_others() {
    let (gw, _) = gateway("max_in_flight = 2", "");
    let (a, b) = (gw.session().await, gw.session().await);
    // Two slow calls on `a`, each known to be running once its first progress arrives.
    let mut slow = Vec::new();
    for i in 0..2 {
        let mut m = a
            .start(
                json!(format!("slow-{i}")),
                "tools/call",
                json!({"name": "m__slow", "arguments": {"seconds": 2, "steps": 20},
                       "_meta": {"progressToken": format!("p{i}")}}),
            )
            .await;
        let first = m.next(T).await.expect("progress from a running slow call");
        assert_eq!(first["method"], "notifications/progress", "{first}");
        slow.push(m);
    }

    // A third request on `a` is refused at once, naming the limit.
    let t = Instant::now();
    let r = a.call_id(json!("third"), "m__echo", json!({"text": "x"})).await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(r["id"], "third");
    let e = error_of(&r);
    assert_eq!(e["code"], -32600, "{r}");
    assert!(e["message"].as_str().unwrap().contains("gateway.max_in_flight"), "{r}");
    // Another session is not affected.
    works(&b, "other session").await;

    // Both slow calls finish normally; then `a` may call again.
    for mut m in slow {
        let (_, resp) = m.response(T).await;
        assert_eq!(text(&resp), "done", "{resp}");
    }
    works(&a, "after the slow calls").await;
}

/// A stateless (2026-07-28) caller has no session, but its requests in flight are
/// bounded the same: by its address (or identity), one address's third is refused at
/// once, another address's is served.
#[tokio::test]
async fn max_in_flight_bounds_one_stateless_caller_not_the_others() {
    let (gw, _) = gateway("max_in_flight = 2\ntrusted_proxies = [\"127.0.0.1\"]", "");
    let call = |from: &'static str, id: i64, tool: &'static str, arguments: Value| {
        stateless_call_from(gw.url.clone(), from, json!(id), tool, arguments)
    };
    let slow: Vec<_> = (0..2)
        .map(|i| tokio::spawn(call("10.0.0.1", i, "m__slow", json!({"seconds": 2}))))
        .collect();
    assert!(gw.in_flight_is(2).await, "in flight: {}", gw.in_flight().await);
    let t = Instant::now();
    let r = call("10.0.0.1", 3, "m__echo", json!({"text": "x"})).await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let e = error_of(&r);
    assert_eq!(e["code"], -32600, "{r}");
    assert!(e["message"].as_str().unwrap().contains("gateway.max_in_flight"), "{r}");
    let r = call("10.0.0.2", 4, "m__echo", json!({"text": "other"})).await;
    assert_eq!(text(&r), "other", "another address is served: {r}");
    for s in slow {
        let r = s.await.unwrap();
        assert_eq!(text(&r), "done", "{r}");
    }
    let r = call("10.0.0.1", 5, "m__echo", json!({"text": "again"})).await;
    assert_eq!(text(&r), "again", "{r}");
}

#[tokio::test]
async fn an_over_long_child_line_fails_its_call_fast_and_the_child_lives_on() {
    let (gw, _) = gateway("max_line = \"1MiB\"", "timeout = \"20s\"\n");
    let s = gw.session().await;
    let pid = gw.server_status("m").await["pid"].clone();
    assert!(pid.is_number(), "{pid}");

    let t = Instant::now();
    let r = s.call("m__big", json!({"bytes": 2_000_000})).await;
    let took = t.elapsed();
    let e = error_of(&r);
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("'m'") && msg.contains("gateway.max_line"), "{msg}");
    assert!(msg.contains(&(1u64 << 20).to_string()), "{msg}");
    assert!(took < Duration::from_secs(5), "the over-long answer took {took:?}");

    // Under the limit it goes through whole, on the same child.
    let r = s.call("m__big", json!({"bytes": 500_000})).await;
    assert_eq!(text(&r).len(), 500_000);
    let st = gw.server_status("m").await;
    assert_eq!(st["pid"], pid, "{st}");
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["restarts"], 0, "{st}");
    assert!(alive(pid.as_i64().unwrap() as i32));
    works(&s, "after max_line").await;
}

#[test]
fn stdio_front_answers_an_over_long_line_with_32600_and_goes_on() {
    // No servers: with a 1 KiB max_line the mock's own tools/list would be over it too.
    let mut gw = StdioGateway::start("[gateway]\nmax_line = \"1KiB\"\n", &[]);
    let init = gw.initialize();
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-gateway", "{init}");

    let long = json!({"jsonrpc":"2.0","id":5,"method":"ping","params":{"pad":"x".repeat(4096)}});
    gw.send(&long);
    let m = gw.recv(T).expect("an answer to the over-long line");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    let msg = m["error"]["message"].as_str().unwrap();
    assert!(msg.contains("gateway.max_line") && msg.contains("1024"), "{msg}");

    // The stream is still in step: a normal request (just under the limit, too) works.
    let (_, r) = gw.request(json!(6), "ping", json!({"pad": "y".repeat(900)}));
    assert_eq!(r["result"], json!({}), "{r}");
    let (_, r) = gw.request(json!(7), "tools/list", json!({}));
    assert_eq!(r["result"]["tools"], json!([]), "{r}");
}

#[tokio::test]
async fn idle_sessions_expire_but_not_while_a_get_stream_is_open() {
    let (gw, _) = gateway("session_idle = \"1s\"", "");
    let streaming = gw.session().await;
    let stream = streaming.get_stream().await;
    let idle = gw.session().await;
    let last_use = Instant::now();

    // Wait (without touching it: any request counts as use) for the janitor to end `idle`.
    let logs = gw.stderr.clone();
    let expired = |id: &str| {
        // Logs name a session by its tag, never by its id.
        let needle = sha256_hex(id)[..16].to_string();
        let logs = logs.clone();
        move || {
            logs.lock()
                .unwrap()
                .lines()
                .any(|l| l.contains("session expired") && l.contains(&needle))
        }
    };
    assert!(until(Duration::from_secs(5), expired(&idle.id)).await, "{}", gw.logs());
    assert_between(
        "expiry",
        last_use.elapsed(),
        Duration::from_millis(900),
        Duration::from_secs(3),
    );
    let r = idle
        .post()
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // The one with a GET stream has been as idle, yet lives; its stream is still open.
    assert!(!expired(&streaming.id)());
    assert_eq!(gw.get_json("/status").await["sessions"], 1);
    works(&streaming, "with its GET stream open").await;

    // Once its stream closes, it too expires.
    drop(stream);
    let closed = Instant::now();
    assert!(
        until(Duration::from_secs(5), expired(&streaming.id)).await,
        "{}",
        gw.logs()
    );
    assert!(closed.elapsed() < Duration::from_secs(3), "{:?}", closed.elapsed());
    assert_eq!(gw.get_json("/status").await["sessions"], 0);
}

/// Not a `[gateway]` key, but the same family: a server announcing list_changed faster
/// than the gateway re-lists it. The child's pipe hands notifications to the supervisor
/// through a bounded queue (64), and the supervisor used to re-list inline: with the
/// queue full the pipe task waited on the supervisor, which waited for a tools/list
/// answer only the pipe task could read, so every call to that server hung until its
/// timeout. Re-lists are now coalesced while one is running.
#[tokio::test]
async fn a_burst_of_list_changed_does_not_wedge_the_server() {
    let (gw, _) = gateway("", "timeout = \"10s\"\n");
    let s = std::sync::Arc::new(gw.session().await);
    let t = Instant::now();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                s.call_id(json!(i), "m__add_tool", json!({"name": format!("t{i}")}))
                    .await
            })
        })
        .collect();
    for c in calls {
        let r = c.await.unwrap();
        assert_eq!(text(&r), "added", "{r}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "200 add_tool took {:?}",
        t.elapsed()
    );
    works(&s, "after the burst").await;
    // The last re-list happened after the last notification: every tool is in the catalog.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names = s.tool_names().await;
        if (0..200).all(|i| names.contains(&format!("m__t{i}"))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "catalog never caught up: {} tools",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
