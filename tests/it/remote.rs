//! Remote servers behind the gateway, over real HTTP on 127.0.0.1: the stdlib
//! Streamable HTTP fixture (`tests/fixtures/http_server.py`) with its switches for
//! credentials, forgotten sessions, cut streams and request recording.
//! The SDK servers (Python SDK, server-everything) are in `remote_interop.rs`.

use crate::common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls `tool` with fresh id `id` and returns the response.
async fn call(s: &Session, id: Value, tool: &str, args: Value) -> Value {
    s.call_id(id, tool, args).await
}

/// Polls tools/list until it holds `name` (true) or `timeout` passes (false).
async fn until_tool(s: &Session, name: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if s.tool_names().await.iter().any(|n| n == name) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls /status until server `name` is in `state`; returns its last status.
async fn until_state(gw: &Gateway, name: &str, state: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let st = gw.server_status(name).await;
        if st["state"] == state || Instant::now() >= deadline {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn readyz(gw: &Gateway) -> u16 {
    reqwest::get(format!("{}/readyz", gw.base))
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn streamable_http_fixture_lists_calls_and_sends_session_headers() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), ""));
    let s = gw.session().await;
    let names = s.tool_names().await;
    for t in ["web__echo", "web__slow", "web__cut", "web__notify_change"] {
        assert!(names.contains(&t.to_string()), "{t} missing from {names:?}");
    }
    let r = call(&s, json!(7), "web__echo", json!({"text": "héllo \"remote\""})).await;
    assert_eq!(r["id"], 7);
    assert_eq!(text(&r), "héllo \"remote\"");

    // An SSE answer with progress: the client's own token comes back on its stream.
    let mut m = s
        .start(
            json!("p"),
            "tools/call",
            json!({"name": "web__slow", "arguments": {"seconds": 0.1, "bogus": 3}, "_meta": {"progressToken": "tok-1"}}),
        )
        .await;
    let (notes, resp) = m.response(Duration::from_secs(20)).await;
    assert_eq!(text(&resp), "slept 0.1");
    assert_eq!(resp["id"], "p");
    // Progress for tokens the server made up is not the caller's.
    let progress: Vec<&Value> = notes
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 1, "{notes:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "tok-1", "{notes:?}");

    let st = gw.server_status("web").await;
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["protocolVersion"], "2025-11-25", "{st}");

    // Every request after initialize carries the session and the negotiated version.
    let recs = remote.records();
    let init = remote.posts_of("initialize");
    assert_eq!(init.len(), 1, "{recs:?}");
    assert!(init[0]["headers"].get("mcp-session-id").is_none(), "{:?}", init[0]);
    // First the 2026-07-28 probe, sessionless, with its request metadata headers.
    let probe = &recs[0];
    assert_eq!(probe["rpc"], "server/discover", "{recs:?}");
    assert_eq!(probe["headers"]["mcp-protocol-version"], "2026-07-28", "{probe}");
    assert_eq!(probe["headers"]["mcp-method"], "server/discover", "{probe}");
    assert!(probe["headers"].get("mcp-session-id").is_none(), "{probe}");
    let sid: Vec<&Value> = recs
        .iter()
        .filter(|r| r["rpc"] != "initialize" && r["rpc"] != "server/discover")
        .collect();
    assert!(sid.len() >= 3, "{recs:?}");
    for r in &sid {
        assert!(r["headers"]["mcp-session-id"].is_string(), "no session id: {r}");
        assert_eq!(r["headers"]["mcp-protocol-version"], "2025-11-25", "{r}");
    }
    let call_rec = &remote.posts_of("tools/call")[0];
    assert!(
        call_rec["headers"]["accept"]
            .as_str()
            .is_some_and(|a| a.contains("application/json") && a.contains("text/event-stream")),
        "{call_rec}"
    );
    // The notification stream was opened with GET.
    assert!(
        until(Duration::from_secs(5), || remote
            .records()
            .iter()
            .any(|r| r["http"] == "GET"))
        .await,
        "no GET stream: {:?}",
        remote.records()
    );

    // A list_changed from the server reaches the client's GET stream and the new tool.
    let mut g = s.get_stream().await;
    let r = call(&s, json!(8), "web__notify_change", json!({})).await;
    assert!(text(&r).starts_with("added added_1"), "{r}");
    let note = g
        .next(Duration::from_secs(10))
        .await
        .expect("list_changed on the GET stream");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    assert!(s.tool_names().await.contains(&"web__added_1".to_string()));

    // Shutdown ends the session with DELETE.
    let mut gw = gw;
    gw.terminate();
    let deletes: Vec<Value> = remote.records().into_iter().filter(|r| r["http"] == "DELETE").collect();
    assert_eq!(deletes.len(), 1, "{:?}", remote.records());
    assert!(deletes[0]["headers"]["mcp-session-id"].is_string());
}

