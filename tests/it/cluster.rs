//! `[cluster]`: replicas sharing one real Redis (issue #16).

use crate::common::*;
use serde_json::json;
use std::time::Duration;

/// 32 bytes and more: the cluster key every replica of a test shares.
pub const KEY: &str = "test-cluster-key-0123456789abcdef0123456789";

pub fn cluster_toml(redis: &Redis, extra: &str) -> String {
    format!("[cluster]\nredis = \"{}\"\nkey = \"{KEY}\"\n{extra}\n", redis.url)
}

#[tokio::test]
async fn a_replica_reports_itself_and_redis_on_status() {
    let mut redis = Redis::start();
    let gw = Gateway::start(&cluster_toml(&redis, "replica_id = \"gw-a\""));
    let seen = until(Duration::from_secs(10), || {
        let s = redis.cli(&["ZCARD", "mcpgw:replicas"]);
        s.trim() == "1"
    })
    .await;
    assert!(seen, "the heartbeat reached Redis");
    let status = gw.get_json("/status").await;
    assert_eq!(status["cluster"]["replica"], "gw-a");
    assert_eq!(status["cluster"]["redis"], "up");
    redis.kill();
    let mut down = false;
    for _ in 0..100 {
        if gw.get_json("/status").await["cluster"]["redis"] == "down" {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(down, "Redis killed shows as down");
    assert!(gw.wait_log("Redis is unreachable", Duration::from_secs(5)).await);
}

/// `n` replicas sharing `redis`, each with `servers` (TOML) and `extra` cluster keys.
pub fn replicas(n: usize, redis: &Redis, servers: &str, extra: &str) -> Vec<Gateway> {
    (0..n)
        .map(|i| {
            let id = if extra.contains("replica_id") {
                String::new()
            } else {
                format!("replica_id = \"gw-{i}\"\n")
            };
            let config = format!("{servers}\n{}", cluster_toml(redis, &format!("{id}{extra}")));
            Gateway::start_with_env(&config, &[("MCP_GATEWAY_LOG", "info,mcp_gateway::router=debug")])
        })
        .collect()
}

/// The same session, its requests sent to `gw`.
pub fn via(s: &Session, gw: &Gateway) -> Session {
    Session {
        http: s.http.clone(),
        url: gw.url.clone(),
        id: s.id.clone(),
        init: s.init.clone(),
    }
}

fn two_way() -> String {
    server("calc", "calc", &["--two-way"], "")
}

const T: Duration = Duration::from_secs(20);

/// A resource of [`subscribable`]'s server.
const README: &str = "mock://calc/readme";

/// A server whose `update_resource` tool says whether it was subscribed to the URI.
fn subscribable() -> String {
    server("calc", "calc", &["--two-way", "--quirk", "subscribed-only"], "")
}

/// Runs `f` while replica `gw` is frozen and its bus connection cut: it misses every note
/// sent meanwhile (pub/sub is at most once), and listens again once thawed.
async fn deaf_while<F: std::future::Future>(gw: &Gateway, redis: &Redis, f: F) -> F::Output {
    let frozen = gw.child.id() as i32;
    // SAFETY: signals to a child process this test started.
    unsafe { libc::kill(frozen, libc::SIGSTOP) };
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let out = f.await;
    // SAFETY: as above.
    unsafe { libc::kill(frozen, libc::SIGCONT) };
    out
}

#[tokio::test]
async fn a_session_opened_on_one_replica_is_served_by_every_replica() {
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let (b, c) = (via(&a, &gws[1]), via(&a, &gws[2]));
    assert!(b.tool_names().await.contains(&"calc__add".to_string()));
    let r = c.call("calc__add", serde_json::json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&r), "5", "{r}");
    let r = b
        .request(
            serde_json::json!(7),
            "logging/setLevel",
            serde_json::json!({"level": "debug"}),
        )
        .await;
    assert_eq!(r["result"], serde_json::json!({}), "{r}");
    // DELETE on the third: the session is gone on every replica.
    assert_eq!(c.end().await, 200);
    for s in [&a, &b] {
        assert!(s.until_gone().await, "the session ended everywhere");
    }
    // Redis never holds a session id.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(!keys.contains(&a.id), "{keys}");
}

/// A session ended through one replica while another was not listening to the bus (the
/// note of its end is lost there: pub/sub is at most once) ends on that replica too once
/// it listens again: it finds the session's tombstone in Redis, rather than serving its
/// copy on or writing the record back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_while_a_replica_missed_the_bus_ends_there_once_it_listens_again() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    let r = b.call("calc__add", serde_json::json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&r), "5", "{r}");
    assert_eq!(deaf_while(&gws[1], &redis, a.end()).await, 200);
    assert!(
        b.until_gone().await,
        "the replica that missed the note still serves the session\n{}",
        gws[1].logs()
    );
    // Its record was not written back.
    let keys = redis.cli(&["KEYS", "*session:*"]);
    assert!(keys.trim().is_empty(), "{keys}");
}

/// `logging/setLevel` through one replica is answered once the level holds on the others:
/// a call sent to another replica right after it is filtered at the new level, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_level_set_through_one_replica_holds_on_the_next_at_once() {
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let others = [via(&a, &gws[1]), via(&a, &gws[2])];
    for round in 0..10 {
        let (level, heard) = if round % 2 == 0 {
            ("error", false)
        } else {
            ("info", true)
        };
        let r = a
            .request(json!(round), "logging/setLevel", json!({"level": level}))
            .await;
        assert_eq!(r["result"], json!({}), "{r}");
        let on = &others[round % 2];
        let message = format!("round-{round}");
        let mut m = on
            .start(
                json!("log"),
                "tools/call",
                json!({"name": "calc__log", "arguments": {"message": message}}),
            )
            .await;
        let (notes, r) = m.response(T).await;
        assert_eq!(text(&r), "logged", "{r}");
        let logged = notes
            .iter()
            .any(|n| n["method"] == "notifications/message" && n["params"]["data"] == message.as_str());
        assert_eq!(logged, heard, "round {round} at {level}: {notes:?}");
    }
}

