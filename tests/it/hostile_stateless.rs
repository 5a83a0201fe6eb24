//! A hostile 2026-07-28 (stateless) downstream server and the bridge that asks its
//! `input_required` questions of a handshake-era client: how many questions a round may
//! ask, how long the rounds may take, which questions may be asked at all, and that every
//! refusal names the server (`tests/fixtures/stateless_hostile.py`).

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// The hostile fixture as the stdio server `evil`, plus `extra` toml for its table.
fn evil(extra: &str) -> String {
    format!(
        "[servers.evil]\ncommand = {:?}\nargs = [{:?}]\nprefix = \"\"\n{extra}\n",
        path_str(&repo().join(".venv/bin/python")),
        path_str(&repo().join("tests/fixtures/stateless_hostile.py")),
    )
}

/// Reads `m` to its response, answering every roots/list question with no roots and
/// every elicitation/create with `accept`; the response and how many questions were asked.
async fn answering_roots(s: &Session, m: &mut Messages) -> (Value, usize) {
    let mut asked = 0;
    loop {
        let msg = m
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("no response after {asked} questions"));
        let answer = match msg["method"].as_str() {
            Some("roots/list") => json!({"roots": []}),
            Some("elicitation/create") => json!({"action": "accept"}),
            Some("sampling/createMessage") => {
                json!({"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"})
            }
            Some(_) => continue,
            None if msg.get("id").is_some() => return (msg, asked),
            None => continue,
        };
        asked += 1;
        let r = s
            .post()
            .json(&json!({"jsonrpc":"2.0","id":msg["id"],"result":answer}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
}

/// A server may not make the gateway ask a client thousands of questions in one round:
/// each would be one more request on the client's stream (and one more answer carried
/// in the retry). Past the bound the call fails at once, naming the server, and the
/// client is asked nothing.
#[tokio::test]
async fn a_round_of_too_many_questions_is_refused_naming_the_server() {
    let gw = Gateway::start(&evil(""));
    let s = Session::open_with(&gw.url, json!({"roots": {}})).await;
    // A modest round is asked as before.
    let mut m = s
        .start(
            json!(1),
            "tools/call",
            json!({"name": "ask_many", "arguments": {"n": 3}}),
        )
        .await;
    let (r, asked) = answering_roots(&s, &mut m).await;
    assert_eq!(asked, 3, "{r}");
    assert!(text(&r).starts_with("answered 3"), "{r}");
    // Two hundred in one round: refused before any is asked.
    let mut m = s
        .start(
            json!(2),
            "tools/call",
            json!({"name": "ask_many", "arguments": {"n": 200}}),
        )
        .await;
    let (r, asked) = answering_roots(&s, &mut m).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'evil'") && msg.contains("200"), "{r}");
    assert_eq!(asked, 0, "no question of an oversized round reaches the client: {r}");
}

/// The server's `timeout` covers the whole bridged call, the time its questions wait for
/// the client included (as it does a handshake-era server's own questions): a client that
/// does not answer gets the question withdrawn and an error naming the server, instead of
/// the call hanging for the ten minutes a question may wait.
#[tokio::test]
async fn a_question_the_client_leaves_unanswered_ends_at_the_servers_timeout() {
    let gw = Gateway::start(&evil("timeout = \"1s\""));
    let s = Session::open_with(&gw.url, json!({"elicitation": {}})).await;
    let mut m = s
        .start(json!(1), "tools/call", json!({"name": "ask_elicit", "arguments": {}}))
        .await;
    let ask = m.next(WAIT).await.expect("the question");
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    // Not answered: the call ends on its own, long before the question's own 600 s.
    let (notes, r) = m.response(WAIT).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'evil'") && msg.contains("1s"), "{r}");
    // The client was told the question is withdrawn.
    assert!(
        notes
            .iter()
            .any(|n| n["method"] == "notifications/cancelled" && n["params"]["requestId"] == ask["id"]),
        "{notes:?}"
    );
}

/// A question of a kind a server may not ask (anything but sampling, elicitation and
/// roots), or whose params are no object, fails the call with an error naming the server
/// and what it asked; the client is asked nothing. A client lacking the capability for a
/// question gets the refusal naming the server too, not a bare -32601 for its tools/call.
#[tokio::test]
async fn a_question_the_server_may_not_ask_fails_naming_the_server() {
    let gw = Gateway::start(&evil(""));
    let s = Session::open_with(&gw.url, json!({"roots": {}})).await;
    for (args, want) in [
        (json!({"method": "tools/call", "params": {"name": "x"}}), "tools/call"),
        (json!({"method": "ping\u{1b}[2J"}), "ping"),
        (json!({"method": 7}), "no method"),
        (json!({"method": "roots/list", "params": "nope"}), "params"),
        (
            json!({"method": "elicitation/create", "params": {"message": "hi"}}),
            "elicitation",
        ),
    ] {
        let mut m = s
            .start(json!(1), "tools/call", json!({"name": "ask_kind", "arguments": args}))
            .await;
        let (r, asked) = answering_roots(&s, &mut m).await;
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("server 'evil'") && msg.contains(want), "{args}: {r}");
        assert!(!msg.contains('\u{1b}'), "{r}");
        assert_eq!(asked, 0, "{r}");
    }
}

/// A tool a stateless server lists with an invalid `x-mcp-header` is dropped and the drop
/// logged, naming the tool and the header by their first 256 bytes and their length: a
/// server with a 1 MiB name and header cannot write megabytes into the gateway's log on
/// every listing (as its names elsewhere and its stderr lines cannot).
#[tokio::test]
async fn a_dropped_tools_huge_name_and_header_are_cut_in_the_log() {
    let config = format!(
        "[servers.evil]\ncommand = {:?}\nargs = [{:?}, \"--long-bad-header\"]\nprefix = \"\"\n",
        path_str(&repo().join(".venv/bin/python")),
        path_str(&repo().join("tests/fixtures/stateless_hostile.py")),
    );
    let gw = Gateway::start(&config);
    assert!(
        gw.wait_log("dropping a tool with an invalid x-mcp-header", WAIT).await,
        "{:.2000}",
        gw.logs()
    );
    let names = gw.session().await.tool_names().await;
    assert!(names.iter().any(|n| n == "ask_many"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("LONGBAD")), "dropped");
    let logs = gw.logs();
    let drop = logs
        .lines()
        .find(|l| l.contains("dropping a tool with an invalid x-mcp-header"))
        .unwrap();
    assert!(drop.len() < 8192, "a log line of {} bytes: {:.300}", drop.len(), drop);
    assert!(drop.contains(&format!("({} bytes)", (1 << 20) + 7)), "{drop:.600}");
}

/// On stdio a 2026-07-28 server ends a `subscriptions/listen` stream with
/// `notifications/cancelled` naming it (the only request a server may cancel). The
/// gateway takes that as the stream's end and opens it again (after its pause), instead
/// of waiting on it for good while the server tells it nothing more (every later
/// list_changed lost).
#[tokio::test]
async fn a_listen_stream_the_server_cancels_is_opened_again() {
    let config = format!(
        "[servers.evil]\ncommand = {:?}\nargs = [{:?}, \"--end-listen\"]\nprefix = \"\"\n",
        path_str(&repo().join(".venv/bin/python")),
        path_str(&repo().join("tests/fixtures/stateless_hostile.py")),
    );
    let gw = Gateway::start(&config);
    let listens = || gw.logs().matches(r#""method":"subscriptions/listen""#).count();
    assert!(
        until(WAIT, || listens() >= 2).await,
        "the ended stream was not opened again: {} listen(s)\n{:.3000}",
        listens(),
        gw.logs()
    );
}

/// A server may answer `input_required` only to tools/call, prompts/get and
/// resources/read. Its `input_required` to another request of a handshake-era client
/// (which cannot take one, and whose call the bridge does not run for such a method) is
/// an error naming the server, not a result the client cannot read.
#[tokio::test]
async fn an_input_required_to_a_request_that_may_not_ask_is_an_error_naming_the_server() {
    let gw = Gateway::start(&evil(""));
    let s = Session::open_with(&gw.url, json!({"roots": {}})).await;
    let mut m = s
        .start(
            json!(1),
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": "x"}}),
        )
        .await;
    let (r, asked) = answering_roots(&s, &mut m).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("server 'evil'") && msg.contains("input_required") && msg.contains("completion/complete"),
        "{r}"
    );
    assert_eq!(asked, 0, "{r}");
}

/// A client that declared `elicitation: {}` (form mode only, as the 2025-11-25 spec reads
/// an empty object) or only `form` is not sent a URL-mode elicitation a server asks
/// (servers MUST NOT send a mode the client does not support: a link to follow, shown by
/// a client that does not expect one): the call fails naming the server and the mode,
/// with the spec's -32602. A client that declared `url` is asked it.
#[tokio::test]
async fn a_url_elicitation_reaches_only_a_client_that_declared_url_mode() {
    let gw = Gateway::start(&evil(""));
    for caps in [json!({"elicitation": {}}), json!({"elicitation": {"form": {}}})] {
        let s = Session::open_with(&gw.url, caps.clone()).await;
        let mut m = s
            .start(
                json!(1),
                "tools/call",
                json!({"name": "ask_url", "arguments": {"id": "el-1"}}),
            )
            .await;
        let (r, asked) = answering_roots(&s, &mut m).await;
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("server 'evil'") && msg.contains("url"), "{caps}: {r}");
        assert_eq!(r["error"]["code"], -32602, "{r}");
        assert_eq!(asked, 0, "{caps}: {r}");
    }
    let s = Session::open_with(&gw.url, json!({"elicitation": {"url": {}}})).await;
    let mut m = s
        .start(
            json!(1),
            "tools/call",
            json!({"name": "ask_url", "arguments": {"id": "el-1"}}),
        )
        .await;
    let (r, asked) = answering_roots(&s, &mut m).await;
    assert_eq!(asked, 1, "{r}");
    assert!(text(&r).starts_with("answered 1"), "{r}");
}

