//! The HTTP client of a Streamable HTTP downstream.
//!
//! Requests go straight through hyper's pooled client (`hyper_util`'s legacy `Client`, the
//! one reqwest wraps) with rustls: keep-alive connections ([`POOL_MAX_IDLE`],
//! [`POOL_IDLE_TIMEOUT`]), `TCP_NODELAY`, ALPN offering `h2` and `http/1.1`, the system
//! roots plus an optional private CA. The URL is parsed once per server.
//!
//! reqwest's own layers (redirects, which a JSON-RPC POST must not follow anyway, retries,
//! its `Url` parsed twice per request, the headers copied twice) cost a remote call about
//! a quarter of the gateway's instructions (BENCHMARKS.md). reqwest stays for what it
//! does that this path does not: a server reached through a proxy named by
//! `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` (and not excluded by `NO_PROXY`), and a URL with
//! credentials in it (`https://user:pass@host/…`, sent as Basic authorization).
//!
//! Over HTTP/2 every call shares one connection, and the server caps the streams open at
//! once on it: each response says how many ([`Response::h2_streams`], read off the
//! connection's first frame by [`settings`]), so that the calls handed out fair slots
//! never outnumber them (`downstream/http.rs`).

mod settings;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use http::header::HeaderMap;
use http::{Method, StatusCode, Uri};
use http_body_util::{BodyDataStream, Full};
use hyper_util::client::legacy;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::time::Duration;

/// Idle keep-alive connections kept per server (HTTP/1.1: one per request in flight, so
/// this many concurrent calls reuse their connections; more open extra ones, closed
/// when they go idle beyond this). HTTP/2 (TLS servers offering `h2`) multiplexes every
/// call over one connection.
pub const POOL_MAX_IDLE: usize = 64;
/// An idle connection is closed after this long.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Connecting (TCP and TLS) gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The streams an HTTP/2 connection is taken to allow at once when its server's own
/// limit is not known (a server reached through reqwest, or a first frame that could not
/// be read): the limit hyper's HTTP/2 client itself keeps to until the server's SETTINGS
/// arrive, low enough for most servers (RFC 9113 §6.5.2 recommends they allow at least
/// 100).
pub const H2_STREAMS_UNKNOWN: usize = 100;

type Stream = hyper_rustls::MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
type Connector =
    tower::util::MapResponse<hyper_rustls::HttpsConnector<HttpConnector>, fn(Stream) -> settings::Sniffed<Stream>>;
type Direct = legacy::Client<Connector, Full<Bytes>>;

/// One server's client.
#[derive(Clone)]
pub struct HttpClient {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Direct { client: Box<Direct>, uri: Uri },
    Proxied { client: reqwest::Client, url: reqwest::Url },
}

/// A failed request, as a sentence without the URL (which may carry a credential).
#[derive(Debug, Clone)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `kind`, then the innermost cause of `e` (the most specific part).
fn sentence(kind: &str, e: &(dyn std::error::Error + 'static)) -> Error {
    let mut detail = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        Error(kind.to_owned())
    } else {
        Error(format!("{kind}: {}", plain_tls(detail)))
    }
}

/// rustls's words for a certificate it refuses in some cases are its enum's debug text
/// (`invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))`): those in words.
fn plain_tls(detail: String) -> String {
    const SAID: [(&str, &str); 2] = [
        (
            "CaUsedAsEndEntity",
            "the server presents a CA certificate (basicConstraints CA:TRUE, as `openssl req -x509` makes by default) as its own, which TLS refuses even when `ca_file` names it: give the server a certificate with CA:FALSE, signed by the CA that `ca_file` names",
        ),
        (
            "UnsupportedCertVersion",
            "the server's certificate is not X.509 version 3",
        ),
    ];
    match SAID.iter().find(|(k, _)| detail.contains(k)) {
        Some((_, words)) => format!("invalid peer certificate: {words}"),
        None => detail,
    }
}

