//! Hot reload end to end: the real binary, its gateway.toml rewritten (or SIGHUP), real
//! children. Servers added, removed and changed; unchanged ones untouched, in-flight
//! calls included; invalid edits logged with file:line:column and ignored; rate limits.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// How many reloads the gateway has finished so far.
fn reloads(gw: &Gateway) -> usize {
    gw.logs().matches("reload done").count()
}

/// Waits until more than `before` reloads have finished.
async fn reloaded(gw: &Gateway, before: usize) {
    let log = gw.stderr.clone();
    let done = until(WAIT, || log.lock().unwrap().matches("reload done").count() > before).await;
    assert!(done, "no reload; log:\n{}", gw.logs());
}

/// Rewrites the gateway's config file in place, as an editor or `echo >` would.
fn rewrite(gw: &Gateway, config: &str) {
    std::fs::write(gw.config_path(), config).unwrap();
}

/// Polls /status until server `name` satisfies `f`; panics with the log otherwise.
async fn wait_status(gw: &Gateway, name: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let st = gw.server_status(name).await;
        if f(&st) {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "server {name}: status never matched; last: {st}\nlog:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(gw: &Gateway, name: &str) -> Value {
    wait_status(gw, name, |s| s["state"] == "ready").await
}

fn pid_of(st: &Value) -> i32 {
    st["pid"].as_i64().unwrap_or_else(|| panic!("no pid in {st}")) as i32
}

/// Whether `pid` is a live process (not a zombie).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with(['Z', 'X'])))
        .is_some_and(|dead| !dead)
}

/// Waits until the session's tool list satisfies `f`; returns the list.
async fn tools_until(gw: &Gateway, s: &Session, f: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let names = s.tool_names().await;
        if f(&names) {
            return names;
        }
        assert!(
            Instant::now() < deadline,
            "tools never matched: {names:?}\nlog:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a GET stream until a `method` notification arrives.
async fn notified(stream: &mut Messages, method: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stream.next(left).await {
            Some(m) if m["method"] == method => return,
            Some(_) => {}
            None => panic!("no {method} on the GET stream; saw {:?}", stream.seen),
        }
    }
}

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// A `slow` call with a progress token: its first progress shows it reached the child.
fn slow(tool: &str, seconds: f64, steps: u32) -> Value {
    json!({"name": tool, "arguments": {"seconds": seconds, "steps": steps}, "_meta": {"progressToken": "p"}})
}

#[tokio::test]
async fn an_added_server_is_started_and_clients_get_list_changed() {
    let (a, b) = (unique("add-a"), unique("add-b"));
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&one);
    let s = gw.session().await;
    let mut stream = s.get_stream().await;
    assert!(!has(&s.tool_names().await, "b__echo"));

    rewrite(&gw, &format!("{one}{}", server("b", &b, &[], "")));
    notified(&mut stream, "notifications/tools/list_changed").await;
    let names = s.tool_names().await;
    assert!(has(&names, "a__echo") && has(&names, "b__echo"), "{names:?}");
    assert_eq!(text(&s.call("b__echo", json!({"text": "new"})).await), "new");
    assert_eq!(ready(&gw, "b").await["restarts"], 0);
}

#[tokio::test]
async fn a_removed_server_is_stopped_its_tools_vanish_and_its_calls_end() {
    let (a, b) = (unique("rm-a"), unique("rm-b"));
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&format!("{one}{}", server("b", &b, &[], "")));
    let s = gw.session().await;
    let a_pid = pid_of(&ready(&gw, "a").await);
    let b_pid = pid_of(&ready(&gw, "b").await);
    assert!(has(&s.tool_names().await, "b__echo"));
    let mut stream = s.get_stream().await;
    // A call in flight to the server that goes away.
    let mut call = s.start(json!(9), "tools/call", slow("b__slow", 30.0, 60)).await;
    assert!(call.next(WAIT).await.is_some(), "a progress notification");

    rewrite(&gw, &one);
    notified(&mut stream, "notifications/tools/list_changed").await;
    let names = s.tool_names().await;
    assert!(names.iter().all(|n| !n.starts_with("b__")), "{names:?}");
    assert!(has(&names, "a__echo"), "{names:?}");
    let (_, resp) = call.response(WAIT).await;
    let msg = error_of(&resp)["message"].as_str().unwrap_or_default();
    assert!(msg.contains("'b'"), "the error names the removed server: {resp}");
    assert!(until(WAIT, || !running(b_pid)).await, "b's child {b_pid} still runs");
    assert!(mock_pids(&b).is_empty());
    assert_eq!(gw.server_status("b").await, Value::Null, "b left /status");
    let r = s.call("b__echo", json!({"text": "gone"})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap_or_default().contains("b__echo"),
        "{r}"
    );
    assert_eq!(pid_of(&gw.server_status("a").await), a_pid, "a was left alone");
}

