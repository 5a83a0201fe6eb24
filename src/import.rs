//! `mcp-gateway import`: the `[servers.*]` tables for the MCP servers that client configs
//! already list (Claude Desktop, Claude Code, Cursor, VS Code, Windsurf).
//!
//! Every format is a JSON object of servers by name, under `mcpServers` (Claude Desktop,
//! Claude Code's `.mcp.json`, Cursor, Windsurf), under `servers` (VS Code, with `inputs`
//! beside it), or under each project of `~/.claude.json`. A server is `command`/`args`/
//! `env`/`cwd`, or `url` (Windsurf: `serverUrl`) with `type` and `headers`.
//!
//! **What `${…}` means depends on the client** ([`Format`]): Claude Desktop takes every
//! string as it is; Claude Code expands `${VAR}` and `${VAR:-default}`; Cursor, VS Code and
//! Windsurf expand `${env:VAR}` and fill in some variables of their own (`${userHome}`,
//! `${workspaceFolder}`, VS Code's `${input:ID}`). Each becomes the gateway's `${VAR}`, a
//! path, or an error naming it; every other `$` is written `$$`, so that the gateway passes
//! it on as the client did.
//!
//! **Secrets never reach the output.** A credential written out is replaced by a
//! `${SERVER_…}` reference, listed in a comment as a variable to export, and said on
//! stderr by where it was and why (never its value):
//! - the whole value of an `env` or `headers` key that names a credential ([`credential_name`]);
//! - in any string (`args`, `env`, `headers`, `url`): the password of a URL
//!   (`postgresql://app:PASSWORD@db`), a URL's query parameter that names a credential
//!   (`?api_key=…`), the credential after `Bearer`/`Basic`/`Token`, a token of a known shape
//!   (`ghp_…`, `sk-…`, `xoxb-…`, a JWT, …, see [`token_like`]) and a long random-looking run of
//!   letters and digits;
//! - in `args`: the value of a flag or `NAME=VALUE` that names a credential (`--api-key X`,
//!   `--token=X`, `-e GITHUB_TOKEN=X`, `--header "Authorization: Bearer X"`).
//!
//! The gateway expands `${VAR}` in `args`, `env`, `url` and `headers`; a secret found in a
//! `command` or `cwd`, which it does not expand, leaves that server out, with a note.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What an import made: the TOML to append, and what was done (for stderr).
#[derive(Debug, Default)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<String>,
    /// The server names, in order.
    pub names: Vec<String>,
}

/// One file to import.
pub struct Source {
    /// As given on the command line: how notes name it.
    pub path: PathBuf,
    pub text: String,
    /// The client that wrote it, when the user said (`--from`); else found by [`Format::detect`].
    pub format: Option<Format>,
}

/// The client whose config a file is: what its `${…}` mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `claude_desktop_config.json`: no expansion at all.
    ClaudeDesktop,
    /// `.mcp.json`, `~/.claude.json`: `${VAR}`, `${VAR:-default}`.
    ClaudeCode,
    /// `.cursor/mcp.json`: `${env:VAR}`, `${userHome}`, `${workspaceFolder}`, …
    Cursor,
    /// `.vscode/mcp.json`: as Cursor, and `${input:ID}`; any other variable is VS Code's own.
    VsCode,
    /// `mcp_config.json`: `${env:VAR}`, `${file:PATH}`.
    Windsurf,
}

impl Format {
    /// The names `--from` takes.
    pub const NAMES: [&'static str; 5] = ["claude-desktop", "claude-code", "cursor", "vscode", "windsurf"];

    pub fn from_name(name: &str) -> Option<Format> {
        let all = [
            Format::ClaudeDesktop,
            Format::ClaudeCode,
            Format::Cursor,
            Format::VsCode,
            Format::Windsurf,
        ];
        Format::NAMES.iter().position(|n| *n == name).map(|i| all[i])
    }

    fn label(self) -> &'static str {
        match self {
            Format::ClaudeDesktop => "Claude Desktop's config",
            Format::ClaudeCode => "Claude Code's",
            Format::Cursor => "Cursor's mcp.json",
            Format::VsCode => "VS Code's mcp.json",
            Format::Windsurf => "Windsurf's mcp_config.json",
        }
    }

