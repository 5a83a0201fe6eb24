//! Downstreams that bend the protocol, one test each, next to a well-behaved server;
//! and a 20 MB tool result through HTTP.

use crate::common::*;
use serde_json::json;
use std::time::Duration;

/// A gateway with server `q` (the mock with `quirk`) and a normal server `n`; checks the
/// basics every quirky server must still give: q's tools listed, calls routed to both.
async fn quirky(quirk: &str) -> (Gateway, Session) {
    let (q, n) = (unique(quirk), unique("normal"));
    let gw = Gateway::start(&[server("q", &q, &["--quirk", quirk], ""), server("n", &n, &[], "")].concat());
    let s = gw.session().await;
    let tools = s.tool_names().await;
    for t in ["q__echo", "q__slow", "n__echo"] {
        assert!(tools.contains(&t.to_string()), "{quirk}: {t} missing from {tools:?}");
    }
    for i in 0..3 {
        let r = s
            .call_id(json!(i), "q__echo", json!({"text": format!("{quirk} {i}")}))
            .await;
        assert_eq!(r["id"], i);
        assert_eq!(text(&r), format!("{quirk} {i}"), "{quirk}: {r}");
    }
    assert_eq!(text(&s.call("n__add", json!({"a": 1, "b": 2})).await), "3");
    (gw, s)
}

/// Concurrent calls with distinct payloads all come back to their callers.
async fn concurrent_echoes(s: &Session, tool: &str, n: usize) {
    let calls = (0..n).map(|i| async move {
        let r = s
            .call_id(json!(format!("e{i}")), tool, json!({"text": format!("payload {i}")}))
            .await;
        (i, r)
    });
    let mut handles = Vec::new();
    for c in calls {
        handles.push(c);
    }
    let results = futures::future::join_all(handles).await;
    for (i, r) in results {
        assert_eq!(r["id"], format!("e{i}"));
        assert_eq!(text(&r), format!("payload {i}"));
    }
}

#[tokio::test]
async fn null_id_error_is_ignored() {
    // The mock answers every notification (initialized, cancelled) with an id:null error.
    let (gw, s) = quirky("null-id-error").await;
    let mut call = s
        .start(
            json!(9),
            "tools/call",
            json!({"name": "q__slow", "arguments": {"seconds": 30, "steps": 300}, "_meta": {"progressToken": 9}}),
        )
        .await;
    assert_eq!(
        call.next(Duration::from_secs(10)).await.unwrap()["method"],
        "notifications/progress"
    );
    s.notify("notifications/cancelled", json!({"requestId": 9})).await;
    let (_, r) = call.response(Duration::from_secs(5)).await;
    assert_eq!(error_of(&r)["code"], -32800);
    assert!(gw.wait_log("[mock] cancelled ", Duration::from_secs(5)).await);
    concurrent_echoes(&s, "q__echo", 10).await;
    assert_eq!(gw.server_status("q").await["state"], "ready");
}

#[tokio::test]
async fn response_without_id_is_ignored() {
    let (gw, s) = quirky("no-id-response").await;
    concurrent_echoes(&s, "q__echo", 10).await;
    assert_eq!(gw.server_status("q").await["state"], "ready");
}

#[tokio::test]
async fn stdout_noise_is_skipped() {
    let (gw, s) = quirky("noise").await;
    concurrent_echoes(&s, "q__echo", 10).await;
    assert!(
        gw.wait_log("not JSON-RPC", Duration::from_secs(10)).await,
        "noise not logged:\n{}",
        gw.logs()
    );
    assert_eq!(gw.server_status("q").await["state"], "ready");
}

#[tokio::test]
async fn server_without_capabilities_still_lists_tools() {
    let (gw, s) = quirky("no-capabilities").await;
    let tools = s.tool_names().await;
    assert_eq!(tools.iter().filter(|t| t.starts_with("q__")).count(), 9, "{tools:?}");
    // Its prompts, resources and templates are empty; n's are still there.
    let prompts = s.list("prompts/list", "prompts").await;
    assert_eq!(
        prompts.iter().map(|p| p["name"].as_str().unwrap()).collect::<Vec<_>>(),
        ["n__greet"]
    );
    let resources = s.list("resources/list", "resources").await;
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert!(resources[0]["uri"].as_str().unwrap().contains("normal"));
    let templates = s.list("resources/templates/list", "resourceTemplates").await;
    assert_eq!(templates.len(), 1, "{templates:?}");
    let st = gw.server_status("q").await;
    assert_eq!(
        (st["state"].as_str(), st["tools"].as_u64(), st["prompts"].as_u64()),
        (Some("ready"), Some(9), Some(0))
    );
}

#[tokio::test]
async fn old_protocol_version_is_negotiated() {
    let (gw, s) = quirky("old-version").await;
    assert_eq!(gw.server_status("q").await["protocolVersion"], "2024-11-05");
    assert_eq!(gw.server_status("n").await["protocolVersion"], "2025-11-25");
    let r = s
        .request(
            json!(1),
            "prompts/get",
            json!({"name": "q__greet", "arguments": {"name": "old"}}),
        )
        .await;
    assert_eq!(r["result"]["messages"][0]["content"]["text"], "Hello, old!", "{r}");
    let r = s.request(json!(2), "tools/list", json!({})).await;
    assert!(
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "q__add"),
        "{r}"
    );
}

#[tokio::test]
async fn string_ids_from_server_are_still_routed() {
    let (gw, s) = quirky("string-ids").await;
    concurrent_echoes(&s, "q__echo", 20).await;
    // Progress and a slow answer with a string id.
    let all = s
        .request_all(
            json!(3),
            "tools/call",
            json!({"name": "q__slow", "arguments": {"seconds": 0.2, "steps": 2}, "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert_eq!(text(all.last().unwrap()), "done");
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(gw.server_status("q").await["state"], "ready");
}

#[tokio::test]
async fn twenty_megabyte_result_arrives_intact_over_http() {
    let name = unique("big");
    let gw = Gateway::start(&server("b", &name, &[], ""));
    let s = gw.session().await;
    let r = s.call("b__big", json!({"bytes": 20_000_000})).await;
    let t = r["result"]["content"][0]["text"].as_str().expect("text");
    assert_eq!(t.len(), 20_000_000);
    assert!(t.bytes().all(|b| b == b'x'));
    // And the connection to the server is still usable.
    assert_eq!(text(&s.call("b__echo", json!({"text": "after"})).await), "after");
}

/// A server that answers `initialize` with a protocol version the gateway never offered
/// is not spoken to in it: it is down, with the version (escaped) and the ones the gateway
/// speaks in its reason, and the gateway serves the others.
#[tokio::test]
async fn a_protocol_version_nobody_offered_is_refused() {
    let (q, n) = (unique("alien"), unique("normal"));
    let gw = Gateway::start(
        &[
            server("q", &q, &["--quirk", "alien-version"], ""),
            server("n", &n, &[], ""),
        ]
        .concat(),
    );
    let st = gw.server_status("q").await;
    let reason = st["reason"].as_str().unwrap_or_default();
    assert_eq!(st["state"], "down", "{st}");
    assert!(
        reason.contains(r#"protocol version "1999-01-01\n", which mcp-gateway does not speak (it speaks 2025-11-25"#),
        "{st}"
    );
    let s = gw.session().await;
    assert!(s.tool_names().await.contains(&"n__echo".to_string()));
}