#[tokio::test]
async fn bearer_token_from_env_is_sent_and_client_credentials_are_not() {
    let token = "tok-7f3a9c-right";
    let remote = Remote::start(&["--require-token", token]);
    let config = remote_table(
        "auth",
        &remote.url(),
        "headers = { Authorization = \"Bearer ${TEST_TOKEN}\" }",
    );
    let gw = Gateway::start_with_env(&config, &[("TEST_TOKEN", token)]);
    let s = gw.session().await;
    let r = s
        .post()
        .header("authorization", "Bearer client-secret")
        .header("cookie", "sid=client-cookie")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
                      "params":{"name":"auth__echo","arguments":{"text":"authorized"}}}))
        .send()
        .await
        .unwrap();
    let r = read_messages(r).await.pop().unwrap();
    assert_eq!(text(&r), "authorized");

    let recs = remote.records();
    assert!(recs.len() >= 4, "{recs:?}");
    for r in &recs {
        assert_eq!(r["headers"]["authorization"], format!("Bearer {token}"), "{r}");
        let all = r.to_string();
        assert!(
            !all.contains("client-secret") && !all.contains("client-cookie"),
            "a client credential reached the server: {r}"
        );
    }
    assert!(!gw.logs().contains(token), "token in the gateway's log");
}

#[tokio::test]
async fn wrong_token_is_a_clear_401_in_check_and_status() {
    let remote = Remote::start(&["--require-token", "the-right-one"]);
    let config = remote_table(
        "auth",
        &remote.url(),
        "headers = { Authorization = \"Bearer ${TEST_TOKEN}\" }",
    );
    let env = [("TEST_TOKEN", "wrong-token-4d1e")];
    let (run, _dir) = check(&config, &["--connect"], &env);
    assert_eq!(run.code, Some(1), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("server auth:"))
        .unwrap_or_else(|| panic!("no line for the server:\n{}", run.stdout));
    assert!(line.contains("DOWN"), "{line}");
    assert!(line.contains("HTTP 401"), "{line}");
    assert!(line.contains("credentials"), "{line}");
    assert!(!run.stdout.contains("wrong-token") && !run.stderr.contains("wrong-token"));

    let gw = Gateway::start_with_env(&config, &env);
    let st = gw.server_status("auth").await;
    assert_eq!(st["state"], "down", "{st}");
    let err = st["lastError"].as_str().unwrap();
    assert!(err.contains("401") && err.contains("credentials"), "{err}");
    assert_eq!(readyz(&gw).await, 503);
    assert!(!gw.logs().contains("wrong-token"));
    // The gateway keeps running and answers clients.
    let s = gw.session().await;
    assert!(s.tool_names().await.is_empty());
}

