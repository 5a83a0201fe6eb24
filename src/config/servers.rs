//! `[servers.NAME]`: how to reach each server (a child on stdio, or a remote URL), its
//! environment and credentials, tool filter, limits, restarts and isolation.

use super::errors::Ctx;
use super::gateway::Gateway;
use super::rate_limits::{self, RateLimits, RawServerLimits};
use super::upstream_auth::{self, RawUpstreamAuth, UpstreamAuth};
use super::values::{duration, name_char, one_of, Filter};
use super::{expand, expand_template, Secret, Template};
use indexmap::IndexMap;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// Environment variables a child inherits from the gateway; everything else it gets
/// comes from its own `env` table, so one server's secrets never reach another.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "USER", "LANG", "TERM", "TMPDIR", "SHELL"];
/// `idle_timeout` unset: how long a session's own process may sit unused.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// `max_sessions` unset: a server's per-session processes at most.
pub const DEFAULT_SERVER_MAX_SESSIONS: usize = 100;
/// `stall_timeout` unset: this many times the server's `timeout`.
pub const STALL_TIMEOUTS: u32 = 2;
/// `isolation` unset: one process for every client.
pub const DEFAULT_ISOLATION: Isolation = Isolation::Shared;
/// `restart` unset: after a crash, not after a clean exit.
pub const DEFAULT_RESTART: Restart = Restart::OnFailure;
/// `protocol` unset: probe for 2026-07-28, fall back to the handshake.
pub const DEFAULT_PROTOCOL: Era = Era::Auto;
/// `transport` unset (a remote server): Streamable HTTP, falling back to HTTP+SSE.
pub const DEFAULT_TRANSPORT: HttpMode = HttpMode::Auto;
/// `max_connections` unset (a remote server): calls in flight to it at once, each on its
/// own connection over HTTP/1.1; more wait for one to end.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// `max_calls_per_client` unset (a stdio server): one client's calls in flight to one of
/// its processes at once; more are refused. As many as a remote server's
/// `max_connections` lets in at once, far above what a person's agent runs at once (a
/// few parallel calls) and above the bursts of a hundred or two that scripts send, low
/// enough that one client cannot queue a million calls in a child that every other
/// client waits behind.
pub const DEFAULT_MAX_CALLS_PER_CLIENT: usize = 256;
/// `enabled` unset: the server runs.
pub const DEFAULT_ENABLED: bool = true;

/// One `[servers.NAME]` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    command: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    transport: Option<Spanned<String>>,
    #[serde(default)]
    headers: IndexMap<String, Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    max_connections: Option<Spanned<usize>>,
    max_calls_per_client: Option<Spanned<usize>>,
    /// `auth = { token_exchange = {..} }` or `{ oauth = {..} }` (remote servers only).
    auth: Option<Spanned<RawUpstreamAuth>>,
    #[serde(default)]
    args: Vec<Spanned<String>>,
    cwd: Option<String>,
    #[serde(default)]
    env: IndexMap<String, Spanned<String>>,
    prefix: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    #[serde(default = "default_enabled")]
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
    /// `[servers.NAME.overrides.TOOL]`, by the server's own tool name.
    #[serde(default)]
    overrides: IndexMap<String, RawOverride>,
    /// Labels that `[profiles.*] tags` and `?tags=` choose servers by.
    #[serde(default)]
    tags: Vec<Spanned<String>>,
    /// `catalog_secrets = { NAME = "${VAR}" }`: what `${client:NAME}` is in the server's
    /// own (catalog) process or connection, which serves no caller.
    #[serde(default)]
    catalog_secrets: IndexMap<String, Spanned<String>>,
    /// `command` or `url` was there but of the wrong type (already reported): whether it
    /// is a stdio or a remote server is unknown, so the checks that depend on it are skipped.
    #[serde(skip)]
    kind_unknown: bool,
}

/// One `[servers.NAME.overrides.TOOL]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    name: Option<Spanned<String>>,
    description: Option<String>,
    title: Option<String>,
    annotations: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What the operator puts in place of a tool's own: its name (the public name is made
