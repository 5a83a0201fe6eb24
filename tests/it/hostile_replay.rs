//! Replay probes of issue #13: hostile clients and misbehaving children that the gateway
//! already withstands. Each is bounded in count and time and talks to the real binary on
//! loopback only: malformed, deep and huge bodies; slowloris heads and bodies; a request
//! with 10,000 headers; two sessions with the same request ids; cancelling and
//! (un)subscribing across sessions; kill -9 and SIGSTOP of a child under calls; 2,000 GET
//! streams opened and closed; and secrets at trace level.

use crate::common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(10);

/// A gateway with one mock server `m` (extra `server_toml`) and `gateway` as its
/// `[gateway]` table body.
fn gateway(gateway: &str, server_toml: &str) -> Gateway {
    Gateway::start(&format!(
        "[gateway]\n{gateway}\n\n{}",
        server("m", &unique("replay"), &[], server_toml)
    ))
}

fn hostport(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

/// A session still works: a tools/call through the gateway to the mock.
async fn works(s: &Session, what: &str) {
    let r = s.call("m__echo", json!({"text": what})).await;
    assert_eq!(text(&r), what, "{r}");
}

/// A POST of `body` (raw bytes) on session `s`: status and body as JSON (Null if none).
async fn post_raw(s: &Session, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let (status, text) = s.post_text(body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Reads until the peer closes (EOF or reset), at most `limit`; what arrived, and
/// whether it closed.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The status code of the first HTTP response in `raw`.
fn status_of(raw: &[u8]) -> Option<u16> {
    let head = String::from_utf8_lossy(raw);
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// (a) A body that is not JSON, one nested 200 deep, and one over max_body: each gets
/// its answer, and the gateway goes on serving.
#[tokio::test]
async fn a_malformed_deep_and_huge_bodies_get_their_codes() {
    let gw = gateway("max_body = \"64KiB\"", "");
    let s = gw.session().await;

    let (status, v) = post_raw(&s, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":").await;
    assert_eq!((status, v["error"]["code"].as_i64()), (400, Some(-32700)), "{v}");
    let (status, v) = post_raw(&s, "\u{0}\u{1}garbage").await;
    assert_eq!((status, v["error"]["code"].as_i64()), (400, Some(-32700)), "{v}");

    // Past the nesting bound (64 levels; serde_json's own recursion limit is 128) a
    // request is refused at parse, without a stack overflow; within it, a ping is answered.
    let nest = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    for depth in [200, 30_000] {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"a":{}}}}}"#,
            nest(depth)
        );
        let (status, v) = post_raw(&s, deep).await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (400, &json!(-32600)),
            "depth {depth}: {v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap_or_default().contains("64 levels"),
            "{v}"
        );
    }
    let shallow = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"a":{}}}}}"#,
        nest(60)
    );
    let (status, v) = post_raw(&s, shallow).await;
    assert_eq!((status, &v["result"]), (200, &json!({})), "depth 60: {v}");
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"m__echo","arguments":{{"text":"deep","x":{}}}}}}}"#,
        nest(58)
    );
    let (status, v) = post_raw(&s, deep).await;
    assert_eq!(
        (status, v["result"]["content"][0]["text"].as_str()),
        (200, Some("deep")),
        "{v}"
    );
    // A deep array as the whole body (a batch of batches): refused.
    let (status, v) = post_raw(&s, nest(200)).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["code"].is_i64(), "{v}");

    // 512 KiB against a 64 KiB limit, with a length and chunked, on one connection: the
    // 413s come whole, and the connection still carries the next request.
    let huge = json!({"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad":"x".repeat(512 << 10)}}).to_string();
    let bytes = huge.clone().into_bytes();
    let chunked = reqwest::Body::wrap_stream(futures::stream::once(async move { Ok::<_, std::io::Error>(bytes) }));
    for body in [reqwest::Body::from(huge), chunked] {
        let (status, v) = post_raw(&s, body).await;
        assert_eq!((status, v["error"]["code"].as_i64()), (413, Some(-32600)), "{v}");
    }
    works(&s, "after the bad bodies").await;
    let fresh = gw.session().await;
    works(&fresh, "a new session after the bad bodies").await;
}

