//! Two-way traffic through the gateway, with the real binary and real children: servers'
//! questions to clients (sampling, elicitation, roots) reach the client of the call that
//! caused them, under an id the gateway mints, and nobody else; a question whose client
//! cannot be known, or that the client cannot answer, is refused with a sentence saying
//! why; progress and log messages stay with their call; resource updates reach only the
//! sessions subscribed, with subscriptions refcounted per (server, uri).
//!
//! Fixtures: `mock_server.py --two-way` (ask_sampling, ask_elicit, ask_roots,
//! update_resource, mark; subscribe/unsubscribe logged to stderr, which the gateway logs)
//! and `http_server.py` (ask_sampling on the call's own SSE stream).
//!
//! Negative checks on a GET stream use a sentinel: `calc__add_tool` makes every GET stream
//! receive tools/list_changed, so whatever was misdelivered before it has arrived by then.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
const README: &str = "mock://calc/readme";

/// `calc` (the two-way mock) and `other` (a plain mock) as stdio servers.
fn config() -> String {
    [
        server("calc", "calc", &["--two-way"], ""),
        server("other", "other", &[], ""),
    ]
    .concat()
}

/// A session whose `initialize` declared `caps`.
async fn open(gw: &Gateway, caps: Value) -> Session {
    let http = reqwest::Client::new();
    let resp = http
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":caps,"clientInfo":{"name":"two-way","version":"1"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let init: Value = resp.json().await.unwrap();
    let s = Session {
        http,
        url: gw.url.clone(),
        id,
        init,
    };
    s.notify("notifications/initialized", json!({})).await;
    s
}

fn all_caps() -> Value {
    json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}})
}

/// Starts a tools/call whose answer is read as it streams.
async fn start_call(s: &Session, id: Value, tool: &str, args: Value) -> Messages {
    s.start(id, "tools/call", json!({"name": tool, "arguments": args}))
        .await
}

/// POSTs the client's response to a server's question; the gateway accepts it with 202.
async fn reply(s: &Session, id: &Value, outcome: Value) {
    let mut msg = json!({"jsonrpc": "2.0", "id": id});
    for (k, v) in outcome.as_object().unwrap() {
        msg[k] = v.clone();
    }
    let r = s.post().json(&msg).send().await.unwrap();
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
}

/// The next message must be the server's question `method`, under an id the gateway minted.
async fn question(m: &mut Messages, method: &str) -> Value {
    let q = m
        .next(T)
        .await
        .unwrap_or_else(|| panic!("no {method} on the call's stream; got {:?}", m.seen));
    assert_eq!(q["method"], method, "{q}");
    let id = q["id"]
        .as_str()
        .unwrap_or_else(|| panic!("minted ids are strings: {q}"));
    // mcp-gateway-{the process's tag}-{n}
    let (tag, n) = id
        .strip_prefix("mcp-gateway-")
        .and_then(|rest| rest.rsplit_once('-'))
        .unwrap_or_else(|| panic!("not minted: {q}"));
    assert!(tag.len() == 6 && n.parse::<u64>().is_ok(), "{q}");
    q
}

fn sampling_answer(text: &str) -> Value {
    json!({"result": {"role": "assistant", "content": {"type": "text", "text": text}, "model": "test-model"}})
}

fn is_error(resp: &Value) -> bool {
    resp["result"]["isError"] == true
}

/// Makes every open GET stream receive notifications/tools/list_changed.
async fn sentinel(s: &Session) {
    let name = unique("sentinel").replace('-', "_");
    let r = s
        .call_id(json!("sentinel"), "calc__add_tool", json!({"name": name}))
        .await;
    assert_eq!(text(&r), "added", "{r}");
}

/// Reads a GET stream up to the sentinel's tools/list_changed and briefly after it;
/// returns every other message seen.
async fn besides_sentinel(stream: &mut Messages) -> Vec<Value> {
    let mut others = Vec::new();
    loop {
        let m = stream
            .next(T)
            .await
            .unwrap_or_else(|| panic!("no sentinel on the GET stream; got {others:?}"));
        if m["method"] == "notifications/tools/list_changed" {
            break;
        }
        others.push(m);
    }
    // Messages of the session's own channel race the broadcast; anything misdelivered
    // was queued before the sentinel and shows up at once.
    while let Some(m) = stream.next(Duration::from_millis(200)).await {
        if m["method"] != "notifications/tools/list_changed" {
            others.push(m);
        }
    }
    others
}

fn methods(msgs: &[Value]) -> Vec<String> {
    msgs.iter()
        .map(|m| m["method"].as_str().unwrap_or("(response)").to_string())
        .collect()
}

