//! `mcp-gateway import`: the client configs people already have (samples of each format
//! under tests/fixtures/import/, written as those clients write them) become
//! `[servers.*]` tables, and no secret value reaches the output or the file.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The literal secrets of the samples: none may appear anywhere the import writes.
const SECRETS: &[&str] = &[
    "SECRETdesktop0123456789",
    "sntrys_SECRETcode0123456789",
    "SECRETpg0123456789",
    "SECRETpgurl0123456789",
    "SECRETbrave0123456789",
    "SECRETstripe0123456789",
    "SECRETnotion0123456789",
    "SECRETgrafana0123456789",
    "SECRETzapier0123456789",
    "SECRETnotionjson0123456789",
    "SECRETmysql0123456789",
    "SECRETlibpq0123456789",
    // Smithery's `?config=`, base64 of `{"githubPersonalAccessToken":"SECRETsmithery…"}`,
    // and Composio's server id.
    "eyJnaXRodWJQZXJzb25hbEFjY2Vzc1Rva2VuIjoiU0VDUkVUc21pdGhlcnkwMTIzNDU2Nzg5In0",
    "5e0b7c1a-93d2-4f6e-b8a1-0c2d3e4f5a6b",
];

/// Every sample, at the place its client keeps it (`.cursor/mcp.json`, `.vscode/mcp.json`,
/// …), in path order.
fn samples() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("tests/fixtures/import"), &mut files);
    files.sort();
    assert_eq!(files.len(), 6, "one sample per format, two for Claude Code: {files:?}");
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
        "postgres",
        "brave-search",
        "sentry",
        "linear",
        "memory",
        "postgres-db",
        "stripe",
        "notion",
        "docs",
        "Perplexity",
        "fetch",
        "grafana",
        "zapier",
        "github-smithery",
        "gmail",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    let args = |s: &str| -> Vec<&str> {
        servers[s]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect()
    };
    // Claude Code: a Bearer header keeps its scheme; types map to transports; a
    // reference stays a reference.
    assert_eq!(
        servers["sentry"]["headers"]["Authorization"].as_str(),
        Some("Bearer ${SENTRY_AUTHORIZATION}")
    );
    assert_eq!(servers["sentry"]["transport"].as_str(), Some("streamable-http"));
    assert_eq!(servers["linear"]["transport"].as_str(), Some("sse"));
    assert_eq!(
        servers["github"]["env"]["GITHUB_TOKEN"].as_str(),
        Some("${GITHUB_TOKEN}")
    );
    // ~/.claude.json: a project's servers too, the name made valid.
    assert_eq!(
        servers["postgres-db"]["env"]["PGPASSWORD"].as_str(),
        Some("${POSTGRES_DB_PGPASSWORD}")
    );
    // Claude Desktop: a token in env; the second "github" gets a suffix, said on stderr.
    assert_eq!(
        servers["github-2"]["env"]["GITHUB_PERSONAL_ACCESS_TOKEN"].as_str(),
        Some("${GITHUB_2_GITHUB_PERSONAL_ACCESS_TOKEN}")
    );
    assert!(err.contains(r#"server "github" is [servers.github-2]"#), "{err}");
    // Secrets in arguments: a URL's password, a flag's value; the rest stays as written.
    assert_eq!(
        args("postgres")[2],
        "postgresql://app:${POSTGRES_PASSWORD}@db.internal:5432/shop"
    );
    assert!(
        err.contains(r#"server "postgres": args[2] holds the password of a URL; it is ${POSTGRES_PASSWORD} now"#),
        "{err}"
    );
    assert_eq!(args("brave-search")[3], "${BRAVE_SEARCH_API_KEY}");
    // Claude Desktop expands nothing: its `$` stay literal (`$$` to the gateway).
    assert_eq!(args("brave-search")[5], "$${NOT_EXPANDED}$$5");
    assert_eq!(args("stripe")[3], "--api-key=${STRIPE_API_KEY}");
    // Inside JSON text, a connection string, after mysql's -p; the rest as written.
    assert_eq!(
        servers["notion-api"]["env"]["OPENAPI_MCP_HEADERS"].as_str(),
        Some(r#"{"Authorization": "Bearer ${NOTION_API_OPENAPI_MCP_HEADERS_TOKEN}", "Notion-Version": "2022-06-28"}"#)
    );
    assert_eq!(args("mysql")[5], "${MYSQL_PASSWORD}");
    assert_eq!(
        servers["mysql"]["env"]["MYSQL_DSN_OPTIONS"].as_str(),
        Some("host=db user=app password=${MYSQL_MYSQL_DSN_OPTIONS_PASSWORD} sslmode=require")
    );
    // Settings under a credential-like name, package and model names: kept as written.
    assert_eq!(
        args("llm"),
        [
            "pypi-query-mcp-server",
            "--max-tokens",
            "4096",
            "--auth",
            "oauth",
            "--model",
            "claude-3-5-sonnet-20241022"
        ]
    );
    let llm = servers["llm"]["env"].as_table().unwrap();
    for (k, v) in [
        ("MAX_TOKENS", "4096"),
        ("ENABLE_AUTH", "false"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("line\nbreak", "kept"),
    ] {
        assert_eq!(llm[k].as_str(), Some(v), "{k}");
    }
    // Cursor and VS Code: ${env:X}, ${input:id} and ${userHome} become ${X}, ${ID} and
    // ${HOME}; ${workspaceFolder} is the project the file is in.
    assert_eq!(
        servers["stripe"]["env"]["STRIPE_SECRET_KEY"].as_str(),
        Some("${STRIPE_SECRET_KEY}")
    );
    let project = repo().join("tests/fixtures/import/cursor");
    assert_eq!(
        args("docs"),
        [
            "--root",
            &format!("{}/docs", project.display()),
            "--cache",
            "${HOME}/.cache"
        ]
    );
    assert!(
        servers["docs"]["command"]
            .as_str()
            .unwrap()
            .ends_with("/.local/bin/docs-mcp")
            && !servers["docs"]["command"].as_str().unwrap().contains('$'),
        "the gateway does not expand a command: the home folder is written out"
    );
    assert_eq!(
        servers["Perplexity"]["env"]["PERPLEXITY_API_KEY"].as_str(),
        Some("${PERPLEXITY_KEY}")
    );
    assert_eq!(servers["Perplexity"]["env"]["HOME_DIR"].as_str(), Some("${HOME}"));
    assert_eq!(
        servers["notion"]["headers"]["X-Team"].as_str(),
        Some("web"),
        "not a secret: kept"
    );
    // A variable only VS Code can fill leaves its server out, said why.
    assert!(!names.contains(&"editor"), "{names:?}");
    assert!(
        err.contains(r#"server "editor" skipped: args[0]: ${command:pickFolder} is filled in by VS Code"#),
        "{err}"
    );
    // Windsurf: serverUrl, a disabled server stays disabled, a key in a URL's query.
    assert_eq!(
        servers["grafana"]["url"].as_str(),
        Some("https://grafana.example.com/mcp")
    );
    assert_eq!(servers["grafana"]["enabled"].as_bool(), Some(false));
    assert_eq!(
        servers["zapier"]["url"].as_str(),
        Some("https://mcp.zapier.example/api/mcp?api_key=${ZAPIER_API_KEY}")
    );
    // Smithery's configuration in base64 and Composio's id in the path: whole, as
    // variables.
    assert_eq!(
        servers["github-smithery"]["url"].as_str(),
        Some("https://server.smithery.example/@smithery-ai/github/mcp?config=${GITHUB_SMITHERY_CONFIG}&profile=work")
    );
    assert_eq!(
        servers["gmail"]["url"].as_str(),
        Some("https://mcp.composio.example/composio/server/${GMAIL_ID}/mcp?include_composio_helper_actions=true")
    );
    // The variables to export are listed, without values.
    for v in [
        "SENTRY_AUTHORIZATION",
        "PERPLEXITY_KEY",
        "NOTION_X_API_KEY",
        "POSTGRES_PASSWORD",
        "BRAVE_SEARCH_API_KEY",
        "STRIPE_API_KEY",
        "ZAPIER_API_KEY",
        "GITHUB_SMITHERY_CONFIG",
        "GMAIL_ID",
    ] {
        assert!(toml.contains(&format!("#   export {v}=...")), "{toml}");
    }
}

/// The import's output runs: the gateway expands the references it wrote in `args` and
/// `env`, so the server gets exactly the values the client config held, `$` included.
#[test]
fn an_imported_server_gets_its_secrets_back_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let desktop = dir.path().join("claude_desktop_config.json");
    let script = repo().join("tests/fixtures/mock_server.py");
    let config = serde_json::json!({"mcpServers": {"vault": {
        "command": "python3",
        "args": [script, "--name", "sk-SECRETargv0123456789ab"],
        "env": {"API_TOKEN": "tok-SECRETenv0123456789", "NOTE": "costs $5, ${not} a variable"}
    }}});
    std::fs::write(&desktop, config.to_string()).unwrap();
    let (code, toml, err) = import(&[desktop.as_path()]);
    assert_eq!(code, 0, "{err}");
    for s in ["SECRETargv", "SECRETenv"] {
        assert!(!toml.contains(s) && !err.contains(s), "{s} written out:\n{toml}\n{err}");
    }
    assert!(
        toml.contains("#   export VAULT_TOKEN=...") && toml.contains("#   export VAULT_API_TOKEN=..."),
        "{toml}"
    );
    let mut gw = StdioGateway::start(
        &toml,
        &[
            ("VAULT_TOKEN", "sk-SECRETargv0123456789ab"),
            ("VAULT_API_TOKEN", "tok-SECRETenv0123456789"),
        ],
    );
    gw.initialize();
    let env = |gw: &mut StdioGateway, id: i64, name: &str| {
        let (_, r) = gw.request(
            serde_json::json!(id),
            "tools/call",
            serde_json::json!({"name": "vault__env", "arguments": {"name": name}}),
        );
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(env(&mut gw, 2, "API_TOKEN"), "tok-SECRETenv0123456789");
    assert_eq!(env(&mut gw, 3, "NOTE"), "costs $5, ${not} a variable");
    let (_, r) = gw.request(
        serde_json::json!(4),
        "resources/read",
        serde_json::json!({"uri": "mock://sk-SECRETargv0123456789ab/readme"}),
    );
    assert_eq!(
        r["result"]["contents"][0]["text"].as_str(),
        Some("readme of sk-SECRETargv0123456789ab"),
        "the argument reached the server expanded: {r}"
    );
    assert!(!gw.logs().contains("SECRETargv"), "{}", gw.logs());
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

/// `--write` onto a symlink to nothing, or onto what is no regular file, is refused by
/// name: nothing is created where the link points, and a FIFO does not block the import.
#[test]
fn write_refuses_a_dangling_symlink_and_what_is_no_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("gateway.toml");
    let target = dir.path().join("elsewhere").join("planted.toml");
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fifo = dir.path().join("fifo.toml");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let files = samples();
    for (path, why) in [(&link, "which does not exist"), (&fifo, "not a regular file")] {
        let mut args: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
        args.extend([Path::new("--write"), path.as_path()]);
        let (code, out, err) = import_within_10s(&args);
        assert_ne!(code, 0, "{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(&*path.to_string_lossy()) && err.contains(why), "{err}");
    }
    assert!(!target.exists(), "nothing was created where the link points");
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

/// A default of a variable in a credential's value (by its key's name) is the credential,
/// whatever the variable is called: left out, and the variable named to export. A default
/// in a setting stays.
#[test]
fn a_credentials_default_is_left_out_by_its_keys_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"pg": {"command": "pg-mcp", "env": {"PGPASSWORD": "${PGPW:-hunter2pass}", "API_KEY": "${X:-changeme123}", "MODE": "${M:-fast}"}}}}"#,
    )
    .unwrap();
    let (code, out, err) = import(&[Path::new("--from"), Path::new("claude-code"), &file]);
    assert_eq!(code, 0, "{err}");
    for secret in ["hunter2pass", "changeme123"] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{secret}:\n{out}\n{err}"
        );
    }
    assert!(
        out.contains(r#"PGPASSWORD = "${PGPW}""#) && out.contains(r#"API_KEY = "${X}""#),
        "{out}"
    );
    assert!(out.contains(r#"MODE = "${M:-fast}""#), "{out}");
    assert!(out.contains("export PGPW=") && out.contains("export X="), "{out}");
}

/// Two `import --write` at once onto one file: each reads it under a lock held until its
/// tables are appended, so the second sees the first's and adds nothing twice.
#[test]
fn two_imports_writing_one_file_at_once_add_each_server_once() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join(".mcp.json");
    std::fs::write(
        &json,
        r#"{"mcpServers": {"gh": {"command": "gh-mcp"}, "fs": {"command": "fs-mcp"}}}"#,
    )
    .unwrap();
    let toml = dir.path().join("gateway.toml");
    for round in 0..10 {
        std::fs::write(&toml, "[servers.old]\ncommand = \"echo\"\n").unwrap();
        let spawn = || {
            Command::new(BIN)
                .args(["import", "--from", "claude-code", "--write"])
                .arg(&toml)
                .arg(&json)
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let (mut a, mut b) = (spawn(), spawn());
        assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
        let text = std::fs::read_to_string(&toml).unwrap();
        for table in ["[servers.gh]", "[servers.fs]"] {
            assert_eq!(text.matches(table).count(), 1, "round {round}:\n{text}");
        }
    }
}

/// A server left out is said on stderr with why, but a value that looks like a credential
/// (a token pasted into `type`, inside an editor's `${command:…}`) is not repeated there;
/// an ordinary value still is.
#[test]
fn a_skipped_servers_reason_never_prints_a_credential() {
    const TOKEN: &str = "ghp_SECRETtype0123456789abcdefABCDEF012345";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    let config = serde_json::json!({"servers": {
        "typed": {"type": TOKEN, "command": "x"},
        "carried": {"transport": format!("Bearer {TOKEN}"), "url": "https://h.example/mcp"},
        "asked": {"command": "x", "args": [format!("${{command:{TOKEN}}}")]},
        "socket": {"type": "ws", "url": "wss://h.example/mcp"},
        "picked": {"command": "x", "args": ["${command:pickFile}"]},
    }});
    std::fs::write(&file, config.to_string()).unwrap();
    let (code, out, err) = import(&[Path::new("--from"), Path::new("vscode"), &file]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(TOKEN) && !err.contains(TOKEN), "{out}\n{err}");
    for name in ["typed", "carried", "asked", "socket", "picked"] {
        assert!(err.contains(&format!("server \"{name}\" skipped")), "{name}: {err}");
    }
    assert!(err.contains("\"ws\"") && err.contains("${command:pickFile}"), "{err}");
}

/// What is no regular file (a FIFO, which would block the read, a device that never ends)
/// is refused at once, by name, and nothing is printed.
#[test]
fn a_fifo_or_a_device_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("mcp.json");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for path in [fifo.as_path(), Path::new("/dev/zero")] {
        let (code, out, err) = import_within_10s(&[path]);
        assert_eq!(code, 64, "{err}");
        assert!(out.is_empty());
        assert!(
            err.contains(&*path.to_string_lossy()) && err.contains("not a regular file"),
            "{err}"
        );
    }
}

/// As [`import`], killed and failing the test if it has not ended within 10 s (what a
/// FIFO or a device would do to a read that waits).
fn import_within_10s(args: &[&Path]) -> (i32, String, String) {
    let child = Command::new(BIN)
        .arg("import")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output().unwrap();
        let _ = tx.send(());
        out
    });
    if rx.recv_timeout(std::time::Duration::from_secs(10)).is_err() {
        // SAFETY: the child this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        panic!("import {args:?} did not end");
    }
    let out = waiter.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a client config holds that has no plain meaning here is said on stderr, never
/// silently turned into a string: a `disabled` that is no boolean (imported as enabled), an
/// env value that is null (left out) or an object (its JSON text). Values are not shown.
#[test]
fn values_without_a_plain_meaning_are_said_not_silently_converted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"odd": {"command": "odd-server", "disabled": "yes",
            "env": {"GONE": null, "CONF": {"secretish": "s3cr3t-value"}, "PORT": 8080}}}}"#,
    )
    .unwrap();
    let (code, out, err) = import(&[file.as_path()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(r#"its "disabled" is a string, not true or false: imported as enabled"#),
        "{err}"
    );
    assert!(err.contains("env.GONE is null: left out"), "{err}");
    assert!(err.contains("env.CONF is an object, not a string"), "{err}");
    assert!(!err.contains("s3cr3t-value"), "{err}");
    assert!(!out.contains("GONE") && !out.contains("enabled = false"), "{out}");
    assert!(out.contains(r#"PORT = "8080""#), "{out}");
}

/// RFC 6750 allows one or more spaces after `Bearer` (`"Bearer" 1*SP b64token`), and
/// clients pass a tab or a no-break space on as they were typed: the credential after
/// `Bearer`, `Basic` or `Token` and any run of whitespace is a reference too, in an
/// argument, an `env` value and a header, whatever the key is called.
#[test]
fn a_credential_after_a_scheme_and_more_than_one_space_is_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {
            "a": {"command": "tool", "args": ["Bearer  plainarg1", "x Bearer  plainarg2", "Bearer\tplainarg3", "Basic  plainarg4"],
                  "env": {"X": "Bearer  plainenv5", "AUTH_HEADER": "Bearer\u00a0plainenv6"}},
            "b": {"url": "https://h.example/mcp", "headers": {"X-Other": "Bearer   plainhdr7", "Authorization": "Bearer  plainhdr8"}}
        }}"#,
    )
    .unwrap();
    let (code, out, err) = import(&[Path::new("--from"), Path::new("claude-code"), &file]);
    assert_eq!(code, 0, "{err}");
    for secret in [
        "plainarg1",
        "plainarg2",
        "plainarg3",
        "plainarg4",
        "plainenv5",
        "plainenv6",
        "plainhdr7",
        "plainhdr8",
    ] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{secret} is written out:\n{out}\n{err}"
        );
    }
    // The scheme stays, as with one space.
    assert!(
        out.contains(r#""Bearer  ${"#) && out.contains(r#"X-Other = "Bearer   ${"#),
        "{out}"
    );
}

