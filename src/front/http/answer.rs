//! A request's answer: JSON when nothing has to be sent before it, else an SSE stream
//! (its related messages, then the answer), resumable for a session.

use super::session::Session;
use super::{json_response, reject, Http};
use crate::downstream::{Sink, SINK_QUEUE};
use crate::error::{code, Error};
use crate::message::{self, Finder, Id, Kind, Outcome};
use crate::router::Client;
use crate::stateless::Finish;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// A call of a 2025-11-25 session not answered within this long is answered on SSE (it
/// starts with the priming event), so a dropped connection can be resumed.
const SSE_AFTER: Duration = Duration::from_millis(100);

/// An answer as SSE: `first`, then the rest of the messages (the response last).
pub(super) fn sse_answer(
    first: bytes::Bytes,
    rest: impl futures::Stream<Item = bytes::Bytes> + Send + 'static,
) -> Response {
    let events = futures::stream::once(async move { first })
        .chain(rest)
        .map(|m| Ok::<_, std::io::Error>(bytes::Bytes::from(event(&m))));
    sse_response(Body::from_stream(events))
}

/// The outcome of a request its client cancelled.
pub(super) fn cancelled() -> Outcome {
    Error::client(code::REQUEST_CANCELLED, "request cancelled by the client").into()
}

pub(super) fn task_failed() -> Response {
    reject(
        StatusCode::INTERNAL_SERVER_ERROR,
        code::INTERNAL_ERROR,
        "request task failed",
    )
    .into_response()
}

