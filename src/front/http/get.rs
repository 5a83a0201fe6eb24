//! GET on the MCP endpoint: a session's stream of server-initiated messages, and the
//! resumption of any of its SSE streams with `Last-Event-ID`.

use super::answer::{live_body, sse_response};
use super::checks::{accepted, admit_bodyless, check_version};
use super::session::{session, Session};
use super::{reject, Http, KEEPALIVE};
use crate::catalog::view::recv_for;
use crate::error::code;
use crate::front::replay::{self, Replay, Resumed};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// GET: the session's stream of server-initiated messages (list_changed), or with
/// `Last-Event-ID` the rest of the stream that id belongs to (see [`replay`]).
pub(super) async fn get_stream(State(http): State<Http>, req: axum::extract::Request) -> Response {
    let (headers, who, view) = match admit_bodyless(&http, req).await {
        Ok(a) => (a.headers, a.who, a.view),
        Err(resp) => return resp,
    };
    if !accepted(&headers).is_some_and(|a| a.sse) {
        return reject(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "GET answers with a stream: send Accept: text/event-stream",
        )
        .into_response();
    }
    let (sid, session) = match session(&http, &headers, who.as_ref(), view.as_ref()).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = check_version(&headers) {
        return r.into_response();
    }
    let mut resumed = None;
    // A GET resuming a GET stream that cannot be resumed here: opened anew instead.
    let mut reopened = false;
    if let Some(last) = headers.get(header::HeaderName::from_static("last-event-id")) {
        let last = String::from_utf8_lossy(last.as_bytes());
        let refused = |why: String| reject(StatusCode::GONE, code::INVALID_REQUEST, why).into_response();
        let Ok(event) = replay::parse_id(&last, http.origin.as_deref()) else {
            return reject(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                format!("Last-Event-ID {last:?} is not an event id of this gateway (STREAM-SEQ)"),
            )
            .into_response();
        };
        let kept = match event.here {
            true => session.replay.get().map(|r| r.resume(event.stream, event.seq)),
            false => None,
        };
        match kept {
            Some(Ok(Resumed::Post { frames, live })) => {
                let priming = session
                    .priming
                    .then(|| session.replay(&http).priming(event.stream, Some(event.seq)));
                return sse_response(Body::from_stream(live_body(priming, frames, live)));
            }
            Some(Ok(Resumed::Get { stream, frames })) => resumed = Some((stream, frames, event.seq)),
            // The session's GET stream, held by another replica (gone, or draining) or
            // with its events no longer kept: a new one. What was sent on the old one
            // since that id is not sent again (cluster mode; notifications are
            // delivered at most once, and SDK clients reconnect with the id they last
            // read, so a refusal would end their GET stream for good).
            _ if event.get == Some(true) => {
                tracing::debug!(session = %crate::client::session_tag(&sid), %last, "a GET stream resumed that is not kept here: opened anew");
                reopened = true;
            }
            _ if !event.here => {
                return refused(format!(
                    "cannot resume after event {last}: another replica sent that stream and keeps its events; \
                     start over"
                ))
            }
            _ => {
                return refused(format!(
                    "cannot resume after event {last}: its stream is unknown or its events are no longer kept \
                     (a session keeps its last {} events, for at most {} s); start over",
                    replay::REPLAY_EVENTS,
                    replay::REPLAY_AGE.as_secs()
                ))
            }
        }
    }
    static CONNS: AtomicU64 = AtomicU64::new(1);
    let conn = CONNS.fetch_add(1, Ordering::Relaxed);
    let ended = CancellationToken::new();
    {
        let mut current = crate::sync::lock(&session.get_conn);
        match current.take() {
            // A client resuming its GET stream: the connection it lost, if this replica
            // has not noticed yet, ends.
            Some((_, old, _)) if resumed.is_some() || reopened => old.cancel(),
            Some(old) => {
                *current = Some(old);
                return reject(
                    StatusCode::CONFLICT,
                    code::INVALID_REQUEST,
                    "this session already has an open GET stream",
                )
                .into_response();
            }
            None => {}
        }
        let at = crate::cluster::now_ms();
        *current = Some((conn, ended.clone(), at));
        session.get_open.store(true, Ordering::Release);
        // Cluster mode: one GET stream per session over every replica, the newest.
        http.gw.stream_opened_elsewhere(&sid, at);
    }
    let replay = session.replay(&http);
    let (stream, frames, after) = match resumed {
        Some((stream, frames, after)) => {
            replay.reopen(stream);
            (stream, frames, Some(after))
        }
        None => (replay.open_get(), Vec::new(), None),
    };
    /// The GET connection `.3` of stream `.2`; when it ends, the stream has no
    /// connection (unless a resuming GET took it over meanwhile).
    struct Open(Arc<Session>, Arc<Replay>, u64, u64);
    impl Drop for Open {
        fn drop(&mut self) {
            let mut current = crate::sync::lock(&self.0.get_conn);
            if current.as_ref().is_some_and(|(c, _, _)| *c == self.3) {
                *current = None;
                self.0.get_open.store(false, Ordering::Release);
                self.1.finish(self.2);
            }
        }
    }
    let priming = session.priming.then(|| replay.priming(stream, after));
    let open = Open(session, replay, stream, conn);
    let rx = http.gw.subscribe();
    let own = open.0.client.subscribe_own();
    let closing = http.closing.clone();
    let ender = http.clone();
    // A stream opened with a JWT ends when the JWT does: the client opens it again with
    // the token it has now, which is checked, so what it hears never outlives its credential.
    let expires = who
        .as_ref()
        .and_then(|i| i.bearer.as_ref())
        .and_then(|b| crate::auth::valid_until(b.expose()));
    let expiry: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = Box::pin(async move {
        match expires {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    });
    let live = futures::stream::unfold((rx, own, open, expiry), move |(mut rx, mut own, open, mut expiry)| {
        let closing = closing.clone();
        let ender = ender.clone();
        let sid = sid.clone();
        let ended = ended.clone();
        async move {
            // At shutdown the stream stays open until the session's calls in flight are
            // answered (or shutdown_grace ends): a client may need it until then (the
            // Python SDK's fails its session when its GET stream cannot be reopened).
            let drained = async {
                closing.cancelled().await;
                open.0.client.idle().await;
            };
            let next = tokio::select! {
                () = drained => return None,
                () = ended.cancelled() => return None,
                () = &mut expiry => {
                    tracing::debug!(session = %crate::client::session_tag(&sid), "GET stream ended: the JWT it was opened with expired");
                    return None;
                }
                next = tokio::time::timeout(KEEPALIVE, recv_for(&mut rx, open.0.client.view())) => next,
                // This session's own messages (resources it subscribed to).
                next = own.recv() => Ok(next),
            };
            match next {
                Ok(Ok(m)) => {
                    let frame = open.1.record(open.2, &m);
                    Some((frame, (rx, own, open, expiry)))
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(n))) => {
                    // Its queue is full: this client cannot keep up. End its session (it
                    // will initialize again) rather than let it fall behind silently.
                    tracing::warn!(session = %crate::client::session_tag(&sid), missed = n, "GET stream cannot keep up; ending the session");
                    ender.end_session(&sid);
                    None
                }
                Ok(Err(_)) => None,
                Err(_) => Some((bytes::Bytes::from_static(b": keep-alive\n\n"), (rx, own, open, expiry))),
            }
        }
    });
    let head = futures::stream::iter(priming.into_iter().chain(frames));
    sse_response(Body::from_stream(head.chain(live).map(Ok::<_, std::io::Error>)))
}
