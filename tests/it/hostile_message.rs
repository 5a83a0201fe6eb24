//! Messages a hostile or careless client can send (issue #13), over HTTP and over the
//! stdio front, against the real binary: ids come back as their own JSON text (answers,
//! progress, cancellation, a client's answers to a server's questions); `arguments` that
//! are not an object are refused without reaching the server; nesting, id, method and
//! name lengths are bounded; a 20 MB argument string still passes.
//!
//! The wire is read as text, not as `serde_json::Value`: a `Value` would itself turn
//! `1e2` into `100.0` and hide what the gateway wrote.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Ids whose text a `serde_json::Value` would change (or whose value it would lose),
/// and a string with an escape.
const IDS: &[&str] = &["1e2", "-0", "1.50", "-9223372036854775809", r#""a\u0062""#];

fn config(name: &str, extra_gateway: &str) -> String {
    format!("[gateway]\n{extra_gateway}\n{}", server("m", name, &["--two-way"], ""))
}

/// POSTs `body` as it is; returns the status and the whole answer as text (JSON, or SSE).
async fn post_raw(s: &Session, body: String) -> (u16, String) {
    s.post_text(body).await
}

fn call_body(id: &str, tool: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    )
}

/// The one JSON-RPC message of a JSON answer, or the last of an SSE one.
fn last_message(body: &str) -> Value {
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let text = data.last().copied().unwrap_or(body);
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:.300}"))
}