    /// By the file's name and folder, then by its shape; `None` when neither tells (the
    /// caller reads it as Claude Code's and says so).
    pub fn detect(path: &Path, root: &Map<String, Value>) -> Option<Format> {
        let lower = |p: Option<&std::ffi::OsStr>| p.map(|s| s.to_string_lossy().to_ascii_lowercase());
        let name = lower(path.file_name()).unwrap_or_default();
        let folder = lower(path.parent().and_then(Path::file_name)).unwrap_or_default();
        if name.contains("claude_desktop_config") {
            Some(Format::ClaudeDesktop)
        } else if name == ".mcp.json" || name == ".claude.json" || root.contains_key("projects") {
            Some(Format::ClaudeCode)
        } else if name.ends_with("mcp_config.json") || folder == "windsurf" {
            Some(Format::Windsurf)
        } else if folder == ".vscode" || (root.contains_key("servers") && !root.contains_key("mcpServers")) {
            Some(Format::VsCode)
        } else if folder == ".cursor" {
            Some(Format::Cursor)
        } else {
            None
        }
    }
}

/// Words that make a key's value a credential, anywhere in the key.
const SECRET_WORDS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "auth",
    "key",
    "credential",
    "cookie",
];
/// Words that do when they are a whole word of the key (`GITHUB_PAT`, not `PATH`).
const SECRET_WHOLE_WORDS: &[&str] = &["pat", "pwd", "pass", "dsn", "sig", "signature"];
/// Words that make a key name where a secret is, not the secret (`TOKEN_FILE`).
const PLACE_WORDS: &[&str] = &["file", "path", "dir", "filename"];

/// One server as found in a file.
struct Found {
    name: String,
    spec: Map<String, Value>,
    file: String,
    format: Format,
    /// `${workspaceFolder}`, when the file sits in a project's `.vscode`/`.cursor`.
    workspace: Option<PathBuf>,
}

/// The servers of a gateway.toml: each name, and what it runs (see [`signature`]).
pub fn existing(toml_text: &str) -> Result<Vec<(String, String)>, String> {
    let t: toml::Table = toml_text.parse().map_err(|e| format!("{e}"))?;
    let Some(toml::Value::Table(servers)) = t.get("servers") else {
        return Ok(Vec::new());
    };
    let s = |spec: &toml::Value, k: &str| spec.get(k).and_then(toml::Value::as_str).map(str::to_owned);
    Ok(servers
        .iter()
        .map(|(name, spec)| {
            let args: Vec<String> = spec
                .get("args")
                .and_then(toml::Value::as_array)
                .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect())
                .unwrap_or_default();
            (name.clone(), signature(s(spec, "command"), &args, s(spec, "url")))
        })
        .collect())
}

