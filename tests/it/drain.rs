//! Draining on SIGTERM (`gateway.drain_delay`, issue #16's rolling restarts), with the
//! real binary: `/readyz` turns 503 at once while everything is still served, the
//! listener closes once the delay is over, requests in flight get `shutdown_grace`, and
//! the process exits 0. A second signal ends the drain early; `0s` closes at once; stdio
//! mode never drains.

use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn signal(gw: &Gateway, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid this test spawned; no memory is touched.
    unsafe {
        libc::kill(gw.child.id() as i32, sig);
    }
}

fn addr(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_owned()
}

/// `GET /readyz` on a new connection: status and body; `None` once the listener is closed.
async fn readyz(gw: &Gateway) -> Option<(u16, String)> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let r = client.get(format!("{}/readyz", gw.base)).send().await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.unwrap_or_default()))
}

async fn exited(gw: &mut Gateway, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = gw.child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_ready(gw: &Gateway) {
    let mut ok = false;
    for _ in 0..1000 {
        if readyz(gw).await.is_some_and(|(s, _)| s == 200) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ok, "never ready:\n{}", gw.logs());
}

#[tokio::test]
async fn sigterm_drains_readyz_503_while_serving_then_closes_and_finishes_calls() {
    let name = unique("drain");
    let config = format!(
        "[gateway]\ndrain_delay = \"2s\"\nshutdown_grace = \"10s\"\n\n{}",
        server("m", &name, &[], "")
    );
    let mut gw = Gateway::start(&config);
    wait_ready(&gw).await;
    let before = gw.session().await;
    assert_eq!(text(&before.call("m__echo", json!({"text": "before"})).await), "before");

    let termed = Instant::now();
    signal(&gw, libc::SIGTERM);
    assert!(gw.wait_log("draining: /readyz is 503 for 2s", T).await, "{}", gw.logs());
    assert_eq!(
        readyz(&gw).await,
        Some((503, "draining\n".to_owned())),
        "/readyz during the drain"
    );
    // Served as before: a session opened now, on a new connection, and one opened before.
    let s = Session::open(&gw.url).await;
    assert_eq!(text(&s.call("m__echo", json!({"text": "during"})).await), "during");
    assert_eq!(text(&before.call("m__echo", json!({"text": "again"})).await), "again");
    // A response sent during the drain closes its connection, so keep-alive clients move.
    let r = s
        .post()
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers().get("connection").map(|v| v.to_str().unwrap().to_owned()),
        Some("close".to_owned())
    );
    // A call started during the drain that outlasts it.
    let mut slow = s
        .start(
            json!(9),
            "tools/call",
            json!({"name": "m__slow", "arguments": {"seconds": 3.0, "steps": 3}, "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert!(slow.next(T).await.is_some(), "the slow call's first progress");
    assert!(!gw.logs().contains("shutting down"), "{}", gw.logs());

    // The listener closes once the delay is over, not before.
    let a = addr(&gw);
    assert!(
        until(T, || std::net::TcpStream::connect(&a).is_err()).await,
        "the listener never closed:\n{}",
        gw.logs()
    );
    let closed = termed.elapsed();
    assert!(
        closed >= Duration::from_secs(2) && closed < Duration::from_secs(6),
        "the listener closed {closed:?} after SIGTERM"
    );
    let logs = gw.logs();
    let (drain_at, stop_at) = (logs.find("draining:").unwrap(), logs.find("shutting down"));
    assert!(stop_at.is_some_and(|s| s > drain_at), "{logs}");

    // The call in flight finishes within the grace, then the process exits 0.
    let (_, resp) = slow.response(T).await;
    assert_eq!(text(&resp), "done", "{resp}");
    let status = exited(&mut gw, T).await.expect("the gateway exits");
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
    assert!(mock_pids(&name).is_empty(), "the server was stopped");
}

#[tokio::test]
async fn a_second_signal_ends_the_drain_at_once() {
    let name = unique("drain-twice");
    let config = format!("[gateway]\ndrain_delay = \"60s\"\n\n{}", server("m", &name, &[], ""));
    let mut gw = Gateway::start(&config);
    wait_ready(&gw).await;
    signal(&gw, libc::SIGTERM);
    assert!(
        gw.wait_log("draining: /readyz is 503 for 60s", T).await,
        "{}",
        gw.logs()
    );
    assert_eq!(readyz(&gw).await.map(|r| r.0), Some(503));
    let s = gw.session().await;
    assert_eq!(text(&s.call("m__echo", json!({"text": "x"})).await), "x");
    // SIGINT counts as SIGTERM does.
    let second = Instant::now();
    signal(&gw, libc::SIGINT);
    let status = exited(&mut gw, T).await.expect("the gateway exits");
    assert!(
        second.elapsed() < Duration::from_secs(5),
        "exited {:?} after the second signal",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
    assert!(
        gw.wait_log("the drain ends early", Duration::from_secs(10)).await,
        "{}",
        gw.logs()
    );
}

#[tokio::test]
async fn drain_delay_0s_closes_the_listener_at_once() {
    let name = unique("drain-0");
    let config = format!("[gateway]\ndrain_delay = \"0s\"\n\n{}", server("m", &name, &[], ""));
    let mut gw = Gateway::start(&config);
    wait_ready(&gw).await;
    let termed = Instant::now();
    signal(&gw, libc::SIGTERM);
    let status = exited(&mut gw, T).await.expect("the gateway exits");
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
    assert!(termed.elapsed() < Duration::from_secs(3), "took {:?}", termed.elapsed());
    let logs = gw.logs();
    assert!(logs.contains("shutting down") && !logs.contains("draining"), "{logs}");
}

#[test]
fn stdio_mode_does_not_drain() {
    let name = unique("drain-stdio");
    let config = format!("[gateway]\ndrain_delay = \"60s\"\n\n{}", server("m", &name, &[], ""));
    let mut gw = StdioGateway::start(&config, &[]);
    gw.initialize();
    let termed = Instant::now();
    // SAFETY: kill(2) on a pid this test spawned.
    unsafe {
        libc::kill(gw.child.id() as i32, libc::SIGTERM);
    }
    let status = gw.wait_exit(T).expect("the gateway exits");
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
    assert!(termed.elapsed() < Duration::from_secs(5), "took {:?}", termed.elapsed());
    assert!(!gw.logs().contains("draining"), "{}", gw.logs());
}

/// A connection the gateway accepted (or still has queued) when its listener closes, its
/// request not sent yet, as a balancer's connection right before the close: the request
/// it then sends is answered, with `Connection: close`, not dropped unanswered (hyper's
/// graceful shutdown closes a connection that has not read a byte at once).
#[tokio::test]
async fn a_connection_open_when_the_listener_closes_gets_its_request_answered() {
    use std::io::{Read, Write};
    let config = "[gateway]\ndrain_delay = \"0s\"\n";
    let mut gw = Gateway::start(config);
    wait_ready(&gw).await;
    let mut early = std::net::TcpStream::connect(addr(&gw)).unwrap();
    early.set_read_timeout(Some(T)).unwrap();
    signal(&gw, libc::SIGTERM);
    let pid = gw.child.id();
    assert!(gw.wait_log("shutting down", T).await, "{}", gw.logs());
    assert!(until(T, || listening_port(pid).is_none()).await, "the listener closed");
    write!(early, "GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", addr(&gw)).unwrap();
    let mut answer = String::new();
    let _ = early.read_to_string(&mut answer);
    let head = answer.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "answered: {answer:?}");
    assert!(head.contains("connection: close"), "{answer:?}");
    let status = exited(&mut gw, T).await.expect("the gateway exits");
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
}

/// A connection its client opened and never used (a spare, as reqwest and browsers keep)
/// does not hold the shutdown for `header_timeout`: silent since long before the stop, it
/// is closed at once, as an idle one between two requests is. (The wait is the rule's
/// own: a connection is a spare once it has been silent 2 s since its accept.)
#[tokio::test]
async fn a_spare_connection_never_used_does_not_hold_the_shutdown() {
    use std::io::Read;
    let config = "[gateway]\ndrain_delay = \"0s\"\nheader_timeout = \"60s\"\nshutdown_grace = \"60s\"\n";
    let mut gw = Gateway::start(config);
    wait_ready(&gw).await;
    let mut spare = std::net::TcpStream::connect(addr(&gw)).unwrap();
    spare.set_read_timeout(Some(T)).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let termed = Instant::now();
    signal(&gw, libc::SIGTERM);
    let status = exited(&mut gw, T).await.expect("the gateway exits");
    assert_eq!(status.code(), Some(0), "{}", gw.logs());
    assert!(termed.elapsed() < Duration::from_secs(5), "took {:?}", termed.elapsed());
    let mut rest = Vec::new();
    assert!(spare.read_to_end(&mut rest).is_ok() && rest.is_empty(), "{rest:?}");
}
