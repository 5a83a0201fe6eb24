//! `mcp-gateway-bench remote-fixture`: a fast Streamable HTTP MCP server in Rust, for the
//! remote cases (`--mode remote-json,remote-sse`) and the pool tests (`tests/it/remote_pool.rs`).
//!
//! hyper, handshake era: `initialize` (a new `Mcp-Session-Id`), `ping`, `tools/list`
//! and `tools/call echo` are answered as the stdio fixture answers them
//! ([`crate::fixture::respond`]); `server/discover` gets -32601 like any unknown method,
//! so a gateway that probes falls back to `initialize`. Notifications get 202; GET
//! (no server stream) 405; DELETE 200. Every answer is JSON (`Content-Length`) or, with
//! `--sse`, one `event: message` on a chunked `text/event-stream` body that ends right
//! after it (or `--sse-linger-ms` later: a server that keeps the stream open a while).
//! `--delay-ms` answers each `tools/call` that much later (a timer: a server whose work
//! or distance takes time without using this machine's CPU).
//!
//! With `--tls-cert`/`--tls-key` (DER) it speaks TLS and offers `h2` and `http/1.1` by
//! ALPN, serving HTTP/2 when the client picks it (`--max-streams` streams at once on a
//! connection). `GET /stats` answers
//! `{"connections", "open", "peak", "http1", "http2"}`: connections accepted, open now, most open at once, and POSTs to the MCP path
//! by HTTP version. It says `remote fixture listening on http(s)://ADDR/mcp` on stderr and
//! runs until stdin closes (`--threads` workers; 1, the default, is a current-thread
//! runtime, like a single-threaded Node or Python server). [`spawn`] runs it in this
//! process instead, on a thread of its own, until dropped.

use crate::fixture;
use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::value::RawValue;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Longest request body read.
const MAX_BODY: usize = 1 << 20;

#[derive(clap::Parser, Debug)]
#[command(
    name = "mcp-gateway-bench remote-fixture",
    about = "a fast Streamable HTTP MCP server"
)]
pub struct RemoteArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Answer requests on an SSE stream instead of JSON.
    #[arg(long)]
    sse: bool,
    /// End each SSE stream this long after its answer event.
    #[arg(long, default_value_t = 0)]
    sse_linger_ms: u64,
    /// TLS: the server certificate, DER.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS: its private key, PKCS#8 DER.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Answer each `tools/call` this long after it arrives (a timer, no CPU): a server
    /// whose own work, or its distance, takes time.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Spread the delay: each `tools/call` waits `--delay-ms` plus or minus up to this
    /// many ms (uniform), as a real server's answers are spread over time instead of all
    /// ending on the same timer tick.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// HTTP/2: the SETTINGS_MAX_CONCURRENT_STREAMS advertised (default: hyper's, 200),
    /// a server that takes only this many calls at once on its one connection.
    #[arg(long)]
    max_streams: Option<u32>,
    /// Runtime threads (1: current-thread; 0: one per CPU).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Default)]
struct Stats {
    connections: AtomicU64,
    /// Connections open now.
    open: AtomicU64,
    /// The most connections open at once so far.
    peak: AtomicU64,
    http1: AtomicU64,
    http2: AtomicU64,
}

struct State {
    sse: bool,
    linger: Duration,
    delay: Duration,
    jitter: Duration,
    tools: String,
    stats: Stats,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The runtime `--threads` asks for.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(match threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    })
}

/// The `remote-fixture` subcommand: serves until stdin closes.
pub fn run(args: RemoteArgs) -> Result<()> {
    runtime(args.threads)?.block_on(async {
        let bound = bind(&args).await?;
        eprintln!("remote fixture listening on {}", bound.url);
        crate::exit_when_stdin_closes();
        serve(bound).await
    })
}

/// The fixture running in this process (see [`spawn`]); it stops when dropped.
pub struct Running {
    /// `http(s)://ADDR/mcp`.
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the fixture in this process, on a thread of its own with the runtime
/// `--threads` asks for; returns once it is listening.
pub fn spawn(args: RemoteArgs) -> Result<Running> {
    let rt = runtime(args.threads)?;
    let (ready, bound) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        rt.block_on(async move {
            match bind(&args).await {
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
                Ok(b) => {
                    let _ = ready.send(Ok(b.url.clone()));
                    tokio::select! {
                        _ = serve(b) => {}
                        _ = stopped => {}
                    }
                }
            }
        });
    });
    let url = bound.recv().context("the remote fixture's thread ended")??;
    Ok(Running {
        url,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// A listening socket, its TLS, and the server's state.
struct Bound {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    max_streams: Option<u32>,
    state: Arc<State>,
    url: String,
}

async fn bind(args: &RemoteArgs) -> Result<Bound> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some(acceptor(c, k)?),
        _ => None,
    };
    let listener = TcpListener::bind(args.listen).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}/mcp", listener.local_addr()?);
    let state = Arc::new(State {
        sse: args.sse,
        linger: Duration::from_millis(args.sse_linger_ms),
        delay: Duration::from_millis(args.delay_ms),
        jitter: Duration::from_millis(args.jitter_ms.min(args.delay_ms)),
        tools: fixture::tools_result(0),
        stats: Stats::default(),
    });
    Ok(Bound {
        listener,
        tls,
        max_streams: args.max_streams,
        state,
        url,
    })
}

