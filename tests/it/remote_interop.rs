//! Remote interop: official SDK servers reached over HTTP through the gateway: the
//! Python SDK server (mcp 2.x) in streamable-http mode and the reference
//! `@modelcontextprotocol/server-everything` in its `streamableHttp` and `sse` modes.
//!
//! Needs `.venv/` and `node_modules/`: run `scripts/setup-test-deps` first. The tests
//! panic (never skip) when those are missing.

use crate::common::*;
use serde_json::json;
use std::path::PathBuf;

const SETUP: &str =
    "run scripts/setup-test-deps (creates .venv and node_modules) before `cargo test --test it remote_interop::`";

fn venv_python() -> String {
    let py = repo().join(".venv/bin/python");
    assert!(py.exists(), "remote interop tests need {} — {SETUP}", py.display());
    path_str(&py)
}

/// The server-everything entry point (its package `bin`).
fn everything() -> String {
    let js: PathBuf = repo().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(js.exists(), "remote interop tests need {} — {SETUP}", js.display());
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        matches!(&node, Ok(o) if o.status.success()),
        "remote interop tests need `node` on PATH ({node:?}) — {SETUP}"
    );
    path_str(&js)
}

/// Starts server-everything in `mode` (`streamableHttp` or `sse`) on port 0 (it reads PORT).
async fn start_everything(mode: &str) -> Proc {
    let js = everything();
    Proc::start("node", &[&js, mode], &[("PORT", "0")]).await
}

#[tokio::test]
async fn python_sdk_server_over_streamable_http() {
    let py = venv_python();
    let server = Proc::start(&py, &["tests/fixtures/py_sdk_server.py", "--http", "0"], &[]).await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let gw = Gateway::start(&remote_table("py", &url, ""));
    let st = gw.server_status("py").await;
    assert_eq!(st["state"], "ready", "{st}\n{}\n{}", gw.logs(), server.output());
    assert_eq!(st["transport"], "http");
    assert!(st["protocolVersion"].is_string(), "{st}");

    let s = gw.session().await;
    let names = s.tool_names().await;
    assert!(names.contains(&"py__py_add".to_string()), "{names:?}");
    assert!(names.contains(&"py__py_echo".to_string()), "{names:?}");
    assert_eq!(text(&s.call("py__py_add", json!({"a": 40, "b": 2})).await), "42");
    let r = s.call("py__py_echo", json!({"text": "héllo ✓ \"py\""})).await;
    assert_eq!(text(&r), "héllo ✓ \"py\"");
    let prompts = s.list("prompts/list", "prompts").await;
    assert!(prompts.iter().any(|p| p["name"] == "py__py_prompt"), "{prompts:?}");
    let r = s.request(json!(9), "resources/read", json!({"uri": "py://info"})).await;
    assert_eq!(r["result"]["contents"][0]["text"], "py-sdk-server info", "{r}");
}

/// Lists and calls server-everything's `echo` through the gateway configured with `table`.
async fn everything_echo(table: &str, server: &Proc) -> Gateway {
    let gw = Gateway::start(table);
    let st = gw.server_status("ev").await;
    assert_eq!(st["state"], "ready", "{st}\n{}\n{}", gw.logs(), server.output());
    let s = gw.session().await;
    let names = s.tool_names().await;
    assert!(names.contains(&"ev__echo".to_string()), "{names:?}");
    assert!(names.contains(&"ev__get-sum".to_string()), "{names:?}");
    let r = s.call("ev__echo", json!({"message": "hi from the gateway ✓"})).await;
    assert_eq!(text(&r), "Echo: hi from the gateway ✓", "{r}");
    let r = s.call_id(json!("sum"), "ev__get-sum", json!({"a": 2, "b": 40})).await;
    assert!(text(&r).contains("42"), "{r}");
    // Several at once over one downstream session.
    let calls = (0..8).map(|i| s.call_id(json!(i), "ev__echo", json!({"message": format!("m{i}")})));
    for (i, r) in futures::future::join_all(calls).await.into_iter().enumerate() {
        assert_eq!(r["id"], i);
        assert_eq!(text(&r), format!("Echo: m{i}"));
    }
    gw
}

#[tokio::test]
async fn server_everything_streamable_http() {
    let server = start_everything("streamableHttp").await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let gw = everything_echo(&remote_table("ev", &url, "transport = \"streamable-http\""), &server).await;
    assert_eq!(gw.server_status("ev").await["transport"], "streamable-http");
}

#[tokio::test]
async fn server_everything_legacy_sse() {
    let server = start_everything("sse").await;
    let url = format!("http://127.0.0.1:{}/sse", server.port);
    let gw = everything_echo(&remote_table("ev", &url, "transport = \"sse\""), &server).await;
    assert_eq!(gw.server_status("ev").await["transport"], "sse");
    assert!(gw.server_status("ev").await["protocolVersion"].is_string());
}

#[tokio::test]
async fn server_everything_sse_found_by_auto_fallback() {
    let server = start_everything("sse").await;
    let url = format!("http://127.0.0.1:{}/sse", server.port);
    let gw = everything_echo(&remote_table("ev", &url, "transport = \"auto\""), &server).await;
    assert!(
        gw.logs().contains("trying the legacy HTTP+SSE transport"),
        "{}",
        gw.logs()
    );
}

#[tokio::test]
async fn auto_transport_prefers_streamable_http() {
    let server = start_everything("streamableHttp").await;
    let url = format!("http://127.0.0.1:{}/mcp", server.port);
    let gw = everything_echo(&remote_table("ev", &url, ""), &server).await;
    assert!(!gw.logs().contains("legacy HTTP+SSE"), "{}", gw.logs());
}
