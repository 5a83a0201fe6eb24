//! The HTTP adapter of the 2026-07-28 flow ([`crate::stateless`]): a sessionless POST
//! of that revision gives the flow its headers, and its answer goes back as JSON, or as
//! SSE (related messages first, a listen stream).

use super::answer::{self, answer_body, event, sse_answer, sse_response, stateless_json, task_failed};
use super::checks::Accepted;
use super::{json_response, refuse, reject, Http, KEEPALIVE};
use crate::auth::Identity;
use crate::catalog::view::ViewKey;
use crate::downstream::SINK_QUEUE;
use crate::error::code;
use crate::message::{self, Kind};
use crate::stateless::envelope::{Invisible, MCP_HEADERS};
use crate::stateless::{self, Answer, Headers, Sent};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The flow's own header names, parsed once (in [`Headers::mcp`] order): looking a header
/// up by `&str` parses and validates the name every time (a few hundred instructions).
static KNOWN: [HeaderName; 3] = [
    HeaderName::from_static("mcp-protocol-version"),
    HeaderName::from_static("mcp-method"),
    HeaderName::from_static("mcp-name"),
];

// [`Headers::mcp`] tells the three apart by length.
const _: () = assert!(MCP_HEADERS[0].len() == 20 && MCP_HEADERS[1].len() == 10 && MCP_HEADERS[2].len() == 8);

/// A value's text as the flow takes it: `to_str` accepts what it accepts (visible ASCII
/// and tabs), without decoding the bytes again.
fn text(v: &axum::http::HeaderValue) -> Result<&str, Invisible> {
    v.to_str().map_err(|_| Invisible)
}

impl Headers for HeaderMap {
    fn header(&self, name: &str) -> Option<Result<&str, Invisible>> {
        match KNOWN.iter().find(|k| k.as_str() == name) {
            Some(k) => self.get(k),
            None => self.get(name),
        }
        .map(text)
    }

    /// One pass over the request's few headers instead of three hashed lookups; the first
    /// value of each, as [`HeaderMap::get`] gives.
    fn mcp(&self) -> [Option<Result<&str, Invisible>>; 3] {
        let mut out = [None, None, None];
        for (name, value) in self {
            // By length first (a standard header's name is a table's entry): the three
            // names' lengths differ.
            let i = match name.as_str().len() {
                20 => 0,
                10 => 1,
                8 => 2,
                _ => continue,
            };
            if out[i].is_none() && *name == KNOWN[i] {
                out[i] = Some(text(value));
            }
        }
        out
    }
}

/// A request's headers with the flow's own three read at once, before the request is
/// known to be of the flow (that check reads one of them) and once for all the checks.
pub(super) struct Read<'a> {
    pub map: &'a HeaderMap,
    mcp: [Option<Result<&'a str, Invisible>>; 3],
}

impl<'a> Read<'a> {
    pub fn new(map: &'a HeaderMap) -> Read<'a> {
        Read { map, mcp: map.mcp() }
    }
}

impl Headers for Read<'_> {
    fn header(&self, name: &str) -> Option<Result<&str, Invisible>> {
        match MCP_HEADERS.iter().position(|h| *h == name) {
            Some(i) => self.mcp[i],
            None => self.map.header(name),
        }
    }

    fn mcp(&self) -> [Option<Result<&str, Invisible>>; 3] {
        self.mcp
    }
}

/// What a stateless request's client id starts with (the principal follows).
const CLIENT_PREFIX: &str = crate::client::STATELESS_ID;

/// Appends an address as `Display` writes it; an IPv4 one without the formatting
/// machinery (a thousand instructions per request).
fn push_ip(s: &mut String, ip: std::net::IpAddr) {
    let std::net::IpAddr::V4(v4) = ip else {
        use std::fmt::Write as _;
        let _ = write!(s, "{ip}");
        return;
    };
    s.reserve(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        if octet >= 100 {
            s.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            s.push(char::from(b'0' + octet / 10 % 10));
        }
        s.push(char::from(b'0' + octet % 10));
    }
}