/// A number is a credential's value too: a numeric password or PIN (`123456`, the most
/// common password there is) under a credential's name is a reference like any other,
/// in `env`, a header, a flag, `NAME=VALUE`, JSON text and a URL's query. Only a number
/// of up to 3 characters (`0`, `1`, `42`: a switch or a count) is kept as a setting.
#[test]
fn a_numeric_credential_is_a_reference_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {
            "a": {"command": "tool",
                  "args": ["--password=123456", "--pwd", "2345678", "-e", "DB_PASSWORD=3456789", "{\"password\": \"4567890\"}", "{\"passcode\": 1, \"db_password\": 1357913}"],
                  "env": {"PGPASSWORD": "5678901", "GITHUB_TOKEN": "6789012", "ENABLE_AUTH": "1", "AUTH": "0"}},
            "b": {"url": "https://h.example/mcp?password=7890123&pass=8901234",
                  "headers": {"Private-Token": "9012345", "X-Api-Key": "1029384"}}
        }}"#,
    )
    .unwrap();
    let (code, out, err) = import(&[Path::new("--from"), Path::new("claude-code"), &file]);
    assert_eq!(code, 0, "{err}");
    for secret in [
        "123456", "2345678", "3456789", "4567890", "5678901", "6789012", "7890123", "8901234", "9012345", "1029384",
        "1357913",
    ] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{secret} is written out:\n{out}\n{err}"
        );
    }
    assert!(
        out.contains(r#"ENABLE_AUTH = "1""#) && out.contains(r#"AUTH = "0""#),
        "{out}"
    );
}