/// What a server runs, as the gateway's TOML has it: its command and arguments, or its
/// URL, with every `${…}` as `${}` (the variable a secret became is named after the
/// server, which may have a suffix). Two entries with the same signature are the same
/// server.
fn signature(command: Option<String>, args: &[String], url: Option<String>) -> String {
    let s = match command {
        Some(cmd) => format!("command {cmd} {}", args.join(" ")),
        None => format!("url {}", url.unwrap_or_default()),
    };
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        if let Some(end) = rest.find('}') {
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// Reads every file and makes the tables. `existing` are the servers already in the
/// gateway.toml being appended to ([`existing`]): a server that runs the same thing is not
/// added again, and a name clash gets a suffix. `home` is the user's home folder (a
/// `.cursor` or `.vscode` folder right in it is the global config, with no workspace).
pub fn import(files: &[Source], existing: &[(String, String)], home: Option<&Path>) -> Result<Imported, String> {
    let mut found = Vec::new();
    let mut out = Imported::default();
    for src in files {
        let file = src.path.display().to_string();
        let v: Value = serde_json::from_str(&src.text).map_err(|e| format!("{file}: not JSON: {e}"))?;
        let Value::Object(root) = v else {
            return Err(format!("{file}: not a JSON object"));
        };
        let format = match src.format.or_else(|| Format::detect(&src.path, &root)) {
            Some(f) => f,
            None => {
                out.notes.push(format!(
                    "{file}: read as {} (`${{VAR}}` expands); say --from {} if another client wrote it",
                    Format::ClaudeCode.label(),
                    Format::NAMES.join("|")
                ));
                Format::ClaudeCode
            }
        };
        let workspace = workspace_of(&src.path, home);
        let before = found.len();
        collect(&root, &file, format, &workspace, &mut found);
        if let Some(Value::Object(projects)) = root.get("projects") {
            for p in projects.values().filter_map(Value::as_object) {
                collect(p, &file, format, &workspace, &mut found);
            }
        }
        if found.len() == before {
            return Err(format!("{file}: no \"mcpServers\" or \"servers\" object"));
        }
    }
    let mut used: BTreeSet<String> = existing.iter().map(|(n, _)| n.clone()).collect();
    let mut seen: Vec<(String, String)> = existing.to_vec();
    let mut vars = Vars::default();
    let mut body = String::new();
    for f in found {
        let base = server_name(&f.name);
        let mut name = base.clone();
        let mut n = 2;
        while used.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        let mut server = Server {
            name: &name,
            found: &f,
            home,
            vars: vars.clone(),
            notes: Vec::new(),
        };
        let made = server.table();
        let (table, sig) = match made {
            Ok(t) => t,
            Err(why) => {
                out.notes
                    .push(format!("{}: server {:?} skipped: {why}", f.file, f.name));
                continue;
            }
        };
        if let Some((other, _)) = seen.iter().find(|(_, s)| *s == sig) {
            out.notes.push(format!(
                "{}: server {:?} is the same as [servers.{other}]; not added",
                f.file, f.name
            ));
            continue;
        }
        if name != f.name {
            out.notes
                .push(format!("{}: server {:?} is [servers.{name}]", f.file, f.name));
        }
        vars = server.vars;
        out.notes.extend(server.notes);
        used.insert(name.clone());
        seen.push((name.clone(), sig));
        body.push_str(&table);
        out.names.push(name);
    }
    if !vars.list.is_empty() {
        out.toml
            .push_str("# Set these before starting the gateway (secrets the imported files held or prompted for):\n");
        for (v, _) in &vars.list {
            out.toml.push_str(&format!("#   export {v}=...\n"));
        }
        out.toml.push('\n');
        out.notes.push(format!(
            "{} values are left out; export: {}",
            vars.list.len(),
            vars.list.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>().join(" ")
        ));
    }
    out.toml.push_str(&body);
    Ok(out)
}

/// `${workspaceFolder}` of a file in a project's `.vscode` or `.cursor` folder: the
/// project's folder, made absolute. `None` for any other file, and for the global
/// `~/.cursor/mcp.json` (whose workspace is whichever project is open).
fn workspace_of(path: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let abs = std::path::absolute(path).ok()?;
    let folder = abs.parent()?;
    let name = folder.file_name()?.to_string_lossy().to_ascii_lowercase();
    if name != ".vscode" && name != ".cursor" {
        return None;
    }
    let project = folder.parent()?;
    match home.and_then(|h| std::path::absolute(h).ok()) {
        Some(h) if h == project => None,
        _ => Some(project.to_path_buf()),
    }
}

/// The servers object of one JSON object (`mcpServers`, or VS Code's `servers`).
fn collect(obj: &Map<String, Value>, file: &str, format: Format, workspace: &Option<PathBuf>, found: &mut Vec<Found>) {
    for key in ["mcpServers", "servers"] {
        if let Some(Value::Object(servers)) = obj.get(key) {
            for (name, spec) in servers {
                if let Value::Object(spec) = spec {
                    found.push(Found {
                        name: name.clone(),
                        spec: spec.clone(),
                        file: file.to_owned(),
                        format,
                        workspace: workspace.clone(),
                    });
                }
            }
        }
    }
}

/// A name the gateway takes: `[A-Za-z0-9-]`, anything else a `-`.
fn server_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    let s = s.trim_matches('-').to_owned();
    if s.is_empty() {
        "server".to_owned()
    } else {
        s
    }
}

/// A piece of a value: text as it is, or a variable of the gateway (`${NAME}`,
/// `${NAME:-default}`).
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Var(String, Option<String>),
}

/// The variables the output asks for: each name, and the secret it stands for (`None`
/// for one the client prompted for or read from its environment), in order.
#[derive(Clone, Default)]
struct Vars {
    list: Vec<(String, Option<String>)>,
}

impl Vars {
    /// The variable for `secret`: `base`, or `base_2`… when `base` already stands for
    /// another value; the same one again for the same value.
    fn for_secret(&mut self, base: &str, secret: &str) -> String {
        let mut name = base.to_owned();
        let mut n = 2;
        loop {
            match self.list.iter().find(|(v, _)| *v == name) {
                None => {
                    self.list.push((name.clone(), Some(secret.to_owned())));
                    return name;
                }
                Some((_, Some(s))) if s == secret => return name,
                Some(_) => {
                    name = format!("{base}_{n}");
                    n += 1;
                }
            }
        }
    }