/// Asks `s` to cancel its request `id` and reads that call to its end.
async fn cancel(s: &Session, id: &Value, call: &mut Messages) -> (Vec<Value>, Value) {
    s.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test done"}),
    )
    .await;
    call.response(T).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sampling_elicitation_and_roots_reach_the_calling_client() {
    let gw = Gateway::start(&config());
    let a = open(&gw, all_caps()).await;

    // Sampling: the question on the call's own stream, the answer POSTed, the result back.
    let mut call = start_call(&a, json!(1), "calc__ask_sampling", json!({"prompt": "what is 2+2?"})).await;
    assert!(
        call.content_type.starts_with("text/event-stream"),
        "{}",
        call.content_type
    );
    let q = question(&mut call, "sampling/createMessage").await;
    assert_eq!(q["params"]["messages"][0]["content"]["text"], "what is 2+2?", "{q}");
    assert_eq!(q["params"]["maxTokens"], 100, "params pass through: {q}");
    reply(&a, &q["id"], sampling_answer("four")).await;
    let (notes, resp) = call.response(T).await;
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(resp["id"], 1);
    assert_eq!(text(&resp), "four", "{resp}");
    assert!(!is_error(&resp), "{resp}");

    // Elicitation.
    let mut call = start_call(&a, json!(2), "calc__ask_elicit", json!({"message": "your name?"})).await;
    let q2 = question(&mut call, "elicitation/create").await;
    assert_eq!(q2["params"]["message"], "your name?", "{q2}");
    assert_eq!(q2["params"]["requestedSchema"]["properties"]["name"]["type"], "string");
    reply(
        &a,
        &q2["id"],
        json!({"result": {"action": "accept", "content": {"name": "Ada"}}}),
    )
    .await;
    let (_, resp) = call.response(T).await;
    let got: Value = serde_json::from_str(&text(&resp)).unwrap();
    assert_eq!(got, json!({"action": "accept", "content": {"name": "Ada"}}));

    // Roots.
    let mut call = start_call(&a, json!(3), "calc__ask_roots", json!({})).await;
    let q3 = question(&mut call, "roots/list").await;
    let roots = json!({"roots": [{"uri": "file:///work/project", "name": "project"}]});
    reply(&a, &q3["id"], json!({ "result": roots })).await;
    let (_, resp) = call.response(T).await;
    let got: Value = serde_json::from_str(&text(&resp)).unwrap();
    assert_eq!(got, roots);

    // Every question got an id of its own.
    let ids = [&q["id"], &q2["id"], &q3["id"]];
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");

    // An error answer reaches the server as an error (the mock shows its message).
    let mut call = start_call(&a, json!(4), "calc__ask_elicit", json!({"message": "again?"})).await;
    let q4 = question(&mut call, "elicitation/create").await;
    reply(
        &a,
        &q4["id"],
        json!({"error": {"code": -32000, "message": "the user declined"}}),
    )
    .await;
    let (_, resp) = call.response(T).await;
    assert!(is_error(&resp), "{resp}");
    assert_eq!(text(&resp), "the user declined");

    // A response to no question is accepted and dropped; an answered id cannot answer twice.
    reply(&a, &q["id"], sampling_answer("late")).await;
    reply(&a, &json!("mcp-gateway-999"), sampling_answer("stray")).await;
    let r = a.call_id(json!(5), "calc__echo", json!({"text": "still fine"})).await;
    assert_eq!(text(&r), "still fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_capability_gets_an_error_naming_it() {
    let gw = Gateway::start(&config());
    let plain = open(&gw, json!({})).await;
    for (id, tool, cap, method) in [
        (1, "calc__ask_sampling", "sampling", "sampling/createMessage"),
        (2, "calc__ask_elicit", "elicitation", "elicitation/create"),
        (3, "calc__ask_roots", "roots", "roots/list"),
    ] {
        let mut call = start_call(&plain, json!(id), tool, json!({"prompt": "x", "message": "x"})).await;
        let (notes, resp) = call.response(T).await;
        assert!(notes.is_empty(), "no question reaches it: {notes:?}");
        assert!(is_error(&resp), "{resp}");
        let t = text(&resp);
        assert!(
            t.contains(&format!("did not declare the {cap} capability")) && t.contains(method),
            "{t}"
        );
    }
    // Declaring one capability does not grant the others.
    let sampler = open(&gw, json!({"sampling": {}})).await;
    let r = sampler.call_id(json!(1), "calc__ask_roots", json!({})).await;
    assert!(is_error(&r) && text(&r).contains("roots capability"), "{r}");
}

/// A server may ask a client sampling, elicitation and roots, nothing else: a `tools/call`,
/// a `tasks/list` (a client's own tasks are no server's business) or a notification sent
/// with an id reach no client, even one that declared every capability; the server is
/// told Method not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_asks_a_client_only_what_the_spec_lets_it() {
    let gw = Gateway::start(&config());
    let s = open(&gw, all_caps()).await;
    for (id, method) in [(1, "tools/call"), (2, "tasks/list"), (3, "notifications/progress")] {
        let mut call = start_call(&s, json!(id), "calc__ask_roots", json!({"method": method})).await;
        let (notes, resp) = call.response(T).await;
        assert!(notes.is_empty(), "{method} reached the client: {notes:?}");
        assert!(is_error(&resp), "{resp}");
        assert!(text(&resp).contains(&format!("Method not found: {method}")), "{resp}");
    }
}

