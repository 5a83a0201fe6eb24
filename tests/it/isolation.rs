//! `isolation = "session"` end to end, with the real binary and real children: a process
//! per client session (per-process state shows which one answers), stopped when its
//! session ends, when it sits idle, on a crash (replaced on the next call) and on
//! SIGTERM; `max_sessions`; and the stdio front end.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Whether `pid` is a live process (a zombie only waits to be reaped: it is gone).
fn running(pid: i32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// The live mock processes started with `--name name`.
fn live_mocks(name: &str) -> Vec<i32> {
    mock_pids(name).into_iter().filter(|&p| running(p)).collect()
}

/// An isolated mock listing `pid` and `counter`, as server `iso`, plus extra TOML lines.
fn isolated(mock_name: &str, extra: &str) -> String {
    server(
        "iso",
        mock_name,
        &["--per-process"],
        &format!("isolation = \"session\"\n{extra}"),
    )
}

/// Polls /status until server `iso` satisfies `f`; panics with the last status and the
/// log when `timeout` passes first.
async fn wait_iso(gw: &Gateway, timeout: Duration, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let st = gw.server_status("iso").await;
        if f(&st) {
            return st;
        }
        if Instant::now() >= deadline {
            panic!("{what}: /status never matched; last: {st}\nlog:\n{}", gw.logs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn procs(st: &Value) -> u64 {
    st["sessionProcesses"]
        .as_u64()
        .unwrap_or_else(|| panic!("no sessionProcesses in {st}"))
}

/// Waits until `pid` has exited; panics after `timeout` with `what`.
async fn gone(pid: i32, timeout: Duration, what: &str) {
    assert!(
        until(timeout, || !running(pid)).await,
        "{what}: process {pid} still runs"
    );
}

/// The text of a successful tool call, panicking on an error.
async fn ok_text(s: &Session, tool: &str) -> String {
    let r = s.call(tool, json!({})).await;
    assert!(
        r.get("error").is_none() && r["result"]["isError"] != true,
        "{tool} failed: {r}"
    );
    text(&r)
}

async fn pid(s: &Session) -> i32 {
    ok_text(s, "iso__pid").await.parse().unwrap()
}

async fn counter(s: &Session) -> u64 {
    ok_text(s, "iso__counter").await.parse().unwrap()
}

async fn delete(s: &Session) {
    assert_eq!(s.end().await, 200, "DELETE");
}

/// An error response or an `isError` tool result, as one string to search.
fn failure(r: &Value) -> String {
    if let Some(e) = r.get("error") {
        return e.to_string();
    }
    assert_eq!(r["result"]["isError"], true, "expected a failure, got {r}");
    r["result"].to_string()
}

#[tokio::test]
async fn each_session_gets_its_own_process_and_one_shared_catalog() {
    let name = unique("iso-own");
    let gw = Gateway::start(&isolated(&name, ""));
    let st = wait_iso(&gw, Duration::from_secs(10), "ready", |s| s["state"] == "ready").await;
    assert_eq!(st["isolation"], "session");
    assert_eq!(procs(&st), 0, "no process before a session calls");
    let catalog_pid = st["pid"].as_i64().unwrap() as i32;

    let (a, b) = (gw.session().await, gw.session().await);
    // The catalog comes from the shared process: every tool once, for every session.
    for s in [&a, &b] {
        let names = s.tool_names().await;
        for t in ["iso__pid", "iso__counter", "iso__echo"] {
            assert_eq!(names.iter().filter(|n| *n == t).count(), 1, "{t} in {names:?}");
        }
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "duplicates in {names:?}");
    }
    assert_eq!(procs(&gw.server_status("iso").await), 0, "listing starts no process");

    assert_eq!(counter(&a).await, 1);
    assert_eq!(counter(&a).await, 2);
    assert_eq!(counter(&b).await, 1, "B has its own process");
    assert_eq!(counter(&a).await, 3);
    assert_eq!(counter(&b).await, 2);

    let (pa, pb) = (pid(&a).await, pid(&b).await);
    assert_ne!(pa, pb);
    assert!(
        pa != catalog_pid && pb != catalog_pid,
        "the catalog process serves no session"
    );
    assert!(running(pa) && running(pb));
    let mut live = live_mocks(&name);
    live.sort();
    let mut want = vec![catalog_pid, pa, pb];
    want.sort();
    assert_eq!(live, want, "exactly the catalog process and one per session");
    let st = wait_iso(&gw, Duration::from_secs(5), "two processes", |s| procs(s) == 2).await;
    assert_eq!(
        st["pid"].as_i64().unwrap() as i32,
        catalog_pid,
        "/status pid is the catalog's"
    );
}

#[tokio::test]
async fn ending_a_session_stops_only_its_process() {
    let name = unique("iso-del");
    let gw = Gateway::start(&isolated(&name, ""));
    let (a, b) = (gw.session().await, gw.session().await);
    let (pa, pb) = (pid(&a).await, pid(&b).await);
    assert_eq!(counter(&b).await, 1);
    wait_iso(&gw, Duration::from_secs(5), "two processes", |s| procs(s) == 2).await;

    delete(&a).await;
    gone(pa, Duration::from_secs(5), "A's process after DELETE").await;
    wait_iso(&gw, Duration::from_secs(5), "one process after DELETE", |s| {
        procs(s) == 1
    })
    .await;

    assert!(running(pb), "B's process survives");
    assert_eq!(pid(&b).await, pb);
    assert_eq!(counter(&b).await, 2, "B's state is intact");
    // A is gone for good: its id is refused.
    let r = a
        .post()
        .json(&json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"iso__pid","arguments":{}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(procs(&gw.server_status("iso").await), 1);
    // The log names the sessions whose processes started and stopped by their tags.
    assert!(
        gw.wait_log("stopping a session's process", Duration::from_secs(5))
            .await
    );
    let logs = gw.logs();
    for s in [&a, &b] {
        assert!(!logs.contains(&s.id), "a session id in the logs:\n{logs}");
        assert!(logs.contains(&sha256_hex(&s.id)[..16]), "{logs}");
    }
}

#[tokio::test]
async fn an_idle_process_is_stopped_and_started_again_on_the_next_call() {
    let name = unique("iso-idle");
    let gw = Gateway::start(&isolated(&name, "idle_timeout = \"1s\""));
    let (a, b) = (gw.session().await, gw.session().await);
    assert_eq!(counter(&a).await, 1);
    assert_eq!(counter(&a).await, 2);
    let pa = pid(&a).await;
    let last = Instant::now();
    // B stays busy meanwhile: only A's process is idle.
    let pb = pid(&b).await;

    gone(pa, Duration::from_secs(4), "A's idle process").await;
    assert!(
        last.elapsed() >= Duration::from_millis(900),
        "stopped after {:?}, before its idle_timeout",
        last.elapsed()
    );
    // The session itself is still valid: its next call gets a fresh process.
    let st = gw.server_status("iso").await;
    assert!(procs(&st) <= 1, "A's process is no longer counted: {st}");
    assert_eq!(counter(&a).await, 1, "a fresh process starts counting again");
    let pa2 = pid(&a).await;
    assert_ne!(pa2, pa);
    assert!(running(pa2));
    let _ = pb;
    assert!(
        gw.wait_log("stopping an idle session's process", Duration::from_secs(10))
            .await,
        "{}",
        gw.logs()
    );
}

#[tokio::test]
async fn a_call_longer_than_idle_timeout_is_not_cut_off() {
    let name = unique("iso-busy");
    let gw = Gateway::start(&isolated(&name, "idle_timeout = \"1s\""));
    let a = gw.session().await;
    let pa = pid(&a).await;
    // 2.5 s in flight: the process is busy, not idle, the whole time.
    let r = a.call("iso__slow", json!({"seconds": 2.5})).await;
    assert!(
        r.get("error").is_none() && r["result"]["isError"] != true,
        "slow call: {r}"
    );
    assert!(running(pa), "the process was stopped under a call in flight");
    assert_eq!(pid(&a).await, pa, "the same process serves the next call");
}

#[tokio::test]
async fn a_slow_start_holds_up_no_other_session() {
    // Every process of this one answers initialize 2 s late.
    let name = unique("iso-slowstart");
    let gw = Gateway::start(&server(
        "iso",
        &name,
        &["--per-process", "--init-delay-ms", "2000"],
        "isolation = \"session\"",
    ));
    let (a, b) = (gw.session().await, gw.session().await);
    assert_eq!(counter(&a).await, 1);
    let started = tokio::spawn(async move { counter(&b).await });
    // B's process exists and is in its handshake.
    assert!(until(Duration::from_secs(5), || live_mocks(&name).len() == 3).await);
    let t = Instant::now();
    assert_eq!(counter(&a).await, 2);
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "A waited {:?} for B's process to start",
        t.elapsed()
    );
    assert!(!started.is_finished(), "B's start was not slow enough to test anything");
    assert_eq!(
        procs(&gw.server_status("iso").await),
        2,
        "a starting process is counted"
    );
    assert_eq!(started.await.unwrap(), 1);
}

#[tokio::test]
async fn max_sessions_bounds_the_processes() {
    let name = unique("iso-max");
    let gw = Gateway::start(&isolated(&name, "max_sessions = 2"));
    let (a, b, c) = (gw.session().await, gw.session().await, gw.session().await);
    let pa = pid(&a).await;
    pid(&b).await;

    let r = c.call("iso__pid", json!({})).await;
    let why = failure(&r);
    assert!(why.contains("iso") && why.contains("max_sessions"), "{why}");
    assert_eq!(live_mocks(&name).len(), 3, "no process was started for C");
    assert_eq!(procs(&gw.server_status("iso").await), 2);
    // A and B keep working.
    assert_eq!(counter(&a).await, 1);

    delete(&a).await;
    wait_iso(&gw, Duration::from_secs(5), "A's process stopped", |s| procs(s) == 1).await;
    gone(pa, Duration::from_secs(5), "A's process").await;
    assert_eq!(counter(&c).await, 1, "C gets a process once A's is gone");
    wait_iso(&gw, Duration::from_secs(5), "B and C", |s| procs(s) == 2).await;
}

#[tokio::test]
async fn a_crashed_session_process_is_replaced_on_the_next_call() {
    let name = unique("iso-crash");
    let gw = Gateway::start(&isolated(&name, ""));
    let (a, b) = (gw.session().await, gw.session().await);
    let catalog_pid = gw.server_status("iso").await["pid"].as_i64().unwrap() as i32;
    assert_eq!(counter(&a).await, 1);
    let pa = pid(&a).await;
    let pb = pid(&b).await;

    let r = a.call("iso__crash", json!({})).await;
    let why = failure(&r);
    assert!(why.contains("iso"), "the error names the server: {why}");
    gone(pa, Duration::from_secs(5), "the crashed process").await;

    // At once, no waiting: the next call of A starts a new process.
    let pa2 = pid(&a).await;
    assert_ne!(pa2, pa);
    assert_eq!(counter(&a).await, 1, "a fresh process");
    // The catalog process and B were not touched.
    assert_eq!(pid(&b).await, pb);
    let st = wait_iso(&gw, Duration::from_secs(5), "A (new) and B", |s| procs(s) == 2).await;
    assert_eq!(st["state"], "ready");
    assert_eq!(st["pid"].as_i64().unwrap() as i32, catalog_pid);
    assert_eq!(
        st["restarts"], 0,
        "a session process's crash is no restart of the server"
    );
}

#[tokio::test]
async fn a_crash_is_not_counted_against_max_sessions() {
    let name = unique("iso-crashmax");
    let gw = Gateway::start(&isolated(&name, "max_sessions = 1"));
    let (a, b) = (gw.session().await, gw.session().await);
    let pa = pid(&a).await;
    failure(&a.call("iso__crash", json!({})).await);
    gone(pa, Duration::from_secs(5), "the crashed process").await;
    wait_iso(&gw, Duration::from_secs(5), "the dead process is not counted", |s| {
        procs(s) == 0
    })
    .await;
    // A's dead process holds no slot: B may have one.
    let pb = pid(&b).await;
    assert!(running(pb));
}

#[tokio::test]
async fn sigterm_stops_every_session_process() {
    let name = unique("iso-term");
    let mut gw = Gateway::start(&isolated(&name, ""));
    let sessions = [gw.session().await, gw.session().await, gw.session().await];
    let mut pids = Vec::new();
    for s in &sessions {
        pids.push(pid(s).await);
    }
    wait_iso(&gw, Duration::from_secs(5), "three processes", |s| procs(s) == 3).await;
    assert_eq!(live_mocks(&name).len(), 4);

    let status = gw.terminate();
    assert!(status.success(), "gateway exit: {status:?}\n{}", gw.logs());
    assert!(
        until(Duration::from_secs(5), || live_mocks(&name).is_empty()).await,
        "left behind: {:?}",
        live_mocks(&name)
    );
}

#[test]
fn stdio_session_gets_its_own_process_and_eof_leaves_none() {
    let name = unique("iso-stdio");
    let mut gw = StdioGateway::start(&isolated(&name, ""), &[]);
    gw.initialize();
    let call = |gw: &mut StdioGateway, id: i64, tool: &str| -> String {
        let (_, r) = gw.request(json!(id), "tools/call", json!({"name": tool, "arguments": {}}));
        assert!(
            r.get("error").is_none() && r["result"]["isError"] != true,
            "{tool}: {r}"
        );
        text(&r)
    };
    let before = live_mocks(&name);
    assert_eq!(before.len(), 1, "only the catalog process before a call: {before:?}");
    let catalog_pid = before[0];

    let own: i32 = call(&mut gw, 1, "iso__pid").parse().unwrap();
    assert_ne!(own, catalog_pid, "the stdio session has its own process");
    assert_eq!(call(&mut gw, 2, "iso__counter"), "1");
    assert_eq!(call(&mut gw, 3, "iso__counter"), "2");
    let mut live = live_mocks(&name);
    live.sort();
    let mut want = vec![catalog_pid, own];
    want.sort();
    assert_eq!(live, want);

    gw.close_stdin();
    let status = gw.wait_exit(Duration::from_secs(15));
    assert!(status.is_some(), "gateway did not exit at EOF\n{}", gw.logs());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !live_mocks(&name).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(live_mocks(&name).is_empty(), "left behind: {:?}", live_mocks(&name));
    assert!(
        gw.wait_log_blocking("stopping a session's process", Duration::from_secs(10)),
        "{}",
        gw.logs()
    );
}

/// A server whose callers get processes of their own refuses resource subscriptions with
/// an error naming it: one shared subscription would be made in one caller's process and
/// heard by every caller, while what a caller's own process says goes nowhere. A shared
/// server beside it still takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_process_per_caller_refuses_resource_subscriptions_by_name() {
    let (iso, shared) = (unique("iso-sub"), unique("shared-sub"));
    let config = format!(
        "{}{}",
        server("iso", &iso, &["--two-way"], "isolation = \"session\"\n"),
        server("plain", &shared, &["--two-way"], "")
    );
    let gw = Gateway::start(&config);
    let s = Session::open(&gw.url).await;
    let uri = format!("mock://{iso}/readme");
    let r = s.request(json!(1), "resources/subscribe", json!({"uri": uri})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("server 'iso'") && msg.contains("not supported"), "{r}");
    assert_eq!(r["error"]["data"]["uri"], uri.as_str(), "{r}");
    let r = s
        .request(
            json!(2),
            "resources/subscribe",
            json!({"uri": format!("mock://{shared}/readme")}),
        )
        .await;
    assert_eq!(r["result"], json!({}), "{r}");
}
