//! Operations under hostile conditions (issue #13), each against the real binary and real
//! children: trace logging written into the config's own folder must not feed the config
//! watcher; a child flooding stderr is logged at a bounded rate and never blocked; and a
//! crash-looping server's failed start attempts count as restarts.

use crate::common::*;
use serde_json::json;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(15);

/// A child process killed (SIGKILL) and reaped on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `path` holds from byte `from` on (lossy UTF-8); empty when unreadable.
fn read_from(path: &Path, from: u64) -> String {
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(from)).is_ok() {
            let _ = f.read_to_end(&mut out);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The last `n` bytes of `s` or a little more (whole characters).
fn tail(s: &str, n: usize) -> &str {
    let mut at = s.len().saturating_sub(n);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[at..]
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Waits until the file holds `needle` after byte `from`.
async fn file_has(path: &Path, from: u64, needle: &str) -> bool {
    until(WAIT, || read_from(path, from).contains(needle)).await
}

/// Before the fix the notify crate logged (at trace) every inotify event in the config's
/// folder; with the log file in that folder each log line was a new event: tens of MB
/// a second while idle. Now only config-file events are acted on and the watcher's
/// dependency logs nothing per event.
#[tokio::test]
async fn trace_logs_in_the_config_folder_do_not_feed_the_watcher() {
    let name = unique("trace-loop");
    let (dir, mut cmd) = gateway_command(
        &server("a", &name, &[], ""),
        &["serve", "--listen", "127.0.0.1:0"],
        &[("MCP_GATEWAY_LOG", "trace")],
    );
    let log = dir.path().join("gateway.log");
    let file = std::fs::File::create(&log).expect("create the log file");
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(file);
    let _gw = Killed(cmd.spawn().expect("spawn gateway"));
    assert!(
        file_has(&log, 0, "mcp-gateway listening on").await && file_has(&log, 0, "listed").await,
        "the gateway did not start; log:\n{:.4000}",
        read_from(&log, 0)
    );

    // Idle for 2 s (the measurement itself): the log must stay small.
    let before = size(&log);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = size(&log) - before;
    assert!(
        grown < 200_000,
        "{grown} bytes of log in 2 idle seconds; its tail:\n{}",
        tail(&read_from(&log, size(&log).saturating_sub(3000)), 3000)
    );

    // The config file itself is still watched: an edit adding a server is picked up.
    let at = size(&log);
    let name_b = unique("trace-loop-b");
    let edited = format!("{}{}", server("a", &name, &[], ""), server("b", &name_b, &[], ""));
    std::fs::write(dir.path().join("gateway.toml"), edited).expect("rewrite the config");
    assert!(
        file_has(&log, at, "reload done").await,
        "no reload; log since the edit:\n{:.4000}",
        read_from(&log, at)
    );
    assert!(
        !mock_pids(&name_b).is_empty(),
        "the added server was not started; log:\n{:.4000}",
        read_from(&log, at)
    );
}

/// The largest number in `log` after "flood ": how far the child got.
fn last_flood_line(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split("flood ").nth(1)?.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// A child writing stderr as fast as the pipe takes it made gigabytes of gateway log.
/// Now its lines are logged at a bounded rate (100/s, bursts of 200) with a
/// "suppressed N" line for the rest, while the pipe is still drained at full speed.
#[tokio::test]
async fn a_child_flooding_stderr_is_logged_at_a_bounded_rate_and_never_blocked() {
    let name = unique("flood");
    // The child (and its budget) cannot start before this.
    let started = Instant::now();
    let gw = Gateway::start(&server("f", &name, &["--quirk", "stderr-flood"], ""));
    let s = gw.session().await;
    assert_eq!(text(&s.call("f__echo", json!({"text": "up"})).await), "up");

    let t0 = Instant::now();
    let before = gw.logs().len();
    assert!(
        gw.wait_log("suppressed", Duration::from_secs(5)).await,
        "no suppressed line; log tail:\n{}",
        tail(&gw.logs(), 3000)
    );
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t0.elapsed())).await;
    let logs = gw.logs();
    let window = &logs[before..];
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        window.len() < 300_000,
        "{} bytes of log in {secs:.1} s; tail:\n{}",
        window.len(),
        tail(window, 2000)
    );
    // Every flood line the gateway logged, against the rate since the child could have
    // started: 200 at once, then 100/s.
    let logged = logs.lines().filter(|l| l.contains("flood ")).count() as f64;
    let allowed = 200.0 + 100.0 * started.elapsed().as_secs_f64();
    assert!(
        logged <= allowed,
        "{logged} flood lines logged in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The child was never held up: it wrote far more lines than were logged.
    let written = last_flood_line(&logs);
    assert!(
        written as f64 > 20.0 * logged.max(1.0),
        "the child got to line {written} only, {logged} logged"
    );
    let suppressed = window
        .lines()
        .find(|l| l.contains("suppressed"))
        .unwrap_or_default()
        .to_string();
    assert!(suppressed.contains("stderr lines"), "{suppressed}");

    // And the server still answers, on the same child.
    assert_eq!(text(&s.call("f__echo", json!({"text": "still"})).await), "still");
    let st = gw.server_status("f").await;
    assert_eq!(
        (st["state"].as_str(), st["restarts"].as_u64()),
        (Some("ready"), Some(0)),
        "{st}"
    );
}

/// `mcp_gateway_downstream_restarts_total{server="NAME"}` from /metrics.
async fn metric_restarts(gw: &Gateway, server: &str) -> u64 {
    let text = gw.get_text("/metrics").await;
    let key = format!("mcp_gateway_downstream_restarts_total{{server=\"{server}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /metrics:\n{text}"))
}

/// A server that never starts was tried five times while `restarts` said 0. Every start
/// attempt after the first counts, failed ones included (attempts 1 + 2 + 4 s apart: 3
/// restarts by about 7 s).
#[tokio::test]
async fn failed_start_attempts_count_as_restarts() {
    let steady = unique("steady");
    let config = format!(
        "{}[servers.never]\ncommand = \"sh\"\nargs = [\"-c\", \"exit 1\"]\n\n\
         [servers.missing]\ncommand = \"/nonexistent/mcp-server-{steady}\"\n",
        server("steady", &steady, &[], "")
    );
    let gw = Gateway::start(&config);
    let deadline = Instant::now() + WAIT;
    for name in ["never", "missing"] {
        loop {
            let st = gw.server_status(name).await;
            if st["restarts"].as_u64().is_some_and(|r| r >= 3) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: restarts never reached 3: {st}\nlog:\n{}",
                gw.logs()
            );
            assert_ne!(st["state"], "ready", "{st}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // /metrics agrees: read between two /status reads of the same counter.
        let low = gw.server_status(name).await["restarts"].as_u64().unwrap_or(0);
        let m = metric_restarts(&gw, name).await;
        let high = gw.server_status(name).await["restarts"].as_u64().unwrap_or(0);
        assert!((low..=high).contains(&m), "{name}: /metrics {m}, /status {low}..{high}");
        assert!(m >= 3, "{name}: {m}");
    }
    // A server that started once and never failed has not restarted.
    let st = gw.server_status("steady").await;
    assert_eq!(
        (st["state"].as_str(), st["restarts"].as_u64()),
        (Some("ready"), Some(0)),
        "{st}"
    );
    assert_eq!(metric_restarts(&gw, "steady").await, 0);
}
