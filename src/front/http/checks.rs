//! What a request to the MCP endpoint passes before it is read as a message: the per-IP
//! limit, single headers, Origin and Host, Content-Type and Accept, the protocol version
//! header, and who the caller is.

use super::{refuse, reject, Http, SESSION_HEADER, VERSION_HEADER};
use crate::auth::{self, Identity};
use crate::error::{code, Error};
use crate::message::{Id, Kind};
use crate::router::{Gateway, SUPPORTED_VERSIONS};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tracing::debug;

/// The per-IP limit, checked first by each MCP endpoint handler, before a body is read
/// or parsed: 429 with `Retry-After`.
///
/// A refusal here is a whole 429 response (axum's `Response` is past clippy's size
/// threshold for an `Err`); it is the cold path.
#[allow(clippy::result_large_err)]
pub(super) fn per_ip(http: &Http, headers: &HeaderMap, extensions: &axum::http::Extensions) -> Result<(), Response> {
    // One view of the topology for both: the trusted proxies and the limits.
    let topo = http.gw.topology();
    if let Some(ip) = caller(&topo.config.gateway.trusted_proxies, headers, extensions) {
        if let Err(l) = topo.limits.check_ip(ip) {
            http.gw.metrics.rate_limited(&l.what);
            crate::console::events().burst(
                "rate_limited",
                &l.what,
                None,
                format!("{ip}: rate limited by {}", l.what),
            );
            let secs = l.retry_after.as_secs_f64().ceil().max(1.0);
            let mut resp = reject(StatusCode::TOO_MANY_REQUESTS, code::RATE_LIMITED, l.message()).into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("{secs:.0}")) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return Err(resp);
        }
    }
    Ok(())
}

/// The caller's address: the connection's peer, or, when the peer is one of
/// `gateway.trusted_proxies`, the address its `X-Forwarded-For` names, read from the
/// right (the hop the proxy added) past the other trusted proxies. A malformed hop stops
/// the walk at the last address believed.
pub(super) fn client_ip(
    http: &Http,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Option<std::net::IpAddr> {
    caller(&http.gw.config().gateway.trusted_proxies, headers, extensions)
}

/// [`client_ip`] with the trusted proxies at hand.
fn caller(
    trusted: &[crate::config::Cidr],
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Option<std::net::IpAddr> {
    let peer = extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())?;
    if trusted.is_empty() || !trusted.iter().any(|c| c.contains(peer)) {
        return Some(peer);
    }
    let mut believed = peer;
    let values: Vec<&[u8]> = headers
        .get_all(header::HeaderName::from_static("x-forwarded-for"))
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    for value in values.iter().rev() {
        let Ok(value) = std::str::from_utf8(value) else {
            return Some(believed);
        };
        for hop in value.rsplit(',') {
            let Ok(ip) = hop.trim().parse::<std::net::IpAddr>() else {
                return Some(believed);
            };
            believed = ip;
            if !trusted.iter().any(|c| c.contains(ip)) {
                return Some(ip);
            }
        }
    }
    Some(believed)
}

/// Headers an MCP request may carry at most once. A second copy is refused (400) rather
/// than one of them picked: which one wins would depend on who reads them (a proxy in
/// front may check the last `Authorization`, the gateway the first).
pub(super) fn check_single(headers: &HeaderMap) -> Result<(), Error> {
    // Nothing repeated at all, the usual case: no lookups.
    if headers.len() == headers.keys_len() {
        return Ok(());
    }
    let single: [(&HeaderName, &str); 5] = [
        (&header::AUTHORIZATION, "Authorization"),
        (&header::ORIGIN, "Origin"),
        (&header::CONTENT_TYPE, "Content-Type"),
        (&SESSION_HEADER, "Mcp-Session-Id"),
        (&VERSION_HEADER, "MCP-Protocol-Version"),
    ];
    for (name, shown) in single {
        if headers.get_all(name).iter().nth(1).is_some() {
            return Err(reject(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("more than one {shown} header: send it once"),
            ));
        }
    }
    Ok(())
}

/// An HTTP/1.1 request needs exactly one Host header (RFC 9112 §3.2): 400 otherwise, on
/// every route. HTTP/1.0 has no such rule, and a request without one is still served
/// (old health checkers); the MCP endpoint then has no Host to check.
pub(super) fn host_problem<B>(req: &axum::http::Request<B>) -> Option<Response> {
    if req.version() < axum::http::Version::HTTP_11 {
        return None;
    }
    let why = match req.headers().get_all(header::HOST).iter().count() {
        1 => return None,
        0 => "no Host header: HTTP/1.1 requires one",
        _ => "more than one Host header: send it once",
    };
    Some(reject(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why).into_response())
}

/// Checks Origin (when present) and Host against localhost and the configured lists,
/// after taking each value apart (see [`Authority`]): `http://localhost:1@evil.com` is
/// not a localhost origin, it is not an origin at all.
pub(super) fn check_origin_host(gw: &Gateway, headers: &HeaderMap) -> Result<(), Error> {
    check_hosts(gw, headers, false)
}

/// [`check_origin_host`] for `/metrics`, which also takes any IP address as `Host`: a
/// scraper often names the gateway by its address, and a page that rebinds its name to
/// the gateway's address still sends that name.
pub(super) fn check_scrape_host(gw: &Gateway, headers: &HeaderMap) -> Result<(), Error> {
    check_hosts(gw, headers, true)
}

fn check_hosts(gw: &Gateway, headers: &HeaderMap, any_ip: bool) -> Result<(), Error> {
    check_single(headers)?;
    let config = gw.config();
    let g = &config.gateway;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let ok = match WebOrigin::parse(origin) {
            Some(o) => {
                (o.web() && o.authority.is_local())
                    || g.allowed_origins
                        .iter()
                        .any(|a| WebOrigin::parse(a).is_some_and(|a| a == o))
            }
            None => false,
        };
        if !ok {
            return Err(reject(
                StatusCode::FORBIDDEN,
                code::INVALID_REQUEST,
                format!("origin {origin} is not allowed"),
            ));
        }
    }
    if let Some(host) = headers.get(header::HOST) {
        let host = host.to_str().unwrap_or("");
        let Some(a) = Authority::parse(host) else {
            return Err(reject(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("Host {host:?} is not a host[:port]"),
            ));
        };
        let ok = a.is_local()
            || (any_ip && a.host.parse::<std::net::IpAddr>().is_ok())
            || g.allowed_hosts.iter().any(|h| {
                Authority::parse(h)
                    .is_some_and(|allowed| allowed.host == a.host && allowed.port.is_none_or(|p| a.port == Some(p)))
            });
        if !ok {
            return Err(reject(
                StatusCode::FORBIDDEN,
                code::INVALID_REQUEST,
                format!("host {host} is not allowed"),
            ));
        }
    }
    Ok(())
}