/// A client's error answer that is no JSON-RPC error object (a string, a code that is no
/// integer, a message that is no string) reaches the server as the gateway's own error,
/// which the server can read, rather than as it was (a server drops it and waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_error_answer_reaches_the_server_as_one_it_can_read() {
    let gw = Gateway::start(&config());
    let s = open(&gw, all_caps()).await;
    for (n, bad) in [
        json!("just a string"),
        json!({"code": "x", "message": 5}),
        json!({"code": 1.5, "message": "m"}),
    ]
    .into_iter()
    .enumerate()
    {
        let mut call = start_call(&s, json!(n), "calc__ask_sampling", json!({"prompt": "x"})).await;
        let q = question(&mut call, "sampling/createMessage").await;
        reply(&s, &q["id"], json!({"error": bad})).await;
        let (_, resp) = call.response(T).await;
        assert!(is_error(&resp), "{resp}");
        assert!(text(&resp).contains("not a JSON-RPC error object"), "{bad}: {resp}");
    }
    // A well-formed one goes as the client wrote it.
    let mut call = start_call(&s, json!(9), "calc__ask_sampling", json!({"prompt": "x"})).await;
    let q = question(&mut call, "sampling/createMessage").await;
    reply(&s, &q["id"], json!({"error": {"code": -1, "message": "user declined"}})).await;
    let (_, resp) = call.response(T).await;
    assert_eq!(text(&resp), "user declined", "{resp}");
}

/// A server that withdraws its question (notifications/cancelled naming it) has it
/// withdrawn from the client too, under the id the client knows, and gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_the_server_withdraws_is_withdrawn_from_the_client() {
    let gw = Gateway::start(&config());
    let s = open(&gw, all_caps()).await;
    let mut call = start_call(&s, json!(1), "calc__ask_roots", json!({"withdraw": 0.3})).await;
    let q = question(&mut call, "roots/list").await;
    // Withdrawn while the call goes on (the server waits 5 s more for an answer), not
    // when the call ends.
    let cancelled = call.next(T).await.expect("the withdrawal");
    assert_eq!(cancelled["method"], "notifications/cancelled", "{cancelled}");
    assert_eq!(cancelled["params"]["requestId"], q["id"], "{cancelled}");
    // The mock logs it after sending the cancel: its stderr may come after.
    assert!(gw.wait_log("roots/list: withdrawn", T).await, "{}", gw.logs());
    assert!(
        !gw.logs().contains("roots/list: no answer"),
        "the call was over first:\n{}",
        gw.logs()
    );
    // Answered late anyway: the server gets nothing.
    reply(&s, &q["id"], json!({"result": {"roots": []}})).await;
    let (_, resp) = call.response(T).await;
    assert!(
        is_error(&resp) && text(&resp).contains("no answer to roots/list"),
        "{resp}"
    );
}

