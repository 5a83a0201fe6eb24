//! Supervision end to end, with the real binary and real children: a child killed under
//! load, restart policies, crash loops, and graceful shutdown (HTTP and stdio) leaving no
//! process behind, grandchildren included.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A process's state letter and process group, from /proc; `None` when it is gone.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: read after the last ')'.
    let mut f = s[s.rfind(')')? + 1..].split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    Some((state, f.next()?.parse().ok()?))
}

/// Whether `pid` is a live process (zombies are dead: they only wait to be reaped).
fn running(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

/// The live processes of process group `pgid`.
fn group(pgid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(state, pg)| pg == pgid && !matches!(state, 'Z' | 'X')))
        .collect()
}

/// Waits until process group `pgid` is empty; returns what is still alive otherwise.
async fn group_gone(pgid: i32, timeout: Duration) -> Vec<i32> {
    until(timeout, || group(pgid).is_empty()).await;
    group(pgid)
}

/// A server table whose command is `sh -c 'sleep 1000 & exec python3 mock_server.py ...'`:
/// the mock has a grandchild (the sleep) in its process group.
fn wrapped(table: &str, mock_name: &str) -> String {
    let script = format!("sleep 1000 & exec python3 tests/fixtures/mock_server.py --name {mock_name}");
    format!(
        "[servers.{table}]\ncommand = \"sh\"\nargs = {}\ncwd = {:?}\n",
        toml_list(&["-c".to_string(), script]),
        repo().display().to_string()
    )
}

