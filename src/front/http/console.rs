//! The operator's console: the page at `/` (static HTML, CSS and JS embedded in the
//! binary), and its data at `/status` (extended here), `/status/events`,
//! `/status/catalog` and `/status/stream` (SSE, every 2 s).
//!
//! Who may look ([`guard`]): with `[clients.*]` or `[auth.oauth]`, a bearer token of a
//! client with `admin = true` (401 without a token, 403 for another client's); without
//! auth, loopback peers only (403). `[gateway] console = false`: 404. An open
//! `/status/stream` is checked again before each frame, and ends once refused. The page
//! itself holds no data: with auth it is served to anyone, and asks for the token (taken
//! once from `?token=` into sessionStorage, or typed into its login box).

use super::{reject, Http};
use crate::error::code;
use crate::supervisor::Status;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// How often the stream sends the status.
const EVERY: Duration = Duration::from_secs(2);

/// The page's Content-Security-Policy: our own script and style only, fetches to us only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Who asks: the request's headers and peer address (its body is dropped).
struct Asker {
    headers: axum::http::HeaderMap,
    peer: Option<std::net::IpAddr>,
}

fn asker(http: &Http, req: Request) -> Asker {
    let peer = peer(http, &req);
    let (parts, _) = req.into_parts();
    Asker {
        headers: parts.headers,
        peer,
    }
}

/// The caller's address as every other check sees it: behind a trusted balancer, the one
/// its `X-Forwarded-For` names (a balancer on this host must not make everyone loopback).
fn peer(http: &Http, req: &Request) -> Option<std::net::IpAddr> {
    super::checks::client_ip(http, req.headers(), req.extensions())
}

fn refused(status: StatusCode, why: &str) -> Response {
    reject(status, code::INVALID_REQUEST, why).into_response()
}

/// Whether the console is served at all to this request (the page and its files): on,
/// its `Host` and `Origin` allowed as the endpoint's are (a page that rebinds its own
/// name to this address must not read the console from the operator's browser), and
/// with no auth configured, a loopback peer.
#[allow(clippy::result_large_err)]
fn open_to(http: &Http, headers: &axum::http::HeaderMap, peer: Option<std::net::IpAddr>) -> Result<(), Response> {
    if !http.gw.config().gateway.console {
        return Err(refused(
            StatusCode::NOT_FOUND,
            "the console is off ([gateway] console = false)",
        ));
    }
    super::checks::check_origin_host(&http.gw, headers).map_err(IntoResponse::into_response)?;
    if http.gw.topology().auth.required() {
        return Ok(());
    }
    match peer {
        Some(ip) if ip.is_loopback() || ip.to_canonical().is_loopback() => Ok(()),
        _ => Err(refused(
            StatusCode::FORBIDDEN,
            "without [clients.*] or [auth.oauth] the console and /status are served to loopback peers only",
        )),
    }
}

/// The console's data: [`open_to`], and with auth an admin's bearer token. Returns who
/// asked, for [`stream`] to ask again.
#[allow(clippy::result_large_err)]
async fn guard(http: &Http, req: Request) -> Result<Asker, Response> {
    let req = asker(http, req);
    allowed(http, &req).await?;
    Ok(req)
}

/// [`guard`]'s check of one asker, against the config in force now.
#[allow(clippy::result_large_err)]
async fn allowed(http: &Http, req: &Asker) -> Result<(), Response> {
    open_to(http, &req.headers, req.peer)?;
    let authn = http.gw.topology().auth.clone();
    if !authn.required() {
        return Ok(());
    }
    let value = req.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match authn.authenticate(value).await {
        Ok(identity) if identity.admin() => Ok(()),
        Ok(identity) => Err(refused(
            StatusCode::FORBIDDEN,
            &format!(
                "client {:?} may not read the console: give it admin = true in [clients.{}]",
                identity.name, identity.name
            ),
        )),
        Err(denied) => {
            let mut resp = refused(StatusCode::UNAUTHORIZED, &denied.to_string());
            let challenge = authn.challenge(&denied, &super::checks::resource_url(http, &req.headers));
            if let Ok(v) = HeaderValue::from_str(&challenge) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            Err(resp)
        }
    }
}

