//! Hostile input against the pipes to stdio children, with the real binary: bytes that
//! would change the framing towards a child (request smuggling), bursts that filled both
//! pipes of a child at once (a deadlock that killed the server for good), a stopped
//! child (degraded, then restarted), and a shutdown that must end within its grace.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

/// The sequential Python echo fixture: it answers each line before it reads the next.
fn echo_server(table: &str, extra: &str) -> String {
    format!(
        "[servers.{table}]\ncommand = \"python3\"\nargs = [\"tests/fixtures/echo_server.py\", {table:?}]\ncwd = {:?}\n{extra}\n",
        repo().display().to_string()
    )
}

/// POSTs `body` (any bytes) in session `s` on a connection of its own; the messages back.
async fn post_raw(s: &Session, client: &reqwest::Client, body: String) -> Vec<Value> {
    let r = client
        .post(&s.url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
        .send()
        .await
        .expect("post");
    read_messages(r).await
}

/// A client that opens a new connection for every request.
fn one_shot_client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

fn echo_call(id: usize, text: &str) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"e__echo","arguments":{"text":text}}})
        .to_string()
}

/// `n` concurrent echo calls of `size` bytes each on connections of their own: every one
/// is answered (its own text back, or a "busy" error naming the server), none times out.
async fn burst(s: &Session, n: usize, size: usize) -> (usize, usize) {
    let client = one_shot_client();
    let calls = (0..n).map(|i| {
        let (client, text) = (client.clone(), format!("{i}:{}", "x".repeat(size)));
        async move {
            let msgs = post_raw(s, &client, echo_call(i, &text)).await;
            let last = msgs.last().cloned().unwrap_or(Value::Null);
            assert_eq!(last["id"], i, "{last:.300}");
            if last.get("result").is_some() {
                assert_eq!(text_of(&last), text);
                (1, 0)
            } else {
                let msg = last["error"]["message"].as_str().unwrap_or_default().to_owned();
                assert!(msg.contains("server 'e' is busy"), "{msg}");
                (0, 1)
            }
        }
    });
    let all = tokio::time::timeout(T, futures::future::join_all(calls))
        .await
        .expect("the burst was not answered in time");
    all.into_iter().fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
}

fn text_of(resp: &Value) -> String {
    text(resp)
}

/// After a burst: a call answered within a second, and SIGTERM ends the gateway within
/// `shutdown_grace` + 1 s.
async fn then_answers_and_stops(mut gw: Gateway, s: &Session, grace: Duration) {
    let began = Instant::now();
    let r = s.call("e__echo", json!({"text": "after"})).await;
    assert_eq!(text(&r), "after");
    assert!(began.elapsed() < Duration::from_secs(1), "took {:?}", began.elapsed());
    let st = gw.server_status("e").await;
    assert_eq!(st["state"], "ready", "{st}");
    let began = Instant::now();
    gw.terminate();
    assert!(
        began.elapsed() < grace + Duration::from_secs(1),
        "SIGTERM took {:?}",
        began.elapsed()
    );
}

/// The server of a burst: one client's calls may all be in flight at once (the burst is
/// about the pipes, not `max_calls_per_client`).
const BURST: &str = "timeout = \"20s\"\nmax_calls_per_client = 5000";