#[tokio::test]
async fn a_changed_server_gets_a_new_child_with_new_tools() {
    let a = unique("chg-a");
    let gw = Gateway::start(&server("a", &a, &["--tools", "2"], ""));
    let s = gw.session().await;
    let old = pid_of(&ready(&gw, "a").await);
    let names = s.tool_names().await;
    assert!(has(&names, "a__tool_1") && !has(&names, "a__tool_2"), "{names:?}");

    rewrite(&gw, &server("a", &a, &["--tools", "3"], ""));
    let st = wait_status(&gw, "a", |s| {
        s["state"] == "ready" && s["pid"].as_i64().is_some_and(|p| p as i32 != old)
    })
    .await;
    assert_eq!(st["tools"], 9 + 3, "{st}");
    tools_until(&gw, &s, |n| has(n, "a__tool_2")).await;
    assert_eq!(text(&s.call("a__tool_2", json!({"k": 1})).await), r#"{"k":1}"#);
    assert!(until(WAIT, || !running(old)).await, "the old child {old} still runs");
    assert_eq!(mock_pids(&a).len(), 1, "exactly one child for a");
}

#[tokio::test]
async fn an_unchanged_server_keeps_its_child_and_its_call_in_flight() {
    let (a, b) = (unique("keep-a"), unique("keep-b"));
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&one);
    let s = gw.session().await;
    let pid = pid_of(&ready(&gw, "a").await);
    let mut call = s.start(json!(3), "tools/call", slow("a__slow", 2.0, 4)).await;
    assert!(call.next(WAIT).await.is_some(), "a progress notification");

    let before = reloads(&gw);
    rewrite(&gw, &format!("{one}{}", server("b", &b, &[], "")));
    reloaded(&gw, before).await;
    ready(&gw, "b").await;
    let (_, resp) = call.response(WAIT).await;
    assert_eq!(text(&resp), "done", "{resp}");
    let st = gw.server_status("a").await;
    assert_eq!((pid_of(&st), st["restarts"].as_u64()), (pid, Some(0)), "{st}");
    assert_eq!(mock_pids(&a), vec![pid]);
}

#[tokio::test]
async fn invalid_edits_are_logged_with_line_and_column_and_ignored() {
    let (a, b) = (unique("bad-a"), unique("bad-b"));
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&one);
    let s = gw.session().await;
    let pid = pid_of(&ready(&gw, "a").await);
    let a_lines = one.lines().count();

    // A syntax error: an unclosed table header, after a's table and a blank line.
    rewrite(&gw, &format!("{one}\n[servers.b\ncommand = \"python3\"\n"));
    let at = format!("gateway.toml:{}:11: not valid TOML: invalid table header", a_lines + 2);
    assert!(gw.wait_log(&at, WAIT).await, "no {at:?} in the log:\n{}", gw.logs());

    // An unknown key, in an otherwise valid new server b.
    let b_table = server("b", &b, &[], "");
    rewrite(&gw, &format!("{one}{}\nbogus = 1\n", b_table.trim_end()));
    let at = format!(
        "gateway.toml:{}:1: servers.b: unknown key \"bogus\"; expected one of command, url",
        a_lines + b_table.trim_end().lines().count() + 1
    );
    assert!(gw.wait_log(&at, WAIT).await, "no {at:?} in the log:\n{}", gw.logs());
    assert!(
        gw.wait_log("invalid config, keeping the running one", WAIT).await,
        "{}",
        gw.logs()
    );

    // Neither applied: a serves as before, b was never started.
    assert_eq!(text(&s.call("a__echo", json!({"text": "still"})).await), "still");
    assert_eq!(pid_of(&gw.server_status("a").await), pid);
    assert_eq!(gw.server_status("b").await, Value::Null);
    assert!(mock_pids(&b).is_empty());
    assert!(!gw.logs().contains("reload done"), "an invalid edit was applied");

    // A valid edit still applies.
    rewrite(&gw, &format!("{one}{b_table}"));
    tools_until(&gw, &s, |n| has(n, "b__echo")).await;
    assert_eq!(text(&s.call("b__echo", json!({"text": "b"})).await), "b");
    assert_eq!(pid_of(&gw.server_status("a").await), pid);
}

