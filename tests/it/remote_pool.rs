//! Remote servers at the speed of a direct connection (issue #20): the gateway's
//! connections to a Streamable HTTP server are reused, an SSE answer is forwarded as soon
//! as its event arrives, and a TLS server that offers HTTP/2 gets HTTP/2.
//!
//! The server is the bench's Rust fixture (`mcp-gateway-bench remote-fixture`, here run in
//! the test process on a thread and runtime of its own), which counts the connections it
//! accepts and the HTTP version of each request (`GET /stats`).

use crate::common::*;
use clap::Parser;
use mcp_gateway_bench::remote;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The remote fixture on port 0, with the switches of `mcp-gateway-bench remote-fixture`.
/// Stops when dropped.
struct Fixture {
    _running: remote::Running,
    url: String,
    base: String,
}

impl Fixture {
    fn start(args: &[&str]) -> Fixture {
        let args = remote::RemoteArgs::try_parse_from(std::iter::once(&"remote-fixture").chain(args))
            .unwrap_or_else(|e| panic!("remote fixture switches {args:?}: {e}"));
        let running = remote::spawn(args).unwrap_or_else(|e| panic!("remote fixture did not start: {e:#}"));
        let url = running.url.clone();
        let base = url.trim_end_matches("/mcp").to_owned();
        Fixture {
            _running: running,
            url,
            base,
        }
    }

    fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `{"connections", "http1", "http2"}`, on a new connection of its own (counted).
    async fn stats(&self, client: &reqwest::Client) -> Value {
        let r = client.get(format!("{}/stats", self.base)).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.json().await.unwrap()
    }
}

/// A client that opens a new connection for every request.
fn fresh() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

/// A gateway with the fixture as server `fx`, ready.
async fn gateway_for(url: &str, extra: &str) -> Gateway {
    let gw = Gateway::start(&remote_table("fx", url, extra));
    let st = gw.server_status("fx").await;
    assert_eq!(st["state"], "ready", "{st}\n{}", gw.logs());
    gw
}

/// `n` sequential echo calls on one session; every answer checked.
async fn calls(s: &Session, n: usize) {
    for i in 0..n {
        let want = format!("call {i} ✓");
        let r = s.call("fx__echo", json!({ "text": want })).await;
        assert_eq!(text(&r), want, "{r}");
    }
}

/// Connections the gateway opened during `n` sequential calls (the second stats request
/// is one more connection of the fixture's count).
async fn opened_during(fx: &Fixture, s: &Session, n: usize) -> u64 {
    let c = fresh();
    let before = fx.stats(&c).await["connections"].as_u64().unwrap();
    calls(s, n).await;
    let after = fx.stats(&c).await["connections"].as_u64().unwrap();
    let opened = after - before - 1;
    eprintln!("{n} sequential calls opened {opened} connections");
    opened
}

#[tokio::test]
async fn json_answers_reuse_the_connection() {
    let fx = Fixture::start(&[]);
    let gw = gateway_for(&fx.url, "").await;
    let s = gw.session().await;
    let opened = opened_during(&fx, &s, 200).await;
    assert!(
        opened <= 2,
        "200 sequential calls opened {opened} connections\n{}",
        gw.logs()
    );
}

#[tokio::test]
async fn sse_answers_reuse_the_connection() {
    let fx = Fixture::start(&["--sse"]);
    let gw = gateway_for(&fx.url, "").await;
    let s = gw.session().await;
    let opened = opened_during(&fx, &s, 200).await;
    assert!(
        opened <= 2,
        "200 sequential calls opened {opened} connections\n{}",
        gw.logs()
    );
}

/// The server ends each SSE stream 5 ms after its answer event. The gateway answers at
/// the event and reads the rest of the stream in the background, so the connection goes
/// back to the pool; a gateway that dropped the unfinished body would close it and open
/// a new one for every call (200 here).
#[tokio::test]
async fn sse_streams_that_linger_still_reuse_connections() {
    let fx = Fixture::start(&["--sse", "--sse-linger-ms", "5"]);
    let gw = gateway_for(&fx.url, "").await;
    let s = gw.session().await;
    let opened = opened_during(&fx, &s, 200).await;
    assert!(
        opened <= 40,
        "200 sequential calls opened {opened} connections\n{}",
        gw.logs()
    );
}

/// A server that keeps every stream open for 2 s after the answer: the streams read in
/// the background are bounded (64 per server), so the gateway does not pile up a
/// connection per call; past the bound a stream's connection is closed.
#[tokio::test]
async fn lingering_streams_are_bounded() {
    let fx = Fixture::start(&["--sse", "--sse-linger-ms", "2000"]);
    let gw = gateway_for(&fx.url, "").await;
    let s = gw.session().await;
    calls(&s, 150).await;
    let st = fx.stats(&fresh()).await;
    let open = st["open"].as_u64().unwrap();
    eprintln!("after 150 calls: {st}");
    // 64 draining, the one the next call would use, the stats request's own, and slack.
    assert!(open <= 70, "{open} connections open after 150 calls: {st}");
    assert!(st["connections"].as_u64().unwrap() >= 100, "{st}");
}

