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
//!   (`ghp_…`, `sk-…`, `xoxb-…`, a JWT, …, see [`secrets::token_like`]) and a long random-looking run of
//!   letters and digits;
//! - in `args`: the value of a flag or `NAME=VALUE` that names a credential (`--api-key X`,
//!   `--token=X`, `-e GITHUB_TOKEN=X`, `--header "Authorization: Bearer X"`).
//!
//! The gateway expands `${VAR}` in `args`, `env`, `url` and `headers`; a secret found in a
//! `command` or `cwd`, which it does not expand, leaves that server out, with a note.

pub(crate) mod secrets;

use secrets::{credential_name, found_secrets, scheme_split, setting_value};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap, HashSet};
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

/// One server as found in a file.
struct Found {
    name: String,
    spec: Map<String, Value>,
    file: String,
    format: Format,
    /// `${workspaceFolder}`, when the file sits in a project's `.vscode`/`.cursor`.
    workspace: Option<PathBuf>,
}

/// What a gateway.toml being appended to already has.
#[derive(Debug, Default)]
pub struct Existing {
    /// Each server's name, and what it runs (see [`signature`]).
    pub servers: Vec<(String, String)>,
    /// Every `${NAME}` it uses: a secret found now gets another name.
    pub vars: Vec<String>,
}

/// The servers and variables of a gateway.toml.
pub fn existing(toml_text: &str) -> Result<Existing, String> {
    let t: toml::Table = toml_text.parse().map_err(|e| format!("{e}"))?;
    let vars = references_in(toml_text);
    let Some(toml::Value::Table(servers)) = t.get("servers") else {
        return Ok(Existing {
            servers: Vec::new(),
            vars,
        });
    };
    let s = |spec: &toml::Value, k: &str| spec.get(k).and_then(toml::Value::as_str).map(str::to_owned);
    let table = |spec: &toml::Value, k: &str| -> Vec<(String, String)> {
        spec.get(k)
            .and_then(toml::Value::as_table)
            .map(|t| {
                t.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let servers = servers
        .iter()
        .map(|(name, spec)| {
            let args: Vec<String> = spec
                .get("args")
                .and_then(toml::Value::as_array)
                .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect())
                .unwrap_or_default();
            let sig = signature(&Run {
                command: s(spec, "command"),
                args,
                url: s(spec, "url"),
                env: table(spec, "env"),
                headers: table(spec, "headers"),
            });
            (name.clone(), sig)
        })
        .collect();
    Ok(Existing { servers, vars })
}

/// The names of every `${NAME…}` in a text (a gateway.toml, a client's value).
fn references_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find('}') else { break };
        let inner = &rest[..end];
        let inner = inner.split_once(":-").map_or(inner, |(v, _)| v);
        let name = match inner.split_once(':') {
            Some(("env", v)) => v.to_owned(),
            Some(("input", id)) => variable(&[id]),
            Some(_) => continue,
            None => inner.to_owned(),
        };
        if ident(&name) {
            out.push(name);
        }
        rest = &rest[end + 1..];
    }
    out
}

/// What a server runs, as the gateway's TOML has it.
struct Run {
    command: Option<String>,
    args: Vec<String>,
    url: Option<String>,
    env: Vec<(String, String)>,
    headers: Vec<(String, String)>,
}

