//! How the command starts: `serve`'s flags without the word `serve`, and the port bound
//! before any server is started.

use crate::common::*;
use std::process::Stdio;

#[tokio::test]
async fn listen_works_without_the_serve_word() {
    let name = unique("noserve");
    let (_dir, mut cmd) = gateway_command(&server("a", &name, &[], ""), &["--listen", "127.0.0.1:0"], &[]);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("mcp-gateway listening on ") || l.contains("error"))
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = line.unwrap_or_default();
    assert!(line.starts_with("mcp-gateway listening on http://127.0.0.1:"), "{line}");
}

#[test]
fn a_port_in_use_is_reported_before_any_server_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let name = unique("portinuse");
    let (_dir, mut cmd) = gateway_command(
        &server("a", &name, &[], ""),
        &["--listen", &format!("127.0.0.1:{port}")],
        &[],
    );
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    // Not one child was spawned: the mock logs its start on stderr, the gateway its handshake.
    assert!(!stderr.contains("started (quirks"), "{stderr}");
    assert!(!stderr.contains("initialized"), "{stderr}");
    assert!(pids_matching(&name).is_empty());
}

/// A stdio server that exits before answering `initialize` (here: Python cannot open its
/// script, the usual mistake with a relative path) has its last stderr lines in
/// `/status` `lastError` and in `check --connect`, with the child's secrets masked.
#[tokio::test]
async fn a_child_that_exits_before_initialize_shows_its_stderr() {
    let cfg = format!(
        "[servers.missing]\ncommand = \"python3\"\nargs = [\"no_such_server_script.py\"]\ncwd = {:?}\nrestart = \"never\"\n\n\
         [servers.leaky]\ncommand = \"python3\"\nargs = [\"-c\", \"import os,sys; sys.stderr.write('token is ' + os.environ['TOKEN'] + chr(10)); sys.exit(3)\"]\n\
         env = {{ TOKEN = \"s3cret-token-value\" }}\nrestart = \"never\"\n",
        repo().display().to_string()
    );
    let gw = Gateway::start(&cfg);
    let mut seen = (String::new(), String::new());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let (a, b) = (gw.server_status("missing").await, gw.server_status("leaky").await);
        seen = (
            a["lastError"].as_str().unwrap_or_default().to_owned(),
            b["lastError"].as_str().unwrap_or_default().to_owned(),
        );
        if seen.0.contains("stderr") && seen.1.contains("stderr") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        seen.0.contains("can't open file") && seen.0.contains("no_such_server_script.py"),
        "{}",
        seen.0
    );
    assert!(seen.1.contains("token is ***"), "{}", seen.1);
    assert!(!seen.1.contains("s3cret-token-value"));
    assert!(!gw.logs().contains("s3cret-token-value"), "the secret reached the log");

    let (run, _dir) = check(&cfg, &["--connect"], &[]);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(run.stdout.contains("can't open file"), "{}", run.stdout);
    assert!(!format!("{}{}", run.stdout, run.stderr).contains("s3cret-token-value"));
}

