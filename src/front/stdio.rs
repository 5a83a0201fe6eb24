//! The gateway itself as a stdio MCP server: one JSON-RPC message per line on stdin,
//! answers and notifications on stdout (and nothing else: every log goes to stderr).
//! One implicit session; requests run concurrently.
//!
//! A request whose `params._meta` carries `io.modelcontextprotocol/protocolVersion` is a
//! 2026-07-28 (stateless) request: it goes to the one flow of that revision
//! ([`crate::stateless`]), with no headers, and its answer is written here;
//! `notifications/cancelled` naming it cancels it. `subscriptions/listen` streams its
//! notifications as lines tagged with the subscription id until cancelled; at the end of
//! input or shutdown each stream gets its graceful response.

use crate::catalog::view::ViewKey;
use crate::downstream::stdio::{LineReader, Next};
use crate::downstream::Sink;
use crate::error::Error;
use crate::message::{self, Id, Kind, Outcome};
use crate::method::Method;
use crate::router::{Client, Gateway};
use crate::stateless::{self, Answer, Stateless};
use bytes::Bytes;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// An error as the line that answers request `id`.
fn refuse(id: &Id, e: Error) -> Bytes {
    e.log();
    Bytes::from(message::response(id, &Outcome::from(e)))
}

/// Serves MCP on `input`/`output` until `input` ends or `shutdown` completes; then
/// waits up to `grace` for requests still in flight. With `as_client`, the session is
/// that `[clients.NAME]`: its allowlist and limits apply, as of the config in force.
/// With `view`, it sees that view (`stdio --profile NAME`), as the HTTP endpoint of the
/// profile does.
pub async fn serve<R, W>(
    gw: Arc<Gateway>,
    input: R,
    output: W,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    as_client: Option<String>,
    view: Option<ViewKey>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(crate::downstream::SINK_QUEUE);
    // Large answers (a result of 64 KiB or more) come on a channel of their own, in
    // parts, so their result is written from its own buffer (see `message::Answer`).
    let (large_tx, large_rx) = mpsc::channel::<message::Answer>(4);
    let writer = crate::background::spawn(write_lines(output, out_rx, large_rx));
    let client = Arc::new(Client::new("stdio").transport("pipe").in_view(view.clone()));

    // list_changed for everyone, and this session's own messages (resource updates).
    let mut changes = gw.subscribe();
    let mut own = client.subscribe_own();
    let fwd = out_tx.clone();
    let sees = view.clone();
    let notifier = crate::background::spawn(async move {
        loop {
            let next = tokio::select! {
                m = crate::catalog::view::recv_for(&mut changes, sees.as_ref()) => m,
                m = own.recv() => m,
            };
            match next {
                Ok(m) => {
                    if fwd.send(m).await.is_err() {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            }
        }
    });

    // Cancelled when input ends or shutdown begins: listen streams end gracefully.
    let closing = CancellationToken::new();
    let transport = stateless::Transport {
        name: "pipe",
        cancel_by_id: true,
    };
    let flow = Stateless::new(gw.clone(), transport, closing.clone());

    let max_line = gw.config().gateway.max_line;
    let spawned = Arc::new(AtomicUsize::new(0));
    let mut reader = LineReader::new(input);
    tokio::pin!(shutdown);
    let mut stopping = false;
    loop {
        // Cancel-safe: a line half read stays in the reader.
        let read = tokio::select! {
            r = reader.next(max_line) => r,
            _ = &mut shutdown => {
                stopping = true;
                break;
            }
            // stdout broke (the client went away): no answer can reach it any more, so
            // the calls in flight are cancelled rather than run for nobody.
            () = out_tx.closed() => {
                warn!("stdout is closed; stopping");
                break;
            }
        };
        let line = match read {
            Ok(Next::Eof) => break,
            Ok(Next::TooLong(n, _)) => {
                let err = Error::invalid_request(format!(
                    "message of more than {max_line} bytes is over the limit (gateway.max_line; {n} bytes read when it was refused)"
                ));
                let _ = out_tx.send(refuse(&Id::NULL, err)).await;
                continue;
            }
            Ok(Next::Line(line)) => line,
            Err(e) => {
                warn!(error = %e, "reading stdin failed");
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg = match Kind::parse_from_client(&line) {
            Ok(m) => m,
            Err(e) => {
                // Under the request's id when it could be read (a request over a limit).
                let id = e.id().cloned().unwrap_or(Id::NULL);
                let _ = out_tx.send(refuse(&id, Error::client(e.code(), e.to_string()))).await;
                continue;
            }
        };
        match msg {
            Kind::Request { id, method, params } if stateless::envelope::is_stateless(None, &method, &params) => {
                let identity = match client_identity(&gw, as_client.as_deref()) {
                    Ok(i) => i,
                    Err(err) => {
                        let _ = out_tx.send(refuse(&id, err)).await;
                        continue;
                    }
                };
                let request = stateless::Request {
                    id,
                    method,
                    params,
                    headers: None,
                    identity,
                    principal: stateless::Principal::Named(as_client.as_deref().unwrap_or("stdio").to_owned()),
                    client: "stdio".to_owned(),
                    parent: None,
                    streams: true,
                    view: view.clone(),
                };
                send_stateless(&gw, flow.serve(request), &out_tx, &large_tx).await;
            }
            Kind::Request { id, method, params } if method == "initialize" => {
                let params = params.to_raw();
                client.set_capabilities(params.as_deref());
                let identity = client_identity(&gw, as_client.as_deref()).ok().flatten();
                let out = gw.initialize_result_for(params.as_deref(), identity.as_deref(), view.as_ref());
                if let Outcome::Result(r) = &out {
                    if let Ok(v) = serde_json::from_str::<Value>(r.get()) {
                        if let Some(version) = v.get("protocolVersion").and_then(Value::as_str) {
                            let _ = client.protocol_version.set(version.to_owned().into());
                        }
                    }
                }
                let _ = out_tx.send(Bytes::from(message::response(&id, &out))).await;
            }
            Kind::Request { id, method, params } => {
                if as_client.is_some() {
                    // Looked up per request, so a reload's change to the table applies.
                    match client_identity(&gw, as_client.as_deref()) {
                        Ok(identity) => client.set_identity(identity),
                        Err(err) => {
                            let _ = out_tx.send(refuse(&id, err)).await;
                            continue;
                        }
                    }
                }
                // A request runs in a task of its own, which holds its answer until the
                // writer takes it. Past max_in_flight of them the refusal is sent from
                // here: a client that writes without reading its answers is held up by
                // its own full pipe, rather than piling up tasks (and memory) forever.
                let max = gw.config().gateway.max_in_flight;
                let Some(slot) = Spawned::take(&spawned, max) else {
                    let err = Error::invalid_request(format!(
                        "this session already has {max} requests in flight (gateway.max_in_flight); wait for some to finish"
                    ));
                    let _ = out_tx.send(refuse(&id, err)).await;
                    continue;
                };
                let (gw, client, out, large) = (gw.clone(), client.clone(), out_tx.clone(), large_tx.clone());
                crate::background::spawn(async move {
                    let _slot = slot;
                    // A cancelled request gets no answer, as the spec asks.
                    if let Some(result) = gw
                        .request(
                            &client,
                            crate::router::Request::new(&id, &method, params),
                            Some(Sink::new(out.clone())),
                            None,
                        )
                        .await
                    {
                        match message::Answer::new(&id, result) {
                            message::Answer::Whole(line) => {
                                let _ = out.send(Bytes::from(line)).await;
                            }
                            parts => {
                                let _ = large.send(parts).await;
                            }
                        }
                    }
                });
            }
            Kind::Notification { method, params } => {
                // A 2026-07-28 request is cancelled through the flow (its own client or stream).
                let theirs = Method::parse(&method) == Method::Cancelled && flow.cancel(params.as_deref());
                if !theirs {
                    gw.notification(&client, &method, params.as_deref());
                }
            }
            Kind::Response { id, outcome } => {
                if !client.answer(id.as_ref(), outcome) {
                    debug!("dropping a client response: no server→client request has its id");
                }
            }
        }
    }
    if stopping {
        info!(grace = ?grace, "shutting down; waiting for requests in flight");
        if tokio::time::timeout(grace, client.idle()).await.is_err() {
            info!("grace period over");
        }
    }
    closing.cancel();
    client.cancel_all();
    gw.forget_client(&client).await;
    notifier.abort();
    drop(out_tx);
    drop(large_tx);
    // Answers still being computed hold senders; the writer ends when the last is gone.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
}

/// One of the requests a pipe runs at once, given back when its task ends.
struct Spawned(Arc<AtomicUsize>);

impl Spawned {
    /// A place among at most `max`, if one is free.
    fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Spawned> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Spawned(count.clone()))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends what the stateless flow answered: at once, or from a task of its own (a call,
/// its rounds, a listen stream), each message as a line.
async fn send_stateless(
    gw: &Arc<Gateway>,
    answer: Answer,
    out: &mpsc::Sender<Bytes>,
    large: &mpsc::Sender<message::Answer>,
) {
    let (out, large) = (out.clone(), large.clone());
    match answer {
        Answer::Refused(id, e) => {
            let _ = out.send(refuse(&id, e)).await;
        }
        Answer::Now(id, outcome) => {
            let _ = out.send(Bytes::from(message::response(&id, &outcome))).await;
        }
        Answer::Call(call) => {
            let gw = gw.clone();
            crate::background::spawn(async move {
                let sink = Some(Sink::new(out.clone()));
                let result = gw
                    .request(
                        &call.client,
                        crate::router::Request::of(&call.id, call.method, call.params),
                        sink,
                        call.parent,
                    )
                    .await;
                drop(call.held);
                // A cancelled request gets no answer.
                if let Some(result) = result {
                    match call.finish.answer(&call.id, result) {
                        message::Answer::Whole(line) => {
                            let _ = out.send(Bytes::from(line)).await;
                        }
                        parts => {
                            let _ = large.send(parts).await;
                        }
                    }
                }
            });
        }
        Answer::Rounds(mut rounds) => {
            crate::background::spawn(async move {
                // Cancelled: the rounds end, which cancels the call; no answer.
                while let Some(sent) = rounds.next().await {
                    match sent {
                        stateless::Sent::Related(m) => {
                            if out.send(m).await.is_err() {
                                break;
                            }
                        }
                        // A large result is written from its own buffer, like a session's.
                        stateless::Sent::Answer(message::Answer::Whole(line)) => {
                            let _ = out.send(Bytes::from(line)).await;
                            break;
                        }
                        stateless::Sent::Answer(parts) => {
                            let _ = large.send(parts).await;
                            break;
                        }
                    }
                }
            });
        }
        Answer::Listen(l) => {
            crate::background::spawn(stateless::listen::run(l, out, Bytes::copy_from_slice, None));
        }
    }
}

/// The identity `--client NAME` has in the config now (none without `--client`); an
/// error answer when the name is no longer configured.
fn client_identity(gw: &Gateway, as_client: Option<&str>) -> Result<Option<Arc<crate::auth::Identity>>, Error> {
    let Some(name) = as_client else { return Ok(None) };
    gw.topology()
        .auth
        .client(name)
        .map(Some)
        .ok_or_else(|| Error::invalid_request(format!("client {name:?} is no longer configured in gateway.toml")))
}

/// Writes each message as a line. A large answer is written in its parts; whatever was
/// queued before it (its call's progress, say) goes out first.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut out: W,
    mut rx: mpsc::Receiver<Bytes>,
    mut large: mpsc::Receiver<message::Answer>,
) {
    let mut large_open = true;
    loop {
        let next = tokio::select! {
            biased;
            m = rx.recv() => match m {
                Some(m) => Ok(m),
                // Every sender is gone; a request queues its large answer before it
                // lets go of its sender, so what is left on `large` is complete.
                None => break,
            },
            a = large.recv(), if large_open => match a {
                Some(a) => Err(a),
                None => {
                    large_open = false;
                    continue;
                }
            },
        };
        let written = match next {
            Ok(m) => write_line(&mut out, &m).await,
            Err(a) => write_answer(&mut out, a).await,
        };
        if written.is_err() || (rx.is_empty() && large.is_empty() && out.flush().await.is_err()) {
            return;
        }
    }
    while let Ok(a) = large.try_recv() {
        if write_answer(&mut out, a).await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
}

/// Writes `m` as exactly one line: a message with raw line breaks (a downstream's
/// pretty-printed result, say) has them blanked in a copy first.
async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, m: &[u8]) -> std::io::Result<()> {
    write_unbroken(out, m).await?;
    out.write_all(b"\n").await
}

async fn write_unbroken<W: AsyncWrite + Unpin>(out: &mut W, m: &[u8]) -> std::io::Result<()> {
    if message::has_line_breaks(m) {
        let mut copy = m.to_vec();
        message::blank_line_breaks(&mut copy);
        out.write_all(&copy).await
    } else {
        out.write_all(m).await
    }
}

async fn write_answer<W: AsyncWrite + Unpin>(out: &mut W, a: message::Answer) -> std::io::Result<()> {
    match a {
        message::Answer::Whole(line) => write_line(out, &line).await,
        message::Answer::Parts(head, result, tail) => {
            write_unbroken(out, &head).await?;
            write_unbroken(out, &result).await?;
            write_unbroken(out, &tail).await?;
            out.write_all(b"\n").await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_large_answer_is_written_whole_after_what_was_queued_before_it() {
        let (tx, rx) = mpsc::channel::<Bytes>(8);
        let (ltx, lrx) = mpsc::channel::<message::Answer>(2);
        tx.send(Bytes::from_static(b"{\"progress\":1}")).await.unwrap();
        let big = message::to_raw(&serde_json::json!({ "text": "b".repeat(message::LARGE_RESULT) }));
        let answer = message::Answer::new(&Id::from(9), Outcome::Result(big.into()));
        assert!(matches!(answer, message::Answer::Parts(..)));
        ltx.send(answer).await.unwrap();
        drop((tx, ltx));
        let mut out = Vec::new();
        write_lines(&mut out, rx, lrx).await;
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').collect();
        assert_eq!(lines.len(), 3, "two lines and the end");
        assert_eq!(lines[0], b"{\"progress\":1}");
        let v: Value = serde_json::from_slice(lines[1]).unwrap();
        assert_eq!(v["id"], 9);
        assert_eq!(v["result"]["text"].as_str().map(str::len), Some(message::LARGE_RESULT));
    }
}
