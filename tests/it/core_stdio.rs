//! `mcp-gateway stdio`: the gateway as a stdio MCP server over real children.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn assert_only_jsonrpc(gw: &StdioGateway) {
    let lines = gw.stdout.lock().unwrap().clone();
    assert!(!lines.is_empty());
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l:.200}"));
        assert_eq!(v["jsonrpc"], "2.0", "{l:.200}");
    }
}

#[test]
fn stdio_session_lists_calls_reports_progress_and_exits_on_eof() {
    let (n1, n2) = (unique("stdio-a"), unique("stdio-b"));
    let cfg = [server("a", &n1, &[], ""), server("b", &n2, &["--quirk", "noise"], "")].concat();
    let mut gw = StdioGateway::start(&cfg, &[("MCP_GATEWAY_LOG", "debug")]);
    let init = gw.initialize();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-gateway");

    let (_, list) = gw.request(json!(1), "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"a__echo") && names.contains(&"b__add"), "{names:?}");

    let (_, r) = gw.request(
        json!("call-1"),
        "tools/call",
        json!({"name": "a__echo", "arguments": {"text": "over stdio"}}),
    );
    assert_eq!(r["id"], "call-1");
    assert_eq!(text(&r), "over stdio");
    let (_, r) = gw.request(
        json!(2),
        "tools/call",
        json!({"name": "b__add", "arguments": {"a": 20, "b": 22}}),
    );
    assert_eq!(text(&r), "42");

    // A malformed line: -32700 with id null, and the session goes on.
    gw.send_raw("{this is not json");
    let m = gw.recv(T).expect("an answer to the malformed line");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(m["error"]["code"], -32700, "{m}");
    gw.send_raw(r#"{"jsonrpc":"2.0","id":1}"#);
    let m = gw.recv(T).unwrap();
    assert_eq!(
        (m["id"].clone(), m["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{m}"
    );

    // Progress with the client's tokens, string and integer.
    for (id, token) in [(json!(3), json!("progress-test-1")), (json!(4), json!(77))] {
        let (notes, r) = gw.request(
            id,
            "tools/call",
            json!({"name": "a__slow", "arguments": {"seconds": 0.3, "steps": 3}, "_meta": {"progressToken": token}}),
        );
        assert_eq!(text(&r), "done");
        let progress: Vec<&Value> = notes
            .iter()
            .filter(|n| n["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 3, "{notes:?}");
        assert!(
            progress.iter().all(|p| p["params"]["progressToken"] == token),
            "{progress:?}"
        );
    }
    let (_, r) = gw.request(json!(5), "ping", json!({}));
    assert_eq!(r["result"], json!({}));

    // stdout held only JSON-RPC; the logs (debug level, child stderr, noise) went to stderr.
    assert_only_jsonrpc(&gw);
    let logs = gw.logs();
    assert!(
        logs.contains("[mock] mock server"),
        "child stderr not in the log:\n{logs}"
    );
    assert!(logs.contains("not JSON-RPC"), "{logs}");

    assert_eq!(mock_pids(&n1).len(), 1);
    assert_eq!(mock_pids(&n2).len(), 1);
    gw.close_stdin();
    let status = gw.wait_exit(Duration::from_secs(10)).expect("gateway exits on EOF");
    assert!(status.success(), "{status:?}\n{}", gw.logs());
    assert!(
        mock_pids(&n1).is_empty() && mock_pids(&n2).is_empty(),
        "children left behind"
    );
    assert_only_jsonrpc(&gw);
}

#[test]
fn stdio_eof_with_a_call_in_flight_leaves_no_child() {
    let n = unique("stdio-eof");
    let mut gw = StdioGateway::start(&server("a", &n, &[], ""), &[]);
    gw.initialize();
    gw.send(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{
        "name":"a__slow","arguments":{"seconds":30,"steps":300},"_meta":{"progressToken":1}}}));
    let m = gw.recv(T).unwrap();
    assert_eq!(m["method"], "notifications/progress", "{m}");
    gw.close_stdin();
    gw.wait_exit(Duration::from_secs(10)).expect("gateway exits on EOF");
    assert!(mock_pids(&n).is_empty(), "child left behind");
    assert_only_jsonrpc(&gw);
}

#[test]
fn twenty_megabyte_result_arrives_intact_over_stdio() {
    let n = unique("stdio-big");
    let mut gw = StdioGateway::start(&server("b", &n, &[], ""), &[]);
    gw.initialize();
    let (_, r) = gw.request(
        json!(1),
        "tools/call",
        json!({"name": "b__big", "arguments": {"bytes": 20_000_000}}),
    );
    let t = r["result"]["content"][0]["text"].as_str().expect("text");
    assert_eq!(t.len(), 20_000_000);
    assert!(t.bytes().all(|b| b == b'x'));
    let (_, r) = gw.request(
        json!(2),
        "tools/call",
        json!({"name": "b__echo", "arguments": {"text": "after"}}),
    );
    assert_eq!(text(&r), "after");
}

/// A client that writes requests and never reads its answers is held up by its own full
/// pipe: past `max_in_flight` requests the gateway answers from its reader, which then
/// waits for stdout, so it stops reading stdin. (It ran each request in a task of its own
/// that waited for stdout, and read on: a gigabyte of tasks in seconds.) Once the client
/// reads, every request read is answered, in full.
#[test]
fn a_client_that_does_not_read_its_answers_stops_being_read() {
    use std::io::{BufRead, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let cfg = format!(
        "[gateway]\nmax_in_flight = 4\n\n{}",
        server("m", &unique("noread"), &[], "")
    );
    let RawStdio {
        mut child,
        mut stdin,
        mut stdout,
        _dir,
    } = RawStdio::start(&cfg, false);
    let mut line = String::new();
    const N: usize = 200_000;
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            for i in 1..=N {
                if writeln!(stdin, r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#).is_err() {
                    return;
                }
                written.store(i, Ordering::Relaxed);
            }
        })
    };
    // The writer stalls once the pipes fill up: no progress for half a second.
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = written.load(Ordering::Relaxed);
        if now == last || now == N {
            break;
        }
        last = now;
    }
    let stalled_at = written.load(Ordering::Relaxed);
    assert!(
        stalled_at < N / 2,
        "the gateway read {stalled_at} of {N} requests nobody read answers to"
    );
    // Reading now: each request is answered once, pong or refusal, in the order read.
    let mut answered = 0;
    while answered < stalled_at {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "stdout ended after {answered} answers"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(
            v.get("result").is_some()
                || v["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("max_in_flight"),
            "{v}"
        );
        answered += 1;
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.join();
}

/// The client's end of stdout breaks (it went away) while stdin stays open: the gateway
/// stops at its next answer, cancelling what is in flight, rather than running calls for
/// nobody until stdin ends.
#[test]
fn a_broken_stdout_stops_the_gateway_though_stdin_stays_open() {
    use std::io::Write;
    let name = unique("epipe");
    let cfg = server("m", &name, &[], "");
    let RawStdio {
        mut child,
        mut stdin,
        stdout,
        _dir,
    } = RawStdio::start(&cfg, true);
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"m__slow","arguments":{{"seconds":60}}}}}}"#
    )
    .unwrap();
    drop(stdout);
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"ping"}}"#).unwrap();
    stdin.flush().unwrap();
    let deadline = std::time::Instant::now() + T;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    assert!(status.is_some(), "still running with stdout broken:\n{err}");
    assert!(err.contains("stdout is closed"), "{err}");
    assert!(
        mock_pids(&name).into_iter().all(|p| !alive(p)),
        "its server is left running"
    );
    drop(stdin);
}

/// `mcp-gateway stdio` on `cfg` with raw pipes (no reader thread: the test decides when, and
/// whether, stdout is read), initialized. Its stderr is piped when `stderr`.
struct RawStdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    _dir: tempfile::TempDir,
}

impl RawStdio {
    fn start(cfg: &str, stderr: bool) -> RawStdio {
        use std::io::{BufRead, Write};
        use std::process::Stdio;
        let (dir, mut cmd) = gateway_command(cfg, &["stdio"], &[]);
        let err = if stderr { Stdio::piped() } else { Stdio::null() };
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(err);
        let mut child = cmd.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        writeln!(stdin, r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#).unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("\"id\":0"), "{line}");
        RawStdio {
            child,
            stdin,
            stdout,
            _dir: dir,
        }
    }
}
