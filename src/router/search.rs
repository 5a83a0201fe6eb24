//! Tool search mode: `tools/list` shows two tools of the gateway's own instead of the
//! whole catalog, `gateway__search_tools` (ranked matches from [`crate::search`]) and
//! `gateway__call_tool` (a call of any tool by name, exactly as `tools/call` would make
//! it). Every public name stays callable by `tools/call` too.
//!
//! Whether a request is in search mode is decided by [`search_mode`] alone. The two names
//! are reserved in the catalog ([`crate::catalog::RESERVED_TOOLS`]), so no server's tool can
//! take them, in search mode or not.

use super::Call;
use crate::catalog::{CALL_TOOL, SEARCH_TOOLS};
use crate::error::Error;
use crate::message::{self, Members, Outcome};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// How many matches `gateway__search_tools` returns without a `limit`, and at most.
pub const DEFAULT_LIMIT: u64 = 8;
pub const MAX_LIMIT: u64 = 50;
use crate::search::MAX_QUERY;

/// Whether `tools/list` on this request's endpoint shows the two search tools instead of
/// the catalog, and whether those two can be called. The one place that decides it:
/// `[gateway] search` for the gateway's path (and its stdio front, which serves the same
/// catalog). A profile's own `search` belongs here too.
pub(super) fn search_mode(cx: &Call<'_>) -> bool {
    match &cx.view {
        // A profile's own `search` decides on its endpoint (a `?tags=` view follows `/mcp`).
        Some(v) if matches!(v.key, crate::catalog::view::ViewKey::Profile(_)) => v.search,
        _ => cx.topo.config.gateway.search,
    }
}

/// The `tools/list` result of search mode: the same for everyone (a search shows each
/// caller only what it may see).
pub(super) fn tools_result() -> &'static RawValue {
    static LIST: OnceLock<Box<RawValue>> = OnceLock::new();
    LIST.get_or_init(|| {
        message::to_raw(&json!({
            "tools": [
                {
                    "name": SEARCH_TOOLS,
                    "title": "Search tools",
                    "description": "Find the tools that can do what you need. This gateway fronts many servers, so their tools are not listed one by one: describe the task in a few words (what to do, to what, and the service if you know it, e.g. \"create a GitHub issue\", \"query Prometheus metrics\", \"read a file\") and get the best matches, ranked, each with its name, description and inputSchema. Then call one with gateway__call_tool (or by its name with tools/call). If nothing fits, search again with other words.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {
                            "query": {
                                "type": "string",
                                "maxLength": MAX_QUERY,
                                "description": "What you want to do, in plain words."
                            },
                            "limit": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_LIMIT,
                                "default": DEFAULT_LIMIT,
                                "description": "How many matches to return, best first (default 8, at most 50)."
                            }
                        },
                        "required": ["query"],
                        "additionalProperties": false
                    },
                    "outputSchema": {
                        "type": "object",
                        "properties": {
                            "tools": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "name": { "type": "string" },
                                        "description": { "type": "string" },
                                        "inputSchema": { "type": "object" }
                                    },
                                    "required": ["name", "inputSchema"]
                                }
                            }
                        },
                        "required": ["tools"]
                    },
                    "annotations": { "readOnlyHint": true, "idempotentHint": true, "openWorldHint": false }
                },
                {
                    "name": CALL_TOOL,
                    "title": "Call a tool",
                    "description": "Call a tool found with gateway__search_tools: give its exact name and the arguments its inputSchema asks for. You get the tool's own result, errors and progress, as if you had called it directly.",
                    "inputSchema": {
                        "type": "object",
                        "properties": {
                            "name": {
                                "type": "string",
                                "description": "The tool's name, exactly as gateway__search_tools returned it."
                            },
                            "arguments": {
                                "type": "object",
                                "description": "The tool's arguments, following its inputSchema ({} when it takes none).",
                                "additionalProperties": true
                            }
                        },
                        "required": ["name", "arguments"],
                        "additionalProperties": false
                    }
                }
            ]
        }))
    })
}

/// Which of the gateway's own tools a `tools/call` names, in search mode.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) enum Own {
    Search,
    Call,
}

pub(super) fn own_tool(name: Option<&str>) -> Option<Own> {
    match name? {
        SEARCH_TOOLS => Some(Own::Search),
        CALL_TOOL => Some(Own::Call),
        _ => None,
    }
}