/// from it, calls still go to the original), description, title, and annotations
/// (merged over the tool's own, key by key).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Override {
    pub name: Option<String>,
    pub description: Option<String>,
    pub title: Option<String>,
    pub annotations: Option<serde_json::Map<String, serde_json::Value>>,
}

impl RawServer {
    /// Notes the keys [`table`](super::tables::table) dropped for a wrong value: without
    /// its `command` or `url`, what kind of server it is stays unknown.
    pub(super) fn removed(&mut self, removed: &[String]) {
        self.kind_unknown = removed.iter().any(|k| k == "command" || k == "url");
    }

    /// Its tags as written, for the profiles' checks.
    pub(super) fn tag_names(&self) -> Vec<String> {
        self.tags.iter().map(|t| t.get_ref().clone()).collect()
    }
}

fn default_enabled() -> bool {
    DEFAULT_ENABLED
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFilter {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
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
    /// Tool overrides, by the server's own tool name.
    pub overrides: IndexMap<String, Override>,
    /// Labels that `[profiles.*] tags` and `?tags=` choose servers by (`[A-Za-z0-9_.-]+`).
    pub tags: Vec<String>,
    /// `catalog_secrets`: the values of `${client:NAME}` in the server's own process (or
    /// connection), which only lists what it offers; a reference without one is left out.
    pub catalog_secrets: Vec<(String, Secret)>,
}

/// The protocol era spoken to a server: `auto` probes with `server/discover` (2026-07-28)
/// and falls back to the `initialize` handshake by the spec's rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Era {
    Auto,
    /// 2026-07-28 only: no `initialize`.
    Stateless,
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
    /// One per client identity (its `[clients.*]` name, or its OAuth subject), shared by
    /// that client's sessions and stateless requests: started on first use, stopped after
    /// `idle_timeout`. Callers without an identity cannot use it.
    Client,
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
    /// The URL as written in gateway.toml (before `${VAR}` expansion), with a password
    /// or a credential's query value written in it literally shown as `****`
    /// ([`shown_url`]): safe to show.
    pub url_display: String,
    /// The expanded URL; may carry a credential in its query.
    pub url: Secret,
    pub mode: HttpMode,
    /// Extra request headers, expanded; they are secrets.
    pub headers: Vec<(String, Secret)>,
    /// The headers that use `${client:NAME}`, filled per caller (see [`HttpSpec::for_client`]).
    pub client_headers: Vec<(String, Template)>,
    /// A PEM file of extra CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// Calls in flight at once on one connection object (the server's, or one caller's
    /// with per-caller credentials): over HTTP/1.1 each holds a connection of its own, so
    /// this bounds them; more wait. Answers to the server's own questions and
    /// notifications do not wait (a call may be waiting for them).
    pub max_connections: usize,
    /// `gateway.max_line`: the longest message (a JSON answer, an SSE event or line)
    /// accepted from the server.
    pub max_message: usize,
    /// `auth`: a credential got per caller (token exchange, or the user's own OAuth).
    pub auth: Option<UpstreamAuth>,
}

/// A child process speaking MCP on its stdin/stdout.
#[derive(Debug, Clone, PartialEq)]
pub struct StdioSpec {
    pub command: String,
    /// The arguments, `${VAR}` expanded: a value from the environment may be a
    /// credential (a database URL), so none is shown (`Debug` prints `****`); the
    /// variables' values are masked in the child's stderr too (in `masked`).
    pub args: Vec<Secret>,
    /// Absolute working directory.
    pub cwd: PathBuf,
    /// The child's own variables, expanded; they are secrets.
    pub env: Vec<(String, Secret)>,
    /// The variables that use `${client:NAME}`, filled per caller (see
    /// [`StdioSpec::for_client`]); the server's catalog process runs without them (or
    /// with its `catalog_secrets`).
    pub client_env: Vec<(String, Template)>,
    /// Values masked in the child's stderr like `env` values, also where it prints only
    /// part of a value: what `args`' variables gave, and the caller's secrets as they are
    /// (filled in by [`StdioSpec::for_client`]).
    pub masked: Vec<Secret>,
    /// The inherited safe set ([`INHERITED_ENV`]) as read when the config loaded.
    pub inherited: Vec<(String, String)>,
    /// `gateway.max_line`: the longest stdout line accepted from the child.
    pub max_line: usize,
    /// `max_calls_per_client`: one client's calls in flight to one process at most.
    pub max_calls_per_client: usize,
}

