//! Hostile HTTP input (issue #13, found by probing the release binary from outside),
//! each against the real binary on a real socket: bodies that are not JSON (415), a
//! Content-Length over `max_body` refused before any body arrives (413), headers that
//! must come once (400), no Host (400), Origin and Host values that only look local
//! (403), `initialize` counted against a client's rate limits (-32029), and
//! `gateway.max_sessions_per_client` bounding one identity's share of the sessions.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Long enough for a loaded CI machine, short next to the 30 s `body_timeout` a
/// gateway that waits for the body would take.
const T: Duration = Duration::from_secs(10);

const ALICE: &str = "alice-hostile-5c1d9e";
const BOB: &str = "bob-hostile-8a2f4b";
const CAROL: &str = "carol-hostile-3e7d0c";

/// A gateway with one mock server `m`, `gateway` as its `[gateway]` table body and
/// `rest` after it.
fn gateway(gateway: &str, rest: &str) -> Gateway {
    let name = unique("hostile");
    Gateway::start_with_env(
        &format!("[gateway]\n{gateway}\n\n{}\n{rest}", server("m", &name, &[], "")),
        &[("ALICE_TOKEN", ALICE), ("BOB_TOKEN", BOB), ("CAROL_TOKEN", CAROL)],
    )
}

/// `[clients.*]` tables for alice, bob and carol (tokens from the environment), with
/// `alice` and `bob` as extra lines of their tables; carol may read `/status`.
fn clients(alice: &str, bob: &str) -> String {
    format!(
        "[clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\n{alice}\n\n\
         [clients.bob]\ntoken = \"${{BOB_TOKEN}}\"\n{bob}\n\n\
         [clients.carol]\ntoken = \"${{CAROL_TOKEN}}\"\nadmin = true\n"
    )
}

fn hostport(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

fn ping() -> Value {
    json!({"jsonrpc":"2.0","id":1,"method":"ping"})
}

fn initialize_body() -> Value {
    json!({"jsonrpc":"2.0","id":"init","method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"hostile","version":"1"}}})
}

/// A POST to the endpoint as `token` (if any): status, session id header, JSON body.
async fn initialize(gw: &Gateway, http: &reqwest::Client, token: Option<&str>) -> (u16, Option<String>, Value) {
    let mut r = http
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&initialize_body());
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, sid, body)
}

/// Writes `request` as is on a new connection and reads one response, within [`T`].
async fn raw(gw: &Gateway, request: &str) -> (u16, String, String) {
    let mut c = TcpStream::connect(hostport(gw)).await.unwrap();
    c.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(T, read_response(&mut c))
        .await
        .unwrap_or_else(|_| panic!("no answer within {T:?} to {request:?}"))
}

fn error_message(v: &Value) -> &str {
    v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message in {v}"))
}

// ---------------------------------------------------------------- Content-Type

#[tokio::test]
async fn a_post_that_is_not_application_json_gets_415_saying_what_to_send() {
    let gw = gateway("", "");
    let s = gw.session().await;
    // What the official SDK clients send, and the same media type in other spellings.
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        " application/json ",
    ] {
        let r = s
            .post()
            .header("content-type", ct)
            .body(ping().to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "Content-Type {ct:?}");
        assert_eq!(r.json::<Value>().await.unwrap()["result"], json!({}), "{ct:?}");
    }
    // curl -d's default, plain text, look-alikes, and none at all.
    for ct in [
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("application/jsonl"),
        Some("application/json-seq"),
        Some("text/json"),
        Some(""),
        None,
    ] {
        let mut r = s.post().body(ping().to_string());
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 415, "Content-Type {ct:?}");
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert_eq!(v["error"]["code"], -32600, "{v}");
        assert!(
            error_message(&v).contains("Content-Type: application/json"),
            "{ct:?}: {v}"
        );
    }
    // An initialize sent as form data opens no session.
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "text/plain")
        .body(initialize_body().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.headers().get("mcp-session-id").is_none());
    assert_eq!(gw.get_json_as("/status", CAROL).await["sessions"], 1);
    // The session still works.
    assert_eq!(s.request(json!(2), "ping", json!({})).await["result"], json!({}));
}

// ---------------------------------------------------------------- early 413

