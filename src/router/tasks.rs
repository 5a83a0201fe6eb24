//! Tasks (2025-11-25, experimental) through the gateway.
//!
//! A task id is the downstream's own, namespaced by its server: `{server}/{taskId}`
//! ([`public_task_id`]). The name is a key in a table ([`crate::shared::Shared`]), never
//! split to route: the table maps it back to the server and the original id, and binds
//! the task to the session that created it, so another session asking for it
//! (tasks/get, tasks/result, tasks/cancel, tasks/list) is told it does not exist.

use super::{Call, Gateway};
use crate::client::Client;
use crate::downstream::Params;
use crate::error::Error;
use crate::message::{self, Outcome};
use crate::method::Method;
use crate::shared::public_task_id;
use crate::supervisor::Server;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::sync::Arc;

use crate::message::meta::META_RELATED_TASK as RELATED;

/// How many pages of one server's tasks/list are read at most.
const MAX_TASK_PAGES: usize = 100;

impl Gateway {
    /// tasks/get, tasks/result and tasks/cancel: to the task's server, under its own id.
    pub(super) async fn task_request(
        &self,
        cx: &mut Call<'_>,
        method: Method,
        params: Option<Box<RawValue>>,
    ) -> Outcome {
        let mut p = match message::params_object(params.as_deref()) {
            Ok(p) => p,
            Err(e) => return Error::invalid_params(e).into(),
        };
        let public = p.get("taskId").and_then(Value::as_str).unwrap_or_default().to_owned();
        let route = self.shared.task(&public, &cx.client.id).await;
        let found = route.and_then(|r| cx.topo.server_index(&r.server).map(|i| (i, r)));
        let Some((server, route)) = found else {
            return Error::invalid_params(format!("unknown task: {}", crate::error::echo(&public))).into();
        };
        p.insert("taskId".into(), Value::String(route.task_id));
        // Cluster mode: the task is in another replica's downstream; it answers.
        let out = match route.replica {
            Some(replica) => Box::pin(self.forward_to(replica, cx, server, method, p.clone())).await,
            None => None,
        };
        let out = match out {
            Some(out) => out,
            None => self.forward(cx, server, method, p).await,
        };
        match out {
            Outcome::Result(r) => {
                let mut body = open(r.get());
                rewrite_task_object(&mut body, &route.server);
                Outcome::Result(close(body).into())
            }
            other => other,
        }
    }

    /// Rewrites a server's CreateTaskResult for the client and binds the task to it.
    pub(super) async fn created_task(&self, server: &Server, client: &Arc<Client>, result: &str) -> Option<Outcome> {
        let mut body = open(result);
        let Some(Value::Object(task)) = body.get_mut("task") else {
            return None;
        };
        let original = task.get("taskId").and_then(Value::as_str)?.to_owned();
        rewrite_task_object(task, &server.name);
        rewrite_task_object(&mut body, &server.name);
        self.shared
            .add_task(&server.name, &original, &client.id, server.per_caller())
            .await;
        self.remember(client);
        Some(Outcome::Result(close(body).into()))
    }