/// The same deadline over Streamable HTTP, with the Python SDK's 2026-07-28 server: a
/// question the client leaves unanswered is withdrawn at the server's `timeout` and the
/// call fails naming the server.
#[tokio::test]
async fn over_http_an_unanswered_question_ends_at_the_servers_timeout() {
    let fixture = path_str(&repo().join("tests/fixtures/conformance_server.py"));
    let python = path_str(&repo().join(".venv/bin/python"));
    let server = Proc::start(&python, &[&fixture, "--http", "0"], &[]).await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let gw = Gateway::start(&format!(
        "[servers.remote]\nurl = {url:?}\nprefix = \"\"\ntimeout = \"1s\"\n"
    ));
    assert_eq!(gw.server_status("remote").await["protocolVersion"], "2026-07-28");
    let s = Session::open_with(&gw.url, json!({"elicitation": {}})).await;
    let mut m = s
        .start(
            json!(1),
            "tools/call",
            json!({"name": "test_input_required_result_elicitation", "arguments": {}}),
        )
        .await;
    let ask = m.next(WAIT).await.expect("the question");
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let (notes, r) = m.response(WAIT).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'remote'") && msg.contains("1s"), "{r}");
    assert!(
        notes.iter().any(|n| n["method"] == "notifications/cancelled"),
        "{notes:?}"
    );
    drop(server);
}

