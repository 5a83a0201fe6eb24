//! Real nginx in front of real gateways: the cluster tests' balancer
//! (tests/fixtures/nginx-cluster.conf.template, through `common::Nginx`) and docker
//! compose's (deploy/nginx/mcp-gateway.conf) balance round-robin with no stickiness,
//! pass SSE through unbuffered, and retry a connect a stopped replica refuses.

use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
const KEY: &str = "balancer-test-cluster-key-0123456789abcdef";

fn addr(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_owned()
}

/// Every GET on its own connection (a pooled one would still be balanced per request,
/// but this leaves nothing to chance).
fn fresh() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

#[tokio::test]
async fn the_test_balancer_is_round_robin_across_two_replicas() {
    let redis = Redis::start();
    let replica = |id: &str| {
        Gateway::start(&format!(
            "[cluster]\nredis = \"{}\"\nkey = \"{KEY}\"\nreplica_id = \"{id}\"\n",
            redis.url
        ))
    };
    let (a, b) = (replica("gw-a"), replica("gw-b"));
    let nginx = Nginx::start(&[addr(&a), addr(&b)]);
    let client = fresh();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let r = client.get(format!("{}/status", nginx.base)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let status: serde_json::Value = r.json().await.unwrap();
        seen.push(status["cluster"]["replica"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen.iter().filter(|r| *r == "gw-a").count(), 5, "{seen:?}");
    assert_eq!(seen.iter().filter(|r| *r == "gw-b").count(), 5, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] != w[1]), "alternating: {seen:?}");
    // nginx's own record agrees: one upstream per request, alternating.
    let used = nginx.upstreams_of(10, T).await;
    assert_eq!(used.len(), 10, "{used:?}");
    for (who, upstream) in seen.iter().zip(&used) {
        let expected = if who == "gw-a" { addr(&a) } else { addr(&b) };
        assert_eq!(upstream, &expected, "{seen:?} {used:?}");
    }
    // The MCP endpoint through it: the Host nginx passes on is accepted.
    let r = client
        .post(&nginx.url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn sse_through_the_test_balancer_is_not_buffered() {
    let name = unique("lb-sse");
    let gw = Gateway::start(&server("m", &name, &[], ""));
    let nginx = Nginx::start(&[addr(&gw)]);
    let s = Session::open(&nginx.url).await;
    progress_is_not_buffered(&s, json!(1)).await;
}

/// A 3-second call with a progress notification a second: the first one must arrive
/// long before the answer (an SSE answer buffered on the way arrives all at the end).
async fn progress_is_not_buffered(s: &Session, id: serde_json::Value) {
    let began = Instant::now();
    let mut call = s
        .start(
            id,
            "tools/call",
            json!({"name": "m__slow", "arguments": {"seconds": 3.0, "steps": 3}, "_meta": {"progressToken": "p"}}),
        )
        .await;
    let first = call.next(T).await.expect("a progress notification");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    assert!(
        began.elapsed() < Duration::from_millis(2500),
        "the first progress (sent at 1 s of 3) came after {:?}: buffered",
        began.elapsed()
    );
    let (_, resp) = call.response(T).await;
    assert_eq!(text(&resp), "done", "{resp}");
}

/// deploy/nginx/mcp-gateway.conf as docker compose runs it (in the image's `http {}`),
/// with its `gateway-N:8080` upstreams and its port replaced by these.
fn compose_balancer(upstreams: &[String]) -> Nginx {
    let site = std::fs::read_to_string(repo().join("deploy/nginx/mcp-gateway.conf")).unwrap();
    for (i, _) in upstreams.iter().enumerate() {
        assert!(site.contains(&format!("server gateway-{}:8080", i + 1)), "{site}");
    }
    assert!(site.contains("listen 8080;"), "{site}");
    Nginx::run(|port, dir| {
        let mut site = site.replace("listen 8080;", &format!("listen 127.0.0.1:{port};"));
        for (i, u) in upstreams.iter().enumerate() {
            site = site.replace(&format!("gateway-{}:8080", i + 1), u);
        }
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 1;\npid {dir}/nginx.pid;\n\
             error_log {dir}/error.log info;\nevents {{ worker_connections 256; }}\n\
             http {{\n  log_format balanced '$request_method $uri $status $upstream_addr';\n\
             access_log {dir}/access.log balanced;\n  client_body_temp_path {dir}/client_body;\n\
             proxy_temp_path {dir}/proxy;\n  fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n\
             scgi_temp_path {dir}/scgi;\n{site}\n}}\n"
        )
    })
}

#[tokio::test]
async fn the_compose_balancer_is_round_robin_and_retries_a_refused_connect() {
    let mut gws = vec![Gateway::start(""), Gateway::start(""), Gateway::start("")];
    let addrs: Vec<String> = gws.iter().map(addr).collect();
    let nginx = compose_balancer(&addrs);
    let client = fresh();
    for _ in 0..6 {
        let r = client.get(format!("{}/healthz", nginx.base)).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let used = nginx.upstreams_of(6, T).await;
    assert_eq!(used.len(), 6, "{used:?}");
    for (i, u) in used.iter().enumerate() {
        assert_eq!(u, &addrs[i % 3], "round-robin over the three: {used:?}");
    }
    // A replica that stopped accepting (past its drain, or gone): its connects are
    // refused and retried on the next one; no request fails.
    let mut gone = gws.remove(1);
    gone.child.kill().unwrap();
    gone.child.wait().unwrap();
    for _ in 0..6 {
        let r = client.get(format!("{}/healthz", nginx.base)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", nginx.error_log());
    }
    let after = &nginx.upstreams_of(12, T).await[6..];
    assert!(
        after.iter().any(|u| u.starts_with(&format!("{}, ", addrs[1]))),
        "a refused connect was retried: {after:?}"
    );
    assert!(
        after.iter().all(|u| u.ends_with(&addrs[0]) || u.ends_with(&addrs[2])),
        "{after:?}"
    );
}

#[tokio::test]
async fn the_compose_balancer_passes_a_session_and_its_sse_through() {
    let name = unique("lb-compose");
    let gw = Gateway::start(&server("m", &name, &[], ""));
    // One replica behind all three upstream lines: a session stays where it is.
    let nginx = compose_balancer(&[addr(&gw), addr(&gw), addr(&gw)]);
    let s = Session::open(&nginx.url).await;
    assert_eq!(
        text(&s.call("m__echo", json!({"text": "via nginx"})).await),
        "via nginx"
    );
    progress_is_not_buffered(&s, json!(2)).await;
}