/// Every `[servers.NAME]`, in file order; a server with a problem is reported and left
/// out. `base` is the config file's folder; `gateway` gives the defaults servers share;
/// `inbound_jwt`: `[auth.oauth]` is configured (what `auth.token_exchange` trades).
pub(super) fn parse(
    cx: &mut Ctx,
    raw: IndexMap<Spanned<String>, RawServer>,
    gateway: &Gateway,
    base: &Path,
    inbound_jwt: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Server> {
    let inherited: Vec<(String, String)> = INHERITED_ENV
        .iter()
        .filter_map(|k| env(k).map(|v| ((*k).to_string(), v)))
        .collect();
    let mut servers = Vec::new();
    let mut prefixes: IndexMap<String, String> = IndexMap::new();
    for (name, s) in raw {
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
            cx,
            s.timeout.as_ref(),
            &format!("servers.{name}.timeout"),
            gateway.request_timeout,
        );
        let rate_limits = rate_limits::parse_server(cx, &s.rate_limits, &name);
        let isolation = one_of(
            cx,
            s.isolation.as_ref(),
            &format!("servers.{name}.isolation"),
            DEFAULT_ISOLATION,
            &[
                ("shared", Isolation::Shared),
                ("session", Isolation::Session),
                ("client", Isolation::Client),
            ],
        );
        let idle_timeout = duration(
            cx,
            s.idle_timeout.as_ref(),
            &format!("servers.{name}.idle_timeout"),
            DEFAULT_IDLE_TIMEOUT,
        );
        let stall_timeout = duration(
            cx,
            s.stall_timeout.as_ref(),
            &format!("servers.{name}.stall_timeout"),
            timeout.saturating_mul(STALL_TIMEOUTS),
        );
        let protocol = one_of(
            cx,
            s.protocol.as_ref(),
            &format!("servers.{name}.protocol"),
            DEFAULT_PROTOCOL,
            &[
                ("auto", Era::Auto),
                ("2026-07-28", Era::Stateless),
                ("handshake", Era::Handshake),
            ],
        );
        if s.max_sessions == Some(0) {
            // 0 would refuse every session's process: say so rather than run with 1.
            cx.at(at, format!("servers.{name}.max_sessions must be at least 1"));
        }
        let restart = one_of(
            cx,
            s.restart.as_ref(),
            &format!("servers.{name}.restart"),
            DEFAULT_RESTART,
            &[
                ("on-failure", Restart::OnFailure),
                ("always", Restart::Always),
                ("never", Restart::Never),
            ],
        );
        let overrides = parse_overrides(cx, &name, &s.overrides);
        let mut catalog_secrets = Vec::new();
        for (key, value) in &s.catalog_secrets {
            // Each must be one the server's env or headers use (checked once they are read).
            match expand(value.get_ref(), env) {
                Ok(v) if v.is_empty() => cx.at(
                    value.span().start,
                    format!("servers.{name}.catalog_secrets.{key} is empty"),
                ),
                Ok(v) => catalog_secrets.push((key.clone(), Secret(v))),
                Err(var) => cx.at(
                    value.span().start,
                    format!("servers.{name}.catalog_secrets.{key}: environment variable {var} is not set"),
                ),
            }
        }
        let mut tags: Vec<String> = Vec::new();
        for t in &s.tags {
            let tag = t.get_ref();
            if tag.is_empty() || !tag.chars().all(name_char) {
                cx.at(
                    t.span().start,
                    format!("servers.{name}.tags: {tag:?} may only use [A-Za-z0-9_.-] and must not be empty"),
                );
            } else if !tags.contains(tag) {
                tags.push(tag.clone());
            }
        }
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
            rate_limits: rate_limits.clone(),
            restart,
            isolation,
            idle_timeout,
            max_sessions: s.max_sessions.unwrap_or(DEFAULT_SERVER_MAX_SESSIONS),
            protocol,
            overrides: overrides.clone(),
            tags: tags.clone(),
            catalog_secrets: catalog_secrets.clone(),
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
                    ("max_calls_per_client", s.max_calls_per_client.is_some()),
                ] {
                    if v {
                        cx.at(
                            at,
                            format!("servers.{name}.{key} only applies to stdio servers (with `command`)"),
                        );
                    }
                }
                let errors = cx.errors.len();
                let auth = s.auth.map(|a| {
                    let at = a.span().start;
                    (at, upstream_auth::parse(cx, &name, a, env))
                });
                if let Some((at, Some(UpstreamAuth::TokenExchange(_)))) = &auth {
                    if !inbound_jwt {
                        cx.at(
                            *at,
                            format!("servers.{name}.auth.token_exchange needs [auth.oauth]: the caller's validated JWT is the token it exchanges"),
                        );
                    }
                }
                let auth = auth.and_then(|(_, a)| a);
                if let Some(mut t) = http_spec(cx, &name, url, s.transport, s.headers, s.ca_file, base, env) {
                    match &s.max_connections {
                        Some(n) if *n.get_ref() == 0 => {
                            cx.at(
                                n.span().start,
                                format!("servers.{name}.max_connections must be at least 1"),
                            );
                        }
                        Some(n) => t.max_connections = *n.get_ref(),
                        None => {}
                    }
                    t.max_message = gateway.max_line;
                    if cx.errors.len() == errors {
                        t.auth = auth;
                        let t = Transport::Http(t);
                        unused_catalog_secrets(cx, &name, &s.catalog_secrets, &t);
                        servers.push(server(t));
                    }
                }
                continue;
            }
            (Some(command), None) => {
                for (key, v) in [
                    ("transport", s.transport.is_some()),
                    ("headers", !s.headers.is_empty()),
                    ("ca_file", s.ca_file.is_some()),
                    ("max_connections", s.max_connections.is_some()),
                    ("auth", s.auth.is_some()),
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
        let mut client_env = Vec::new();
        for (key, value) in s.env {
            let span = value.span();
            if key.is_empty() || key.contains(['=', '\0']) {
                cx.at(
                    span.start,
                    format!("servers.{name}.env: {key:?} is not a variable name (empty, or with '=' or a NUL byte)"),
                );
                continue;
            }
            match expand_template(value.get_ref(), env) {
                Ok(t) if t.is_plain() => child_env.extend(t.plain().map(|v| (key, v))),
                Ok(t) => {
                    let what = format!("servers.{name}.env.{key}");
                    if secret_names(cx, span.start, &what, &t) && isolation == Isolation::Shared {
                        cx.at(
                            span.start,
                            format!("{what} uses ${{client:…}}, which needs isolation = \"client\" or \"session\" (a process per caller); with isolation = \"shared\" every client would share one process"),
                        );
                    }
                    client_env.push((key, t));
                }
                Err(var) => cx.at(
                    span.start,
                    format!("servers.{name}.env.{key}: environment variable {var} is not set (write ${{{var}:-default}} for a default)"),
                ),
            }
        }
        let cwd = match &s.cwd {
            None => base.to_path_buf(),
            Some(c) if Path::new(c).is_absolute() => PathBuf::from(c),
            Some(c) => base.join(c),
        };
        let (args, masked) = stdio_args(cx, &name, s.args, env);
        let max_calls_per_client = match &s.max_calls_per_client {
            Some(n) if *n.get_ref() == 0 => {
                cx.at(
                    n.span().start,
                    format!("servers.{name}.max_calls_per_client must be at least 1"),
                );
                DEFAULT_MAX_CALLS_PER_CLIENT
            }
            Some(n) => *n.get_ref(),
            None => DEFAULT_MAX_CALLS_PER_CLIENT,
        };
        let t = Transport::Stdio(StdioSpec {
            command: command.into_inner(),
            args,
            cwd,
            env: child_env,
            client_env,
            masked,
            inherited: inherited.clone(),
            max_line: gateway.max_line,
            max_calls_per_client,
        });
        unused_catalog_secrets(cx, &name, &s.catalog_secrets, &t);
        servers.push(server(t));
    }
    servers
}