#[tokio::test]
async fn a_content_length_over_max_body_is_refused_before_the_body_is_sent() {
    let gw = gateway("max_body = \"1KiB\"", "");
    let s = gw.session().await;
    let addr = hostport(&gw);
    // The headers and not one byte of the body: the answer cannot wait for it.
    for len in ["1025", "1000000000000"] {
        for expect in ["", "Expect: 100-continue\r\n"] {
            let mut c = TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n{expect}\
                 Content-Length: {len}\r\n\r\n",
                s.id
            );
            c.write_all(head.as_bytes()).await.unwrap();
            let (status, head, body) = tokio::time::timeout(T, read_response(&mut c))
                .await
                .unwrap_or_else(|_| panic!("no 413 within {T:?} for Content-Length {len} {expect:?}"));
            assert_eq!(status, 413, "{head}{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["code"], -32600, "{v}");
            assert!(error_message(&v).contains("1024 byte limit"), "{v}");
        }
    }
    // Exactly at the limit is still read and served.
    let body = json!({"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad": ""}}).to_string();
    let pad = 1024 - body.len();
    let body = json!({"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad": "x".repeat(pad)}}).to_string();
    assert_eq!(body.len(), 1024);
    let r = s
        .post()
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], 3);
}

// ---------------------------------------------------------------- headers that must be one

#[tokio::test]
async fn two_authorization_headers_are_400_whichever_comes_first() {
    let gw = gateway("", &clients("", ""));
    let http = reqwest::Client::new();
    // Alone, each token works.
    assert_eq!(initialize(&gw, &http, Some(ALICE)).await.0, 200);
    for (first, second) in [(ALICE, BOB), (ALICE, "not-a-token"), ("not-a-token", ALICE)] {
        let r = http
            .post(&gw.url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {first}"))
            .header("authorization", format!("Bearer {second}"))
            .json(&initialize_body())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{first:.5}… then {second:.5}…");
        assert!(r.headers().get("mcp-session-id").is_none());
        let v: Value = r.json().await.unwrap();
        assert!(error_message(&v).contains("Authorization"), "{v}");
        // The tokens are not echoed.
        assert!(!v.to_string().contains(ALICE) && !v.to_string().contains(BOB), "{v}");
    }
    assert_eq!(gw.get_json_as("/status", CAROL).await["sessions"], 1);
    assert!(!gw.logs().contains(ALICE) && !gw.logs().contains(BOB));
}

#[tokio::test]
async fn two_session_ids_are_400() {
    let gw = gateway("", "");
    let (a, b) = (gw.session().await, gw.session().await);
    let r = a
        .post()
        .header("mcp-session-id", &b.id)
        .json(&ping())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(error_message(&r.json().await.unwrap()).contains("Mcp-Session-Id"));
}

#[tokio::test]
async fn a_request_without_host_or_with_two_is_400() {
    let gw = gateway("", "");
    let s = gw.session().await;
    let addr = hostport(&gw);
    let body = ping().to_string();
    let post = |hosts: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\n{hosts}Content-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            s.id,
            body.len()
        )
    };
    let (status, head, reply) = raw(&gw, &post(&format!("Host: {addr}\r\n"))).await;
    assert_eq!(status, 200, "{head}{reply}");

    for hosts in ["".to_owned(), format!("Host: {addr}\r\nHost: {addr}\r\n")] {
        let (status, head, reply) = raw(&gw, &post(&hosts)).await;
        assert_eq!(status, 400, "{hosts:?}: {head}{reply}");
        let v: Value = serde_json::from_str(&reply).unwrap();
        assert!(error_message(&v).contains("Host"), "{v}");
    }
    // Every route, not only the MCP endpoint.
    let (status, head, reply) = raw(&gw, "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "{head}{reply}");
    // HTTP/1.0 has no Host requirement (an old health checker): still served.
    let (status, head, reply) = raw(&gw, "GET /healthz HTTP/1.0\r\n\r\n").await;
    assert_eq!((status, reply.as_str()), (200, "ok\n"), "{head}");
}

// ---------------------------------------------------------------- Origin and Host parsed

