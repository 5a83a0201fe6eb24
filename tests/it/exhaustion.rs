//! Resource exhaustion: what many sessions, many connections and misbehaving children
//! can make the gateway hold. Each test runs the real binary on loopback with real
//! children, and bounds what it measures generously (RSS, open files).

use crate::common::*;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Resident memory (KiB) of process `pid`.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Forty sessions each read a 12 MB answer sent as SSE (a progress notification comes
/// first), which the gateway keeps so a broken connection can resume it. Kept per
/// session (at most 16 MiB each), one client's many sessions would pin 40 × 12 MB; all
/// sessions together keep at most the replay budget (256 MiB).
#[tokio::test]
async fn answers_kept_for_resuming_share_one_budget_across_sessions() {
    const SESSIONS: usize = 40;
    const BYTES: usize = 12_000_000;
    let gw = Gateway::start(&server("m", &unique("exhaust"), &[], ""));
    let pid = gw.child.id();
    let warm = gw.session().await;
    assert_eq!(text(&warm.call("m__echo", json!({"text": "hi"})).await), "hi");
    let rss0 = rss_kib(pid);
    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let s = gw.session().await;
        let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "m__big", "arguments": {"bytes": BYTES, "cr": true}, "_meta": {"progressToken": i}}});
        let (status, body) = s.post_text(call.to_string()).await;
        assert_eq!(status, 200);
        assert!(
            body.starts_with("id: ") && body.len() > BYTES,
            "not an SSE answer: {}",
            &body[..body.len().min(300)]
        );
        sessions.push(s);
    }
    let rss1 = rss_kib(pid);
    eprintln!("RSS {rss0} KiB before, {rss1} KiB after {SESSIONS} answers of {BYTES} bytes");
    assert!(
        rss1 < rss0 + 330 * 1024,
        "RSS {rss0} KiB before, {rss1} KiB after {SESSIONS} sessions' answers of {BYTES} bytes"
    );
    // Sessions still work, and within the budget the newest answer can be resumed.
    assert_eq!(text(&warm.call("m__echo", json!({"text": "after"})).await), "after");
    let last = sessions.last().unwrap();
    let replayed = resume(last, "1-0")
        .await
        .unwrap_or_else(|status| panic!("resuming answered {status}, not 200"));
    assert!(replayed.len() > BYTES, "{}", &replayed[..replayed.len().min(300)]);
}

/// The text of resuming `s`'s stream after `last` (a 200's body), or the refusal's status.
async fn resume(s: &Session, last: &str) -> Result<String, u16> {
    let r = s
        .http
        .get(&s.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &s.id)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", last)
        .timeout(T)
        .send()
        .await
        .unwrap();
    match r.status().as_u16() {
        200 => Ok(r.text().await.unwrap()),
        status => Err(status),
    }
}

/// A call to `m__big` answered as SSE (a progress notification comes first), kept for
/// resuming as stream 1's events.
async fn big_sse_answer(s: &Session, bytes: usize) {
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "m__big", "arguments": {"bytes": bytes, "cr": true}, "_meta": {"progressToken": 1}}});
    let (status, body) = s.post_text(call.to_string()).await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with("id: ") && body.len() > bytes,
        "not an SSE answer: {}",
        &body[..body.len().min(300)]
    );
}

/// Alice, from 24 sessions, keeps 24 answers of 12 MB for resuming: more than the replay
/// budget (256 MiB). Bob's one small answer, the oldest event of all, stays resumable:
/// past the budget the client keeping the most gives up its own oldest events, not
/// whichever session's are oldest.
#[tokio::test]
async fn a_client_filling_the_replay_budget_sheds_its_own_events_not_another_clients() {
    const ALICE: &str = "alice-replay-3b9d";
    const BOB: &str = "bob-replay-c71e";
    const SESSIONS: usize = 24;
    const BYTES: usize = 12_000_000;
    let cfg = format!(
        "{}\n[clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\n\n[clients.bob]\ntoken = \"${{BOB_TOKEN}}\"\n",
        server("m", &unique("exhaust"), &[], "")
    );
    let gw = Gateway::start_with_env(&cfg, &[("ALICE_TOKEN", ALICE), ("BOB_TOKEN", BOB)]);
    let bob = Session::open_as(&gw.url, BOB).await;
    big_sse_answer(&bob, 1000).await;
    let mut alice = Vec::new();
    for _ in 0..SESSIONS {
        let s = Session::open_as(&gw.url, ALICE).await;
        big_sse_answer(&s, BYTES).await;
        alice.push(s);
    }
    // Alice's oldest answer went to keep within the budget; her newest is kept.
    assert!(
        resume(&alice[0], "1-0").await.is_err(),
        "all of Alice's answers were kept"
    );
    let newest = resume(alice.last().unwrap(), "1-0")
        .await
        .expect("Alice's newest answer");
    assert!(newest.len() > BYTES);
    let replayed = resume(&bob, "1-0")
        .await
        .unwrap_or_else(|status| panic!("Bob's answer cannot be resumed: HTTP {status}"));
    assert!(replayed.contains("\"result\""), "{replayed}");
}