/// A URL as written in gateway.toml, safe to show: a password in its user info, and the
/// value of a query parameter named as a credential (`api_key`, `token`, `sig` …), are
/// `****` unless written as `${VAR}` (which is shown as written: the value is not in it).
pub fn shown_url(written: &str) -> String {
    use crate::import::secrets::{credential_name, setting_value};
    let (head, fragment) = match written.split_once('#') {
        Some((h, f)) => (h, Some(f)),
        None => (written, None),
    };
    let (head, query) = match head.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (head, None),
    };
    let mut out = String::with_capacity(written.len());
    let start = head.find("://").map_or(0, |i| i + 3);
    let authority_end = head[start..].find('/').map_or(head.len(), |i| start + i);
    let authority = &head[start..authority_end];
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            out.push_str(&head[..start]);
            match user.split_once(':') {
                Some((name, password))
                    if !(password.is_empty() || password.starts_with("${") && password.ends_with('}')) =>
                {
                    out.push_str(name);
                    out.push_str(":****");
                }
                _ => out.push_str(user),
            }
            out.push('@');
            out.push_str(host);
            out.push_str(&head[authority_end..]);
        }
        None => out.push_str(head),
    }
    if let Some(q) = query {
        out.push('?');
        for (i, part) in q.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match part.split_once('=') {
                Some((k, v)) if credential_name(k) && !v.is_empty() && !setting_value(v) => {
                    out.push_str(k);
                    out.push_str("=****");
                }
                _ => out.push_str(part),
            }
        }
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
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
        Err(var) if var.starts_with(super::CLIENT_REF) => {
            cx.at(
                url.span().start,
                format!("servers.{name}.url: ${{{var}}} cannot be in a url (one URL serves every caller); put the caller's secret in `headers`"),
            );
            String::new()
        }
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
    let mode = one_of(
        cx,
        transport.as_ref(),
        &format!("servers.{name}.transport"),
        DEFAULT_TRANSPORT,
        &[
            ("auto", HttpMode::Auto),
            ("streamable-http", HttpMode::Streamable),
            ("sse", HttpMode::Sse),
        ],
    );
    let mut out_headers = Vec::new();
    let mut client_headers = Vec::new();
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
        match expand_template(value.get_ref(), env) {
            Ok(t) if t.fill(&|_| Some(String::new())).is_ok_and(|v| v.expose().bytes().any(|b| b == b'\r' || b == b'\n')) => {
                cx.at(value.span().start, format!("servers.{name}.headers.{key}: the value contains a line break"));
            }
            Ok(t) if t.is_plain() => out_headers.extend(t.plain().map(|v| (key, v))),
            Ok(t) => {
                if secret_names(cx, value.span().start, &format!("servers.{name}.headers.{key}"), &t) {
                    client_headers.push((key, t));
                }
            }
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
        url_display: shown_url(url.get_ref()),
        url: Secret(expanded),
        mode,
        headers: out_headers,
        client_headers,
        ca_file,
        max_connections: DEFAULT_MAX_CONNECTIONS,
        max_message: crate::config::gateway::DEFAULT_MAX_LINE,
        auth: None,
    })
}