/// Over a shared pipe, the end of a URL-mode elicitation (`notifications/elicitation/complete`)
/// goes to the client it was asked of, though another client's call is in flight on that
/// server by then (before, it went only to "the only call in flight", so it was dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_elicitations_completion_reaches_the_client_it_was_asked_of() {
    let gw = Gateway::start(&config());
    // A URL-mode question reaches only a client that declared the mode.
    let a = open(
        &gw,
        json!({"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": true}}),
    )
    .await;
    let b = open(&gw, all_caps()).await;
    let args = json!({"url": true, "message": "connect your account"});
    let mut call = start_call(&a, json!(1), "calc__ask_elicit", args).await;
    let q = question(&mut call, "elicitation/create").await;
    assert_eq!(q["params"]["mode"], "url", "{q}");
    reply(&a, &q["id"], json!({"result": {"action": "accept"}})).await;
    // B's call reaches the server (the mock completes the elicitation only then).
    let b_args = json!({"name": "calc__slow", "arguments": {"seconds": 60, "steps": 600},
        "_meta": {"progressToken": "b-tok"}});
    let mut b_call = b.start(json!("b-slow"), "tools/call", b_args).await;
    let first = b_call.next(T).await.expect("B's progress");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let done = call.next(T).await.expect("the completion, on A's call");
    assert_eq!(done["method"], "notifications/elicitation/complete", "{done}");
    assert_eq!(done["params"]["elicitationId"], q["params"]["elicitationId"], "{done}");
    let (_, resp) = call.response(T).await;
    assert_eq!(text(&resp), r#"{"action":"accept"}"#, "{resp}");
    let (notes, _) = cancel(&b, &json!("b-slow"), &mut b_call).await;
    assert!(
        notes
            .iter()
            .all(|n| n["method"] != "notifications/elicitation/complete"),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_over_a_shared_pipe_reaches_its_caller_only_or_is_refused() {
    let gw = Gateway::start(&config());
    let a = open(&gw, all_caps()).await;
    let b = open(&gw, all_caps()).await;
    let mut a_get = a.get_stream().await;
    let mut b_get = b.get_stream().await;

    // B has a call in flight on the other server (its first progress proves it).
    let b_args = json!({"name": "other__slow", "arguments": {"seconds": 60, "steps": 600},
        "_meta": {"progressToken": "b-tok"}});
    let mut b_call = b.start(json!("b-slow"), "tools/call", b_args).await;
    let first = b_call.next(T).await.expect("B's progress");
    assert_eq!(first["method"], "notifications/progress", "{first}");

    // A's question goes to A, and A's answer back to the server.
    let mut call = start_call(&a, json!(1), "calc__ask_sampling", json!({"prompt": "for A"})).await;
    let q = question(&mut call, "sampling/createMessage").await;
    assert_eq!(q["params"]["messages"][0]["content"]["text"], "for A");
    reply(&a, &q["id"], sampling_answer("A answered")).await;
    let (_, resp) = call.response(T).await;
    assert_eq!(text(&resp), "A answered", "{resp}");

    // With a call of B in flight on the same server, nobody can tell whose question it is.
    let c_args = json!({"name": "calc__slow", "arguments": {"seconds": 60, "steps": 600},
        "_meta": {"progressToken": "b-calc"}});
    let mut b_calc = b.start(json!("b-calc"), "tools/call", c_args).await;
    b_calc.next(T).await.expect("B's progress on calc");
    let r = a
        .call_id(json!(2), "calc__ask_sampling", json!({"prompt": "whose?"}))
        .await;
    assert!(is_error(&r), "{r}");
    let t = text(&r);
    assert!(
        t.contains("cannot tell which client sampling/createMessage is for") && t.contains("2 calls"),
        "{t}"
    );
    let (notes, resp) = cancel(&b, &json!("b-calc"), &mut b_calc).await;
    assert!(
        resp["error"]["message"].as_str().unwrap().contains("cancelled"),
        "{resp}"
    );
    assert!(
        notes.iter().all(|n| n["params"]["progressToken"] == "b-calc"),
        "{notes:?}"
    );

    // Two questions at once from A's and B's calls on the same server: both refused,
    // neither delivered to anyone.
    let (mut ca, mut cb) = tokio::join!(
        start_call(
            &a,
            json!(3),
            "calc__ask_sampling",
            json!({"prompt": "A?", "together": 2})
        ),
        start_call(
            &b,
            json!(3),
            "calc__ask_sampling",
            json!({"prompt": "B?", "together": 2})
        ),
    );
    for (who, call) in [("A", &mut ca), ("B", &mut cb)] {
        let (notes, resp) = call.response(T).await;
        assert!(notes.is_empty(), "{who} was asked: {notes:?}");
        assert!(is_error(&resp), "{who}: {resp}");
        assert!(text(&resp).contains("cannot tell which client"), "{who}: {resp}");
    }

    // B's unrelated call saw only its own progress; no GET stream carried a question.
    let (notes, _) = cancel(&b, &json!("b-slow"), &mut b_call).await;
    assert!(
        notes
            .iter()
            .all(|n| n["method"] == "notifications/progress" && n["params"]["progressToken"] == "b-tok"),
        "{notes:?}"
    );
    sentinel(&a).await;
    assert_eq!(besides_sentinel(&mut a_get).await, Vec::<Value>::new());
    assert_eq!(besides_sentinel(&mut b_get).await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_log_messages_of_a_call_never_reach_another_client() {
    let gw = Gateway::start(&config());
    let a = open(&gw, json!({})).await;
    let b = open(&gw, json!({})).await;
    let mut b_get = b.get_stream().await;
    let b_args = json!({"name": "other__slow", "arguments": {"seconds": 60, "steps": 600},
        "_meta": {"progressToken": "b-tok"}});
    let mut b_call = b.start(json!(1), "tools/call", b_args).await;
    b_call.next(T).await.expect("B's progress");

    let all = a
        .request_all(
            json!(1),
            "tools/call",
            json!({"name": "calc__slow", "arguments": {"seconds": 0.3, "steps": 3},
                "_meta": {"progressToken": "a-tok"}}),
        )
        .await;
    let (resp, notes) = all.split_last().unwrap();
    assert_eq!(text(resp), "done");
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes.iter().all(|n| n["params"]["progressToken"] == "a-tok"),
        "{notes:?}"
    );

    let all = a
        .request_all(
            json!(2),
            "tools/call",
            json!({"name": "calc__log", "arguments": {"message": "for A only"}}),
        )
        .await;
    assert_eq!(methods(&all), ["notifications/message", "(response)"], "{all:?}");
    assert_eq!(all[0]["params"]["data"], "for A only");

    let (notes, _) = cancel(&b, &json!(1), &mut b_call).await;
    let strays: Vec<_> = b_call
        .seen
        .iter()
        .chain(&notes)
        .filter(|n| n.get("id").is_none() && n["params"]["progressToken"] != "b-tok")
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
    sentinel(&a).await;
    assert_eq!(besides_sentinel(&mut b_get).await, Vec::<Value>::new());
}

/// How many times the gateway's log shows the mock's stderr line `line`.
fn count(gw: &Gateway, line: &str) -> usize {
    gw.logs().matches(&format!("[mock] {line}")).count()
}

/// Waits until every stderr line the mock wrote before `mark {tag}` is in the gateway's log.
async fn settle(gw: &Gateway, s: &Session, tag: &str) {
    let r = s.call_id(json!(tag), "calc__mark", json!({"text": tag})).await;
    assert_eq!(text(&r), "marked");
    assert!(gw.wait_log(&format!("[mock] mark {tag}"), T).await, "{}", gw.logs());
}

async fn subscribe(s: &Session, method: &str) {
    let r = s.request(json!(method), method, json!({"uri": README})).await;
    assert_eq!(r["result"], json!({}), "{r}");
}

async fn update(s: &Session) {
    let r = s
        .call_id(json!("u"), "calc__update_resource", json!({"uri": README}))
        .await;
    assert_eq!(text(&r), format!("updated {README}"));
}

async fn expect_update(stream: &mut Messages) {
    let m = stream.next(T).await.expect("resources/updated");
    assert_eq!(m["method"], "notifications/resources/updated", "{m}");
    assert_eq!(m["params"]["uri"], README, "{m}");
}

async fn delete(s: &Session) {
    assert_eq!(s.end().await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_updates_reach_subscribers_only_and_subscriptions_are_refcounted() {
    let gw = Gateway::start(&config());
    let a = open(&gw, json!({})).await;
    assert_eq!(
        a.init["result"]["capabilities"]["resources"]["subscribe"], true,
        "{}",
        a.init
    );
    let b = open(&gw, json!({})).await;
    let mut a_get = a.get_stream().await;
    let mut b_get = b.get_stream().await;

    // A subscribes, B does not: the update reaches A only.
    subscribe(&a, "resources/subscribe").await;
    update(&a).await;
    expect_update(&mut a_get).await;
    sentinel(&a).await;
    assert_eq!(besides_sentinel(&mut b_get).await, Vec::<Value>::new());
    assert_eq!(besides_sentinel(&mut a_get).await, Vec::<Value>::new());

    // B subscribes too: the downstream was subscribed once.
    subscribe(&b, "resources/subscribe").await;
    settle(&gw, &a, "both-subscribed").await;
    assert_eq!(count(&gw, &format!("subscribe {README}")), 1, "{}", gw.logs());
    update(&b).await;
    expect_update(&mut a_get).await;
    expect_update(&mut b_get).await;

    // A unsubscribes: B still needs it, so the downstream stays subscribed.
    subscribe(&a, "resources/unsubscribe").await;
    settle(&gw, &a, "a-unsubscribed").await;
    assert_eq!(count(&gw, &format!("unsubscribe {README}")), 0, "{}", gw.logs());
    update(&a).await;
    expect_update(&mut b_get).await;
    sentinel(&a).await;
    assert_eq!(besides_sentinel(&mut a_get).await, Vec::<Value>::new());
    assert_eq!(besides_sentinel(&mut b_get).await, Vec::<Value>::new());

    // B, the last, unsubscribes: now the downstream does.
    subscribe(&b, "resources/unsubscribe").await;
    settle(&gw, &a, "b-unsubscribed").await;
    assert_eq!(count(&gw, &format!("unsubscribe {README}")), 1, "{}", gw.logs());
    // Unsubscribing what one is not subscribed to changes nothing.
    subscribe(&b, "resources/unsubscribe").await;
    settle(&gw, &a, "b-again").await;
    assert_eq!(count(&gw, &format!("unsubscribe {README}")), 1, "{}", gw.logs());

    // DELETE drops a session's subscriptions; the downstream unsubscribe comes with the last.
    subscribe(&a, "resources/subscribe").await;
    subscribe(&b, "resources/subscribe").await;
    settle(&gw, &a, "resubscribed").await;
    assert_eq!(count(&gw, &format!("subscribe {README}")), 2, "{}", gw.logs());
    delete(&a).await;
    update(&b).await;
    expect_update(&mut b_get).await;
    settle(&gw, &b, "a-deleted").await;
    assert_eq!(count(&gw, &format!("unsubscribe {README}")), 1, "{}", gw.logs());
    delete(&b).await;
    let unsubscribed = until(T, || count(&gw, &format!("unsubscribe {README}")) == 2).await;
    assert!(unsubscribed, "{}", gw.logs());
}

#[test]
fn over_stdio_the_question_goes_out_on_stdout_and_the_answer_comes_back_on_stdin() {
    let mut g = StdioGateway::start(&config(), &[]);
    let (_, init) = g.request(
        json!(0),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}, "roots": {}},
            "clientInfo": {"name": "two-way", "version": "1"}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    g.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    for (n, prompt) in [(1, "first"), (2, "second")] {
        g.send(&json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "calc__ask_sampling", "arguments": {"prompt": prompt}}}));
        let q = g
            .recv(T)
            .unwrap_or_else(|| panic!("no question on stdout; stderr:\n{}", g.logs()));
        assert_eq!(q["method"], "sampling/createMessage", "{q}");
        assert_eq!(q["params"]["messages"][0]["content"]["text"], prompt, "{q}");
        let id = q["id"].as_str().unwrap_or_default();
        assert!(id.starts_with("mcp-gateway-"), "{q}");
        g.send(&json!({"jsonrpc": "2.0", "id": q["id"],
            "result": {"role": "assistant", "content": {"type": "text", "text": format!("re: {prompt}")}, "model": "m"}}));
        let (others, resp) = g.until_response(&json!(n), T);
        assert!(others.is_empty(), "{others:?}");
        assert_eq!(text(&resp), format!("re: {prompt}"), "{resp}");
    }

    // Roots declared, elicitation not.
    let (_, resp) = {
        g.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "calc__ask_roots", "arguments": {}}}));
        let q = g.recv(T).expect("roots/list on stdout");
        assert_eq!(q["method"], "roots/list", "{q}");
        g.send(&json!({"jsonrpc": "2.0", "id": q["id"], "result": {"roots": []}}));
        g.until_response(&json!(3), T)
    };
    assert_eq!(text(&resp), r#"{"roots":[]}"#);
    let (_, resp) = g.request(
        json!(4),
        "tools/call",
        json!({"name": "calc__ask_elicit", "arguments": {"message": "hm"}}),
    );
    assert!(
        is_error(&resp) && text(&resp).contains("elicitation capability"),
        "{resp}"
    );

    // A subscription's update comes out on stdout too.
    let (_, r) = g.request(json!(5), "resources/subscribe", json!({"uri": README}));
    assert_eq!(r["result"], json!({}), "{r}");
    let (others, r) = g.request(
        json!(6),
        "tools/call",
        json!({"name": "calc__update_resource", "arguments": {"uri": README}}),
    );
    assert!(!is_error(&r), "{r}");
    let update = match others.into_iter().next() {
        Some(m) => m,
        None => g.recv(T).expect("resources/updated on stdout"),
    };
    assert_eq!(update["method"], "notifications/resources/updated", "{update}");
    assert_eq!(update["params"]["uri"], README);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_an_http_downstream_each_question_reaches_the_client_whose_call_it_is() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), ""));
    let a = open(&gw, json!({"sampling": {}})).await;
    let b = open(&gw, json!({"sampling": {}})).await;
    let mut b_get = b.get_stream().await;

    // Both calls in flight at once, each with its question on its own stream.
    let (mut ca, mut cb) = tokio::join!(
        start_call(&a, json!(1), "web__ask_sampling", json!({"prompt": "from A"})),
        start_call(&b, json!(1), "web__ask_sampling", json!({"prompt": "from B"})),
    );
    let qa = question(&mut ca, "sampling/createMessage").await;
    let qb = question(&mut cb, "sampling/createMessage").await;
    assert_eq!(qa["params"]["messages"][0]["content"]["text"], "from A", "{qa}");
    assert_eq!(qb["params"]["messages"][0]["content"]["text"], "from B", "{qb}");
    // Answered in the other order.
    reply(&b, &qb["id"], sampling_answer("answer for B")).await;
    reply(&a, &qa["id"], sampling_answer("answer for A")).await;
    let (notes_a, ra) = ca.response(T).await;
    let (notes_b, rb) = cb.response(T).await;
    assert!(notes_a.is_empty() && notes_b.is_empty(), "{notes_a:?} {notes_b:?}");
    assert_eq!(text(&ra), "answer for A", "{ra}");
    assert_eq!(text(&rb), "answer for B", "{rb}");
    // The server got the answers under its own ids (the fixture's "ask-N").
    let answers: Vec<Value> = remote
        .records()
        .into_iter()
        .filter(|r| r["http"] == "POST" && r["rpc"].is_null())
        .collect();
    assert!(answers.len() >= 2, "{answers:?}");

    // A client without sampling is refused, over HTTP too.
    let plain = open(&gw, json!({})).await;
    let r = plain
        .call_id(json!(1), "web__ask_sampling", json!({"prompt": "x"}))
        .await;
    assert!(
        is_error(&r) && text(&r).contains("did not declare the sampling capability"),
        "{r}"
    );

    sentinel_remote(&a, &remote).await;
    let others = besides_sentinel(&mut b_get).await;
    assert!(others.is_empty(), "{others:?}");
}