/// `tools/call` params of `gateway__call_tool` made into those of the call it asks for:
/// `name` and `arguments` from its arguments; `_meta` (the progress token), `task` and
/// anything else stay as the client sent them.
pub(super) fn unwrap_call(p: &mut Members) -> Result<(), Error> {
    let bad = |what: &str| Error::invalid_params(format!("{CALL_TOOL}: {what}"));
    let Some(raw) = p.get_raw("arguments") else {
        return Err(bad("needs arguments.name, the name of the tool to call"));
    };
    let inner = Members::parse(RawValue::from_string(raw.to_owned()).ok())
        .map_err(|_| bad("arguments must be an object with name and arguments"))?;
    let Some(target) = inner.get_str("name").map(std::borrow::Cow::into_owned) else {
        let e = match inner.get_raw("name") {
            None => "needs arguments.name, the name of the tool to call",
            Some(_) => "arguments.name must be a string: the name of a tool",
        };
        return Err(bad(e));
    };
    if target == CALL_TOOL {
        return Err(bad("arguments.name cannot be gateway__call_tool itself"));
    }
    if target.len() > crate::message::MAX_NAME_LEN {
        return Err(bad(&format!(
            "arguments.name is {} bytes, longer than the {} allowed",
            target.len(),
            crate::message::MAX_NAME_LEN
        )));
    }
    // As `tools/call`'s own `arguments`: an object when present, never null.
    match inner.get_raw("arguments") {
        None => {
            p.remove("arguments");
        }
        Some(args) if args.starts_with('{') => p.insert_raw("arguments", args),
        Some(_) => return Err(bad("arguments.arguments must be an object: the tool's arguments")),
    }
    p.insert_str("name", &target);
    Ok(())
}

