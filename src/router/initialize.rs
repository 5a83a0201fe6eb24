//! The handshake: the `initialize` result a session gets, from what its servers offer.

use super::tasks::supports_tasks;
use super::Gateway;
use crate::auth::Identity;
use crate::catalog::view::ViewKey;
use crate::message::{self, Outcome};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// Protocol revisions the public endpoint speaks in the handshake era, newest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The gateway's `serverInfo`: the same in every `initialize` result, and in the
/// `_meta` of every 2026-07-28 result.
pub fn server_info() -> Value {
    json!({ "name": "mcp-gateway", "title": "MCP Gateway", "version": env!("CARGO_PKG_VERSION") })
}

impl Gateway {
    /// The `initialize` result as `identity` sees it on the endpoint of `view` (none:
    /// the whole catalog): the instructions of a server outside the view, or whose tools,
    /// prompts and resources its allowlist hides entirely, are left out.
    pub fn initialize_result_for(
        &self,
        params: Option<&RawValue>,
        identity: Option<&Identity>,
        view: Option<&ViewKey>,
    ) -> Outcome {
        let topo = self.topology();
        let view = view.map(|k| topo.view(k));
        let shown = |index: usize, server: &str| {
            view.as_ref().is_none_or(|v| v.has_server(index))
                && identity.is_none_or(|i| {
                    topo.catalog
                        .entries
                        .iter()
                        .any(|e| &*e.server == server && i.permits(&e.public))
                })
        };
        let requested = message::params_object(params)
            .ok()
            .and_then(|p| p.get("protocolVersion").and_then(Value::as_str).map(str::to_owned));
        let version = match requested.as_deref() {
            Some(v) if SUPPORTED_VERSIONS.contains(&v) => v,
            _ => SUPPORTED_VERSIONS[0],
        };
        let mut caps = Map::new();
        caps.insert("tools".into(), json!({ "listChanged": true }));
        caps.insert("prompts".into(), json!({ "listChanged": true }));
        caps.insert("resources".into(), json!({ "listChanged": true }));
        let mut instructions = String::new();
        let subscribable = topo.servers.iter().any(|s| {
            s.state()
                .info
                .as_ref()
                .and_then(|i| i.capabilities.as_ref())
                .is_some_and(|c| {
                    c.get("resources")
                        .and_then(|r| r.get("subscribe"))
                        .and_then(Value::as_bool)
                        == Some(true)
                })
        });
        if subscribable {
            caps.insert("resources".into(), json!({ "listChanged": true, "subscribe": true }));
        }
        if topo.servers.iter().any(|s| supports_tasks(s, "call")) {
            caps.insert(
                "tasks".into(),
                json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } }),
            );
        }
        for (index, s) in topo.servers.iter().enumerate() {
            let state = s.state();
            let Some(info) = &state.info else { continue };
            for (cap, value) in [("completions", json!({})), ("logging", json!({}))] {
                if info.has(cap) {
                    caps.insert(cap.into(), value);
                }
            }
            if let Some(text) = info
                .instructions
                .as_deref()
                .filter(|t| !t.trim().is_empty() && shown(index, &s.name))
            {
                if !instructions.is_empty() {
                    instructions.push_str("\n\n");
                }
                instructions.push_str(&format!("## {}\n{}", s.name, text.trim()));
            }
        }
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": caps,
            "serverInfo": server_info(),
        });
        if !instructions.is_empty() {
            result["instructions"] = Value::String(instructions);
        }
        Outcome::Result(message::to_raw(&result).into())
    }
}