#[tokio::test]
async fn origins_are_parsed_so_userinfo_tricks_are_not_localhost() {
    let gw = gateway("allowed_origins = [\"https://app.example.com\"]", "");
    let s = gw.session().await;
    let with_origin = |origin: &'static str| {
        let req = s.post().header("origin", origin).json(&ping());
        async move { req.send().await.unwrap().status().as_u16() }
    };
    for origin in [
        "http://localhost:1@evil.com",
        "http://localhost@evil.com",
        "http://[::1]@evil.com",
        "http://127.0.0.1:80@evil.com:80",
        "http://localhost.evil.com",
        "http://127.0.0.1.evil.com",
        "http://localhost:1234/path",
        "http://localhost:notaport",
        "ftp://localhost",
        "localhost",
        "null",
        "https://app.example.com@evil.com",
        "https://app.example.com.evil.com",
        "https://app.example.com:8443",
        "http://app.example.com",
        "https://evil.com#@app.example.com",
    ] {
        assert_eq!(with_origin(origin).await, 403, "{origin}");
    }
    for origin in [
        "http://localhost:1234",
        "http://localhost",
        "https://LOCALHOST:8443",
        "http://127.0.0.1:5",
        "http://[::1]:8080",
        "https://app.example.com",
        "https://App.Example.COM",
        "https://app.example.com:443",
    ] {
        assert_eq!(with_origin(origin).await, 200, "{origin}");
    }
}

#[tokio::test]
async fn host_values_are_parsed_too() {
    let gw = gateway("allowed_hosts = [\"gateway.internal\", \"pinned.internal:8080\"]", "");
    let s = gw.session().await;
    let body = ping().to_string();
    let post = |host: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            s.id,
            body.len()
        )
    };
    for host in [
        "localhost:1@evil.com",
        "localhost@evil.com",
        "localhost:x",
        "[::1]evil.com",
        "pinned.internal:9090",
        "pinned.internal",
        "evil.com",
        "gateway.internal.evil.com",
    ] {
        let (status, head, reply) = raw(&gw, &post(host)).await;
        assert!(matches!(status, 400 | 403), "{host}: {head}{reply}");
    }
    for host in [
        "localhost",
        "LocalHost:8080",
        "127.0.0.1:1",
        "[::1]:9",
        "gateway.internal",
        "Gateway.Internal:9000",
        "pinned.internal:8080",
    ] {
        let (status, head, reply) = raw(&gw, &post(host)).await;
        assert_eq!(status, 200, "{host}: {head}{reply}");
    }
}

// ---------------------------------------------------------------- initialize and limits

#[tokio::test]
async fn initialize_counts_against_the_clients_rate_limits() {
    let gw = gateway(
        "",
        &format!(
            "[rate_limits]\nper_client = \"4/m\"\n\n{}",
            clients("rate_limit = \"3/m\"", "")
        ),
    );
    let http = reqwest::Client::new();
    // alice's own rate_limit: three initializes, then the fourth is refused.
    for i in 0..3 {
        let (status, sid, v) = initialize(&gw, &http, Some(ALICE)).await;
        assert_eq!((status, sid.is_some()), (200, true), "alice #{i}: {v}");
    }
    let (status, sid, v) = initialize(&gw, &http, Some(ALICE)).await;
    assert_eq!((status, sid), (200, None), "{v}");
    assert_eq!(v["id"], "init", "{v}");
    assert_eq!(v["error"]["code"], -32029, "{v}");
    assert!(error_message(&v).contains("client 'alice' limit 3/m"), "{v}");
    let ms = v["error"]["data"]["retryAfterMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(ms > 0 && ms <= 20_000, "3/m refills one every 20 s, not {ms} ms");
    // per_client: bob has no limit of his own, but four a minute is every client's.
    for i in 0..4 {
        let (status, sid, v) = initialize(&gw, &http, Some(BOB)).await;
        assert_eq!((status, sid.is_some()), (200, true), "bob #{i}: {v}");
    }
    let (_, sid, v) = initialize(&gw, &http, Some(BOB)).await;
    assert_eq!(sid, None, "{v}");
    assert_eq!(v["error"]["code"], -32029, "{v}");
    assert!(error_message(&v).contains("per_client limit 4/m"), "{v}");
    assert!(v["error"]["data"]["retryAfterMs"].as_u64().is_some(), "{v}");
    // Nobody else paid for them.
    let (status, sid, v) = initialize(&gw, &http, Some(CAROL)).await;
    assert_eq!((status, sid.is_some()), (200, true), "carol: {v}");
    assert_eq!(gw.get_json_as("/status", CAROL).await["sessions"], 8);
}

#[tokio::test]
async fn max_sessions_per_client_bounds_one_clients_share() {
    // max_sessions = 20 and no max_sessions_per_client: a tenth of it, 2 each.
    let gw = gateway("max_sessions = 20", &clients("", ""));
    let http = reqwest::Client::new();
    let mut alice = Vec::new();
    for _ in 0..2 {
        let (status, sid, v) = initialize(&gw, &http, Some(ALICE)).await;
        assert_eq!(status, 200, "{v}");
        alice.push(sid.expect("a session"));
    }
    let (status, sid, v) = initialize(&gw, &http, Some(ALICE)).await;
    assert_eq!((status, sid), (503, None), "{v}");
    assert_eq!(v["id"], "init", "{v}");
    let msg = error_message(&v);
    assert!(
        msg.contains("alice") && msg.contains('2') && msg.contains("gateway.max_sessions_per_client"),
        "{msg}"
    );
    // Another client still gets its own share.
    for _ in 0..2 {
        let (status, sid, v) = initialize(&gw, &http, Some(BOB)).await;
        assert_eq!((status, sid.is_some()), (200, true), "bob: {v}");
    }
    assert_eq!(initialize(&gw, &http, Some(BOB)).await.0, 503);
    // Ending one of alice's sessions gives her place back, and only one.
    let r = http
        .delete(&gw.url)
        .header("authorization", format!("Bearer {ALICE}"))
        .header("mcp-session-id", &alice[0])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(initialize(&gw, &http, Some(ALICE)).await.0, 200);
    assert_eq!(initialize(&gw, &http, Some(ALICE)).await.0, 503);
    assert_eq!(gw.get_json_as("/status", CAROL).await["sessions"], 4);
}

#[tokio::test]
async fn without_auth_the_share_is_per_address() {
    let gw = gateway("max_sessions_per_client = 2", "");
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .build()
            .unwrap()
    };
    let (one, two) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    for _ in 0..2 {
        assert_eq!(initialize(&gw, &one, None).await.0, 200);
    }
    let (status, sid, v) = initialize(&gw, &one, None).await;
    assert_eq!((status, sid), (503, None), "{v}");
    let msg = error_message(&v);
    assert!(
        msg.contains("127.0.0.1") && msg.contains("gateway.max_sessions_per_client"),
        "{msg}"
    );
    // Another address has a share of its own.
    let (status, sid, v) = initialize(&gw, &two, None).await;
    assert_eq!((status, sid.is_some()), (200, true), "{v}");
}

