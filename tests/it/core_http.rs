//! The HTTP front end with real children: concurrency and id mapping, progress and
//! cancellation, timeouts, dying children, and list_changed on the GET stream.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn three(names: &[String; 3]) -> String {
    [
        server("s0", &names[0], &[], ""),
        server("s1", &names[1], &[], ""),
        server("s2", &names[2], &[], ""),
    ]
    .concat()
}

/// 200 calls in flight at once over 3 servers: session A uses integer ids 0..100,
/// session B string ids "0".."99" (so 17 and "17" are in flight together). Odd calls
/// are `slow` with a per-call progress token (keeping ~100 calls pending downstream at
/// once), even ones `echo` a per-call text. Every answer must carry the caller's id with
/// its JSON type, and the caller's own payload or progress token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_calls_keep_their_ids_and_payloads() {
    let names = [unique("c0"), unique("c1"), unique("c2")];
    let gw = Gateway::start(&three(&names));
    let a = gw.session().await;
    let b = gw.session().await;
    let mut calls = Vec::new();
    for (sess, label) in [(&a, "A"), (&b, "B")] {
        for i in 0..100u32 {
            let id = if label == "A" { json!(i) } else { json!(i.to_string()) };
            let tool = format!("s{}__{}", i % 3, if i % 2 == 0 { "echo" } else { "slow" });
            let token = format!("tok-{label}-{i}");
            let params = if i % 2 == 0 {
                json!({"name": tool, "arguments": {"text": format!("{label}:{i}")}})
            } else {
                json!({"name": tool, "arguments": {"seconds": 0.4, "steps": 1}, "_meta": {"progressToken": token}})
            };
            calls.push(async move {
                let all = sess.request_all(id.clone(), "tools/call", params).await;
                (label, i, id, all)
            });
        }
    }
    let started = Instant::now();
    let results = futures::future::join_all(calls).await;
    // 100 slow calls of 0.4 s each finished in far less than 100 × 0.4 s: they overlapped.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "calls did not run concurrently: {:?}",
        started.elapsed()
    );
    assert_eq!(results.len(), 200);
    for (label, i, id, all) in results {
        let resp = all.last().unwrap();
        assert_eq!(resp["id"], id, "{label}{i}: {resp}");
        assert_eq!(resp["id"].is_string(), label == "B");
        if i % 2 == 0 {
            assert_eq!(text(resp), format!("{label}:{i}"));
            assert_eq!(all.len(), 1, "echo has no related messages: {all:?}");
        } else {
            assert_eq!(text(resp), "done", "{resp}");
            let progress: Vec<&Value> = all.iter().filter(|m| m["method"] == "notifications/progress").collect();
            assert_eq!(progress.len(), 1, "{label}{i}: {all:?}");
            assert_eq!(progress[0]["params"]["progressToken"], format!("tok-{label}-{i}"));
        }
    }
    assert!(gw.get_json("/status").await["servers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["state"] == "ready"));
}

#[tokio::test]
async fn duplicate_id_in_one_session_is_rejected_but_other_sessions_may_reuse_it() {
    let name = unique("dup");
    let gw = Gateway::start(&server("d", &name, &[], ""));
    let a = gw.session().await;
    let b = gw.session().await;
    let mut first = a
        .start(
            json!(5),
            "tools/call",
            json!({"name": "d__slow", "arguments": {"seconds": 2, "steps": 20}, "_meta": {"progressToken": 1}}),
        )
        .await;
    // Wait until the first call is certainly in flight.
    let m = first.next(T).await.unwrap();
    assert_eq!(m["method"], "notifications/progress");
    let dup = a.call_id(json!(5), "d__echo", json!({"text": "x"})).await;
    assert_eq!(error_of(&dup)["code"], -32600, "{dup}");
    // Same digits as a string in the same session, and the same integer in another session, are fine.
    assert_eq!(text(&a.call_id(json!("5"), "d__echo", json!({"text": "s"})).await), "s");
    assert_eq!(text(&b.call_id(json!(5), "d__echo", json!({"text": "b"})).await), "b");
    a.notify("notifications/cancelled", json!({"requestId": 5})).await;
    let (_, r) = first.response(T).await;
    assert_eq!(r["id"], 5);
}

/// Progress carries the client's own token (string or integer) and reaches only the
/// stream of the call it belongs to: not the other session's call, not its GET stream.
#[tokio::test]
async fn progress_goes_to_its_own_call_only() {
    let name = unique("prog");
    let gw = Gateway::start(&server("p", &name, &[], ""));
    let a = gw.session().await;
    let b = gw.session().await;
    let mut b_get = b.get_stream().await;
    let call_a = a.request_all(
        json!(1),
        "tools/call",
        json!({"name": "p__slow", "arguments": {"seconds": 0.6, "steps": 3}, "_meta": {"progressToken": "progress-test-1"}}),
    );
    let call_b = b.request_all(
        json!(1),
        "tools/call",
        json!({"name": "p__slow", "arguments": {"seconds": 0.6, "steps": 3}, "_meta": {"progressToken": 42}}),
    );
    let (all_a, all_b) = tokio::join!(call_a, call_b);
    for (all, token) in [(&all_a, json!("progress-test-1")), (&all_b, json!(42))] {
        let (resp, notes) = all.split_last().unwrap();
        assert_eq!(text(resp), "done");
        assert_eq!(notes.len(), 3, "{all:?}");
        for (k, n) in notes.iter().enumerate() {
            assert_eq!(n["method"], "notifications/progress");
            // Same JSON type as the client sent: "progress-test-1" stays a string, 42 a number.
            assert_eq!(n["params"]["progressToken"], token, "{n}");
            assert_eq!(n["params"]["progress"], k + 1);
            assert_eq!(n["params"]["total"], 3);
        }
    }
    // B's GET stream saw no progress: the first thing on it is the list_changed we cause now.
    assert_eq!(text(&a.call("p__add_tool", json!({"name": "later"})).await), "added");
    let first = b_get.next(T).await.expect("list_changed on GET");
    assert_eq!(first["method"], "notifications/tools/list_changed", "{first}");
}

/// A server's answer with raw CRs as whitespace, sent as an SSE event: SSE ends a line at
/// a lone CR (two end the event), so none may reach the stream as a byte: the client reads
/// the whole answer.
#[tokio::test]
async fn a_raw_cr_in_a_servers_answer_does_not_cut_its_sse_event() {
    let gw = Gateway::start(&server("p", &unique("cr"), &[], ""));
    let s = gw.session().await;
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "p__big", "arguments": {"bytes": 3, "cr": true}, "_meta": {"progressToken": 1}}});
    let r = s.post().json(&body).send().await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let raw = r.bytes().await.unwrap();
    assert!(!raw.contains(&b'\r'), "{}", String::from_utf8_lossy(&raw));
    let all = parse_sse(&String::from_utf8_lossy(&raw));
    let last = all.last().expect("the answer");
    assert_eq!(last["id"], 5, "{all:?}");
    assert_eq!(text(last), "xxx");
}