#[tokio::test]
async fn forgotten_session_is_reinitialized_transparently() {
    // The server/discover probe (refused: a handshake-era server), initialize,
    // notifications/initialized, tools/list: the next POST finds no session.
    let remote = Remote::start(&["--forget-sessions-after", "4"]);
    let gw = Gateway::start(&remote_table("fg", &remote.url(), ""));
    let s = gw.session().await;
    for i in 0..5 {
        let r = call(&s, json!(i), "fg__echo", json!({"text": format!("call {i}")})).await;
        assert_eq!(text(&r), format!("call {i}"), "call {i}: {r}");
    }
    let inits = remote.posts_of("initialize");
    assert_eq!(inits.len(), 2, "{:#?}", remote.records());
    assert!(inits[1]["headers"].get("mcp-session-id").is_none());
    // The calls after the re-initialize use the new session.
    let sessions: std::collections::HashSet<String> = remote
        .posts_of("tools/call")
        .iter()
        .map(|r| r["headers"]["mcp-session-id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let initialized = remote.posts_of("notifications/initialized");
    assert_eq!(initialized.len(), 2, "{:#?}", remote.records());
    assert!(
        gw.wait_log("forgot the session", Duration::from_secs(10)).await,
        "{}",
        gw.logs()
    );
    assert_eq!(gw.server_status("fg").await["state"], "ready");
}

#[tokio::test]
async fn server_killed_and_restarted_comes_back_with_list_changed() {
    let mut remote = Remote::start(&[]);
    let config = format!(
        "{}{}",
        remote_table("flaky", &remote.url(), ""),
        server("calc", &unique("calc"), &[], "")
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    assert_eq!(
        text(&call(&s, json!(1), "flaky__echo", json!({"text": "before"})).await),
        "before"
    );
    let mut g = s.get_stream().await;

    remote.kill();
    // At once: the call reaches the dead server and the error names it.
    let r = call(&s, json!(2), "flaky__echo", json!({"text": "while down"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_string();
    assert!(msg.contains("'flaky'") || msg.contains("flaky__echo"), "{r}");
    let st = until_state(&gw, "flaky", "down", Duration::from_secs(10)).await;
    assert_eq!(st["state"], "down", "{st}");
    assert!(st["lastError"].as_str().unwrap().contains("connection lost"), "{st}");
    // Once it is known to be down, its tools leave the catalog and clients are told.
    let note = g
        .next(Duration::from_secs(10))
        .await
        .expect("list_changed when the server went down");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    let names = s.tool_names().await;
    assert!(!names.iter().any(|n| n.starts_with("flaky__")), "{names:?}");
    assert!(names.contains(&"calc__add".to_string()), "{names:?}");
    // Its names are gone from the catalog, but a call to one names the server that is down.
    let r = call(&s, json!(3), "flaky__echo", json!({"text": "still down"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_string();
    assert!(msg.contains("server 'flaky' is not available"), "{r}");
    // The other server is unaffected.
    assert_eq!(
        text(&call(&s, json!(4), "calc__add", json!({"a": 1, "b": 2})).await),
        "3"
    );
    assert_eq!(readyz(&gw).await, 503);

    remote.restart();
    let st = until_state(&gw, "flaky", "ready", Duration::from_secs(15)).await;
    assert_eq!(st["state"], "ready", "{st}\n{}", gw.logs());
    assert!(until_tool(&s, "flaky__echo", Duration::from_secs(15)).await);
    let note = g
        .next(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("no list_changed after the server came back\n{}", gw.logs()));
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    assert_eq!(
        text(&call(&s, json!(5), "flaky__echo", json!({"text": "after"})).await),
        "after"
    );
    assert_eq!(readyz(&gw).await, 200);
}

#[tokio::test]
async fn cut_response_stream_is_resumed_with_last_event_id() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("cutter", &remote.url(), ""));
    let s = gw.session().await;
    let t = Instant::now();
    let r = call(&s, json!(1), "cutter__cut", json!({})).await;
    assert_eq!(text(&r), "resumed", "{r}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let resume: Vec<Value> = remote
        .records()
        .into_iter()
        .filter(|r| r["http"] == "GET" && r["headers"]["last-event-id"].is_string())
        .collect();
    assert_eq!(resume.len(), 1, "{:?}", remote.records());
    assert!(resume[0]["headers"]["mcp-session-id"].is_string());
    // The session goes on.
    assert_eq!(
        text(&call(&s, json!(2), "cutter__echo", json!({"text": "next"})).await),
        "next"
    );
}

#[tokio::test]
async fn cut_response_stream_without_resumption_fails_clearly() {
    let remote = Remote::start(&["--no-resume"]);
    let gw = Gateway::start(&remote_table("cutter", &remote.url(), ""));
    let s = gw.session().await;
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(15), call(&s, json!(1), "cutter__cut", json!({})))
        .await
        .expect("the call hung instead of failing");
    // Well before the server's 20 s timeout.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let e = error_of(&r);
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("'cutter'"), "{r}");
    assert!(msg.contains("405") || msg.contains("resum"), "{r}");
    assert_eq!(e["data"]["server"], "cutter");
    assert_eq!(
        text(&call(&s, json!(2), "cutter__echo", json!({"text": "next"})).await),
        "next"
    );
}

#[tokio::test]
async fn forty_concurrent_calls_to_one_http_server() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("many", &remote.url(), ""));
    let s = Arc::new(gw.session().await);
    let t = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let (tool, args, want) = if i % 2 == 0 {
                    ("many__echo", json!({"text": format!("n{i}")}), format!("n{i}"))
                } else {
                    ("many__slow", json!({"seconds": 0.5}), "slept 0.5".to_string())
                };
                let id = json!(format!("c{i}"));
                let r = s.call_id(id.clone(), tool, args).await;
                assert_eq!(r["id"], id, "{r}");
                assert_eq!(text(&r), want, "{r}");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // 20 half-second calls in flight together, not one after another.
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(remote.posts_of("tools/call").len(), 40);
    assert_eq!(remote.posts_of("initialize").len(), 1);
}

#[tokio::test]
async fn server_down_at_start_does_not_stop_the_gateway() {
    // Reserved until the fixture takes it over: refused until then, and nobody else's.
    let port = ReservedPort::new();
    let url = format!("http://127.0.0.1:{}/mcp", port.port);
    let config = format!(
        "{}{}",
        server("calc", &unique("calc"), &[], ""),
        remote_table("late", &url, "")
    );
    let gw = Gateway::start(&config);
    assert_eq!(readyz(&gw).await, 503);
    let st = gw.server_status("late").await;
    assert_eq!(st["state"], "down", "{st}");
    assert!(st["lastError"].as_str().unwrap().contains("connect"), "{st}");
    let s = gw.session().await;
    assert_eq!(
        text(&call(&s, json!(1), "calc__add", json!({"a": 2, "b": 3})).await),
        "5"
    );
    assert!(!s.tool_names().await.iter().any(|n| n.starts_with("late__")));
    let mut g = s.get_stream().await;

    let _remote = Remote::start_on(port, &[]);
    // Retries at 1 s, 2 s, 4 s… after start: well within 15 s.
    assert!(
        until_tool(&s, "late__echo", Duration::from_secs(15)).await,
        "{}",
        gw.logs()
    );
    let note = g.next(Duration::from_secs(5)).await.expect("list_changed");
    assert_eq!(note["method"], "notifications/tools/list_changed");
    assert_eq!(
        text(&call(&s, json!(2), "late__echo", json!({"text": "hi"})).await),
        "hi"
    );
    assert_eq!(readyz(&gw).await, 200);
}

#[tokio::test]
async fn secrets_in_headers_and_url_never_show() {
    let header_secret = "hdr-secret-5b8e2f";
    let url_secret = "url-secret-a91c07";
    // Written in gateway.toml itself, not through a variable.
    let literal_secret = "lit-pass-7d3e9a";
    let mut remote = Remote::start(&[]);
    let dead = ReservedPort::new();
    let config = format!(
        "{}{}{}",
        remote_table(
            "lit",
            &format!(
                "http://user:{literal_secret}@127.0.0.1:{}/mcp?api_key={literal_secret}",
                remote.port
            ),
            "",
        ),
        remote_table(
            "sec",
            &format!("{}?key=${{URL_SECRET}}", remote.url()),
            "headers = { X-Api-Key = \"${HEADER_SECRET}\", Authorization = \"Bearer ${HEADER_SECRET}\" }",
        ),
        remote_table(
            "gone",
            &format!("http://127.0.0.1:{}/mcp?key=${{URL_SECRET}}", dead.port),
            "headers = { X-Api-Key = \"${HEADER_SECRET}\" }",
        ),
    );
    let env = [
        ("HEADER_SECRET", header_secret),
        ("URL_SECRET", url_secret),
        ("MCP_GATEWAY_LOG", "debug"),
    ];
    let leaks = |what: &str, text: &str| {
        assert!(
            !text.contains(header_secret) && !text.contains(url_secret) && !text.contains(literal_secret),
            "a secret shows in {what}:\n{text}"
        );
    };

    let (run, _dir) = check(&config, &["--connect"], &env);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("sec__echo"), "{}", run.stdout);
    assert!(run.stdout.contains("server gone: DOWN"), "{}", run.stdout);
    leaks("check --connect stdout", &run.stdout);
    leaks("check --connect stderr", &run.stderr);

    let gw = Gateway::start_with_env(&config, &env);
    let s = gw.session().await;
    assert_eq!(
        text(&call(&s, json!(1), "sec__echo", json!({"text": "ok"})).await),
        "ok"
    );
    // The secrets did reach the server.
    let rec = &remote.posts_of("tools/call")[0];
    assert!(
        rec["path"].as_str().unwrap().ends_with(&format!("?key={url_secret}")),
        "{rec}"
    );
    assert_eq!(rec["headers"]["x-api-key"], header_secret);

    let mut errors = Vec::new();
    errors.push(call(&s, json!(2), "sec__cut_missing", json!({})).await);
    // A server that repeats the credentials it was sent in its error: as an HTTP error's
    // text, and as a JSON-RPC error with an HTTP error status or with 200.
    for (id, status) in [(5, 502), (6, 400), (7, 200)] {
        let e = call(&s, json!(id), "sec__echo", json!({"text": format!("leak {status}")})).await;
        assert!(e.to_string().contains("***"), "{e}");
        errors.push(e);
    }
    assert_eq!(
        text(&call(&s, json!(8), "lit__echo", json!({"text": "ok"})).await),
        "ok"
    );
    remote.kill();
    errors.push(call(&s, json!(3), "sec__echo", json!({"text": "down"})).await);
    let st = until_state(&gw, "sec", "down", Duration::from_secs(10)).await;
    assert_eq!(st["state"], "down", "{st}");
    errors.push(call(&s, json!(4), "sec__echo", json!({"text": "down"})).await);
    for e in &errors {
        assert!(e.get("error").is_some(), "{e}");
        leaks("an error to a client", &e.to_string());
    }
    let status = gw.get_text("/status").await;
    assert!(status.contains("\"gone\""), "{status}");
    leaks("/status", &status);
    let logs = gw.logs();
    assert!(logs.contains("DEBUG"), "not a debug log:\n{logs}");
    leaks("the gateway's debug log", &logs);
}

#[tokio::test]
async fn a_forgotten_session_gets_its_resource_subscriptions_back() {
    // probe, initialize, initialized, tools/list, resources/list, templates/list, and the
    // client's subscribe: the POST after those finds no session.
    let remote = Remote::start(&["--resources", "--forget-sessions-after", "7"]);
    let gw = Gateway::start(&remote_table("rs", &remote.url(), ""));
    let s = gw.session().await;
    let sub = s
        .request(json!(1), "resources/subscribe", json!({"uri": "fixture://watched"}))
        .await;
    assert_eq!(sub["result"], json!({}), "{sub}");
    assert_eq!(remote.posts_of("resources/subscribe").len(), 1);
    let r = call(&s, json!(2), "rs__echo", json!({"text": "after"})).await;
    assert_eq!(text(&r), "after", "{r}");
    assert_eq!(remote.posts_of("initialize").len(), 2, "{:#?}", remote.records());
    // The new session is subscribed again, under its own session id.
    let again = until(Duration::from_secs(10), || {
        remote.posts_of("resources/subscribe").len() == 2
    })
    .await;
    assert!(again, "{:#?}", remote.records());
    let subs = remote.posts_of("resources/subscribe");
    assert_ne!(
        subs[0]["headers"]["mcp-session-id"], subs[1]["headers"]["mcp-session-id"],
        "{subs:?}"
    );
}

/// `max_connections = 1` and calls that outlast their 1 s timeout: each gets the timeout
/// error naming the server, whether it held the one slot or was waiting for it, and the
/// slot is free again at once (a timed-out call's task is aborted, its slot with it): the
/// next call is answered within its own 1 s, where a slot still held by a 3 s call would
/// time it out too.
#[tokio::test]
async fn calls_that_time_out_waiting_for_a_slot_free_it() {
    let remote = Remote::start(&[]);
    let config = format!(
        "[servers.one]\nurl = {:?}\ntimeout = \"1s\"\nmax_connections = 1\n",
        remote.url()
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let slow = futures::future::join_all((0..4).map(|i| call(&s, json!(i), "one__slow", json!({"seconds": 3})))).await;
    for r in &slow {
        let e = r["error"]["message"].as_str().unwrap_or_default();
        assert!(e.contains("one") && e.contains("1s"), "{r}");
    }
    let r = call(&s, json!(9), "one__echo", json!({"text": "free"})).await;
    assert_eq!(text(&r), "free", "{r}\n{}", gw.logs());
}

/// One session's flood of slow calls does not hold up another session's call: with one
/// slot, the other session's call gets the slot as soon as the call holding it ends, not
/// after every call the flooding session queued first (a plain semaphore's order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_flood_does_not_queue_another_sessions_call_behind_it() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("one", &remote.url(), "max_connections = 1"));
    let flood = Arc::new(gw.session().await);
    let other = gw.session().await;
    let spawn_call = |id: i64, seconds: f64| {
        let s = flood.clone();
        tokio::spawn(async move { s.call_id(json!(id), "one__slow", json!({"seconds": seconds})).await })
    };
    let other = other.call_id(json!("b"), "one__echo", json!({"text": "my turn"}));
    other_goes_before_the_flood(&remote, &gw, spawn_call, other, "session").await;
}

/// Floods a server of one slot (`spawn_call(id, seconds)`: a holder, then three queued
/// calls), then makes `other`'s call: its turn comes after the holder's and at most one
/// queued call of the flood.
async fn other_goes_before_the_flood<T: Send + 'static>(
    remote: &Remote,
    gw: &Gateway,
    spawn_call: impl Fn(i64, f64) -> tokio::task::JoinHandle<T>,
    other: impl std::future::Future<Output = Value>,
    whose: &str,
) {
    let holder = spawn_call(0, 0.5);
    assert!(
        until(Duration::from_secs(10), || remote.posts_of("tools/call").len() == 1).await,
        "{:#?}",
        remote.records()
    );
    let queued: Vec<_> = (1..=3).map(|id| spawn_call(id, 1.0)).collect();
    assert!(gw.in_flight_is(4).await, "in flight: {}", gw.in_flight().await);
    let r = other.await;
    assert_eq!(text(&r), "my turn", "{r}");
    let done = queued.iter().filter(|t| t.is_finished()).count();
    assert!(
        done <= 1,
        "{done} of the flood's queued calls went before the other {whose}'s"
    );
    assert!(holder.await.is_ok());
    for t in queued {
        t.abort();
    }
}

/// Stateless (2026-07-28) requests without an identity are callers by their address: a
/// flood from one address (behind a trusted balancer, the one its `X-Forwarded-For`
/// names) does not queue another address's call behind it, as a session's flood does not
/// (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_addresss_stateless_flood_does_not_queue_another_addresss_call_behind_it() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&format!(
        "[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n\n{}",
        remote_table("one", &remote.url(), "max_connections = 1")
    ));
    let call = |from: &'static str, id: Value, tool: &'static str, arguments: Value| {
        stateless_call_from(gw.url.clone(), from, id, tool, arguments)
    };
    let spawn_call =
        |id: i64, seconds: f64| tokio::spawn(call("10.0.0.1", json!(id), "one__slow", json!({"seconds": seconds})));
    let other = call("10.0.0.2", json!("b"), "one__echo", json!({"text": "my turn"}));
    other_goes_before_the_flood(&remote, &gw, spawn_call, other, "address").await;
}