    /// tasks/list: this session's tasks, from every server that lists tasks.
    pub(super) async fn list_tasks(&self, cx: &mut Call<'_>) -> Outcome {
        let client = cx.client;
        let mut all = Vec::new();
        for s in cx.topo.servers.iter().filter(|s| supports_tasks(s, "list")) {
            // A session's own process holds its tasks; none is started just to list.
            let identity = client.identity();
            let caller = crate::supervisor::Caller {
                session: Some(&client.id),
                client: identity.as_deref().map(|i| (i.name.as_str(), i.secrets())),
                principal: identity.as_deref().map(|i| i.process_key()),
            };
            let conn = s.existing_connection_for(&caller).await;
            let Some(conn) = conn else { continue };
            let mut cursor: Option<String> = None;
            for _ in 0..MAX_TASK_PAGES {
                let params = cursor.as_ref().map(|c| message::to_raw(&json!({ "cursor": c })));
                let Ok(Outcome::Result(r)) = conn
                    .call(
                        Method::TasksList.as_str(),
                        Params::Raw(params),
                        None,
                        s.settings().timeout,
                    )
                    .await
                else {
                    break;
                };
                let mut page = open(r.get());
                if let Some(Value::Array(tasks)) = page.remove("tasks") {
                    for t in tasks {
                        let Value::Object(mut t) = t else { continue };
                        let Some(id) = t.get("taskId").and_then(Value::as_str) else {
                            continue;
                        };
                        if self
                            .shared
                            .task(&public_task_id(&s.name, id), &client.id)
                            .await
                            .is_some()
                        {
                            rewrite_task_object(&mut t, &s.name);
                            all.push(Value::Object(t));
                        }
                    }
                }
                match page.remove("nextCursor") {
                    Some(Value::String(c)) if !c.is_empty() => cursor = Some(c),
                    _ => break,
                }
            }
        }
        Outcome::Result(message::to_raw(&json!({ "tasks": all })).into())
    }

    /// Delivers a server's `notifications/tasks/status` to the session that owns the task.
    pub(super) async fn task_status(&self, server: &Arc<str>, method: &str, params: Option<&RawValue>) {
        let Some(raw) = params else { return };
        let mut body = open(raw.get());
        let Some(id) = body.get("taskId").and_then(Value::as_str) else {
            return;
        };
        let Some(route) = self.shared.task_by_origin(server, id).await else {
            return;
        };
        rewrite_task_object(&mut body, server);
        let line = Bytes::from(message::notification(method, Some(&close(body))));
        self.deliver(&self.shared.key(&route.owner), line);
    }
}

/// Whether a server declared task support: `call` for task-augmented tools/call, or
/// `list` / `cancel` for those requests.
pub(super) fn supports_tasks(s: &Server, what: &str) -> bool {
    let state = s.state();
    let Some(tasks) = state
        .info
        .as_ref()
        .and_then(|i| i.capabilities.as_ref())
        .and_then(|c| c.get("tasks"))
    else {
        return false;
    };
    match what {
        "call" => tasks
            .get("requests")
            .and_then(|r| r.get("tools"))
            .and_then(|t| t.get("call"))
            .is_some(),
        other => tasks.get(other).is_some(),
    }
}

/// Puts the public id in place of the server's in a task object (`taskId`) and in
/// `_meta[related-task].taskId`. Returns the public id when there was a `taskId`.
fn rewrite_task_object(obj: &mut Map<String, Value>, server: &str) -> Option<String> {
    let mut public = None;
    if let Some(Value::String(id)) = obj.get_mut("taskId") {
        let p = public_task_id(server, id);
        *id = p.clone();
        public = Some(p);
    }
    if let Some(Value::Object(meta)) = obj.get_mut("_meta") {
        if let Some(Value::Object(rel)) = meta.get_mut(RELATED) {
            if let Some(Value::String(id)) = rel.get_mut("taskId") {
                *id = public_task_id(server, id);
            }
        }
    }
    public
}

/// Opens a raw result as an object (empty on anything else).
fn open(raw: &str) -> Map<String, Value> {
    match serde_json::from_str(raw) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Serializes an object back to a raw value.
fn close(obj: Map<String, Value>) -> Box<RawValue> {
    message::to_raw(&Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_objects_and_related_meta_are_rewritten() {
        let mut obj = json!({"taskId": "7", "status": "working",
            "_meta": {RELATED: {"taskId": "7"}}})
        .as_object()
        .cloned()
        .unwrap();
        assert_eq!(rewrite_task_object(&mut obj, "s").as_deref(), Some("s/7"));
        assert_eq!(obj["taskId"], "s/7");
        assert_eq!(obj["_meta"][RELATED]["taskId"], "s/7");
    }
}