    /// A variable the user sets themselves (a VS Code input, a workspace folder).
    fn asked(&mut self, name: &str) {
        if !self.list.iter().any(|(v, _)| v == name) {
            self.list.push((name.to_owned(), None));
        }
    }
}

/// A variable name from anything: upper case, `_` for anything but letters and digits.
fn variable(parts: &[&str]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_matches('-')
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// One server being made into a table.
struct Server<'a> {
    name: &'a str,
    found: &'a Found,
    /// The user's home folder: what `${userHome}` is in a `command` or `cwd`.
    home: Option<&'a Path>,
    vars: Vars,
    notes: Vec<String>,
}

impl Server<'_> {
    /// `[servers.NAME]`, and what it runs ([`signature`]).
    fn table(&mut self) -> Result<(String, String), String> {
        let spec = &self.found.spec;
        let name = self.name;
        let mut t = format!("[servers.{name}]\n");
        let str_of = |k: &str| spec.get(k).and_then(Value::as_str);
        let sig;
        if let Some(cmd) = str_of("command") {
            let cmd = self.plain("command", cmd)?;
            t.push_str(&format!("command = {}\n", quote(&cmd)));
            let raw: Vec<String> = match spec.get("args") {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            let args = self.args(&raw)?;
            if !args.is_empty() {
                let list: Vec<String> = args.iter().map(|a| quote(a)).collect();
                t.push_str(&format!("args = [{}]\n", list.join(", ")));
            }
            if let Some(cwd) = str_of("cwd") {
                let cwd = self.plain("cwd", cwd)?;
                t.push_str(&format!("cwd = {}\n", quote(&cwd)));
            }
            if let Some(env) = spec.get("env").and_then(Value::as_object) {
                t.push_str(&format!("env = {}\n", self.inline("env", env)?));
            }
            if spec.contains_key("envFile") {
                self.note("envFile is not imported: put its variables in `env` (as ${VAR} references)".into());
            }
            sig = signature(Some(cmd), &args, None);
        } else if let Some(url) = str_of("url").or_else(|| str_of("serverUrl")) {
            let parts = self.read("url", url)?;
            let url = render(self.scan("url", parts, None));
            t.push_str(&format!("url = {}\n", quote(&url)));
            match str_of("type").or_else(|| str_of("transport")) {
                Some("sse") => t.push_str("transport = \"sse\"\n"),
                Some("http" | "streamable-http" | "streamableHttp") => t.push_str("transport = \"streamable-http\"\n"),
                _ => {}
            }
            if let Some(headers) = spec.get("headers").and_then(Value::as_object) {
                t.push_str(&format!("headers = {}\n", self.inline("headers", headers)?));
            }
            sig = signature(None, &[], Some(url));
        } else {
            return Err("neither \"command\" nor \"url\"".into());
        }
        if spec.get("disabled").and_then(Value::as_bool) == Some(true) {
            t.push_str("enabled = false\n");
        }
        t.push('\n');
        Ok((t, sig))
    }

    fn note(&mut self, what: String) {
        self.notes
            .push(format!("{}: server {:?}: {what}", self.found.file, self.found.name));
    }

    /// A `command` or `cwd`, which the gateway does not expand: its client's variables
    /// must come to plain text, and no secret may be in it.
    fn plain(&mut self, field: &str, s: &str) -> Result<String, String> {
        let parts = self.read(field, s)?;
        let mut text = String::new();
        for p in &parts {
            match p {
                Part::Text(t) => text.push_str(t),
                Part::Var(v, _) if v == "HOME" && self.home.is_some() => {
                    text.push_str(&self.home.map(|h| h.to_string_lossy()).unwrap_or_default())
                }
                Part::Var(v, _) => {
                    return Err(format!(
                        "its {field} uses the variable {v}, and the gateway expands variables only in args, env, url and headers"
                    ))
                }
            }
        }
        if !found_secrets(&text).is_empty() {
            return Err(format!(
                "its {field} holds what looks like a credential, and the gateway cannot take it from the environment there"
            ));
        }
        Ok(text)
    }

    /// `args`, each read, its secrets replaced, as the gateway's strings.
    fn args(&mut self, raw: &[String]) -> Result<Vec<String>, String> {
        let mut read = Vec::with_capacity(raw.len());
        for (i, a) in raw.iter().enumerate() {
            read.push(self.read(&format!("args[{i}]"), a)?);
        }
        let mut out = Vec::with_capacity(read.len());
        let mut next_is_secret: Option<String> = None;
        for (i, parts) in read.into_iter().enumerate() {
            let field = format!("args[{i}]");
            let whole = match &parts[..] {
                [Part::Text(t)] => Some(t.clone()),
                _ => None,
            };
            if let (Some(flag), Some(t)) = (next_is_secret.take(), &whole) {
                if !t.starts_with('-') && !t.is_empty() {
                    let var = self.secret_var(&[&flag], t, &field, &format!("the value of {flag}"));
                    out.push(render(vec![Part::Var(var, None)]));
                    continue;
                }
            }
            if let Some(t) = &whole {
                if t.starts_with('-') && !t.contains('=') && credential_name(t) {
                    next_is_secret = Some(t.trim_start_matches('-').to_owned());
                }
            }
            let parts = self.scan(&field, parts, None);
            out.push(render(parts));
        }
        Ok(out)
    }

    /// An inline table of `env` or `headers`, secrets replaced by references.
    fn inline(&mut self, field: &str, map: &Map<String, Value>) -> Result<String, String> {
        let mut items = Vec::with_capacity(map.len());
        for (k, v) in map {
            let raw = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let at = format!("{field}.{k}");
            let parts = self.read(&at, &raw)?;
            let parts = self.scan(&at, parts, Some(k));
            items.push(format!("{} = {}", key(k), quote(&render(parts))));
        }
        Ok(format!("{{ {} }}", items.join(", ")))
    }

    /// `s` as its client reads it: text and variables.
    fn read(&mut self, field: &str, s: &str) -> Result<Vec<Part>, String> {
        let format = self.found.format;
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${").filter(|_| format != Format::ClaudeDesktop) {
            text.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let Some(end) = after.find('}') else {
                text.push_str(&rest[i..]);
                rest = "";
                break;
            };
            let inner = &after[..end];
            let whole = &rest[i..i + 3 + end];
            rest = &after[end + 1..];
            let var = |parts: &mut Vec<Part>, text: &mut String, name: String, default: Option<String>| {
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(text)));
                }
                parts.push(Part::Var(name, default));
            };
            let ide = matches!(format, Format::Cursor | Format::VsCode);
            if let Some(v) = inner.strip_prefix("env:").filter(|v| ident(v)) {
                var(&mut parts, &mut text, v.to_owned(), None);
            } else if format == Format::ClaudeCode {
                match inner.split_once(":-") {
                    Some((v, d)) if ident(v) => {
                        let d = self.default_kept(field, v, d);
                        var(&mut parts, &mut text, v.to_owned(), d)
                    }
                    None if ident(inner) => var(&mut parts, &mut text, inner.to_owned(), None),
                    _ => text.push_str(whole),
                }
            } else if ide && inner == "userHome" {
                var(&mut parts, &mut text, "HOME".into(), None);
            } else if ide && (inner == "pathSeparator" || inner == "/") {
                text.push('/');
            } else if ide && (inner == "workspaceFolder" || inner == "workspaceFolderBasename") {
                let base = inner == "workspaceFolderBasename";
                match &self.found.workspace {
                    Some(w) if base => text.push_str(&w.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()),
                    Some(w) => text.push_str(&w.to_string_lossy()),
                    None => {
                        let v = if base {
                            "WORKSPACE_FOLDER_BASENAME"
                        } else {
                            "WORKSPACE_FOLDER"
                        };
                        self.vars.asked(v);
                        self.note(format!(
                            "{field}: ${{{inner}}} is whichever project is open in the editor; it is ${{{v}}} now"
                        ));
                        var(&mut parts, &mut text, v.into(), None);
                    }
                }
            } else if format == Format::VsCode {
                if let Some(id) = inner.strip_prefix("input:") {
                    let v = variable(&[id]);
                    self.vars.asked(&v);
                    var(&mut parts, &mut text, v, None);
                } else {
                    return Err(format!(
                        "{field}: {whole} is filled in by VS Code, and the gateway has no value for it"
                    ));
                }
            } else if format == Format::Windsurf && inner.starts_with("file:") {
                return Err(format!(
                    "{field}: Windsurf reads ${{file:…}} from a file when it starts the server; put the file's contents in an environment variable and write ${{VAR}}"
                ));
            } else {
                text.push_str(whole);
            }
        }
        text.push_str(rest);
        if !text.is_empty() || parts.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(parts)
    }

    /// A Claude Code default (`${VAR:-default}`), unless it is itself a credential.
    fn default_kept(&mut self, field: &str, var: &str, default: &str) -> Option<String> {
        if found_secrets(default).is_empty() && !credential_name(var) {
            return Some(default.to_owned());
        }
        if !default.is_empty() {
            self.note(format!(
                "{field}: the default of ${{{var}}} looks like a credential; it is left out (export {var})"
            ));
        }
        None
    }

    /// The parts with every secret in their text replaced by a variable. `key`: the `env`
    /// or `headers` key the value is of.
    fn scan(&mut self, field: &str, parts: Vec<Part>, key: Option<&str>) -> Vec<Part> {
        let written = parts.iter().any(|p| matches!(p, Part::Text(t) if !t.trim().is_empty()));
        if let Some(k) = key.filter(|k| credential_name(k) && written) {
            // The whole value is the credential: keep only an Authorization scheme.
            let text: String = parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => t.clone(),
                    Part::Var(v, _) => format!("${{{v}}}"),
                })
                .collect();
            let (scheme, rest) = scheme_split(&text);
            let only_refs =
                matches!(&parts[..], [Part::Text(t), Part::Var(..)] if t.trim() == scheme.trim() && !scheme.is_empty());
            if only_refs {
                return parts;
            }
            let var = self.secret_var(&[k], rest, field, "a credential, by its key's name");
            let mut out = Vec::new();
            if !scheme.is_empty() {
                out.push(Part::Text(scheme.to_owned()));
            }
            out.push(Part::Var(var, None));
            return out;
        }
        let mut out = Vec::new();
        for p in parts {
            let Part::Text(t) = p else {
                out.push(p);
                continue;
            };
            let mut at = 0;
            for (range, hint, why) in found_secrets(&t) {
                if range.start > at {
                    out.push(Part::Text(t[at..range.start].to_owned()));
                }
                let var = self.secret_var(&[key.unwrap_or(""), &hint], &t[range.clone()], field, why);
                out.push(Part::Var(var, None));
                at = range.end;
            }
            if at < t.len() || out.is_empty() {
                out.push(Part::Text(t[at..].to_owned()));
            }
        }
        out
    }

    /// The variable for a secret found in `field`, said on stderr (never the value).
    fn secret_var(&mut self, hint: &[&str], secret: &str, field: &str, why: &str) -> String {
        let mut parts = vec![self.name];
        parts.extend(hint.iter().copied().filter(|h| !h.is_empty()));
        let v = self.vars.for_secret(&variable(&parts), secret);
        self.note(format!("{field} holds {why}; it is ${{{v}}} now"));
        v
    }
}