/// Server `name`'s entry in `/status`, asked on `s`'s own (pooled) connection: when
/// every connection slot is taken, a new connection would wait its turn.
async fn status_on(gw: &Gateway, s: &Session, name: &str) -> serde_json::Value {
    let st: serde_json::Value = s
        .http
        .get(format!("{}/status", gw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    st["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
        .unwrap_or_default()
}

/// Under `ulimit -n 128`, 150 clients that open a connection, send one request and then
/// sit idle do not take every descriptor: a child that exits meanwhile is started again
/// at once (its pipes need descriptors), not left failing with EMFILE until the idle
/// connections time out.
#[tokio::test]
async fn idle_connections_leave_descriptors_for_restarting_a_child() {
    use std::os::unix::process::CommandExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LIMIT: libc::rlim_t = 128;
    const CLIENTS: usize = 150;
    let (dir, mut cmd) = gateway_command(
        &server("m", &unique("exhaust"), &[], ""),
        &["serve", "--listen", "127.0.0.1:0"],
        &[],
    );
    // SAFETY: setrlimit(2) between fork and exec, on the child's own limit only.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let gw = Gateway::spawn(dir, cmd);
    // 64 connections, fewer than the default cap per address: the start says it bounds
    // nothing here.
    let said = gw.wait_log("max_connections_per_address is not below the connections", T);
    assert!(said.await, "{}", gw.logs());
    let s = gw.session().await;
    assert_eq!(text(&s.call("m__echo", json!({"text": "hi"})).await), "hi");
    let pid = status_on(&gw, &s, "m").await["pid"].as_i64().unwrap();

    let addr = gw.base.trim_start_matches("http://").to_string();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let answered = answered.clone();
        // Reads its answer, then holds the connection open, idle.
        clients.push(tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            if c.read(&mut buf).await.unwrap_or(0) > 0 {
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_secs(120)).await;
            drop(c);
        }));
    }
    assert!(
        until(T, || answered.load(std::sync::atomic::Ordering::Relaxed) >= 60).await,
        "answered {}",
        answered.load(std::sync::atomic::Ordering::Relaxed)
    );

    let r = s.call("m__crash", json!({})).await;
    assert!(r.to_string().contains("exited"), "{r}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let st = status_on(&gw, &s, "m").await;
        if st["state"] == "ready" && st["pid"].as_i64().is_some_and(|p| p != pid) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not started again: {} ({})",
            st["state"],
            st["lastError"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text(&s.call("m__echo", json!({"text": "back"})).await), "back");
    for c in clients {
        c.abort();
    }
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A server that first leaves behind a process of its own, in a session of its own (out
/// of reach of the gateway's kill of its process group), holding its stdin, stdout and
/// stderr, silent; then becomes the mock. The leftover lives 30 s, marked by `mark`.
fn leaves_a_process_behind(name: &str, mark: &str) -> String {
    let script = format!(
        "import os, sys, time\n\
         if os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n\
         os.execvp('python3', ['python3', 'tests/fixtures/mock_server.py', '--name', '{name}'])\n"
    );
    format!(
        "[servers.m]\ncommand = \"python3\"\nargs = [\"-c\", {script:?}, \"{mark}\"]\ncwd = {:?}\n",
        repo().display().to_string()
    )
}

/// A server that exits, leaving behind a process that holds its pipes open, costs the
/// gateway nothing once it has been started again: its stdout and stderr are let go of
/// (they never reach end of file while that process lives), restart after restart.
#[tokio::test]
async fn a_restarted_server_whose_leftover_process_holds_its_pipes_leaks_no_descriptors() {
    let mark = unique("leftover");
    let gw = Gateway::start(&leaves_a_process_behind(&unique("exhaust"), &mark));
    let pid = gw.child.id();
    let s = gw.session().await;
    assert_eq!(text(&s.call("m__echo", json!({"text": "hi"})).await), "hi");
    let before = fds(pid);
    let mut child = gw.server_status("m").await["pid"].as_i64().unwrap();
    for round in 0..2 {
        let r = s.call("m__crash", json!({})).await;
        assert!(r.to_string().contains("exited"), "{r}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = gw.server_status("m").await;
            if st["state"] == "ready" && st["pid"].as_i64().is_some_and(|p| p != child) {
                child = st["pid"].as_i64().unwrap();
                break;
            }
            assert!(std::time::Instant::now() < deadline, "round {round}: {st}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let settled = until(T, || fds(pid) <= before).await;
    let after = fds(pid);
    for p in pids_matching(&mark) {
        // SAFETY: kill(2) on a leftover process this test's server started.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(settled, "{before} descriptors before two restarts, {after} after");
    assert_eq!(text(&s.call("m__echo", json!({"text": "back"})).await), "back");
}

/// A server that answers a call with a line that never ends: the call fails as soon as
/// the line is over `gateway.max_line`, naming the server and the limit, not after the
/// call's timeout (the end of the line, which the gateway waited for, never comes).
#[tokio::test]
async fn a_line_that_never_ends_fails_its_call_once_over_max_line() {
    let script = r#"
import json, sys
out = sys.stdout.buffer
def send(m):
    out.write(json.dumps(m).encode() + b"\n"); out.flush()
for line in sys.stdin.buffer:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "endless", "version": "1"}}})
    elif m["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": [{"name": "endless",
              "inputSchema": {"type": "object"}}]}})
    elif m["method"] == "tools/call":
        out.write(b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % json.dumps(m["id"]).encode())
        while True:
            out.write(b"x" * 65536)
    else:
        send({"jsonrpc": "2.0", "id": m["id"], "result": {}})
"#;
    let gw = Gateway::start(&format!(
        "[gateway]\nmax_line = \"1MiB\"\n\n[servers.e]\ncommand = \"python3\"\nargs = [\"-c\", {script:?}]\ntimeout = \"30s\"\n"
    ));
    let s = gw.session().await;
    let t = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(15), s.call("e__endless", json!({})))
        .await
        .expect("the call was not failed while the line went on");
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("'e'") && msg.contains("gateway.max_line") && msg.contains(&(1u64 << 20).to_string()),
        "{r}"
    );
    assert!(t.elapsed() < Duration::from_secs(10), "failed after {:?}", t.elapsed());
}

