//! A POST to the MCP endpoint: one JSON-RPC message (or a 2025-03-26 batch), read within
//! its limits, then sent where it belongs: the stateless flow, `initialize`, or its
//! session.

use super::answer::{cancelled, request};
use super::checks::{
    accepted, check_accept, check_content_type, check_origin_host, check_version, client_ip, identify, per_ip,
};
use super::session::{initialize, session, Session};
use super::{json_response, refuse, reject, Http, SESSION_HEADER};
use crate::error::code;
use crate::message::{self, Id, Kind, Outcome};
use crate::stateless::envelope;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use tracing::debug;

/// Past `gateway.max_body`, at least this much more of a body is read and dropped
/// before the 413 (see [`post`]).
const DRAIN_MIN: usize = 1 << 20;

/// Reads `body` to its end, dropping it; false when it is longer than `max` (or fails):
/// then the connection is left for hyper to close.
async fn drain(body: &mut Body, max: usize) -> bool {
    let mut left = max;
    while let Some(frame) = http_body_util::BodyExt::frame(body).await {
        let Ok(frame) = frame else { return false };
        if let Some(data) = frame.data_ref() {
            match left.checked_sub(data.len()) {
                Some(l) => left = l,
                None => return false,
            }
        }
    }
    true
}

pub(super) async fn post(State(http): State<Http>, req: axum::extract::Request) -> Response {
    // Served directly, not through the app's routes: waits for the start here.
    http.gw.started().await;
    // Taken apart, not extracted: the `HeaderMap` and `Extensions` extractors clone.
    let (parts, body) = req.into_parts();
    let (headers, extensions, uri) = (parts.headers, parts.extensions, parts.uri);
    if let Err(r) = per_ip(&http, &headers, &extensions) {
        return r;
    }
    let accept = accepted(&headers);
    if let Err(r) = check_origin_host(&http.gw, &headers)
        .and_then(|()| check_content_type(&headers))
        .and_then(|()| check_accept(accept))
    {
        return r.into_response();
    }
    let limits = &http.gw.config().gateway;
    let too_large = || {
        reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            format!("the request body is over the {} byte limit", limits.max_body),
        )
        .into_response()
    };
    // A Content-Length over the limit is refused as soon as the headers are in, before
    // any of the body is read (or, with `Expect: 100-continue`, sent). The body is not
    // read, so the connection closes, and the answer says so.
    let max = u64::try_from(limits.max_body).unwrap_or(u64::MAX);
    if axum::body::HttpBody::size_hint(&body).lower() > max {
        let mut resp = too_large();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    // A client that trickles its body is cut off; one that sends too much gets 413, after
    // the rest of its body is read (up to as much again, within body_timeout) and
    // dropped, so its connection can carry the next request: hyper would close a
    // connection with unread body behind the 413's back, and the client, told nothing,
    // would send its next request into the closed connection.
    let mut body = body;
    let read = async {
        match http_body_util::BodyExt::collect(http_body_util::Limited::new(&mut body, limits.max_body)).await {
            Ok(c) => Ok(c.to_bytes()),
            Err(_) => Err(drain(&mut body, limits.max_body.max(DRAIN_MIN)).await),
        }
    };
    let body = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            return reject(
                StatusCode::REQUEST_TIMEOUT,
                code::INVALID_REQUEST,
                "the request body took too long to arrive",
            )
            .into_response()
        }
    };
    let who = match identify(&http, &headers, &body).await {
        Ok(w) => w,
        Err(resp) => return resp,
    };
    // After the credential: who may not call learns no profile names.
    let view = match http.endpoint(&uri) {
        Ok(v) => v,
        Err(e) => {
            let id = match Kind::parse(&body) {
                Ok(Kind::Request { id, .. }) => id,
                _ => Id::NULL,
            };
            return refuse(&id, e);
        }
    };
    let is_array = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let mut version = None;
    if is_array && headers.contains_key(&SESSION_HEADER) {
        // A batch: JSON-RPC batching is part of 2025-03-26 only.
        let (_, session) = match session(&http, &headers, who.as_ref(), view.as_ref()).await {
            Ok(s) => s,
            Err(r) => return r.into_response(),
        };
        if let Err(r) = check_version(&headers) {
            return r.into_response();
        }
        if session.protocol_version == BATCH_VERSION {
            return batch(&http, &headers, &session, &body).await;
        }
        version = Some(session.protocol_version.clone());
    }
    let msg = match Kind::parse_from_client(&body) {
        Ok(m) => m,
        Err(e) => {
            let msg = match version {
                Some(v) if is_array => format!(
                    "batches are not supported in protocol version {v} (JSON-RPC batching is in {BATCH_VERSION} only; 2025-06-18 removed it): send one JSON-RPC message per POST"
                ),
                None if is_array => "batches are not supported: send one JSON-RPC message per POST".to_owned(),
                _ => e.to_string(),
            };
            return reject(StatusCode::BAD_REQUEST, e.code(), msg).into_response();
        }
    };
    if !headers.contains_key(&SESSION_HEADER) {
        let read = super::stateless::Read::new(&headers);
        let stateless = match &msg {
            Kind::Request { method, params, .. } => envelope::is_stateless(Some(&read), method, params),
            _ => envelope::names_revision(&read),
        };
        if stateless {
            let peer = client_ip(&http, &headers, &extensions);
            return super::stateless::serve(http, &read, accept, msg, who, peer, view).await;
        }
    }
    if let Kind::Request { id, method, params } = &msg {
        if method == "initialize" {
            let peer = client_ip(&http, &headers, &extensions);
            // Boxed, like every rare path: its Redis calls would grow every request's future.
            return Box::pin(initialize(&http, id, params.to_raw().as_deref(), who, peer, view)).await;
        }
    }
    let id = match &msg {
        Kind::Request { id, .. } => id.clone(),
        _ => Id::NULL,
    };
    let (sid, session) = match session(&http, &headers, who.as_ref(), view.as_ref()).await {
        Ok(s) => s,
        Err(r) => return refuse(&id, r),
    };
    if let Err(r) = check_version(&headers) {
        return refuse(&id, r);
    }
    match msg {
        Kind::Notification { method, params } => {
            http.gw.notification(&session.client, &method, params.as_deref());
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Response { id, outcome } => {
            if !session.client.answer(id.as_ref(), outcome) {
                if http.gw.cluster().is_some() {
                    // The question may be another replica's call's.
                    http.gw.answer_elsewhere(&sid, &body);
                } else {
                    debug!(session = %crate::client::session_tag(&sid), "dropping a client response: no server→client request has its id");
                }
            }
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Request { id, method, params } => {
            let parent = crate::telemetry::from_headers(&headers);
            let sse_ok = accept.is_none_or(|a| a.sse);
            let client = session.client.clone();
            request(
                http,
                client,
                id,
                (crate::method::Method::parse(&method), method.into()),
                params,
                parent,
                None,
                Some((&session, sse_ok)),
            )
            .await
        }
    }
}

/// The one protocol version with JSON-RPC batches.
const BATCH_VERSION: &str = "2025-03-26";

/// A JSON-RPC batch of a 2025-03-26 session: its requests run at once and are answered
/// together as one JSON array, each response under its request's id (an element that is
/// not a message gets an error with a null id); a batch of notifications and responses
/// only is 202. `initialize` is refused in a batch (2025-03-26 forbids it there). The
/// requests' progress and log messages are not sent (there is no stream to send them on),
/// and servers' questions about them are refused.
async fn batch(http: &Http, headers: &HeaderMap, session: &Arc<Session>, body: &[u8]) -> Response {
    let items: Vec<&serde_json::value::RawValue> = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return reject(StatusCode::BAD_REQUEST, code::PARSE_ERROR, e.to_string()).into_response(),
    };
    if items.is_empty() {
        return reject(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "an empty batch: send at least one JSON-RPC message",
        )
        .into_response();
    }
    let client = &session.client;
    let error = |id: &Id, code: i64, msg: &str| {
        Some(message::response(
            id,
            &Outcome::Error(message::error_object(code, msg, None)),
        ))
    };
    let mut calls = Vec::new();
    for item in items {
        let answer = match Kind::parse_from_client(item.get().as_bytes()) {
            Err(e) => error(&Id::NULL, e.code(), &e.to_string()),
            Ok(Kind::Request { id, method, .. }) if method == "initialize" => error(
                &id,
                code::INVALID_REQUEST,
                "initialize must not be part of a batch: send it alone",
            ),
            Ok(Kind::Request { id, method, params }) => {
                let (gw, client) = (http.gw.clone(), client.clone());
                let parent = crate::telemetry::from_headers(headers);
                calls.push(futures::future::Either::Left(async move {
                    let out = gw
                        .request(&client, crate::router::Request::new(&id, &method, params), None, parent)
                        .await;
                    let out = out.unwrap_or_else(cancelled);
                    Some(message::response(&id, &out))
                }));
                continue;
            }
            Ok(Kind::Notification { method, params }) => {
                http.gw.notification(client, &method, params.as_deref());
                None
            }
            Ok(Kind::Response { id, outcome }) => {
                client.answer(id.as_ref(), outcome);
                None
            }
        };
        calls.push(futures::future::Either::Right(futures::future::ready(answer)));
    }
    let answers: Vec<Vec<u8>> = futures::future::join_all(calls).await.into_iter().flatten().collect();
    if answers.is_empty() {
        return StatusCode::ACCEPTED.into_response();
    }
    let mut out = Vec::with_capacity(answers.iter().map(|a| a.len() + 1).sum::<usize>() + 1);
    out.push(b'[');
    for (i, a) in answers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(a);
    }
    out.push(b']');
    json_response(out)
}