/// notifications/cancelled from the client: the POST is answered with -32800 at once,
/// the server is told (the mock logs "cancelled <id>"), and the gateway stays healthy.
#[tokio::test]
async fn client_cancellation_reaches_the_server_and_answers_the_post() {
    let name = unique("cancel");
    let gw = Gateway::start(&server("c", &name, &[], ""));
    let s = gw.session().await;
    let mut call = s
        .start(
            json!("job-1"),
            "tools/call",
            json!({"name": "c__slow", "arguments": {"seconds": 30, "steps": 300}, "_meta": {"progressToken": "t"}}),
        )
        .await;
    assert_eq!(call.next(T).await.unwrap()["method"], "notifications/progress");
    let t0 = Instant::now();
    s.notify(
        "notifications/cancelled",
        json!({"requestId": "job-1", "reason": "user"}),
    )
    .await;
    let (_, r) = call.response(Duration::from_secs(5)).await;
    assert_eq!(r["id"], "job-1");
    assert_eq!(error_of(&r)["code"], -32800, "{r}");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "cancel answered after {:?}",
        t0.elapsed()
    );
    assert!(
        call.next(Duration::from_secs(5)).await.is_none(),
        "stream must end after the answer"
    );
    assert!(
        gw.wait_log("[mock] cancelled ", Duration::from_secs(5)).await,
        "server not told:\n{}",
        gw.logs()
    );
    // Healthy: same session and server still answer, and the id can be reused.
    assert_eq!(
        text(
            &s.call_id(json!("job-1"), "c__echo", json!({"text": "still here"}))
                .await
        ),
        "still here"
    );
    assert_eq!(
        reqwest::get(format!("{}/healthz", gw.base)).await.unwrap().status(),
        200
    );
    assert_eq!(gw.server_status("c").await["state"], "ready");
}

#[tokio::test]
async fn timeout_names_server_and_cancels_downstream() {
    let name = unique("tmo");
    let gw = Gateway::start(&server("sleepy", &name, &[], "timeout = \"500ms\""));
    let s = gw.session().await;
    let t0 = Instant::now();
    let r = s.call("sleepy__slow", json!({"seconds": 5})).await;
    let took = t0.elapsed();
    let e = error_of(&r);
    assert_eq!(e["code"], -32001, "{r}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("sleepy") && msg.contains("500ms"), "{msg}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        gw.wait_log("[mock] cancelled ", Duration::from_secs(5)).await,
        "no cancel downstream:\n{}",
        gw.logs()
    );
    assert_eq!(text(&s.call("sleepy__echo", json!({"text": "ok"})).await), "ok");
}