/// A stdio server's `args`, `${VAR}` expanded as `env` values are, and the values the
/// variables gave (masked in the child's stderr). `${client:…}` is for `env` and `headers`
/// only: an argument is visible to every local user in the process list.
fn stdio_args(
    cx: &mut Ctx,
    name: &str,
    raw: Vec<Spanned<String>>,
    env: &dyn Fn(&str) -> Option<String>,
) -> (Vec<Secret>, Vec<Secret>) {
    let used = std::cell::RefCell::new(Vec::new());
    let recording = |var: &str| {
        let v = env(var);
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            used.borrow_mut().push(Secret(v.clone()));
        }
        v
    };
    let mut args = Vec::with_capacity(raw.len());
    for (i, a) in raw.into_iter().enumerate() {
        let span = a.span();
        let a = a.into_inner();
        // One parse: `${VAR}` expanded, `$${client:…}` a literal, `${client:…}` refused.
        match expand_template(&a, &recording) {
            Ok(t) => match t.plain() {
                Some(v) => args.push(v),
                None => cx.at(
                    span.start,
                    format!("servers.{name}.args[{i}]: ${{client:…}} is for `env` and `headers` only (an argument shows in the process list)"),
                ),
            },
            Err(var) => cx.at(
                span.start,
                format!("servers.{name}.args[{i}]: environment variable {var} is not set (write ${{{var}:-default}} for a default, or $$ for a literal $)"),
            ),
        }
    }
    (args, used.into_inner())
}

