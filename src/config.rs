//! gateway.toml: parsed once into `RawConfig` (serde, unknown keys rejected), then
//! validated into [`Config`] with `${VAR}` expanded and secrets wrapped in [`Secret`].
//!
//! This is the only module that reads the gateway's environment, and only through the
//! lookup function handed to [`Config::load`], so tests never touch process env.
//! Every error names the file, line and column it comes from.
//!
//! Each table has its own file beside this one, with its serde form, its validated form,
//! its defaults and its `parse`: `gateway`, `servers`, `rate_limits`, `telemetry`,
//! `clients` (`[clients.*]` and `[auth]`) and `profiles`. `tables` reads one table of the TOML document,
//! `errors` locates and words the problems, `values` holds what tables share.

mod clients;
mod cluster;
mod errors;
mod gateway;
mod profiles;
mod rate_limits;
mod servers;
mod tables;
mod telemetry;
mod upstream_auth;
pub(crate) mod values;

pub use clients::{Auth, ClientSpec, OAuth, TokenDigest, DEFAULT_CLIENT_CLAIM};
pub use cluster::{Cluster, OnRedisDown, DEFAULT_CLUSTER_PREFIX, DEFAULT_ON_REDIS_DOWN, MIN_CLUSTER_KEY};
pub use errors::{ConfigError, ConfigErrors};
pub use gateway::{
    Cidr, Gateway, DEFAULT_BODY_TIMEOUT, DEFAULT_DRAIN_DELAY, DEFAULT_HEADER_TIMEOUT, DEFAULT_INPUT_TIMEOUT,
    DEFAULT_LISTEN, DEFAULT_MAX_BODY, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_LINE,
    DEFAULT_MAX_SESSIONS, DEFAULT_PAGE_SIZE, DEFAULT_PATH, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SEPARATOR,
    DEFAULT_SESSION_IDLE, DEFAULT_SHUTDOWN_GRACE, SESSIONS_PER_CLIENT_DIVISOR,
};
pub use profiles::{profile_char, Profile, RESERVED_PROFILES};
pub use rate_limits::{Per, Rate, RateLimits};
pub use servers::shown_url;
pub use servers::{
    Era, HttpMode, HttpSpec, Isolation, Override, Restart, Server, StdioSpec, Transport, DEFAULT_ENABLED,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_ISOLATION, DEFAULT_PROTOCOL, DEFAULT_RESTART, DEFAULT_SERVER_MAX_SESSIONS,
    DEFAULT_TRANSPORT, INHERITED_ENV, STALL_TIMEOUTS,
};
pub use telemetry::{
    LogFormat, OtlpProtocol, Telemetry, DEFAULT_LOG_FORMAT, DEFAULT_OTLP_PROTOCOL, DEFAULT_SERVICE_NAME,
};
pub use upstream_auth::{ClientAuth, OAuthClient, TokenExchange, UpstreamAuth, ACCESS_TOKEN_TYPE, DEFAULT_CLIENT_AUTH};
pub use values::{glob, name_char, parse_duration, parse_size, Filter};

use errors::{unknown_key, Ctx};
use indexmap::IndexMap;
use std::fmt;
use std::path::{Path, PathBuf};
use tables::{key_span, named, table};
use toml::Spanned;

/// A value that must never be shown: `Debug` and `Display` print `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The real value, for the places that must use it: a child's environment, a remote
    /// server's URL and headers.
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

// ---------------------------------------------------------------- reading, table by table

/// The whole file, assembled table by table by [`read_tables`].
#[derive(Default)]
struct RawConfig {
    gateway: gateway::RawGateway,
    servers: IndexMap<Spanned<String>, servers::RawServer>,
    rate_limits: rate_limits::RawGlobalLimits,
    telemetry: telemetry::RawTelemetry,
    clients: IndexMap<Spanned<String>, clients::RawClient>,
    auth: clients::RawAuth,
    cluster: Option<cluster::RawCluster>,
    profiles: IndexMap<Spanned<String>, profiles::RawProfile>,
}