fn no_store(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

fn static_file(body: &'static str, kind: &'static str) -> Response {
    let mut resp = ([(header::CONTENT_TYPE, HeaderValue::from_static(kind))], body).into_response();
    resp.headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

/// `GET /`: the page.
pub(super) async fn page(State(http): State<Http>, req: Request) -> Response {
    if let Err(r) = open_to(&http, req.headers(), peer(&http, &req)) {
        return r;
    }
    let mut resp = static_file(PAGE, "text/html; charset=utf-8");
    resp.headers_mut()
        .insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    resp.headers_mut()
        .insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp.headers_mut()
        .insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    no_store(resp)
}

pub(super) async fn script(State(http): State<Http>, req: Request) -> Response {
    match open_to(&http, req.headers(), peer(&http, &req)) {
        Ok(()) => static_file(SCRIPT, "text/javascript; charset=utf-8"),
        Err(r) => r,
    }
}

pub(super) async fn style(State(http): State<Http>, req: Request) -> Response {
    match open_to(&http, req.headers(), peer(&http, &req)) {
        Ok(()) => static_file(STYLE, "text/css; charset=utf-8"),
        Err(r) => r,
    }
}

fn json_body(v: &Value) -> Response {
    no_store(super::json_response(v.to_string().into_bytes()))
}

/// `GET /status`.
pub(super) async fn status(State(http): State<Http>, req: Request) -> Response {
    if let Err(r) = guard(&http, req).await {
        return r;
    }
    json_body(&status_json(&http))
}

#[derive(serde::Deserialize)]
pub(super) struct Since {
    since: Option<u64>,
}

/// `GET /status/events?since=SEQ`: the last events (those after `since`), newest first.
/// The query is read after the access check: a stranger learns nothing from a 400.
pub(super) async fn events(State(http): State<Http>, req: Request) -> Response {
    let q = Query::<Since>::try_from_uri(req.uri());
    if let Err(r) = guard(&http, req).await {
        return r;
    }
    match q {
        Ok(Query(q)) => json_body(&json!({ "events": events_json(q.since.unwrap_or(0)) })),
        Err(e) => refused(StatusCode::BAD_REQUEST, &format!("since: {}", e.body_text())),
    }
}

/// `/status/stream` connections open at most: each costs a status a second.
const WATCHERS: usize = 64;

static WATCHING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One open `/status/stream`, counted while it lives.
struct Watcher;

impl Watcher {
    fn new() -> Option<Watcher> {
        WATCHING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < WATCHERS).then_some(n + 1))
            .ok()
            .map(|_| Watcher)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        WATCHING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `GET /status/catalog`.
pub(super) async fn catalog(State(http): State<Http>, req: Request) -> Response {
    if let Err(r) = guard(&http, req).await {
        return r;
    }
    json_body(&catalog_json(&http))
}

/// `GET /status/stream`: SSE. `status` (what `/status` says) every 2 s, `events` (the
/// new ones, newest first) when there are any; it ends when the gateway shuts down, or
/// when its credential no longer opens the console: each frame is checked as a new
/// request would be (a reload that took the token or `admin = true` away, a JWT that
/// expired, `console = false`), so a watcher cannot keep reading with what it lost.
pub(super) async fn stream(State(http): State<Http>, req: Request) -> Response {
    let asker = match guard(&http, req).await {
        Ok(a) => std::sync::Arc::new(a),
        Err(r) => return r,
    };
    let Some(watcher) = Watcher::new() else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("{WATCHERS} /status/stream connections are open already, the most served at once: close one, or poll /status"),
        );
    };
    let closing = http.closing.clone();
    let first = true;
    let state = (http, 0u64, first);
    let body = futures::stream::unfold(state, move |(http, since, first)| {
        // Counted while the body lives: a closed connection drops it.
        let _watcher = &watcher;
        let closing = closing.clone();
        let asker = asker.clone();
        async move {
            if !first {
                tokio::select! {
                    () = tokio::time::sleep(EVERY) => {}
                    () = closing.cancelled() => return None,
                }
                if allowed(&http, &asker).await.is_err() {
                    tracing::info!("a /status/stream ended: its credential no longer opens the console");
                    return None;
                }
            }
            let mut frame = String::new();
            let new = events_json(since);
            let last = crate::console::events().last().max(since);
            if !new.is_empty() {
                frame.push_str("event: events\ndata: ");
                frame.push_str(&Value::Array(new).to_string());
                frame.push_str("\n\n");
            }
            frame.push_str("event: status\ndata: ");
            frame.push_str(&status_json(&http).to_string());
            frame.push_str("\n\n");
            Some((Ok::<_, std::convert::Infallible>(frame), (http, last, false)))
        }
    });
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    no_store(resp)
}