/// A stateless answer as JSON. -32020, -32021 and -32022 (a server's own included) are
/// 400 on HTTP in 2026-07-28. An answer whose text has no `-3202` in it carries none of
/// them, and is not parsed again to look.
pub(super) fn stateless_json(answer: bytes::Bytes) -> Response {
    static STATELESS_CODES: Finder = Finder::new(|| memchr::memmem::Finder::new(b"-3202"));
    if STATELESS_CODES.find(&answer).is_none() {
        return json_response(answer);
    }
    let status = match Kind::parse(&answer) {
        Ok(Kind::Response {
            outcome: Outcome::Error(e),
            ..
        }) if matches!(
            message::error_summary(&e).0,
            code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH
        ) =>
        {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::OK,
    };
    (status, json_response(answer)).into_response()
}

/// Whether `answer` is the gateway's -32030 (unavailable: a cluster's Redis is down and
/// `cluster.on_redis_down = "refuse"`), which is HTTP 503.
fn unavailable(answer: &message::Answer) -> bool {
    let message::Answer::Whole(v) = answer else {
        return false;
    };
    static UNAVAILABLE: Finder = Finder::new(|| memchr::memmem::Finder::new(b"-32030"));
    if UNAVAILABLE.find(v).is_none() {
        return false;
    }
    matches!(
        Kind::parse(v),
        Ok(Kind::Response { outcome: Outcome::Error(e), .. }) if message::error_summary(&e).0 == code::UNAVAILABLE
    )
}

/// Runs one request; answers with JSON if nothing else has to be sent first, else SSE.
/// With `session`, an SSE answer is resumable (see [`session_sse`]); `sse_ok`: its Accept
/// admits `text/event-stream`, so a slow call of a 2025-11-25 session may switch to SSE.
#[allow(clippy::too_many_arguments)]
pub(super) async fn request(
    http: Http,
    client: Arc<Client>,
    id: Id,
    (method, name): (crate::method::Method, std::borrow::Cow<'static, str>),
    params: message::Incoming,
    parent: Option<opentelemetry::Context>,
    finish: Option<Finish>,
    session: Option<(&Arc<Session>, bool)>,
) -> Response {
    let (sink, mut related) = mpsc::channel::<bytes::Bytes>(SINK_QUEUE);
    let gw = http.gw.clone();
    let stateless = finish.is_some();
    // Only a cluster's requests may be refused for Redis (503); one process never looks.
    let clustered = gw.cluster().is_some();
    // A session's call goes on when its client goes away (it may resume the stream); a
    // stateless request is cancelled by closing its connection: dropped, its call is.
    let keeps = session.is_some();
    let mut task = Detached(
        keeps,
        Some(Box::pin(async move {
            let out = gw
                .request(
                    &client,
                    crate::router::Request {
                        id: &id,
                        method,
                        name: &name,
                        params,
                    },
                    Some(Sink::new(sink)),
                    parent,
                )
                .await;
            let out = out.unwrap_or_else(cancelled);
            // Only an error may change the status: a result's text is not searched.
            let error = matches!(out, Outcome::Error(_));
            let answer = match finish {
                Some(f) => f.answer(&id, out),
                None => message::Answer::new(&id, out),
            };
            (answer, error)
        })),
    );
    // The request runs right here, without a task of its own, until the first thing to
    // send is known: the answer (the usual case: plain JSON), or a related message (then
    // it moves to a task, and the answer follows on an SSE stream). A 2025-11-25 session's
    // call still running after SSE_AFTER moves too: its stream starts with the priming
    // event, so the client can resume it. Other sessions never arm the timer.
    enum First {
        Answer((message::Answer, bool)),
        Related(bytes::Bytes),
        Slow,
    }
    let slow = session.is_some_and(|(s, sse_ok)| sse_ok && s.priming);
    let first = {
        let Some(fut) = task.1.as_mut() else {
            return task_failed();
        };
        let mut open = true;
        let wait = async {
            if slow {
                tokio::time::sleep(SSE_AFTER).await
            }
        };
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                m = related.recv(), if open => match m {
                    Some(m) => break First::Related(m),
                    None => open = false,
                },
                out = &mut *fut => break First::Answer(out),
                () = &mut wait, if slow => break First::Slow,
            }
        }
    };
    match first {
        First::Answer((answer, error)) => {
            task.1 = None;
            match related.try_recv() {
                Err(_) if error && clustered && unavailable(&answer) => {
                    (StatusCode::SERVICE_UNAVAILABLE, json_response(answer_body(answer))).into_response()
                }
                Err(_) if error && stateless => stateless_json(answer.into_vec().into()),
                Err(_) => json_response(answer_body(answer)),
                // Related messages queued before the answer go out before it, on SSE.
                Ok(m) => {
                    let rest = std::iter::from_fn(move || related.try_recv().ok());
                    let answer = answer.into_vec().into();
                    let rest = futures::stream::iter(rest.chain(std::iter::once(answer)));
                    match session {
                        Some((s, _)) => session_sse(&http, s, Some(m), rest),
                        None => sse_answer(m, rest),
                    }
                }
            }
        }
        First::Related(_) | First::Slow => {
            let Some(fut) = task.1.take() else {
                return task_failed();
            };
            let m = match first {
                First::Related(m) => Some(m),
                _ => None,
            };
            match (session, m) {
                (Some((s, _)), m) => {
                    // A task runs the call; the stream records what it sends.
                    let (done_tx, done) = oneshot::channel::<Vec<u8>>();
                    crate::background::spawn(async move {
                        let _ = done_tx.send(fut.await.0.into_vec());
                    });
                    let done = Box::pin(async move { done.await.ok() });
                    session_sse(&http, s, m, outgoing(related, done).map(|(_, m)| m))
                }
                // Stateless: the call runs inside the response's stream, so a client that
                // closes the connection drops it, which cancels it downstream.
                (None, Some(m)) => {
                    let done = Box::pin(async move { Some(fut.await.0.into_vec()) });
                    sse_answer(m, outgoing(related, done).map(|(_, m)| m))
                }
                (None, None) => task_failed(),
            }
        }
    }
}

/// A session's SSE answer, resumable: the priming event first (2025-11-25 and later),
/// then `first` and `rest` as events with ids, kept for replay (see [`crate::front::replay`]). A task
/// sends them, so a client that drops the connection does not stop the call: it runs on
/// until answered (or its server's timeout, or the session's end), its events kept, and
/// a GET with `Last-Event-ID` picks the stream up where the client lost it.
fn session_sse(
    http: &Http,
    session: &Arc<Session>,
    first: Option<bytes::Bytes>,
    rest: impl futures::Stream<Item = bytes::Bytes> + Send + 'static,
) -> Response {
    let replay = session.replay(http);
    let (stream, live) = replay.open_post();
    let priming = session.priming.then(|| replay.priming(stream, None));
    crate::background::spawn(async move {
        if let Some(m) = first {
            replay.record(stream, &m);
        }
        let mut rest = std::pin::pin!(rest);
        while let Some(m) = rest.next().await {
            replay.record(stream, &m);
        }
        replay.finish(stream);
    });
    sse_response(Body::from_stream(live_body(priming, Vec::new(), Some(live))))
}