/// The keys allowed at the top of the file.
const TOP_KEYS: &[&str] = &[
    "gateway",
    "servers",
    "rate_limits",
    "telemetry",
    "clients",
    "auth",
    "cluster",
    "profiles",
];

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
            "cluster" => raw.cluster = Some(table(cx, &[key], item).map(|t| t.0).unwrap_or_default()),
            "servers" => raw.servers = named(cx, key, item, servers::RawServer::removed),
            "clients" => raw.clients = named(cx, key, item, |_: &mut clients::RawClient, _| {}),
            "profiles" => raw.profiles = named(cx, key, item, |_: &mut profiles::RawProfile, _| {}),
            other => {
                let at = key_span(root, other).map_or(0, |s| s.start);
                cx.at(at, unknown_key(&[], other, TOP_KEYS));
            }
        }
    }
    Some(raw)
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
    /// `[cluster]`: replicas sharing state through Redis. `None`: one process.
    pub cluster: Option<Cluster>,
    /// `[profiles.*]` in file order: endpoints at `{gateway.path}/{NAME}` over some servers.
    pub profiles: Vec<Profile>,
}

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
        let gateway = gateway::parse(&mut cx, raw.gateway, &folder(path), env);
        let rate_limits = rate_limits::parse(&mut cx, &raw.rate_limits);
        let telemetry = telemetry::parse(&mut cx, raw.telemetry, env);
        let auth = clients::parse(&mut cx, raw.clients, raw.auth, env);
        // Every server named in the file, with its tags, for the profiles' checks (one
        // with problems of its own is reported once, not again by each profile naming it).
        let known: Vec<(String, Vec<String>)> = raw
            .servers
            .iter()
            .map(|(n, s)| (n.get_ref().clone(), s.tag_names()))
            .collect();
        let servers = servers::parse(&mut cx, raw.servers, &gateway, &folder(path), auth.oauth.is_some(), env);
        let profiles = profiles::parse(&mut cx, raw.profiles, &known);
        let cluster = cluster::parse(&mut cx, raw.cluster, env);
        if !cx.errors.is_empty() {
            return Err(ConfigErrors(cx.errors));
        }
        Ok(Config {
            file: path.to_path_buf(),
            gateway,
            servers,
            rate_limits,
            telemetry,
            auth,
            cluster,
            profiles,
        })
    }

    /// The `[profiles.NAME]` of that name.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// The folder of the config file, absolute where it can be: relative `cwd`s and
/// `ca_file`s resolve against it.
fn folder(path: &Path) -> PathBuf {
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base = if base.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base
    };
    std::fs::canonicalize(&base).unwrap_or(base)
}

/// hand to [`Config::load`], so this module stays the only reader of the environment.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Expands `${VAR}` and `${VAR:-default}`; `$$` is a literal `$`. Returns the name of
/// the first unset variable that has no default.
pub fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    expand_parts(s, env, &mut out, None)?;
    Ok(out)
}

/// As [`expand`], and `${client:NAME}` stays a reference to the calling client's secret
/// `NAME` (a server's `env` and `headers`), filled per caller by [`Template::fill`].
pub fn expand_template(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Template, String> {
    let mut parts = Vec::new();
    let mut text = String::with_capacity(s.len());
    expand_parts(s, env, &mut text, Some(&mut parts))?;
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(Template(parts))
}

/// Expands `s` into `out`; with `parts`, a `${client:NAME}` ends the text so far (moved
/// into `parts`) and adds the reference.
fn expand_parts(
    s: &str,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
    mut parts: Option<&mut Vec<Part>>,
) -> Result<(), String> {
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
            if let (Some(parts), Some(name)) = (parts.as_deref_mut(), inner.strip_prefix(CLIENT_REF)) {
                if !out.is_empty() {
                    parts.push(Part::Text(std::mem::take(out)));
                }
                parts.push(Part::Client(name.to_owned()));
                rest = &body[end + 1..];
                continue;
            }
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
    Ok(())
}

/// What marks a reference to the calling client's secret: `${client:NAME}`.
pub const CLIENT_REF: &str = "client:";

/// A server's `env` or `headers` value that uses `${client:NAME}`: text (its `${VAR}`s
/// expanded when the config loaded) and references to the calling client's
/// `[clients.*] secrets`, filled per caller. Never shown: `Debug` prints `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

#[derive(Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Client(String),
}

impl Template {
    /// The secret names it refers to, in order.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Part::Client(n) => Some(n.as_str()),
            Part::Text(_) => None,
        })
    }

    /// Whether it refers to no secret at all (then it is plain text).
    pub fn is_plain(&self) -> bool {
        self.secrets().next().is_none()
    }

    /// Its text, when it refers to no secret.
    pub fn plain(&self) -> Option<Secret> {
        self.fill(&|_| None).ok()
    }

    /// Its text, every reference filled from `secret`; `Err`: the first secret `secret`
    /// does not have.
    pub fn fill(&self, secret: &dyn Fn(&str) -> Option<String>) -> Result<Secret, String> {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Client(n) => out.push_str(&secret(n).ok_or_else(|| n.clone())?),
            }
        }
        Ok(Secret(out))
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

#[cfg(test)]
mod tests;
