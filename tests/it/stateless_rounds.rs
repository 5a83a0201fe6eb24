//! Multi round-trip requests bridged for handshake-era servers: a server's question
//! during a 2026-07-28 call becomes `input_required`; the retry with `inputResponses` and
//! the `requestState` resumes the parked call; tampered, reused, mismatched and expired
//! states are refused (-32602); an expired call is cancelled downstream.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const V: &str = "2026-07-28";
const T: Duration = Duration::from_secs(20);

fn meta(caps: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientInfo": {"name": "mrtr-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps,
    })
}

fn all_caps() -> Value {
    json!({"elicitation": {}, "sampling": {}, "roots": {}})
}

/// A stateless request (headers from the body) as `token` if given; the last message.
async fn post(gw: &Gateway, token: Option<&str>, id: Value, method: &str, mut params: Value) -> Value {
    if params.get("_meta").is_none() {
        params["_meta"] = meta(all_caps());
    }
    let mut req = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V)
        .header("mcp-method", method);
    let name = params.get("name").or_else(|| params.get("uri"));
    if let Some(n) = name.and_then(Value::as_str) {
        req = req.header("mcp-name", n);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let r = req
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    read_messages(r).await.into_iter().last().expect("a response")
}

async fn call(gw: &Gateway, id: Value, tool: &str, args: Value, extra: Value) -> Value {
    let mut params = json!({"name": tool, "arguments": args});
    if let Value::Object(e) = extra {
        for (k, v) in e {
            params[k] = v;
        }
    }
    post(gw, None, id, "tools/call", params).await
}