/// A 2026-07-28 request, run as an ephemeral client named after the caller's identity
/// (with auth) or IP address.
pub(super) async fn serve(
    http: Http,
    headers: &Read<'_>,
    accept: Option<Accepted>,
    msg: Kind,
    who: Option<Arc<Identity>>,
    peer: Option<std::net::IpAddr>,
    view: Option<ViewKey>,
) -> Response {
    let (id, method, params) = match msg {
        Kind::Request { id, method, params } => (id, method, params),
        // No client notification is defined for 2026-07-28 over HTTP: accepted, ignored.
        Kind::Notification { .. } => return StatusCode::ACCEPTED.into_response(),
        Kind::Response { .. } => {
            return reject(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                "a 2026-07-28 client sends no responses (servers ask nothing of it here)",
            )
            .into_response()
        }
    };
    // The client is named after the principal, which is read from its name when needed.
    let mut client = String::with_capacity(CLIENT_PREFIX.len() + 16);
    client.push_str(CLIENT_PREFIX);
    match (&who, peer) {
        (Some(i), _) => client.push_str(&i.name),
        (None, Some(ip)) => push_ip(&mut client, ip),
        (None, None) => client.push_str("unknown"),
    }
    let request = stateless::Request {
        id,
        method,
        params,
        headers: Some(headers),
        identity: who,
        client,
        principal: stateless::Principal::InClient(CLIENT_PREFIX.len()),
        parent: crate::telemetry::from_headers(headers.map),
        streams: accept.is_some_and(|a| a.sse),
        view,
    };
    match http.stateless.serve(request) {
        Answer::Refused(id, e) => refuse(&id, e),
        Answer::Now(id, outcome) => json_response(message::response(&id, &outcome)),
        Answer::Call(c) => {
            answer::request(
                http,
                c.client,
                c.id,
                (c.method, c.method.as_str().into()),
                c.params,
                c.parent,
                Some(c.finish),
                None,
            )
            .await
        }
        // Closing the response cancels the call.
        Answer::Rounds(mut rounds) => match rounds.next().await {
            Some(Sent::Answer(message::Answer::Whole(answer))) => stateless_json(answer.into()),
            // A large result, never an error that changes the status.
            Some(Sent::Answer(parts)) => json_response(answer_body(parts)),
            Some(Sent::Related(first)) => sse_answer(
                first,
                rounds.into_stream().map(|s| match s {
                    Sent::Related(m) => m,
                    Sent::Answer(a) => bytes::Bytes::from(a.into_vec()),
                }),
            ),
            None => task_failed(),
        },
        // An SSE stream with keep-alive comments; it ends gracefully at shutdown.
        Answer::Listen(l) => {
            let (tx, rx) = mpsc::channel::<bytes::Bytes>(SINK_QUEUE);
            let keepalive = Some((KEEPALIVE, bytes::Bytes::from_static(b": keep-alive\n\n")));
            crate::background::spawn(stateless::listen::run(
                l,
                tx,
                |m| bytes::Bytes::from(event(m)),
                keepalive,
            ));
            let frames = futures::stream::unfold(rx, |mut rx| async move {
                let m = rx.recv().await?;
                Some((Ok::<_, std::io::Error>(m), rx))
            });
            sse_response(Body::from_stream(frames))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_three_headers_at_once_are_the_ones_looked_up() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("x"));
        h.append("mcp-name", HeaderValue::from_static("first"));
        h.insert("mcp-method", HeaderValue::from_static("tools/call"));
        h.append("mcp-name", HeaderValue::from_static("second"));
        h.insert("mcp-param-x", HeaderValue::from_static("y"));
        let one_by_one = crate::stateless::envelope::MCP_HEADERS.map(|n| h.header(n));
        assert_eq!(h.mcp(), one_by_one);
        assert_eq!(h.mcp(), [None, Some(Ok("tools/call")), Some(Ok("first"))]);
        assert_eq!(HeaderMap::new().mcp(), [None, None, None]);
        // Bytes past visible ASCII (tabs allowed) are not text.
        let mut h = HeaderMap::new();
        h.insert("mcp-method", HeaderValue::from_bytes(b"tools/\tcall").unwrap());
        h.insert("mcp-name", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        assert_eq!(h.mcp(), [None, Some(Ok("tools/\tcall")), Some(Err(Invisible))]);
    }

    fn ip_text(ip: std::net::IpAddr) -> String {
        let mut s = String::new();
        push_ip(&mut s, ip);
        s
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.200.9.100",
            "::1",
            "::ffff:1.2.3.4",
            "fe80::1",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for o in 0..=255u8 {
            let ip = std::net::IpAddr::from([o, 0, o, 9]);
            assert_eq!(ip_text(ip), ip.to_string());
        }
        let mut after = CLIENT_PREFIX.to_owned();
        push_ip(&mut after, "10.0.0.1".parse().unwrap());
        assert_eq!(after, "stateless:10.0.0.1");
    }
}