/// (b) Slowloris: a head trickled a byte every 100 ms (slower than header_timeout allows
/// in total) is cut off; a body trickled likewise gets 408 after body_timeout. Others
/// are served meanwhile.
#[tokio::test]
async fn b_slowloris_heads_and_bodies_are_cut_off() {
    let gw = gateway("header_timeout = \"1s\"\nbody_timeout = \"1s\"", "");
    let addr = hostport(&gw);

    let head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let conn = TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = conn.into_split();
    let t0 = Instant::now();
    let trickle = tokio::spawn(async move {
        for b in head.iter() {
            if wr.write_all(&[*b]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), rd.read(&mut chunk)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    };
    let took = t0.elapsed();
    assert!(closed, "a trickled head kept its connection for 5 s");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    // The head never completed: hyper closes without a response, or with a 408.
    assert!(
        got.is_empty() || status_of(&got) == Some(408),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    trickle.abort();

    // A body trickled a byte every 100 ms: the whole body gets body_timeout, not each byte.
    let s = gw.session().await;
    let mut raw = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
         Mcp-Protocol-Version: 2025-11-25\r\nContent-Length: 200\r\n\r\n",
        s.id
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let (mut rd, mut wr) = raw.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..200 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    works(&s, "while a body trickles").await;
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), rd.read(&mut chunk))
            .await
            .expect("no answer to a trickled body within 5 s")
            .unwrap_or(0);
        assert!(n > 0, "closed without an answer: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    let took = t0.elapsed();
    assert_eq!(status_of(&got), Some(408), "{:?}", String::from_utf8_lossy(&got));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "408 after {took:?}"
    );
    trickle.abort();
    // And a new session is served after it.
    works(&gw.session().await, "after the slowloris").await;
}

/// (c) One request with 10,000 headers is refused (431, or the connection closed); the
/// gateway lives on.
#[tokio::test]
async fn c_ten_thousand_headers_are_refused() {
    let gw = gateway("", "");
    let s = gw.session().await;
    let mut req = String::from("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n");
    for i in 0..10_000 {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut raw = TcpStream::connect(hostport(&gw)).await.unwrap();
    // The gateway may stop reading (and close) before all of it is written.
    let _ = raw.write_all(req.as_bytes()).await;
    let (got, closed) = read_until_closed(&mut raw, Duration::from_secs(5)).await;
    assert!(closed, "the connection stayed open");
    assert_eq!(status_of(&got), Some(431), "{:?}", String::from_utf8_lossy(&got));
    works(&s, "after 10,000 headers").await;
}

/// (d) Two sessions of the same client name send the same request ids, interleaved:
/// 2,000 calls each, and every answer is the session's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_same_request_ids_in_two_sessions_get_their_own_answers() {
    const CALLS: usize = 2000;
    const LANES: usize = 8;
    let gw = gateway("", "");
    let (a, b) = (Arc::new(gw.session().await), Arc::new(gw.session().await));
    let mut tasks = Vec::new();
    for (tag, s) in [("A", a), ("B", b)] {
        for lane in 0..LANES {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut wrong = Vec::new();
                for i in (lane..CALLS).step_by(LANES) {
                    let want = format!("{tag}-{i}");
                    let r = s.call_id(json!(i), "m__echo", json!({"text": want})).await;
                    if r["id"] != json!(i) || r["result"]["content"][0]["text"] != want.as_str() {
                        wrong.push(r);
                    }
                }
                wrong
            }));
        }
    }
    let t0 = Instant::now();
    for t in tasks {
        let wrong = t.await.unwrap();
        assert!(wrong.is_empty(), "{} wrong answers, first {}", wrong.len(), wrong[0]);
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}