/// Sessions without an identity take turns as their address's: one address that opens a
/// session per queued call (a client that gets around a per-session turn) gets one turn
/// among addresses, so another address's call goes after the holder's and at most one of
/// the flood's, not after every session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_addresss_flood_over_many_sessions_does_not_queue_another_addresss_call_behind_it() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&format!(
        "[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n\n{}",
        remote_table("one", &remote.url(), "max_connections = 1")
    ));
    let from = |addr: &str| {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("x-forwarded-for", addr.parse().expect("header value"));
        reqwest::Client::builder().default_headers(h).build().expect("client")
    };
    let mut flood = Vec::new();
    for _ in 0..4 {
        flood.push(Arc::new(Session::open_on(from("10.0.0.1"), &gw.url, json!({})).await));
    }
    let other = Session::open_on(from("10.0.0.2"), &gw.url, json!({})).await;
    let spawn_call = |id: i64, seconds: f64| {
        let s = flood[id as usize].clone();
        tokio::spawn(async move { s.call_id(json!(id), "one__slow", json!({"seconds": seconds})).await })
    };
    let other = other.call_id(json!("b"), "one__echo", json!({"text": "my turn"}));
    other_goes_before_the_flood(&remote, &gw, spawn_call, other, "address").await;
}

/// A call still waiting for the server's only slot never reached the server, so its
/// client's cancellation is not passed on (a thousand such waiters would otherwise be a
/// thousand notifications, and notifications take no slot); the call holding the slot is
/// cancelled at the server as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_waiting_for_a_slot_is_not_cancelled_at_the_server() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("one", &remote.url(), "max_connections = 1"));
    let s = Arc::new(gw.session().await);
    let spawn_call = |id: i64| {
        let s = s.clone();
        tokio::spawn(async move { s.call_id(json!(id), "one__slow", json!({"seconds": 5})).await })
    };
    let holder = spawn_call(0);
    assert!(
        until(Duration::from_secs(10), || remote.posts_of("tools/call").len() == 1).await,
        "{:#?}",
        remote.records()
    );
    let waiters: Vec<_> = (1..=3).map(spawn_call).collect();
    assert!(gw.in_flight_is(4).await, "in flight: {}", gw.in_flight().await);
    for id in 1..=3 {
        s.notify(
            "notifications/cancelled",
            json!({"requestId": id, "reason": "changed my mind"}),
        )
        .await;
    }
    assert!(gw.in_flight_is(1).await, "in flight: {}", gw.in_flight().await);
    s.notify("notifications/cancelled", json!({"requestId": 0})).await;
    assert!(
        until(Duration::from_secs(10), || !remote
            .posts_of("notifications/cancelled")
            .is_empty())
        .await,
        "the holder's cancellation did not reach the server"
    );
    assert!(gw.in_flight_is(0).await, "in flight: {}", gw.in_flight().await);
    // Only the holder's request and its cancellation reached the server.
    assert_eq!(remote.posts_of("tools/call").len(), 1, "{:#?}", remote.records());
    assert_eq!(
        remote.posts_of("notifications/cancelled").len(),
        1,
        "{:#?}",
        remote.records()
    );
    holder.abort();
    for w in waiters {
        w.abort();
    }
}