fn from_reqwest(e: &reqwest::Error) -> Error {
    let kind = if e.is_connect() {
        "cannot connect"
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_body() || e.is_decode() {
        "the response broke off"
    } else {
        "request failed"
    };
    sentence(kind, e)
}

fn from_legacy(e: &legacy::Error) -> Error {
    sentence(
        if e.is_connect() {
            "cannot connect"
        } else {
            "request failed"
        },
        e,
    )
}

fn from_body(e: &hyper::Error) -> Error {
    let kind = if e.is_timeout() {
        "timed out"
    } else {
        "the response broke off"
    };
    match std::error::Error::source(e) {
        Some(_) => sentence(kind, e),
        None => Error(format!("{kind}: {e}")),
    }
}

/// The rustls configuration: the system roots, plus the certificates of `ca_file`.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read ca_file {}: {e}", path.display()))?;
        let mut any = false;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("ca_file {} is not PEM: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("ca_file {} holds a certificate rustls refuses: {e}", path.display()))?;
            any = true;
        }
        if !any {
            return Err(format!("ca_file {} holds no PEM certificate", path.display()));
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    // ALPN (`h2`, `http/1.1`) is set by the connector from the versions it enables.
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The reqwest client for a proxied server (or a URL with credentials in it), and for
/// the 2024-11-05 HTTP+SSE transport (`sse.rs`).
pub fn reqwest_client(ca_file: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        // As the direct path: a 3xx is the server's answer, never followed (a redirect
        // would carry the configured headers, X-Api-Key say, and the body elsewhere).
        .redirect(reqwest::redirect::Policy::none())
        .use_rustls_tls();
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read ca_file {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {} is not PEM: {e}", path.display()))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| format!("cannot build the HTTP client: {e}"))
}

impl HttpClient {
    /// The client for the server at `url` (already checked to be http or https).
    pub fn new(url: &reqwest::Url, ca_file: Option<&std::path::Path>) -> Result<HttpClient, String> {
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e| format!("the URL is not a valid HTTP URI: {e}"))?;
        let proxied = hyper_util::client::proxy::matcher::Matcher::from_env()
            .intercept(&uri)
            .is_some();
        let credentials = !url.username().is_empty() || url.password().is_some();
        if proxied || credentials {
            return Ok(HttpClient {
                inner: Inner::Proxied {
                    client: reqwest_client(ca_file)?,
                    url: url.clone(),
                },
            });
        }
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(ca_file)?)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let sniffed: Connector = tower::ServiceExt::map_response(https, settings::Sniffed::new as fn(Stream) -> _);
        let client = legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(sniffed);
        Ok(HttpClient {
            inner: Inner::Direct {
                client: Box::new(client),
                uri,
            },
        })
    }

    /// Sends `method` to the server's URL with `headers` and `body`.
    pub async fn send(&self, method: Method, headers: HeaderMap, body: Bytes) -> Result<Response, Error> {
        match &self.inner {
            Inner::Direct { client, uri } => {
                let mut req = http::Request::new(Full::new(body));
                *req.method_mut() = method;
                *req.uri_mut() = uri.clone();
                *req.headers_mut() = headers;
                let resp = client.request(req).await.map_err(|e| from_legacy(&e))?;
                let (parts, body) = resp.into_parts();
                let h2_streams = (parts.version == http::Version::HTTP_2).then(|| {
                    parts
                        .extensions
                        .get::<settings::StreamLimit>()
                        .and_then(settings::StreamLimit::get)
                        .unwrap_or(H2_STREAMS_UNKNOWN)
                });
                Ok(Response {
                    status: parts.status,
                    headers: parts.headers,
                    h2_streams,
                    body: Body::Hyper(body),
                })
            }
            Inner::Proxied { client, url } => {
                let resp = client
                    .request(method, url.clone())
                    .headers(headers)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| from_reqwest(&e))?;
                Ok(Response {
                    status: resp.status(),
                    headers: resp.headers().clone(),
                    h2_streams: (resp.version() == http::Version::HTTP_2).then_some(H2_STREAMS_UNKNOWN),
                    body: Body::Reqwest(resp),
                })
            }
        }
    }
}

/// A response: its head, and its body still to read.
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    /// Over HTTP/2, the streams its connection allows at once ([`Response::h2_streams`]).
    h2_streams: Option<usize>,
    body: Body,
}

enum Body {
    Hyper(hyper::body::Incoming),
    Reqwest(reqwest::Response),
}

impl Response {
    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// `None` over HTTP/1.1; over HTTP/2, how many streams the server allows open at once
    /// on the response's connection: its `SETTINGS_MAX_CONCURRENT_STREAMS` (`usize::MAX` if
    /// it named none, as HTTP/2 has it), or [`H2_STREAMS_UNKNOWN`] if that is not known.
    pub fn h2_streams(&self) -> Option<usize> {
        self.h2_streams
    }

    /// The whole body, unless it is longer than `max` bytes: then `None`, and no more of
    /// it is read (a server cannot make the gateway hold more than `max` for an answer).
    pub async fn bytes_up_to(self, max: usize) -> Result<Option<Bytes>, Error> {
        let declared = self
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Ok(None);
        }
        let mut body = self.bytes_stream();
        // One chunk (most answers) is kept as it came; more are joined.
        let mut first: Option<Bytes> = None;
        let mut joined = bytes::BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            let total = first.as_ref().map_or(0, Bytes::len) + joined.len() + chunk.len();
            if total > max {
                return Ok(None);
            }
            match first.take() {
                None if joined.is_empty() => first = Some(chunk),
                Some(f) => {
                    joined.extend_from_slice(&f);
                    joined.extend_from_slice(&chunk);
                }
                None => joined.extend_from_slice(&chunk),
            }
        }
        Ok(Some(first.unwrap_or_else(|| joined.freeze())))
    }

    /// The body as it arrives.
    pub fn bytes_stream(self) -> BoxStream<'static, Result<Bytes, Error>> {
        match self.body {
            Body::Hyper(b) => BodyDataStream::new(b).map(|r| r.map_err(|e| from_body(&e))).boxed(),
            Body::Reqwest(r) => r.bytes_stream().map(|r| r.map_err(|e| from_reqwest(&e))).boxed(),
        }
    }
}