/// A remote server may withdraw its question (`notifications/cancelled` on the call's own
/// stream) while the client still holds it: the client is told under the id it knows, and
/// the server gets no answer, however late the client sends one. The stream is read on
/// while a question waits, or the withdrawal would sit unread behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_servers_withdrawn_question_is_withdrawn_from_the_client() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), ""));
    let a = open(&gw, json!({"sampling": {}})).await;
    let args = json!({"prompt": "never mind", "withdraw": 0.3});
    let mut call = start_call(&a, json!(1), "web__ask_sampling", args).await;
    let q = question(&mut call, "sampling/createMessage").await;
    let cancelled = call.next(T).await.expect("the withdrawal");
    assert_eq!(cancelled["method"], "notifications/cancelled", "{cancelled}");
    assert_eq!(cancelled["params"]["requestId"], q["id"], "{cancelled}");
    // Answered late anyway (the server listens 2 s more): it gets nothing.
    reply(&a, &q["id"], sampling_answer("too late")).await;
    let (_, resp) = call.response(T).await;
    assert!(is_error(&resp), "{resp}");
    assert_eq!(text(&resp), "withdrawn, no answer", "{resp}");
}

/// With `max_connections = 1`, a call holds the server's only slot while its question
/// waits for the client. The client's answer goes to the server past the bound (queued
/// behind the call that waits for it, it would never go), and a second call, which waits
/// its turn, is answered once the first ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_not_queued_behind_the_call_that_waits_for_it() {
    let remote = Remote::start(&[]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), "max_connections = 1"));
    let a = open(&gw, json!({"sampling": {}})).await;
    let mut first = start_call(&a, json!(1), "web__ask_sampling", json!({"prompt": "one slot"})).await;
    let q = question(&mut first, "sampling/createMessage").await;
    let (second, first) = tokio::join!(a.call_id(json!(2), "web__echo", json!({"text": "my turn"})), async {
        reply(&a, &q["id"], sampling_answer("answered")).await;
        first.response(T).await.1
    });
    assert_eq!(text(&first), "answered", "{first}\n{}", gw.logs());
    assert_eq!(text(&second), "my turn", "{second}\n{}", gw.logs());
}

