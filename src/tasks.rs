//! Tasks (2025-11-25, experimental) through the gateway.
//!
//! A task id is the downstream's own, namespaced by its server: `{server}/{taskId}`.
//! The name is a key in a table, never split to route: the table maps it back to the
//! server and the original id, and binds the task to the session that created it, so
//! another session asking for it (tasks/get, tasks/result, tasks/cancel, tasks/list)
//! is told it does not exist.

use crate::message;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a public task id leads, and whose task it is.
#[derive(Debug, Clone)]
pub struct TaskRoute {
    pub server: Arc<str>,
    /// The downstream's own task id.
    pub task_id: String,
    /// The session that created it.
    pub owner: String,
}

/// The gateway's task table.
#[derive(Default)]
pub struct Tasks {
    routes: Mutex<HashMap<String, TaskRoute>>,
}

/// The public id of a downstream's task.
pub fn public_id(server: &str, task_id: &str) -> String {
    format!("{server}/{task_id}")
}

/// The key under which `_meta` relates a message to a task.
pub const RELATED: &str = "io.modelcontextprotocol/related-task";

impl Tasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskRoute>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task `public` of session `owner`, if it exists and is that session's.
    pub fn resolve(&self, public: &str, owner: &str) -> Option<TaskRoute> {
        self.lock().get(public).filter(|r| r.owner == owner).cloned()
    }

    /// The route of a downstream's task, by its server and own id.
    pub fn by_origin(&self, server: &str, task_id: &str) -> Option<TaskRoute> {
        self.lock().get(&public_id(server, task_id)).cloned()
    }

    /// Records a task a server created for `owner`; returns its public id.
    pub fn register(&self, server: &Arc<str>, task_id: &str, owner: &str) -> String {
        let public = public_id(server, task_id);
        self.lock().insert(
            public.clone(),
            TaskRoute {
                server: server.clone(),
                task_id: task_id.to_owned(),
                owner: owner.to_owned(),
            },
        );
        public
    }

    /// Forgets every task of a session.
    pub fn forget_owner(&self, owner: &str) {
        self.lock().retain(|_, r| r.owner != owner);
    }

    /// Forgets every task of a server (it was stopped or replaced).
    pub fn forget_server(&self, server: &str) {
        self.lock().retain(|_, r| &*r.server != server);
    }
}

/// Puts the public id in place of the server's in a task object (`taskId`) and in
/// `_meta[related-task].taskId`. Returns whether anything changed.
pub fn rewrite_task_object(obj: &mut Map<String, Value>, server: &str) -> Option<String> {
    let mut public = None;
    if let Some(Value::String(id)) = obj.get_mut("taskId") {
        let p = public_id(server, id);
        *id = p.clone();
        public = Some(p);
    }
    if let Some(Value::Object(meta)) = obj.get_mut("_meta") {
        if let Some(Value::Object(rel)) = meta.get_mut(RELATED) {
            if let Some(Value::String(id)) = rel.get_mut("taskId") {
                *id = public_id(server, id);
            }
        }
    }
    public
}

/// Opens a raw result as an object (empty on anything else).
pub fn open(raw: &str) -> Map<String, Value> {
    match serde_json::from_str(raw) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Serializes an object back to a raw value.
pub fn close(obj: Map<String, Value>) -> Box<RawValue> {
    message::to_raw(&Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_namespaced_and_bound_to_their_session() {
        let t = Tasks::default();
        let server: Arc<str> = Arc::from("calc");
        let public = t.register(&server, "abc", "session-a");
        assert_eq!(public, "calc/abc");
        assert_eq!(
            t.resolve(&public, "session-a").map(|r| r.task_id),
            Some("abc".to_owned())
        );
        assert!(t.resolve(&public, "session-b").is_none());
        t.forget_owner("session-a");
        assert!(t.resolve(&public, "session-a").is_none());
    }

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