#[tokio::test]
async fn ids_come_back_byte_for_byte_over_http() {
    let gw = Gateway::start(&config(&unique("ids"), ""));
    let s = gw.session().await;
    for id in IDS {
        let (status, body) = post_raw(&s, call_body(id, "m__echo", r#"{"text":"hi"}"#)).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
            "{id}: {body}"
        );
        assert_eq!(text(&last_message(&body)), "hi");
        // Answered by the gateway itself, too.
        let (_, body) = post_raw(&s, format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#)).await;
        assert_eq!(body, format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#));
        // And an error.
        let (_, body) = post_raw(&s, call_body(id, "m__nope", "{}")).await;
        assert!(
            body.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"error":"#)),
            "{body}"
        );
    }
    // 1 and "1" are two ids, both in flight at once.
    let calls = ["1", r#""1""#].map(|id| {
        let s = &s;
        async move { post_raw(s, call_body(id, "m__slow", r#"{"seconds":0.5}"#)).await }
    });
    let [(_, a), (_, b)] = futures::future::join_all(calls).await.try_into().unwrap();
    // A slow call in a 2025-11-25 session may be answered as SSE: the answer's text is
    // then the data of its last event.
    assert!(a.contains(r#"{"jsonrpc":"2.0","id":1,"result""#), "{a}");
    assert!(b.contains(r#"{"jsonrpc":"2.0","id":"1","result""#), "{b}");
}

/// The line the server got with `needle` in it (its `log-lines` quirk), as it got it.
async fn server_line(gw: &Gateway, needle: &str) -> String {
    assert!(
        gw.wait_log(needle, Duration::from_secs(10)).await,
        "the server got no line with {needle}: {}",
        gw.logs()
    );
    let logs = gw.logs();
    let line = logs.lines().find(|l| l.contains(needle)).unwrap_or_default();
    line.split_once("[mock] line ").map_or(line, |(_, l)| l).to_owned()
}

/// A call's params reach the server as the client wrote them but for the name the gateway
/// routes on, its progress token and the whitespace between top-level members: values keep
/// every byte (numbers, escapes, inner whitespace, key order), a key written with escapes
/// arrives decoded, and a 2026-07-28 client's `_meta` loses only the envelope's own members
/// (the members of a `_meta` the gateway edits keep their bytes too).
#[tokio::test]
async fn call_params_reach_the_server_as_written_over_http() {
    let gw = Gateway::start(&format!(
        "[gateway]\n{}",
        server("m", &unique("params"), &["--two-way", "--quirk", "log-lines"], "")
    ));
    let s = gw.session().await;
    let arguments = r#"{ "text" : "p\u0031 caf\u00e9" , "n":1.50,"big" : [1e400, -0 ] }"#;
    let body = format!(
        r#"{{ "jsonrpc" : "2.0", "id" : 1 , "method" : "tools/call" , "params" : {{ "name" : "m__echo" ,
        "arguments" : {arguments} , "x\u0079" : {{ "k" : 1 }}, "_meta" : {{ "k" : [ 1.50 ] , "progressToken" : 7 }} }} }}"#
    );
    let (status, answer) = post_raw(&s, body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(text(&last_message(&answer)), "p1 café");
    let got = server_line(&gw, "p\\u0031").await;
    let want = format!(
        r#""params":{{"name":"echo","arguments":{arguments},"xy":{{ "k" : 1 }},"_meta":{{"k":[ 1.50 ],"progressToken":"#
    );
    assert!(got.contains(&want), "the server got {got}\nnot {want}");

    // A 2026-07-28 request: the envelope's members go, another `_meta` member stays.
    let meta = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}"#;
    for (n, (extra, kept)) in [("", None), (r#","k" : [ 2.50 ]"#, Some(r#","_meta":{"k":[ 2.50 ]}"#))]
        .into_iter()
        .enumerate()
    {
        let arguments = format!(r#"{{"text":"s{n}\u0021", "n":1.50}}"#);
        let body = format!(
            r#"{{"method":"tools/call","params":{{"name":"m__echo","arguments":{arguments},"_meta":{{{meta}{extra}}}}},"jsonrpc":"2.0","id":2}}"#
        );
        let mut request = reqwest::Client::new().post(&gw.url).body(body);
        for (name, value) in [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "m__echo"),
        ] {
            request = request.header(name, value);
        }
        let answer = request.send().await.unwrap().text().await.unwrap();
        assert_eq!(text(&last_message(&answer)), format!("s{n}!"), "{answer}");
        let got = server_line(&gw, &format!("s{n}\\u0021")).await;
        let want = format!(
            r#""params":{{"name":"echo","arguments":{arguments}{}}}"#,
            kept.unwrap_or("")
        );
        assert!(got.contains(&want), "the server got {got}\nnot {want}");
    }
}

#[tokio::test]
async fn progress_tokens_and_cancellations_keep_their_text_over_http() {
    let gw = Gateway::start(&config(&unique("progress"), ""));
    let s = gw.session().await;
    for token in ["1e2", "-0", r#""t\u0031""#] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"m__slow","arguments":{{"seconds":0.3,"steps":2}},"_meta":{{"progressToken":{token}}}}}}}"#
        );
        let (_, answer) = post_raw(&s, body).await;
        let progress: Vec<&str> = answer
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| d.contains("notifications/progress"))
            .collect();
        assert_eq!(progress.len(), 2, "{answer}");
        for p in progress {
            assert!(p.contains(&format!(r#""progressToken":{token}"#)), "{token}: {p}");
        }
    }
    // A cancellation names the request as the client wrote its id; the answer keeps it.
    let id = "1.50";
    let mut call = s
        .post()
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"m__slow","arguments":{{"seconds":30,"steps":300}},"_meta":{{"progressToken":{id}}}}}}}"#
        ))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("notifications/progress") {
        assert!(Instant::now() < deadline, "no progress: {seen}");
        let chunk = tokio::time::timeout(Duration::from_secs(10), call.chunk())
            .await
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("the stream ended")));
    }
    assert!(seen.contains(&format!(r#""progressToken":{id}"#)), "{seen}");
    let (status, _) = post_raw(
        &s,
        format!(r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#),
    )
    .await;
    assert_eq!(status, 202);
    let rest = tokio::time::timeout(Duration::from_secs(10), call.text())
        .await
        .unwrap()
        .unwrap();
    let answer = rest
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_default();
    assert!(
        answer.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"error":"#)),
        "{rest}"
    );
    assert_eq!(error_of(&serde_json::from_str(answer).unwrap())["code"], -32800);
    assert!(gw.wait_log("[mock] cancelled ", Duration::from_secs(5)).await);
}

/// Every kind of value `arguments` can be that is not an object.
const NOT_OBJECTS: &[(&str, &str)] = &[
    ("[]", "an array"),
    (r#""x""#, "a string"),
    ("1", "a number"),
    ("null", "null"),
    ("true", "a boolean"),
];

fn assert_refused_arguments(answer: &Value, method: &str, kind: &str) {
    let e = error_of(answer);
    assert_eq!(e["code"], -32602, "{answer}");
    // The gateway's own words (the mock would say "arguments must be an object").
    assert_eq!(
        e["message"],
        format!("{method}: params.arguments must be an object when present, not {kind}"),
        "{answer}"
    );
}

#[tokio::test]
async fn arguments_that_are_not_objects_are_refused_over_http() {
    let gw = Gateway::start(&config(&unique("args"), ""));
    let s = gw.session().await;
    for (args, kind) in NOT_OBJECTS {
        let (_, body) = post_raw(&s, call_body("3", "m__mark", args)).await;
        assert_refused_arguments(&last_message(&body), "tools/call", kind);
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{{"name":"m__greet","arguments":{args}}}}}"#
        );
        let (_, body) = post_raw(&s, body).await;
        assert_refused_arguments(&last_message(&body), "prompts/get", kind);
    }
    // Never forwarded: the server never ran the tool those calls named.
    assert!(!gw.logs().contains("[mock] mark"), "{}", gw.logs());
    // An object, or none at all, still goes through.
    assert_eq!(text(&s.call("m__echo", json!({"text": "ok"})).await), "ok");
    let r = s.request(json!(5), "tools/call", json!({"name": "m__echo"})).await;
    assert!(r.get("result").is_some(), "{r}");
    let r = s
        .request(
            json!(6),
            "prompts/get",
            json!({"name": "m__greet", "arguments": {"name": "Ada"}}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
}

/// `{"a":[[…]]}` nested to `levels` levels in all (the message's own object counting).
fn nested_args(levels: usize) -> String {
    // message, params, arguments: three levels; the array inside the rest.
    let arrays = levels - 3;
    format!(r#"{{"text":"deep","a":{}{}}}"#, "[".repeat(arrays), "]".repeat(arrays))
}

#[tokio::test]
async fn nesting_ids_methods_and_names_are_bounded_over_http() {
    let gw = Gateway::start(&config(&unique("bounds"), r#"max_body = "64MiB""#));
    let s = gw.session().await;
    // 64 levels pass; 65 are refused, as are a million (without a stack overflow).
    let (_, body) = post_raw(&s, call_body("1", "m__echo", &nested_args(64))).await;
    assert_eq!(text(&last_message(&body)), "deep", "{body:.300}");
    for levels in [65, 1_000_000] {
        let (status, body) = post_raw(&s, call_body("2", "m__echo", &nested_args(levels))).await;
        assert_eq!(status, 400, "{body:.300}");
        let e = last_message(&body);
        assert_eq!(error_of(&e)["code"], -32600, "{e}");
        assert!(
            error_of(&e)["message"]
                .as_str()
                .unwrap()
                .contains("more than 64 levels deep"),
            "{e}"
        );
    }
    // An id of 256 bytes of JSON passes; 257 is refused (the answer cannot use it).
    let id = format!("\"{}\"", "i".repeat(254));
    let (_, body) = post_raw(&s, format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#)).await;
    assert_eq!(body, format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#));
    let long = format!("\"{}\"", "i".repeat(255));
    let (status, body) = post_raw(&s, format!(r#"{{"jsonrpc":"2.0","id":{long},"method":"ping"}}"#)).await;
    assert_eq!(status, 400);
    let e = last_message(&body);
    assert_eq!(e["id"], Value::Null);
    assert_eq!(error_of(&e)["code"], -32600);
    assert!(
        error_of(&e)["message"]
            .as_str()
            .unwrap()
            .contains("\"id\" is 257 bytes"),
        "{e}"
    );
    // A method name of 257 bytes.
    let method = "m".repeat(257);
    let (status, body) = post_raw(&s, format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}"}}"#)).await;
    assert_eq!(status, 400);
    assert!(body.contains("\"method\\\" is 257 bytes"), "{body}");
    // A tool or prompt name of a megabyte: refused, and not echoed back.
    let name = "n".repeat(1 << 20);
    let (_, body) = post_raw(&s, call_body("3", &name, "{}")).await;
    let e = last_message(&body);
    assert_eq!(error_of(&e)["code"], -32602);
    assert_eq!(
        error_of(&e)["message"],
        "tools/call: params.name is 1048576 bytes, longer than the 256 allowed"
    );
    assert!(body.len() < 1000, "the name was echoed back");
    let body = format!(r#"{{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{{"name":"{name}"}}}}"#);
    let (_, body) = post_raw(&s, body).await;
    assert!(
        body.contains("prompts/get: params.name is 1048576 bytes"),
        "{body:.300}"
    );
    assert!(body.len() < 1000, "the name was echoed back");
    // A 20 MB argument string still goes through, there and back.
    let big = "x[{\\\"".repeat(5 << 20);
    let t = Instant::now();
    let (status, body) = post_raw(&s, call_body("5", "m__echo", &format!(r#"{{"text":"{big}"}}"#))).await;
    assert_eq!(status, 200);
    assert_eq!(text(&last_message(&body)).len(), 4 * (5 << 20));
    eprintln!("a 20 MB argument string: {:?} there and back", t.elapsed());
}

/// Waits for a stdout line of the stdio gateway that `pred` accepts.
fn line_where(gw: &StdioGateway, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = gw.stdout.lock().unwrap().iter().find(|l| pred(l)) {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no such line; stdout:\n{:.2000?}\nstderr:\n{}",
            gw.stdout.lock().unwrap(),
            gw.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn stdio_gateway(name: &str) -> StdioGateway {
    let mut gw = StdioGateway::start(&config(name, ""), &[]);
    gw.send_raw(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    line_where(&gw, |l| l.starts_with(r#"{"jsonrpc":"2.0","id":0,"result""#));
    gw.send_raw(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    gw
}

#[test]
fn ids_progress_cancellation_and_answers_keep_their_text_on_stdio() {
    let mut gw = stdio_gateway(&unique("stdio-ids"));
    for (n, id) in IDS.iter().enumerate() {
        gw.send_raw(&call_body(id, "m__echo", &format!(r#"{{"text":"e{n}"}}"#)));
        let line = line_where(&gw, |l| l.contains(&format!(r#""text":"e{n}""#)));
        assert!(
            line.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
            "{line}"
        );
    }
    // Progress, then a cancellation by the id's own text.
    gw.send_raw(
        r#"{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"name":"m__slow","arguments":{"seconds":30,"steps":300},"_meta":{"progressToken":1e2}}}"#,
    );
    let p = line_where(&gw, |l| l.contains("notifications/progress"));
    assert!(p.contains(r#""progressToken":1e2"#), "{p}");
    gw.send_raw(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":-0}}"#);
    // Reached the server (the stdio front, as the spec says, then sends no answer).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.logs().contains("[mock] cancelled ") {
        assert!(
            Instant::now() < deadline,
            "the cancellation did not reach the server: {}",
            gw.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A server's question: the client answers under the gateway's id, spelled its own way.
    gw.send_raw(&call_body("9", "m__ask_sampling", r#"{"prompt":"2+2?"}"#));
    let ask = line_where(&gw, |l| l.contains("sampling/createMessage"));
    let asked: Value = serde_json::from_str(&ask).unwrap();
    let gw_id = asked["id"].as_str().expect("a string id").to_owned();
    let spelled = format!("\"\\u{:04x}{}\"", u32::from(gw_id.as_bytes()[0]), &gw_id[1..]);
    gw.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":{spelled},"result":{{"role":"assistant","content":{{"type":"text","text":"four"}},"model":"m"}}}}"#
    ));
    let done = line_where(&gw, |l| l.starts_with(r#"{"jsonrpc":"2.0","id":9,"#));
    assert_eq!(text(&serde_json::from_str(&done).unwrap()), "four", "{done}");
}

#[test]
fn arguments_and_bounds_are_checked_on_stdio() {
    let mut gw = stdio_gateway(&unique("stdio-bounds"));
    for (n, (args, kind)) in NOT_OBJECTS.iter().enumerate() {
        let id = 100 + n;
        gw.send_raw(&call_body(&id.to_string(), "m__mark", args));
        let line = line_where(&gw, |l| l.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"#)));
        assert_refused_arguments(&serde_json::from_str(&line).unwrap(), "tools/call", kind);
    }
    assert!(!gw.logs().contains("[mock] mark"), "{}", gw.logs());
    gw.send_raw(&call_body("200", "m__echo", &nested_args(65)));
    let line = line_where(&gw, |l| l.contains("more than 64 levels deep"));
    let e: Value = serde_json::from_str(&line).unwrap();
    // On stdio the refusal comes under the request's id: the client is not left waiting.
    assert_eq!(
        (e["id"].clone(), error_of(&e)["code"].clone()),
        (json!(200), json!(-32600))
    );
    gw.send_raw(&call_body("201", "m__echo", &nested_args(64)));
    let line = line_where(&gw, |l| l.starts_with(r#"{"jsonrpc":"2.0","id":201,"#));
    assert_eq!(text(&serde_json::from_str(&line).unwrap()), "deep");
    gw.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"{}","method":"ping"}}"#,
        "i".repeat(300)
    ));
    let line = line_where(&gw, |l| l.contains("\\\"id\\\" is 302 bytes"));
    assert!(
        line.starts_with(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600"#),
        "{line}"
    );
    gw.send_raw(&call_body("202", &"n".repeat(300), "{}"));
    let line = line_where(&gw, |l| l.starts_with(r#"{"jsonrpc":"2.0","id":202,"#));
    assert!(
        line.contains("params.name is 300 bytes, longer than the 256 allowed"),
        "{line}"
    );
}

#[tokio::test]
async fn a_listen_streams_subscription_id_keeps_its_text() {
    let gw = Gateway::start(&config(&unique("listen"), ""));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1e2,"method":"subscriptions/listen","params":{{"notifications":{{"toolsListChanged":true}},"_meta":{}}}}}"#,
        stateless_meta("hostile")
    );
    let mut r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("the stream ended")));
    }
    assert!(seen.contains("notifications/subscriptions/acknowledged"), "{seen}");
    assert!(
        seen.contains(r#""io.modelcontextprotocol/subscriptionId":1e2"#),
        "{seen}"
    );
}

/// A refusal is logged with the client's text quoted: a method name holding a line break
/// does not make a log line of its own (stdio front, 2026-07-28, debug logs).
#[test]
fn a_refused_method_name_cannot_forge_a_log_line() {
    use std::io::Write;
    let (_dir, mut cmd) = gateway_command("", &["stdio"], &[("MCP_GATEWAY_LOG", "debug")]);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let forged = "x\nFORGED gateway line";
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": forged, "params": {"_meta": stateless_meta("forge")}});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{req}").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("-32601"), "refused: {stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refused"), "the refusal is logged: {stderr}");
    assert!(
        !stderr.lines().any(|l| l.starts_with("FORGED")),
        "a client's text made a log line:\n{stderr}"
    );
}
