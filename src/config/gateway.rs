//! `[gateway]`: the public endpoint, its bounds and timeouts, and the defaults for every
//! server.

use super::errors::Ctx;
use super::values::{duration, duration_or_zero, name_char, size};
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;
use toml::Spanned;

/// `gateway.listen` unset: loopback only.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));
/// `gateway.path` unset: where the MCP endpoint is served.
pub const DEFAULT_PATH: &str = "/mcp";
/// `gateway.separator` unset: what goes between a server's prefix and its tool's name.
pub const DEFAULT_SEPARATOR: &str = "__";
/// `gateway.request_timeout` unset: the per-request timeout of every server that sets none.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// `gateway.session_idle` unset: how long an unused HTTP session lives.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// How long a call parked on a question waits for the client's retry (`gateway.input_timeout`).
pub const DEFAULT_INPUT_TIMEOUT: Duration = Duration::from_secs(300);
/// `gateway.header_timeout` unset: how long a client may take to send its headers.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// `gateway.keep_alive_timeout` unset: how long a client connection may sit idle between
/// two requests. Longer than the idle timeout of the balancers in front (60 s for an AWS
/// ALB and for nginx's upstream `keepalive_timeout`), so that they, not the gateway, close
/// an idle connection: one the gateway closes just as a balancer sends on it fails that
/// request (a 502).
pub const DEFAULT_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(75);
/// `gateway.body_timeout` unset: how long a client may take to send a request body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// `gateway.shutdown_grace` unset: how long in-flight requests get after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// `gateway.drain_delay` unset: after SIGTERM, how long `/readyz` says 503 while the
/// gateway still serves, so a load balancer stops sending before it stops accepting.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(5);
/// `gateway.busy_poll` unset: how long the runtime polls for I/O before it sleeps (see
/// `crate::runtime`; Seastar's idle poll is 200 µs too).
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(200);
/// The longest `gateway.busy_poll`: past a few hundred µs a wait is not a wake-up's cost.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(10);
/// `gateway.max_body` unset: the largest request body accepted (16 MiB).
pub const DEFAULT_MAX_BODY: usize = 16 << 20;
/// `gateway.max_line` unset: the longest message line accepted (256 MiB).
pub const DEFAULT_MAX_LINE: usize = 256 << 20;
/// `gateway.max_sessions` unset: open HTTP sessions at most.
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;
/// `gateway.max_sessions_per_client` unset: `max_sessions` divided by this, at least 1.
pub const SESSIONS_PER_CLIENT_DIVISOR: usize = 10;
/// `gateway.max_in_flight` unset: requests in flight per session at most.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1_000;
/// `gateway.max_connections_per_address` unset: client connections one address (an IPv6
/// /64) may hold open at once. Twice what a client bursting a thousand calls at once over
/// HTTP/1.1 opens (a connection per call in flight), and room for a team of hundreds
/// behind one NAT address, each with a few clients holding a POST and a GET stream; yet
/// one address takes at most an eighth of the 16,384 connection slots.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 2048;
/// `gateway.page_size` unset: 0, each merged list served as one page.
pub const DEFAULT_PAGE_SIZE: usize = 0;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGateway {
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
    drain_delay: Option<Spanned<String>>,
    max_sessions: Option<Spanned<usize>>,
    max_sessions_per_client: Option<Spanned<usize>>,
    page_size: Option<usize>,
    max_in_flight: Option<Spanned<usize>>,
    max_connections_per_address: Option<Spanned<usize>>,
    session_idle: Option<Spanned<String>>,
    input_timeout: Option<Spanned<String>>,
    header_timeout: Option<Spanned<String>>,
    keep_alive_timeout: Option<Spanned<String>>,
    body_timeout: Option<Spanned<String>>,
    max_line: Option<Spanned<String>>,
    worker_threads: Option<Spanned<usize>>,
    busy_poll: Option<Spanned<String>>,
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    search: Option<bool>,
    search_model: Option<Spanned<String>>,
    console: Option<bool>,
    public_url: Option<Spanned<String>>,
    state_dir: Option<Spanned<String>>,
    token_key: Option<Spanned<String>>,
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
    /// After SIGTERM: how long `/readyz` answers 503 while requests are still served,
    /// before the listener closes and `shutdown_grace` begins.
    pub drain_delay: Duration,
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
    /// Client connections open at once from one address at most (an IPv6 address's /64),
    /// so one address cannot take every connection slot; past it a new connection is
    /// answered 503 and closed, taking no slot. A peer in `trusted_proxies` is not counted.
    pub max_connections_per_address: usize,
    /// A session unused this long (and with no open GET stream) is ended.
    pub session_idle: Duration,
    /// How long a 2026-07-28 call whose server asked a question (`input_required`) waits
    /// for the client's retry before it is cancelled; also its `requestState`'s lifetime.
    pub input_timeout: Duration,
    /// How long a client may take to send its request headers: a new connection its
    /// first request's, a kept-alive one a request's from its first byte.
    pub header_timeout: Duration,
    /// How long a client connection may sit idle between two requests (read at start).
    pub keep_alive_timeout: Duration,
    /// How long a client may take to send a request body.
    pub body_timeout: Duration,
    /// Longest message line a child may write (or a stdio client send); longer ones fail
    /// the call they answer with an error naming the server.
    pub max_line: usize,
    /// Async runtime worker threads; `None`: half the CPUs, at least one (or
    /// `TOKIO_WORKER_THREADS`). Read at start only.
    pub worker_threads: Option<usize>,
    /// How long the runtime polls for I/O before it sleeps, while its recent waits were
    /// that short (`crate::runtime`); zero: never. Read at start only.
    pub busy_poll: Duration,
    /// Whether the file sets `busy_poll`: unset, a CPU quota turns it off
    /// (`crate::runtime::cpu_quota`).
    pub busy_poll_set: bool,
    /// The operator's console at `/` and `/status*` (default on; admins only with auth,
    /// loopback peers only without).
    pub console: bool,
    /// Tool search mode on `path` and over stdio: `tools/list` shows only
    /// `gateway__search_tools` and `gateway__call_tool` (every tool stays callable by name).
    /// Default: off.
    pub search: bool,
    /// A sentence-embedding model's folder (a BERT model as sentence-transformers saves it:
    /// docs/configuration.md, "Tool search"), relative to the config file's folder. With one,
    /// search ranks by the request's meaning as well as its words. Default: none.
    pub search_model: Option<std::path::PathBuf>,
    /// Balancers whose `X-Forwarded-For` is believed (addresses or CIDR blocks). A request
    /// from one of them counts as from the address it names, for `per_ip` and for the
    /// sessions' shares; from anyone else the header is ignored.
    pub trusted_proxies: Vec<Cidr>,
    /// Where browsers reach the gateway (`https://gw.example.com`), for the OAuth consent
    /// links and the `redirect_uri`. `None`: `http://` and the address the gateway listens
    /// on, which a loopback listener only may use.
    pub public_url: Option<String>,
    /// Where the gateway keeps its state of its own (the token store, its key).
    pub state_dir: std::path::PathBuf,
    /// Seals the token store in single mode; `None`: a random key kept in
    /// `{state_dir}/token.key` (0600). In cluster mode the cluster key is used.
    pub token_key: Option<super::Secret>,
}