#[tokio::test]
async fn sighup_reloads() {
    let (a, b) = (unique("hup-a"), unique("hup-b"));
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&one);
    let s = gw.session().await;

    // gateway.toml becomes a symlink to real.toml: edits to real.toml are invisible to
    // the watcher (it follows names in the folder), so only SIGHUP can apply them.
    let dir = gw.config_path().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("real.toml"), &one).unwrap();
    std::os::unix::fs::symlink("real.toml", dir.join("link.tmp")).unwrap();
    let before = reloads(&gw);
    std::fs::rename(dir.join("link.tmp"), gw.config_path()).unwrap();
    reloaded(&gw, before).await;
    // Let any straggling watcher event from the rename settle (SETTLE is 200 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = reloads(&gw);
    std::fs::write(dir.join("real.toml"), format!("{one}{}", server("b", &b, &[], ""))).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(reloads(&gw), before, "the watcher saw real.toml change");
    assert!(!has(&s.tool_names().await, "b__echo"));

    // SAFETY: kill(2) on the gateway this test spawned; no memory is touched.
    unsafe {
        libc::kill(gw.child.id() as i32, libc::SIGHUP);
    }
    assert!(gw.wait_log("SIGHUP: reloading", WAIT).await, "{}", gw.logs());
    reloaded(&gw, before).await;
    tools_until(&gw, &s, |n| has(n, "b__echo")).await;
    assert_eq!(text(&s.call("b__echo", json!({"text": "hup"})).await), "hup");
}

/// A tools/call answered with the rate-limit tool error.
fn limited(resp: &Value) -> bool {
    resp["result"]["isError"] == true && text(resp).contains("Rate limit exceeded")
}

#[tokio::test]
async fn a_per_tool_limit_added_on_reload_takes_effect() {
    let a = unique("lim-a");
    let gw = Gateway::start(&server("a", &a, &[], ""));
    let s = gw.session().await;
    for i in 0..5 {
        let r = s.call_id(json!(i), "a__echo", json!({"text": "free"})).await;
        assert_eq!(text(&r), "free", "{r}");
    }

    let before = reloads(&gw);
    rewrite(
        &gw,
        &server("a", &a, &[], "rate_limits = { per_tool = { echo = \"2/m\" } }\n"),
    );
    reloaded(&gw, before).await;
    ready(&gw, "a").await;
    for i in 0..2 {
        let r = s.call_id(json!(i), "a__echo", json!({"text": "ok"})).await;
        assert_eq!(text(&r), "ok", "{r}");
    }
    let r = s.call_id(json!(3), "a__echo", json!({"text": "over"})).await;
    assert!(limited(&r), "the third call in a minute is limited: {r}");
    // Other tools are not limited.
    let r = s.call_id(json!(4), "a__add", json!({"a": 1, "b": 2})).await;
    assert_eq!(text(&r), "3", "{r}");

    // And removed again: unlimited.
    let before = reloads(&gw);
    rewrite(&gw, &server("a", &a, &[], ""));
    reloaded(&gw, before).await;
    ready(&gw, "a").await;
    let r = s.call_id(json!(5), "a__echo", json!({"text": "free again"})).await;
    assert_eq!(text(&r), "free again", "{r}");
}

#[tokio::test]
async fn a_global_per_client_limit_added_on_reload_takes_effect() {
    let a = unique("glob-a");
    let one = server("a", &a, &[], "");
    let gw = Gateway::start(&one);
    let s = gw.session().await;
    let pid = pid_of(&ready(&gw, "a").await);
    let before = reloads(&gw);
    rewrite(&gw, &format!("[rate_limits]\nper_client = \"3/m\"\n\n{one}"));
    reloaded(&gw, before).await;
    let mut answers = Vec::new();
    for i in 0..4 {
        answers.push(s.call_id(json!(i), "a__echo", json!({"text": "x"})).await);
    }
    assert!(answers[..3].iter().all(|r| text(r) == "x"), "{answers:?}");
    assert!(limited(&answers[3]), "{}", answers[3]);
    // Only [rate_limits] changed: the server was left alone.
    assert_eq!(pid_of(&gw.server_status("a").await), pid);
}

