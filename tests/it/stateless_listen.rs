//! `subscriptions/listen` (2026-07-28) on the public endpoint: the acknowledgment first,
//! list_changed and resources/updated filtered by what was asked and tagged with the
//! subscription id, downstream resource subscriptions while the stream is open, the
//! stream across a reload, the graceful close at shutdown, and allowlists.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const V: &str = "2026-07-28";
const T: Duration = Duration::from_secs(20);
const SUB: &str = "io.modelcontextprotocol/subscriptionId";

fn meta() -> Value {
    stateless_meta("listen-test")
}

/// A well-formed stateless POST (headers derived from the body), as `token` if given.
async fn post(
    gw: &Gateway,
    token: Option<&str>,
    accept: &str,
    id: Value,
    method: &str,
    mut params: Value,
) -> reqwest::Response {
    params["_meta"] = meta();
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", accept)
        .header("mcp-protocol-version", V)
        .header("mcp-method", method);
    if let Some(n) = params.get("name").and_then(Value::as_str) {
        req = req.header("mcp-name", n);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    req.json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
}

async fn listen(gw: &Gateway, token: Option<&str>, id: Value, notifications: Value) -> Messages {
    let r = post(
        gw,
        token,
        "application/json, text/event-stream",
        id,
        "subscriptions/listen",
        json!({"notifications": notifications}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.headers()["x-accel-buffering"], "no");
    Messages::new(r)
}

async fn call(gw: &Gateway, token: Option<&str>, tool: &str, args: Value) -> Value {
    let r = post(
        gw,
        token,
        "application/json, text/event-stream",
        json!("c"),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    )
    .await;
    let all = read_messages(r).await;
    all.into_iter().last().expect("a response")
}

async fn next(s: &mut Messages) -> Value {
    s.next(T).await.expect("a message on the listen stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_acknowledges_filters_tags_and_unsubscribes() {
    let n = unique("listen");
    let gw = Gateway::start(&server("s0", &n, &["--two-way"], ""));
    let readme = format!("mock://{n}/readme");

    // discover now advertises what listen delivers.
    let r = read_messages(post(&gw, None, "application/json", json!("d"), "server/discover", json!({})).await).await;
    let caps = &r[0]["result"]["capabilities"];
    assert_eq!(caps["tools"]["listChanged"], true, "{caps}");
    assert_eq!(caps["resources"]["subscribe"], true, "{caps}");

    // Without an SSE Accept: 406. A malformed filter: -32602.
    let r = post(
        &gw,
        None,
        "application/json",
        json!(1),
        "subscriptions/listen",
        json!({"notifications": {}}),
    )
    .await;
    assert_eq!(r.status(), 406);
    let r = post(
        &gw,
        None,
        "text/event-stream",
        json!(2),
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": "yes"}}),
    )
    .await;
    let m = read_messages(r).await;
    assert_eq!(m[0]["error"]["code"], -32602, "{m:?}");
    assert_eq!(m[0]["id"], 2);

    let mut s = listen(
        &gw,
        None,
        json!(42),
        json!({"toolsListChanged": true, "resourceSubscriptions": [readme, "nope://x"]}),
    )
    .await;
    let ack = next(&mut s).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(
        ack["params"]["_meta"][SUB],
        json!(42),
        "the id as sent (a number): {ack}"
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": [readme, "nope://x"]}),
        "an unlisted URI goes to the only server with resources, as reads do: {ack}"
    );
    assert!(ack.get("id").is_none());
    assert!(
        gw.wait_log(&format!("subscribe {readme}"), T).await,
        "the downstream was subscribed: {}",
        gw.logs()
    );

    // An update of the subscribed URI arrives tagged; one of another URI does not, and
    // neither does anything before the tools list change that follows it.
    assert_eq!(
        text(&call(&gw, None, "s0__update_resource", json!({"uri": "mock://other"})).await),
        "updated mock://other"
    );
    call(&gw, None, "s0__update_resource", json!({"uri": readme})).await;
    let u = next(&mut s).await;
    assert_eq!(u["method"], "notifications/resources/updated", "{u}");
    assert_eq!(u["params"]["uri"], readme.as_str());
    assert_eq!(u["params"]["_meta"][SUB], json!(42));
    call(&gw, None, "s0__update_resource", json!({"uri": "mock://other"})).await;
    call(&gw, None, "s0__add_tool", json!({"name": "fresh"})).await;
    let t = next(&mut s).await;
    assert_eq!(t["method"], "notifications/tools/list_changed", "{t}");
    assert_eq!(t["params"]["_meta"][SUB], json!(42));

    // A second stream with a string id, only prompts: its ack says just that.
    let mut p = listen(&gw, None, json!("p"), json!({"promptsListChanged": true})).await;
    let ack = next(&mut p).await;
    assert_eq!(ack["params"]["_meta"][SUB], "p");
    assert_eq!(ack["params"]["notifications"], json!({"promptsListChanged": true}));

    // Closing the stream ends the downstream subscription (nobody else has it).
    drop(s);
    assert!(
        gw.wait_log(&format!("unsubscribe {readme}"), T).await,
        "the downstream was unsubscribed: {}",
        gw.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_survives_reload_and_closes_gracefully_on_shutdown() {
    let (n0, n1) = (unique("listen-r0"), unique("listen-r1"));
    let mut gw = Gateway::start(&server("s0", &n0, &[], ""));
    let mut s = listen(&gw, None, json!(7), json!({"toolsListChanged": true})).await;
    let ack = next(&mut s).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");

    // A reload that adds a server changes the tools list: the stream hears it.
    let config = format!("{}{}", server("s0", &n0, &[], ""), server("s1", &n1, &[], ""));
    std::fs::write(gw.config_path(), config).unwrap();
    let t = next(&mut s).await;
    assert_eq!(t["method"], "notifications/tools/list_changed", "{t}");
    assert_eq!(t["params"]["_meta"][SUB], 7);

    // Shutdown: the listen request gets its response, then the stream ends.
    gw.sigterm();
    let (notes, done) = s.response(T).await;
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(done["id"], 7, "{done}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["_meta"][SUB], 7, "{done}");
    assert!(s.next(T).await.is_none(), "the stream ends after the response");
    let status = gw.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_only_subscribes_what_the_allowlist_shows() {
    let (na, nb) = (unique("listen-a"), unique("listen-b"));
    let config = format!(
        "{}{}[clients.alice]\ntoken = \"alice-listen-token\"\nallow = [\"a__*\", \"mock://{na}/*\"]\n\n[clients.bob]\ntoken = \"bob-listen-token\"\n",
        server("a", &na, &["--two-way"], ""),
        server("b", &nb, &["--two-way"], ""),
    );
    let gw = Gateway::start(&config);
    let (ra, rb) = (format!("mock://{na}/readme"), format!("mock://{nb}/readme"));
    let mut s = listen(
        &gw,
        Some("alice-listen-token"),
        json!(1),
        json!({"toolsListChanged": true, "resourceSubscriptions": [ra, rb]}),
    )
    .await;
    let ack = next(&mut s).await;
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": [ra]}),
        "a hidden URI is treated as unknown: {ack}"
    );
    // Bob sees both; an update of b's readme reaches him, and alice's stream only gets
    // a's (the next thing on her stream is a's update, not b's).
    let mut b = listen(
        &gw,
        Some("bob-listen-token"),
        json!(2),
        json!({"resourceSubscriptions": [rb]}),
    )
    .await;
    let ack = next(&mut b).await;
    assert_eq!(ack["params"]["notifications"], json!({"resourceSubscriptions": [rb]}));
    call(&gw, Some("bob-listen-token"), "b__update_resource", json!({"uri": rb})).await;
    assert_eq!(next(&mut b).await["params"]["uri"], rb.as_str());
    call(
        &gw,
        Some("alice-listen-token"),
        "a__update_resource",
        json!({"uri": ra}),
    )
    .await;
    assert_eq!(next(&mut s).await["params"]["uri"], ra.as_str());

    // A reload narrows alice's allowlist: a's readme is hidden from her now, so its next
    // update does not reach her open stream (the tools list change after it does).
    let narrowed = config.replace(&format!(", \"mock://{na}/*\""), "");
    assert_ne!(narrowed, config);
    std::fs::write(gw.config_path(), narrowed).unwrap();
    assert!(gw.wait_log("reload done", T).await, "{}", gw.logs());
    call(&gw, Some("bob-listen-token"), "a__update_resource", json!({"uri": ra})).await;
    call(&gw, Some("bob-listen-token"), "a__add_tool", json!({"name": "later"})).await;
    let m = next(&mut s).await;
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
}

/// Reads a stream until it ends; `false` if it is still open after `T`. What it carries
/// meanwhile must be a tools list change.
async fn ends(s: &mut Messages) -> bool {
    let deadline = std::time::Instant::now() + T;
    while let Some(m) = s
        .next(deadline.saturating_duration_since(std::time::Instant::now()))
        .await
    {
        assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
    }
    std::time::Instant::now() < deadline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_rotates_or_removes_a_clients_token_ends_its_listen_stream() {
    let n = unique("listen-revoke");
    let config = |alice: &str, bob: &str| {
        format!(
            "{}[clients.alice]\ntoken = \"{alice}\"\n\n{bob}",
            server("a", &n, &["--two-way"], "")
        )
    };
    let bob = "[clients.bob]\ntoken = \"bob-listen-token\"\n";
    let gw = Gateway::start(&config("alice-listen-token", bob));
    let mut a = listen(
        &gw,
        Some("alice-listen-token"),
        json!(1),
        json!({"toolsListChanged": true}),
    )
    .await;
    let mut b = listen(
        &gw,
        Some("bob-listen-token"),
        json!(2),
        json!({"toolsListChanged": true}),
    )
    .await;
    for s in [&mut a, &mut b] {
        assert_eq!(next(s).await["method"], "notifications/subscriptions/acknowledged");
    }

    // Alice's token is rotated (a leaked one, say): what the old token opened ends; bob's
    // stream stays and hears the next change.
    std::fs::write(gw.config_path(), config("alice-rotated-token", bob)).unwrap();
    assert!(gw.wait_log("reload done", T).await, "{}", gw.logs());
    assert!(
        ends(&mut a).await,
        "alice's stream is still open after her token changed"
    );
    call(&gw, Some("bob-listen-token"), "a__add_tool", json!({"name": "later"})).await;
    assert_eq!(next(&mut b).await["method"], "notifications/tools/list_changed");
    let r = post(
        &gw,
        Some("alice-listen-token"),
        "application/json",
        json!(3),
        "tools/list",
        json!({}),
    )
    .await;
    assert_eq!(r.status(), 401);

    // Bob's table is removed: his stream ends too.
    std::fs::write(gw.config_path(), config("alice-rotated-token", "")).unwrap();
    assert!(ends(&mut b).await, "bob's stream is still open after his table went");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_are_bounded_by_max_sessions() {
    let gw = Gateway::start(&format!(
        "[gateway]\nmax_sessions = 2\n\n[servers.s0]\n{}\n",
        mock("s0", &[])
    ));
    let first = listen(&gw, None, json!(1), json!({"toolsListChanged": true})).await;
    let _second = listen(&gw, None, json!(2), json!({"toolsListChanged": true})).await;
    let third = post(
        &gw,
        None,
        "application/json, text/event-stream",
        json!(3),
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
    )
    .await;
    assert_eq!(third.status(), 503);
    let body: Value = third.json().await.unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("max_sessions"),
        "{body}"
    );
    // Closing one frees its place.
    drop(first);
    let mut freed = false;
    for _ in 0..200 {
        let r = post(
            &gw,
            None,
            "application/json, text/event-stream",
            json!(4),
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true}}),
        )
        .await;
        if r.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(freed, "a closed listen stream's place was not freed");
}