/// What a remote server sends is bounded by `gateway.max_line`, as a child's lines are: a
/// JSON answer or an SSE event past it fails the call with an error naming the server
/// and the limit (it was read whole, a gigabyte if the server liked), and an error body is
/// read only as far as it is shown.
#[tokio::test]
async fn a_remote_servers_answer_is_bounded_by_max_line() {
    let remote = Remote::start(&["--hostile"]);
    let config = format!(
        "[gateway]\nmax_line = \"64KiB\"\n\n{}",
        remote_table("r", &remote.url(), "")
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let small = call(&s, json!(1), "r__big", json!({"bytes": 10_000})).await;
    assert_eq!(text(&small).len(), 10_000, "{small}");
    for (id, args) in [
        (2, json!({"bytes": 100_000})),
        (3, json!({"bytes": 100_000, "sse": true})),
    ] {
        let r = call(&s, json!(id), "r__big", args.clone()).await;
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("server 'r'") && msg.contains("gateway.max_line"),
            "{args}: {r}"
        );
    }
    let r = call(&s, json!(4), "r__big", json!({"bytes": 50_000_000, "status": 500})).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'r'") && msg.contains("not read"), "{r}");
    // The server is still there for the next call.
    assert_eq!(text(&call(&s, json!(5), "r__echo", json!({"text": "ok"})).await), "ok");
}