/// `host[:port]` taken apart: a DNS name or IPv4 address (letters, digits, `-`, `.`,
/// `_`), or an IPv6 literal in brackets; the port, when given, digits that fit a u16.
/// Anything else (userinfo `a@b`, a path, `%`, spaces, an empty host) does not parse.
#[derive(Debug, PartialEq)]
struct Authority {
    /// Lowercased; an IPv6 literal without its brackets.
    host: String,
    port: Option<u16>,
}

impl Authority {
    fn parse(s: &str) -> Option<Authority> {
        let (host, port) = match s.strip_prefix('[') {
            Some(rest) => {
                let (h, after) = rest.split_once(']')?;
                let v6 = !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.');
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':')?),
                };
                (v6.then_some(h)?, port)
            }
            None => {
                let (h, port) = match s.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (s, None),
                };
                let name = !h.is_empty()
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
                (name.then_some(h)?, port)
            }
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
            Some(_) => return None,
        };
        Some(Authority {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// `localhost`, `127.0.0.1` or `::1`, on any port.
    fn is_local(&self) -> bool {
        matches!(self.host.as_str(), "localhost" | "127.0.0.1" | "::1")
    }
}

/// An origin, `scheme://host[:port]` (RFC 6454), with the scheme lowercased and a port
/// equal to the scheme's default dropped, so `https://App.example.com:443` and
/// `https://app.example.com` are the same origin. A configured value may end in `/`.
#[derive(Debug, PartialEq)]
struct WebOrigin {
    scheme: String,
    authority: Authority,
}

impl WebOrigin {
    fn parse(s: &str) -> Option<WebOrigin> {
        let (scheme, rest) = s.split_once("://")?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return None;
        }
        let scheme = scheme.to_ascii_lowercase();
        let mut authority = Authority::parse(rest.strip_suffix('/').unwrap_or(rest))?;
        let default = match scheme.as_str() {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        if authority.port.is_some() && authority.port == default {
            authority.port = None;
        }
        Some(WebOrigin { scheme, authority })
    }

    /// http or https: the only schemes a localhost origin is accepted with.
    fn web(&self) -> bool {
        matches!(self.scheme.as_str(), "http" | "https")
    }
}

/// The body of a POST must be JSON: `application/json`, any parameters (`; charset=utf-8`),
/// the media type case-insensitive (RFC 9110 §8.3.1). A missing Content-Type is refused
/// too: the official SDK clients always send it (and the SDKs' own servers refuse
/// requests without it), and a form post or `text/plain` is how a browser page sends a
/// request to localhost without a CORS preflight.
pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), Error> {
    let value = headers.get(header::CONTENT_TYPE);
    let ok = value.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if ok {
        return Ok(());
    }
    let got = match value {
        None => "none".to_owned(),
        Some(v) => format!("{:?}", String::from_utf8_lossy(v.as_bytes())),
    };
    Err(reject(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        code::INVALID_REQUEST,
        format!(
            "a POST carries one JSON-RPC message: send it with Content-Type: application/json (this one has {got})"
        ),
    ))
}

