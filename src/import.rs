//! `mcp-gateway import`: the `[servers.*]` tables for the MCP servers that client configs
//! already list (Claude Desktop, Claude Code, Cursor, VS Code, Windsurf).
//!
//! Every format is a JSON object of servers by name, under `mcpServers` (Claude Desktop,
//! Claude Code's `.mcp.json`, Cursor, Windsurf), under `servers` (VS Code, with `inputs`
//! beside it), or under each project of `~/.claude.json`. A server is `command`/`args`/
//! `env`/`cwd`, or `url` (Windsurf: `serverUrl`) with `type` and `headers`.
//!
//! Secrets never reach the output: a value of an `env` or `headers` key that names a
//! credential (`token`, `key`, `secret`, `password`, `auth`), and any `Bearer …`, is
//! replaced by a `${SERVER_KEY}` reference, listed in a comment as a variable to export.
//! VS Code's `${input:ID}` and `${env:VAR}` become `${ID}` and `${VAR}`.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// What an import made: the TOML to append, and what was done (for stderr).
#[derive(Debug, Default)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<String>,
    /// The server names, in order.
    pub names: Vec<String>,
}

/// Words that make a key's value a credential.
const SECRET_WORDS: &[&str] = &["token", "key", "secret", "password", "auth"];

/// One server as found in a file.
struct Found {
    name: String,
    spec: Map<String, Value>,
    file: String,
}

/// The servers of a gateway.toml: each name, and what it runs (see [`signature`]).
pub fn existing(toml_text: &str) -> Result<Vec<(String, String)>, String> {
    let t: toml::Table = toml_text.parse().map_err(|e| format!("{e}"))?;
    let Some(toml::Value::Table(servers)) = t.get("servers") else {
        return Ok(Vec::new());
    };
    let to_json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(Value::Null);
    Ok(servers
        .iter()
        .map(|(name, spec)| {
            let spec = match to_json(spec) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            (name.clone(), signature(&spec))
        })
        .collect())
}

/// A stdio server's `args`, references in the gateway's form.
fn args_of(spec: &Map<String, Value>) -> Vec<String> {
    match spec.get("args") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), references))
            .collect(),
        _ => Vec::new(),
    }
}

/// What a server runs: its command and arguments, or its URL. Two entries with the same
/// signature are the same server.
fn signature(spec: &Map<String, Value>) -> String {
    let s = |k: &str| spec.get(k).and_then(Value::as_str).map(references);
    if let Some(cmd) = s("command") {
        let args = args_of(spec);
        format!("command {cmd} {}", args.join(" "))
    } else {
        format!("url {}", s("url").or_else(|| s("serverUrl")).unwrap_or_default())
    }
}

/// Reads every `(file name, contents)` and makes the tables. `existing` are the servers
/// already in the gateway.toml being appended to ([`existing`]): a server that runs the
/// same thing is not added again, and a name clash gets a suffix.
pub fn import(files: &[(String, String)], existing: &[(String, String)]) -> Result<Imported, String> {
    let mut found = Vec::new();
    for (file, text) in files {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("{file}: not JSON: {e}"))?;
        let Value::Object(root) = v else {
            return Err(format!("{file}: not a JSON object"));
        };
        let before = found.len();
        collect(&root, file, &mut found);
        if let Some(Value::Object(projects)) = root.get("projects") {
            for p in projects.values().filter_map(Value::as_object) {
                collect(p, file, &mut found);
            }
        }
        if found.len() == before {
            return Err(format!("{file}: no \"mcpServers\" or \"servers\" object"));
        }
    }
    let mut out = Imported::default();
    let mut used: BTreeSet<String> = existing.iter().map(|(n, _)| n.clone()).collect();
    let mut seen: Vec<(String, String)> = existing.to_vec();
    let mut exports = Vec::new();
    let mut body = String::new();
    for f in found {
        let sig = signature(&f.spec);
        if let Some((other, _)) = seen.iter().find(|(_, s)| *s == sig) {
            out.notes.push(format!(
                "{}: server {:?} is the same as [servers.{other}]; not added",
                f.file, f.name
            ));
            continue;
        }
        let base = server_name(&f.name);
        let mut name = base.clone();
        let mut n = 2;
        while used.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        if name != f.name {
            out.notes
                .push(format!("{}: server {:?} is [servers.{name}]", f.file, f.name));
        }
        used.insert(name.clone());
        seen.push((name.clone(), sig));
        match table(&name, &f.spec, &mut exports) {
            Ok(t) => {
                body.push_str(&t);
                out.names.push(name);
            }
            Err(why) => out
                .notes
                .push(format!("{}: server {:?} skipped: {why}", f.file, f.name)),
        }
    }
    if !exports.is_empty() {
        out.toml
            .push_str("# Set these before starting the gateway (secrets the imported files held or prompted for):\n");
        for e in &exports {
            out.toml.push_str(&format!("#   export {e}=...\n"));
        }
        out.toml.push('\n');
        out.notes.push(format!(
            "{} secret values are left out; export: {}",
            exports.len(),
            exports.join(" ")
        ));
    }
    out.toml.push_str(&body);
    Ok(out)
}