/// One address (no auth), from several sessions, fills a stdio server with slow calls:
/// past `max_calls_per_client` (256 by default) of them in flight, its next call is
/// refused at once, naming the server and the limit, instead of waiting in the child
/// behind the rest, and so is a 2026-07-28 call from that address. Another address's call
/// is served meanwhile, and once one of the first address's calls ends it may call again.
#[tokio::test]
async fn one_address_has_at_most_max_calls_per_client_in_flight_to_a_child() {
    const LIMIT: usize = 256;
    const SESSIONS: usize = 4;
    let gw = Gateway::start(&server("m", &unique("exhaust"), &[], ""));
    // The mock runs each slow call on a thread of its own.
    let pid = gw.server_status("m").await["pid"].as_i64().unwrap();
    let threads = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))?
                    .trim()
                    .parse::<usize>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let before = threads();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(std::sync::Arc::new(gw.session().await));
    }
    let mut calls = Vec::new();
    for i in 0..LIMIT {
        let s = sessions[i % SESSIONS].clone();
        calls.push(tokio::spawn(async move {
            s.call_id(json!(1000 + i), "m__slow", json!({"seconds": 120})).await
        }));
    }
    assert!(
        until(T, || threads() >= before + LIMIT).await,
        "{} calls reached the server",
        threads() - before
    );
    let one_more = gw.session().await;
    let r = tokio::time::timeout(T, one_more.call("m__echo", json!({"text": "more"})))
        .await
        .expect("the call past the limit waited");
    let msg = error_of(&r)["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("'m'") && msg.contains("max_calls_per_client") && msg.contains(&LIMIT.to_string()),
        "{r}"
    );
    assert_eq!(error_of(&r)["data"]["server"], "m", "{r}");
    assert_eq!(error_of(&r)["code"], -32029, "a limit, as a rate limit: {r}");
    // A 2026-07-28 caller from that address is the same client: no session of its own to
    // count apart.
    let r = tokio::time::timeout(
        T,
        stateless_call_from(gw.url.clone(), "127.0.0.1", json!(1), "m__echo", json!({"text": "x"})),
    )
    .await
    .expect("the stateless call past the limit waited");
    assert_eq!(error_of(&r)["code"], -32029, "the address's stateless call: {r}");

    // Another address (loopback's 127.0.0.2) is another client.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let other = Session::open_on(other, &gw.url, json!({})).await;
    assert_eq!(text(&other.call("m__echo", json!({"text": "other"})).await), "other");

    // A call of the first address ends (cancelled): it may call again.
    sessions[0]
        .notify("notifications/cancelled", json!({"requestId": 1000, "reason": "test"}))
        .await;
    assert!(
        gw.in_flight_is(LIMIT as i64 - 1).await,
        "the cancelled call is still in flight"
    );
    assert_eq!(text(&one_more.call("m__echo", json!({"text": "again"})).await), "again");
    for c in calls {
        c.abort();
    }
}

