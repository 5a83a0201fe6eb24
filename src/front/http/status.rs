//! The endpoints beside MCP: `/readyz`, `/metrics` (Prometheus text), and the RFC 9728 OAuth metadata.

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

/// Each profile: its endpoint, its servers, what it shows, and its open sessions.
pub(super) fn profiles_json(http: &Http, topo: &crate::router::Topology) -> Vec<Value> {
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

/// Prometheus text exposition. Its `Host` and `Origin` are checked as the console's are
/// (any IP address is a fine `Host` too): it names the servers and tools.
pub(super) async fn metrics(State(http): State<Http>, headers: HeaderMap) -> Response {
    if let Err(e) = super::checks::check_scrape_host(&http.gw, &headers) {
        return e.into_response();
    }
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