/// Polls /status until server `name` satisfies `f`; panics with the last status and the
/// log when `timeout` passes first.
async fn wait_status(gw: &Gateway, name: &str, timeout: Duration, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let st = gw.server_status(name).await;
        if f(&st) {
            return st;
        }
        if Instant::now() >= deadline {
            panic!("server {name}: status never matched; last: {st}\nlog:\n{}", gw.logs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pid_of(st: &Value) -> i32 {
    st["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {st}")) as i32
}

/// Waits for a child process to exit; `None` when `timeout` passes first.
async fn exited(child: &mut std::process::Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn sigterm(pid: u32) {
    // SAFETY: kill(2) on a pid this test spawned; no memory is touched.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
}

/// A tools/call of `slow` with a progress token, so the first progress notification
/// shows the call has reached the child.
fn slow_params(tool: &str, seconds: f64, steps: u32) -> Value {
    json!({"name": tool, "arguments": {"seconds": seconds, "steps": steps}, "_meta": {"progressToken": "p"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_100_calls_fails_them_at_once_and_the_server_comes_back() {
    let name = unique("kill9");
    let gw = Gateway::start(&server("k", &name, &[], ""));
    let before = wait_status(&gw, "k", Duration::from_secs(10), |s| s["state"] == "ready").await;
    let old = pid_of(&before);
    assert_eq!(before["restarts"], 0);

    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(std::sync::Arc::new(gw.session().await));
    }
    let mut calls = Vec::new();
    for i in 0..100 {
        let s = sessions[i % sessions.len()].clone();
        calls.push(tokio::spawn(async move {
            let r = s.call_id(json!(i), "k__slow", json!({"seconds": 5})).await;
            (r, Instant::now())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.in_flight().await < 100 {
        assert!(Instant::now() < deadline, "the 100 calls never were in flight together");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // SAFETY: kill(2) on the child the gateway reported; no memory is touched.
    unsafe {
        libc::kill(old, libc::SIGKILL);
    }
    let killed = Instant::now();
    for c in calls {
        let (r, at) = c.await.unwrap();
        let took = at.duration_since(killed);
        assert!(took < Duration::from_secs(1), "answered {took:?} after the kill: {r}");
        let msg = error_of(&r)["message"].as_str().unwrap_or_default();
        assert!(msg.contains("'k'"), "the error names the server: {r}");
    }

    let after = wait_status(
        &gw,
        "k",
        Duration::from_secs(10).saturating_sub(killed.elapsed()),
        |s| s["state"] == "ready" && s["pid"].as_i64().is_some_and(|p| p as i32 != old),
    )
    .await;
    assert_eq!(after["restarts"], 1, "{after}");
    assert!(
        after["lastError"].as_str().unwrap_or_default().contains("signal 9"),
        "{after}"
    );
    assert!(!running(old));
    for s in &sessions {
        assert_eq!(text(&s.call("k__echo", json!({"text": "back"})).await), "back");
    }
}

#[tokio::test]
async fn restart_policies_never_on_failure_and_always() {
    let names: Vec<String> = ["never", "onfail", "onfail-clean", "always"]
        .iter()
        .map(|n| unique(n))
        .collect();
    let config = [
        server("never", &names[0], &[], "restart = \"never\"\n"),
        server("onfail", &names[1], &[], "restart = \"on-failure\"\n"),
        // The default policy is on-failure.
        server("clean", &names[2], &[], ""),
        server("always", &names[3], &[], "restart = \"always\"\n"),
    ]
    .concat();
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let mut pids = Vec::new();
    for t in ["never", "onfail", "clean", "always"] {
        pids.push(pid_of(
            &wait_status(&gw, t, Duration::from_secs(10), |s| s["state"] == "ready").await,
        ));
    }

    // never and onfail crash (exit 3); clean and always exit 0.
    let crashed = Instant::now();
    let (a, b, c, d) = tokio::join!(
        s.call_id(json!(1), "never__crash", json!({})),
        s.call_id(json!(2), "onfail__crash", json!({})),
        s.call_id(json!(3), "clean__crash", json!({"code": 0})),
        s.call_id(json!(4), "always__crash", json!({"code": 0})),
    );
    for (r, srv) in [(&a, "never"), (&b, "onfail"), (&c, "clean"), (&d, "always")] {
        let msg = error_of(r)["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("'{srv}'")), "{r}");
    }

    for (t, old) in [("onfail", pids[1]), ("always", pids[3])] {
        let st = wait_status(&gw, t, Duration::from_secs(10), |s| {
            s["state"] == "ready" && s["pid"].as_i64().is_some_and(|p| p as i32 != old)
        })
        .await;
        assert_eq!(st["restarts"], 1, "{st}");
    }
    assert_eq!(text(&s.call("onfail__echo", json!({"text": "x"})).await), "x");
    assert_eq!(text(&s.call("always__echo", json!({"text": "y"})).await), "y");

    // The first restart comes 1 s after an exit; give the other two twice that.
    let quiet = Duration::from_secs(2).saturating_sub(crashed.elapsed());
    tokio::time::sleep(quiet).await;
    for (t, mock_name, why) in [
        ("never", &names[0], "exit status 3"),
        ("clean", &names[2], "exit status 0"),
    ] {
        let st = gw.server_status(t).await;
        assert_eq!(st["state"], "down", "{st}");
        assert_eq!(st["restarts"], 0, "{st}");
        assert!(st["pid"].is_null(), "{st}");
        assert!(st["lastError"].as_str().unwrap_or_default().contains(why), "{st}");
        assert!(mock_pids(mock_name).is_empty(), "{t} was started again");
        let r = s.call(&format!("{t}__echo"), json!({"text": "z"})).await;
        let msg = error_of(&r)["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("'{t}'")), "{r}");
    }
    assert!(!running(pids[0]) && !running(pids[2]));
}

#[tokio::test]
async fn a_crash_loop_marks_the_server_failed_while_others_keep_serving() {
    let name = unique("steady");
    // The child exits 1 before it answers initialize: every start fails.
    let config = format!(
        "{}[servers.loop]\ncommand = \"sh\"\nargs = [\"-c\", \"exit 1\"]\n",
        server("steady", &name, &[], "")
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    // Five failures 1 + 2 + 4 + 8 s apart: about 15 s. Serve all the while.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut served = 0;
    let failed = loop {
        let st = gw.server_status("loop").await;
        if st["state"] == "failed" {
            break st;
        }
        assert!(Instant::now() < deadline, "never failed: {st}\nlog:\n{}", gw.logs());
        assert_ne!(st["state"], "ready", "{st}");
        assert_eq!(text(&s.call("steady__echo", json!({"text": "ok"})).await), "ok");
        served += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(served > 10, "served only {served} calls during the loop");
    let why = failed["lastError"].as_str().unwrap_or_default();
    assert!(why.contains("crash loop"), "lastError should say crash loop: {failed}");
    assert!(
        gw.wait_log("crash loop: 5 failures within 60s", Duration::from_secs(10))
            .await,
        "{}",
        gw.logs()
    );
    let steady = gw.server_status("steady").await;
    assert_eq!(
        (steady["state"].as_str(), steady["restarts"].as_u64()),
        (Some("ready"), Some(0))
    );
    assert_eq!(text(&s.call("steady__echo", json!({"text": "still"})).await), "still");
}

#[tokio::test]
async fn sigterm_over_http_finishes_the_call_exits_0_and_leaves_no_process() {
    let name = unique("term-http");
    let mut gw = Gateway::start(&wrapped("g", &name));
    let pgid = pid_of(&wait_status(&gw, "g", Duration::from_secs(10), |s| s["state"] == "ready").await);
    assert!(
        group(pgid).len() >= 2,
        "the mock and its sleep grandchild: {:?}",
        group(pgid)
    );

    let s = gw.session().await;
    let mut call = s.start(json!(1), "tools/call", slow_params("g__slow", 2.0, 4)).await;
    let first = call
        .next(Duration::from_secs(5))
        .await
        .expect("a progress notification");
    assert_eq!(first["method"], "notifications/progress", "{first}");

    gw.sigterm();
    let (_, resp) = call.response(Duration::from_secs(10)).await;
    assert_eq!(text(&resp), "done", "{resp}");
    let status = exited(&mut gw.child, Duration::from_secs(10)).await.expect("exit");
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.logs());
    assert_eq!(group_gone(pgid, Duration::from_secs(2)).await, Vec::<i32>::new());
}

#[tokio::test]
async fn sigterm_in_stdio_mode_finishes_the_call_exits_0_and_leaves_no_process() {
    let name = unique("term-stdio");
    let mut gw = StdioGateway::start(&wrapped("g", &name), &[]);
    gw.initialize();
    gw.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": slow_params("g__slow", 2.0, 4)}));
    let first = gw.recv(Duration::from_secs(10)).expect("a progress notification");
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let pgid = *mock_pids(&name).first().expect("the mock's pid");
    assert!(
        group(pgid).len() >= 2,
        "the mock and its sleep grandchild: {:?}",
        group(pgid)
    );

    sigterm(gw.child.id());
    let (_, resp) = gw.until_response(&json!(5), Duration::from_secs(10));
    assert_eq!(text(&resp), "done", "{resp}");
    let status = gw.wait_exit(Duration::from_secs(10)).expect("exit");
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.logs());
    assert_eq!(group_gone(pgid, Duration::from_secs(2)).await, Vec::<i32>::new());
}

#[tokio::test]
async fn shutdown_grace_bounds_the_wait_for_a_long_call() {
    let grace = "[gateway]\nshutdown_grace = \"1s\"\ndrain_delay = \"0s\"\n\n";

    // HTTP.
    let name = unique("grace-http");
    let mut gw = Gateway::start(&format!("{grace}{}", wrapped("g", &name)));
    let pgid = pid_of(&wait_status(&gw, "g", Duration::from_secs(10), |s| s["state"] == "ready").await);
    let s = gw.session().await;
    let mut call = s.start(json!(1), "tools/call", slow_params("g__slow", 30.0, 60)).await;
    assert!(
        call.next(Duration::from_secs(5)).await.is_some(),
        "a progress notification"
    );
    sigterm(gw.child.id());
    let termed = Instant::now();
    let status = exited(&mut gw.child, Duration::from_secs(10)).await.expect("exit");
    let took = termed.elapsed();
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.logs());
    // The grace, then the child's shutdown (it exits as soon as its stdin closes).
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(3500),
        "exited {took:?} after SIGTERM"
    );
    assert_eq!(group_gone(pgid, Duration::from_secs(2)).await, Vec::<i32>::new());
    // The call's stream ends rather than hang.
    while call.next(Duration::from_secs(5)).await.is_some() {}

    // stdio.
    let name = unique("grace-stdio");
    let mut gw = StdioGateway::start(&format!("{grace}{}", wrapped("g", &name)), &[]);
    gw.initialize();
    gw.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": slow_params("g__slow", 30.0, 60)}));
    assert!(gw.recv(Duration::from_secs(10)).is_some(), "a progress notification");
    let pgid = *mock_pids(&name).first().expect("the mock's pid");
    sigterm(gw.child.id());
    let termed = Instant::now();
    let status = gw.wait_exit(Duration::from_secs(10)).expect("exit");
    let took = termed.elapsed();
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.logs());
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(3500),
        "exited {took:?} after SIGTERM"
    );
    assert_eq!(group_gone(pgid, Duration::from_secs(2)).await, Vec::<i32>::new());
}
