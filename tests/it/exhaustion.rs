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
    let resumed = last
        .http
        .get(&last.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &last.id)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", "1-0")
        .timeout(T)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let replayed = resumed.text().await.unwrap();
    assert!(replayed.len() > BYTES, "{}", &replayed[..replayed.len().min(300)]);
}
