//! gateway.toml: parsed once into [`RawConfig`] (serde, unknown keys rejected), then
//! validated into [`Config`] with `${VAR}` expanded and secrets wrapped in [`Secret`].
//!
//! This is the only module that reads the gateway's environment, and only through the
//! lookup function handed to [`Config::load`], so tests never touch process env.
//! Every error names the file, line and column it comes from.

use indexmap::IndexMap;
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// Environment variables a child inherits from the gateway; everything else it gets
/// comes from its own `env` table, so one server's secrets never reach another.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "SHELL"];

/// A value that must never be shown: `Debug` and `Display` print `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The real value, for the one place that must use it (a child's environment).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

// ---------------------------------------------------------------- raw (serde) form

/// The whole file, assembled table by table by [`read_tables`].
#[derive(Default)]
struct RawConfig {
    gateway: RawGateway,
    servers: IndexMap<Spanned<String>, RawServer>,
    rate_limits: RawGlobalLimits,
    telemetry: RawTelemetry,
    clients: IndexMap<Spanned<String>, RawClient>,
    auth: RawAuth,
}

/// `[clients.NAME]`: who may call, and what they may see.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClient {
    token: Option<Spanned<String>>,
    token_sha256: Option<Spanned<String>>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    rate_limit: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    oauth: Option<Spanned<RawOAuth>>,
}

/// `[auth.oauth]`: the gateway as an OAuth 2.1 resource server.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOAuth {
    issuer: Spanned<String>,
    audience: Spanned<String>,
    jwks_url: Spanned<String>,
    client_claim: Option<Spanned<String>>,
    resource: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    otlp_endpoint: Option<Spanned<String>>,
    otlp_protocol: Option<Spanned<String>>,
    service_name: Option<Spanned<String>>,
    log_format: Option<Spanned<String>>,
    #[serde(default)]
    record_payloads: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGlobalLimits {
    per_client: Option<Spanned<String>>,
    per_ip: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServerLimits {
    per_server: Option<Spanned<String>>,
    #[serde(default)]
    per_tool: IndexMap<String, Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    listen: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    separator: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    max_body: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    max_sessions: Option<Spanned<usize>>,
    max_sessions_per_client: Option<Spanned<usize>>,
    page_size: Option<usize>,
    max_in_flight: Option<Spanned<usize>>,
    session_idle: Option<Spanned<String>>,
    input_timeout: Option<Spanned<String>>,
    header_timeout: Option<Spanned<String>>,
    body_timeout: Option<Spanned<String>>,
    max_line: Option<Spanned<String>>,
    worker_threads: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    transport: Option<Spanned<String>>,
    #[serde(default)]
    headers: IndexMap<String, Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    #[serde(default)]
    args: Vec<String>,
    cwd: Option<String>,
    #[serde(default)]
    env: IndexMap<String, Spanned<String>>,
    prefix: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    tools: RawFilter,
    #[serde(default)]
    rate_limits: RawServerLimits,
    restart: Option<Spanned<String>>,
    isolation: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    stall_timeout: Option<Spanned<String>>,
    max_sessions: Option<usize>,
    protocol: Option<Spanned<String>>,
    /// `command` or `url` was there but of the wrong type (already reported): whether it
    /// is a stdio or a remote server is unknown, so the checks that depend on it are skipped.
    #[serde(skip)]
    kind_unknown: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFilter {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

// ---------------------------------------------------------------- validated form

/// The validated configuration the gateway runs on.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from; relative `cwd`s resolve against its folder.
    pub file: PathBuf,
    pub gateway: Gateway,
    /// Servers in file order; that order decides name collisions (first wins).
    pub servers: Vec<Server>,
    /// `[rate_limits]`: `per_client` and `per_ip`.
    pub rate_limits: RateLimits,
    /// `[telemetry]`: log format and OpenTelemetry export.
    pub telemetry: Telemetry,
    /// `[clients.*]` and `[auth.oauth]`: who may use the endpoint, and what each sees.
    pub auth: Auth,
}

/// `[clients.*]` and `[auth.oauth]`. With neither, the endpoint is open (as before).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Auth {
    /// In file order.
    pub clients: Vec<ClientSpec>,
    pub oauth: Option<OAuth>,
}

impl Auth {
    /// Whether requests to the MCP endpoint need a bearer token.
    pub fn required(&self) -> bool {
        !self.clients.is_empty() || self.oauth.is_some()
    }

    pub fn client(&self, name: &str) -> Option<&ClientSpec> {
        self.clients.iter().find(|c| c.name == name)
    }
}

/// One `[clients.NAME]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSpec {
    pub name: String,
    /// SHA-256 of its static bearer token; `None` for a client that only signs in with
    /// OAuth (or only runs `stdio --client`).
    pub token: Option<TokenDigest>,
    /// Globs over public tool and prompt names and resource URIs (empty allow: all).
    pub filter: Filter,
    /// The client's own limit, besides `[rate_limits] per_client`.
    pub rate_limit: Option<Rate>,
}

impl ClientSpec {
    /// Whether it sees everything (no allow and no deny globs).
    pub fn unrestricted(&self) -> bool {
        self.filter.allow.is_empty() && self.filter.deny.is_empty()
    }
}

/// The SHA-256 digest of a bearer token; never shown (`Debug` prints `sha256:****`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest(pub [u8; 32]);

impl TokenDigest {
    pub fn of(token: &str) -> TokenDigest {
        let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        TokenDigest(out)
    }

    /// From 64 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<TokenDigest> {
        let hex = hex.trim().as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
            let s = std::str::from_utf8(pair).ok()?;
            *o = u8::from_str_radix(s, 16).ok()?;
        }
        Some(TokenDigest(out))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:****")
    }
}

/// `[auth.oauth]`: JWT bearer tokens from one issuer.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuth {
    pub issuer: String,
    pub audience: String,
    pub jwks_url: String,
    /// The claim whose (string) value names the client; default `sub`.
    pub client_claim: String,
    /// The public URL of the MCP endpoint, for the protected-resource metadata; `None`:
    /// derived from each request's Host header (`http://HOST{path}`).
    pub resource: Option<String>,
}

/// `[telemetry]`, with the `OTEL_*` environment applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// Where spans go: the OTLP URL exactly as the exporter uses it (for http/protobuf
    /// with `/v1/traces` appended). `None`: no export.
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: OtlpProtocol,
    pub service_name: String,
    pub log_format: LogFormat,
    /// Record tool arguments and results on spans (opt-in).
    pub record_payloads: bool,
    /// How long finished spans wait before a batch is sent (`OTEL_BSP_SCHEDULE_DELAY`, ms).
    pub batch_delay: Option<Duration>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            otlp_endpoint: None,
            otlp_protocol: OtlpProtocol::HttpProtobuf,
            service_name: "mcp-gateway".into(),
            log_format: LogFormat::Text,
            record_payloads: false,
            batch_delay: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtlpProtocol {
    HttpProtobuf,
    Grpc,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Rate limits; which fields apply depends on where they were written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateLimits {
    pub per_client: Option<Rate>,
    pub per_ip: Option<Rate>,
    pub per_server: Option<Rate>,
    /// Keyed by the server's own tool name.
    pub per_tool: Vec<(String, Rate)>,
}

/// Per which period a rate counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Per {
    Second,
    Minute,
    Hour,
}

/// `"N/s"`, `"N/m"` or `"N/h"`, optionally followed by `" burst B"` (default burst N).
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    pub count: u32,
    pub per: Per,
    pub burst: u32,
}