/// Sampling a server asks through the gateway: `includeContext` other than "none" reaches
/// the client as "none", whatever the client declared (through the gateway "thisServer"
/// is every server behind it, so a server would get the others' context in its answer;
/// a client MAY ignore the request, so the gateway does), and `tools` reach only a client
/// that declared `sampling.tools` (servers MUST NOT send them otherwise: -32602, naming
/// the server, and the client is asked nothing).
#[tokio::test]
async fn sampling_cannot_reach_past_the_asking_server() {
    let gw = Gateway::start(&evil(""));
    let messages = json!([{"role": "user", "content": {"type": "text", "text": "hi"}}]);
    let context = Session::open_with(&gw.url, json!({"sampling": {"context": {}}})).await;
    for include in ["thisServer", "allServers"] {
        let args = json!({"method": "sampling/createMessage",
            "params": {"messages": messages, "maxTokens": 5, "includeContext": include}});
        let mut m = context
            .start(json!(1), "tools/call", json!({"name": "ask_kind", "arguments": args}))
            .await;
        let ask = m.next(WAIT).await.expect("the question");
        assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
        assert_eq!(ask["params"]["includeContext"], "none", "{include}: {ask}");
        assert_eq!(ask["params"]["maxTokens"], 5, "the rest as the server sent it: {ask}");
        let answer = json!({"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"});
        let r = context
            .post()
            .json(&json!({"jsonrpc":"2.0","id":ask["id"],"result":answer}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let (_, r) = m.response(WAIT).await;
        assert!(text(&r).starts_with("answered 1"), "{r}");
    }
    let tools = json!({"method": "sampling/createMessage", "params": {"messages": messages, "maxTokens": 5,
        "tools": [{"name": "t", "inputSchema": {"type": "object"}}]}});
    let mut m = context
        .start(
            json!(2),
            "tools/call",
            json!({"name": "ask_kind", "arguments": tools.clone()}),
        )
        .await;
    let (r, asked) = answering_roots(&context, &mut m).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'evil'") && msg.contains("sampling.tools"), "{r}");
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(asked, 0, "{r}");
    // Declared: asked.
    let able = Session::open_with(&gw.url, json!({"sampling": {"tools": {}}})).await;
    let mut m = able
        .start(json!(3), "tools/call", json!({"name": "ask_kind", "arguments": tools}))
        .await;
    let (r, asked) = answering_roots(&able, &mut m).await;
    assert_eq!((asked, text(&r).starts_with("answered 1")), (1, true), "{r}");
}

/// A 2026-07-28 tools/call of `evil`'s `ask_kind` from a stateless client that declared
/// `capabilities`: the response.
async fn stateless_ask(gw: &Gateway, capabilities: Value, method: &str, params: Value) -> Value {
    let mut meta = stateless_meta("asker");
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    let arguments = json!({"method": method, "params": params});
    stateless_tool_call(&gw.url, None, meta, json!(1), "ask_kind", arguments).await
}

/// A 2026-07-28 client asks a server's questions itself, so the gateway passes the
/// server's `input_required` on; it checks them first as the bridge does for a
/// handshake-era client: a question of a capability (or elicitation mode, or sampling with
/// tools) the client did not declare, or of a method a server may not ask, fails the call
/// naming the server, and a sampling question's `includeContext` becomes "none" (through
/// the gateway the asking server's context is every server's).
#[tokio::test]
async fn a_stateless_clients_questions_are_only_what_it_declared_and_sampling_sees_no_other_server() {
    let gw = Gateway::start(&evil(""));
    let sampling = json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                          "maxTokens": 5, "includeContext": "allServers"});
    let r = stateless_ask(&gw, json!({}), "sampling/createMessage", sampling.clone()).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("server 'evil'") && msg.contains("did not declare the sampling capability"),
        "{r}"
    );
    let r = stateless_ask(&gw, json!({"sampling": {}}), "sampling/createMessage", sampling).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let asked = &r["result"]["inputRequests"]["q"];
    assert_eq!(asked["method"], "sampling/createMessage", "{r}");
    assert_eq!(asked["params"]["includeContext"], "none", "{r}");
    assert_eq!(asked["params"]["maxTokens"], 5, "{r}");
    assert_eq!(
        r["result"]["requestState"], "hostile-state",
        "the server's own state: {r}"
    );
    // A URL elicitation to a client that declared form mode only.
    let url = json!({"mode": "url", "elicitationId": "u1", "url": "https://example.com/x", "message": "go"});
    let r = stateless_ask(&gw, json!({"elicitation": {}}), "elicitation/create", url).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'evil'") && msg.contains("elicitation.url"), "{r}");
    // A method no server may ask a client.
    let r = stateless_ask(&gw, json!({"sampling": {}}), "tools/call", json!({})).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'evil'") && msg.contains("tools/call"), "{r}");
}