async fn serve(bound: Bound) -> Result<()> {
    let Bound {
        listener,
        tls,
        max_streams,
        state,
        ..
    } = bound;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        state.stats.connections.fetch_add(1, Ordering::Relaxed);
        let now = state.stats.open.fetch_add(1, Ordering::Relaxed) + 1;
        state.stats.peak.fetch_max(now, Ordering::Relaxed);
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _open = Open(state.clone());
            let svc = hyper::service::service_fn(move |req| handle(state.clone(), req));
            match tls {
                None => {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                }
                Some(tls) => {
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    if h2 {
                        let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                        if let Some(n) = max_streams {
                            h2.max_concurrent_streams(n);
                        }
                        let _ = h2.serve_connection(TokioIo::new(stream), svc).await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    }
                }
            }
        });
    }
}

/// Counts a connection out of `open` when its task ends.
struct Open(Arc<State>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

fn acceptor(cert: &PathBuf, key: &PathBuf) -> Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let cert = CertificateDer::from(std::fs::read(cert).with_context(|| format!("read {}", cert.display()))?);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        std::fs::read(key).with_context(|| format!("read {}", key.display()))?,
    ));
    let mut config = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .context("TLS certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn full(status: StatusCode, content_type: Option<&'static str>, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed_unsync());
    *r.status_mut() = status;
    if let Some(ct) = content_type {
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    r
}

async fn handle(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/stats" {
        let s = &state.stats;
        let body = serde_json::json!({
            "connections": s.connections.load(Ordering::Relaxed),
            "open": s.open.load(Ordering::Relaxed),
            "peak": s.peak.load(Ordering::Relaxed),
            "http1": s.http1.load(Ordering::Relaxed),
            "http2": s.http2.load(Ordering::Relaxed),
        })
        .to_string();
        return Ok(full(StatusCode::OK, Some("application/json"), body));
    }
    if path != "/mcp" {
        return Ok(full(StatusCode::NOT_FOUND, None, Bytes::new()));
    }
    match req.version() {
        Version::HTTP_2 => state.stats.http2.fetch_add(1, Ordering::Relaxed),
        _ => state.stats.http1.fetch_add(1, Ordering::Relaxed),
    };
    match *req.method() {
        Method::POST => {}
        Method::DELETE => return Ok(full(StatusCode::OK, None, Bytes::new())),
        _ => return Ok(full(StatusCode::METHOD_NOT_ALLOWED, None, Bytes::new())),
    }
    let has_session = req.headers().contains_key("mcp-session-id");
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(full(StatusCode::BAD_REQUEST, None, Bytes::new())),
    };
    let Ok(msg) = serde_json::from_slice::<fixture::Msg>(&body) else {
        return Ok(full(StatusCode::BAD_REQUEST, None, "not JSON-RPC"));
    };
    let (Some(id), Some(method)) = (msg.id, msg.method.as_deref()) else {
        return Ok(full(StatusCode::ACCEPTED, None, Bytes::new())); // a notification or a response
    };
    let init = method == "initialize";
    if !init && method != "server/discover" && !has_session {
        return Ok(full(StatusCode::BAD_REQUEST, None, "missing Mcp-Session-Id"));
    }
    if method == "tools/call" && !state.delay.is_zero() {
        let delay = if state.jitter.is_zero() {
            state.delay
        } else {
            let spread = state.jitter.as_micros() as u64;
            let off = rand::random_range(0..=2 * spread);
            (state.delay + Duration::from_micros(off)).saturating_sub(state.jitter)
        };
        tokio::time::sleep(delay).await;
    }
    let params = msg.params.map_or("{}", RawValue::get);
    let (key, result) = fixture::respond(method, params, &state.tools, 0, "remote-fixture");
    let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"{key}\":{result}}}", id.get());
    let mut resp = if state.sse {
        let event = Bytes::from(format!("event: message\ndata: {answer}\n\n"));
        let linger = state.linger;
        let frames = futures::stream::unfold(Some(event), move |next| async move {
            match next {
                Some(ev) => Some((Ok::<_, Infallible>(Frame::data(ev)), None)),
                None => {
                    if !linger.is_zero() {
                        tokio::time::sleep(linger).await;
                    }
                    None
                }
            }
        });
        let mut r = Response::new(StreamBody::new(frames).boxed_unsync());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        r
    } else {
        full(StatusCode::OK, Some("application/json"), answer)
    };
    if init {
        let sid = format!("{:032x}", rand::random::<u128>());
        if let Ok(v) = HeaderValue::from_str(&sid) {
            resp.headers_mut().insert("mcp-session-id", v);
        }
    }
    Ok(resp)
}