/// The servers object of one JSON object (`mcpServers`, or VS Code's `servers`).
fn collect(obj: &Map<String, Value>, file: &str, found: &mut Vec<Found>) {
    for key in ["mcpServers", "servers"] {
        if let Some(Value::Object(servers)) = obj.get(key) {
            for (name, spec) in servers {
                if let Value::Object(spec) = spec {
                    found.push(Found {
                        name: name.clone(),
                        spec: spec.clone(),
                        file: file.to_owned(),
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

/// `[servers.NAME]` for one spec.
fn table(name: &str, spec: &Map<String, Value>, exports: &mut Vec<String>) -> Result<String, String> {
    let mut t = format!("[servers.{name}]\n");
    let str_of = |k: &str| spec.get(k).and_then(Value::as_str);
    if let Some(cmd) = str_of("command") {
        t.push_str(&format!("command = {}\n", quote(&references(cmd))));
        let args = args_of(spec);
        if !args.is_empty() {
            let list: Vec<String> = args.iter().map(|a| quote(a)).collect();
            t.push_str(&format!("args = [{}]\n", list.join(", ")));
        }
        if let Some(cwd) = str_of("cwd") {
            t.push_str(&format!("cwd = {}\n", quote(&references(cwd))));
        }
        if let Some(env) = spec.get("env").and_then(Value::as_object) {
            t.push_str(&format!("env = {}\n", inline(name, env, exports)));
        }
    } else if let Some(url) = str_of("url").or_else(|| str_of("serverUrl")) {
        t.push_str(&format!("url = {}\n", quote(&references(url))));
        match str_of("type").or_else(|| str_of("transport")) {
            Some("sse") => t.push_str("transport = \"sse\"\n"),
            Some("http" | "streamable-http" | "streamableHttp") => t.push_str("transport = \"streamable-http\"\n"),
            _ => {}
        }
        if let Some(headers) = spec.get("headers").and_then(Value::as_object) {
            t.push_str(&format!("headers = {}\n", inline(name, headers, exports)));
        }
    } else {
        return Err("neither \"command\" nor \"url\"".into());
    }
    if spec.get("disabled").and_then(Value::as_bool) == Some(true) {
        t.push_str("enabled = false\n");
    }
    t.push('\n');
    Ok(t)
}

/// An inline table of strings, secrets replaced by references.
fn inline(server: &str, map: &Map<String, Value>, exports: &mut Vec<String>) -> String {
    let items: Vec<String> = map
        .iter()
        .map(|(k, v)| {
            let raw = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            let value = match secret(k, &raw) {
                Some(prefix) => {
                    let var = variable(server, k);
                    exports.push(var.clone());
                    format!("{prefix}${{{var}}}")
                }
                None => {
                    exports.extend(inputs_in(&raw));
                    references(&raw)
                }
            };
            format!("{} = {}", key(k), quote(&value))
        })
        .collect();
    format!("{{ {} }}", items.join(", "))
}

/// When `value` of `key` is a credential written out: what to keep of it (`Bearer `, or
/// nothing). A value that is only references is no secret.
fn secret(key: &str, value: &str) -> Option<&'static str> {
    if let Some(rest) = value
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("bearer "))
        .map(|_| &value[7..])
    {
        return (!only_references(rest)).then_some("Bearer ");
    }
    let lower = key.to_ascii_lowercase();
    (SECRET_WORDS.iter().any(|w| lower.contains(w)) && !only_references(value)).then_some("")
}

/// Nothing but `${...}` references (and blanks): no value written out.
fn only_references(s: &str) -> bool {
    let mut rest = s;
    let mut literal = String::new();
    while let Some(i) = rest.find("${") {
        literal.push_str(&rest[..i]);
        match rest[i..].find('}') {
            Some(end) => rest = &rest[i + end + 1..],
            None => return false,
        }
    }
    literal.push_str(rest);
    literal.trim().is_empty()
}

/// The variable for a secret: `SERVER_KEY`, upper case, `_` for anything else.
fn variable(server: &str, key: &str) -> String {
    format!("{server}_{key}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// The variables that VS Code's `${input:ID}` become in `s` (values it prompted for).
fn inputs_in(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("${input:") {
        let after = &rest[i + 8..];
        let Some(end) = after.find('}') else { break };
        out.push(
            references(&format!("${{input:{}}}", &after[..end]))
                .trim_matches(['$', '{', '}'])
                .to_owned(),
        );
        rest = &after[end + 1..];
    }
    out
}

/// VS Code's `${input:ID}` and `${env:VAR}` as the gateway's `${ID}` and `${VAR}`.
fn references(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let inner = &after[..end];
        let name = inner
            .strip_prefix("input:")
            .or_else(|| inner.strip_prefix("env:"))
            .map(|n| {
                n.chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() {
                            c.to_ascii_uppercase()
                        } else {
                            '_'
                        }
                    })
                    .collect::<String>()
            })
            .unwrap_or_else(|| inner.to_owned());
        out.push_str(&format!("${{{name}}}"));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
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

    #[test]
    fn secrets_become_references_and_references_stay() {
        assert_eq!(secret("GITHUB_TOKEN", "ghp_abc"), Some(""));
        assert_eq!(secret("Authorization", "Bearer sk-1"), Some("Bearer "));
        assert_eq!(secret("Authorization", "Bearer ${TOKEN}"), None);
        assert_eq!(secret("API_KEY", "${input:api-key}"), None);
        assert_eq!(secret("MODE", "fast"), None);
        assert_eq!(
            references("a ${input:api-key} ${env:HOME} ${X:-d}"),
            "a ${API_KEY} ${HOME} ${X:-d}"
        );
        assert_eq!(variable("git-hub", "x.api_key"), "GIT_HUB_X_API_KEY");
        assert_eq!(server_name("my server@2"), "my-server-2");
        assert_eq!(
            inputs_in("${input:perplexity-key} and ${env:X}"),
            vec!["PERPLEXITY_KEY".to_owned()]
        );
    }
}