/// The gateway's string for parts: `$` in text doubled, variables as `${NAME}`.
fn render(parts: Vec<Part>) -> String {
    let mut s = String::new();
    for p in parts {
        match p {
            Part::Text(t) => s.push_str(&t.replace('$', "$$")),
            Part::Var(v, None) => s.push_str(&format!("${{{v}}}")),
            Part::Var(v, Some(d)) => s.push_str(&format!("${{{v}:-{d}}}")),
        }
    }
    s
}

/// An environment variable's name as shells take it.
fn ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The words of a key: split at anything but letters and digits, and where a lower-case
/// letter meets an upper-case one (`githubPat`).
fn words(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in key.chars() {
        if !c.is_ascii_alphanumeric() {
            out.extend((!word.is_empty()).then(|| std::mem::take(&mut word)));
            prev_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && prev_lower {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        word.push(c.to_ascii_lowercase());
    }
    out.extend((!word.is_empty()).then_some(word));
    out
}

/// Whether a key, flag or parameter names a credential: it contains a [`SECRET_WORDS`]
/// word or is made with a [`SECRET_WHOLE_WORDS`] one, and names no place ([`PLACE_WORDS`]:
/// `TOKEN_FILE` is where a secret is).
pub fn credential_name(key: &str) -> bool {
    let words = words(key);
    if words.iter().any(|w| PLACE_WORDS.contains(&w.as_str())) {
        return false;
    }
    let lower = key.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| lower.contains(w)) || words.iter().any(|w| SECRET_WHOLE_WORDS.contains(&w.as_str()))
}

/// An Authorization scheme at the start of a value (`Bearer `, `Basic `, `Token `), and
/// what follows it.
fn scheme_split(s: &str) -> (&str, &str) {
    for scheme in ["bearer ", "basic ", "token "] {
        if s.len() > scheme.len() && s.is_char_boundary(scheme.len()) && s[..scheme.len()].eq_ignore_ascii_case(scheme)
        {
            return s.split_at(scheme.len());
        }
    }
    ("", s)
}

/// Prefixes of tokens that services issue (GitHub, GitLab, OpenAI/Anthropic, Stripe,
/// Slack, AWS, Google, Hugging Face, npm, PyPI, Sentry, Linear, Notion, Figma,
/// DigitalOcean, Shopify, Groq, xAI, Perplexity, Tavily, Replicate, SendGrid).
const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "gldt-",
    "glptt-",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "whsec_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxe-",
    "xoxs-",
    "xapp-",
    "AKIA",
    "ASIA",
    "AIza",
    "hf_",
    "npm_",
    "pypi-",
    "sntrys_",
    "sntryu_",
    "lin_api_",
    "ntn_",
    "secret_",
    "figd_",
    "dop_v1_",
    "shpat_",
    "shpss_",
    "gsk_",
    "xai-",
    "pplx-",
    "tvly-",
    "r8_",
    "SG.",
];