fn events_json(since: u64) -> Vec<Value> {
    crate::console::events()
        .since(since)
        .into_iter()
        .map(|e| {
            json!({
                "seq": e.seq,
                "at": e.at,
                "kind": e.kind,
                "server": e.server,
                "text": e.text,
                "count": e.count,
            })
        })
        .collect()
}

fn state_name(st: &crate::supervisor::State) -> &'static str {
    match &st.status {
        Status::Disabled => "disabled",
        Status::Starting => "starting",
        Status::Ready if st.degraded() => "degraded",
        Status::Ready => "ready",
        Status::Down(_) => "down",
        Status::Failed(_) => "failed",
        Status::Stopped => "stopped",
    }
}

/// Per-server state as JSON. Never includes env values, headers or expanded URLs.
pub(super) fn status_json(http: &Http) -> Value {
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
            let url = match &s.cfg.transport {
                crate::config::Transport::Http(h) => Some(h.url_display.clone()),
                crate::config::Transport::Stdio(_) => None,
            };
            let reason = match &st.status {
                Status::Down(why) | Status::Failed(why) => Some(why.clone()),
                _ => None,
            };
            let era = st
                .info
                .as_ref()
                .map(|i| if i.stateless { "2026-07-28" } else { "handshake" });
            let sum = s.summary();
            let rate = if sum.calls == 0 {
                0.0
            } else {
                sum.errors as f64 / sum.calls as f64
            };
            json!({
                "name": s.cfg.name,
                "state": state_name(&st),
                "reason": reason,
                "transport": s.cfg.transport.kind(),
                "era": era,
                "url": url,
                "prefix": s.settings().prefix.clone(),
                "pid": st.conn.as_ref().and_then(|c| c.pid()),
                // The server's word: any string it likes.
                "protocolVersion": st.info.as_ref().map(|i| crate::console::clipped(&i.protocol_version, 64)),
                "uptimeSeconds": st.since.filter(|_| st.status == Status::Ready).map(|t| t.elapsed().as_secs()),
                "tools": tools,
                "toolsTotal": st.lists.tools.len(),
                "prompts": prompts,
                "promptsTotal": st.lists.prompts.len(),
                "resources": resources,
                "resourcesTotal": st.lists.resources.len(),
                "restarts": s.restarts.load(Ordering::Relaxed),
                "inFlight": s.in_flight.load(Ordering::Relaxed),
                "isolation": match s.cfg.isolation {
                    crate::config::Isolation::Shared => "shared",
                    crate::config::Isolation::Session => "session",
                    crate::config::Isolation::Client => "client",
                },
                "sessionProcesses": s.session_processes(),
                "lastError": st.last_error,
                "calls": sum.calls,
                "errors": sum.errors,
                "errorRate": rate,
                "callsPerSecond": sum.calls_per_second,
                "p50Ms": sum.p50_ms,
                "p99Ms": sum.p99_ms,
                "series": {
                    "step": crate::console::STEP,
                    "calls": sum.calls_series,
                    "errors": sum.errors_series,
                    "p50Ms": sum.p50_series,
                    "p99Ms": sum.p99_series,
                },
            })
        })
        .collect();
    let mut by_version: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    let mut by_client: HashMap<std::sync::Arc<str>, usize> = HashMap::new();
    for s in http.sessions.iter() {
        *by_version.entry(s.protocol_version.clone()).or_default() += 1;
        *by_client.entry(s.share.clone()).or_default() += 1;
    }
    let clients: Vec<Value> = http
        .gw
        .metrics
        .clients
        .rows()
        .into_iter()
        .map(|r| {
            json!({
                "name": &*r.key,
                "sessions": by_client.get(&r.key).copied().unwrap_or(0),
                "calls": r.calls,
                "errors": r.errors,
                "callsPerSecond": r.calls_per_second,
                "rateLimited": r.limited.iter().map(|(l, n)| json!({ "limit": l, "count": n })).collect::<Vec<_>>(),
                "lastError": r.last_error.map(|(at, what)| json!({ "at": at, "text": what })),
            })
        })
        .collect();
    let profiles = super::status::profiles_json(http, &topo);
    let mut out = json!({
        "gateway": {
            "version": env!("CARGO_PKG_VERSION"),
            "path": http.gw.config().gateway.path,
            "uptimeSeconds": http.started.elapsed().as_secs(),
            "auth": topo.auth.required(),
            "lastEvent": crate::console::events().last(),
        },
        "servers": servers,
        "sessions": http.sessions.len(),
        "sessionsByVersion": by_version,
        "clients": clients,
        "profiles": profiles,
    });
    if let Some(c) = http.gw.cluster() {
        out["cluster"] = c.status();
    }
    out
}