/// A child's configured env values are masked in what it says back that the gateway
/// shows: a JSON-RPC error it answers (to the client, and so in `/status`), and a stdout
/// line that is not JSON-RPC (logged as skipped).
#[tokio::test]
async fn a_childs_error_and_stray_stdout_lines_mask_its_secrets() {
    let secret = "s3cret-api-key-77";
    let cfg = server(
        "calc",
        &unique("mask"),
        &[],
        &format!("env = {{ API_KEY = \"{secret}\" }}\n"),
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let r = s.call("calc__env", serde_json::json!({"name": "API_KEY"})).await;
    assert_eq!(text(&r), secret, "a result is passed on as the server wrote it");
    let r = s
        .call("calc__env", serde_json::json!({"name": "API_KEY", "leak": true}))
        .await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(message, "upstream rejected key ***", "{r}");
    assert!(
        gw.wait_log("debug: using key ***", std::time::Duration::from_secs(10))
            .await,
        "{}",
        gw.logs()
    );
    assert!(!gw.logs().contains(secret), "the secret reached the log");
}

/// A cgroup with a CPU quota of half a CPU, made for one test: cgroup v1's `cpu`
/// hierarchy, or v2 where `cpu` can be enabled below its root. Removed on drop (once
/// the processes put in it have exited).
struct Quota(std::path::PathBuf);

impl Quota {
    fn half_a_cpu() -> Quota {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = |fs: &str, opt: Option<&str>| {
            mounts.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let r: Vec<&str> = right.split(' ').collect();
                let ok = r.first() == Some(&fs)
                    && opt.is_none_or(|o| r.get(2).is_some_and(|s| s.split(',').any(|x| x == o)));
                ok.then(|| std::path::PathBuf::from(left.split(' ').nth(4).unwrap()))
            })
        };
        let name = format!("mcp-gateway-test-{}", std::process::id());
        if let Some(v1) = mount("cgroup", Some("cpu")) {
            let dir = v1.join(name);
            std::fs::create_dir(&dir)
                .unwrap_or_else(|e| panic!("cannot make {}: {e} (the tests run as root)", dir.display()));
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
            std::fs::write(dir.join("cpu.cfs_quota_us"), "50000").unwrap();
            return Quota(dir);
        }
        let v2 = mount("cgroup2", None).expect("neither cgroup v1's cpu nor cgroup v2 is mounted");
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
        let dir = v2.join(name);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot make {}: {e} (the tests run as root)", dir.display()));
        std::fs::write(dir.join("cpu.max"), "50000 100000")
            .unwrap_or_else(|e| panic!("cgroup v2 has no cpu controller to enable below {}: {e}", v2.display()));
        Quota(dir)
    }

    /// `mcp-gateway stdio` on `config`, in this cgroup or not, its input closed at once:
    /// what it wrote on stderr.
    fn stdio_stderr(&self, config: &std::path::Path, inside: bool) -> String {
        let mut cmd = if inside {
            let mut c = std::process::Command::new("sh");
            c.arg("-c")
                .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
                .arg(&self.0)
                .arg(BIN);
            c
        } else {
            std::process::Command::new(BIN)
        };
        let out = cmd
            .args(["stdio", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_cpu_quota_turns_the_default_busy_poll_off_and_a_set_one_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (unset, set) = (dir.path().join("unset.toml"), dir.path().join("set.toml"));
    std::fs::write(&unset, "[gateway]\n").unwrap();
    std::fs::write(&set, "[gateway]\nbusy_poll = \"200us\"\n").unwrap();
    let quota = Quota::half_a_cpu();
    let off = "gateway.busy_poll is off: this process has a CPU quota of 0.50 CPUs";
    let err = quota.stdio_stderr(&unset, true);
    assert!(err.contains(off), "{err}");
    assert!(err.contains(&quota.0.display().to_string()), "names the file: {err}");
    let err = quota.stdio_stderr(&set, true);
    assert!(!err.contains("busy_poll is off"), "{err}");
    // Outside that cgroup, as the tests themselves run: off only if they have a quota too.
    let err = quota.stdio_stderr(&unset, false);
    assert_eq!(
        err.contains("busy_poll is off"),
        mcp_gateway::runtime::cpu_quota().is_some(),
        "{err}"
    );
}

/// What a child writes reaches the gateway's log with its control characters escaped, so
/// it can forge no log line (a CR that returns over the line's start, a newline) and send
/// no escape sequence to an operator's terminal; and a long secret across the point where
/// a logged line is cut is masked whole, not shown in part.
#[tokio::test]
async fn a_childs_lines_reach_the_log_escaped_and_masked_before_they_are_cut() {
    let secret = format!("S3cretDbPassw0rd-{}", "ABCDEFGHIJKLMNOPQRSTUVWXYZ".repeat(10));
    let cfg = server(
        "calc",
        &unique("escape"),
        &["--two-way"],
        &format!("env = {{ DB_PASSWORD = \"{secret}\" }}\n"),
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let forged = "x\r2026-12-05T00:00:00Z  INFO mcp_gateway: forged \u{1b}[31mred\u{9b}2J";
    let r = s.call("calc__mark", serde_json::json!({"text": forged})).await;
    assert_eq!(text(&r), "marked");
    let escaped = r"mark x\u{d}2026-12-05T00:00:00Z  INFO mcp_gateway: forged \u{1b}[31mred\u{9b}2J";
    assert!(
        gw.wait_log(escaped, std::time::Duration::from_secs(10)).await,
        "{}",
        gw.logs()
    );
    // The stray stdout line is cut at 200 bytes, inside the secret: masked all the same.
    s.call("calc__env", serde_json::json!({"name": "DB_PASSWORD", "leak": true}))
        .await;
    assert!(
        gw.wait_log("debug: using key ***", std::time::Duration::from_secs(10))
            .await,
        "{}",
        gw.logs()
    );
    let logs = gw.logs();
    assert!(
        !logs.contains("S3cretDbPassw0rd"),
        "a part of the secret reached the log:\n{logs}"
    );
    assert!(
        !logs.contains('\r') && !logs.contains('\u{1b}') && !logs.contains('\u{9b}'),
        "{logs:?}"
    );
}

/// Peers' words reach log fields (a server's error message, a tool name, a protocol
/// version): every log line stays one line, its line breaks and control characters
/// escaped, so a server cannot forge a line of the gateway's or clear the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_error_message_cannot_forge_a_log_line() {
    let cfg = server("calc", &unique("forge"), &["--quirk", "forged-list-error"], "");
    let gw = Gateway::start(&cfg);
    assert!(
        gw.wait_log(
            r"boom\n2099-01-01T00:00:00Z  WARN mcp_gateway: FORGED\r\u{1b}[2J",
            std::time::Duration::from_secs(10)
        )
        .await,
        "{}",
        gw.logs()
    );
    let logs = gw.logs();
    assert!(!logs.lines().any(|l| l.starts_with("2099")), "{logs}");
    assert!(!logs.contains('\r') && !logs.contains('\u{1b}'), "{logs:?}");
}

/// A server's tool named with a bidi override (`\u{202e}eteled_lla` shows as `all_delete`)
/// reaches the text log escaped, as a control character does: the operator reads what the
/// server sent, not what it wants shown. So do the line and paragraph separators, which
/// some log viewers break lines at, and zero-width characters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_bidi_override_reaches_the_log_escaped() {
    let cfg = server("calc", &unique("bidi"), &["--console", "--two-way"], "");
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let sent = "x\u{2028}2099-01-01T00:00:00Z  WARN mcp_gateway: FORGED\u{2029}\u{200b}\u{2066}";
    assert_eq!(
        text(&s.call("calc__mark", serde_json::json!({"text": sent})).await),
        "marked"
    );
    let shown = r"mark x\u{2028}2099-01-01T00:00:00Z  WARN mcp_gateway: FORGED\u{2029}\u{200b}\u{2066}";
    assert!(
        gw.wait_log(shown, std::time::Duration::from_secs(10)).await,
        "{}",
        gw.logs()
    );
    assert!(
        gw.logs().contains(r"tool \u{202e}eteled_lla of server 'calc'"),
        "{}",
        gw.logs()
    );
    let logs = gw.logs();
    for c in ['\u{202e}', '\u{2028}', '\u{2029}', '\u{200b}', '\u{2066}'] {
        assert!(!logs.contains(c), "{:?} in the log:\n{logs}", c);
    }
}

/// So do the JSON log's lines (`log_format = "json"`), as `\uXXXX` escapes that decode to
/// what the server sent: each line stays one JSON value, and `jq` shows the escapes' text
/// only when asked to decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_bidi_override_reaches_the_json_log_escaped() {
    let cfg = format!(
        "[telemetry]\nlog_format = \"json\"\n\n{}",
        server("calc", &unique("bidi-json"), &["--console", "--two-way"], "")
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let sent = "x\u{2028}FORGED\u{2029}\u{200b}\u{2066}";
    assert_eq!(
        text(&s.call("calc__mark", serde_json::json!({"text": sent})).await),
        "marked"
    );
    assert!(
        gw.wait_log(r"x\u2028FORGED\u2029\u200b\u2066", std::time::Duration::from_secs(10))
            .await,
        "{}",
        gw.logs()
    );
    let logs = gw.logs();
    for c in ['\u{202e}', '\u{2028}', '\u{2029}', '\u{200b}', '\u{2066}'] {
        assert!(!logs.contains(c), "{:?} in the log:\n{logs}", c);
    }
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let tool = lines
        .iter()
        .find(|v| v.to_string().contains("eteled_lla"))
        .expect("the tool's note");
    assert!(tool.to_string().contains("\u{202e}eteled_lla"), "{tool}");
}

/// A server's log messages that no client takes (no call in flight) are the gateway's to
/// log: with the server's name, cut as a stderr line is, and within the server's budget
/// of log lines (200 at once, 100 a second), not 2,000 lines of 20 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_flood_of_log_messages_is_logged_within_its_budget() {
    let cfg = server("calc", &unique("logflood"), &[], "");
    let mut gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let args = serde_json::json!({"message": "flood", "count": 2000, "bytes": 20000, "later": true});
    assert_eq!(text(&s.call("calc__log", args).await), "logged");
    // Answered after the flood on the same pipe: the gateway has read all of it.
    s.call("calc__echo", serde_json::json!({"text": "after"})).await;
    let started = std::time::Instant::now();
    gw.terminate();
    assert!(gw.wait_log(STDERR_CLOSED, std::time::Duration::from_secs(10)).await);
    let logs = gw.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("downstream log message")).collect();
    let budget = 200 + 100 * (2 + started.elapsed().as_secs() as usize);
    assert!(!lines.is_empty() && lines.len() <= budget, "{} lines", lines.len());
    for l in &lines {
        assert!(
            l.contains("server=calc") && l.len() < 5000,
            "{}",
            &l[..l.len().min(300)]
        );
    }
}