#[tokio::test]
async fn a_burst_of_a_thousand_calls_does_not_deadlock_the_pipe() {
    let cfg = format!(
        "[gateway]\nmax_in_flight = 5000\nshutdown_grace = \"2s\"\n{}",
        echo_server("e", BURST)
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let (ok, busy) = burst(&s, 1000, 2000).await;
    assert_eq!(ok + busy, 1000);
    assert!(ok > 0, "every call was refused");
    then_answers_and_stops(gw, &s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_burst_of_large_calls_does_not_deadlock_the_pipe() {
    let cfg = format!(
        "[gateway]\nmax_in_flight = 5000\nshutdown_grace = \"2s\"\n{}",
        echo_server("e", BURST)
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let (ok, busy) = burst(&s, 600, 20_000).await;
    assert_eq!(ok + busy, 600);
    assert!(ok > 0);
    then_answers_and_stops(gw, &s, Duration::from_secs(2)).await;
}

fn child_pid(st: &Value) -> i32 {
    st["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {st}")) as i32
}

fn signal(pid: i32, sig: i32) {
    unsafe {
        libc::kill(pid, sig);
    }
}

#[tokio::test]
async fn calls_queued_at_a_stopped_child_are_answered_once_it_continues() {
    let cfg = format!(
        "[gateway]\nmax_in_flight = 5000\nshutdown_grace = \"2s\"\n{}",
        echo_server("e", &format!("{BURST}\nstall_timeout = \"60s\""))
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let pid = child_pid(&gw.server_status("e").await);
    signal(pid, libc::SIGSTOP);
    let client = one_shot_client();
    let calls = (0..200).map(|i| {
        let client = client.clone();
        let s = &s;
        async move {
            let text = format!("{i}:{}", "y".repeat(20_000));
            let msgs = post_raw(s, &client, echo_call(i, &text)).await;
            let last = msgs.last().cloned().unwrap_or(Value::Null);
            (last.get("result").is_some() && text_of(&last) == text) as usize
        }
    });
    let resume = async {
        // The calls reach the gateway and fill both pipes while the child is stopped
        // (there is no event for "full"; 1.5 s is ample for 200 local POSTs).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        signal(pid, libc::SIGCONT);
    };
    let (answered, ()) = tokio::join!(
        async {
            tokio::time::timeout(T, futures::future::join_all(calls))
                .await
                .expect("not answered")
        },
        resume
    );
    assert_eq!(answered.iter().sum::<usize>(), 200);
    then_answers_and_stops(gw, &s, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn past_the_outbox_bound_a_call_is_refused_as_busy_at_once() {
    // 7 MB arguments to a stopped child: a few fit in the 16 MiB bound, the rest are
    // refused at once, with the server's name, not after the timeout.
    let cfg = format!(
        "[gateway]\nmax_body = \"64MiB\"\nshutdown_grace = \"2s\"\n{}",
        echo_server("e", "timeout = \"20s\"\nstall_timeout = \"60s\"")
    );
    let gw = Gateway::start(&cfg);
    let s = std::sync::Arc::new(gw.session().await);
    let pid = child_pid(&gw.server_status("e").await);
    signal(pid, libc::SIGSTOP);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let msgs = post_raw(&s, &one_shot_client(), echo_call(i, &"z".repeat(7 << 20))).await;
                msgs.last().cloned().unwrap_or(Value::Null)
            })
        })
        .collect();
    // The refusals come at once, while the child is still stopped.
    let early = until(Duration::from_secs(10), || {
        calls.iter().filter(|c| c.is_finished()).count() >= 2
    })
    .await;
    let finished: Vec<bool> = calls.iter().map(|c| c.is_finished()).collect();
    signal(pid, libc::SIGCONT);
    assert!(early, "no call was refused while the child was stopped");
    let mut answers = Vec::new();
    for c in calls {
        answers.push(tokio::time::timeout(T, c).await.expect("answered").unwrap());
    }
    for (a, early) in answers.iter().zip(finished) {
        if early {
            let msg = a["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("server 'e' is busy"), "{a:.300}");
            // It says what waits: at least one 7 MB message, whether still in the outbox
            // or handed to the writer.
            let said = msg.split("is busy: ").nth(1).unwrap_or_default();
            let (n, rest) = said.split_once(" messages (").unwrap_or_default();
            let kib = rest.split_once(" KiB)").unwrap_or_default().0;
            assert!(n.parse::<usize>().is_ok_and(|n| n >= 1), "{msg}");
            assert!(kib.parse::<usize>().is_ok_and(|k| k >= 7 << 10), "{msg}");
        }
    }
    assert!(answers.iter().any(|a| a.get("result").is_some()), "none was served");
}

#[tokio::test]
async fn a_stopped_child_is_degraded_then_restarted() {
    let cfg = format!(
        "[gateway]\nshutdown_grace = \"2s\"\n{}",
        echo_server("e", "timeout = \"1s\"\nstall_timeout = \"3s\"")
    );
    let mut gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let pid = child_pid(&gw.server_status("e").await);
    signal(pid, libc::SIGSTOP);
    let r = s.call("e__echo", json!({"text": "into the void"})).await;
    let msg = r["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("server 'e'"), "{r}");
    let base = gw.base.clone();
    let mut degraded = false;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && !degraded {
        let st = gw.server_status("e").await;
        degraded = st["state"] == "degraded";
        if !degraded {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(degraded, "never degraded: {}", gw.server_status("e").await);
    let ready = reqwest::get(format!("{base}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503);
    // After stall_timeout it is killed and started again.
    let mut new_pid = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && new_pid.is_none() {
        let st = gw.server_status("e").await;
        if st["state"] == "ready" && st["pid"].as_i64().is_some_and(|p| p as i32 != pid) {
            new_pid = Some(child_pid(&st));
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(new_pid.is_some(), "not restarted: {}", gw.server_status("e").await);
    assert!(gw.wait_log("stalled", Duration::from_secs(10)).await, "{}", gw.logs());
    let r = s.call("e__echo", json!({"text": "back"})).await;
    assert_eq!(text(&r), "back");
    assert_eq!(reqwest::get(format!("{base}/readyz")).await.unwrap().status(), 200);
    assert!(!alive(pid) || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(" Z ")));
    gw.terminate();
}

#[tokio::test]
async fn a_healthy_child_that_ignores_a_cancelled_call_is_not_restarted() {
    // The mock honours cancellation and says nothing more; the gateway's ping shows it
    // is alive, so it is neither degraded for long nor restarted.
    let name = unique("cancel-quiet");
    let cfg = format!(
        "{}timeout = \"1s\"\nstall_timeout = \"2s\"\n",
        server("m", &name, &[], "")
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let pid = child_pid(&gw.server_status("m").await);
    let r = s.call("m__slow", json!({"seconds": 30, "steps": 0})).await;
    assert!(r.get("error").is_some() || r["result"]["isError"] == true, "{r}");
    // Past stall_timeout, checked against the clock: the same process still serves.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = gw.server_status("m").await;
    assert_eq!(child_pid(&st), pid, "{st}");
    let r = s.call("m__echo", json!({"text": "still here"})).await;
    assert_eq!(text(&r), "still here");
}

#[tokio::test]
async fn raw_newlines_in_arguments_cannot_smuggle_messages_into_a_child() {
    // A client allowed only sec__echo hides a whole request to the secret-revealing tool
    // behind a raw LF (legal JSON whitespace) inside its arguments.
    let name = unique("smuggle");
    let cfg = format!(
        "[clients.mallory]\ntoken = \"mallory-token\"\nallow = [\"sec__echo\"]\n\n{}env = {{ SECRET = \"hunter2-secret\" }}\n",
        server("sec", &name, &[], "")
    );
    let gw = Gateway::start(&cfg);
    let http = reqwest::Client::new();
    let post = |body: String, session: Option<String>| {
        let mut b = http
            .post(&gw.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("authorization", "Bearer mallory-token")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(id) = session {
            b = b.header("mcp-session-id", id);
        }
        b.body(body).send()
    };
    let init = post(
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"m","version":"1"}}}).to_string(),
        None,
    )
    .await
    .unwrap();
    let sid = init.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let smuggled = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"env","arguments":{{"name":"SECRET"}}}}}}"#
        )
    };
    let body = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"sec__echo\",\"arguments\":{{\"text\":\"harmless\",\"pad\":\n{}\n,\"more\":\r\n{}\n}}}}}}",
        smuggled(1),
        smuggled(2)
    );
    serde_json::from_str::<Value>(&body).expect("the attack is valid JSON");
    let r = read_messages(post(body, Some(sid.clone())).await.unwrap()).await;
    let last = r.last().unwrap();
    assert_eq!(last["id"], 2, "{last}");
    assert_eq!(text(last), "harmless", "{last}");
    assert!(!last.to_string().contains("hunter2"), "{last}");
    // And a pretty-printed request is one message to the child, answered at once.
    let pretty = serde_json::to_string_pretty(&json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
        "params":{"name":"sec__echo","arguments":{"text":"pretty\nprinted"}}}))
    .unwrap();
    assert!(pretty.contains('\n'));
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        read_messages(post(pretty, Some(sid.clone())).await.unwrap()).await
    })
    .await
    .expect("a pretty-printed request timed out");
    assert_eq!(text(r.last().unwrap()), "pretty\nprinted");
    // The child never ran the smuggled call: nothing but the echo reached its tools.
    assert!(!gw.logs().contains("hunter2"), "the secret reached the log");
}