/// A `catalog_secrets` key that no `${client:…}` of the server uses is a mistake (a typo).
fn unused_catalog_secrets(cx: &mut Ctx, name: &str, raw: &IndexMap<String, Spanned<String>>, t: &Transport) {
    let used = t.client_secrets();
    for (key, value) in raw {
        if !used.iter().any(|(_, n)| n == key) {
            cx.at(
                value.span().start,
                format!("servers.{name}.catalog_secrets.{key}: the server's env and headers use no ${{client:{key}}}"),
            );
        }
    }
}

/// Checks the secret names `t` refers to (`what` names the key); false if one is bad.
fn secret_names(cx: &mut Ctx, at: usize, what: &str, t: &Template) -> bool {
    let mut ok = true;
    for n in t.secrets() {
        if n.is_empty() || !n.chars().all(name_char) {
            cx.at(
                at,
                format!("{what}: ${{client:{n}}}: a secret name may only use [A-Za-z0-9_.-] and must not be empty (no default: a client without the secret gets an error)"),
            );
            ok = false;
        }
    }
    ok
}

impl StdioSpec {
    /// Whether some of its variables are the calling client's secrets.
    pub fn per_client(&self) -> bool {
        !self.client_env.is_empty()
    }

    /// The spec of a process for one caller: its `${client:…}` variables filled from
    /// `secret`. `Err`: the first secret it lacks, and the variable that needs it.
    pub fn for_client(&self, secret: &dyn Fn(&str) -> Option<String>) -> Result<StdioSpec, (String, String)> {
        self.filled(secret, true)
    }

    /// With `strict`, as [`StdioSpec::for_client`]; else a variable whose secret `secret`
    /// lacks is left out.
    fn filled(&self, secret: &dyn Fn(&str) -> Option<String>, strict: bool) -> Result<StdioSpec, (String, String)> {
        let mut spec = self.clone();
        for (k, t) in &self.client_env {
            let v = match t.fill(secret) {
                Ok(v) => v,
                Err(missing) if strict => return Err((missing, format!("env.{k}"))),
                Err(_) => continue,
            };
            spec.env.push((k.clone(), v));
            spec.masked.extend(t.secrets().filter_map(secret).map(Secret));
        }
        spec.client_env.clear();
        Ok(spec)
    }
}

impl HttpSpec {
    /// Whether some of its headers are the calling client's secrets.
    pub fn per_client(&self) -> bool {
        !self.client_headers.is_empty()
    }

    /// The spec of a connection for one caller: its `${client:…}` headers filled from
    /// `secret`. `Err`: the first secret it lacks (or that cannot be a header value), and
    /// the header that needs it.
    pub fn for_client(&self, secret: &dyn Fn(&str) -> Option<String>) -> Result<HttpSpec, (String, String)> {
        self.filled(secret, true)
    }

