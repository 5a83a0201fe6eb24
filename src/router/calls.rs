//! Calls by public name: `tools/call` and `prompts/get` (routed by the catalog's tables,
//! never by splitting the name), and `completion/complete` (by the prompt or resource
//! it completes for).

use super::resources::resource_owner;
use super::search;
use super::tasks::supports_tasks;
use super::{Call, Gateway, Topology};
use crate::downstream::DsError;
use crate::error::Error;
use crate::message::{self, Outcome};
use crate::method::Method;
use serde_json::value::RawValue;
use serde_json::{json, Value};

impl Gateway {
    /// tools/call and prompts/get.
    pub(super) async fn call_named(&self, cx: &mut Call<'_>, method: Method, params: message::Incoming) -> Outcome {
        let topo = cx.topo;
        let tool = method == Method::ToolsCall;
        let (table, what) = if tool {
            (&topo.catalog.tools, "tool")
        } else {
            (&topo.catalog.prompts, "prompt")
        };
        // Opened one level only (or already, by the stateless envelope's checks):
        // `arguments` goes on as the client wrote it.
        let mut p = match params.into_members() {
            Ok(p) => p,
            Err(e) => return Error::invalid_params(e).into(),
        };
        if tool && search::search_mode(cx) {
            let mut own = search::own_tool(p.get_str("name").as_deref());
            if own == Some(search::Own::Call) {
                if let Err(e) = search::unwrap_call(&mut p) {
                    return e.into();
                }
                own = search::own_tool(p.get_str("name").as_deref());
            }
            if own == Some(search::Own::Search) {
                cx.info.tool = Some(crate::catalog::SEARCH_TOOLS.to_owned());
                // Boxed: a rare path, kept out of every call's future.
                return Box::pin(search::search_tools(cx, &p)).await;
            }
        }
        let name = p.get_str("name");
        let Some(name) = name.as_deref() else {
            return Error::invalid_params(format!("{method} needs params.name")).into();
        };
        if name.len() > message::MAX_NAME_LEN {
            let max = message::MAX_NAME_LEN;
            let e = format!(
                "{method}: params.name is {} bytes, longer than the {max} allowed",
                name.len()
            );
            return Error::invalid_params(e).into();
        }
        // The schema says an object when present (the TS SDK refuses anything else, null
        // included); a server must never see another shape.
        if let Some(kind) = p.get_raw("arguments").and_then(not_an_object) {
            let e = format!("{method}: params.arguments must be an object when present, not {kind}");
            return Error::invalid_params(e).into();
        }
        let Some(route) = table.get(name).filter(|r| cx.sees(name, r.server, tool)) else {
            // A name under the prefix of a server that is down is that server's problem,
            // not an unknown name: say so (unless the name is hidden).
            if let Some(e) = down_server_for(topo, name).filter(|(s, _)| cx.sees(name, *s, tool)) {
                let s = &topo.servers[e.0];
                let sep = topo.config.gateway.separator.as_str();
                let own = name.get(s.settings().prefix.len() + sep.len()..).map(str::to_owned);
                if let (true, true, Some(own)) = (tool, s.awaiting_consent(), own) {
                    // A tool of a server waiting for a consent again (its one user's tokens
                    // were revoked): the call asks the caller for it, or, with the caller's
                    // own token, goes on the caller's own connection.
                    cx.info.tool = Some(name.to_owned());
                    cx.info.server = Some(s.name.clone());
                    cx.info.index = Some(e.0);
                    if let Err(out) = self.spend_route(cx, method, e.0, Some(own.as_str())).await {
                        return out;
                    }
                    p.insert_str("name", &own);
                    return self.forward(cx, e.0, method, p).await;
                }
                return Outcome::Error(e.1.to_error_object());
            }
            let e = Error::invalid_params(format!("unknown {what}: {name}")).with_data(json!({ what: name }));
            return e.into();
        };
        if tool {
            cx.info.tool = Some(name.to_owned());
        }
        // Known from here on, so a limited call counts under its server too.
        let server = &topo.servers[route.server];
        cx.info.server = Some(server.name.clone());
        cx.info.index = Some(route.server);
        if let Err(out) = self
            .spend_route(cx, method, route.server, tool.then_some(route.name.as_str()))
            .await
        {
            return out;
        }
        p.insert_str("name", &route.name);
        // A task-augmented call goes as one only to a server that declared it can.
        let as_task = tool && p.contains_key("task");
        if as_task && !supports_tasks(server, "call") {
            p.remove("task");
        }
        match self.forward(cx, route.server, method, p).await {
            Outcome::Result(r) if as_task => self
                .created_task(server, cx.client, r.get())
                .await
                .unwrap_or(Outcome::Result(r)),
            other => other,
        }
    }

    /// completion/complete: to the server of the prompt or resource it completes for.
    pub(super) async fn complete(&self, cx: &mut Call<'_>, params: Option<Box<RawValue>>) -> Outcome {
        let mut p = match message::params_object(params.as_deref()) {
            Ok(p) => p,
            Err(e) => return Error::invalid_params(e).into(),
        };
        let Some(Value::Object(r)) = p.get_mut("ref") else {
            return Error::invalid_params("completion/complete needs params.ref").into();
        };
        let server = match r.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = r.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let Some(route) = cx
                    .topo
                    .catalog
                    .prompts
                    .get(&name)
                    .filter(|r| cx.sees(&name, r.server, false))
                else {
                    let name = crate::error::echo(&name);
                    return Error::invalid_params(format!("unknown prompt: {name}"))
                        .with_data(serde_json::json!({ "prompt": name }))
                        .into();
                };
                r.insert("name".into(), Value::String(route.name.clone()));
                route.server
            }
            Some("ref/resource") => {
                let uri = r.get("uri").and_then(Value::as_str).unwrap_or_default().to_owned();
                match resource_owner(cx, &uri).filter(|&s| cx.sees(&uri, s, false)) {
                    Some(s) => s,
                    None => {
                        let uri = crate::error::echo(&uri);
                        return Error::invalid_params(format!("unknown resource: {uri}"))
                            .with_data(serde_json::json!({ "uri": uri }))
                            .into();
                    }
                }
            }
            other => {
                let e = format!("unknown ref type: {}", crate::error::echo(other.unwrap_or("(none)")));
                return Error::invalid_params(e).into();
            }
        };
        self.forward(cx, server, Method::CompletionComplete, p).await
    }
}

/// What kind of JSON value `raw` (a value's text, no leading whitespace) is, unless an object.
fn not_an_object(raw: &str) -> Option<&'static str> {
    Some(match raw.as_bytes().first()? {
        b'{' => return None,
        b'[' => "an array",
        b'"' => "a string",
        b'n' => "null",
        b't' | b'f' => "a boolean",
        _ => "a number",
    })
}

/// The server (its index) that is not ready and whose prefix `name` carries, and its error.
fn down_server_for(topo: &Topology, name: &str) -> Option<(usize, DsError)> {
    let sep = &topo.config.gateway.separator;
    topo.servers.iter().enumerate().find_map(|(i, s)| {
        let prefix = s.settings().prefix.clone();
        let prefixed = !prefix.is_empty()
            && name
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with(sep.as_str()));
        if !prefixed {
            return None;
        }
        s.connection().err().map(|e| (i, e))
    })
}
