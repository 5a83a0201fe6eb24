//! What the gateway keeps for sessions across servers: resource subscriptions
//! (refcounted per server and URI), the log level downstreams run at, tasks bound to
//! the sessions that created them, and what a restarted server must be asked again.

use super::{Gateway, Topology};
use crate::client::Client;
use crate::downstream::Params;
use crate::message::{self, Outcome};
use crate::supervisor::Server;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::sync::{Arc, Weak};
use tracing::{debug, warn};

impl Gateway {
    /// Delivers a server's `notifications/resources/updated` to the sessions subscribed
    /// to that URI, and to no one else.
    pub(super) fn resource_updated(&self, server: &Arc<str>, method: &str, params: Option<&RawValue>) {
        let Ok(mut p) = message::params_object(params) else {
            return;
        };
        let Some(uri) = p.get("uri").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        // From a 2026-07-28 server's listen stream: its subscription id is the gateway's own.
        let tagged = match p.get_mut("_meta") {
            Some(Value::Object(m)) => {
                let had = m.remove(crate::downstream::stateless::META_SUBSCRIPTION).is_some();
                if m.is_empty() {
                    p.remove("_meta");
                }
                had
            }
            _ => false,
        };
        let stripped = tagged.then(|| message::to_raw(&Value::Object(p)));
        let params = stripped.as_deref().or(params);
        let targets: Vec<Arc<Client>> = {
            let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
            let Some(sessions) = subs.get_mut(&(server.clone(), uri)) else {
                return;
            };
            sessions.retain(|_, c| c.strong_count() > 0);
            sessions.values().filter_map(Weak::upgrade).collect()
        };
        let line = Bytes::from(message::notification(method, params));
        for c in targets {
            let _ = c.own.send(line.clone());
        }
    }

    /// Sets every downstream that offers logging to the most verbose level any live
    /// session asked for, when that changed. Each session's messages are then filtered
    /// to its own level on the way out.
    pub(super) async fn apply_log_level(&self, topo: &Topology) {
        let wanted = {
            let mut clients = self.log_clients.lock().unwrap_or_else(|e| e.into_inner());
            clients.retain(|_, c| c.strong_count() > 0);
            clients
                .values()
                .filter_map(Weak::upgrade)
                .filter_map(|c| *c.log_level.read().unwrap_or_else(|e| e.into_inner()))
                .min()
        };
        let Some(rank) = wanted else { return };
        {
            let mut current = self.downstream_log.lock().unwrap_or_else(|e| e.into_inner());
            if *current == Some(rank) {
                return;
            }
            *current = Some(rank);
        }
        let level = crate::downstream::LOG_LEVELS[rank];
        let calls = topo.servers.iter().filter_map(|s| {
            // A 2026-07-28 server gets the level with each request instead.
            let logs = s
                .state()
                .info
                .as_ref()
                .is_some_and(|i| i.has("logging") && !i.stateless);
            let conn = s.connection().ok().filter(|_| logs)?;
            let params = message::to_raw(&json!({ "level": level }));
            Some(async move {
                if let Err(e) = conn
                    .call(
                        "logging/setLevel",
                        Params::Raw(Some(params)),
                        None,
                        s.settings().timeout,
                    )
                    .await
                {
                    debug!(server = %s.name, error = %e, "setting the log level failed");
                }
            })
        });
        futures::future::join_all(calls).await;
    }

    /// Rewrites a server's CreateTaskResult for the client and binds the task to it.
    pub(super) fn created_task(&self, server: &Arc<str>, client: &Arc<Client>, result: &str) -> Option<Outcome> {
        let mut body = crate::tasks::open(result);
        let Some(Value::Object(task)) = body.get_mut("task") else {
            return None;
        };
        let original = task.get("taskId").and_then(Value::as_str)?.to_owned();
        crate::tasks::rewrite_task_object(task, server);
        crate::tasks::rewrite_task_object(&mut body, server);
        self.tasks.register(server, &original, &client.id);
        self.task_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(client.id.clone(), Arc::downgrade(client));
        Some(Outcome::Result(crate::tasks::close(body).into()))
    }

