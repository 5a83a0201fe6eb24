//! Config errors: each one located (file, line, column), and serde's messages said in
//! gateway.toml's terms. A world of its own, apart from `crate::error`: these are
//! startup problems, shown to whoever edits the file.

use std::fmt;

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

/// Where problems are collected while a file is validated: every table reports all of
/// its own, and the file is refused once at the end.
pub(super) struct Ctx<'a> {
    pub(super) file: String,
    pub(super) src: &'a str,
    pub(super) errors: Vec<ConfigError>,
}

impl Ctx<'_> {
    /// Records `message` at byte `offset` of the file.
    pub(super) fn at(&mut self, offset: usize, message: String) {
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

/// serde's message about the key at `path`, said in gateway.toml's terms: which key,
/// what it should be, with an example.
pub(super) fn explain(path: &[String], message: &str) -> String {
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
        ("env" | "headers" | "secrets" | "catalog_secrets", _) if n >= 4 => {
            format!(r#"a string (in quotes, e.g. {key} = "1")"#)
        }
        (
            _,
            "request_timeout" | "shutdown_grace" | "drain_delay" | "session_idle" | "input_timeout" | "header_timeout"
            | "keep_alive_timeout" | "body_timeout" | "timeout" | "idle_timeout" | "stall_timeout" | "busy_poll",
        ) => r#"a duration string like "60s" (or "500ms", "2m", "1h")"#.into(),
        (_, "max_body" | "max_line") => r#"a size string like "16MiB" (or "512KiB", "1GiB", "1048576")"#.into(),
        (_, "per_client" | "per_ip" | "per_server" | "rate_limit") => RATE.into(),
        (_, "enabled" | "record_payloads" | "search") => format!("a boolean: {key} = true or {key} = false"),
        (
            _,
            "max_sessions"
            | "max_sessions_per_client"
            | "page_size"
            | "max_in_flight"
            | "max_connections_per_address"
            | "worker_threads"
            | "max_connections"
            | "max_calls_per_client",
        ) => {
            format!("a whole number like {key} = 100")
        }
        (_, "allowed_origins") => r#"a list of strings like ["https://app.example.com"]"#.into(),
        (_, "allowed_hosts") => r#"a list of strings like ["gateway.internal:8080"]"#.into(),
        (_, "args") => r#"a list of strings like ["-y", "@modelcontextprotocol/server-everything"]"#.into(),
        (_, "allow" | "deny") => r#"a list of globs like ["search_*", "get_?"]"#.into(),
        (_, "env" | "headers" | "per_tool") => format!(r#"a table of strings like {key} = {{ NAME = "value" }}"#),
        (_, "secrets" | "catalog_secrets") => format!(r#"a table of strings like {key} = {{ NAME = "${{VAR}}" }}"#),
        ("servers", _) if n == 2 => r#"a table like [servers.NAME] with command = "..." or url = "...""#.into(),
        ("clients", _) if n == 2 => r#"a table like [clients.NAME] with token = "${TOKEN}""#.into(),
        ("profiles", _) if n == 2 => {
            r#"a table like [profiles.NAME] with servers = ["github"] or tags = ["web"]"#.into()
        }
        (_, "servers") if n == 3 => r#"a list of server names like ["github", "figma"]"#.into(),
        (_, "tags") => r#"a list of tags like ["web", "db"]"#.into(),
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
        (_, "isolation") => r#"one of "shared", "session", "client""#.into(),
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
pub(super) fn unknown_key(table: &[String], key: &str, allowed: &[&str]) -> String {
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
