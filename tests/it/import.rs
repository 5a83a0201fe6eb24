//! `mcp-gateway import`: the client configs people already have (samples of each format
//! under tests/fixtures/import/, written as those clients write them) become
//! `[servers.*]` tables, and no secret value reaches the output or the file.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The literal secrets of the samples: none may appear anywhere the import writes.
const SECRETS: &[&str] = &[
    "ghp_SECRETdesktop0123456789",
    "sntrys_SECRETcode0123456789",
    "SECRETpg0123456789",
    "SECRETnotion0123456789",
    "SECRETgrafana0123456789",
];

fn samples() -> Vec<PathBuf> {
    let dir = repo().join("tests/fixtures/import");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "one sample per format");
    files
}

fn import(args: &[&Path]) -> (i32, String, String) {
    let out = Command::new(BIN).arg("import").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn no_secrets(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} holds the secret {s}:\n{text}");
    }
}

#[test]
fn every_format_becomes_servers_with_secrets_as_references() {
    let files = samples();
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let (code, toml, err) = import(&refs);
    assert_eq!(code, 0, "{err}");
    no_secrets("stdout", &toml);
    no_secrets("stderr", &err);
    let t: toml::Table = toml.parse().unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let servers = t["servers"].as_table().unwrap();
    let names: Vec<&str> = servers.keys().map(String::as_str).collect();
    for n in [
        "filesystem",
        "github",
        "github-2",
        "sentry",
        "linear",
        "memory",
        "postgres-db",
        "stripe",
        "notion",
        "Perplexity",
        "fetch",
        "grafana",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    // Claude Desktop: a token in env becomes ${SERVER_KEY}.
    assert_eq!(
        servers["github"]["env"]["GITHUB_PERSONAL_ACCESS_TOKEN"].as_str(),
        Some("${GITHUB_GITHUB_PERSONAL_ACCESS_TOKEN}")
    );
    // Claude Code: a Bearer header keeps its scheme; types map to transports.
    assert_eq!(
        servers["sentry"]["headers"]["Authorization"].as_str(),
        Some("Bearer ${SENTRY_AUTHORIZATION}")
    );
    assert_eq!(servers["sentry"]["transport"].as_str(), Some("streamable-http"));
    assert_eq!(servers["linear"]["transport"].as_str(), Some("sse"));
    // A reference stays a reference; the second "github" gets a suffix, said on stderr.
    assert_eq!(
        servers["github-2"]["env"]["GITHUB_TOKEN"].as_str(),
        Some("${GITHUB_TOKEN}")
    );
    assert!(err.contains(r#"server "github" is [servers.github-2]"#), "{err}");
    // ~/.claude.json: a project's servers too, the name made valid.
    assert_eq!(
        servers["postgres-db"]["env"]["PGPASSWORD"].as_str(),
        Some("${POSTGRES_DB_PGPASSWORD}")
    );
    // Cursor and VS Code: ${env:X} and ${input:id} become ${X} and ${ID}.
    assert_eq!(
        servers["stripe"]["env"]["STRIPE_SECRET_KEY"].as_str(),
        Some("${STRIPE_SECRET_KEY}")
    );
    assert_eq!(
        servers["Perplexity"]["env"]["PERPLEXITY_API_KEY"].as_str(),
        Some("${PERPLEXITY_KEY}")
    );
    assert_eq!(
        servers["notion"]["headers"]["X-Team"].as_str(),
        Some("web"),
        "not a secret: kept"
    );
    // Windsurf: serverUrl, and a disabled server stays disabled.
    assert_eq!(
        servers["grafana"]["url"].as_str(),
        Some("https://grafana.example.com/mcp")
    );
    assert_eq!(servers["grafana"]["enabled"].as_bool(), Some(false));
    // The variables to export are listed, without values.
    for v in ["SENTRY_AUTHORIZATION", "PERPLEXITY_KEY", "NOTION_X_API_KEY"] {
        assert!(toml.contains(&format!("#   export {v}=...")), "{toml}");
    }
}

#[test]
fn write_appends_a_valid_config_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let before = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[servers.memory]\ncommand = \"npx\"\nargs = [\"-y\", \"@modelcontextprotocol/server-memory\"]\n";
    std::fs::write(&path, before).unwrap();
    let files = samples();
    let mut args: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let write = Path::new("--write");
    args.extend([write, path.as_path()]);
    let (code, out, err) = import(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty(), "--write prints no tables: {out}");
    assert!(
        err.contains(r#"server "memory" is the same as [servers.memory]; not added"#),
        "{err}"
    );
    let after = std::fs::read_to_string(&path).unwrap();
    assert!(after.starts_with(before), "appended, not rewritten");
    no_secrets("the written file", &after);
    let env = |name: &str| (!name.starts_with("OTEL_")).then(|| "x".to_owned());
    mcp_gateway::config::Config::parse(&path, &after, &env).unwrap_or_else(|e| panic!("{e}"));
    // Again: every server is already there; the file stays as it is.
    let (code, _, err) = import(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("nothing to add"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), after);
}

#[test]
fn a_file_without_servers_or_json_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("settings.json");
    std::fs::write(&bad, r#"{"editor.fontSize": 14}"#).unwrap();
    let (code, out, err) = import(&[bad.as_path()]);
    assert_eq!(code, 64);
    assert!(out.is_empty());
    assert!(
        err.contains("settings.json") && err.contains("no \"mcpServers\""),
        "{err}"
    );
    std::fs::write(&bad, "{nope").unwrap();
    let (code, _, err) = import(&[bad.as_path()]);
    assert_eq!(code, 64);
    assert!(err.contains("not JSON"), "{err}");
}