/// A server may write its error's JSON with escapes (`\/` for `/`, as PHP does, or any
/// `\u0073`): its secrets are masked in what the escapes mean, not only in the bytes.
#[tokio::test]
async fn a_secret_written_with_json_escapes_is_masked_all_the_same() {
    let secret = "s3cret/api/key+77==";
    let cfg = server(
        "calc",
        &unique("mask"),
        &[],
        &format!("env = {{ API_KEY = \"{secret}\" }}\n"),
    );
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let args = serde_json::json!({"name": "API_KEY", "leak": true, "escaped": true});
    let r = s.call("calc__env", args).await;
    assert_eq!(r["error"]["message"], "upstream rejected key ***", "{r}");
    assert_eq!(r["error"]["data"]["key"], "***", "{r}");
    assert_eq!(r["error"]["code"], -32001, "{r}");
}

/// A server's tool name is the server's to choose, however long: the notes about it (its
/// public name, listed twice) name it by its first 256 bytes and its length, so a server
/// cannot write megabytes into the gateway's log on every listing, as its stderr lines,
/// cut at 4 KiB, cannot either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_huge_tool_name_is_cut_in_the_log() {
    let cfg = server("calc", &unique("longname"), &["--quirk", "long-names"], "");
    let mut gw = Gateway::start(&cfg);
    let s = gw.session().await;
    assert!(s.tool_names().await.iter().any(|n| n.starts_with("calc__LONGNAME")));
    gw.terminate();
    assert!(gw.wait_log(STDERR_CLOSED, std::time::Duration::from_secs(10)).await);
    let logs = gw.logs();
    let notes: Vec<&str> = logs.lines().filter(|l| l.contains("tool LONGNAME")).collect();
    assert!(notes.len() >= 2, "the renaming and the repeat are said: {:.2000}", logs);
    for l in logs.lines() {
        assert!(l.len() < 8192, "a log line of {} bytes: {:.300}", l.len(), l);
    }
    assert!(logs.contains(&format!("({} bytes)", (1 << 20) + 8)), "{:.2000}", logs);
}
