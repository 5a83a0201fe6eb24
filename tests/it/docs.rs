//! Every `toml` block in README.md and docs/ is a gateway.toml that the real config
//! loader accepts (as rathole tests its examples), so the reference cannot drift from the
//! code. `${VAR}` references resolve to a placeholder value.

use std::path::{Path, PathBuf};

fn markdown_files() -> Vec<PathBuf> {
    let root = crate::common::repo();
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
        {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// The `toml` fenced blocks of a markdown file, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match &mut open {
            None if line.trim_start().starts_with("```toml") => open = Some((n + 2, String::new())),
            Some(_) if line.trim_start().starts_with("```") => out.extend(open.take()),
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// `${VAR}` in an example resolves to a placeholder; the gateway's own variables
/// (`OTEL_*`, `MCP_GATEWAY_*`) are unset, as on a machine that sets none, except
/// `MCP_GATEWAY_CLUSTER_KEY`, which every replica of a cluster has (docs/cluster.md).
fn placeholder(name: &str) -> Option<String> {
    if name == "MCP_GATEWAY_CLUSTER_KEY" {
        return Some("0123456789abcdef".repeat(4));
    }
    (!name.starts_with("OTEL_") && !name.starts_with("MCP_GATEWAY_"))
        .then(|| "placeholder-value-of-at-least-32-bytes-0123456789".to_owned())
}

/// Files the examples name by relative path, made empty in the folder they load from.
const EXAMPLE_FILES: &[&str] = &["certs/internal-ca.pem"];

#[test]
fn every_toml_block_in_the_docs_is_a_valid_config() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    for f in EXAMPLE_FILES {
        let p = dir.path().join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "").unwrap();
    }
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, block) in toml_blocks(&text) {
            let shown = format!(
                "{}:{line}",
                file.strip_prefix(crate::common::repo()).unwrap_or(&file).display()
            );
            // Relative paths in examples (cwd, ca_file) resolve against the config's folder.
            let path = dir.path().join("gateway.toml");
            if let Err(e) = mcp_gateway::config::Config::parse(Path::new(&path), &block, &placeholder) {
                failures.push(format!("{shown}:\n{e}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(checked >= 2, "only {checked} toml blocks found");
}