async fn assert_dead_server_reported(gw: &Gateway, s: &Session, server: &str) {
    // Later calls get a clear error naming the server, at once.
    let t0 = Instant::now();
    let r = s.call(&format!("{server}__echo"), json!({"text": "x"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_string();
    assert!(msg.contains(&format!("'{server}'")), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(gw.server_status(server).await["state"], "down");
    // The others keep working.
    assert_eq!(text(&s.call("ok__echo", json!({"text": "alive"})).await), "alive");
    assert_eq!(text(&s.call("ok__add", json!({"a": 1, "b": 1})).await), "2");
}

#[tokio::test]
async fn crashing_child_fails_its_call_fast_and_others_keep_working() {
    let (victim, ok) = (unique("crashy"), unique("ok"));
    let gw = Gateway::start(&[server("crashy", &victim, &[], ""), server("ok", &ok, &[], "")].concat());
    let s = gw.session().await;
    // Another call in flight on the same server fails too.
    let mut pending = s
        .start(
            json!(2),
            "tools/call",
            json!({"name": "crashy__slow", "arguments": {"seconds": 30, "steps": 300}, "_meta": {"progressToken": 2}}),
        )
        .await;
    assert_eq!(pending.next(T).await.unwrap()["method"], "notifications/progress");
    let t0 = Instant::now();
    let r = s.call_id(json!(1), "crashy__crash", json!({})).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let msg = error_of(&r)["message"].as_str().unwrap();
    assert!(msg.contains("'crashy'") && msg.contains("exit"), "{msg}");
    let (_, r2) = pending.response(Duration::from_secs(1)).await;
    assert!(error_of(&r2)["message"].as_str().unwrap().contains("'crashy'"), "{r2}");
    assert_dead_server_reported(&gw, &s, "crashy").await;
    assert!(mock_pids(&victim).is_empty());
}

#[tokio::test]
async fn killed_child_fails_its_call_fast_and_others_keep_working() {
    let (victim, ok) = (unique("victim"), unique("ok"));
    let gw = Gateway::start(&[server("victim", &victim, &[], ""), server("ok", &ok, &[], "")].concat());
    let s = gw.session().await;
    let pids = mock_pids(&victim);
    assert_eq!(pids.len(), 1, "{pids:?}");
    let mut call = s
        .start(
            json!(1),
            "tools/call",
            json!({"name": "victim__slow", "arguments": {"seconds": 30, "steps": 300}, "_meta": {"progressToken": 1}}),
        )
        .await;
    assert_eq!(call.next(T).await.unwrap()["method"], "notifications/progress");
    let t0 = Instant::now();
    unsafe {
        libc::kill(pids[0], libc::SIGKILL);
    }
    let (_, r) = call.response(Duration::from_secs(1)).await;
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let msg = error_of(&r)["message"].as_str().unwrap();
    assert!(msg.contains("'victim'") && msg.contains("signal 9"), "{msg}");
    assert_dead_server_reported(&gw, &s, "victim").await;
}

/// The GET stream gets list_changed when a server adds a tool, and the next tools/list
/// has the new tool under its prefixed name.
#[tokio::test]
async fn get_stream_receives_list_changed() {
    let (n1, n2) = (unique("dyn"), unique("other"));
    let gw = Gateway::start(&[server("dyn", &n1, &[], ""), server("other", &n2, &[], "")].concat());
    let s = gw.session().await;
    let mut get = s.get_stream().await;
    assert!(get.content_type.starts_with("text/event-stream"));
    assert!(!s.tool_names().await.contains(&"dyn__fresh".to_string()));
    // A second GET on the same session is refused while the first is open.
    let second = s
        .http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 409);
    assert_eq!(text(&s.call("dyn__add_tool", json!({"name": "fresh"})).await), "added");
    let m = get.next(T).await.expect("a message on the GET stream");
    assert_eq!(m["method"], "notifications/tools/list_changed");
    assert!(m.get("id").is_none());
    let names = s.tool_names().await;
    assert!(names.contains(&"dyn__fresh".to_string()), "{names:?}");
    assert!(!names.contains(&"other__fresh".to_string()));
    assert_eq!(text(&s.call("dyn__fresh", json!({"text": "new"})).await), "new");
}

/// A DELETE ends the session's GET stream too: an ended session hears nothing more.
#[tokio::test]
async fn a_deleted_sessions_get_stream_ends() {
    let gw = Gateway::start(&server("m", &unique("del"), &[], ""));
    let s = gw.session().await;
    let mut get = s.get_stream().await;
    assert_eq!(s.end().await, 200);
    let wait = Duration::from_secs(10);
    let started = Instant::now();
    if let Some(m) = get.next(wait).await {
        panic!("the ended session's stream sent {m}");
    }
    assert!(started.elapsed() < wait, "the GET stream is still open after DELETE");
}
