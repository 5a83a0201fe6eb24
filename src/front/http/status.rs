//! The endpoints beside MCP: `/readyz`, `/status` (JSON) and `/` (the same as a page),
//! `/metrics` (Prometheus text), and the RFC 9728 OAuth metadata.

use super::checks::resource_url;
use super::{json_response, reject, Http};
use crate::error::code;
use crate::supervisor::Status;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// `GET /.well-known/oauth-protected-resource`: RFC 9728 metadata (404 without OAuth).
pub(super) async fn resource_metadata(State(http): State<Http>, headers: HeaderMap) -> Response {
    let authn = http.gw.topology().auth.clone();
    match authn.metadata(&resource_url(&http, &headers)) {
        Some(doc) => json_response(doc.to_string().into_bytes()),
        None => reject(StatusCode::NOT_FOUND, code::INVALID_REQUEST, "no OAuth configured").into_response(),
    }
}

pub(super) async fn readyz(State(http): State<Http>) -> Response {
    if http.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else if http.gw.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Per-server state as JSON. Never includes env values, headers or expanded URLs.
fn status_json(http: &Http) -> Value {
    let topo = http.gw.topology();
    // What clients see (the catalog, after filters and collisions); the server's own
    // totals go beside it as `toolsTotal` and so on.
    let visible = topo.catalog.visible(topo.servers.len());
    let servers: Vec<Value> = topo
        .servers
        .iter()
        .zip(visible)
        .map(|(s, [tools, prompts, resources])| {
            let st = s.state();
            let state = match &st.status {
                Status::Disabled => "disabled",
                Status::Starting => "starting",
                Status::Ready if st.degraded() => "degraded",
                Status::Ready => "ready",
                Status::Down(_) => "down",
                Status::Failed(_) => "failed",
                Status::Stopped => "stopped",
            };
            let url = match &s.cfg.transport {
                crate::config::Transport::Http(h) => Some(h.url_display.clone()),
                crate::config::Transport::Stdio(_) => None,
            };
            json!({
                "name": s.cfg.name,
                "state": state,
                "transport": s.cfg.transport.kind(),
                "url": url,
                "prefix": s.settings().prefix.clone(),
                "pid": st.conn.as_ref().and_then(|c| c.pid()),
                "protocolVersion": st.info.as_ref().map(|i| i.protocol_version.clone()),
                "uptimeSeconds": st.since.filter(|_| st.status == Status::Ready).map(|t| t.elapsed().as_secs()),
                "tools": tools,
                "toolsTotal": st.lists.tools.len(),
                "prompts": prompts,
                "promptsTotal": st.lists.prompts.len(),
                "resources": resources,
                "resourcesTotal": st.lists.resources.len(),
                "restarts": s.restarts.load(Ordering::Relaxed),
                "isolation": match s.cfg.isolation {
                    crate::config::Isolation::Shared => "shared",
                    crate::config::Isolation::Session => "session",
                },
                "sessionProcesses": s.session_processes(),
                "lastError": st.last_error,
            })
        })
        .collect();
    let mut by_version: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for s in http.sessions.iter() {
        *by_version.entry(s.protocol_version.clone()).or_default() += 1;
    }
    let profiles = profiles_json(http, &topo);
    let mut out = json!({
        "servers": servers,
        "sessions": http.sessions.len(),
        "sessionsByVersion": by_version,
        "profiles": profiles,
    });
    if let Some(c) = http.gw.cluster() {
        out["cluster"] = c.status();
    }
    out
}

/// Each profile: its endpoint, its servers, what it shows, and its open sessions.
fn profiles_json(http: &Http, topo: &crate::router::Topology) -> Vec<Value> {
    if topo.config.profiles.is_empty() {
        return Vec::new();
    }
    let mut open: std::collections::HashMap<crate::catalog::view::ViewKey, usize> = std::collections::HashMap::new();
    for s in http.sessions.iter() {
        if let Some(k) = s.client.view() {
            *open.entry(k.clone()).or_default() += 1;
        }
    }
    topo.views
        .profiles()
        .map(|v| {
            let [tools, prompts, resources, templates] = v.counts;
            let servers = v.server_names(topo.servers.iter().map(|s| &*s.name));
            let name = v.name();
            let sessions = open.get(&v.key).copied().unwrap_or(0);
            json!({
                "name": name,
                "path": format!("{}/{name}", http.base),
                "servers": servers,
                "tools": tools,
                "prompts": prompts,
                "resources": resources,
                "resourceTemplates": templates,
                "search": v.search,
                "sessions": sessions,
            })
        })
        .collect()
}

pub(super) async fn status(State(http): State<Http>) -> Response {
    json_response(status_json(&http).to_string().into_bytes())
}

/// A small HTML page showing what `/status` shows.
pub(super) async fn status_page(State(http): State<Http>) -> Response {
    let status = status_json(&http);
    let mut rows = String::new();
    for s in status["servers"].as_array().into_iter().flatten() {
        let cell = |k: &str| match &s[k] {
            Value::Null => String::new(),
            Value::String(v) => html_escape(v),
            other => html_escape(&other.to_string()),
        };
        // "2 of 9" when the server lists more than clients see.
        let count = |k: &str| match (cell(k), cell(&format!("{k}Total"))) {
            (seen, total) if seen == total => seen,
            (seen, total) => format!("{seen} of {total}"),
        };
        rows.push_str(&format!(
            "<tr class=\"{state}\"><td>{name}</td><td>{state}</td><td>{transport}</td><td>{pid}</td><td>{up}</td><td>{tools}</td><td>{prompts}</td><td>{resources}</td><td>{restarts}</td><td>{err}</td></tr>\n",
            name = cell("name"),
            state = cell("state"),
            transport = cell("transport"),
            pid = cell("pid"),
            up = cell("uptimeSeconds"),
            tools = count("tools"),
            prompts = count("prompts"),
            resources = count("resources"),
            restarts = cell("restarts"),
            err = cell("lastError"),
        ));
    }
    let mut profiles = String::new();
    for p in status["profiles"].as_array().into_iter().flatten() {
        let cell = |k: &str| match &p[k] {
            Value::String(v) => html_escape(v),
            other => html_escape(&other.to_string()),
        };
        let servers: Vec<String> = p["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(html_escape)
            .collect();
        profiles.push_str(&format!(
            "<tr><td>{name}</td><td><code>{path}</code></td><td>{servers}</td><td>{tools}</td><td>{prompts}</td><td>{resources}</td><td>{sessions}</td></tr>\n",
            name = cell("name"),
            path = cell("path"),
            servers = servers.join(", "),
            tools = cell("tools"),
            prompts = cell("prompts"),
            resources = cell("resources"),
            sessions = cell("sessions"),
        ));
    }
    if !profiles.is_empty() {
        profiles = format!(
            "<h2>Profiles</h2>\n<table><tr><th>profile</th><th>endpoint</th><th>servers</th><th>tools</th><th>prompts</th><th>resources</th><th>sessions</th></tr>\n{profiles}</table>\n"
        );
    }
    let page = format!(
        r#"<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>mcp-gateway</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
tr.ready td:nth-child(2){{color:#070}}tr.down td:nth-child(2){{color:#b00}}</style></head>
<body><h1>mcp-gateway {version}</h1>
<p>Endpoint <code>{path}</code> · {sessions} session(s) · <a href="/status">/status</a> · <a href="/metrics">/metrics</a> · <a href="/readyz">/readyz</a></p>
<table><tr><th>server</th><th>state</th><th>transport</th><th>pid</th><th>uptime (s)</th><th>tools</th><th>prompts</th><th>resources</th><th>restarts</th><th>last error</th></tr>
{rows}</table>
{profiles}</body></html>
"#,
        version = env!("CARGO_PKG_VERSION"),
        path = html_escape(&http.gw.config().gateway.path),
        sessions = status["sessions"],
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Prometheus text exposition.
pub(super) async fn metrics(State(http): State<Http>) -> Response {
    let topo = http.gw.topology();
    let servers: Vec<_> = topo
        .servers
        .iter()
        .map(|s| {
            let up = s.state().status == Status::Ready;
            let restarts = s.restarts.load(Ordering::Relaxed);
            (s.cfg.name.as_str(), s.cfg.transport.kind(), up, restarts)
        })
        .collect();
    let snap = crate::metrics::Snapshot {
        sessions: http.sessions.len(),
        servers,
    };
    let body = http.gw.metrics.render(&snap);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}
