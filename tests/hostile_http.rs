//! Hostile HTTP input (issue #13, found by probing the release binary from outside),
//! each against the real binary on a real socket: bodies that are not JSON (415), and
//! a Content-Length over `max_body` refused before any body arrives (413).

mod common;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// Reads one HTTP response with a Content-Length body: status code, head and body.
async fn read_response(s: &mut TcpStream) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.expect("read response");
        assert!(
            n > 0,
            "connection closed mid-response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.expect("read body");
        assert!(n > 0, "connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string();
    (status, head, body)
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
    assert_eq!(gw.get_json("/status").await["sessions"], 1);
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
