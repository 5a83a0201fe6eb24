//! The gateway itself as a stdio MCP server: one JSON-RPC message per line on stdin,
//! answers and notifications on stdout (and nothing else: every log goes to stderr).
//! One implicit session; requests run concurrently.

use crate::downstream::stdio::{read_line_limited, LineRead};
use crate::downstream::Sink;
use crate::message::{self, code, Kind, Outcome};
use crate::router::{Client, Gateway};
use bytes::Bytes;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

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
    let writer = tokio::spawn(write_lines(output, out_rx));
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

    let max_line = gw.config().gateway.max_line;
    let mut reader = BufReader::with_capacity(64 << 10, input);
    let mut line = Vec::new();
    tokio::pin!(shutdown);
    let mut stopping = false;
    loop {
        line.clear();
        let read = tokio::select! {
            r = read_line_limited(&mut reader, &mut line, max_line) => r,
            _ = &mut shutdown => {
                stopping = true;
                break;
            }
        };
        match read {
            Ok(LineRead::Eof) => break,
            Ok(LineRead::TooLong(n)) => {
                let err = Outcome::Error(message::error_object(
                    code::INVALID_REQUEST,
                    &format!("message of {n} bytes is over the {max_line} byte limit (gateway.max_line)"),
                    None,
                ));
                let _ = out_tx.send(Bytes::from(message::response(&Value::Null, &err))).await;
                continue;
            }
            Ok(LineRead::Line) => {}
            Err(e) => {
                warn!(error = %e, "reading stdin failed");
                break;
            }
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let msg = match Kind::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                let err = Outcome::Error(message::error_object(e.code(), &e.to_string(), None));
                let _ = out_tx.send(Bytes::from(message::response(&Value::Null, &err))).await;
                continue;
            }
        };
        match msg {
            Kind::Request { id, method, params } if method == "initialize" => {
                client.set_capabilities(params.as_deref());
                let out = gw.initialize_result(params.as_deref());
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
                if let Some(name) = &as_client {
                    // Looked up per request, so a reload's change to the table applies.
                    match gw.topology().auth.client(name) {
                        Some(identity) => client.set_identity(Some(identity)),
                        None => {
                            let err = Outcome::Error(message::error_object(
                                code::INVALID_REQUEST,
                                &format!("client {name:?} is no longer configured in gateway.toml"),
                                None,
                            ));
                            let _ = out_tx.send(Bytes::from(message::response(&id, &err))).await;
                            continue;
                        }
                    }
                }
                let (gw, client, out) = (gw.clone(), client.clone(), out_tx.clone());
                tokio::spawn(async move {
                    // A cancelled request gets no answer, as the spec asks.
                    if let Some(result) = gw
                        .request(&client, &id, &method, params, Some(Sink::new(out.clone())), None)
                        .await
                    {
                        let _ = out.send(Bytes::from(message::response(&id, &result))).await;
                    }
                });
            }
            Kind::Notification { method, params } => gw.notification(&client, &method, params.as_deref()),
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
    client.cancel_all();
    gw.forget_client(&client).await;
    notifier.abort();
    drop(out_tx);
    // Answers still being computed hold senders; the writer ends when the last is gone.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
}

async fn write_lines<W: AsyncWrite + Unpin>(mut out: W, mut rx: mpsc::Receiver<Bytes>) {
    while let Some(m) = rx.recv().await {
        if out.write_all(&m).await.is_err() || out.write_all(b"\n").await.is_err() {
            return;
        }
        if rx.is_empty() && out.flush().await.is_err() {
            return;
        }
    }
    let _ = out.flush().await;
}
