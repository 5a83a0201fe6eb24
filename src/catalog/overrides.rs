//! `[servers.NAME.overrides.TOOL]` in the merge: what an override puts on a tool, and
//! what does not hold of the overrides once the servers' tools are known.

use super::{join, Route, Source};
use crate::config::Override;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// What does not hold of the overrides (see `Catalog::problems`). A server that lists no
/// tools at all (down, or not listed yet) is not judged.
pub(super) fn problems(separator: &str, sources: &[Source], tools: &HashMap<String, Route>) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, s) in sources.iter().enumerate().filter(|(_, s)| !s.lists.tools.is_empty()) {
        for (tool, o) in s.overrides {
            let listed = s
                .lists
                .tools
                .iter()
                .any(|t| t.get("name").and_then(Value::as_str) == Some(tool));
            if !listed {
                problems.push(format!(
                    "servers.{}.overrides.{tool}: server '{}' lists no tool {tool:?}",
                    s.server, s.server
                ));
                continue;
            }
            let Some(new) = o.name.as_deref().filter(|_| s.filter.permits(tool)) else {
                continue;
            };
            let public = join(s.prefix, separator, new);
            let ours = tools.get(&public).is_some_and(|r| r.server == i && r.name == *tool);
            // Another tool whose own public name this is (it got a hashed one instead).
            let taken = sources.iter().enumerate().any(|(j, o)| {
                o.lists
                    .tools
                    .iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .any(|name| {
                        let shown = o.overrides.get(name).and_then(|x| x.name.as_deref()).unwrap_or(name);
                        (j, name) != (i, tool.as_str())
                            && o.filter.permits(name)
                            && join(o.prefix, separator, shown) == public
                    })
            });
            if !ours || taken {
                problems.push(format!(
                    "servers.{}.overrides.{tool}.name: {public} is already another tool's public name",
                    s.server
                ));
            }
        }
    }
    problems
}

/// Puts an override's description, title and annotations on a tool.
pub(super) fn apply(item: &mut Map<String, Value>, o: &Override) {
    if let Some(d) = &o.description {
        item.insert("description".into(), Value::String(d.clone()));
    }
    if let Some(t) = &o.title {
        item.insert("title".into(), Value::String(t.clone()));
    }
    if let Some(a) = &o.annotations {
        let own = item.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
        if !own.is_object() {
            *own = Value::Object(Map::new());
        }
        if let Value::Object(own) = own {
            for (k, v) in a {
                own.insert(k.clone(), v.clone());
            }
        }
    }
}