/// (e) Session B cancelling request id 7 does not cancel A's request 7; B's
/// (un)subscribes do not touch A's subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_cancel_and_subscribe_do_not_cross_sessions() {
    let name = unique("cross");
    let gw = Gateway::start(&server("m", &name, &["--two-way"], ""));
    let (a, b) = (gw.session().await, gw.session().await);
    let mut call = a
        .start(
            json!(7),
            "tools/call",
            json!({"name": "m__slow", "arguments": {"seconds": 1.0, "steps": 4},
                   "_meta": {"progressToken": "a7"}}),
        )
        .await;
    let first = call.next(T).await.expect("progress from A's call");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    for id in [json!(7), json!("7")] {
        b.notify("notifications/cancelled", json!({"requestId": id, "reason": "hostile"}))
            .await;
    }
    let (_, resp) = call.response(T).await;
    assert_eq!(text(&resp), "done", "{resp}");
    assert!(!gw.logs().contains("[mock] cancelled"), "{}", gw.logs());

    let uri = format!("mock://{name}/readme");
    let mut a_get = a.get_stream().await;
    sub(&a, "resources/subscribe", &uri).await;
    // B unsubscribes what it never subscribed, twice; then subscribes and unsubscribes.
    sub(&b, "resources/unsubscribe", &uri).await;
    sub(&b, "resources/unsubscribe", &uri).await;
    sub(&b, "resources/subscribe", &uri).await;
    sub(&b, "resources/unsubscribe", &uri).await;
    let mut b_get = b.get_stream().await;
    let r = b.call_id(json!("u"), "m__update_resource", json!({"uri": uri})).await;
    assert_eq!(text(&r), format!("updated {uri}"), "{r}");
    // A, still subscribed, hears of the update; B does not.
    let m = loop {
        let m = a_get.next(T).await.expect("resources/updated on A's stream");
        if m["method"] != "notifications/tools/list_changed" {
            break m;
        }
    };
    assert_eq!(
        (m["method"].as_str(), m["params"]["uri"].as_str()),
        (Some("notifications/resources/updated"), Some(uri.as_str())),
        "{m}"
    );
    while let Some(m) = b_get.next(Duration::from_millis(300)).await {
        assert_eq!(m["method"], "notifications/tools/list_changed", "B got {m}");
    }
    // The downstream was subscribed for A and never unsubscribed.
    assert!(
        !gw.logs().contains(&format!("[mock] unsubscribe {uri}")),
        "{}",
        gw.logs()
    );
}

/// A resources/(un)subscribe of `uri` on `s`, which must succeed.
async fn sub(s: &Session, method: &str, uri: &str) {
    let r = s.request(json!(method), method, json!({"uri": uri})).await;
    assert_eq!(r["result"], json!({}), "{method}: {r}");
}

fn pid_of(st: &Value) -> i32 {
    st["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {st}")) as i32
}

/// Polls /status until server `name` satisfies `f`.
async fn wait_status(gw: &Gateway, name: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + T;
    loop {
        let st = gw.server_status(name).await;
        if f(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "{name}: never matched: {st}\n{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child the gateway reported; no memory is touched.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// (f) kill -9 of a child with 100 calls in flight: each gets an error naming the
/// server within a second, and the server comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_kill_9_under_100_calls_fails_them_fast_and_the_server_returns() {
    let gw = gateway("", "");
    let old = pid_of(&wait_status(&gw, "m", |s| s["state"] == "ready").await);
    let s = Arc::new(gw.session().await);
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let r = s.call_id(json!(i), "m__slow", json!({"seconds": 5})).await;
                (r, Instant::now())
            })
        })
        .collect();
    let deadline = Instant::now() + T;
    while gw.in_flight().await < 100 {
        assert!(Instant::now() < deadline, "the 100 calls were never in flight together");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(old, libc::SIGKILL);
    let killed = Instant::now();
    for c in calls {
        let (r, at) = c.await.unwrap();
        let took = at.duration_since(killed);
        assert!(took < Duration::from_secs(1), "answered {took:?} after the kill: {r}");
        let msg = error_of(&r)["message"].as_str().unwrap_or_default();
        assert!(msg.contains("'m'"), "{r}");
    }
    wait_status(&gw, "m", |st| {
        st["state"] == "ready" && st["pid"].as_i64().is_some_and(|p| p as i32 != old)
    })
    .await;
    works(&s, "after kill -9").await;
}

/// (g) A stopped child (SIGSTOP): calls time out after the server's timeout with an
/// error naming it; after SIGCONT it answers again.
#[tokio::test]
async fn g_a_stopped_child_times_calls_out_and_recovers_on_sigcont() {
    let gw = gateway("", "timeout = \"1s\"\n");
    let s = gw.session().await;
    works(&s, "before SIGSTOP").await;
    let pid = pid_of(&gw.server_status("m").await);
    signal(pid, libc::SIGSTOP);
    let t0 = Instant::now();
    let r = s.call("m__echo", json!({"text": "stopped"})).await;
    let took = t0.elapsed();
    signal(pid, libc::SIGCONT);
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("'m'"), "{r}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "timed out after {took:?}: {r}"
    );
    // Resumed, the same child answers (its late answer to the timed-out call is dropped).
    let deadline = Instant::now() + T;
    loop {
        let r = s.call("m__echo", json!({"text": "resumed"})).await;
        if r["result"]["content"][0]["text"] == "resumed" {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let st = gw.server_status("m").await;
    assert_eq!((st["state"].as_str(), pid_of(&st)), (Some("ready"), pid), "{st}");
}

/// Open file descriptors and resident memory (KiB) of process `pid`.
fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    (fds, rss)
}