/// Changing only a server's rate_limits restarts its child, which fails its in-flight
/// calls: the limits live in the server's config entry, and any difference in the entry
/// counts as a change (router.rs `Gateway::reload` compares whole `config::Server`s).
/// Prefix, tool filter and timeout changes do the same. Run with `--ignored`.
#[tokio::test]
async fn a_rate_limit_edit_leaves_the_child_and_its_calls_alone() {
    let a = unique("lim-keep");
    let gw = Gateway::start(&server("a", &a, &[], ""));
    let s = gw.session().await;
    let pid = pid_of(&ready(&gw, "a").await);
    let mut call = s.start(json!(1), "tools/call", slow("a__slow", 2.0, 4)).await;
    assert!(call.next(WAIT).await.is_some(), "a progress notification");
    let before = reloads(&gw);
    rewrite(
        &gw,
        &server("a", &a, &[], "rate_limits = { per_tool = { echo = \"2/m\" } }\n"),
    );
    reloaded(&gw, before).await;
    let (_, resp) = call.response(WAIT).await;
    assert_eq!(text(&resp), "done", "{resp}");
    assert_eq!(pid_of(&ready(&gw, "a").await), pid);
}

/// A reload that narrows a client's allowlist stops what it was subscribed to reaching it
/// (as a URI it may not see any more, it hears nothing of it); one that removes the
/// client ends its sessions, GET stream and all, as a revoked token would.
#[tokio::test]
async fn a_reload_that_narrows_or_removes_a_client_reaches_its_open_session() {
    let name = unique("revoke");
    let uri = format!("mock://{name}/readme");
    let clients = |alice: &str| {
        format!(
            "{}[clients.bob]\ntoken = \"bob-token-0123456789ab\"\n\n{alice}",
            server("m", &name, &["--two-way"], "")
        )
    };
    let alice = "[clients.alice]\ntoken = \"alice-token-0123456789\"\n";
    let gw = Gateway::start(&clients(alice));
    let a = Session::open_as(&gw.url, "alice-token-0123456789").await;
    let b = Session::open_as(&gw.url, "bob-token-0123456789ab").await;
    let r = a.request(json!(1), "resources/subscribe", json!({"uri": uri})).await;
    assert_eq!(r["result"], json!({}), "{r}");
    let mut a_get = a.get_stream().await;

    let before = reloads(&gw);
    rewrite(&gw, &clients(&format!("{alice}deny = [\"mock://*\"]\n")));
    reloaded(&gw, before).await;
    let r = b.call("m__update_resource", json!({"uri": uri})).await;
    assert_eq!(text(&r), format!("updated {uri}"), "{r}");
    // Then a change alice does hear, on the same stream: the update did not come first.
    assert_eq!(text(&b.call("m__add_tool", json!({"name": "after"})).await), "added");
    let m = a_get.next(WAIT).await.expect("list_changed on alice's stream");
    assert_eq!(m["method"], "notifications/tools/list_changed", "alice heard {m}");

    let before = reloads(&gw);
    rewrite(&gw, &clients(""));
    reloaded(&gw, before).await;
    let deadline = Instant::now() + WAIT;
    loop {
        match a_get.next(deadline.saturating_duration_since(Instant::now())).await {
            None => break,
            Some(m) => assert_eq!(m["method"], "notifications/tools/list_changed", "alice heard {m}"),
        }
    }
    assert!(Instant::now() < deadline, "alice's GET stream is still open");
    let (status, _) = a.post_text(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_ends_the_sessions_the_old_one_opened() {
    let name = unique("rotate");
    let config = |token: &str| format!("{}[clients.alice]\ntoken = \"{token}\"\n", server("m", &name, &[], ""));
    let gw = Gateway::start(&config("alice-token-0123456789"));
    let a = Session::open_as(&gw.url, "alice-token-0123456789").await;
    let mut get = a.get_stream().await;
    let before = reloads(&gw);
    rewrite(&gw, &config("alice-token-rotated-0123"));
    reloaded(&gw, before).await;
    let deadline = Instant::now() + WAIT;
    while let Some(m) = get.next(deadline.saturating_duration_since(Instant::now())).await {
        assert_eq!(m["method"], "notifications/tools/list_changed", "alice heard {m}");
    }
    assert!(Instant::now() < deadline, "the old token's GET stream is still open");
    // The old token is refused, and the session is gone for the new one too (which opens
    // a session of its own).
    let (status, _) = a.post_text(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    assert_eq!(status, 401);
    let b = Session::open_as(&gw.url, "alice-token-rotated-0123").await;
    assert_eq!(b.request(json!(3), "ping", json!({})).await["result"], json!({}));
    let old = Session {
        http: b.http.clone(),
        url: b.url.clone(),
        id: a.id.clone(),
        init: a.init.clone(),
    };
    let (status, body) = old.post_text(r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#).await;
    assert_eq!(status, 404, "{body}");
}
