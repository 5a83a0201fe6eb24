//! The gateway itself as a stdio MCP server: one JSON-RPC message per line on stdin,
//! answers and notifications on stdout (and nothing else: every log goes to stderr).
//! One implicit session; requests run concurrently.
//!
//! A request whose `params._meta` carries `io.modelcontextprotocol/protocolVersion` is a
//! 2026-07-28 (stateless) request and is served like one on HTTP (no `initialize` needed;
//! `_meta` validated by [`modern::prepare`], without the header checks; results decorated
//! by [`modern::finish`]), as a throwaway client of its own; `notifications/cancelled`
//! cancels it. Servers' questions during `tools/call`, `prompts/get` and `resources/read`
//! become `input_required` ([`crate::mrtr`]). `subscriptions/listen` streams its notifications as lines tagged with the
//! subscription id until cancelled; at the end of input or shutdown each stream gets its
//! graceful response.

use super::{listen, modern};
use crate::downstream::stdio::{LineReader, Next};
use crate::downstream::Sink;
use crate::message::{self, code, id_key, Id, Kind, Outcome};
use crate::router::{Client, Gateway};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// A 2026-07-28 request in flight, by its id: what `notifications/cancelled` cancels.
enum Modern {
    Call(Arc<Client>),
    /// A listen stream, or a call that may ask questions: cancelled by dropping it.
    Stop(CancellationToken),
}

type ModernTable = Arc<Mutex<HashMap<String, Modern>>>;