/// An SSE body: the priming event, `frames`, then whatever arrives on `live`.
pub(super) fn live_body(
    priming: Option<bytes::Bytes>,
    frames: Vec<bytes::Bytes>,
    live: Option<mpsc::Receiver<bytes::Bytes>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    let head = futures::stream::iter(priming.into_iter().chain(frames));
    let tail = futures::stream::unfold(live, |live| async move {
        let mut rx = live?;
        let m = rx.recv().await?;
        Some((m, Some(rx)))
    });
    head.chain(tail).map(Ok::<_, std::io::Error>)
}

/// A request still running, with the answer it will make. Dropped unfinished (the client
/// went away), a session's (`true`) goes on in a task of its own, as if it had been
/// spawned; a stateless request's is dropped, which cancels it.
struct Detached(bool, Option<Answering>);

/// A request's call, to its answer and whether that is an error.
type Answering = std::pin::Pin<Box<dyn std::future::Future<Output = (message::Answer, bool)> + Send>>;

/// A JSON answer's body. A large result goes to the socket from its own buffer, after the
/// head and before the closing brace, with its length known (Content-Length).
pub(super) fn answer_body(answer: message::Answer) -> Body {
    match answer {
        message::Answer::Whole(v) => Body::from(v),
        message::Answer::Parts(head, result, tail) => Body::new(Chunks::new([bytes::Bytes::from(head), result, tail])),
    }
}

/// A body of a few buffers sent as they are, with their total length known.
struct Chunks {
    parts: std::collections::VecDeque<bytes::Bytes>,
    left: u64,
}

impl Chunks {
    fn new<const N: usize>(parts: [bytes::Bytes; N]) -> Chunks {
        let left = parts.iter().map(|b| b.len() as u64).sum();
        Chunks {
            parts: parts.into_iter().filter(|b| !b.is_empty()).collect(),
            left,
        }
    }
}

impl axum::body::HttpBody for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let next = this.parts.pop_front().map(|b| {
            this.left -= b.len() as u64;
            Ok(hyper::body::Frame::data(b))
        });
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(fut) = self.1.take().filter(|_| self.0) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                crate::background::spawn_on(
                    async move {
                        fut.await;
                    },
                    &rt,
                );
            }
        }
    }
}

/// A request's answer as it will come (none: it never will).
type Done = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Vec<u8>>> + Send>>;

/// What one request sends back, in order: related messages, then the answer (flagged
/// `true`). Related messages queued before the answer always go out before it.
fn outgoing(related: mpsc::Receiver<bytes::Bytes>, done: Done) -> impl futures::Stream<Item = (bool, bytes::Bytes)> {
    enum Answer {
        Pending(Done),
        Ready(Vec<u8>),
        Sent,
    }
    futures::stream::unfold((related, Answer::Pending(done)), |(mut rx, answer)| async move {
        match answer {
            Answer::Sent => None,
            Answer::Ready(out) => match rx.try_recv() {
                Ok(m) => Some(((false, m), (rx, Answer::Ready(out)))),
                Err(_) => Some(((true, bytes::Bytes::from(out)), (rx, Answer::Sent))),
            },
            Answer::Pending(mut done) => tokio::select! {
                biased;
                Some(m) = rx.recv() => Some(((false, m), (rx, Answer::Pending(done)))),
                out = &mut done => {
                    let out = out?;
                    match rx.try_recv() {
                        Ok(m) => Some(((false, m), (rx, Answer::Ready(out)))),
                        Err(_) => Some(((true, bytes::Bytes::from(out)), (rx, Answer::Sent))),
                    }
                }
            },
        }
    })
}

/// One JSON-RPC message framed as an SSE `message` event.
pub(super) fn event(json: &[u8]) -> Vec<u8> {
    crate::front::replay::message_event(None, json)
}

pub(super) fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