/// Twelve calls at once, each answered 300 ms late: with `max_connections = 3` at most
/// three are in flight to the server (each on its own HTTP/1.1 connection) and the rest
/// wait their turn; all twelve are answered. Without it, the server sees twelve
/// connections at once.
#[tokio::test]
async fn calls_in_flight_are_bounded_by_max_connections() {
    async fn peak(extra: &str) -> u64 {
        let fx = Fixture::start(&["--delay-ms", "300"]);
        let gw = gateway_for(&fx.url, extra).await;
        let s = gw.session().await;
        let answers = futures::future::join_all((0..12).map(|i| {
            let s = &s;
            async move {
                s.call_id(json!(i), "fx__echo", json!({ "text": format!("c{i}") }))
                    .await
            }
        }))
        .await;
        for (i, r) in answers.iter().enumerate() {
            assert_eq!(text(r), format!("c{i}"), "{r}\n{}", gw.logs());
        }
        let st = fx.stats(&fresh()).await;
        eprintln!("{extra:?}: {st}");
        st["peak"].as_u64().unwrap()
    }
    // Three calls' connections, and the stats request's own.
    let bounded = peak("max_connections = 3").await;
    assert!(
        bounded <= 4,
        "{bounded} connections open at once with max_connections = 3"
    );
    let unbounded = peak("").await;
    assert!(unbounded >= 12, "{unbounded} connections at once without a bound");
}

/// The answer is forwarded when its event arrives, not when the stream ends.
#[tokio::test]
async fn sse_answer_is_forwarded_before_the_stream_ends() {
    let fx = Fixture::start(&["--sse", "--sse-linger-ms", "2000"]);
    let gw = gateway_for(&fx.url, "").await;
    let s = gw.session().await;
    for i in 0..5 {
        let t0 = Instant::now();
        let r = s.call("fx__echo", json!({ "text": format!("t{i}") })).await;
        let took = t0.elapsed();
        assert_eq!(text(&r), format!("t{i}"), "{r}");
        assert!(
            took < Duration::from_millis(1000),
            "call {i} took {took:?}: it waited for the stream to end (2 s after the answer)"
        );
    }
}

/// Over TLS with ALPN, a server offering `h2` is spoken to in HTTP/2, on one connection.
#[tokio::test]
async fn tls_server_offering_h2_gets_http2() {
    let tls = repo().join("tests/fixtures/tls");
    let fx = Fixture::start(&[
        "--sse",
        "--tls-cert",
        &path_str(&tls.join("server.der")),
        "--tls-key",
        &path_str(&tls.join("server.key.der")),
    ]);
    assert!(fx.url.starts_with("https://"), "{}", fx.url);
    let url = format!("https://localhost:{}/mcp", fx.port());
    let ca = path_str(&tls.join("ca.pem"));
    let gw = gateway_for(&url, &format!("ca_file = {ca:?}")).await;
    let s = gw.session().await;
    calls(&s, 20).await;

    let pem = std::fs::read(tls.join("ca.pem")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let st = fx.stats(&client).await;
    // The handshake (probe, initialize, initialized, lists) and the 20 calls.
    assert!(st["http2"].as_u64().unwrap() >= 20, "{st}\n{}", gw.logs());
    assert_eq!(st["http1"], 0, "requests arrived as HTTP/1.1: {st}");
    // One multiplexed connection (plus this stats request's own).
    assert!(st["connections"].as_u64().unwrap() <= 3, "{st}");
}

/// Over HTTP/2 the server, not `max_connections` (256 here), caps the calls in flight: it
/// advertises SETTINGS_MAX_CONCURRENT_STREAMS 2, and hyper queues the streams past it on
/// the one connection first come, first served. The gateway hands out no more slots than
/// that, so the calls past it wait in its fair line instead: one session floods ten calls
/// of 1 s each, and another session's call, made while two of them hold the streams,
/// waits for those two and at most one more of the flood's (the turn before its own), not
/// for the whole flood (ten, on a gateway that lets hyper queue them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_servers_stream_limit_does_not_queue_another_sessions_call_behind_a_flood() {
    let tls = repo().join("tests/fixtures/tls");
    let fx = Fixture::start(&[
        "--tls-cert",
        &path_str(&tls.join("server.der")),
        "--tls-key",
        &path_str(&tls.join("server.key.der")),
        "--max-streams",
        "2",
        "--delay-ms",
        "1000",
    ]);
    let url = format!("https://localhost:{}/mcp", fx.port());
    let ca = path_str(&tls.join("ca.pem"));
    let gw = gateway_for(&url, &format!("ca_file = {ca:?}")).await;
    let flood = std::sync::Arc::new(gw.session().await);
    let other = gw.session().await;
    let queued: Vec<_> = (0..10)
        .map(|i| {
            let s = flood.clone();
            tokio::spawn(async move {
                s.call_id(json!(i), "fx__echo", json!({ "text": format!("a{i}") }))
                    .await
            })
        })
        .collect();
    assert!(gw.in_flight_is(10).await, "in flight: {}", gw.in_flight().await);
    let before = queued.iter().filter(|t| t.is_finished()).count();
    let r = other
        .call_id(json!("b"), "fx__echo", json!({ "text": "my turn" }))
        .await;
    assert_eq!(text(&r), "my turn", "{r}\n{}", gw.logs());
    let done = queued.iter().filter(|t| t.is_finished()).count() - before;
    eprintln!("{done} of the flood's calls were answered while the other session's waited");
    // The two that held the streams when it was made, and the flood's call whose turn came
    // first.
    assert!(
        done <= 3,
        "{done} of the flood's 10 calls were answered while the other session's waited"
    );
    for (i, t) in queued.into_iter().enumerate() {
        let r = t.await.expect("a flood call's task");
        assert_eq!(text(&r), format!("a{i}"), "{r}");
    }
}