/// Serves MCP on `input`/`output` until `input` ends or `shutdown` completes; then
/// waits up to `grace` for requests still in flight. With `as_client`, the session is
/// that `[clients.NAME]`: its allowlist and limits apply, as of the config in force.
pub async fn serve<R, W>(
    gw: Arc<Gateway>,
    input: R,
    output: W,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    as_client: Option<String>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(crate::downstream::SINK_QUEUE);
    // Large answers (a result of 64 KiB or more) come on a channel of their own, in
    // parts, so their result is written from its own buffer (see `message::Answer`).
    let (large_tx, large_rx) = mpsc::channel::<message::Answer>(4);
    let writer = tokio::spawn(write_lines(output, out_rx, large_rx));
    let client = Arc::new(Client::new("stdio").transport("pipe"));

    // list_changed for everyone, and this session's own messages (resource updates).
    let mut changes = gw.subscribe();
    let mut own = client.subscribe_own();
    let fwd = out_tx.clone();
    let notifier = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                m = changes.recv() => m,
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

    let modern_inflight: ModernTable = Arc::default();
    let parked = crate::mrtr::Parked::new(gw.config().gateway.input_timeout);
    // Cancelled when input ends or shutdown begins: listen streams end gracefully.
    let closing = CancellationToken::new();

    let max_line = gw.config().gateway.max_line;
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
        };
        let line = match read {
            Ok(Next::Eof) => break,
            Ok(Next::TooLong(n, _)) => {
                let err = Outcome::Error(message::error_object(
                    code::INVALID_REQUEST,
                    &format!("message of {n} bytes is over the {max_line} byte limit (gateway.max_line)"),
                    None,
                ));
                let _ = out_tx.send(Bytes::from(message::response(&Id::NULL, &err))).await;
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
        let msg = match Kind::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                let err = Outcome::Error(message::error_object(e.code(), &e.to_string(), None));
                // Under the request's id when it could be read (a request over a limit).
                let id = e.id().cloned().unwrap_or(Id::NULL);
                let _ = out_tx.send(Bytes::from(message::response(&id, &err))).await;
                continue;
            }
        };
        match msg {
            Kind::Request { id, method, params } if modern::has_modern_meta(params.as_deref()) => {
                let identity = match client_identity(&gw, as_client.as_deref()) {
                    Ok(i) => i,
                    Err(err) => {
                        let _ = out_tx.send(Bytes::from(message::response(&id, &err))).await;
                        continue;
                    }
                };
                let m = ModernRequest {
                    gw: &gw,
                    out: &out_tx,
                    table: &modern_inflight,
                    closing: &closing,
                    parked: &parked,
                    principal: as_client.as_deref().unwrap_or("stdio"),
                };
                m.serve(id, method, params, identity).await;
            }
            Kind::Request { id, method, params } if method == "initialize" => {
                client.set_capabilities(params.as_deref());
                let identity = client_identity(&gw, as_client.as_deref()).ok().flatten();
                let out = gw.initialize_result_for(params.as_deref(), identity.as_deref());
                if let Outcome::Result(r) = &out {
                    if let Ok(v) = serde_json::from_str::<Value>(r.get()) {
                        if let Some(version) = v.get("protocolVersion").and_then(Value::as_str) {
                            let _ = client.protocol_version.set(version.to_owned());
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
                            let _ = out_tx.send(Bytes::from(message::response(&id, &err))).await;
                            continue;
                        }
                    }
                }
                let (gw, client, out, large) = (gw.clone(), client.clone(), out_tx.clone(), large_tx.clone());
                tokio::spawn(async move {
                    // A cancelled request gets no answer, as the spec asks.
                    if let Some(result) = gw
                        .request(&client, &id, &method, params, Some(Sink::new(out.clone())), None)
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
                // A 2026-07-28 request is cancelled through its own client (or stream).
                let modern = (method == "notifications/cancelled")
                    .then(|| message::cancelled_request_id(params.as_deref()))
                    .flatten()
                    .and_then(|rid| {
                        let table = modern_inflight.lock().unwrap_or_else(|e| e.into_inner());
                        match table.get(&id_key(&rid))? {
                            Modern::Call(c) => Some(Some(c.clone())),
                            Modern::Stop(t) => {
                                t.cancel();
                                Some(None)
                            }
                        }
                    });
                match modern {
                    Some(Some(c)) => gw.notification(&c, &method, params.as_deref()),
                    Some(None) => {}
                    None => gw.notification(&client, &method, params.as_deref()),
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

/// What a 2026-07-28 request on stdio needs from the loop.
struct ModernRequest<'a> {
    gw: &'a Arc<Gateway>,
    out: &'a mpsc::Sender<Bytes>,
    table: &'a ModernTable,
    closing: &'a CancellationToken,
    parked: &'a Arc<crate::mrtr::Parked>,
    /// Who may resume a parked call: the `--client` name, or "stdio".
    principal: &'a str,
}

impl ModernRequest<'_> {
    async fn answer(&self, id: &Id, out: &Outcome) {
        let _ = self.out.send(Bytes::from(message::response(id, out))).await;
    }

    /// Validates and runs one stateless request (in a task of its own).
    async fn serve(
        &self,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        identity: Option<Arc<crate::auth::Identity>>,
    ) {
        let prepared = match modern::prepare(None, &method, params.as_deref(), |_| None) {
            Ok(p) => p,
            Err(r) => {
                self.answer(&id, &Outcome::Error(message::error_object(r.code, &r.message, r.data)))
                    .await;
                return;
            }
        };
        let private = self.gw.topology().auth.required();
        let init = self.gw.initialize_result_for(None, identity.as_deref());
        if method == "server/discover" {
            self.answer(&id, &modern::discover(&init, private)).await;
            return;
        }
        let key = id_key(&id);
        if self.table.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key) {
            let err = message::error_object(
                code::INVALID_REQUEST,
                &format!("request id {key} is already in use"),
                None,
            );
            self.answer(&id, &Outcome::Error(err)).await;
            return;
        }
        if method == "subscriptions/listen" {
            let filter =
                match message::params_object(prepared.params.as_deref()).and_then(|p| listen::Filter::parse(&p)) {
                    Ok(f) => f,
                    Err(e) => {
                        self.answer(
                            &id,
                            &Outcome::Error(message::error_object(code::INVALID_PARAMS, &e, None)),
                        )
                        .await;
                        return;
                    }
                };
            static LISTENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            let n = LISTENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let client = Client::new(format!("stdio:listen-{n}"))
                .transport("pipe")
                .stateless(prepared.capabilities, None);
            let _ = client.protocol_version.set(modern::VERSION.to_owned());
            client.set_identity(identity);
            let cancel = CancellationToken::new();
            self.table
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), Modern::Stop(cancel.clone()));
            let l = listen::Listen {
                gw: self.gw.clone(),
                client: Arc::new(client),
                id,
                filter,
                closing: self.closing.clone(),
                cancel,
                finish: Box::new(move |out| modern::finish("subscriptions/listen", out, &init, private, None)),
            };
            let (out, table) = (self.out.clone(), self.table.clone());
            tokio::spawn(async move {
                listen::run(l, out, Bytes::copy_from_slice, None).await;
                table.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            });
            return;
        }
        let client = Client::new("stdio")
            .transport("pipe")
            .stateless(prepared.capabilities, prepared.log_rank);
        let _ = client.protocol_version.set(modern::VERSION.to_owned());
        client.set_identity(identity);
        if crate::mrtr::may_ask(&method) {
            // Servers' questions come back as input_required (see crate::mrtr).
            let started = crate::mrtr::Round {
                gw: self.gw.clone(),
                parked: self.parked.clone(),
                id: id.clone(),
                method,
                principal: self.principal.to_owned(),
                init,
                private,
                uri: prepared.uri,
            }
            .start(client, prepared.params, None);
            let rounds = match started {
                Ok(r) => r,
                Err(refused) => {
                    self.answer(&id, &refused).await;
                    return;
                }
            };
            let cancel = CancellationToken::new();
            self.table
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), Modern::Stop(cancel.clone()));
            let (out, table) = (self.out.clone(), self.table.clone());
            tokio::spawn(async move {
                let mut rounds = Box::pin(rounds);
                loop {
                    // Cancelled: the rounds are dropped, which cancels the call; no answer.
                    let next = tokio::select! {
                        n = futures::StreamExt::next(&mut rounds) => n,
                        _ = cancel.cancelled() => None,
                    };
                    let Some((last, m)) = next else { break };
                    if out.send(m).await.is_err() || last {
                        break;
                    }
                }
                table.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            });
            return;
        }
        let client = Arc::new(client);
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), Modern::Call(client.clone()));
        let (gw, out, table) = (self.gw.clone(), self.out.clone(), self.table.clone());
        let uri = prepared.uri;
        let hint = gw.catalog().hint(&method);
        tokio::spawn(async move {
            let result = gw
                .request(
                    &client,
                    &id,
                    &method,
                    prepared.params,
                    Some(Sink::new(out.clone())),
                    None,
                )
                .await;
            table.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            // A cancelled request gets no answer.
            if let Some(result) = result {
                let result = modern::finish_cached(&method, result, &init, private, uri.as_deref(), hint);
                let _ = out.send(Bytes::from(message::response(&id, &result))).await;
            }
        });
    }
}

/// The identity `--client NAME` has in the config now (none without `--client`); an
/// error answer when the name is no longer configured.
fn client_identity(gw: &Gateway, as_client: Option<&str>) -> Result<Option<Arc<crate::auth::Identity>>, Outcome> {
    let Some(name) = as_client else { return Ok(None) };
    gw.topology().auth.client(name).map(Some).ok_or_else(|| {
        Outcome::Error(message::error_object(
            code::INVALID_REQUEST,
            &format!("client {name:?} is no longer configured in gateway.toml"),
            None,
        ))
    })
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
        message::Answer::Parts(head, result) => {
            write_unbroken(out, &head).await?;
            write_unbroken(out, &result).await?;
            out.write_all(b"}\n").await
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