/// A level a session set through one replica while another was not listening to the bus
/// (the note is lost there) holds on that replica too once it listens again: its copy of
/// the session reads the level from Redis, rather than filtering that session's log
/// messages at the level it had. Another session keeps the servers at `debug`, so the
/// message reaches the replica and only the session's own level decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_level_set_while_a_replica_missed_the_bus_holds_there_once_it_listens_again() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let (a, chatty) = (gws[0].session().await, gws[0].session().await);
    for (s, level) in [(&chatty, "debug"), (&a, "info")] {
        let r = s.request(json!(1), "logging/setLevel", json!({"level": level})).await;
        assert_eq!(r["result"], json!({}), "{r}");
    }
    let b = via(&a, &gws[1]);
    let heard = |round: usize| {
        let b = &b;
        async move {
            let message = format!("round-{round}");
            let mut m = b
                .start(
                    json!(round),
                    "tools/call",
                    json!({"name": "calc__log", "arguments": {"message": message}}),
                )
                .await;
            let (notes, r) = m.response(T).await;
            assert_eq!(text(&r), "logged", "{r}");
            notes
                .iter()
                .any(|n| n["method"] == "notifications/message" && n["params"]["data"] == message.as_str())
        }
    };
    assert!(
        heard(0).await,
        "at info, the message is heard through the other replica"
    );
    let r = deaf_while(
        &gws[1],
        &redis,
        a.request(json!(2), "logging/setLevel", json!({"level": "error"})),
    )
    .await;
    assert_eq!(r["result"], json!({}), "{r}");
    for round in 1..200 {
        if !heard(round).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the replica that missed the note still sends the session messages below its level\n{}",
        gws[1].logs()
    );
}

/// `resources/subscribe` through one replica is answered once every replica's child
/// subscribed, and `resources/unsubscribe` once they left: a change right after either,
/// on any replica, is heard or not as the client was told (the calc child here notifies a
/// change only for a URI it was subscribed to, as a real server does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_through_one_replica_holds_on_every_replica_at_once() {
    let redis = Redis::start();
    let gws = replicas(3, &redis, &subscribable(), "");
    let first = gws[0].session().await;
    let all: Vec<Session> = gws.iter().map(|g| via(&first, g)).collect();
    for round in 0..6 {
        let (here, there) = (&all[round % 3], &all[(round + 1) % 3]);
        let (method, want) = if round % 2 == 0 {
            ("resources/subscribe", format!("updated {README}"))
        } else {
            ("resources/unsubscribe", format!("not subscribed to {README}"))
        };
        let r = here.request(json!(round), method, json!({"uri": README})).await;
        assert_eq!(r["result"], json!({}), "{r}");
        let r = there.call("calc__update_resource", json!({"uri": README})).await;
        assert_eq!(text(&r), want, "round {round}, {method}: {r}");
    }
}

/// A subscription made through one replica while another was not listening to the bus
/// (the note asking its server to subscribe is lost there) holds on that replica too once
/// it listens again: it subscribes its server to what Redis says sessions subscribed to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_made_while_a_replica_missed_the_bus_holds_there_once_it_listens_again() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &subscribable(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    let r = b.call("calc__update_resource", json!({"uri": README})).await;
    assert_eq!(text(&r), format!("not subscribed to {README}"), "{r}");
    let r = deaf_while(
        &gws[1],
        &redis,
        a.request(json!(1), "resources/subscribe", json!({"uri": README})),
    )
    .await;
    assert_eq!(r["result"], json!({}), "{r}");
    let mut last = serde_json::Value::Null;
    for _ in 0..200 {
        last = b.call("calc__update_resource", json!({"uri": README})).await;
        if text(&last) == format!("updated {README}") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the replica that missed the note never subscribed its server: {last}\n{}",
        gws[1].logs()
    );
}

#[tokio::test]
async fn a_session_outlives_the_replica_it_was_opened_on() {
    let redis = Redis::start();
    let mut gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    assert_eq!(
        text(&a.call("calc__add", serde_json::json!({"a": 1, "b": 1})).await),
        "2"
    );
    unsafe {
        libc::kill(gws[0].child.id() as i32, libc::SIGKILL);
    }
    let _ = gws[0].child.wait();
    let b = via(&a, &gws[1]);
    let started = std::time::Instant::now();
    let r = b.call("calc__add", serde_json::json!({"a": 2, "b": 2})).await;
    assert_eq!(text(&r), "4", "{r}");
    assert!(started.elapsed() < Duration::from_secs(1));
    drop(gws.remove(0));
}