/// The sentinel for a gateway in front of the HTTP fixture: its notify_change.
async fn sentinel_remote(s: &Session, _remote: &Remote) {
    let r = s.call_id(json!("sentinel"), "web__notify_change", json!({})).await;
    assert!(text(&r).starts_with("added"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_whose_call_is_cancelled_is_answered_with_an_error_at_once() {
    let gw = Gateway::start(&config());
    let a = open(&gw, all_caps()).await;
    let mut call = start_call(&a, json!(1), "calc__ask_sampling", json!({"prompt": "never answered"})).await;
    let q = question(&mut call, "sampling/createMessage").await;
    let (_, resp) = cancel(&a, &json!(1), &mut call).await;
    assert!(
        resp["error"]["message"].as_str().unwrap().contains("cancelled"),
        "{resp}"
    );
    // The server is not left waiting for an answer that will never come.
    assert!(
        gw.wait_log("[mock] sampling/createMessage answered: error", T).await,
        "{}",
        gw.logs()
    );
    // A late answer is dropped, and the session works on.
    reply(&a, &q["id"], sampling_answer("too late")).await;
    let r = a.call_id(json!(2), "calc__echo", json!({"text": "ok"})).await;
    assert_eq!(text(&r), "ok");
}

#[test]
fn over_stdio_a_cancelled_call_withdraws_its_question() {
    let mut g = StdioGateway::start(&config(), &[]);
    g.request(
        json!(0),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
            "clientInfo": {"name": "two-way", "version": "1"}}),
    );
    g.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    g.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "calc__ask_sampling", "arguments": {"prompt": "p"}}}));
    let q = g.recv(T).expect("question");
    assert_eq!(q["method"], "sampling/createMessage", "{q}");
    g.send(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}));
    // The gateway withdraws its question from the client...
    let m = g.recv(T).expect("notifications/cancelled for the question");
    assert_eq!(m["method"], "notifications/cancelled", "{m}");
    assert_eq!(m["params"]["requestId"], q["id"], "{m}");
    // ...and tells the server it will get no answer.
    let deadline = std::time::Instant::now() + T;
    while !g.logs().contains("[mock] sampling/createMessage answered: error") {
        assert!(std::time::Instant::now() < deadline, "{}", g.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, r) = g.request(
        json!(2),
        "tools/call",
        json!({"name": "calc__echo", "arguments": {"text": "ok"}}),
    );
    assert_eq!(text(&r), "ok");
}