impl Rate {
    pub fn parse(s: &str) -> Option<Rate> {
        let mut words = s.split_whitespace();
        let (n, per) = words.next()?.split_once('/')?;
        let count: u32 = n.parse().ok().filter(|&c| c > 0)?;
        let per = match per {
            "s" => Per::Second,
            "m" => Per::Minute,
            "h" => Per::Hour,
            _ => return None,
        };
        let burst = match (words.next(), words.next(), words.next()) {
            (None, _, _) => count,
            (Some("burst"), Some(b), None) => b.parse().ok().filter(|&b| b > 0)?,
            _ => return None,
        };
        Some(Rate { count, per, burst })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.per {
            Per::Second => "s",
            Per::Minute => "m",
            Per::Hour => "h",
        };
        write!(f, "{}/{per}", self.count)?;
        if self.burst != self.count {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// `[gateway]`: the public endpoint and defaults.
#[derive(Debug, Clone)]
pub struct Gateway {
    pub listen: SocketAddr,
    /// The MCP endpoint path, e.g. `/mcp`.
    pub path: String,
    /// Put between a server's prefix and its tool or prompt name.
    pub separator: String,
    /// Default per-request timeout for every server.
    pub request_timeout: Duration,
    /// Browser origins allowed besides localhost ones (exact match, e.g. `https://app.example.com`).
    pub allowed_origins: Vec<String>,
    /// Host header values allowed besides localhost ones (e.g. `gateway.internal:8080`).
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body; more is answered with 413.
    pub max_body: usize,
    /// How long in-flight requests get to finish after SIGTERM or SIGINT.
    pub shutdown_grace: Duration,
    /// Items per page of a merged list; 0 serves each list as one page.
    pub page_size: usize,
    /// Open HTTP sessions at most; `initialize` past it is refused (503).
    pub max_sessions: usize,
    /// Open HTTP sessions of one identity at most (the authenticated client's name, else
    /// the caller's IP address); `initialize` past it is refused (503). Default: a tenth
    /// of `max_sessions`, at least 1.
    pub max_sessions_per_client: usize,
    /// Requests in flight per session at most; more are refused with an error.
    pub max_in_flight: usize,
    /// A session unused this long (and with no open GET stream) is ended.
    pub session_idle: Duration,
    /// How long a 2026-07-28 call whose server asked a question (`input_required`) waits
    /// for the client's retry before it is cancelled; also its `requestState`'s lifetime.
    pub input_timeout: Duration,
    /// How long a client may take to send its request headers.
    pub header_timeout: Duration,
    /// How long a client may take to send a request body.
    pub body_timeout: Duration,
    /// Longest message line a child may write (or a stdio client send); longer ones fail
    /// the call they answer with an error naming the server.
    pub max_line: usize,
    /// Async runtime worker threads; `None`: half the CPUs, at least one (or
    /// `TOKIO_WORKER_THREADS`). Read at start only.
    pub worker_threads: Option<usize>,
}

/// One `[servers.NAME]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub name: String,
    /// Put before the server's tool and prompt names; empty means unprefixed.
    pub prefix: String,
    pub timeout: Duration,
    /// A server that owes answers and has said nothing for `timeout` is degraded (and
    /// pinged); for this long, it is killed and started again. Default: twice `timeout`.
    pub stall_timeout: Duration,
    pub enabled: bool,
    pub tools: Filter,
    pub transport: Transport,
    /// `per_server` and `per_tool`.
    pub rate_limits: RateLimits,
    pub restart: Restart,
    /// `shared` (one process for every client) or `session` (one per client session).
    pub isolation: Isolation,
    /// With `isolation = "session"`: a session's process unused this long is stopped.
    pub idle_timeout: Duration,
    /// With `isolation = "session"`: processes at most; a session past it gets an error.
    pub max_sessions: usize,
    /// Which protocol era to speak to the server.
    pub protocol: Era,
}

/// The protocol era spoken to a server: `auto` probes with `server/discover` (2026-07-28)
/// and falls back to the `initialize` handshake by the spec's rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Era {
    Auto,
    /// 2026-07-28 only: no `initialize`.
    Modern,
    /// The `initialize` handshake (2025-11-25 and earlier) only: no probe.
    Handshake,
}

/// Who shares a server's process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Isolation {
    /// One process (or remote session) for every client.
    Shared,
    /// One per client session: started on first use, stopped when the session ends or
    /// after `idle_timeout`. Questions it asks always reach the right client.
    Session,
}

/// When a server that went away is started again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Restart {
    /// After a crash (non-zero exit, signal) or a lost connection; not after a clean exit.
    OnFailure,
    Always,
    Never,
}

/// How to reach a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio(StdioSpec),
    Http(HttpSpec),
}

impl Transport {
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Stdio(_) => "stdio",
            Transport::Http(h) => match h.mode {
                HttpMode::Auto => "http",
                HttpMode::Streamable => "streamable-http",
                HttpMode::Sse => "sse",
            },
        }
    }
}

/// Which HTTP transport a remote server speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HttpMode {
    /// Streamable HTTP, falling back to legacy HTTP+SSE as the spec describes.
    Auto,
    Streamable,
    /// The 2024-11-05 HTTP+SSE transport.
    Sse,
}

/// A remote server.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSpec {
    /// The URL as written in gateway.toml (before `${VAR}` expansion): safe to show.
    pub url_display: String,
    /// The expanded URL; may carry a credential in its query.
    pub url: Secret,
    pub mode: HttpMode,
    /// Extra request headers, expanded; they are secrets.
    pub headers: Vec<(String, Secret)>,
    /// A PEM file of extra CA certificates to trust.
    pub ca_file: Option<PathBuf>,
}

/// A child process speaking MCP on its stdin/stdout.
#[derive(Debug, Clone, PartialEq)]
pub struct StdioSpec {
    pub command: String,
    pub args: Vec<String>,
    /// Absolute working directory.
    pub cwd: PathBuf,
    /// The child's own variables, expanded; they are secrets.
    pub env: Vec<(String, Secret)>,
    /// The inherited safe set ([`INHERITED_ENV`]) as read when the config loaded.
    pub inherited: Vec<(String, String)>,
    /// `gateway.max_line`: the longest stdout line accepted from the child.
    pub max_line: usize,
}

/// `allow`/`deny` globs over a server's own tool names (`*` and `?`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

impl Filter {
    pub fn permits(&self, name: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|g| glob(g, name));
        allowed && !self.deny.iter().any(|g| glob(g, name))
    }
}

/// Glob match with `*` (any run) and `?` (one character).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// One problem in a config file, located.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 for a problem with the file as a whole.
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            // About the file as a whole (it cannot be read).
            return write!(f, "{}: {}", self.file, self.message);
        }
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

/// All problems found in a config file (at least one).
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

struct Ctx<'a> {
    file: String,
    src: &'a str,
    errors: Vec<ConfigError>,
}

impl Ctx<'_> {
    fn at(&mut self, offset: usize, message: String) {
        let before = &self.src[..offset.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            column,
            message,
        });
    }
}

// ---------------------------------------------------------------- reading, table by table

/// The keys allowed at the top of the file.
const TOP_KEYS: &[&str] = &["gateway", "servers", "rate_limits", "telemetry", "clients", "auth"];