/// (h) 2,000 GET streams opened and closed (20 sessions, 100 each, one at a time per
/// session): afterwards the gateway's fds and RSS are back near where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h_two_thousand_get_streams_leave_no_fds_or_memory_behind() {
    const SESSIONS: usize = 20;
    const EACH: usize = 100;
    let gw = gateway("", "");
    let pid = gw.child.id();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(Arc::new(gw.session().await));
    }
    // Warm up (allocator pools, one stream per session), then measure.
    for s in &sessions {
        drop(s.get_stream().await);
    }
    let (fds0, rss0) = fds_and_rss(pid);
    let t0 = Instant::now();
    let tasks: Vec<_> = sessions
        .iter()
        .map(|s| {
            let addr = hostport(&gw);
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\
                 Mcp-Session-Id: {}\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n",
                s.id,
                path = gw.url.trim_start_matches(&gw.base),
            );
            tokio::spawn(async move {
                let mut conflicts = 0;
                let mut opened = 0;
                while opened < EACH {
                    // A fresh connection each time, closed once the stream's head is in;
                    // that close may still be on its way to the gateway (409 until it is).
                    let mut c = TcpStream::connect(&addr).await.unwrap();
                    c.write_all(req.as_bytes()).await.unwrap();
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = c.read(&mut chunk).await.unwrap_or(0);
                        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&head));
                        head.extend_from_slice(&chunk[..n]);
                    }
                    match status_of(&head) {
                        Some(200) => opened += 1,
                        Some(409) => {
                            conflicts += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        _ => panic!("GET stream: {:?}", String::from_utf8_lossy(&head)),
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Every stream is closed: the gateway lets go of their connections.
    let settled = until(T, || fds_and_rss(pid).0 <= fds0 + 5).await;
    let (fds1, rss1) = fds_and_rss(pid);
    assert!(settled, "fds {fds0} before, {fds1} after");
    assert!(
        rss1 < rss0 + 32 * 1024,
        "RSS {rss0} KiB before, {rss1} KiB after 2,000 streams"
    );
    assert_eq!(gw.get_json("/status").await["sessions"], SESSIONS as u64);
    works(&sessions[0], "after 2,000 streams").await;
    eprintln!("2,000 GET streams in {took:?} ({conflicts} retries on 409); fds {fds0}->{fds1}, RSS {rss0}->{rss1} KiB");
}

/// (i) At MCP_GATEWAY_LOG=trace, a server's env secret and a client's token never reach
/// the log: not at start, not in calls, not on a refused token.
#[tokio::test]
async fn i_secrets_stay_out_of_the_trace_log() {
    const ENV_SECRET: &str = "env-secret-4b9d2f7e1a";
    const TOKEN: &str = "client-token-8c3e6a0f5d";
    let config = format!(
        "[clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\n\n{}",
        server("m", &unique("secrets"), &[], "env = { API_KEY = \"${API_KEY}\" }\n")
    );
    let gw = Gateway::start_with_env(
        &config,
        &[
            ("MCP_GATEWAY_LOG", "trace"),
            ("ALICE_TOKEN", TOKEN),
            ("API_KEY", ENV_SECRET),
        ],
    );
    let s = Session::open_as(&gw.url, TOKEN).await;
    works(&s, "one").await;
    assert_eq!(text(&s.call("m__add", json!({"a": 1, "b": 2})).await), "3");
    assert!(!s.tool_names().await.is_empty());
    // A wrong token, one character off, is refused without being echoed.
    let wrong = format!("{}x", &TOKEN[..TOKEN.len() - 1]);
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("authorization", format!("Bearer {wrong}"))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    works(&s, "two").await;
    assert!(gw.wait_log("mcp_gateway", T).await);
    let logs = gw.logs();
    assert!(logs.contains("TRACE"), "not at trace level?\n{logs:.2000}");
    for secret in [ENV_SECRET, TOKEN, wrong.as_str()] {
        let at = logs.find(secret).unwrap_or(0);
        assert!(
            !logs.contains(secret),
            "{secret} in the log: …{}…",
            logs.get(at.saturating_sub(300)..at).unwrap_or_default()
        );
    }
    // The child does have the secret (after the log was read: the answer carries it).
    assert_eq!(text(&s.call("m__env", json!({"name": "API_KEY"})).await), ENV_SECRET);
}