/// Known gap: after a restart (or a reload's new process, or an HTTP server that forgot
/// its session) the gateway still counts the sessions' subscriptions but never subscribes
/// the new downstream, so a server that honours subscriptions sends no more updates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_subscribed_again() {
    let gw = Gateway::start(&config());
    let a = open(&gw, json!({})).await;
    let mut a_get = a.get_stream().await;
    subscribe(&a, "resources/subscribe").await;
    settle(&gw, &a, "subscribed").await;
    assert_eq!(count(&gw, &format!("subscribe {README}")), 1);
    let r = a.call_id(json!(1), "calc__crash", json!({})).await;
    assert!(r.get("error").is_some(), "{r}");
    // The new process learns of the subscription the gateway still holds for A.
    let again = until(T, || count(&gw, &format!("subscribe {README}")) == 2).await;
    assert!(again, "{}", gw.logs());
    update(&a).await;
    loop {
        let m = a_get.next(T).await.expect("resources/updated after the restart");
        if m["method"] == "notifications/resources/updated" {
            break;
        }
    }
}

/// A session whose client declared URL-mode elicitation (2025-11-25).
fn url_caps() -> Value {
    json!({"elicitation": {"form": {}, "url": {}}})
}

/// The 2025-11-25 flow over a shared pipe: a call fails with -32042 (URL elicitation
/// required); later, while another client's call is the only one in flight, the server
/// says the elicitation is complete. The completion reaches the session that was asked,
/// on its own stream, and not the client whose call happened to be in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_elicitation_an_error_required_is_completed_to_the_session_asked() {
    let gw = Gateway::start(&config());
    let a = open(&gw, url_caps()).await;
    let b = open(&gw, all_caps()).await;
    let mut a_get = a.get_stream().await;
    let mut b_get = b.get_stream().await;
    let r = a.call_id(json!(1), "calc__need_url", json!({"id": "el-a"})).await;
    assert_eq!(r["error"]["code"], -32042, "{r}");
    assert_eq!(r["error"]["data"]["elicitations"][0]["elicitationId"], "el-a", "{r}");
    let mut b_call = start_call(&b, json!(2), "calc__complete_url", json!({"id": "el-a"})).await;
    let (notes, resp) = b_call.response(T).await;
    assert_eq!(text(&resp), "completed", "{resp}");
    assert!(notes.is_empty(), "B's call got {notes:?}");
    let done = a_get.next(T).await.expect("the completion, on A's own stream");
    assert_eq!(done["method"], "notifications/elicitation/complete", "{done}");
    assert_eq!(done["params"]["elicitationId"], "el-a", "{done}");
    sentinel(&b).await;
    let others = besides_sentinel(&mut b_get).await;
    assert!(others.is_empty(), "B's stream got {others:?}");
}