    /// tasks/list: this session's tasks, from every server that lists tasks.
    pub(super) async fn list_tasks(&self, topo: &Topology, client: &Arc<Client>) -> Outcome {
        let mut all = Vec::new();
        for s in topo.servers.iter().filter(|s| supports_tasks(s, "list")) {
            // A session's own process holds its tasks; none is started just to list.
            let conn = s.existing_connection_for(&client.id).await;
            let Some(conn) = conn else { continue };
            let mut cursor: Option<String> = None;
            for _ in 0..100 {
                let params = cursor.as_ref().map(|c| message::to_raw(&json!({ "cursor": c })));
                let Ok(Outcome::Result(r)) = conn
                    .call("tasks/list", Params::Raw(params), None, s.settings().timeout)
                    .await
                else {
                    break;
                };
                let mut page = crate::tasks::open(r.get());
                if let Some(Value::Array(tasks)) = page.remove("tasks") {
                    for t in tasks {
                        let Value::Object(mut t) = t else { continue };
                        let Some(id) = t.get("taskId").and_then(Value::as_str) else {
                            continue;
                        };
                        if self
                            .tasks
                            .resolve(&crate::tasks::public_id(&s.name, id), &client.id)
                            .is_some()
                        {
                            crate::tasks::rewrite_task_object(&mut t, &s.name);
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
    pub(super) fn task_status(&self, server: &Arc<str>, method: &str, params: Option<&RawValue>) {
        let Some(raw) = params else { return };
        let mut body = crate::tasks::open(raw.get());
        let Some(id) = body.get("taskId").and_then(Value::as_str) else {
            return;
        };
        let Some(route) = self.tasks.by_origin(server, id) else {
            return;
        };
        let owner = self
            .task_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&route.owner)
            .and_then(Weak::upgrade);
        let Some(owner) = owner else { return };
        crate::tasks::rewrite_task_object(&mut body, server);
        let line = Bytes::from(message::notification(method, Some(&crate::tasks::close(body))));
        let _ = owner.own.send(line);
    }

    /// A session ended: drop its subscriptions, unsubscribing downstreams nobody else needs.
    pub async fn forget_client(&self, client: &Client) {
        self.tasks.forget_owner(&client.id);
        self.task_owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&client.id);
        let isolated: Vec<Arc<Server>> = self
            .topology()
            .servers
            .iter()
            .filter(|s| s.cfg.isolation == crate::config::Isolation::Session)
            .cloned()
            .collect();
        for s in isolated {
            s.end_session(&client.id).await;
        }
        self.log_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&client.id);
        let unneeded: Vec<(Arc<str>, String)> = {
            let mut subs = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
            let mut gone = Vec::new();
            subs.retain(|key, sessions| {
                sessions.remove(&client.id);
                sessions.retain(|_, c| c.strong_count() > 0);
                if sessions.is_empty() {
                    gone.push(key.clone());
                }
                !sessions.is_empty()
            });
            gone
        };
        let topo = self.topology();
        for (server, uri) in unneeded {
            let Some(s) = topo.servers.iter().find(|s| s.name == server) else {
                continue;
            };
            if s.stateless() {
                s.listen_uri(&uri, false);
                continue;
            }
            if let Ok(conn) = s.connection() {
                let params = message::to_raw(&json!({ "uri": uri }));
                let _ = conn
                    .call(
                        "resources/unsubscribe",
                        Params::Raw(Some(params)),
                        None,
                        s.settings().timeout,
                    )
                    .await;
            }
        }
    }

    /// Asks a restarted server again for what sessions had asked of its old process:
    /// the resource subscriptions that still have subscribers, and the log level.
    pub(super) fn restore(&self, server: Arc<str>) {
        let topo = self.topology();
        let Some(s) = topo.servers.iter().find(|s| s.name == server).cloned() else {
            return;
        };
        if s.stateless() {
            // Its listen stream carries the URIs across restarts; log levels go per request.
            return;
        }
        let uris: Vec<String> = self
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((srv, _), sessions)| *srv == server && sessions.values().any(|c| c.strong_count() > 0))
            .map(|((_, uri), _)| uri.clone())
            .collect();
        let level =
            (*self.downstream_log.lock().unwrap_or_else(|e| e.into_inner())).map(|r| crate::downstream::LOG_LEVELS[r]);
        let Ok(conn) = s.connection() else { return };
        tokio::spawn(async move {
            let timeout = s.settings().timeout;
            for uri in uris {
                let params = message::to_raw(&json!({ "uri": uri }));
                if let Err(e) = conn
                    .call("resources/subscribe", Params::Raw(Some(params)), None, timeout)
                    .await
                {
                    warn!(server = %s.name, %uri, error = %e, "re-subscribing after a restart failed");
                }
            }
            let logs = s.state().info.as_ref().is_some_and(|i| i.has("logging"));
            if let (Some(level), true) = (level, logs) {
                let params = message::to_raw(&json!({ "level": level }));
                let _ = conn
                    .call("logging/setLevel", Params::Raw(Some(params)), None, timeout)
                    .await;
            }
        });
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