/// `initialize` from 127.0.0.1 naming `forwarded` in `X-Forwarded-For`.
async fn initialize_via(gw: &Gateway, forwarded: &str) -> u16 {
    reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("x-forwarded-for", forwarded)
        .json(&initialize_body())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_trusted_proxys_x_forwarded_for_names_the_caller_and_nobody_elses_does() {
    // Behind a trusted balancer, each caller has a share (and a per_ip budget) of its own.
    let gw = gateway(
        "max_sessions_per_client = 1\ntrusted_proxies = [\"127.0.0.0/8\", \"10.9.0.0/16\"]",
        "[rate_limits]\nper_ip = \"3/m\"\n",
    );
    assert_eq!(initialize_via(&gw, "203.0.113.7").await, 200);
    assert_eq!(initialize_via(&gw, "203.0.113.7").await, 503, "its one share is taken");
    // The hop the balancer added is read from the right, past other trusted proxies;
    // what the caller wrote to the left of it counts for nothing.
    assert_eq!(initialize_via(&gw, "1.1.1.1, 203.0.113.8, 10.9.0.4").await, 200);
    assert_eq!(
        initialize_via(&gw, "6.6.6.6, 203.0.113.8").await,
        503,
        "the same caller"
    );
    // per_ip counts by that address too: 203.0.113.7 spent 2 of its 3, 203.0.113.9 none.
    assert_eq!(initialize_via(&gw, "203.0.113.7").await, 503);
    assert_eq!(initialize_via(&gw, "203.0.113.7").await, 429);
    assert_eq!(initialize_via(&gw, "203.0.113.9").await, 200);
    // Without trusted_proxies the header is ignored: every request is 127.0.0.1's.
    let plain = gateway("max_sessions_per_client = 1", "");
    assert_eq!(initialize_via(&plain, "203.0.113.7").await, 200);
    assert_eq!(initialize_via(&plain, "203.0.113.8").await, 503);
    // A malformed hop is not believed: the walk stops at the balancer itself.
    let strict = gateway("max_sessions_per_client = 1\ntrusted_proxies = [\"127.0.0.1\"]", "");
    assert_eq!(initialize_via(&strict, "nonsense").await, 200);
    assert_eq!(
        initialize_via(&strict, "also, nonsense").await,
        503,
        "both count as 127.0.0.1"
    );
}
