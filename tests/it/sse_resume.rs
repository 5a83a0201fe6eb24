//! Resumable SSE (issue #14): event ids on every SSE event, priming events and `retry`
//! for 2025-11-25 sessions, `Last-Event-ID` replay on GET within the replay bound, and a
//! call that keeps running when its client drops the connection.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn gateway() -> (Gateway, String) {
    let name = unique("resume");
    (Gateway::start(&server("s", &name, &[], "")), name)
}

/// GET with `Last-Event-ID` (and the session's headers).
async fn resume(s: &Session, last: &str, version: &str) -> reqwest::Response {
    s.http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", version)
        .header("last-event-id", last)
        .send()
        .await
        .unwrap()
}

fn progress_of(m: &Value) -> i64 {
    assert_eq!(m["method"], "notifications/progress", "{m}");
    m["params"]["progress"].as_i64().unwrap()
}

/// The stream id part of `STREAM-SEQ`.
fn stream_of(id: &str) -> &str {
    id.split_once('-')
        .map(|(s, _)| s)
        .unwrap_or_else(|| panic!("not STREAM-SEQ: {id}"))
}

/// A long call with progress: the client reads two progress events, drops the
/// connection, reconnects with GET + Last-Event-ID, and gets the remaining progress
/// (none twice, none lost) and the answer with its own id: the call was not cancelled.
#[tokio::test]
async fn a_dropped_call_stream_resumes_after_its_last_event_id() {
    let (gw, _) = gateway();
    let s = gw.session().await;
    let args = json!({"name": "s__slow", "arguments": {"seconds": 1.5, "steps": 5}, "_meta": {"progressToken": "p"}});
    let mut m = s.start(json!("long-1"), "tools/call", args).await;
    assert!(m.content_type.starts_with("text/event-stream"), "{}", m.content_type);
    assert_eq!(progress_of(&m.next(T).await.expect("progress 1")), 1);
    assert_eq!(progress_of(&m.next(T).await.expect("progress 2")), 2);
    // The priming event came first, with `retry`; every event has its own id, all on one stream.
    assert_eq!(m.ids.len(), 3, "{:?}", m.ids);
    assert!(m.ids[0].ends_with("-0"), "priming id {:?}", m.ids);
    assert_eq!(m.retry, Some(1000));
    let stream = stream_of(&m.ids[0]).to_string();
    assert!(m.ids.iter().all(|i| stream_of(i) == stream), "{:?}", m.ids);
    let last = m.last_id.clone().unwrap();
    drop(m);

    let r = resume(&s, &last, "2025-11-25").await;
    assert_eq!(r.status(), 200);
    let mut rest = Messages::new(r);
    let (notes, answer) = rest.response(T).await;
    let steps: Vec<i64> = notes.iter().map(progress_of).collect();
    assert_eq!(steps, vec![3, 4, 5], "the progress after the cut, once each");
    assert_eq!(answer["id"], "long-1");
    assert!(text(&answer).contains("done"), "{answer}");
    assert!(
        rest.next(Duration::from_secs(2)).await.is_none(),
        "the stream ends after its answer"
    );
    // The resumed events carry the ids of the same stream, after the one resumed from;
    // the priming event before them names the one resumed from, so a connection that
    // breaks again before the replay ends loses none of it (with the newest id there, a
    // client that read only the priming event would resume past the replay).
    assert!(rest.ids.iter().all(|i| stream_of(i) == stream), "{:?}", rest.ids);
    assert_eq!(rest.ids[0], last, "{:?}", rest.ids);
    assert!(!rest.ids[1..].contains(&last), "{:?}", rest.ids);
}

/// A stream resumed after its call ended starts with a priming event that names the
/// event resumed from, not the stream's newest: a client whose connection breaks right
/// after it (SSE clients keep the id of every event, empty ones too) resumes from it and
/// gets the whole replay, the answer included, again.
#[tokio::test]
async fn a_resumed_streams_priming_event_names_the_event_resumed_from() {
    let (gw, _) = gateway();
    let s = gw.session().await;
    let args = json!({"name": "s__slow", "arguments": {"seconds": 0.6, "steps": 3}, "_meta": {"progressToken": "p"}});
    let mut m = s.start(json!("r"), "tools/call", args).await;
    assert_eq!(progress_of(&m.next(T).await.expect("progress 1")), 1);
    let last = m.last_id.clone().unwrap();
    drop(m);
    // The call runs on to its answer, its events kept.
    assert!(gw.in_flight_is(0).await, "in flight: {}", gw.in_flight().await);
    for round in 0..2 {
        let r = resume(&s, &last, "2025-11-25").await;
        assert_eq!(r.status(), 200);
        let mut rest = Messages::new(r);
        let (notes, answer) = rest.response(T).await;
        assert_eq!(
            notes.iter().map(progress_of).collect::<Vec<_>>(),
            vec![2, 3],
            "round {round}"
        );
        assert_eq!(answer["id"], "r");
        // What a client that read only the priming event resumes from.
        assert_eq!(rest.ids[0], last, "round {round}: {:?}", rest.ids);
    }
}