/// `gateway__search_tools`: the best matches the caller may see, as `structuredContent`
/// and as the same JSON in a text block.
pub(super) async fn search_tools(cx: &Call<'_>, p: &Members) -> Outcome {
    let (query, limit) = match search_args(p) {
        Ok(a) => a,
        Err(e) => return e.into(),
    };
    let index = cx.topo.catalog.search_index();
    // With a model, the request's vector and its cosines take milliseconds of CPU: made
    // on the blocking pool, not on the thread that serves every other request.
    let cosines = match index.semantic() {
        Some(semantic) => match semantic.permits.acquire().await {
            Ok(_permit) => {
                let (q, catalog) = (query.clone(), cx.topo.catalog.clone());
                tokio::task::spawn_blocking(move || catalog.search_index().cosines(&q))
                    .await
                    .ok()
                    .flatten()
            }
            Err(_) => None,
        },
        None => None,
    };
    // What the caller may see: its allowlist, and the view of its endpoint.
    let tools = &cx.topo.catalog.tools;
    // Without cosines (no model yet, or its task failed): by words, not the model here.
    let hits = index.search_by(&query, Some(cosines.as_deref().unwrap_or(&[])), limit, |name| {
        cx.visible(name) && (cx.view.is_none() || tools.get(name).is_some_and(|r| cx.sees(name, r.server, true)))
    });
    let mut tools = String::from(r#"{"tools":["#);
    for (i, h) in hits.iter().enumerate() {
        if i > 0 {
            tools.push(',');
        }
        tools.push_str(h.entry.get());
    }
    tools.push_str("]}");
    #[derive(Serialize)]
    struct Text<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        text: &'a str,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Found<'a> {
        content: [Text<'a>; 1],
        structured_content: &'a RawValue,
    }
    let Ok(structured) = RawValue::from_string(tools.clone()) else {
        return Error::gateway("search results did not serialize").into();
    };
    let found = Found {
        content: [Text {
            kind: "text",
            text: &tools,
        }],
        structured_content: &structured,
    };
    match serde_json::value::to_raw_value(&found) {
        Ok(raw) => Outcome::Result(raw.into()),
        Err(_) => Error::gateway("search results did not serialize").into(),
    }
}

/// `query` and `limit` from `gateway__search_tools`' arguments.
fn search_args(p: &Members) -> Result<(String, usize), Error> {
    let bad = |what: &str| Error::invalid_params(format!("{SEARCH_TOOLS}: {what}"));
    let args: serde_json::Map<String, Value> = match p.get_raw("arguments") {
        None => serde_json::Map::new(),
        Some(raw) => serde_json::from_str(raw).map_err(|e| match raw.trim_start().starts_with('{') {
            // An object whose text holds what no string can (a lone surrogate escape).
            true => bad(&format!("arguments cannot be read: {e}")),
            false => bad("arguments must be an object"),
        })?,
    };
    let query = match args.get("query") {
        Some(Value::String(q)) if q.len() > MAX_QUERY => {
            return Err(bad(&format!(
                "arguments.query is {} bytes, longer than the {MAX_QUERY} allowed: describe the task in a few words",
                q.len()
            )))
        }
        Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
        Some(Value::String(_)) => return Err(bad("arguments.query must not be empty")),
        Some(_) => return Err(bad("arguments.query must be a string")),
        None => return Err(bad("needs arguments.query, what you want to do in plain words")),
    };
    let limit = match args.get("limit") {
        None | Some(Value::Null) => DEFAULT_LIMIT,
        Some(v) => match v
            .as_u64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
        {
            Some(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => return Err(bad("arguments.limit must be an integer from 1 to 50")),
        },
    };
    Ok((query, limit as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(v: Value) -> Members {
        Members::parse(Some(message::to_raw(&v))).unwrap()
    }

    #[test]
    fn a_call_through_the_gateway_keeps_meta_and_task_and_takes_name_and_arguments() {
        let mut p = members(json!({
            "name": CALL_TOOL,
            "arguments": {"name": "gh__create_issue", "arguments": {"title": "x"}},
            "_meta": {"progressToken": 7},
            "task": {"ttl": 1000}
        }));
        unwrap_call(&mut p).unwrap();
        let v: Value = serde_json::from_str(p.into_raw().get()).unwrap();
        assert_eq!(
            v,
            json!({"name": "gh__create_issue", "arguments": {"title": "x"}, "_meta": {"progressToken": 7}, "task": {"ttl": 1000}})
        );
        let mut p = members(json!({"name": CALL_TOOL, "arguments": {"name": "t"}}));
        unwrap_call(&mut p).unwrap();
        assert_eq!(p.get_raw("arguments"), None, "no arguments: the call has none");
    }

    #[test]
    fn bad_arguments_name_the_field() {
        for (args, field) in [
            (json!({"name": CALL_TOOL}), "arguments.name"),
            (json!({"name": CALL_TOOL, "arguments": {}}), "arguments.name"),
            (json!({"name": CALL_TOOL, "arguments": {"name": 3}}), "arguments.name"),
            (
                json!({"name": CALL_TOOL, "arguments": {"name": "t", "arguments": [1]}}),
                "arguments.arguments",
            ),
            (
                json!({"name": CALL_TOOL, "arguments": {"name": CALL_TOOL}}),
                "arguments.name",
            ),
            (
                json!({"name": CALL_TOOL, "arguments": {"name": "a".repeat(300)}}),
                "arguments.name is 300 bytes",
            ),
            (
                json!({"name": CALL_TOOL, "arguments": {"name": "calc__add", "arguments": null}}),
                "arguments.arguments must be an object",
            ),
        ] {
            let e = unwrap_call(&mut members(args.clone())).unwrap_err();
            assert_eq!(e.code, crate::error::code::INVALID_PARAMS, "{args}");
            assert!(e.message.contains(field), "{args}: {}", e.message);
        }
        for (args, field) in [
            (json!({}), "arguments.query"),
            (json!({"arguments": {"query": ""}}), "arguments.query"),
            (json!({"arguments": {"query": 1}}), "arguments.query"),
            (
                json!({"arguments": {"query": "word ".repeat(MAX_QUERY / 5 + 1)}}),
                "arguments.query is 2050 bytes, longer than the 2048 allowed",
            ),
            (json!({"arguments": {"query": "x", "limit": 0}}), "arguments.limit"),
            (json!({"arguments": {"query": "x", "limit": 51}}), "arguments.limit"),
            (json!({"arguments": {"query": "x", "limit": "5"}}), "arguments.limit"),
            (json!({"arguments": {"query": "x", "limit": 2.5}}), "arguments.limit"),
        ] {
            let e = search_args(&members(args.clone())).unwrap_err();
            assert!(e.message.contains(field), "{args}: {}", e.message);
        }
        assert_eq!(
            search_args(&members(json!({"arguments": {"query": "x"}}))).unwrap().1,
            8
        );
        assert_eq!(
            search_args(&members(json!({"arguments": {"query": "x", "limit": 50}})))
                .unwrap()
                .1,
            50
        );
    }

    #[test]
    fn the_list_has_the_two_tools() {
        let v: Value = serde_json::from_str(tools_result().get()).unwrap();
        let names: Vec<&str> = v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, [SEARCH_TOOLS, CALL_TOOL]);
    }
}