/// The one question of an input_required result: (key, request, state).
fn question(r: &Value) -> (String, Value, String) {
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    assert_eq!(
        r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcp-gateway",
        "{r}"
    );
    let reqs = r["result"]["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(reqs.len(), 1, "{r}");
    let (k, q) = reqs.iter().next().unwrap();
    let state = r["result"]["requestState"].as_str().expect("requestState").to_string();
    (k.clone(), q.clone(), state)
}

fn refused(r: &Value) {
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["error"]["data"]["reason"], "invalid_request_state", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_become_input_required_and_retries_resume_the_call() {
    let n = unique("mrtr");
    let gw = Gateway::start(&server("s0", &n, &["--two-way"], ""));

    // Elicitation: asked, then answered on the retry.
    let r = call(
        &gw,
        json!(1),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({}),
    )
    .await;
    let (key, q, state) = question(&r);
    assert_eq!(q["method"], "elicitation/create", "{q}");
    assert_eq!(q["params"]["message"], "Your name?", "{q}");

    // A tampered state, or one presented for another tool, is refused (the call stays parked).
    let mut tampered = state.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    let r = call(
        &gw,
        json!(2),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({"requestState": tampered, "inputResponses": {}}),
    )
    .await;
    refused(&r);
    let r = call(
        &gw,
        json!(3),
        "s0__ask_roots",
        json!({}),
        json!({"requestState": state, "inputResponses": {}}),
    )
    .await;
    refused(&r);
    let r = call(
        &gw,
        json!(4),
        "s0__ask_elicit",
        json!({}),
        json!({"requestState": "mcp-gateway.garbage"}),
    )
    .await;
    refused(&r);
    // (A state without the gateway's mark is a 2026-07-28 server's own: it goes to the
    // server untouched; tests/it/stateless_downstream.rs and the conformance suite cover that.)

    // A retry without the answer is asked again, with a new state; the old one is spent.
    let r = call(
        &gw,
        json!(5),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({"requestState": state, "inputResponses": {"other": {}}}),
    )
    .await;
    let (key2, q2, state2) = question(&r);
    assert_eq!((key2.as_str(), &q2), (key.as_str(), &q), "the same open question");
    assert_ne!(state2, state);
    let r = call(
        &gw,
        json!(6),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({"requestState": state, "inputResponses": {}}),
    )
    .await;
    refused(&r);

    let answer = json!({"action": "accept", "content": {"name": "octocat"}});
    let r = call(
        &gw,
        json!(7),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({"requestState": state2, "inputResponses": {key2.clone(): answer}}),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(r["id"], 7);
    assert_eq!(text(&r), r#"{"action":"accept","content":{"name":"octocat"}}"#);
    let r = call(
        &gw,
        json!(8),
        "s0__ask_elicit",
        json!({"message": "Your name?"}),
        json!({"requestState": state2, "inputResponses": {key2: answer}}),
    )
    .await;
    refused(&r);

    // Sampling and roots the same way.
    let r = call(&gw, json!(9), "s0__ask_sampling", json!({"prompt": "2+2?"}), json!({})).await;
    let (k, q, s) = question(&r);
    assert_eq!(q["method"], "sampling/createMessage");
    assert_eq!(q["params"]["messages"][0]["content"]["text"], "2+2?", "{q}");
    let reply =
        json!({"role": "assistant", "content": {"type": "text", "text": "4"}, "model": "m", "stopReason": "endTurn"});
    let r = call(
        &gw,
        json!(10),
        "s0__ask_sampling",
        json!({"prompt": "2+2?"}),
        json!({"requestState": s, "inputResponses": {k: reply}}),
    )
    .await;
    assert_eq!(text(&r), "4", "{r}");
    let r = call(&gw, json!(11), "s0__ask_roots", json!({}), json!({})).await;
    let (k, q, s) = question(&r);
    assert_eq!(q["method"], "roots/list");
    let r = call(
        &gw,
        json!(12),
        "s0__ask_roots",
        json!({}),
        json!({"requestState": s, "inputResponses": {k: {"roots": [{"uri": "file:///x"}]}}}),
    )
    .await;
    assert_eq!(text(&r), r#"{"roots":[{"uri":"file:///x"}]}"#, "{r}");

    // A server's ping is answered by the gateway, and a method an InputRequest cannot be
    // (it is sampling, elicitation or roots) is refused to the server as -32601: neither
    // becomes an input_required.
    let r = call(&gw, json!(21), "s0__ask_roots", json!({"method": "ping"}), json!({})).await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(text(&r), "{}", "{r}");
    let r = call(
        &gw,
        json!(22),
        "s0__ask_roots",
        json!({"method": "x/whatever"}),
        json!({}),
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r).contains("Method not found: x/whatever"), "{r}");

    // A client that did not declare the capability is never asked.
    let mut p = json!({"name": "s0__ask_elicit", "arguments": {"message": "x"}});
    p["_meta"] = meta(json!({"sampling": {}}));
    let r = post(&gw, None, json!(13), "tools/call", p).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r).contains("elicitation"), "{r}");

    // Calls that ask nothing are plain results.
    let r = call(&gw, json!(14), "s0__echo", json!({"text": "plain"}), json!({})).await;
    assert_eq!(text(&r), "plain");
    assert_eq!(r["result"]["resultType"], "complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_bound_to_its_principal_and_expires() {
    let n = unique("mrtr-x");
    let config = format!(
        "[gateway]\ninput_timeout = \"1s\"\n\n{}[clients.alice]\ntoken = \"alice-mrtr-token\"\n\n[clients.bob]\ntoken = \"bob-mrtr-token\"\n",
        server("s0", &n, &["--two-way"], ""),
    );
    let gw = Gateway::start(&config);
    let ask = |id: u64, extra: Value| {
        let mut p = json!({"name": "s0__ask_elicit", "arguments": {"message": "who?"}});
        if let Value::Object(e) = extra {
            for (k, v) in e {
                p[k] = v;
            }
        }
        (json!(id), p)
    };
    let (id, p) = ask(1, json!({}));
    let r = post(&gw, Some("alice-mrtr-token"), id, "tools/call", p).await;
    let (key, _, state) = question(&r);
    // Bob cannot use alice's state.
    let answer = json!({key.clone(): {"action": "decline"}});
    let (id, p) = ask(2, json!({"requestState": state, "inputResponses": answer}));
    refused(&post(&gw, Some("bob-mrtr-token"), id, "tools/call", p).await);

    // Unanswered past input_timeout: the parked call is cancelled downstream (the server
    // hears the cancellation and its question is withdrawn), and the state is refused.
    assert!(
        gw.wait_log("elicitation/create answered: error", T).await,
        "the server's question ended when the call expired: {}",
        gw.logs()
    );
    let (id, p) = ask(3, json!({"requestState": state, "inputResponses": answer}));
    refused(&post(&gw, Some("alice-mrtr-token"), id, "tools/call", p).await);
}

/// A slow call of a 2026-07-28 client that may be asked questions (`elicitation`: it runs in
/// rounds) or may not (no capabilities: it runs as any call), with a progress token or not.
fn slow_call(gw: &Gateway, caps: Value, progress: bool) -> reqwest::RequestBuilder {
    let mut params = json!({"name": "s0__slow", "arguments": {"seconds": 30, "steps": 30}});
    let mut md = meta(caps);
    if progress {
        md["progressToken"] = json!("p");
    }
    params["_meta"] = md;
    reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "s0__slow")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_call_whose_client_goes_away_is_cancelled() {
    for caps in [json!({}), json!({"elicitation": {}})] {
        // Gone after the first progress notification (the answer had become a stream).
        let n = unique("mrtr-gone");
        let gw = Gateway::start(&server("s0", &n, &[], ""));
        let r = slow_call(&gw, caps.clone(), true).send().await.unwrap();
        let mut m = Messages::new(r);
        let first = m.next(T).await.expect("a progress notification");
        assert_eq!(first["method"], "notifications/progress", "{first}");
        drop(m);
        assert!(
            gw.wait_log("[mock] cancelled", T).await,
            "{caps}: the server heard the cancellation: {}",
            gw.logs()
        );
        // Gone while the answer was still to come as plain JSON (nothing sent yet).
        let n = unique("mrtr-gone-json");
        let gw = Gateway::start(&server("s0", &n, &[], ""));
        let call = tokio::spawn(slow_call(&gw, caps.clone(), false).send());
        assert!(
            gw.wait_log("[mock] slow started", T).await,
            "{caps}: the call reached the server"
        );
        call.abort();
        assert!(
            gw.wait_log("[mock] cancelled", T).await,
            "{caps}: the server heard the cancellation of a JSON answer's call: {}",
            gw.logs()
        );
    }
}
