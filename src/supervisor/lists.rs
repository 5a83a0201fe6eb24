//! What a server offers: its tools, prompts, resources and templates, listed through
//! every page at the start and again on `list_changed`.

use super::{InitInfo, Server};
use crate::catalog::{self, Hint, Lists};
use crate::downstream::{stateless, Connection, Params};
use crate::message::{self, Outcome};
use crate::method::{Method, LISTS};
use serde_json::{json, Map, Value};
use std::time::Duration;
use tracing::{info, warn};

/// A bound on pages followed per list, against servers that repeat a cursor forever.
const MAX_PAGES: usize = 1000;

/// Which list a `list_changed` notification refers to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
}

impl ListKind {
    pub fn from_notification(method: &str) -> Option<ListKind> {
        match method {
            "notifications/tools/list_changed" => Some(ListKind::Tools),
            "notifications/prompts/list_changed" => Some(ListKind::Prompts),
            "notifications/resources/list_changed" => Some(ListKind::Resources),
            _ => None,
        }
    }

    pub fn notification(self) -> &'static str {
        match self {
            ListKind::Tools => "notifications/tools/list_changed",
            ListKind::Prompts => "notifications/prompts/list_changed",
            ListKind::Resources => "notifications/resources/list_changed",
        }
    }

    /// The list methods it covers.
    fn methods(self) -> &'static [Method] {
        match self {
            ListKind::Tools => &[Method::ToolsList],
            ListKind::Prompts => &[Method::PromptsList],
            ListKind::Resources => &[Method::ResourcesList, Method::ResourcesTemplatesList],
        }
    }
}

impl Server {
    /// Lists everything the server offers.
    pub(super) async fn list_all(&self, conn: &Connection, info: &InitInfo) -> Lists {
        let t = self.settings().timeout;
        let [tools, prompts, resources, templates] = LISTS;
        let lists = tokio::join!(
            self.list(conn, info, tools, t),
            self.list(conn, info, prompts, t),
            self.list(conn, info, resources, t),
            self.list(conn, info, templates, t),
        );
        let mut out = Lists::default();
        for (m, (items, hint)) in LISTS.into_iter().zip([lists.0, lists.1, lists.2, lists.3]) {
            let _ = out.set(m, items, hint);
        }
        out
    }

    /// Lists `kind` again, after the server said it changed (logged with whether it did).
    pub(super) async fn relist(&self, kind: ListKind) {
        let (conn, info) = {
            let s = self.state();
            match (&s.conn, &s.info) {
                (Some(c), Some(i)) => (c.clone(), i.clone()),
                _ => return,
            }
        };
        let timeout = self.settings().timeout;
        let mut listed = Vec::with_capacity(2);
        for &m in kind.methods() {
            listed.push((m, self.list(&conn, &info, m, timeout).await));
        }
        // Resources and their templates change together.
        let mut changed = false;
        self.update(|s| {
            for (m, (items, hint)) in listed {
                changed |= s.lists.set(m, items, hint);
            }
        });
        info!(server = %self.name, ?kind, changed, "re-listed after list_changed");
    }

    /// Lists one kind through all its pages. A server that declared no capabilities at
    /// all is asked anyway; any error counts as an empty list. 2026-07-28: a tool whose
    /// x-mcp-header annotations break the rules is not offered.
    async fn list(
        &self,
        conn: &Connection,
        info: &InitInfo,
        method: Method,
        timeout: Duration,
    ) -> (Vec<Map<String, Value>>, Option<Hint>) {
        let name = method.as_str();
        let capability = name.split('/').next().unwrap_or(name);
        if info.capabilities.is_some() && !info.has(capability) {
            // Nothing to change, nothing to cache against.
            return (
                Vec::new(),
                info.stateless.then_some(Hint {
                    ttl_ms: u64::MAX,
                    private: false,
                }),
            );
        }
        let key = catalog::result_key(method);
        let mut hint: Option<Hint> = None;
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let params = if info.stateless {
                let mut p = Map::new();
                if let Some(c) = &cursor {
                    p.insert("cursor".into(), Value::String(c.clone()));
                }
                Params::Object {
                    params: stateless::own_params(p),
                    progress: None,
                }
            } else {
                Params::Raw(cursor.as_ref().map(|c| message::to_raw(&json!({ "cursor": c }))))
            };
            let page = match conn.call(name, params, None, timeout).await {
                Ok(Outcome::Result(r)) => r,
                Ok(Outcome::Error(e)) => {
                    if info.capabilities.is_some() {
                        warn!(server = %self.name, method = name, error = %message::error_summary(&e).1, "listing failed");
                    }
                    break;
                }
                Err(e) => {
                    warn!(server = %self.name, method = name, error = %e, "listing failed");
                    break;
                }
            };
            let mut page: Map<String, Value> = match serde_json::from_str(page.get()) {
                Ok(p) => p,
                Err(e) => {
                    warn!(server = %self.name, method = name, error = %e, "listing result is not an object");
                    break;
                }
            };
            if info.stateless {
                let h = Hint::of(&page);
                hint = Some(hint.map_or(h, |o| o.and(h)));
            }
            if let Some(Value::Array(list)) = page.remove(key) {
                items.extend(list.into_iter().filter_map(|v| match v {
                    Value::Object(m) => Some(m),
                    _ => None,
                }));
            }
            match page.remove("nextCursor") {
                Some(Value::String(c)) if !c.is_empty() && cursor.as_deref() != Some(&c) => cursor = Some(c),
                _ => break,
            }
        }
        if method == Method::ToolsList && info.stateless {
            items.retain(|t| match stateless::check_x_mcp_headers(t.get("inputSchema")) {
                Ok(()) => true,
                Err(why) => {
                    // The server's name for it, by its start when long (as the catalog's notes say it).
                    let tool = crate::error::echo(t.get("name").and_then(Value::as_str).unwrap_or(""));
                    warn!(server = %self.name, tool = ?tool, reason = %why, "dropping a tool with an invalid x-mcp-header");
                    false
                }
            });
        }
        (items, hint)
    }
}