/// A server behind the forward proxy `HTTP_PROXY` names (a real nginx, proxying what it
/// is asked for) is reached through it: the gateway's direct client steps aside for the
/// proxy-aware one, and every MCP request shows in the proxy's log.
#[tokio::test]
async fn a_server_behind_an_http_proxy_is_reached_through_it() {
    let fx = Fixture::start(&[]);
    let proxy = Nginx::run(|port, dir| {
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\npid {dir}/nginx.pid;\n\
             error_log {dir}/error.log info;\nevents {{ worker_connections 64; }}\n\
             http {{\n  log_format balanced '$request_method $uri $status $upstream_addr';\n\
             access_log {dir}/access.log balanced;\n  client_body_temp_path {dir}/client_body;\n\
             proxy_temp_path {dir}/proxy;\n  fastcgi_temp_path {dir}/fastcgi;\n\
             uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
             proxy_pass http://$http_host$uri$is_args$args;\n      proxy_http_version 1.1;\n\
             proxy_set_header Host $http_host;\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
        )
    });
    let gw = Gateway::start_with_env(
        &remote_table("fx", &fx.url, ""),
        &[("HTTP_PROXY", proxy.base.as_str()), ("NO_PROXY", "")],
    );
    let st = gw.server_status("fx").await;
    assert_eq!(st["state"], "ready", "{st}\n{}", gw.logs());
    let s = gw.session().await;
    calls(&s, 3).await;
    let fixture = format!("127.0.0.1:{}", fx.port());
    let through = proxy.upstreams_of(6, Duration::from_secs(10)).await;
    assert!(
        through.iter().filter(|u| **u == fixture).count() >= 5,
        "initialize, initialized, tools/list and 3 calls went through the proxy: {through:?}\n{}",
        proxy.error_log()
    );
}

/// A self-signed certificate made the usual way (`openssl req -x509`: CA:TRUE) is refused
/// by TLS even with `ca_file` naming it: the reason says so in words, not rustls's enum.
#[tokio::test]
async fn a_ca_certificate_used_as_the_servers_own_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| path_str(&dir.path().join(f));
    let ok = |c: &mut std::process::Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(std::process::Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=DNS:localhost",
        "-days",
        "2",
        "-keyout",
        &p("key.pem"),
        "-out",
        &p("cert.pem"),
    ]));
    ok(std::process::Command::new("openssl").args([
        "x509",
        "-in",
        &p("cert.pem"),
        "-outform",
        "DER",
        "-out",
        &p("cert.der"),
    ]));
    ok(std::process::Command::new("openssl").args([
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &p("key.pem"),
        "-outform",
        "DER",
        "-out",
        &p("key.der"),
    ]));
    let fx = Fixture::start(&["--tls-cert", &p("cert.der"), "--tls-key", &p("key.der")]);
    let url = format!("https://localhost:{}/mcp", fx.port());
    let ca = p("cert.pem");
    let gw = Gateway::start(&remote_table("fx", &url, &format!("ca_file = {ca:?}")));
    let st = gw.server_status("fx").await;
    let reason = st["reason"].as_str().unwrap_or_default();
    assert!(
        st["state"] == "down"
            && reason.contains("a CA certificate (basicConstraints CA:TRUE")
            && !reason.contains("OtherError"),
        "{st}"
    );
}