/// An SSE answer to a call that is no JSON (a raw control character in a string) fails
/// the call at once, naming the server, though the server holds the stream open: it was
/// skipped, and the call waited for the stream's end or its timeout.
#[tokio::test]
async fn a_remote_servers_broken_answer_fails_its_call_at_once() {
    let remote = Remote::start(&["--hostile"]);
    // The server holds the stream 30 s, past the call's timeout (20 s): a call that
    // waited would end in a timeout, not this error.
    let gw = Gateway::start(&remote_table("r", &remote.url(), ""));
    let s = gw.session().await;
    let r = call(&s, json!(1), "r__broken", json!({})).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("'r'") && msg.contains("invalid JSON-RPC"), "{r}");
    assert_eq!(text(&call(&s, json!(2), "r__echo", json!({"text": "ok"})).await), "ok");
}

/// A 3xx is a remote server's answer, never followed, on every path (a URL with a user
/// and password goes through another HTTP client than a plain one): a redirect would
/// carry the configured headers and the request to wherever it points.
#[tokio::test]
async fn a_redirect_is_not_followed_with_the_servers_headers() {
    let remote = Remote::start(&["--hostile"]);
    let sink = Remote::start(&[]);
    for url in [
        remote.url(),
        format!("http://user:pass-0123456@127.0.0.1:{}/mcp", remote.port),
    ] {
        let config = remote_table("r", &url, "headers = { X-Api-Key = \"key-0123456789\" }");
        let gw = Gateway::start(&config);
        let s = gw.session().await;
        let r = call(&s, json!(1), "r__moved", json!({"to": sink.url()})).await;
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("server 'r'") && msg.contains("307"), "{url}: {r}");
    }
    assert!(
        sink.records().is_empty(),
        "the redirect was followed: {:?}",
        sink.records()
    );
}