/// Every public tool, prompt, resource and template: its server and original name,
/// description and schema, and which profiles and clients may see it.
fn catalog_json(http: &Http) -> Value {
    let topo = http.gw.topology();
    let cat = &topo.catalog;
    let server_name = |i: usize| topo.servers.get(i).map(|s| s.cfg.name.clone());
    let mut policies: Vec<_> = topo.auth.policies().cloned().collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let profiles: Vec<_> = topo.views.profiles().cloned().collect();
    let items = |raw: &serde_json::value::RawValue, key: &str| -> Vec<Value> {
        serde_json::from_str::<Value>(raw.get())
            .ok()
            .and_then(|mut v| v.get_mut(key).map(Value::take))
            .and_then(|v| match v {
                Value::Array(a) => Some(a),
                _ => None,
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    let mut add = |kind: &str, item: Value, public: String, server: Option<usize>, original: Option<String>| {
        let profile_names: Vec<String> = profiles
            .iter()
            .filter(|v| {
                server.is_some_and(|s| {
                    if kind == "tool" {
                        v.has_tool(&topo.catalog, &public, s)
                    } else {
                        v.has_server(s)
                    }
                })
            })
            .map(|v| match &v.key {
                crate::catalog::view::ViewKey::Profile(n) => n.to_string(),
                other => other.to_string(),
            })
            .collect();
        // No clients configured: everyone may (`null`).
        let clients: Option<Vec<&str>> = topo.auth.required().then(|| {
            policies
                .iter()
                .filter(|p| match kind {
                    "tool" | "prompt" => p.permits_in(&topo.catalog, &public),
                    _ => p.permits(&public),
                })
                .map(|p| p.name.as_str())
                .collect()
        });
        let field = |k: &str| item.get(k).cloned().unwrap_or(Value::Null);
        out.push(json!({
            "kind": kind,
            "name": public,
            "server": server.and_then(server_name),
            "original": original,
            "title": field("title"),
            "annotations": field("annotations"),
            "description": field("description"),
            "inputSchema": field("inputSchema"),
            "arguments": field("arguments"),
            "mimeType": field("mimeType"),
            "profiles": profile_names,
            "clients": clients,
        }));
    };
    let name_of = |item: &Value| item.get("name").and_then(Value::as_str).map(str::to_owned);
    for item in items(&cat.tools_result, "tools") {
        let Some(public) = name_of(&item) else { continue };
        let route = cat.tools.get(&public);
        add(
            "tool",
            item,
            public.clone(),
            route.map(|r| r.server),
            route.map(|r| r.name.clone()),
        );
    }
    for item in items(&cat.prompts_result, "prompts") {
        let Some(public) = name_of(&item) else { continue };
        let route = cat.prompts.get(&public);
        add(
            "prompt",
            item,
            public.clone(),
            route.map(|r| r.server),
            route.map(|r| r.name.clone()),
        );
    }
    for item in items(&cat.resources_result, "resources") {
        let Some(uri) = item.get("uri").and_then(Value::as_str).map(str::to_owned) else {
            continue;
        };
        let server = cat.resources.get(&uri).copied();
        let original = name_of(&item);
        add("resource", item, uri, server, original);
    }
    for (i, item) in items(&cat.templates_result, "resourceTemplates")
        .into_iter()
        .enumerate()
    {
        let Some(uri) = item.get("uriTemplate").and_then(Value::as_str).map(str::to_owned) else {
            continue;
        };
        let server = cat.templates.get(i).map(|(_, s)| *s);
        let original = name_of(&item);
        add("template", item, uri, server, original);
    }
    json!({ "items": out, "profiles": profiles.len(), "auth": topo.auth.required() })
}