/// An id of a stream the session never had, or one whose events were evicted (past the
/// count bound), is refused with 410 and a JSON-RPC error saying why; a malformed one
/// with 400. The last event of an answered stream resumes to an empty, ended stream.
#[tokio::test]
async fn an_unknown_or_evicted_event_id_is_refused() {
    let (gw, _) = gateway();
    let s = gw.session().await;
    let r = resume(&s, "999-1", "2025-11-25").await;
    assert_eq!(r.status(), 410);
    let body: Value = r.json().await.unwrap();
    assert!(
        error_of(&body)["message"].as_str().unwrap().contains("no longer kept"),
        "{body}"
    );
    let r = resume(&s, "not-an-id", "2025-11-25").await;
    assert_eq!(r.status(), 400);

    // 1 100 progress events: more than the 1 000 a session keeps.
    let args =
        json!({"name": "s__slow", "arguments": {"seconds": 0.5, "steps": 1100}, "_meta": {"progressToken": "p"}});
    let mut m = s.start(json!(2), "tools/call", args).await;
    let (notes, answer) = m.response(T).await;
    assert_eq!(answer["id"], 2);
    assert!(notes.len() > 1000, "{} progress events", notes.len());
    let first = m.ids[1].clone();
    let last = m.last_id.clone().unwrap();
    let r = resume(&s, &first, "2025-11-25").await;
    assert_eq!(r.status(), 410, "event {first} is past the count bound");
    let body: Value = r.json().await.unwrap();
    assert_eq!(error_of(&body)["code"], -32600, "{body}");
    let r = resume(&s, &last, "2025-11-25").await;
    assert_eq!(r.status(), 200);
    let mut rest = Messages::new(r);
    assert!(rest.next(T).await.is_none(), "nothing after the answer");
}

/// The GET stream's events have ids too: a GET with the id of its first list_changed
/// replays the second, and the stream goes on live under the same stream number, taking
/// it over from the connection still open.
#[tokio::test]
async fn the_get_stream_resumes_after_its_last_event_id() {
    let (gw, _) = gateway();
    let s = gw.session().await;
    let mut get = s.get_stream().await;
    s.call("s__add_tool", json!({"name": "one"})).await;
    let first = get.next(T).await.expect("list_changed");
    assert_eq!(first["method"], "notifications/tools/list_changed");
    let first_id = get.last_id.clone().unwrap();
    s.call("s__add_tool", json!({"name": "two"})).await;
    get.next(T).await.expect("second list_changed");
    let second_id = get.last_id.clone().unwrap();
    assert_ne!(first_id, second_id);
    // Resumed while the first connection is still open (as after a network failure the
    // gateway has not noticed yet): the new connection takes the stream over.
    let r = resume(&s, &first_id, "2025-11-25").await;
    assert_eq!(r.status(), 200);
    let mut again = Messages::new(r);
    let replayed = again.next(T).await.expect("the second list_changed, replayed");
    assert_eq!(replayed["method"], "notifications/tools/list_changed");
    assert_eq!(
        again.ids.first(),
        Some(&first_id),
        "the priming event names the event resumed from"
    );
    assert_eq!(again.last_id.as_deref(), Some(second_id.as_str()));
    s.call("s__add_tool", json!({"name": "three"})).await;
    again.next(T).await.expect("a live list_changed");
    let live = again.last_id.clone().unwrap();
    assert_eq!(stream_of(&live), stream_of(&first_id));
    assert!(get.next(T).await.is_none(), "the connection taken over has ended");
    // A plain second GET is still refused while one is open.
    let r = s
        .http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
}

/// Opens a session at `version` by hand (the helper speaks 2025-11-25).
async fn session_at(url: &str, version: &str) -> Session {
    let http = reqwest::Client::new();
    let resp = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":version,"capabilities":{},"clientInfo":{"name":"old","version":"1"}}}))
        .send()
        .await
        .unwrap();
    let id = resp.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let init: Value = resp.json().await.unwrap();
    assert_eq!(init["result"]["protocolVersion"], version);
    Session {
        http,
        url: url.to_string(),
        id,
        init,
    }
}

/// Priming events and `retry` are for 2025-11-25 sessions only: a 2025-06-18 session's
/// SSE answer has ids on its messages but starts with the first message, and its slow
/// call without progress stays plain JSON. A 2025-11-25 session's slow call is answered
/// on SSE, priming event first, so it is resumable too.
#[tokio::test]
async fn priming_and_retry_only_for_2025_11_25() {
    let (gw, _) = gateway();
    let old = session_at(&gw.url, "2025-06-18").await;
    let post = |s: &Session, version: &str, id: i64, args: Value| {
        s.http
            .post(&s.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &s.id)
            .header("mcp-protocol-version", version)
            .json(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"s__slow","arguments":args,"_meta":{"progressToken":"t"}}}))
            .send()
    };
    let r = post(&old, "2025-06-18", 1, json!({"seconds": 0.3, "steps": 2}))
        .await
        .unwrap();
    let body = r.text().await.unwrap();
    assert!(body.starts_with("id: "), "ids on an old session's events: {body}");
    assert!(!body.contains("retry:"), "{body}");
    assert!(!body.contains("data: \n"), "no priming event: {body}");
    let r = post(&old, "2025-06-18", 2, json!({"seconds": 0.3})).await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");

    let new = gw.session().await;
    let r = post(&new, "2025-11-25", 3, json!({"seconds": 0.3})).await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let body = r.text().await.unwrap();
    assert!(
        body.starts_with("id: ") && body.contains("retry: 1000\ndata: \n\n"),
        "{body}"
    );
    let msgs = parse_sse(&body);
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0]["id"], 3);
    // A fast call stays plain JSON, with no id.
    let r = new
        .post()
        .json(&json!({"jsonrpc":"2.0","id":4,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");
}