/// Parses the file into a spanned TOML document, then deserializes each table on its own
/// (`[gateway]`, each `[servers.NAME]`, each `[clients.NAME]`, `[rate_limits]`,
/// `[telemetry]`, `[auth]`), so every table's problems are reported in one run. Within a
/// table serde stops at its first problem; [`table`] then drops the offending key and
/// tries again, so a table's unknown keys and wrong types all come out too (a missing
/// required key is the exception: serde names one at a time). `None`: the file is not
/// TOML at all (one located error).
fn read_tables(cx: &mut Ctx, src: &str) -> Option<RawConfig> {
    let doc = match toml_edit::ImDocument::parse(src) {
        Ok(d) => d,
        Err(e) => {
            let offset = e.span().map_or(0, |s| s.start);
            let message = e.message().trim().replace('\n', "; ");
            cx.at(offset, format!("not valid TOML: {message}"));
            return None;
        }
    };
    let root = doc.as_table();
    let mut raw = RawConfig::default();
    for (key, item) in root.iter() {
        match key {
            "gateway" => raw.gateway = table(cx, &[key], item).map(|t| t.0).unwrap_or_default(),
            "rate_limits" => raw.rate_limits = table(cx, &[key], item).map(|t| t.0).unwrap_or_default(),
            "telemetry" => raw.telemetry = table(cx, &[key], item).map(|t| t.0).unwrap_or_default(),
            "auth" => raw.auth = table(cx, &[key], item).map(|t| t.0).unwrap_or_default(),
            "servers" => {
                raw.servers = named(cx, key, item, |s: &mut RawServer, removed| {
                    s.kind_unknown = removed.iter().any(|k| k == "command" || k == "url");
                })
            }
            "clients" => raw.clients = named(cx, key, item, |_: &mut RawClient, _| {}),
            other => {
                let at = key_span(root, other).map_or(0, |s| s.start);
                cx.at(at, unknown_key(&[], other, TOP_KEYS));
            }
        }
    }
    Some(raw)
}

/// `[servers.NAME]` or `[clients.NAME]`: each entry deserialized on its own.
fn named<T: serde::de::DeserializeOwned>(
    cx: &mut Ctx,
    section: &str,
    item: &toml_edit::Item,
    fix: impl Fn(&mut T, &[String]),
) -> IndexMap<Spanned<String>, T> {
    let mut out = IndexMap::new();
    let Some(t) = item.as_table_like() else {
        cx.at(
            start(item),
            format!(
                "{section}: expected tables like [{section}.NAME], found {}",
                item.type_name()
            ),
        );
        return out;
    };
    for (name, v) in t.iter() {
        let span = key_span(t, name).or_else(|| v.span()).unwrap_or(0..0);
        if let Some((mut raw, removed)) = table::<T>(cx, &[section, name], v) {
            fix(&mut raw, &removed);
            out.insert(Spanned::new(span, name.to_owned()), raw);
        }
    }
    out
}

/// Deserializes one table at `path`, reporting each of its problems; on a problem, the
/// key it is about is removed and the rest tried again. Also returns the removed keys
/// directly in the table (their values were wrong; the defaults stand in).
fn table<T: serde::de::DeserializeOwned>(
    cx: &mut Ctx,
    path: &[&str],
    item: &toml_edit::Item,
) -> Option<(T, Vec<String>)> {
    let mut item = item.clone();
    let mut removed: Vec<Vec<String>> = Vec::new();
    // Each round removes a key, so this ends; the bound only guards against a surprise.
    for _ in 0..256 {
        let e = match deserialize::<T>(item.clone()) {
            Ok(v) => return Some((v, removed.into_iter().map(|mut p| p.swap_remove(0)).collect())),
            Err(e) => e,
        };
        let offset = e.span().map(|s| s.start);
        let within = offset.and_then(|o| locate(&item, o)).unwrap_or_default();
        let message = e.message();
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'));
        // A required key whose value was wrong (and so removed) was already reported.
        let reported = missing.is_some_and(|f| {
            removed.iter().any(|r| {
                r.split_last()
                    .is_some_and(|(last, parent)| last == f && parent == within)
            })
        });
        if !reported {
            let full: Vec<String> = path.iter().map(|p| (*p).to_owned()).chain(within.clone()).collect();
            cx.at(offset.unwrap_or_else(|| start(&item)), explain(&full, message));
        }
        if within.is_empty() || !remove(&mut item, &within) {
            return None;
        }
        removed.push(within);
    }
    None
}

fn deserialize<T: serde::de::DeserializeOwned>(item: toml_edit::Item) -> Result<T, toml_edit::de::Error> {
    use serde::de::IntoDeserializer;
    match item {
        toml_edit::Item::Table(t) => toml_edit::de::from_document(toml_edit::DocumentMut::from(t)),
        toml_edit::Item::Value(v) => T::deserialize(v.into_deserializer()),
        toml_edit::Item::ArrayOfTables(a) => {
            T::deserialize(toml_edit::Value::Array(a.into_array()).into_deserializer())
        }
        toml_edit::Item::None => toml_edit::de::from_document(toml_edit::DocumentMut::new()),
    }
}

/// The path of keys, below `item`, of the deepest key whose name or value holds `offset`.
fn locate(item: &toml_edit::Item, offset: usize) -> Option<Vec<String>> {
    let t = item.as_table_like()?;
    let holds =
        |r: Option<std::ops::Range<usize>>| r.is_some_and(|r| r.start <= offset && offset < r.end.max(r.start + 1));
    for (k, v) in t.iter() {
        if let Some(mut deeper) = locate(v, offset) {
            deeper.insert(0, k.to_owned());
            return Some(deeper);
        }
        if holds(key_span(t, k)) || holds(v.span()) {
            return Some(vec![k.to_owned()]);
        }
    }
    None
}

fn remove(item: &mut toml_edit::Item, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = item;
    for p in parents {
        match at.as_table_like_mut().and_then(|t| t.get_mut(p)) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_table_like_mut().and_then(|t| t.remove(last)).is_some()
}

fn key_span(t: &dyn toml_edit::TableLike, key: &str) -> Option<std::ops::Range<usize>> {
    t.get_key_value(key).and_then(|(k, _)| k.span())
}

/// Where an item starts: its own span, else (an implicit table, an array of tables) its
/// first part's.
fn start(item: &toml_edit::Item) -> usize {
    if let Some(s) = item.span() {
        return s.start;
    }
    match item {
        toml_edit::Item::ArrayOfTables(a) => a.iter().find_map(|t| t.span()).map_or(0, |s| s.start),
        _ => item
            .as_table_like()
            .and_then(|t| t.iter().find_map(|(k, v)| key_span(t, k).or_else(|| v.span())))
            .map_or(0, |s| s.start),
    }
}

/// serde's message about the key at `path`, said in gateway.toml's terms: which key,
/// what it should be, with an example.
fn explain(path: &[String], message: &str) -> String {
    let at = path.join(".");
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (key, rest) = rest.split_once('`').unwrap_or((rest, ""));
        let allowed: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
        return unknown_key(&path[..path.len().saturating_sub(1)], key, &allowed);
    }
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        let mut key = path.to_vec();
        key.push(field.to_owned());
        let example = expected(&key).map_or(String::new(), |e| format!(" ({e})"));
        return format!("{at}: missing required key {field:?}{example}");
    }
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    if let Some(rest) = rest {
        let (found, serde_wants) = rest.split_once(", expected ").unwrap_or((rest, ""));
        let found = found.replace('`', "");
        return match expected(path) {
            // An item of a list is wrong, not the list.
            Some(want) if want.starts_with("a list") && serde_wants == "a string" => {
                format!("{at}: expected {want}; one item is {found}")
            }
            Some(want) => format!("{at}: expected {want}, found {found}"),
            None => format!("{at}: expected {}, found {found}", plain(serde_wants)),
        };
    }
    format!("{at}: {}", message.trim())
}