/// `state_dir` unset: `$XDG_STATE_HOME/mcp-gateway`, else `$HOME/.local/state/mcp-gateway`.
pub fn default_state_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<std::path::PathBuf> {
    let xdg = env("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let home = || {
        env("HOME")
            .filter(|v| !v.is_empty())
            .map(|h| std::path::Path::new(&h).join(".local/state"))
    };
    xdg.or_else(home).map(|d| d.join("mcp-gateway"))
}

/// An address block, `10.0.0.0/8` or one address (`/32`, `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.parse::<std::net::IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
            None => (s.parse::<std::net::IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr::{V4, V6};
        let ip = match ip {
            V6(v6) => v6.to_ipv4_mapped().map_or(V6(v6), V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (V4(net), V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (V6(net), V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// `[gateway]`, each key checked and each problem reported; defaults stand in for what
/// is unset (and for what is wrong, the file being refused anyway).
pub(super) fn parse(
    cx: &mut Ctx,
    g: RawGateway,
    base: &std::path::Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Gateway {
    let listen = match &g.listen {
        None => DEFAULT_LISTEN,
        Some(s) => s.get_ref().parse::<SocketAddr>().unwrap_or_else(|_| {
            cx.at(
                s.span().start,
                format!("listen: {:?} is not an address like \"127.0.0.1:8080\"", s.get_ref()),
            );
            DEFAULT_LISTEN
        }),
    };
    let path = g
        .path
        .as_ref()
        .map_or(DEFAULT_PATH.to_string(), |p| p.get_ref().clone());
    let at = g.path.as_ref().map_or(0, |p| p.span().start);
    if !path.starts_with('/') {
        cx.at(at, format!("path: {path:?} must start with '/'"));
    } else if let Some(why) = path_refused(&path) {
        cx.at(
            at,
            format!("path: {path:?} {why}; choose another, such as {DEFAULT_PATH}"),
        );
    }
    let separator = g
        .separator
        .as_ref()
        .map_or(DEFAULT_SEPARATOR.to_string(), |s| s.get_ref().clone());
    if separator.is_empty() || !separator.chars().all(name_char) {
        let at = g.separator.as_ref().map_or(0, |s| s.span().start);
        cx.at(
            at,
            format!("separator: {separator:?} may only use [A-Za-z0-9_.-] and must not be empty"),
        );
    }
    let request_timeout = duration(
        cx,
        g.request_timeout.as_ref(),
        "request_timeout",
        DEFAULT_REQUEST_TIMEOUT,
    );
    let session_idle = duration(cx, g.session_idle.as_ref(), "session_idle", DEFAULT_SESSION_IDLE);
    let input_timeout = duration(cx, g.input_timeout.as_ref(), "input_timeout", DEFAULT_INPUT_TIMEOUT);
    let header_timeout = duration(cx, g.header_timeout.as_ref(), "header_timeout", DEFAULT_HEADER_TIMEOUT);
    let keep_alive_timeout = duration(
        cx,
        g.keep_alive_timeout.as_ref(),
        "keep_alive_timeout",
        DEFAULT_KEEP_ALIVE_TIMEOUT,
    );
    let body_timeout = duration(cx, g.body_timeout.as_ref(), "body_timeout", DEFAULT_BODY_TIMEOUT);
    let max_line = size(cx, g.max_line.as_ref(), "max_line", "64MiB", DEFAULT_MAX_LINE);
    let busy_poll = duration_or_zero(cx, g.busy_poll.as_ref(), "busy_poll", DEFAULT_BUSY_POLL);
    if let Some(v) = g.busy_poll.as_ref().filter(|_| busy_poll > MAX_BUSY_POLL) {
        cx.at(
            v.span().start,
            format!(
                "gateway.busy_poll: {:?} is more than the most allowed, \"10ms\"",
                v.get_ref()
            ),
        );
    }
    for (key, v) in [
        ("max_sessions", &g.max_sessions),
        ("max_in_flight", &g.max_in_flight),
        ("worker_threads", &g.worker_threads),
        ("max_sessions_per_client", &g.max_sessions_per_client),
        ("max_connections_per_address", &g.max_connections_per_address),
    ] {
        if let Some(n) = v.as_ref().filter(|n| *n.get_ref() == 0) {
            cx.at(n.span().start, format!("gateway.{key} must be at least 1"));
        }
    }
    let shutdown_grace = duration(cx, g.shutdown_grace.as_ref(), "shutdown_grace", DEFAULT_SHUTDOWN_GRACE);
    let drain_delay = duration_or_zero(cx, g.drain_delay.as_ref(), "drain_delay", DEFAULT_DRAIN_DELAY);
    let max_body = size(cx, g.max_body.as_ref(), "max_body", "16MiB", DEFAULT_MAX_BODY);
    let max_sessions = g.max_sessions.map_or(DEFAULT_MAX_SESSIONS, Spanned::into_inner);
    let public_url = g.public_url.as_ref().and_then(|u| {
        let v = u.get_ref().trim_end_matches('/');
        let ok = (v.starts_with("https://") || v.starts_with("http://"))
            && !v.contains(['?', '#'])
            && !v.bytes().any(|b| b.is_ascii_control() || b == b' ');
        if !ok {
            cx.at(
                u.span().start,
                format!(
                    "public_url: {:?} must be an http:// or https:// URL without a query",
                    u.get_ref()
                ),
            );
        }
        ok.then(|| v.to_owned())
    });
    let state_dir = match &g.state_dir {
        Some(d) => base.join(d.get_ref()),
        None => default_state_dir(env).unwrap_or_else(|| base.join(".mcp-gateway")),
    };
    let token_key = g
        .token_key
        .as_ref()
        .and_then(|k| match super::expand(k.get_ref(), env) {
            Ok(v) if v.len() >= 32 => Some(super::Secret::new(v)),
            Ok(_) => {
                cx.at(k.span().start, "token_key must be at least 32 characters".into());
                None
            }
            Err(var) => {
                cx.at(
                    k.span().start,
                    format!("token_key: environment variable {var} is not set"),
                );
                None
            }
        });
    Gateway {
        public_url,
        state_dir,
        token_key,
        listen,
        path,
        separator,
        request_timeout,
        allowed_origins: g.allowed_origins,
        allowed_hosts: g.allowed_hosts,
        max_body,
        shutdown_grace,
        drain_delay,
        max_sessions,
        max_sessions_per_client: g
            .max_sessions_per_client
            .map_or((max_sessions / SESSIONS_PER_CLIENT_DIVISOR).max(1), Spanned::into_inner),
        page_size: g.page_size.unwrap_or(DEFAULT_PAGE_SIZE),
        max_in_flight: g.max_in_flight.map_or(DEFAULT_MAX_IN_FLIGHT, Spanned::into_inner),
        max_connections_per_address: g
            .max_connections_per_address
            .map_or(DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, Spanned::into_inner),
        session_idle,
        input_timeout,
        header_timeout,
        keep_alive_timeout,
        body_timeout,
        max_line,
        worker_threads: g.worker_threads.map(Spanned::into_inner),
        busy_poll,
        busy_poll_set: g.busy_poll.is_some(),
        console: g.console.unwrap_or(true),
        search: g.search.unwrap_or(false),
        search_model: g.search_model.as_ref().map(|m| base.join(m.get_ref())),
        trusted_proxies: g
            .trusted_proxies
            .iter()
            .filter_map(|p| {
                let c = Cidr::parse(p.get_ref().trim());
                if c.is_none() {
                    cx.at(
                        p.span().start,
                        format!(
                            "trusted_proxies: {:?} is not an address or CIDR block like \"10.0.0.0/8\"",
                            p.get_ref()
                        ),
                    );
                }
                c
            })
            .collect(),
    }
}

/// Why the endpoint may not be served at `path` (which starts with `/`), if it may not:
/// the gateway's own pages are there, or it has characters its router reads as patterns.
fn path_refused(path: &str) -> Option<String> {
    if let Some(c) = path.chars().find(|c| matches!(c, '{' | '}' | '*' | '?' | '#' | '%')) {
        return Some(format!("has {c:?}, which a path of the endpoint may not have"));
    }
    if path.contains("//") {
        return Some("has an empty segment".into());
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Some("is the console's page".into());
    }
    const OWN: [&str; 8] = [
        "/healthz",
        "/readyz",
        "/status",
        "/metrics",
        "/console.js",
        "/console.css",
        "/oauth",
        "/.well-known",
    ];
    OWN.iter()
        .find(|o| trimmed == **o || trimmed.starts_with(&format!("{o}/")))
        .map(|o| format!("is the gateway's own {o}"))
}

#[cfg(test)]
mod cidr_tests {
    use super::Cidr;

    #[test]
    fn blocks_contain_their_addresses_only() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains("10.1.200.3".parse().unwrap()));
        assert!(!net.contains("10.2.0.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.0.9".parse().unwrap()), "v4-mapped v6");
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()) && !one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8").unwrap().contains("fd12::1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
    }
}