/// A server's command, arguments, URL, env and headers, with every `${…}` as `${}` (the
/// variable a secret became is named after the server, which may have a suffix): an
/// imported server with the same signature as one already in the file is not added again.
fn signature(run: &Run) -> String {
    let mut env = run.env.clone();
    env.sort();
    let mut headers = run.headers.clone();
    headers.sort();
    let s = serde_json::json!([run.command, run.args, run.url, env, headers]).to_string();
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

/// Reads every file and makes the tables. `existing`: what the gateway.toml being
/// appended to has ([`existing`]): a server that runs the same thing is not added again, a
/// name clash gets a suffix, and its variables are not reused for other values. `home` is
/// the user's home folder (a `.cursor` or `.vscode` folder right in it is the global
/// config, with no workspace).
pub fn import(files: &[Source], existing: &Existing, home: Option<&Path>) -> Result<Imported, String> {
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
        let mut any = collect(&root, &file, format, &workspace, &mut found, &mut out.notes);
        if let Some(Value::Object(projects)) = root.get("projects") {
            for p in projects.values().filter_map(Value::as_object) {
                any |= collect(p, &file, format, &workspace, &mut found, &mut out.notes);
            }
        }
        if !any && found.len() == before {
            return Err(format!("{file}: no \"mcpServers\" or \"servers\" object"));
        }
    }
    let mut used: BTreeSet<String> = existing.servers.iter().map(|(n, _)| n.clone()).collect();
    // The client's own references and the file's: a secret's variable takes another name.
    let mut vars = Vars::default();
    vars.reserved.extend(existing.vars.iter().cloned());
    for f in &found {
        vars.reserved
            .extend(references_in(&serde_json::to_string(&f.spec).unwrap_or_default()));
    }
    // Servers listed twice as they are (a project's and the user's): added once.
    let mut exact: HashSet<String> = HashSet::new();
    let mut body = String::new();
    for f in found {
        let shown = f.shown();
        let raw = serde_json::to_string(&f.spec).unwrap_or_default();
        if !exact.insert(raw) {
            out.notes.push(format!(
                "{}: server {shown} is listed again, the same; added once",
                f.file
            ));
            continue;
        }
        let base = f.base_name();
        let mut name = base.clone();
        let mut n = 2;
        while used.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        let mark = vars.mark();
        let mut server = Server {
            name: &name,
            found: &f,
            home,
            vars: &mut vars,
            notes: Vec::new(),
        };
        let made = server.table();
        let notes = std::mem::take(&mut server.notes);
        let (table, sig) = match made {
            Ok(t) => t,
            Err(why) => {
                vars.back_to(mark);
                out.notes.push(format!("{}: server {shown} skipped: {why}", f.file));
                continue;
            }
        };
        if let Some((other, _)) = existing.servers.iter().find(|(_, s)| *s == sig) {
            vars.back_to(mark);
            out.notes.push(format!(
                "{}: server {shown} is the same as [servers.{other}]; not added",
                f.file
            ));
            continue;
        }
        if name != f.name {
            out.notes
                .push(format!("{}: server {shown} is [servers.{name}]", f.file));
        }
        out.notes.extend(notes);
        used.insert(name.clone());
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

/// The servers object of one JSON object (`mcpServers`, or VS Code's `servers`); whether
/// it had one. A server that is not an object is said and left out.
fn collect(
    obj: &Map<String, Value>,
    file: &str,
    format: Format,
    workspace: &Option<PathBuf>,
    found: &mut Vec<Found>,
    notes: &mut Vec<String>,
) -> bool {
    let mut any = false;
    for key in ["mcpServers", "servers"] {
        if let Some(Value::Object(servers)) = obj.get(key) {
            any = true;
            for (name, spec) in servers {
                let f = Found {
                    name: name.clone(),
                    spec: spec.as_object().cloned().unwrap_or_default(),
                    file: file.to_owned(),
                    format,
                    workspace: workspace.clone(),
                };
                if spec.is_object() {
                    found.push(f);
                } else {
                    notes.push(format!("{file}: server {} skipped: not a JSON object", f.shown()));
                }
            }
        }
    }
    any
}

/// A value of the file's as a note repeats it (a `type`, a `${…}` the gateway cannot fill
/// in): escaped (`quoted`: and in quotes), or not at all when it holds what looks like a
/// credential.
fn shown_value(v: &str, quoted: bool) -> String {
    match (found_secrets(v, true).is_empty(), quoted) {
        (false, _) => "(a value that looks like a credential)".to_owned(),
        (true, true) => format!("{v:?}"),
        (true, false) => v.escape_debug().to_string(),
    }
}

impl Found {
    /// The server's name for stderr: quoted and escaped, or not at all when it looks like
    /// a credential.
    fn shown(&self) -> String {
        if found_secrets(&self.name, true).is_empty() {
            format!("{:?}", self.name)
        } else {
            "(a name that looks like a credential)".to_owned()
        }
    }

    /// The table name it starts from: its own made valid, or `server` when its own looks
    /// like a credential.
    fn base_name(&self) -> String {
        if found_secrets(&self.name, true).is_empty() {
            server_name(&self.name)
        } else {
            "server".to_owned()
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
#[derive(Default)]
struct Vars {
    list: Vec<(String, Option<String>)>,
    /// Where each name is in `list`.
    index: HashMap<String, usize>,
    /// Names a secret's variable must not take: the client's own references and the
    /// gateway.toml's.
    reserved: HashSet<String>,
}

impl Vars {
    /// The variable for `secret`: `base`, or `base_2`… when `base` already stands for
    /// another value or is reserved; the same one again for the same value.
    fn for_secret(&mut self, base: &str, secret: &str) -> String {
        let mut name = base.to_owned();
        let mut n = 2;
        loop {
            match self.index.get(&name).map(|&i| &self.list[i].1) {
                None if !self.reserved.contains(&name) => {
                    self.push(name.clone(), Some(secret.to_owned()));
                    return name;
                }
                Some(Some(s)) if s == secret => return name,
                _ => {
                    name = format!("{base}_{n}");
                    n += 1;
                }
            }
        }
    }

    /// A variable the user sets themselves (a VS Code input, a workspace folder, a
    /// default left out).
    fn asked(&mut self, name: &str) {
        if !self.index.contains_key(name) {
            self.push(name.to_owned(), None);
        }
    }

    fn push(&mut self, name: String, secret: Option<String>) {
        self.index.insert(name.clone(), self.list.len());
        self.list.push((name, secret));
    }

    /// How many there are now, for [`Vars::back_to`].
    fn mark(&self) -> usize {
        self.list.len()
    }

    /// Forgets the variables since `mark` (a server left out).
    fn back_to(&mut self, mark: usize) {
        for (name, _) in self.list.drain(mark..) {
            self.index.remove(&name);
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
    vars: &'a mut Vars,
    notes: Vec<String>,
}

impl Server<'_> {
    /// `[servers.NAME]`, and what it runs ([`signature`]).
    fn table(&mut self) -> Result<(String, String), String> {
        let spec = &self.found.spec;
        let name = self.name;
        let mut t = format!("[servers.{name}]\n");
        let str_of = |k: &str| spec.get(k).and_then(Value::as_str);
        let kind = str_of("type").or_else(|| str_of("transport"));
        if let Some(k) = kind.filter(|k| !matches!(*k, "stdio" | "sse" | "http" | "streamable-http" | "streamableHttp"))
        {
            return Err(format!(
                "its type {} is not one the gateway speaks (stdio, http, sse)",
                shown_value(k, true)
            ));
        }
        let mut run = Run {
            command: None,
            args: Vec::new(),
            url: None,
            env: Vec::new(),
            headers: Vec::new(),
        };
        if let Some(cmd) = str_of("command") {
            if spec.contains_key("url") || spec.contains_key("serverUrl") {
                self.note("has both command and url: imported as a stdio server, its url left out".into());
            }
            let cmd = self.plain("command", cmd)?;
            t.push_str(&format!("command = {}\n", quote(&cmd)));
            let raw: Vec<String> = match spec.get("args") {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect(),
                None | Some(Value::Null) => Vec::new(),
                Some(_) => return Err("its args are not a list".into()),
            };
            run.args = self.args(&raw)?;
            if !run.args.is_empty() {
                let list: Vec<String> = run.args.iter().map(|a| quote(a)).collect();
                t.push_str(&format!("args = [{}]\n", list.join(", ")));
            }
            if let Some(cwd) = str_of("cwd") {
                let cwd = self.plain("cwd", cwd)?;
                t.push_str(&format!("cwd = {}\n", quote(&cwd)));
            }
            run.env = self.pairs("env")?;
            if !run.env.is_empty() {
                t.push_str(&format!("env = {}\n", inline(&run.env)));
            }
            if spec.contains_key("envFile") {
                self.note("envFile is not imported: put its variables in `env` (as ${VAR} references)".into());
            }
            run.command = Some(cmd);
        } else if let Some(url) = str_of("url").or_else(|| str_of("serverUrl")) {
            let parts = self.read("url", url)?;
            let url = render(self.scan("url", parts, None));
            t.push_str(&format!("url = {}\n", quote(&url)));
            match kind {
                Some("sse") => t.push_str("transport = \"sse\"\n"),
                Some("http" | "streamable-http" | "streamableHttp") => t.push_str("transport = \"streamable-http\"\n"),
                _ => {}
            }
            run.headers = self.pairs("headers")?;
            if !run.headers.is_empty() {
                t.push_str(&format!("headers = {}\n", inline(&run.headers)));
            }
            run.url = Some(url);
        } else {
            return Err("neither \"command\" nor \"url\"".into());
        }
        match spec.get("disabled") {
            Some(Value::Bool(true)) => t.push_str("enabled = false\n"),
            None | Some(Value::Bool(false) | Value::Null) => {}
            Some(other) => self.note(format!(
                "its \"disabled\" is {}, not true or false: imported as enabled",
                json_kind(other)
            )),
        }
        t.push('\n');
        Ok((t, signature(&run)))
    }

    fn note(&mut self, what: String) {
        self.notes
            .push(format!("{}: server {}: {what}", self.found.file, self.found.shown()));
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
        if !found_secrets(&text, false).is_empty() {
            return Err(format!(
                "its {field} holds what looks like a credential, and the gateway cannot take it from the environment there"
            ));
        }
        Ok(text)
    }

    /// `args`, each read, its secrets replaced, as the gateway's strings. A flag that
    /// names a credential makes the next argument one (`--api-key X`), unless that is a
    /// setting (`--auth oauth`); so does the same in one argument (`"--token X"`).
    fn args(&mut self, raw: &[String]) -> Result<Vec<String>, String> {
        let mut read = Vec::with_capacity(raw.len());
        for (i, a) in raw.iter().enumerate() {
            read.push(self.read(&format!("args[{i}]"), a)?);
        }
        let flag = |t: &str| {
            let name = t.trim_start_matches('-');
            (t.starts_with('-') && !name.is_empty() && !t.contains('=') && credential_name(name))
                .then(|| name.to_owned())
        };
        // mysql, mysqldump and sshpass take a password as `-p X` or `-pX`; elsewhere `-p`
        // is a port or a path.
        let command = self
            .found
            .spec
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let short_p = std::iter::once(command)
            .chain(raw.iter().map(String::as_str))
            .any(|a| ["mysql", "mariadb", "sshpass"].iter().any(|t| a.contains(t)));
        let mut out = Vec::with_capacity(read.len());
        let mut next_is_secret: Option<String> = None;
        for (i, parts) in read.into_iter().enumerate() {
            let field = format!("args[{i}]");
            let whole = match &parts[..] {
                [Part::Text(t)] => Some(t.clone()),
                _ => None,
            };
            if let (Some(name), Some(t)) = (next_is_secret.take(), &whole) {
                if !t.starts_with('-') && !setting_value(t) {
                    let var = self.secret_var(&[&name], t, &field, &format!("the value of --{name}"));
                    out.push(render(vec![Part::Var(var, None)]));
                    continue;
                }
            }
            if let Some(t) = whole.as_deref().filter(|_| short_p) {
                if t == "-p" {
                    next_is_secret = Some("password".into());
                    out.push(render(parts));
                    continue;
                }
                if let Some(pw) = t.strip_prefix("-p").filter(|pw| !pw.is_empty()) {
                    let var = self.secret_var(&["password"], pw, &field, "the value of -p");
                    out.push(render(vec![Part::Text("-p".into()), Part::Var(var, None)]));
                    continue;
                }
            }
            if let Some(t) = &whole {
                match t.split_once(' ') {
                    Some((f, v)) if flag(f).is_some() && !setting_value(v) => {
                        let name = flag(f).unwrap_or_default();
                        let var = self.secret_var(&[&name], v, &field, &format!("the value of --{name}"));
                        out.push(render(vec![Part::Text(format!("{f} ")), Part::Var(var, None)]));
                        continue;
                    }
                    _ => next_is_secret = flag(t),
                }
            }
            let parts = self.scan(&field, parts, None);
            out.push(render(parts));
        }
        Ok(out)
    }

    /// `env` or `headers` as the gateway's strings, secrets replaced by references. A
    /// value that is not a string is its JSON text.
    fn pairs(&mut self, field: &str) -> Result<Vec<(String, String)>, String> {
        let map = match self.found.spec.get(field) {
            Some(Value::Object(m)) => m.clone(),
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(_) => return Err(format!("its {field} is not an object")),
        };
        let mut out = Vec::with_capacity(map.len());
        for (k, v) in &map {
            let at = format!("{field}.{}", k.escape_debug());
            // A number or a boolean is its text, as clients pass it; what has no text of
            // its own is said (never shown: it may be a secret).
            match v {
                Value::Null => {
                    self.note(format!("{at} is null: left out"));
                    continue;
                }
                Value::Array(_) | Value::Object(_) => {
                    self.note(format!(
                        "{at} is {}, not a string: imported as its JSON text",
                        json_kind(v)
                    ));
                }
                _ => {}
            }
            let raw = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let parts = self.read(&at, &raw)?;
            let parts = self.scan(&at, parts, Some(k));
            out.push((k.clone(), render(parts)));
        }
        Ok(out)
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
                        "{field}: {} is filled in by VS Code, and the gateway has no value for it",
                        shown_value(whole, false)
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

    /// A Claude Code default (`${VAR:-default}`), unless it is itself a credential: then
    /// the variable has none, and is listed to export.
    fn default_kept(&mut self, field: &str, var: &str, default: &str) -> Option<String> {
        let secret = !found_secrets(default, true).is_empty() || (credential_name(var) && !setting_value(default));
        if !secret {
            return Some(default.to_owned());
        }
        self.vars.asked(var);
        self.note(format!(
            "{field}: the default of ${{{var}}} looks like a credential; it is left out (export {var})"
        ));
        None
    }

    /// The parts with every secret in their text replaced by a variable. `key`: the `env`
    /// or `headers` key the value is of.
    fn scan(&mut self, field: &str, parts: Vec<Part>, key: Option<&str>) -> Vec<Part> {
        // A default of a variable in a credential's value is the credential, whatever the
        // variable is named (`PGPASSWORD = "${PGPW:-hunter2}"`): left out, the variable asked.
        let parts = match key.filter(|k| credential_name(k)) {
            Some(_) => parts
                .into_iter()
                .map(|p| match p {
                    Part::Var(v, Some(d)) if !setting_value(&d) => {
                        self.vars.asked(&v);
                        self.note(format!(
                            "{field}: the default of ${{{v}}} is a credential, by its key's name; it is left out (export {v})"
                        ));
                        Part::Var(v, None)
                    }
                    p => p,
                })
                .collect(),
            None => parts,
        };
        // Text of its own beyond separators (`${A}-${B}` is only references).
        let written = parts
            .iter()
            .any(|p| matches!(p, Part::Text(t) if t.chars().any(char::is_alphanumeric)));
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
            if only_refs || setting_value(&text) {
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
            for (range, hint, why) in found_secrets(&t, true) {
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

/// A TOML basic string on one line: `"` and `\\` escaped, and every control character
/// (a newline in a key would otherwise make a multi-line string, which a key cannot be).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An inline table of strings.
fn inline(pairs: &[(String, String)]) -> String {
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{} = {}", key(k), quote(v)))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

/// A TOML key: bare when it can be.
fn key(k: &str) -> String {
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_owned()
    } else {
        quote(k)
    }
}

/// What kind of JSON value `v` is, for a note (its value is never shown).
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_quotes_and_variables() {
        assert_eq!(variable(&["git-hub", "x.api_key"]), "GIT_HUB_X_API_KEY");
        assert_eq!(server_name("my server@2"), "my-server-2");
        let mut v = Vars::default();
        v.reserved.insert("B".into());
        assert_eq!(v.for_secret("A", "1"), "A");
        assert_eq!(v.for_secret("A", "1"), "A");
        assert_eq!(v.for_secret("A", "2"), "A_2");
        assert_eq!(v.for_secret("B", "3"), "B_2", "a reserved name is not taken");
        let mark = v.mark();
        v.for_secret("C", "4");
        v.back_to(mark);
        assert_eq!(v.list.len(), 3);
        assert!(!v.index.contains_key("C"));
        for text in ["a = 1\n[gateway]", "q\"uo'te", "tab\tnul\u{0}del\u{7f}", "back\\slash"] {
            let line = format!("{} = {}", quote(text), quote(text));
            let t: toml::Table = line.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(t[text].as_str(), Some(text));
            assert!(!line.contains('\n'));
        }
        assert_eq!(
            references_in("${A} ${env:B} ${input:c-d} ${E:-x} ${command:f} $${G}"),
            ["A", "B", "C_D", "E", "G"]
        );
    }
}