/// serde's name for a type, in words.
fn plain(serde_wants: &str) -> String {
    match serde_wants {
        "usize" | "u32" | "u64" => "a whole number like 10".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list like [\"a\", \"b\"]".into(),
        "a map" => "a table".into(),
        s if s.starts_with("struct ") => "a table".into(),
        s => s.into(),
    }
}

/// What the key at `path` takes, with an example; `None` for keys not known here.
fn expected(path: &[String]) -> Option<String> {
    let n = path.len();
    let key = path.last()?.as_str();
    let parent = if n >= 2 { path[n - 2].as_str() } else { "" };
    const RATE: &str = r#"a rate string like "10/s" (or "5/m", "100/h burst 10")"#;
    Some(match (parent, key) {
        ("per_tool", _) => RATE.into(),
        ("env" | "headers", _) if n >= 4 => format!(r#"a string (in quotes, e.g. {key} = "1")"#),
        (
            _,
            "request_timeout" | "shutdown_grace" | "session_idle" | "input_timeout" | "header_timeout" | "body_timeout"
            | "timeout" | "idle_timeout" | "stall_timeout",
        ) => r#"a duration string like "60s" (or "500ms", "2m", "1h")"#.into(),
        (_, "max_body" | "max_line") => r#"a size string like "16MiB" (or "512KiB", "1GiB", "1048576")"#.into(),
        (_, "per_client" | "per_ip" | "per_server" | "rate_limit") => RATE.into(),
        (_, "enabled" | "record_payloads") => format!("a boolean: {key} = true or {key} = false"),
        (_, "max_sessions" | "max_sessions_per_client" | "page_size" | "max_in_flight" | "worker_threads") => {
            format!("a whole number like {key} = 100")
        }
        (_, "allowed_origins") => r#"a list of strings like ["https://app.example.com"]"#.into(),
        (_, "allowed_hosts") => r#"a list of strings like ["gateway.internal:8080"]"#.into(),
        (_, "args") => r#"a list of strings like ["-y", "@modelcontextprotocol/server-everything"]"#.into(),
        (_, "allow" | "deny") => r#"a list of globs like ["search_*", "get_?"]"#.into(),
        (_, "env" | "headers" | "per_tool") => format!(r#"a table of strings like {key} = {{ NAME = "value" }}"#),
        ("servers", _) if n == 2 => r#"a table like [servers.NAME] with command = "..." or url = "...""#.into(),
        ("clients", _) if n == 2 => r#"a table like [clients.NAME] with token = "${TOKEN}""#.into(),
        (_, "tools") => r#"a table like tools = { allow = ["*"], deny = ["delete_*"] }"#.into(),
        (_, "rate_limits") => r#"a table like rate_limits = { per_server = "10/s" }"#.into(),
        (_, "gateway" | "telemetry" | "auth" | "oauth") => format!("a table like [{}]", path.join(".")),
        (_, "listen") => r#"an address string like "127.0.0.1:8080""#.into(),
        (_, "path") => r#"a string like "/mcp""#.into(),
        (_, "separator") => r#"a string like "__""#.into(),
        (_, "command") => r#"a string like "npx" (its arguments go in args = [...])"#.into(),
        (_, "url" | "jwks_url" | "resource" | "otlp_endpoint" | "issuer") => {
            r#"a URL string like "https://example.com/mcp""#.into()
        }
        (_, "transport") => r#"one of "auto", "streamable-http", "sse""#.into(),
        (_, "restart") => r#"one of "on-failure", "always", "never""#.into(),
        (_, "isolation") => r#"one of "shared", "session""#.into(),
        (_, "protocol") => r#"one of "auto", "2026-07-28", "handshake""#.into(),
        (_, "otlp_protocol") => r#"one of "http/protobuf", "grpc""#.into(),
        (_, "log_format") => r#"one of "text", "json""#.into(),
        (_, "token") => r#"a string like "${ALICE_TOKEN}""#.into(),
        (_, "token_sha256") => "a string of 64 hex digits (a SHA-256 digest)".into(),
        (_, "cwd" | "ca_file") => r#"a path string like "./certs""#.into(),
        (_, "prefix") => r#"a string like prefix = "calc" (or "" for none)"#.into(),
        (_, "service_name" | "audience") => format!(r#"a string like {key} = "mcp-gateway""#),
        (_, "client_claim") => r#"a string like client_claim = "sub""#.into(),
        _ => return None,
    })
}

/// `TABLE: unknown key "KEY"; expected one of …`, with the closest allowed key if one
/// is close.
fn unknown_key(table: &[String], key: &str, allowed: &[&str]) -> String {
    let at = if table.is_empty() {
        "the top level".to_owned()
    } else {
        table.join(".")
    };
    let mut m = if allowed.is_empty() {
        format!("{at}: unknown key {key:?}; no keys are allowed there")
    } else {
        format!("{at}: unknown key {key:?}; expected one of {}", allowed.join(", "))
    };
    let closest = allowed
        .iter()
        .map(|a| (edit_distance(key, a), *a))
        .min()
        .filter(|(d, a)| *d <= 2.max(a.len() / 4) && *d < a.len());
    if let Some((_, a)) = closest {
        m.push_str(&format!(" (did you mean {a:?}?)"));
    }
    m
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// How long a call parked on a question waits for the client's retry (`gateway.input_timeout`).
pub const DEFAULT_INPUT_TIMEOUT: Duration = Duration::from_secs(300);

impl Config {
    /// Reads and validates a config file. `env` looks up the gateway's environment.
    pub fn load(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let src = std::fs::read_to_string(path).map_err(|e| {
            // A relative path resolves against the working directory, which is often not
            // the one meant (an mcp.json stdio entry runs wherever its client runs): say both.
            let tried = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let cwd = std::env::current_dir().map_or_else(|e| format!("unknown: {e}"), |d| d.display().to_string());
            ConfigErrors(vec![ConfigError {
                file: tried.display().to_string(),
                line: 0,
                column: 0,
                message: format!(
                    "cannot read the config file: {e}; the working directory is {cwd}. Name the file with --config PATH or MCP_GATEWAY_CONFIG=PATH (absolute, or relative to the working directory)"
                ),
            }])
        })?;
        Config::parse(path, &src, env)
    }

    /// Validates config text as if read from `path`.
    pub fn parse(path: &Path, src: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let mut cx = Ctx {
            file: path.display().to_string(),
            src,
            errors: Vec::new(),
        };
        let Some(raw) = read_tables(&mut cx, src) else {
            return Err(ConfigErrors(cx.errors));
        };
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = if base.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base
        };
        let base = std::fs::canonicalize(&base).unwrap_or(base);

        let g = raw.gateway;
        let listen = match &g.listen {
            None => DEFAULT_LISTEN.parse().ok(),
            Some(s) => match s.get_ref().parse::<SocketAddr>() {
                Ok(a) => Some(a),
                Err(_) => {
                    cx.at(
                        s.span().start,
                        format!("listen: {:?} is not an address like \"127.0.0.1:8080\"", s.get_ref()),
                    );
                    None
                }
            },
        };
        let path_ = g.path.as_ref().map_or("/mcp".to_string(), |p| p.get_ref().clone());
        if !path_.starts_with('/') {
            let at = g.path.as_ref().map_or(0, |p| p.span().start);
            cx.at(at, format!("path: {path_:?} must start with '/'"));
        }
        let separator = g.separator.as_ref().map_or("__".to_string(), |s| s.get_ref().clone());
        if separator.is_empty() || !separator.chars().all(name_char) {
            let at = g.separator.as_ref().map_or(0, |s| s.span().start);
            cx.at(
                at,
                format!("separator: {separator:?} may only use [A-Za-z0-9_.-] and must not be empty"),
            );
        }
        let request_timeout = duration(
            &mut cx,
            g.request_timeout.as_ref(),
            "request_timeout",
            Duration::from_secs(60),
        );
        let session_idle = duration(
            &mut cx,
            g.session_idle.as_ref(),
            "session_idle",
            Duration::from_secs(30 * 60),
        );
        let input_timeout = duration(
            &mut cx,
            g.input_timeout.as_ref(),
            "input_timeout",
            DEFAULT_INPUT_TIMEOUT,
        );
        let header_timeout = duration(
            &mut cx,
            g.header_timeout.as_ref(),
            "header_timeout",
            Duration::from_secs(10),
        );
        let body_timeout = duration(
            &mut cx,
            g.body_timeout.as_ref(),
            "body_timeout",
            Duration::from_secs(30),
        );
        let max_line = match &g.max_line {
            None => 256 << 20,
            Some(s) => parse_size(s.get_ref()).unwrap_or_else(|| {
                cx.at(
                    s.span().start,
                    format!("max_line: {:?} is not a size like \"64MiB\"", s.get_ref()),
                );
                0
            }),
        };
        for (key, v) in [
            ("max_sessions", &g.max_sessions),
            ("max_in_flight", &g.max_in_flight),
            ("worker_threads", &g.worker_threads),
        ] {
            if let Some(n) = v.as_ref().filter(|n| *n.get_ref() == 0) {
                cx.at(n.span().start, format!("gateway.{key} must be at least 1"));
            }
        }
        if let Some(n) = g.max_sessions_per_client.as_ref().filter(|n| *n.get_ref() == 0) {
            cx.at(
                n.span().start,
                "gateway.max_sessions_per_client must be at least 1".to_owned(),
            );
        }
        let shutdown_grace = duration(
            &mut cx,
            g.shutdown_grace.as_ref(),
            "shutdown_grace",
            Duration::from_secs(10),
        );
        let max_body = match &g.max_body {
            None => 16 << 20,
            Some(s) => match parse_size(s.get_ref()) {
                Some(n) => n,
                None => {
                    cx.at(
                        s.span().start,
                        format!("max_body: {:?} is not a size like \"16MiB\"", s.get_ref()),
                    );
                    0
                }
            },
        };

        let rate_limits = RateLimits {
            per_client: rate(&mut cx, raw.rate_limits.per_client.as_ref(), "rate_limits.per_client"),
            per_ip: rate(&mut cx, raw.rate_limits.per_ip.as_ref(), "rate_limits.per_ip"),
            ..RateLimits::default()
        };
        let telemetry = telemetry(&mut cx, raw.telemetry, env);
        let auth = auth(&mut cx, raw.clients, raw.auth, env);
        let inherited: Vec<(String, String)> = INHERITED_ENV
            .iter()
            .filter_map(|k| env(k).map(|v| ((*k).to_string(), v)))
            .collect();
        let mut servers = Vec::new();
        let mut prefixes: IndexMap<String, String> = IndexMap::new();
        for (name, s) in raw.servers {
            let at = name.span().start;
            let name = name.into_inner();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                cx.at(at, format!("server name {name:?} may only use [A-Za-z0-9-]"));
            }
            let prefix = s.prefix.as_ref().map_or(name.clone(), |p| p.get_ref().clone());
            if !prefix.chars().all(name_char) {
                let at = s.prefix.as_ref().map_or(at, |p| p.span().start);
                cx.at(
                    at,
                    format!("servers.{name}.prefix: {prefix:?} may only use [A-Za-z0-9_.-]"),
                );
            }
            if !prefix.is_empty() && s.enabled {
                if let Some(other) = prefixes.insert(prefix.clone(), name.clone()) {
                    let at = s.prefix.as_ref().map_or(at, |p| p.span().start);
                    cx.at(
                        at,
                        format!("servers.{name}.prefix: {prefix:?} is already the prefix of server {other:?}"),
                    );
                }
            }
            let timeout = duration(
                &mut cx,
                s.timeout.as_ref(),
                &format!("servers.{name}.timeout"),
                request_timeout,
            );
            let server_limits = RateLimits {
                per_server: rate(
                    &mut cx,
                    s.rate_limits.per_server.as_ref(),
                    &format!("servers.{name}.rate_limits.per_server"),
                ),
                per_tool: s
                    .rate_limits
                    .per_tool
                    .iter()
                    .filter_map(|(tool, r)| {
                        rate(&mut cx, Some(r), &format!("servers.{name}.rate_limits.per_tool.{tool}"))
                            .map(|r| (tool.clone(), r))
                    })
                    .collect(),
                ..RateLimits::default()
            };
            let isolation = match s.isolation.as_ref().map(|r| r.get_ref().as_str()) {
                None | Some("shared") => Isolation::Shared,
                Some("session") => Isolation::Session,
                Some(other) => {
                    let at = s.isolation.as_ref().map_or(at, |r| r.span().start);
                    cx.at(
                        at,
                        format!("servers.{name}.isolation: {other:?} is not one of shared, session"),
                    );
                    Isolation::Shared
                }
            };
            let idle_timeout = duration(
                &mut cx,
                s.idle_timeout.as_ref(),
                &format!("servers.{name}.idle_timeout"),
                Duration::from_secs(600),
            );
            let stall_timeout = duration(
                &mut cx,
                s.stall_timeout.as_ref(),
                &format!("servers.{name}.stall_timeout"),
                timeout.saturating_mul(2),
            );
            let protocol = match s.protocol.as_ref().map(|r| r.get_ref().as_str()) {
                None | Some("auto") => Era::Auto,
                Some("2026-07-28") => Era::Modern,
                Some("handshake") => Era::Handshake,
                Some(other) => {
                    let at = s.protocol.as_ref().map_or(at, |r| r.span().start);
                    cx.at(
                        at,
                        format!("servers.{name}.protocol: {other:?} is not one of auto, 2026-07-28, handshake"),
                    );
                    Era::Auto
                }
            };
            let restart = match s.restart.as_ref().map(|r| r.get_ref().as_str()) {
                None | Some("on-failure") => Restart::OnFailure,
                Some("always") => Restart::Always,
                Some("never") => Restart::Never,
                Some(other) => {
                    let at = s.restart.as_ref().map_or(at, |r| r.span().start);
                    cx.at(
                        at,
                        format!("servers.{name}.restart: {other:?} is not one of on-failure, always, never"),
                    );
                    Restart::OnFailure
                }
            };
            let server = |transport| Server {
                name: name.clone(),
                prefix: prefix.clone(),
                timeout,
                stall_timeout,
                enabled: s.enabled,
                tools: Filter {
                    allow: s.tools.allow.clone(),
                    deny: s.tools.deny.clone(),
                },
                transport,
                rate_limits: server_limits.clone(),
                restart,
                isolation,
                idle_timeout,
                max_sessions: s.max_sessions.unwrap_or(100).max(1),
                protocol,
            };
            let command = match (s.command, s.url) {
                (Some(_), Some(url)) => {
                    cx.at(
                        url.span().start,
                        format!("servers.{name}: give either `command` (stdio) or `url` (HTTP), not both"),
                    );
                    continue;
                }
                (None, None) if s.kind_unknown => continue,
                (None, None) => {
                    cx.at(
                        at,
                        format!("servers.{name}: needs `command` (a stdio server) or `url` (a remote server)"),
                    );
                    continue;
                }
                (None, Some(url)) => {
                    for (key, v) in [
                        ("args", !s.args.is_empty()),
                        ("env", !s.env.is_empty()),
                        ("cwd", s.cwd.is_some()),
                    ] {
                        if v {
                            cx.at(
                                at,
                                format!("servers.{name}.{key} only applies to stdio servers (with `command`)"),
                            );
                        }
                    }
                    if let Some(t) = http_spec(&mut cx, &name, url, s.transport, s.headers, s.ca_file, &base, env) {
                        servers.push(server(Transport::Http(t)));
                    }
                    continue;
                }
                (Some(command), None) => {
                    for (key, v) in [
                        ("transport", s.transport.is_some()),
                        ("headers", !s.headers.is_empty()),
                        ("ca_file", s.ca_file.is_some()),
                    ] {
                        if v {
                            cx.at(
                                at,
                                format!("servers.{name}.{key} only applies to remote servers (with `url`)"),
                            );
                        }
                    }
                    command
                }
            };
            if command.get_ref().trim().is_empty() {
                cx.at(command.span().start, format!("servers.{name}.command is empty"));
            }
            let mut child_env = Vec::new();
            for (key, value) in s.env {
                let span = value.span();
                match expand(value.get_ref(), env) {
                    Ok(v) => child_env.push((key, Secret(v))),
                    Err(var) => cx.at(
                        span.start,
                        format!("servers.{name}.env.{key}: environment variable {var} is not set (write ${{{var}:-default}} for a default)"),
                    ),
                }
            }
            let cwd = match &s.cwd {
                None => base.clone(),
                Some(c) if Path::new(c).is_absolute() => PathBuf::from(c),
                Some(c) => base.join(c),
            };
            servers.push(server(Transport::Stdio(StdioSpec {
                command: command.into_inner(),
                args: s.args,
                cwd,
                env: child_env,
                inherited: inherited.clone(),
                max_line,
            })));
        }
        if !cx.errors.is_empty() {
            return Err(ConfigErrors(cx.errors));
        }
        let max_sessions = g.max_sessions.map_or(10_000, Spanned::into_inner);
        Ok(Config {
            file: path.to_path_buf(),
            gateway: Gateway {
                listen: listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
                path: path_,
                separator,
                request_timeout,
                allowed_origins: g.allowed_origins,
                allowed_hosts: g.allowed_hosts,
                max_body,
                shutdown_grace,
                max_sessions,
                max_sessions_per_client: g
                    .max_sessions_per_client
                    .map_or((max_sessions / 10).max(1), Spanned::into_inner),
                page_size: g.page_size.unwrap_or(0),
                max_in_flight: g.max_in_flight.map_or(1_000, Spanned::into_inner),
                session_idle,
                input_timeout,
                header_timeout,
                body_timeout,
                max_line,
                worker_threads: g.worker_threads.map(Spanned::into_inner),
            },
            servers,
            rate_limits,
            telemetry,
            auth,
        })
    }
}

/// `[clients.*]` and `[auth.oauth]`. Tokens are hashed here and only their digests kept.
fn auth(
    cx: &mut Ctx,
    clients: IndexMap<Spanned<String>, RawClient>,
    raw: RawAuth,
    env: &dyn Fn(&str) -> Option<String>,
) -> Auth {
    let mut out = Vec::new();
    let mut seen: Vec<(TokenDigest, String)> = Vec::new();
    for (name, c) in clients {
        let at = name.span().start;
        let name = name.into_inner();
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            cx.at(
                at,
                format!("client name {name:?} must not be empty or hold control characters"),
            );
        }
        let token = match (&c.token, &c.token_sha256) {
            (Some(_), Some(h)) => {
                cx.at(
                    h.span().start,
                    format!("clients.{name}: give either `token` or `token_sha256`, not both"),
                );
                None
            }
            (Some(t), None) => match expand(t.get_ref(), env) {
                Ok(v) if v.trim().is_empty() => {
                    cx.at(t.span().start, format!("clients.{name}.token is empty"));
                    None
                }
                Ok(v) => Some((TokenDigest::of(&v), t.span().start, "token")),
                Err(var) => {
                    cx.at(
                        t.span().start,
                        format!("clients.{name}.token: environment variable {var} is not set"),
                    );
                    None
                }
            },
            (None, Some(h)) => match TokenDigest::from_hex(h.get_ref()) {
                Some(d) => Some((d, h.span().start, "token_sha256")),
                None => {
                    cx.at(
                        h.span().start,
                        format!("clients.{name}.token_sha256 is not 64 hex digits (a SHA-256 digest)"),
                    );
                    None
                }
            },
            (None, None) => None,
        };
        let token = token.map(|(digest, at, key)| {
            if let Some((_, other)) = seen.iter().find(|(d, _)| *d == digest) {
                cx.at(at, format!("clients.{name}.{key}: client {other:?} has the same token"));
            }
            seen.push((digest, name.clone()));
            digest
        });
        let rate_limit = rate(cx, c.rate_limit.as_ref(), &format!("clients.{name}.rate_limit"));
        out.push(ClientSpec {
            name,
            token,
            filter: Filter {
                allow: c.allow,
                deny: c.deny,
            },
            rate_limit,
        });
    }
    let oauth = raw.oauth.map(|o| {
        let o = o.into_inner();
        let mut value = |v: &Spanned<String>, key: &str| match expand(v.get_ref(), env) {
            Ok(s) if s.trim().is_empty() => {
                cx.at(v.span().start, format!("auth.oauth.{key} is empty"));
                String::new()
            }
            Ok(s) => s.trim().to_owned(),
            Err(var) => {
                cx.at(
                    v.span().start,
                    format!("auth.oauth.{key}: environment variable {var} is not set"),
                );
                String::new()
            }
        };
        let issuer = value(&o.issuer, "issuer");
        let audience = value(&o.audience, "audience");
        let jwks_url = value(&o.jwks_url, "jwks_url");
        let client_claim = o
            .client_claim
            .as_ref()
            .map_or("sub".to_owned(), |c| value(c, "client_claim"));
        let resource = o.resource.as_ref().map(|r| value(r, "resource"));
        let urls = [(Some(&jwks_url), &o.jwks_url, "jwks_url")]
            .into_iter()
            .chain(o.resource.as_ref().map(|r| (resource.as_ref(), r, "resource")));
        for (v, raw, key) in urls {
            let v = v.map_or("", String::as_str);
            if !(v.is_empty() || v.starts_with("http://") || v.starts_with("https://")) {
                cx.at(
                    raw.span().start,
                    format!("auth.oauth.{key} must start with http:// or https://"),
                );
            }
        }
        OAuth {
            issuer,
            audience,
            jwks_url,
            client_claim,
            resource,
        }
    });
    Auth { clients: out, oauth }
}

/// `[telemetry]`: a key in the file wins over its `OTEL_*` variable. Errors about a
/// variable point at the `[telemetry]` key that would override it, or at line 1.
fn telemetry(cx: &mut Ctx, t: RawTelemetry, env: &dyn Fn(&str) -> Option<String>) -> Telemetry {
    let from_env = |key: &str| env(key).filter(|v| !v.trim().is_empty());
    let protocol = match &t.otlp_protocol {
        Some(p) => (
            p.get_ref().clone(),
            p.span().start,
            "telemetry.otlp_protocol".to_owned(),
        ),
        None => (
            from_env("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_else(|| "http/protobuf".into()),
            0,
            "OTEL_EXPORTER_OTLP_PROTOCOL (from the environment)".to_owned(),
        ),
    };
    let otlp_protocol = match protocol.0.trim() {
        "http/protobuf" => OtlpProtocol::HttpProtobuf,
        "grpc" => OtlpProtocol::Grpc,
        other => {
            cx.at(
                protocol.1,
                format!("{}: {other:?} is not one of \"http/protobuf\", \"grpc\"", protocol.2),
            );
            OtlpProtocol::HttpProtobuf
        }
    };
    let endpoint = match &t.otlp_endpoint {
        Some(e) => match expand(e.get_ref(), env) {
            Ok(v) => Some((v, e.span().start, "telemetry.otlp_endpoint".to_owned())),
            Err(var) => {
                cx.at(
                    e.span().start,
                    format!("telemetry.otlp_endpoint: environment variable {var} is not set"),
                );
                None
            }
        },
        None => from_env("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|v| (v, 0, "OTEL_EXPORTER_OTLP_ENDPOINT (from the environment)".to_owned())),
    };
    let otlp_endpoint = endpoint.and_then(|(url, at, key)| {
        let url = url.trim().to_owned();
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if !matches!(rest, Some(r) if !r.is_empty() && !r.starts_with('/')) {
            cx.at(
                at,
                format!("{key}: {url:?} is not a URL like \"http://127.0.0.1:4318\""),
            );
            return None;
        }
        Some(match otlp_protocol {
            // The base URL, as with OTEL_EXPORTER_OTLP_ENDPOINT: the signal's path is added.
            OtlpProtocol::HttpProtobuf if !url.ends_with("/v1/traces") => {
                format!("{}/v1/traces", url.trim_end_matches('/'))
            }
            _ => url,
        })
    });
    let service_name = match &t.service_name {
        Some(s) if s.get_ref().trim().is_empty() => {
            cx.at(s.span().start, "telemetry.service_name is empty".into());
            String::new()
        }
        Some(s) => s.get_ref().clone(),
        None => from_env("OTEL_SERVICE_NAME").unwrap_or_else(|| "mcp-gateway".into()),
    };
    let log_format = match t.log_format.as_ref().map(|f| (f.get_ref().as_str(), f.span().start)) {
        None | Some(("text", _)) => LogFormat::Text,
        Some(("json", _)) => LogFormat::Json,
        Some((other, at)) => {
            cx.at(
                at,
                format!("telemetry.log_format: {other:?} is not one of \"text\", \"json\""),
            );
            LogFormat::Text
        }
    };
    let batch_delay = from_env("OTEL_BSP_SCHEDULE_DELAY").and_then(|v| match v.trim().parse::<u64>() {
        Ok(ms) => Some(Duration::from_millis(ms.max(1))),
        Err(_) => {
            cx.at(
                0,
                format!("OTEL_BSP_SCHEDULE_DELAY (from the environment): {v:?} is not a number of milliseconds"),
            );
            None
        }
    });
    Telemetry {
        otlp_endpoint,
        otlp_protocol,
        service_name,
        log_format,
        record_payloads: t.record_payloads,
        batch_delay,
    }
}

fn rate(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str) -> Option<Rate> {
    let v = v?;
    let r = Rate::parse(v.get_ref());
    if r.is_none() {
        cx.at(
            v.span().start,
            format!(
                "{key}: {:?} is not a rate like \"20/s\", \"5/m\" or \"100/h burst 10\"",
                v.get_ref()
            ),
        );
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn http_spec(
    cx: &mut Ctx,
    name: &str,
    url: Spanned<String>,
    transport: Option<Spanned<String>>,
    headers: IndexMap<String, Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<HttpSpec> {
    let errors = cx.errors.len();
    let expanded = match expand(url.get_ref(), env) {
        Ok(u) => u,
        Err(var) => {
            cx.at(
                url.span().start,
                format!("servers.{name}.url: environment variable {var} is not set"),
            );
            String::new()
        }
    };
    if !(expanded.is_empty() || expanded.starts_with("http://") || expanded.starts_with("https://")) {
        cx.at(
            url.span().start,
            format!("servers.{name}.url must start with http:// or https://"),
        );
    }
    let mode = match transport.as_ref().map(|t| t.get_ref().as_str()) {
        None | Some("auto") => HttpMode::Auto,
        Some("streamable-http") => HttpMode::Streamable,
        Some("sse") => HttpMode::Sse,
        Some(other) => {
            let at = transport.as_ref().map_or(0, |t| t.span().start);
            cx.at(
                at,
                format!("servers.{name}.transport: {other:?} is not one of auto, streamable-http, sse"),
            );
            HttpMode::Auto
        }
    };
    let mut out_headers = Vec::new();
    for (key, value) in headers {
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
        {
            cx.at(
                value.span().start,
                format!("servers.{name}.headers: {key:?} is not a valid header name"),
            );
            continue;
        }
        match expand(value.get_ref(), env) {
            Ok(v) if v.bytes().any(|b| b == b'\r' || b == b'\n') => {
                cx.at(value.span().start, format!("servers.{name}.headers.{key}: the value contains a line break"));
            }
            Ok(v) => out_headers.push((key, Secret(v))),
            Err(var) => cx.at(
                value.span().start,
                format!("servers.{name}.headers.{key}: environment variable {var} is not set (write ${{{var}:-default}} for a default)"),
            ),
        }
    }
    let ca_file = ca_file.map(|c| {
        let p = Path::new(c.get_ref());
        let p = if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        if !p.is_file() {
            cx.at(
                c.span().start,
                format!("servers.{name}.ca_file: {} is not a readable file", p.display()),
            );
        }
        p
    });
    (cx.errors.len() == errors).then(|| HttpSpec {
        url_display: url.into_inner(),
        url: Secret(expanded),
        mode,
        headers: out_headers,
        ca_file,
    })
}

/// Looks a variable up in this process's environment: the lookup `main` and reloads
/// hand to [`Config::load`], so this module stays the only reader of the environment.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Characters allowed in public names, prefixes and the separator.
pub fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

fn duration(cx: &mut Ctx, v: Option<&Spanned<String>>, key: &str, default: Duration) -> Duration {
    match v {
        None => default,
        Some(s) => match parse_duration(s.get_ref()) {
            Some(d) => d,
            None => {
                cx.at(
                    s.span().start,
                    format!(
                        "{key}: {:?} is not a duration like \"30s\", \"500ms\" or \"2m\"",
                        s.get_ref()
                    ),
                );
                default
            }
        },
    }
}

/// Parses `"500ms"`, `"30s"`, `"2m"`, `"1h"`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs > 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs))
}

/// Parses `"1048576"`, `"512KiB"`, `"16MiB"`, `"1GiB"` (also KB/MB/GB as powers of 1000).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: usize = n.parse().ok()?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult).filter(|&v| v > 0)
}

/// Expands `${VAR}` and `${VAR:-default}`; `$$` is a literal `$`. Returns the name of
/// the first unset variable that has no default.
pub fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                out.push('$');
                rest = after;
                continue;
            };
            let inner = &body[..end];
            let (var, default) = match inner.split_once(":-") {
                Some((v, d)) => (v, Some(d)),
                None => (inner, None),
            };
            match (env(var).filter(|v| !v.is_empty() || default.is_none()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => return Err(var.to_string()),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands() {
        assert_eq!(expand("a${SET}b", &env).unwrap(), "avalueb");
        assert_eq!(expand("${NOPE:-fast}", &env).unwrap(), "fast");
        assert_eq!(expand("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(expand("$$x $y", &env).unwrap(), "$x $y");
        assert_eq!(expand("${NOPE}", &env).unwrap_err(), "NOPE");
    }

    #[test]
    fn globs() {
        assert!(glob("*", "anything"));
        assert!(glob("delete_*", "delete_all"));
        assert!(!glob("delete_*", "create"));
        assert!(glob("a?c", "abc"));
        let f = Filter {
            allow: vec!["*".into()],
            deny: vec!["delete_*".into()],
        };
        assert!(f.permits("create") && !f.permits("delete_x"));
    }

    #[test]
    fn max_sessions_per_client_defaults_to_a_tenth_and_is_located_when_zero() {
        let at = |src: &str| Config::parse(Path::new("g.toml"), src, &env);
        let per = |src: &str| at(src).map(|c| c.gateway.max_sessions_per_client).ok();
        assert_eq!(per(""), Some(1_000));
        assert_eq!(per("[gateway]\nmax_sessions = 25\n"), Some(2));
        assert_eq!(per("[gateway]\nmax_sessions = 5\n"), Some(1));
        assert_eq!(
            per("[gateway]\nmax_sessions = 5\nmax_sessions_per_client = 5\n"),
            Some(5)
        );
        let errors = at("[gateway]\nmax_sessions_per_client = 0\n")
            .err()
            .map(|e| e.to_string());
        let errors = errors.unwrap_or_default();
        assert!(
            errors.contains("g.toml:2:27") && errors.contains("at least 1"),
            "{errors}"
        );
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_size("16MiB"), Some(16 << 20));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn telemetry_table_and_otel_env() {
        let none = |_: &str| None;
        let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.service_name, "mcp-gateway");

        let src =
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"\nlog_format = \"json\"\nrecord_payloads = true\n";
        let c = Config::parse(Path::new("g.toml"), src, &none).unwrap();
        let t = &c.telemetry;
        assert_eq!(t.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
        assert_eq!((t.log_format, t.record_payloads), (LogFormat::Json, true));

        let otel = |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4317".to_owned()),
            "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".to_owned()),
            "OTEL_SERVICE_NAME" => Some("svc".to_owned()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("100".to_owned()),
            _ => None,
        };
        let t = Config::parse(Path::new("g.toml"), "", &otel).unwrap().telemetry;
        assert_eq!(t.otlp_endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!(t.otlp_protocol, OtlpProtocol::Grpc);
        assert_eq!(t.service_name, "svc");
        assert_eq!(t.batch_delay, Some(Duration::from_millis(100)));

        let src = "[telemetry]\notlp_protocol = \"http/json\"\nlog_format = \"xml\"\nsampling = 1\n";
        let e = Config::parse(Path::new("g.toml"), src, &none).unwrap_err();
        assert_eq!((e.0[0].line, e.0[0].column), (4, 1), "{e}");
        assert!(e.to_string().contains("sampling"), "{e}");
        let src =
            "[telemetry]\notlp_protocol = \"http/json\"\nlog_format = \"xml\"\notlp_endpoint = \"localhost:4318\"\n";
        let e = Config::parse(Path::new("g.toml"), src, &none).unwrap_err();
        let lines: Vec<_> = e.0.iter().map(|e| (e.line, e.column)).collect();
        assert_eq!(lines, [(2, 17), (4, 17), (3, 14)], "{e}");
        assert!(e.to_string().contains("telemetry.otlp_protocol: \"http/json\""), "{e}");
    }

    #[test]
    fn clients_and_oauth() {
        let none = |_: &str| None;
        let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
        assert!(!c.auth.required());

        let env = |k: &str| (k == "ALICE_TOKEN").then(|| "s3cret-alice".to_owned());
        let digest = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"; // "secret"
        let src = format!(
            "[clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\nallow = [\"calc__*\"]\nrate_limit = \"5/s\"\n\n\
             [clients.bob]\ntoken_sha256 = \"{}\"\ndeny = [\"calc__delete*\"]\n\n[clients.carol]\n\n\
             [auth.oauth]\nissuer = \"https://issuer.example\"\naudience = \"mcp-gateway\"\n\
             jwks_url = \"https://issuer.example/jwks.json\"\n",
            digest.to_uppercase()
        );
        let c = Config::parse(Path::new("g.toml"), &src, &env).unwrap();
        assert!(c.auth.required());
        let names: Vec<_> = c.auth.clients.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["alice", "bob", "carol"]);
        let alice = c.auth.client("alice").unwrap();
        assert_eq!(alice.token, Some(TokenDigest::of("s3cret-alice")));
        assert_eq!(alice.rate_limit, Rate::parse("5/s"));
        assert!(alice.filter.permits("calc__add") && !alice.filter.permits("docs__x"));
        assert_eq!(c.auth.client("bob").unwrap().token, Some(TokenDigest::of("secret")));
        assert!(c.auth.client("carol").unwrap().token.is_none());
        assert!(c.auth.client("carol").unwrap().unrestricted());
        let o = c.auth.oauth.as_ref().unwrap();
        assert_eq!((o.client_claim.as_str(), o.resource.as_deref()), ("sub", None));
        // Neither the token nor its digest shows.
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("2bb80d") && !shown.contains("2BB80D"));

        let bad = "[clients.a]\ntoken = \"${NOPE}\"\n\n[clients.b]\ntoken_sha256 = \"abc\"\n\n\
                   [clients.c]\ntoken = \"x\"\ntoken_sha256 = \"y\"\n\n[clients.d]\ntoken = \"same\"\n\n\
                   [clients.e]\ntoken = \"same\"\nrate_limit = \"fast\"\n\n\
                   [auth.oauth]\nissuer = \"i\"\naudience = \"\"\njwks_url = \"ftp://x\"\n";
        let e = Config::parse(Path::new("g.toml"), bad, &none).unwrap_err();
        let text = e.to_string();
        for want in [
            "g.toml:2:9: clients.a.token: environment variable NOPE is not set",
            "g.toml:5:16: clients.b.token_sha256 is not 64 hex digits",
            "g.toml:9:16: clients.c: give either `token` or `token_sha256`, not both",
            "g.toml:15:9: clients.e.token: client \"d\" has the same token",
            "g.toml:16:14: clients.e.rate_limit: \"fast\" is not a rate",
            "g.toml:20:12: auth.oauth.audience is empty",
            "g.toml:21:12: auth.oauth.jwks_url must start with http:// or https://",
        ] {
            assert!(text.contains(want), "{want}\nnot in\n{text}");
        }
        assert!(!text.contains("same\""), "{text}");

        let e = Config::parse(Path::new("g.toml"), "[clients.a]\ntokn = \"x\"\n", &none).unwrap_err();
        assert!(e.to_string().contains("tokn"), "{e}");
        let e = Config::parse(Path::new("g.toml"), "[auth.oauth]\nissuer = \"x\"\n", &none).unwrap_err();
        assert!(e.to_string().contains("audience"), "{e}");
    }

    #[test]
    fn every_table_is_checked_on_its_own_and_each_bad_key_once() {
        let src = "servers.i = { command = 5, enabled = \"no\" }\n\n[servers.j]\ncomand = \"x\"\n\
                   tools = { allow = \"echo\", nope = [] }\n\n[auth.oauth]\nissuer = 5\naudience = \"a\"\n\
                   jwks_url = \"https://x\"\n\n[gatway]\n";
        let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err();
        let got: Vec<_> = e.0.iter().map(|e| (e.line, e.column, e.message.as_str())).collect();
        let starts = |m: &str, s: &str| m.starts_with(s);
        let want: &[(usize, usize, &str)] = &[
            (1, 25, "servers.i.command: expected a string like \"npx\""),
            (1, 38, "servers.i.enabled: expected a boolean"),
            (4, 1, "servers.j: unknown key \"comand\"; expected one of command, url,"),
            (5, 19, "servers.j.tools.allow: expected a list of globs like"),
            (
                5,
                27,
                "servers.j.tools: unknown key \"nope\"; expected one of allow, deny",
            ),
            (8, 10, "auth.oauth.issuer: expected a URL string like"),
            (12, 2, "the top level: unknown key \"gatway\""),
            // Its command was reported as the wrong type: no "needs `command`" for i.
            (3, 10, "servers.j: needs `command` (a stdio server) or `url`"),
        ];
        assert_eq!(got.len(), want.len(), "{e}");
        for ((l, c, m), (wl, wc, wm)) in got.iter().zip(want) {
            assert!(
                (l, c) == (wl, wc) && starts(m, wm),
                "{l}:{c}: {m}\nwanted {wl}:{wc}: {wm}\nall:\n{e}"
            );
        }
        // A missing required key is named.
        let e = Config::parse(Path::new("g.toml"), "[auth.oauth]\nissuer = \"i\"\n", &env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "g.toml:1:1: auth.oauth: missing required key \"audience\" (a string like audience = \"mcp-gateway\")"
        );
    }

    #[test]
    fn errors_are_located_and_secret_free() {
        let src = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[servers.a]\ncommand = \"x\"\nenv = { K = \"${MISSING}\", S = \"${SET}\" }\n";
        let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert_eq!((e.0[0].line, e.0[0].column), (6, 13));
        assert!(e.0[0].message.contains("servers.a.env.K") && e.0[0].message.contains("MISSING"));
        assert!(!e.to_string().contains("value"));

        let e = Config::parse(Path::new("g.toml"), "[gateway]\nlisten = \"x\"\nbogus = 1\n", &env).unwrap_err();
        assert_eq!(e.0[0].line, 3, "{e}");
        assert!(e.to_string().contains("bogus"), "{e}");

        let ok = Config::parse(
            Path::new("g.toml"),
            "[servers.b]\ncommand = \"x\"\nenv = { S = \"${SET}\" }\n",
            &env,
        )
        .unwrap();
        assert!(!format!("{ok:?}").contains("value"));
        assert_eq!(ok.servers[0].prefix, "b");
    }
}