/// A connection from `from` (a loopback address of its own) to `to`, that asks `path` and
/// reads the answer: its status and body, and the connection, kept alive.
async fn ask_from(
    from: std::net::Ipv4Addr,
    to: std::net::SocketAddr,
    path: &str,
) -> (u16, String, tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let mut c = socket.connect(to).await.unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut c).await;
    (status, body, c)
}

/// One address holds at most `gateway.max_connections_per_address` connections open: a
/// connection past it is answered 503 and closed, while another address is served and a
/// trusted proxy is not counted; once some of the address's connections close, it is
/// served again. The refusals are logged once per ten seconds and counted in /metrics.
#[tokio::test]
async fn one_address_holds_at_most_max_connections_per_address() {
    use std::net::Ipv4Addr;
    use tokio::io::AsyncReadExt;
    const CAP: usize = 4;
    let (hog, other, proxy) = (
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 4),
    );
    let config = format!(
        "[gateway]\nmax_connections_per_address = {CAP}\ntrusted_proxies = [\"{proxy}\"]\n\n{}",
        server("m", &unique("conncap"), &[], "")
    );
    let gw = Gateway::start(&config);
    let to: std::net::SocketAddr = gw.base.trim_start_matches("http://").parse().unwrap();

    let mut held = Vec::new();
    for _ in 0..CAP {
        let (status, _, c) = ask_from(hog, to, "/healthz").await;
        assert_eq!(status, 200);
        held.push(c);
    }
    for _ in 0..2 {
        let (status, body, mut c) = ask_from(hog, to, "/healthz").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("gateway.max_connections_per_address"), "{body}");
        let mut rest = [0u8; 64];
        let end = tokio::time::timeout(T, c.read(&mut rest)).await;
        assert!(
            matches!(end, Ok(Ok(0) | Err(_))),
            "the refused connection is closed: {end:?}"
        );
    }
    // Another address is served meanwhile, and a trusted proxy past the cap too.
    let (status, _, _other) = ask_from(other, to, "/healthz").await;
    assert_eq!(status, 200);
    let mut through_proxy = Vec::new();
    for _ in 0..CAP + 2 {
        let (status, _, c) = ask_from(proxy, to, "/healthz").await;
        assert_eq!(status, 200, "a trusted proxy is not counted");
        through_proxy.push(c);
    }
    let (status, metrics, _) = ask_from(other, to, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("\nmcp_gateway_connections_refused_total 2\n"),
        "{metrics}"
    );
    let warned = gw
        .logs()
        .lines()
        .filter(|l| l.contains("refused a connection") && l.contains("127.0.0.1"))
        .count();
    assert_eq!(warned, 1, "said once, the second counted:\n{}", gw.logs());

    // Two of the address's connections close: it is served again once the gateway has
    // seen them close.
    held.truncate(CAP - 2);
    let deadline = std::time::Instant::now() + T;
    while held.len() < CAP {
        let (status, _, c) = ask_from(hog, to, "/healthz").await;
        if status == 200 {
            held.push(c);
            continue;
        }
        assert!(std::time::Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _, _) = ask_from(hog, to, "/healthz").await;
    assert_eq!(status, 503, "at the cap again");
}