/// Whether a run of letters, digits, `_`, `-` and `.` is a token: a known prefix
/// ([`TOKEN_PREFIXES`]) and 12 more characters, a JWT (`eyJ….eyJ….…`), or a piece between
/// `_`/`-`/`.` that looks random: 20 or more characters mixing upper case, lower case and
/// digits, or 32 or more mixing letters and digits (hex keys). Words joined by dashes
/// (`claude-3-5-sonnet-20241022`) are not.
pub fn token_like(run: &str) -> bool {
    if TOKEN_PREFIXES
        .iter()
        .any(|p| run.starts_with(p) && run.len() >= p.len() + 12)
    {
        return true;
    }
    if run.starts_with("eyJ") && run.matches('.').count() >= 2 && run.len() >= 30 {
        return true;
    }
    run.split(['_', '-', '.']).any(|piece| {
        let has = |f: fn(&char) -> bool| piece.chars().any(|c| f(&c));
        let (upper, lower, digit) = (
            has(char::is_ascii_uppercase),
            has(char::is_ascii_lowercase),
            has(char::is_ascii_digit),
        );
        (piece.len() >= 20 && upper && lower && digit) || (piece.len() >= 32 && digit && (upper || lower))
    })
}

/// The secrets in a string of text: each byte range, a word for its variable's name, and
/// why it is one.
fn found_secrets(s: &str) -> Vec<(Range<usize>, String, &'static str)> {
    let mut found: Vec<(Range<usize>, String, &'static str)> = Vec::new();
    let add = |found: &mut Vec<(Range<usize>, String, &'static str)>, r: Range<usize>, hint: String, why| {
        if !r.is_empty() && !found.iter().any(|(f, ..)| f.start < r.end && r.start < f.end) {
            found.push((r, hint, why));
        }
    };
    // `Name: Bearer X` (an HTTP header as an argument) and `Bearer X`.
    let (head, value_at) = match s.split_once(':') {
        Some((name, _))
            if !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !s[name.len()..].starts_with("://") =>
        {
            let v = s[name.len() + 1..].trim_start();
            (Some(name), s.len() - v.len())
        }
        _ => (None, 0),
    };
    let (scheme, rest) = scheme_split(&s[value_at..]);
    if head.is_some_and(credential_name) && !rest.trim().is_empty() {
        add(
            &mut found,
            value_at + scheme.len()..s.len(),
            head.unwrap_or_default().to_owned(),
            "a credential in a header",
        );
    } else if !scheme.is_empty() && !rest.trim().is_empty() {
        add(
            &mut found,
            value_at + scheme.len()..s.len(),
            "token".into(),
            "an Authorization credential",
        );
    }
    // `NAME=VALUE` and `--name=value` whose name names a credential (not in a URL's query).
    if let Some((name, value)) = s.split_once('=') {
        let bare = name.trim_start_matches('-');
        if !bare.is_empty()
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            && credential_name(bare)
            && !value.is_empty()
        {
            add(
                &mut found,
                name.len() + 1..s.len(),
                bare.to_owned(),
                "a credential, by its name",
            );
        }
    }
    // URLs: a password, a token as the user, credentials in the query.
    let mut from = 0;
    while let Some(i) = s[from..].find("://").map(|i| i + from) {
        let start = i + 3;
        let end_auth = s[start..]
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .map_or(s.len(), |e| start + e);
        let authority = &s[start..end_auth];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) if colon + 1 < userinfo.len() => add(
                    &mut found,
                    start + colon + 1..start + at,
                    "password".into(),
                    "the password of a URL",
                ),
                None if token_like(userinfo) => {
                    add(&mut found, start..start + at, "token".into(), "a token as a URL's user")
                }
                _ => {}
            }
        }
        let end_url = s[end_auth..]
            .find(|c: char| c.is_whitespace() || c == '#')
            .map_or(s.len(), |e| end_auth + e);
        if let Some(q) = s[end_auth..end_url].find('?').map(|q| end_auth + q + 1) {
            let mut p = q;
            for pair in s[q..end_url].split('&') {
                if let Some((k, v)) = pair.split_once('=') {
                    if credential_name(k) && !v.is_empty() {
                        let vs = p + k.len() + 1;
                        add(
                            &mut found,
                            vs..vs + v.len(),
                            k.to_owned(),
                            "a credential in a URL's query",
                        );
                    }
                }
                p += pair.len() + 1;
            }
        }
        from = end_url.max(start);
    }
    // Tokens by their shape, anywhere.
    let run_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    let mut i = 0;
    while i < s.len() {
        let Some(c) = s[i..].chars().next() else { break };
        if !run_char(c) {
            i += c.len_utf8();
            continue;
        }
        let end = s[i..].find(|c: char| !run_char(c)).map_or(s.len(), |e| i + e);
        let run = s[i..end].trim_end_matches('.');
        if token_like(run) {
            add(&mut found, i..i + run.len(), "token".into(), "what looks like a token");
        }
        i = end;
    }
    found.sort_by_key(|(r, ..)| r.start);
    found
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A TOML key: bare when it can be.
fn key(k: &str) -> String {
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_owned()
    } else {
        quote(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(s: &str) -> Vec<&str> {
        found_secrets(s).into_iter().map(|(r, ..)| &s[r]).collect()
    }

    #[test]
    fn credentials_are_found_by_name_place_and_shape() {
        for k in [
            "GITHUB_TOKEN",
            "Authorization",
            "X-Api-Key",
            "apiKey",
            "GITHUB_PAT",
            "githubPat",
            "DB_PASSWD",
            "SENTRY_DSN",
            "Cookie",
        ] {
            assert!(credential_name(k), "{k}");
        }
        for k in [
            "PATH",
            "MODE",
            "TOKEN_FILE",
            "GOOGLE_APPLICATION_CREDENTIALS_PATH",
            "X-Team",
            "passport",
        ] {
            assert!(!credential_name(k), "{k}");
        }
        assert_eq!(secrets("postgresql://admin:hunter2@db:5432/app"), ["hunter2"]);
        assert_eq!(secrets("postgresql://admin@db/app"), Vec::<&str>::new());
        assert_eq!(secrets("https://x.example/mcp?api_key=zap123&mode=1"), ["zap123"]);
        assert_eq!(secrets("Bearer sk-1"), ["sk-1"]);
        assert_eq!(secrets("Authorization: Bearer abc"), ["abc"]);
        assert_eq!(secrets("--token=tok_1"), ["tok_1"]);
        assert_eq!(secrets("GITHUB_TOKEN=ghp_x"), ["ghp_x"]);
        assert_eq!(
            secrets("ghp_abcdefghijklmnopqrstuvwxyz0123"),
            ["ghp_abcdefghijklmnopqrstuvwxyz0123"]
        );
        assert_eq!(
            secrets("key is eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"),
            ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"]
        );
        assert_eq!(
            secrets("https://mcp.example/s/Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MA/mcp"),
            ["Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MA"]
        );
        for plain in [
            "-y",
            "@modelcontextprotocol/server-filesystem",
            "/Users/alice/Desktop",
            "ghcr.io/github/github-mcp-server",
            "claude-3-5-sonnet-20241022",
            "123e4567-e89b-12d3-a456-426614174000",
            "--tools=all",
            "http://localhost:3000/mcp",
            "C:\\Users\\alice\\AppData",
        ] {
            assert_eq!(secrets(plain), Vec::<&str>::new(), "{plain}");
        }
    }

    #[test]
    fn names_and_words() {
        assert_eq!(variable(&["git-hub", "x.api_key"]), "GIT_HUB_X_API_KEY");
        assert_eq!(server_name("my server@2"), "my-server-2");
        assert_eq!(words("githubPat"), ["github", "pat"]);
        assert_eq!(words("X-API-Key"), ["x", "api", "key"]);
        let mut v = Vars::default();
        assert_eq!(v.for_secret("A", "1"), "A");
        assert_eq!(v.for_secret("A", "1"), "A");
        assert_eq!(v.for_secret("A", "2"), "A_2");
    }
}