#[tokio::test]
async fn a_session_is_its_owners_on_every_replica_and_a_forged_record_is_refused() {
    let redis = Redis::start();
    let clients =
        "[clients.alice]\ntoken = \"alice-token-0123456789\"\n[clients.bob]\ntoken = \"bob-token-0123456789ab\"\n";
    let gws = replicas(2, &redis, &format!("{}{clients}", two_way()), "");
    let open = |token: &'static str, url: String| async move {
        let http = reqwest::Client::builder()
            .default_headers(
                [(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {token}").parse().unwrap(),
                )]
                .into_iter()
                .collect(),
            )
            .build()
            .unwrap();
        let resp = initialize(&http, &url).await;
        let id = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        Session {
            http,
            url,
            id,
            init: resp.json().await.unwrap(),
        }
    };
    let alice = open("alice-token-0123456789", gws[0].url.clone()).await;
    let bob = open("bob-token-0123456789ab", gws[1].url.clone()).await;
    // Bob presents alice's session id on the other replica: not found, for him.
    let stolen = Session {
        id: alice.id.clone(),
        ..via(&bob, &gws[1])
    };
    let (status, _) = stolen
        .post_text(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .await;
    assert_eq!(status, 404);
    let (status, _) = via(&alice, &gws[1])
        .post_text(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .await;
    assert_eq!(status, 200, "alice's own session works on the other replica");
    // No token is stored in Redis.
    let dump = redis.cli(&["--no-raw", "KEYS", "*"]);
    for key in dump.lines() {
        let key = key.trim_matches('"');
        let v = redis.cli(&["GET", key]);
        assert!(!v.contains("alice-token") && !v.contains("bob-token"), "{key}: {v}");
    }
    // Someone who can write to Redis copies alice's record to a session id of their own,
    // or rewrites it for bob: neither verifies.
    let keys: Vec<String> = redis
        .cli(&["KEYS", "mcpgw:session:*"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for k in &keys {
        let v = redis.cli(&["GET", k]);
        let forged = v.trim().replace("\"alice\"", "\"bob\"");
        redis.cli(&["SET", k, &forged]);
    }
    let fresh = replicas(1, &redis, &format!("{}{clients}", two_way()), "replica_id = \"gw-new\"");
    let (status, _) = via(&alice, &fresh[0])
        .post_text(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#)
        .await;
    assert_eq!(status, 404, "alice's record was changed: refused");
    let (status, _) = Session {
        id: alice.id.clone(),
        ..via(&bob, &fresh[0])
    }
    .post_text(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#)
    .await;
    assert_eq!(status, 404, "nor does it become bob's");
    assert!(fresh[0].wait_log("does not verify", T).await);
}

/// A session whose `initialize` declared sampling, elicitation and roots.
async fn open_asking(gw: &Gateway) -> Session {
    Session::open_with(
        &gw.url,
        serde_json::json!({"sampling": {}, "elicitation": {}, "roots": {}}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_asked_during_a_call_on_one_replica_is_answered_through_another() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let a = open_asking(&gws[0]).await;
    // The session is known to the others before the question (as a client's earlier
    // requests would have made it).
    let b = via(&a, &gws[1]);
    assert!(!b.tool_names().await.is_empty());
    let mut call = a
        .start(
            json!(1),
            "tools/call",
            json!({"name": "calc__ask_elicit", "arguments": {"message": "name?"}}),
        )
        .await;
    let q = call.next(T).await.expect("the question");
    assert_eq!(q["method"], "elicitation/create", "{q}");
    let answer = json!({"jsonrpc": "2.0", "id": q["id"], "result": {"action": "accept", "content": {"name": "Ada"}}});
    let r = b.post().json(&answer).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let (_, resp) = call.response(T).await;
    let got: serde_json::Value = serde_json::from_str(&text(&resp)).unwrap();
    assert_eq!(got, json!({"action": "accept", "content": {"name": "Ada"}}), "{resp}");
    // And through a replica that never saw the session before.
    let mut call = a
        .start(
            json!(2),
            "tools/call",
            json!({"name": "calc__ask_roots", "arguments": {}}),
        )
        .await;
    let q = call.next(T).await.expect("the question");
    let roots = json!({"roots": [{"uri": "file:///p", "name": "p"}]});
    let answer = json!({"jsonrpc": "2.0", "id": q["id"], "result": roots});
    let r = via(&a, &gws[2]).post().json(&answer).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let (_, resp) = call.response(T).await;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&text(&resp)).unwrap(), roots);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_through_another_replica_cancels_the_call_where_it_runs() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    assert!(!b.tool_names().await.is_empty());
    let started = std::time::Instant::now();
    let mut call = a
        .start(
            json!("slow-1"),
            "tools/call",
            json!({"name": "calc__slow", "arguments": {"seconds": 60, "steps": 60}, "_meta": {"progressToken": "p1"}}),
        )
        .await;
    // Progress reaches the client on the call's own stream.
    let p = call.next(T).await.expect("progress");
    assert_eq!(p["method"], "notifications/progress", "{p}");
    b.notify(
        "notifications/cancelled",
        json!({"requestId": "slow-1", "reason": "enough"}),
    )
    .await;
    let _ = call.response(Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the call was cancelled: {}",
        gws[0].logs()
    );
    assert!(gws[0].wait_log("cancelled a request through another replica", T).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_on_any_replica_gets_its_sessions_notifications() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let (b, c) = (via(&a, &gws[1]), via(&a, &gws[2]));
    let mut stream = b.get_stream().await;
    let readme = "mock://calc/readme";
    let r = a
        .request(json!("sub"), "resources/subscribe", json!({"uri": readme}))
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    // Every replica's child follows the subscription.
    for gw in &gws {
        assert!(
            gw.wait_log(&format!("[mock] subscribe {readme}"), T).await,
            "{}",
            gw.logs()
        );
    }
    // The third replica's child sees the change: the stream on the second gets it.
    let r = c.call("calc__update_resource", json!({"uri": readme})).await;
    assert_eq!(text(&r), format!("updated {readme}"), "{r}");
    let m = stream.next(T).await.expect("resources/updated");
    assert_eq!(m["method"], "notifications/resources/updated", "{m}");
    assert_eq!(m["params"]["uri"], readme, "{m}");
    // A tool added through the first replica's child: list_changed on the stream.
    let r = a.call("calc__add_tool", json!({"name": "fresh"})).await;
    assert_eq!(text(&r), "added", "{r}");
    let m = stream.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
}

/// A 2026-07-28 request (envelope in `_meta`, the headers a client sends): the last message.
async fn stateless(gw: &Gateway, id: serde_json::Value, tool: &str, extra: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    let mut params = json!({"name": tool, "arguments": {"message": "name?"}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "cluster-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }});
    if let serde_json::Value::Object(e) = extra {
        for (k, v) in e {
            params[k] = v;
        }
    }
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    read_messages(r).await.into_iter().last().expect("a response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_required_retry_resumes_its_parked_call_on_any_replica_once() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let r = stateless(&gws[0], json!(1), "calc__ask_elicit", json!({})).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state = r["result"]["requestState"].as_str().unwrap().to_owned();
    let key = r["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    // A retry on the second replica without the answer: asked again (the call stays
    // parked on the first, as its next round).
    let r = stateless(
        &gws[1],
        json!(2),
        "calc__ask_elicit",
        json!({"requestState": state, "inputResponses": {}}),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state2 = r["result"]["requestState"].as_str().unwrap().to_owned();
    assert_ne!(state, state2);
    // The first state was used: refused on every replica.
    let again = stateless(
        &gws[2],
        json!(3),
        "calc__ask_elicit",
        json!({"requestState": state, "inputResponses": {}}),
    )
    .await;
    assert_eq!(again["error"]["data"]["reason"], "invalid_request_state", "{again}");
    // Tampered: refused.
    // Its last digit changed (to one it is not: a state ending in 0 stays valid as "…0").
    let mut tampered = state2.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    let bad = stateless(
        &gws[2],
        json!(4),
        "calc__ask_elicit",
        json!({"requestState": tampered, "inputResponses": {}}),
    )
    .await;
    assert_eq!(bad["error"]["data"]["reason"], "invalid_request_state", "{bad}");
    // Answered through the third replica: the call, still on the first, finishes.
    let answer = json!({key.clone(): {"action": "accept", "content": {"name": "Ada"}}});
    let r = stateless(
        &gws[2],
        json!(5),
        "calc__ask_elicit",
        json!({"requestState": state2, "inputResponses": answer}),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let got: serde_json::Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(got, json!({"action": "accept", "content": {"name": "Ada"}}), "{r}");
    // Used: refused, even on the replica that holds nothing any more.
    let r = stateless(
        &gws[0],
        json!(6),
        "calc__ask_elicit",
        json!({"requestState": state2, "inputResponses": answer}),
    )
    .await;
    assert_eq!(r["error"]["data"]["reason"], "invalid_request_state", "{r}");
}

#[test]
fn check_validates_the_cluster_table_and_with_connect_pings_redis() {
    let redis = Redis::start();
    let (run, _d) = check(&cluster_toml(&redis, ""), &["--connect"], &[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("cluster: Redis at redis+unix://"), "{}", run.stdout);
    // A password in the URL is never shown.
    let down = "[cluster]\nredis = \"redis://user:hunter2-secret@127.0.0.1:1/0\"\nkey = \"${K}\"\n";
    let (run, _d) = check(down, &["--connect"], &[("K", KEY)]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("cluster: DOWN"), "{}", run.stdout);
    assert!(
        !run.stdout.contains("hunter2") && !run.stderr.contains("hunter2"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    // Without --connect the table is validated: a short key, a wrong scheme, a bad word.
    let bad = "[cluster]\nredis = \"http://x\"\nkey = \"short\"\non_redis_down = \"panic\"\n";
    let (run, _d) = check(bad, &[], &[]);
    assert_eq!(run.code, Some(64), "an invalid config");
    for needle in ["redis:// or rediss://", "at least 32", "on_redis_down"] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
    let unset = "[cluster]\nredis = \"redis://127.0.0.1/0\"\nkey = \"${NOT_SET_ANYWHERE}\"\n";
    let (run, _d) = check(unset, &[], &[]);
    assert!(run.stderr.contains("NOT_SET_ANYWHERE"), "{}", run.stderr);
}

/// A per-session mock (`pid`, `counter`) as server `iso`.
fn per_session() -> String {
    server("iso", "iso", &["--per-process"], "isolation = \"session\"\n")
}

async fn counter(s: &Session) -> u64 {
    let r = s.call("iso__counter", serde_json::json!({})).await;
    text(&r).parse().unwrap_or_else(|_| panic!("{r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_process_keeps_its_state_whichever_replica_the_call_lands_on() {
    let redis = Redis::start();
    let mut gws = replicas(3, &redis, &per_session(), "");
    let a = gws[0].session().await;
    let (b, c) = (via(&a, &gws[1]), via(&a, &gws[2]));
    assert_eq!(
        counter(&b).await,
        1,
        "its process starts on the first replica it needs it"
    );
    assert_eq!(counter(&a).await, 2, "and every call reaches that one process");
    assert_eq!(counter(&c).await, 3);
    assert_eq!(counter(&b).await, 4);
    let pid = text(&c.call("iso__pid", serde_json::json!({})).await);
    assert_eq!(pid, text(&a.call("iso__pid", serde_json::json!({})).await));
    // Its replica dies, and the process with it: the next call gets a new one at once.
    unsafe {
        libc::kill(gws[1].child.id() as i32, libc::SIGKILL);
    }
    let _ = gws[1].child.wait();
    let started = std::time::Instant::now();
    assert_eq!(counter(&c).await, 1, "a new process, its state gone with the old one");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(counter(&a).await, 2);
    drop(gws.remove(1));
}

/// A 2026-07-28 request with the headers a client sends: the response, unread.
async fn stateless_post(
    gw: &Gateway,
    id: serde_json::Value,
    method: &str,
    mut params: serde_json::Value,
) -> reqwest::Response {
    params["_meta"] = stateless_meta("cluster-test");
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = params.get("name").and_then(serde_json::Value::as_str) {
        req = req.header("mcp-name", n);
    }
    req.json(&serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_on_one_replica_hears_changes_seen_by_another() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(3, &redis, &two_way(), "");
    let readme = "mock://calc/readme";
    let r = stateless_post(
        &gws[1],
        json!(42),
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true, "resourceSubscriptions": [readme]}}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut s = Messages::new(r);
    let ack = s.next(T).await.expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    for gw in &gws {
        assert!(
            gw.wait_log(&format!("[mock] subscribe {readme}"), T).await,
            "{}",
            gw.logs()
        );
    }
    let r = stateless_post(
        &gws[2],
        json!("c"),
        "tools/call",
        json!({"name": "calc__update_resource", "arguments": {"uri": readme}}),
    )
    .await;
    let r = read_messages(r).await.into_iter().last().unwrap();
    assert_eq!(text(&r), format!("updated {readme}"), "{r}");
    let m = s.next(T).await.expect("resources/updated");
    assert_eq!(m["method"], "notifications/resources/updated", "{m}");
    assert_eq!(m["params"]["uri"], readme, "{m}");
    assert_eq!(
        m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 42,
        "{m}"
    );
    let r = stateless_post(
        &gws[0],
        json!("d"),
        "tools/call",
        json!({"name": "calc__add_tool", "arguments": {"name": "fresh"}}),
    )
    .await;
    let _ = read_messages(r).await;
    let m = s.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
}

/// Polls `/status` until its cluster object says Redis is `state`.
async fn redis_state(gw: &Gateway, state: &str) {
    for _ in 0..200 {
        if gw.get_json("/status").await["cluster"]["redis"] == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Redis never showed as {state}: {}", gw.logs());
}

/// More sessions than one pipeline restores (256) all come back after Redis restarted
/// empty, and one that ended meanwhile among them does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_sessions_are_restored_in_batches_and_an_ended_one_stays_ended() {
    let mut redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let mut open = Vec::new();
    for _ in 0..300 {
        open.push(gws[0].session().await);
    }
    // The second replica holds a copy of the first session.
    let copy = via(&open[0], &gws[1]);
    assert!(!copy.tool_names().await.is_empty());
    redis.kill();
    for gw in &gws {
        redis_state(gw, "down").await;
    }
    assert_eq!(open[0].end().await, 200);
    redis.restart();
    let mut restored = 0;
    for _ in 0..200 {
        restored = redis.cli(&["KEYS", "mcpgw:session:*"]).lines().count();
        if restored == 299 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(restored, 299, "{}", gws[0].logs());
    assert!(copy.until_gone().await, "{}", gws[1].logs());
    let r = via(&open[299], &gws[1])
        .call("calc__add", serde_json::json!({"a": 1, "b": 1}))
        .await;
    assert_eq!(text(&r), "2", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_ride_out_redis_going_away_and_coming_back_empty() {
    use serde_json::json;
    let mut redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    assert_eq!(text(&b.call("calc__add", json!({"a": 1, "b": 2})).await), "3");
    redis.kill();
    for gw in &gws {
        redis_state(gw, "down").await;
    }
    // on_redis_down = "local": what each replica holds goes on.
    for s in [&a, &b, &a, &b] {
        assert_eq!(text(&s.call("calc__add", json!({"a": 2, "b": 2})).await), "4");
    }
    let during = gws[0].session().await;
    assert_eq!(text(&during.call("calc__add", json!({"a": 3, "b": 3})).await), "6");
    for gw in &gws {
        assert_eq!(
            gw.logs().matches("Redis is unreachable").count(),
            1,
            "warned once: {}",
            gw.logs()
        );
    }
    // Redis comes back empty: the replicas put their sessions back, so a replica that
    // never saw them serves them.
    redis.restart();
    for gw in &gws {
        redis_state(gw, "up").await;
    }
    let mut restored = false;
    for _ in 0..100 {
        if redis.cli(&["KEYS", "mcpgw:session:*"]).lines().count() == 2 {
            restored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(restored, "{}", redis.cli(&["KEYS", "*"]));
    let fresh = replicas(1, &redis, &two_way(), "replica_id = \"gw-new\"");
    for s in [&a, &during] {
        let r = via(s, &fresh[0]).call("calc__add", json!({"a": 5, "b": 5})).await;
        assert_eq!(text(&r), "10", "{r}");
    }
}

/// A session ended through one replica while Redis was down (the end could be neither
/// written nor told) ends on every replica once Redis is back, though it came back empty
/// and the other replica, still serving the session, puts its record back: the replica
/// that ended it writes the end first thing, and the other finds it at its next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_while_redis_was_down_ends_everywhere_once_it_is_back() {
    use serde_json::json;
    let mut redis = Redis::start();
    let servers = format!("[gateway]\nsession_idle = \"2s\"\n{}", two_way());
    let gws = replicas(2, &redis, &servers, "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    assert_eq!(text(&b.call("calc__add", json!({"a": 1, "b": 2})).await), "3");
    redis.kill();
    for gw in &gws {
        redis_state(gw, "down").await;
    }
    assert_eq!(a.end().await, 200);
    redis.restart();
    for gw in &gws {
        redis_state(gw, "up").await;
    }
    assert!(
        b.until_gone().await,
        "the session lives on on the other replica\n{}",
        gws[1].logs()
    );
    let mut clean = false;
    for _ in 0..100 {
        if redis.cli(&["KEYS", "*session:*"]).trim().is_empty() {
            clean = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(clean, "{}", redis.cli(&["KEYS", "*"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_refuse_a_session_needing_redis_gets_503_while_it_is_down() {
    let mut redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "on_redis_down = \"refuse\"");
    let a = gws[0].session().await;
    redis.kill();
    for gw in &gws {
        redis_state(gw, "down").await;
    }
    // The replica that holds the session serves it; the other cannot look it up.
    assert_eq!(
        text(&a.call("calc__add", serde_json::json!({"a": 1, "b": 1})).await),
        "2"
    );
    let (status, body) = via(&a, &gws[1])
        .post_text(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("on_redis_down"), "{body}");
    assert_eq!(try_open(&gws[0]).await.0, 503, "no new session without Redis");
}

/// POSTs an `initialize` to `url` with `http`.
async fn initialize(http: &reqwest::Client, url: &str) -> reqwest::Response {
    http.post(url)
        .header("accept", "application/json, text/event-stream")
        .json(
            &serde_json::json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
        )
        .send()
        .await
        .unwrap()
}

/// `initialize` on `gw`: its HTTP status, and the session id when it opened one.
async fn try_open(gw: &Gateway) -> (u16, Option<String>, String) {
    let resp = initialize(&reqwest::Client::new(), &gw.url).await;
    let status = resp.status().as_u16();
    let id = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, id, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_holds_over_all_replicas() {
    let redis = Redis::start();
    let gws = replicas(
        3,
        &redis,
        &format!(
            "[gateway]\nmax_sessions = 2\nmax_sessions_per_client = 2\n\n{}",
            two_way()
        ),
        "",
    );
    let (s0, first, _) = try_open(&gws[0]).await;
    let (s1, _, _) = try_open(&gws[1]).await;
    assert_eq!((s0, s1), (200, 200));
    let (s2, _, body) = try_open(&gws[2]).await;
    assert_eq!(s2, 503, "{body}");
    assert!(body.contains("gateway.max_sessions"), "{body}");
    // One ends (DELETE on another replica than its own): room for one more.
    let first = first.unwrap();
    let del = reqwest::Client::new()
        .delete(&gws[1].url)
        .header("mcp-session-id", &first)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    let mut opened = false;
    for _ in 0..100 {
        if try_open(&gws[2]).await.0 == 200 {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(opened);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_reached_from_every_replica_by_its_session_only() {
    use serde_json::json;
    let redis = Redis::start();
    let jobs = format!(
        "[servers.jobs]\ncommand = \"python3\"\nargs = [\"tests/fixtures/task_server.py\"]\ncwd = {:?}\n",
        repo().display().to_string()
    );
    let gws = replicas(2, &redis, &jobs, "");
    let a = gws[0].session().await;
    let created = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"seconds": 0.3, "text": "hi"}, "task": {"ttl": 60000}}),
        )
        .await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    let b = via(&a, &gws[1]);
    let got = b.request(json!(2), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["taskId"], id.as_str(), "{got}");
    let result = b.request(json!(3), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(text(&result), "hi", "{result}");
    let other = gws[1].session().await;
    let foreign = other.request(json!(4), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    // Whoever can write to Redis cannot hand the task to another session.
    let key = redis.cli(&["KEYS", "mcpgw:task:*"]).trim().to_owned();
    let route = redis.cli(&["GET", &key]);
    let (_, json) = route.trim().split_once('.').unwrap();
    let mut stored: serde_json::Value = serde_json::from_str(json).unwrap();
    stored["owner"] = json!(crate::common::sha256_hex(&other.id));
    redis.cli(&["SET", &key, &format!("{}.{stored}", route.split_once('.').unwrap().0)]);
    let stolen = other.request(json!(5), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(stolen["error"]["code"], -32602, "{stolen}");
    assert!(gws[1].wait_log("task route in Redis does not verify", T).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_list_changed_reaches_the_servers_a_sessions_calls_reached_on_any_replica() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    // Its calls reach the first replica's child only.
    assert_eq!(
        text(&a.call("calc__add", serde_json::json!({"a": 1, "b": 1})).await),
        "2"
    );
    assert!(!b.tool_names().await.is_empty());
    b.notify("notifications/roots/list_changed", serde_json::json!({}))
        .await;
    assert!(gws[0].wait_log("[mock] roots changed", T).await, "{}", gws[0].logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_an_id_are_told_so() {
    let redis = Redis::start();
    let gws = replicas(
        2,
        &redis,
        "",
        "replica_id = \"same\"\nadvertise = \"http://10.0.0.5:8080\"",
    );
    assert!(
        gws[0].wait_log("another running replica has this replica id", T).await
            || gws[1].wait_log("another running replica has this replica id", T).await
    );
    assert!(gws[0].wait_log("cluster.advertise is not used", T).await);
}

/// GET with `Last-Event-ID` and the session's headers.
async fn resume(s: &Session, last: &str) -> reqwest::Response {
    s.http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", last)
        .send()
        .await
        .unwrap()
}

/// Event ids name the replica that keeps their events, and their stream's kind: a GET
/// stream one replica held, resumed on another (its replica gone, as an SDK client
/// reconnects), is opened anew there, live; a call's stream another replica sent is
/// refused, never confused with a stream of the same number here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_resumed_on_another_replica_is_opened_anew_there() {
    use serde_json::json;
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    // On the second replica: a call's stream, numbered as the first replica numbers its
    // GET stream (both are the session's first stream there).
    let slow =
        json!({"name": "calc__slow", "arguments": {"seconds": 0.2, "steps": 2}, "_meta": {"progressToken": "p"}});
    let mut call = b.start(json!(1), "tools/call", slow.clone()).await;
    call.response(T).await;
    let mut stream = a.get_stream().await;
    assert_eq!(text(&a.call("calc__add_tool", json!({"name": "one"})).await), "added");
    let m = stream.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
    let get_id = stream.last_id.clone().unwrap();
    let mut call = a.start(json!(2), "tools/call", slow).await;
    call.response(T).await;
    let post_id = call.last_id.clone().unwrap();
    assert_ne!(get_id.split_once('.'), None, "{get_id}: ids carry their origin");
    drop(stream);
    // The first replica's call stream: its events are there, not here.
    let r = resume(&b, &post_id).await;
    assert_eq!(r.status(), 410);
    let body = r.text().await.unwrap();
    assert!(body.contains("another replica"), "{body}");
    // Its GET stream: a new one here, which the session's notifications reach.
    let r = resume(&b, &get_id).await;
    assert_eq!(r.status(), 200);
    let mut again = Messages::new(r);
    assert_eq!(text(&a.call("calc__add_tool", json!({"name": "two"})).await), "added");
    let m = again.next(T).await.expect("list_changed on the reopened stream");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
    let new_id = again.last_id.clone().unwrap();
    assert_ne!(new_id.split_once('.').map(|p| p.0), get_id.split_once('.').map(|p| p.0));
}

/// A reload narrows a client's allowlist on every replica. An update that a replica
/// holding no copy of the session hears goes to the replica that streams to it over the
/// bus: that one checks the allowlist as it is now, so the hidden URI's update never
/// arrives (the next thing on the stream is a change the client may hear).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_heard_by_another_replica_follows_the_narrowed_allowlist_where_it_streams() {
    let redis = Redis::start();
    let clients =
        "[clients.alice]\ntoken = \"alice-cluster-token-01\"\n\n[clients.bob]\ntoken = \"bob-cluster-token-0123\"\n";
    let gws = replicas(3, &redis, &format!("{}{clients}", two_way()), "");
    let a = Session::open_as(&gws[0].url, "alice-cluster-token-01").await;
    let mut stream = via(&a, &gws[1]).get_stream().await;
    let r = a
        .request(json!("sub"), "resources/subscribe", json!({"uri": README}))
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    for gw in &gws {
        assert!(
            gw.wait_log(&format!("[mock] subscribe {README}"), T).await,
            "{}",
            gw.logs()
        );
    }
    for gw in &gws {
        let before = gw.logs().matches("reload done").count();
        let config = std::fs::read_to_string(gw.config_path()).unwrap();
        let narrowed = config.replace(
            "token = \"alice-cluster-token-01\"\n",
            "token = \"alice-cluster-token-01\"\ndeny = [\"mock://*\"]\n",
        );
        assert_ne!(narrowed, config);
        std::fs::write(gw.config_path(), narrowed).unwrap();
        let log = gw.stderr.clone();
        let done = until(T, || log.lock().unwrap().matches("reload done").count() > before).await;
        assert!(done, "no reload:\n{}", gw.logs());
    }
    let bob = Session::open_as(&gws[2].url, "bob-cluster-token-0123").await;
    let r = bob.call("calc__update_resource", json!({"uri": README})).await;
    assert_eq!(text(&r), format!("updated {README}"), "{r}");
    let r = bob.call("calc__add_tool", json!({"name": "after"})).await;
    assert_eq!(text(&r), "added", "{r}");
    let m = stream.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "alice heard {m}");
}

/// `[gateway] session_idle`, before the servers of [`replicas`].
fn idle(servers: &str, idle: &str) -> String {
    format!("[gateway]\nsession_idle = \"{idle}\"\n\n{servers}")
}

/// What a session wrote to Redis (its subscriptions, its log level) goes once its record
/// expires, though no replica ends it: the only one that served it died. A session in use
/// beside it keeps its own, and the downstreams' shared level falls back to the one it
/// chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_session_wrote_to_redis_goes_with_its_record_when_no_replica_ends_it() {
    let redis = Redis::start();
    let mut gws = replicas(2, &redis, &idle(&subscribable(), "2s"), "");
    let gone = gws[0].session().await;
    let kept = gws[1].session().await;
    let item = "mock://calc/items/only-the-idle-one";
    for (s, uri) in [(&gone, README), (&gone, item), (&kept, README)] {
        let r = s.request(json!(1), "resources/subscribe", json!({"uri": uri})).await;
        assert_eq!(r["result"], json!({}), "{r}");
    }
    for (s, level) in [(&gone, "debug"), (&kept, "warning")] {
        let r = s.request(json!(2), "logging/setLevel", json!({"level": level})).await;
        assert_eq!(r["result"], json!({}), "{r}");
    }
    let (dg, dk) = (sha256_hex(&gone.id), sha256_hex(&kept.id));
    assert_eq!(redis.cli(&["SCARD", &format!("mcpgw:subs-of:{dg}")]).trim(), "2");
    assert_eq!(redis.cli(&["GET", "mcpgw:downstream-level"]).trim(), "0");
    // The only replica that served it dies.
    unsafe { libc::kill(gws[0].child.id() as i32, libc::SIGKILL) };
    let _ = gws[0].child.wait();
    let state = |r: &Redis| {
        (
            r.cli(&["SCARD", &format!("mcpgw:subs-of:{dg}")]).trim().to_owned(),
            r.cli(&["HKEYS", "mcpgw:levels"]).trim().to_owned(),
            r.cli(&["HKEYS", "mcpgw:uris:calc"]).trim().to_owned(),
            r.cli(&["GET", "mcpgw:downstream-level"]).trim().to_owned(),
            r.cli(&["SMEMBERS", "mcpgw:with-state"]).trim().to_owned(),
        )
    };
    let want = (
        "0".to_owned(),
        dk.clone(),
        README.to_owned(),
        "3".to_owned(),
        dk.clone(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state(&redis) != want {
        assert!(
            std::time::Instant::now() < deadline,
            "left in Redis: {:?}\n{}",
            state(&redis),
            gws[1].logs()
        );
        // The other session goes on being used.
        let r = kept.call("calc__add", json!({"a": 1, "b": 1})).await;
        assert_eq!(text(&r), "2", "{r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let subscribers = redis.cli(&["KEYS", "mcpgw:sub:*"]);
    assert_eq!(subscribers.lines().count(), 1, "{subscribers}");
    assert_eq!(redis.cli(&["SMEMBERS", subscribers.trim()]).trim(), dk);
    assert!(via(&gone, &gws[1]).until_gone().await);
    // The session in use is still subscribed.
    let r = kept.call("calc__update_resource", json!({"uri": README})).await;
    assert_eq!(text(&r), format!("updated {README}"), "{r}");
}

/// Sessions left with state in Redis are swept a page at a time (SSCAN, HSCAN): every
/// page, not only the first, and a session in use keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_goes_through_every_page_of_sessions_left_with_state() {
    let redis = Redis::start();
    let gws = replicas(1, &redis, &idle(&subscribable(), "2s"), "");
    let kept = gws[0].session().await;
    let r = kept
        .request(json!(1), "logging/setLevel", json!({"level": "info"}))
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
    let dk = sha256_hex(&kept.id);
    // Left by sessions whose records are gone: 700 with state, 600 more with a level only.
    let mut sadd = vec!["SADD".to_owned(), "mcpgw:with-state".to_owned()];
    sadd.extend((0..700).map(|i| format!("{:064x}", i + 1)));
    let mut hset = vec!["HSET".to_owned(), "mcpgw:levels".to_owned()];
    for i in 0..600 {
        hset.extend([format!("{:064x}", 10_000 + i), "1".to_owned()]);
    }
    for args in [&sadd, &hset] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        redis.cli(&args);
    }
    assert_eq!(redis.cli(&["SCARD", "mcpgw:with-state"]).trim(), "701");
    let left = |r: &Redis| {
        (
            r.cli(&["SMEMBERS", "mcpgw:with-state"]).trim().to_owned(),
            r.cli(&["HKEYS", "mcpgw:levels"]).trim().to_owned(),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while left(&redis) != (dk.clone(), dk.clone()) {
        assert!(
            std::time::Instant::now() < deadline,
            "left in Redis: {} with state, {} levels\n{}",
            redis.cli(&["SCARD", "mcpgw:with-state"]).trim(),
            redis.cli(&["HLEN", "mcpgw:levels"]).trim(),
            gws[0].logs()
        );
        let r = kept.call("calc__add", json!({"a": 1, "b": 1})).await;
        assert_eq!(text(&r), "2", "{r}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each session counted once, in one sweep (two if one came between the SADD and the
    // HSET): every page of it, not one page a sweep.
    let logs = gws[0].logs();
    let sweeps: Vec<u64> = logs
        .lines()
        .filter(|l| l.contains("removed the subscriptions and levels of expired sessions"))
        .filter_map(|l| l.split("sessions=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(sweeps.iter().sum::<u64>(), 1300, "{sweeps:?}\n{logs}");
    assert!(sweeps.len() <= 2, "{sweeps:?}");
}

/// A URI longer than 8 KiB, or a subscription past a session's 1,024th, is refused with
/// -32602 and kept nowhere, by a single gateway and by a replica alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_bounded_in_uri_length_and_number_per_session() {
    let redis = Redis::start();
    let single = Gateway::start(&subscribable());
    let replica = replicas(1, &redis, &subscribable(), "").remove(0);
    for gw in [&single, &replica] {
        let s = gw.session().await;
        let long = format!("mock://calc/items/{}", "x".repeat(8 * 1024));
        let r = s.request(json!(1), "resources/subscribe", json!({"uri": long})).await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("over the limit of 8192"),
            "{r}"
        );
        for i in 0..1024 {
            let uri = format!("mock://calc/items/{i}");
            let r = s.request(json!(i), "resources/subscribe", json!({"uri": uri})).await;
            assert_eq!(r["result"], json!({}), "{r}");
        }
        let r = s
            .request(
                json!("over"),
                "resources/subscribe",
                json!({"uri": "mock://calc/items/over"}),
            )
            .await;
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("1024 subscriptions"),
            "{r}"
        );
        // One it holds is no new one; after an unsubscribe there is room again.
        let r = s
            .request(json!(3), "resources/subscribe", json!({"uri": "mock://calc/items/0"}))
            .await;
        assert_eq!(r["result"], json!({}), "{r}");
        let r = s
            .request(json!(4), "resources/unsubscribe", json!({"uri": "mock://calc/items/0"}))
            .await;
        assert_eq!(r["result"], json!({}), "{r}");
        let r = s
            .request(
                json!(5),
                "resources/subscribe",
                json!({"uri": "mock://calc/items/over"}),
            )
            .await;
        assert_eq!(r["result"], json!({}), "{r}");
    }
    let kept = redis.cli(&["HLEN", "mcpgw:uris:calc"]);
    assert_eq!(kept.trim(), "1024", "{kept}");
    let memory = redis.cli(&["MEMORY", "USAGE", "mcpgw:uris:calc"]);
    assert!(
        memory.trim().parse::<u64>().unwrap_or(u64::MAX) < 256 * 1024,
        "{memory}"
    );
}

/// The OOM rejections Redis counted (`INFO errorstats`).
fn oom_rejections(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "errorstats"])
        .lines()
        .find(|l| l.starts_with("errorstat_OOM:"))
        .and_then(|l| l.split("count=").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A Redis out of memory (`maxmemory` with `noeviction`) answers reads and refuses
/// writes: each replica counts it as one outage (one warning), rather than taking every
/// read that succeeds for Redis back, reconciling, failing, and so on; and finds Redis
/// back once it takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_out_of_memory_is_one_outage_not_a_flapping_one() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &idle(&two_way(), "4s"), "");
    for _ in 0..20 {
        let s = gws[0].session().await;
        let r = via(&s, &gws[1]).call("calc__add", json!({"a": 1, "b": 1})).await;
        assert_eq!(text(&r), "2", "{r}");
    }
    let before = oom_rejections(&redis);
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    for gw in &gws {
        assert!(gw.wait_log("Redis is unreachable", T).await, "{}", gw.logs());
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let rejected = oom_rejections(&redis) - before;
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    for gw in &gws {
        let warnings = gw.logs().matches("Redis is unreachable").count();
        assert_eq!(warnings, 1, "{}", gw.logs());
    }
    assert!(rejected < 60, "{rejected} writes refused in 4 s");
    for gw in &gws {
        assert!(gw.wait_log("Redis is reachable again", T).await, "{}", gw.logs());
        redis_state(gw, "up").await;
    }
}

/// Narrows `[clients.alice]` on replica `gw` only (a reload applied there first) with
/// `deny`, and waits for the reload.
async fn narrow_alice(gw: &Gateway, deny: &str) {
    let before = gw.logs().matches("reload done").count();
    let config = std::fs::read_to_string(gw.config_path()).unwrap();
    let narrowed = config.replace(
        "token = \"alice-cluster-token-01\"\n",
        &format!("token = \"alice-cluster-token-01\"\ndeny = {deny}\n"),
    );
    assert_ne!(narrowed, config);
    std::fs::write(gw.config_path(), narrowed).unwrap();
    let log = gw.stderr.clone();
    let done = until(T, || log.lock().unwrap().matches("reload done").count() > before).await;
    assert!(done, "no reload:\n{}", gw.logs());
}

/// During a reload applied to one replica only, a call another replica forwards to the
/// session's process there follows the allowlist that replica's config now says: a tool
/// it denies the caller is refused as unknown, wherever the call landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_call_follows_the_allowlist_of_the_replica_that_runs_it() {
    let redis = Redis::start();
    let alice = "[clients.alice]\ntoken = \"alice-cluster-token-01\"\n";
    let gws = replicas(2, &redis, &format!("{}{alice}", per_session()), "");
    let a = Session::open_as(&gws[0].url, "alice-cluster-token-01").await;
    let b = via(&a, &gws[1]);
    assert_eq!(counter(&a).await, 1, "its process runs on the first replica");
    assert_eq!(counter(&b).await, 2, "a call through the other is forwarded there");
    narrow_alice(&gws[0], "[\"iso__counter\"]").await;
    let r = a.call("iso__counter", json!({})).await;
    assert_eq!(error_of(&r)["code"], -32602, "{r}");
    let r = b.call("iso__counter", json!({})).await;
    assert_eq!(error_of(&r)["code"], -32602, "forwarded, and run anyway: {r}");
    assert_eq!(error_of(&r)["message"], "unknown tool: iso__counter", "{r}");
    // What it still allows goes on, on the same process.
    let pid = text(&a.call("iso__pid", json!({})).await);
    assert_eq!(text(&b.call("iso__pid", json!({})).await), pid);
}

/// A session holds one GET stream over all replicas, as in one process: a GET stream
/// opened on another replica ends the one before (the newest wins: it may be the client
/// reconnecting through another replica before the first saw its connection die), so
/// nothing is heard twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_holds_one_get_stream_over_all_replicas_the_newest() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &two_way(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    let mut first = a.get_stream().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut second = b.get_stream().await;
    let started = std::time::Instant::now();
    assert!(first.next(T).await.is_none(), "the first stream got {:?}", first.seen);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let r = a.call("calc__add_tool", json!({"name": "once"})).await;
    assert_eq!(text(&r), "added", "{r}");
    let m = second.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
    assert!(
        second.next(Duration::from_millis(500)).await.is_none(),
        "{:?}",
        second.seen
    );
}

/// The same when the replica holding the first stream missed the note of the second
/// (frozen, its bus connection cut): it finds the newer stream in Redis at its janitor's
/// next round and ends its own, so nothing is heard twice for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_stream_whose_successors_note_was_missed_ends_all_the_same() {
    let redis = Redis::start();
    let gws = replicas(2, &redis, &idle(&two_way(), "2s"), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    let mut first = a.get_stream().await;
    let mut second = deaf_while(&gws[0], &redis, b.get_stream()).await;
    // Ended within a janitor's round or two (every session_idle / 2), not by the note.
    assert!(first.next(T).await.is_none(), "the first stream got {:?}", first.seen);
    assert!(first.ended(), "the first stream is still open\n{}", gws[0].logs());
    let r = b.call("calc__add_tool", json!({"name": "once"})).await;
    assert_eq!(text(&r), "added", "{r}");
    let m = second.next(T).await.expect("list_changed");
    assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
}

/// After Redis restarted empty, what sessions did through each replica is put back: a
/// subscription made before goes on delivering updates, a session's level holds, and a
/// subscription made while Redis was down reaches it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_and_levels_come_back_after_redis_restarts_empty() {
    let mut redis = Redis::start();
    let gws = replicas(2, &redis, &subscribable(), "");
    let a = gws[0].session().await;
    let b = via(&a, &gws[1]);
    let r = b.request(json!(1), "resources/subscribe", json!({"uri": README})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    let r = a.request(json!(2), "logging/setLevel", json!({"level": "error"})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    redis.kill();
    for gw in &gws {
        redis_state(gw, "down").await;
    }
    let during = "mock://calc/items/during-the-outage";
    let r = a.request(json!(3), "resources/subscribe", json!({"uri": during})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    redis.restart();
    for gw in &gws {
        redis_state(gw, "up").await;
    }
    let d = sha256_hex(&a.id);
    let back = until(T, || {
        redis.cli(&["SCARD", &format!("mcpgw:subs-of:{d}")]).trim() == "2"
            && redis.cli(&["HGET", "mcpgw:levels", &d]).trim() == "4"
            && redis.cli(&["HLEN", "mcpgw:uris:calc"]).trim() == "2"
    })
    .await;
    assert!(
        back,
        "{}\n{}\n{}",
        redis.cli(&["KEYS", "*"]),
        gws[0].logs(),
        gws[1].logs()
    );
    // An update heard by either replica's child reaches the session's stream.
    let mut stream = a.get_stream().await;
    for (s, uri) in [(&b, README), (&a, during)] {
        let r = s.call("calc__update_resource", json!({"uri": uri})).await;
        assert_eq!(text(&r), format!("updated {uri}"), "{r}");
        let m = stream.next(T).await.expect("resources/updated");
        assert_eq!(m["method"], "notifications/resources/updated", "{m}");
        assert_eq!(m["params"]["uri"], uri, "{m}");
    }
}

/// A task's route comes back after Redis restarted empty: the replica whose downstream
/// holds the task writes it again, and another replica reaches the task as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_route_comes_back_after_redis_restarts_empty() {
    let mut redis = Redis::start();
    let jobs = format!(
        "[servers.jobs]\ncommand = \"python3\"\nargs = [\"tests/fixtures/task_server.py\"]\ncwd = {:?}\n",
        repo().display().to_string()
    );
    let gws = replicas(2, &redis, &jobs, "");
    let a = gws[0].session().await;
    let created = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"seconds": 0.1, "text": "hi"}, "task": {"ttl": 60000}}),
        )
        .await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    redis.restart();
    for gw in &gws {
        redis_state(gw, "up").await;
    }
    let back = until(T, || !redis.cli(&["KEYS", "mcpgw:task:*"]).trim().is_empty()).await;
    assert!(back, "{}\n{}", redis.cli(&["KEYS", "*"]), gws[0].logs());
    let b = via(&a, &gws[1]);
    let got = b.request(json!(2), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["taskId"], id.as_str(), "{got}");
}