/// A child that asks its client far more questions than the client answers: past the
/// bound, each gets an error at once from the gateway, rather than a task waiting each.
#[tokio::test]
async fn a_server_asking_faster_than_clients_answer_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("asker.py");
    std::fs::write(
        &script,
        r#"import json, sys
N = 300
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
answered = refused = 0
call = None
for line in sys.stdin:
    m = json.loads(line)
    method = m.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": m["params"]["protocolVersion"],
              "capabilities": {"tools": {}}, "serverInfo": {"name": "asker", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": [{"name": "ask", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        call = m["id"]
        for i in range(N):
            send({"jsonrpc": "2.0", "id": "q%d" % i, "method": "roots/list"})
    elif method is None and "id" in m:
        answered += 1
        if "already answering" in json.dumps(m.get("error", {})):
            refused += 1
        if refused == N - 64:
            send({"jsonrpc": "2.0", "id": call, "result": {"content": [{"type": "text", "text": str(refused)}]}})
"#,
    )
    .unwrap();
    let cfg = format!(
        "[servers.a]\ncommand = \"python3\"\nargs = [{:?}]\ntimeout = \"10s\"\n",
        script.display().to_string()
    );
    let gw = Gateway::start(&cfg);
    // The client can be asked for roots, and never answers.
    let s = Session::open_with(&gw.url, json!({"roots": {}})).await;
    let msgs = tokio::time::timeout(
        T,
        s.request_all(json!(1), "tools/call", json!({"name": "a__ask", "arguments": {}})),
    )
    .await
    .expect("the call was not answered");
    let last = msgs.last().unwrap();
    assert_eq!(text(last), "236", "{last:.300}");
    let asked = msgs.iter().filter(|m| m["method"] == "roots/list").count();
    assert!(asked <= 64, "{asked} questions reached the client");
}

/// A server's answer that is not JSON (a byte that is not UTF-8, a raw control character
/// in a string) but whose id the gateway can still read fails that call at once, with
/// an error naming the server, instead of leaving it to wait for `request_timeout`; the
/// server stays in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_broken_answer_fails_its_call_at_once() {
    let cfg = format!(
        "[gateway]\nrequest_timeout = \"40s\"\n\n{}",
        server("m", &unique("broken"), &["--quirk", "broken-answers"], "")
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    for text in ["broken", "broken string id"] {
        let started = Instant::now();
        let r = s.call("m__echo", json!({ "text": text })).await;
        assert!(started.elapsed() < T, "answered after {:?}", started.elapsed());
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("server 'm'") && message.contains("not valid JSON"),
            "{text}: {r}"
        );
    }
    assert_eq!(text(&s.call("m__echo", json!({"text": "whole"})).await), "whole");
}