/// A legacy HTTP+SSE server whose `endpoint` event names another origin is refused and
/// marked down with that reason: its messages would carry the configured headers there.
#[tokio::test]
async fn a_legacy_endpoint_on_another_origin_is_refused() {
    let sink = Remote::start(&[]);
    let legacy = Remote::start(&["--legacy-endpoint", &sink.url()]);
    let config = remote_table(
        "old",
        &format!("http://127.0.0.1:{}/sse", legacy.port),
        "transport = \"sse\"\nheaders = { X-Api-Key = \"key-0123456789\" }",
    );
    let gw = Gateway::start(&config);
    let st = until_state(&gw, "old", "down", Duration::from_secs(20)).await;
    assert!(st.to_string().contains("another origin"), "{st}");
    assert!(
        sink.records().is_empty(),
        "a message went to the other origin: {:?}",
        sink.records()
    );
}

/// A remote server that accepts the connection and never answers holds the gateway's
/// start (for its `timeout`): the probes answer meanwhile (/healthz 200, /readyz 503), and
/// the rest waits for the start to be over (the "listening" line too), then sees the
/// server named as unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_answer_while_a_hanging_server_holds_the_start() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", hole.local_addr().unwrap());
    let cfg = format!("[servers.hole]\nurl = {url:?}\ntimeout = \"60s\"\n");
    let port = ReservedPort::new();
    let listen = format!("127.0.0.1:{}", port.port);
    let (_dir, mut cmd) = gateway_command(&cfg, &["serve", "--listen", &listen], &[]);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn gateway");
    let stderr = child.stderr.take().unwrap();
    // The gateway's first attempt connects, and is never answered while this holds it.
    let (held, hole) = tokio::task::spawn_blocking(move || (hole.accept().unwrap().0, hole))
        .await
        .unwrap();
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    // Held for 60 s, the start cannot be over before this answers (unless it hangs).
    let h = http
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("/healthz answers during the start");
    assert_eq!(h.status(), 200);
    let r = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    // The rest waits: let the attempt fail (connection closed, then refused).
    let status = tokio::spawn(http.get(format!("{base}/status")).send());
    drop((held, hole));
    let seen = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut seen = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("mcp-gateway listening on") {
                break;
            }
        }
        seen
    })
    .await
    .unwrap();
    assert!(seen.contains("server unavailable"), "{seen}");
    let st: Value = status.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(st["servers"][0]["state"], "down", "{st}");
    let _ = child.kill();
    let _ = child.wait();
    drop(port);
}

