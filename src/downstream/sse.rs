//! The legacy HTTP+SSE transport (2024-11-05): a GET stream whose first `endpoint`
//! event names the URL to POST messages to; the server's messages arrive as SSE
//! `message` events on the GET stream. It is a message stream like a child's pipes,
//! so the same owner task ([`super::pipe::run_pipe`]) drives it.

use super::http::headers;
use super::pipe::{run_pipe, Pipe};
use super::{Connection, Incoming};
use crate::config::HttpSpec;
use crate::sse;
use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn, Instrument};

/// How long the server gets to name its POST endpoint.
const ENDPOINT_WAIT: Duration = Duration::from_secs(10);

/// Opens the GET stream and returns a handle at once; messages queue until the
/// server has named its endpoint.
pub fn spawn(server: Arc<str>, spec: &HttpSpec, incoming: mpsc::Sender<Incoming>) -> Result<Connection, String> {
    let http = super::client::reqwest_client(spec.ca_file.as_deref())?;
    let hdrs = headers(spec)?;
    let url = reqwest::Url::parse(spec.url.expose()).map_err(|e| format!("bad url {}: {e}", spec.url_display))?;
    let span = tracing::info_span!("downstream", server = %server, url = %spec.url_display, transport = "sse");
    let max = spec.max_message;
    let (write_tx, mut write_rx) = mpsc::channel::<Vec<u8>>(super::COMMAND_QUEUE);
    let (line_tx, line_rx) = mpsc::channel::<bytes::Bytes>(64);
    let (exit_tx, exit_rx) = oneshot::channel();
    let (endpoint_tx, mut endpoint_rx) = watch::channel::<Option<reqwest::Url>>(None);
    let stop = CancellationToken::new();

    // The GET stream: the endpoint, then the server's messages.
    {
        let (http, hdrs, url, stop) = (http.clone(), hdrs.clone(), url.clone(), stop.clone());
        crate::background::spawn(
            async move {
                let reason = tokio::select! {
                    r = read_stream(&http, hdrs, url, endpoint_tx, line_tx, max) => r,
                    _ = stop.cancelled() => "closed by the gateway".to_owned(),
                };
                let _ = exit_tx.send(reason);
            }
            .instrument(span.clone()),
        );
    }
    // POSTs, in order, once the endpoint is known.
    let unwritten = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let posted = unwritten.clone();
    crate::background::spawn(
        async move {
            let endpoint = match tokio::time::timeout(ENDPOINT_WAIT, endpoint_rx.wait_for(Option::is_some)).await {
                Ok(Ok(e)) => e.clone(),
                _ => {
                    warn!("the server named no endpoint on its SSE stream");
                    return;
                }
            };
            let Some(endpoint) = endpoint else { return };
            while let Some(mut line) = write_rx.recv().await {
                posted.fetch_sub(line.len(), std::sync::atomic::Ordering::Relaxed);
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                let r = http
                    .post(endpoint.clone())
                    .headers(hdrs.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(line)
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => {}
                    Ok(r) => warn!(status = %r.status(), "the server refused a message"),
                    Err(e) => warn!(error = %e.without_url(), "posting a message failed"),
                }
            }
        }
        .instrument(span.clone()),
    );
    let pipe = Pipe {
        write: write_tx,
        lines: line_rx,
        exit: exit_rx,
        pid: None,
        stop: Some(stop),
        unwritten,
        secrets: super::http::secret_values(spec),
        per_client: usize::MAX,
    };
    Ok(run_pipe(server, pipe, incoming, super::pipe::Watch::OFF, span))
}

/// Reads the GET stream until it ends; returns why it ended.
async fn read_stream(
    http: &reqwest::Client,
    hdrs: reqwest::header::HeaderMap,
    url: reqwest::Url,
    endpoint: watch::Sender<Option<reqwest::Url>>,
    lines: mpsc::Sender<bytes::Bytes>,
    max: usize,
) -> String {
    let resp = match http
        .get(url.clone())
        .headers(hdrs)
        .header(ACCEPT, "text/event-stream")
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return format!("cannot open the SSE stream: {}", e.without_url()),
    };
    if !resp.status().is_success() {
        return format!("the SSE stream was refused with HTTP {}", resp.status());
    }
    let mut parser = sse::Parser::with_limit(max);
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else {
            return "the SSE stream broke".to_owned();
        };
        let events = match parser.feed(&chunk) {
            Ok(evs) => evs,
            Err(n) => return format!("the server sent {n}"),
        };
        for ev in events {
            match ev.event.as_str() {
                "endpoint" => match url.join(ev.data.trim()) {
                    // Messages carry the configured headers: only to the server's own
                    // origin (scheme, host and port), as the SDKs require.
                    Ok(u) if u.origin() != url.origin() => {
                        return format!(
                            "the server named an endpoint on another origin ({}), which is refused: messages carry the configured headers",
                            u.origin().ascii_serialization()
                        )
                    }
                    Ok(u) => {
                        debug!(endpoint = %u.path(), "server named its endpoint");
                        let _ = endpoint.send(Some(u));
                    }
                    Err(e) => return format!("the server named a bad endpoint: {e}"),
                },
                "" | "message" => {
                    if lines.send(bytes::Bytes::from(ev.data)).await.is_err() {
                        return "closed".to_owned();
                    }
                }
                other => debug!(event = other, "ignoring an SSE event"),
            }
        }
    }
    "the SSE stream ended".to_owned()
}