/// What the Accept headers admit of `json` (`application/json`) and `sse`
/// (`text/event-stream`); `None` without an Accept header (or only empty ones). For each,
/// the most specific matching range decides (`type/subtype`, then `type/*`, then `*/*`;
/// the highest q among equals), and `q=0` refuses.
pub(super) fn accepted(headers: &HeaderMap) -> Option<Accepted> {
    const MEDIA: [(&str, &str); 2] = [("application", "json"), ("text", "event-stream")];
    let mut best = [(0u8, false); 2];
    let mut any = false;
    for v in headers.get_all(header::ACCEPT) {
        let v = String::from_utf8_lossy(v.as_bytes());
        for range in v.split(',') {
            let mut parts = range.split(';');
            let Some((rt, rs)) = parts.next().and_then(|r| r.trim().split_once('/')) else {
                continue;
            };
            any = true;
            let (rt, rs) = (rt.trim(), rs.trim());
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, q)| q.trim().parse::<f32>().unwrap_or(0.0));
            for (i, (t, sub)) in MEDIA.iter().enumerate() {
                let rank = match (rt.eq_ignore_ascii_case(t), rs.eq_ignore_ascii_case(sub)) {
                    (true, true) => 3,
                    (true, false) if rs == "*" => 2,
                    _ if rt == "*" && rs == "*" => 1,
                    _ => continue,
                };
                let (r, ok) = &mut best[i];
                if rank > *r {
                    (*r, *ok) = (rank, q > 0.0);
                } else if rank == *r {
                    *ok |= q > 0.0;
                }
            }
        }
    }
    any.then_some(Accepted {
        json: best[0].1,
        sse: best[1].1,
    })
}

/// See [`accepted`].
#[derive(Clone, Copy)]
pub(super) struct Accepted {
    pub(super) json: bool,
    pub(super) sse: bool,
}

/// A POST must admit JSON or SSE (either answer may come); a missing Accept is fine.
pub(super) fn check_accept(accept: Option<Accepted>) -> Result<(), Error> {
    match accept {
        Some(a) if !a.json && !a.sse => Err(reject(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "the answer is application/json or text/event-stream: send Accept: application/json, text/event-stream",
        )),
        _ => Ok(()),
    }
}

/// The public URL of the MCP endpoint, for OAuth metadata and challenges.
pub(super) fn resource_url(http: &Http, headers: &HeaderMap) -> String {
    let config = http.gw.config();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    auth::resource_url(config.auth.oauth.as_ref(), host, &config.gateway.path)
}

/// Who is calling: `Ok(None)` when no auth is configured; a 401 response (echoing the
/// request's id, if `body` is one) when a token is needed and missing or not accepted.
pub(super) async fn identify(http: &Http, headers: &HeaderMap, body: &[u8]) -> Result<Option<Arc<Identity>>, Response> {
    let authn = http.gw.topology().auth.clone();
    if !authn.required() {
        return Ok(None);
    }
    let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match authn.authenticate(value).await {
        Ok(identity) => Ok(Some(identity)),
        Err(denied) => {
            debug!(reason = %denied, "request refused: not authenticated");
            let id = match Kind::parse(body) {
                Ok(Kind::Request { id, .. }) => id,
                _ => Id::NULL,
            };
            let mut resp = refuse(
                &id,
                reject(StatusCode::UNAUTHORIZED, code::INVALID_REQUEST, denied.to_string()),
            );
            let challenge = authn.challenge(&denied, &resource_url(http, headers));
            if let Ok(v) = HeaderValue::from_str(&challenge) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
            Err(resp)
        }
    }
}

pub(super) fn check_version(headers: &HeaderMap) -> Result<(), Error> {
    match headers.get(&VERSION_HEADER).map(|v| v.to_str().unwrap_or("")) {
        None => Ok(()),
        Some(v) if SUPPORTED_VERSIONS.contains(&v) => Ok(()),
        Some(v) => Err(reject(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            format!(
                "unsupported MCP-Protocol-Version {v:?}; supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        )),
    }
}

/// The checks every bodyless MCP request passes first (GET, DELETE): the per-IP limit,
/// Origin and Host, and who the caller is. Returns its headers and identity.
pub(super) async fn admit_bodyless(http: &Http, req: axum::extract::Request) -> Result<Admitted, Response> {
    let (parts, _) = req.into_parts();
    let (headers, extensions) = (parts.headers, parts.extensions);
    per_ip(http, &headers, &extensions)?;
    check_origin_host(&http.gw, &headers).map_err(IntoResponse::into_response)?;
    let who = identify(http, &headers, b"").await?;
    let view = http.endpoint(&parts.uri).map_err(IntoResponse::into_response)?;
    Ok(Admitted { headers, who, view })
}

/// A GET or DELETE past [`admit_bodyless`]'s checks.
pub(super) struct Admitted {
    pub(super) headers: HeaderMap,
    pub(super) who: Option<Arc<Identity>>,
    /// The view of its endpoint; none: the whole catalog.
    pub(super) view: Option<crate::catalog::view::ViewKey>,
}