/// A server too busy (429 or 503 with `Retry-After`, seconds or an HTTP date): the caller's
/// error names the server and the status, and says when the server asks to be tried
/// again; the gateway does not retry on its own (one POST per call).
#[tokio::test]
async fn a_busy_servers_retry_after_reaches_the_caller_in_words() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), ""));
    let s = gw.session().await;
    let cases = [
        (429, "30", Some("(it asks to be tried again in 30s)")),
        (
            503,
            "Wed, 21 Oct 2015 07:28:00 GMT",
            Some("(it asks to be tried again now)"),
        ),
        (
            429,
            "99999999999",
            Some("(it asks to be tried again in more than 86400s)"),
        ),
        (429, "soon, maybe", None),
    ];
    let before = remote.posts_of("tools/call").len();
    for (i, (status, after, said)) in cases.iter().enumerate() {
        let args = json!({"text": "x", "retry_after": after, "status": status});
        let r = call(&s, json!(i), "web__echo", args).await;
        let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_string();
        assert!(
            msg.contains("server 'web' answered HTTP") && msg.contains(&status.to_string()),
            "{r}"
        );
        match said {
            Some(w) => assert!(msg.contains(w), "{r}"),
            None => assert!(!msg.contains("tried again"), "{r}"),
        }
    }
    assert_eq!(remote.posts_of("tools/call").len() - before, cases.len());
}