    /// With `strict`, as [`HttpSpec::for_client`]; else a header whose secret `secret`
    /// lacks is left out.
    fn filled(&self, secret: &dyn Fn(&str) -> Option<String>, strict: bool) -> Result<HttpSpec, (String, String)> {
        let mut spec = self.clone();
        for (k, t) in &self.client_headers {
            let v = match t.fill(secret) {
                Ok(v) => v,
                Err(missing) if strict => return Err((missing, format!("headers.{k}"))),
                Err(_) => continue,
            };
            if v.expose().bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                if !strict {
                    continue;
                }
                let name = t.secrets().next().unwrap_or_default().to_owned();
                return Err((name, format!("headers.{k} (the value holds control characters)")));
            }
            spec.headers.push((k.clone(), v));
        }
        spec.client_headers.clear();
        Ok(spec)
    }
}

impl Transport {
    /// Whether its `env` or `headers` use `${client:…}`: then each caller has its own
    /// process or connection.
    pub fn per_client(&self) -> bool {
        match self {
            Transport::Stdio(s) => s.per_client(),
            Transport::Http(h) => h.per_client(),
        }
    }

    /// As the server's own (catalog) process or connection runs it: `${client:NAME}`
    /// filled from `secrets` (its `catalog_secrets`), a value whose secret is not there
    /// left out.
    pub fn for_catalog(&self, secrets: &[(String, Secret)]) -> Transport {
        let secret = |n: &str| secrets.iter().find(|(k, _)| k == n).map(|(_, v)| v.0.clone());
        // Not strict: it never fails.
        match self {
            Transport::Stdio(s) if s.per_client() => {
                s.filled(&secret, false).map_or_else(|_| self.clone(), Transport::Stdio)
            }
            Transport::Http(h) if h.per_client() => {
                h.filled(&secret, false).map_or_else(|_| self.clone(), Transport::Http)
            }
            other => other.clone(),
        }
    }

    /// Its values that use `${client:…}`, and what they are: `"env"` or `"headers"`.
    pub fn templates(&self) -> (&'static str, &[(String, Template)]) {
        match self {
            Transport::Stdio(s) => ("env", &s.client_env),
            Transport::Http(h) => ("headers", &h.client_headers),
        }
    }

    /// The secret names its `env` or `headers` refer to, with the key of each.
    pub fn client_secrets(&self) -> Vec<(String, &str)> {
        let (kind, refs) = self.templates();
        refs.iter()
            .flat_map(|(k, t)| t.secrets().map(move |n| (format!("{kind}.{k}"), n)))
            .collect()
    }
}

/// `[servers.NAME.overrides.*]`: a new name must be a valid one, and two tools may not
/// be given the same name.
fn parse_overrides(cx: &mut Ctx, server: &str, raw: &IndexMap<String, RawOverride>) -> IndexMap<String, Override> {
    let mut out = IndexMap::new();
    let mut names: IndexMap<String, String> = IndexMap::new();
    for (tool, o) in raw {
        if let Some(n) = &o.name {
            let new = n.get_ref();
            if new.is_empty() || !new.chars().all(name_char) {
                cx.at(
                    n.span().start,
                    format!("servers.{server}.overrides.{tool}.name: {new:?} may only use [A-Za-z0-9_.-] and must not be empty"),
                );
            } else if let Some(other) = names.insert(new.clone(), tool.clone()) {
                cx.at(
                    n.span().start,
                    format!("servers.{server}.overrides.{tool}.name: {new:?} is already the new name of {other:?}"),
                );
            }
        }
        out.insert(
            tool.clone(),
            Override {
                name: o.name.as_ref().map(|n| n.get_ref().clone()),
                description: o.description.clone(),
                title: o.title.clone(),
                annotations: o.annotations.clone(),
            },
        );
    }
    out
}