/// The same flow with a remote server, whose completion comes on its GET stream, where
/// the gateway used to drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_servers_url_elicitation_completes_on_the_session_asked() {
    let remote = Remote::start(&["--url-elicitation"]);
    let gw = Gateway::start(&remote_table("web", &remote.url(), ""));
    let a = open(&gw, url_caps()).await;
    let b = open(&gw, url_caps()).await;
    let mut a_get = a.get_stream().await;
    let mut b_get = b.get_stream().await;
    let r = a.call_id(json!(1), "web__need_url", json!({"id": "el-web"})).await;
    assert_eq!(r["error"]["code"], -32042, "{r}");
    let r = b.call_id(json!(2), "web__complete_url", json!({"id": "el-web"})).await;
    assert!(text(&r).starts_with("completed (1 listening)"), "{r}");
    let done = a_get.next(T).await.expect("the completion, on A's own stream");
    assert_eq!(done["method"], "notifications/elicitation/complete", "{done}");
    assert_eq!(done["params"]["elicitationId"], "el-web", "{done}");
    // Asked nothing: B hears nothing of it (the sentinel: the server's list_changed).
    sentinel_remote(&b, &remote).await;
    let others = besides_sentinel(&mut b_get).await;
    assert!(others.is_empty(), "B's stream got {others:?}");
}
