//! `mcp-gateway-bench fixture`: a minimal stdio MCP server in Rust, for the startup case.
//!
//! The startup target is about the gateway starting its servers concurrently, not about
//! how long an interpreter takes to boot; with 20 CPython fixtures on 2 cores the
//! interpreters alone take over a second. This server starts in about a millisecond.
//!
//! One JSON-RPC message per line, answered in order. `initialize` is answered after
//! `--init-delay-ms`; `ping` with `{}`; `tools/list` with `echo` plus `--tools` more
//! tools; `tools/call echo` with its `text`. Anything else, `server/discover` before
//! `initialize` included, gets -32601 at once, so a gateway that probes first falls back
//! without waiting. Notifications and responses are ignored. Single-threaded, blocking
//! std I/O, no async runtime.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::io::{BufRead, BufWriter, Write};
use std::time::Duration;

const VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
const LATEST: &str = "2025-11-25";

#[derive(clap::Parser, Debug)]
#[command(name = "mcp-gateway-bench fixture", about = "a minimal stdio MCP server")]
pub struct FixtureArgs {
    /// The server's name (in serverInfo).
    #[arg(long, default_value = "fixture")]
    name: String,
    /// Extra tools besides `echo` (`tool_0` … `tool_{N-1}`).
    #[arg(long, default_value_t = 0)]
    tools: usize,
    /// How long `initialize` takes to answer.
    #[arg(long, default_value_t = 0)]
    init_delay_ms: u64,
}

#[derive(Deserialize)]
pub struct Msg<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct CallParams<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize, Default)]
struct InitParams<'a> {
    #[serde(borrow, default, rename = "protocolVersion")]
    protocol_version: Option<Cow<'a, str>>,
}

pub fn tools_result(extra: usize) -> String {
    let schema = json!({
        "type": "object",
        "properties": { "text": { "type": "string" } },
        "required": ["text"],
    });
    let mut tools = vec![json!({
        "name": "echo",
        "description": "Echo the given text.",
        "inputSchema": schema,
    })];
    tools.extend((0..extra).map(|i| {
        json!({
            "name": format!("tool_{i}"),
            "description": format!("Extra tool {i}: echoes like echo."),
            "inputSchema": schema,
        })
    }));
    json!({ "tools": tools }).to_string()
}

/// The answer to one request: `("result" | "error", its JSON)`. `tools` is
/// [`tools_result`] of `extra_tools`; `name` goes in serverInfo.
pub fn respond(method: &str, params: &str, tools: &str, extra_tools: usize, name: &str) -> (&'static str, String) {
    match method {
        "initialize" => {
            let p: InitParams = serde_json::from_str(params).unwrap_or_default();
            let version = p
                .protocol_version
                .as_deref()
                .filter(|v| VERSIONS.contains(v))
                .unwrap_or(LATEST);
            let body = json!({
                "protocolVersion": version,
                "capabilities": { "tools": {} },
                "serverInfo": { "name": name, "version": "1.0.0" },
            });
            ("result", body.to_string())
        }
        "ping" => ("result", "{}".to_owned()),
        "tools/list" => ("result", tools.to_owned()),
        "tools/call" => {
            let p: CallParams = serde_json::from_str(params).unwrap_or_default();
            let known = p.name.as_deref().is_some_and(|n| {
                n == "echo"
                    || n.strip_prefix("tool_")
                        .is_some_and(|i| i.parse::<usize>().is_ok_and(|i| i < extra_tools))
            });
            if known {
                let text = p
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("text"))
                    .map_or_else(String::new, |t| t.as_str().map_or_else(|| t.to_string(), str::to_owned));
                let body = json!({ "content": [{ "type": "text", "text": text }] });
                ("result", body.to_string())
            } else {
                let name = p.name.as_deref().unwrap_or("");
                let body = json!({ "code": -32602, "message": format!("Unknown tool: {name}") });
                ("error", body.to_string())
            }
        }
        other => {
            let body = json!({ "code": -32601, "message": format!("Method not found: {other}") });
            ("error", body.to_string())
        }
    }
}

/// Runs the server until stdin closes.
pub fn run(args: FixtureArgs) -> anyhow::Result<()> {
    let tools = tools_result(args.tools);
    let mut input = std::io::BufReader::with_capacity(64 << 10, std::io::stdin().lock());
    let mut out = BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
    let mut line = Vec::new();
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            out.flush()?;
            return Ok(());
        }
        let Ok(msg) = serde_json::from_slice::<Msg>(&line) else {
            continue;
        };
        let (Some(id), Some(method)) = (msg.id, msg.method.as_deref()) else {
            continue; // a notification or a response
        };
        let params = msg.params.map_or("{}", RawValue::get);
        if method == "initialize" && args.init_delay_ms > 0 {
            out.flush()?;
            std::thread::sleep(Duration::from_millis(args.init_delay_ms));
        }
        let (key, body) = respond(method, params, &tools, args.tools, &args.name);
        writeln!(out, "{{\"jsonrpc\":\"2.0\",\"id\":{},\"{key}\":{body}}}", id.get())?;
        // Answer at once unless more input is already waiting (then batch the writes).
        if input.buffer().is_empty() {
            out.flush()?;
        }
    }
}
