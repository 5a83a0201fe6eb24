//! What the gateway keeps across sessions, with one owner: the resource subscriptions
//! (refcounted per server and URI), the log levels sessions asked for and the one the
//! downstreams run at, and the tasks sessions created (2025-11-25).
//!
//! Callers ask [`Shared`] through named async methods and get owned answers: nothing hands
//! out a lock or a reference into its maps, and sessions are named by id, never held.
//! This is the in-memory implementation, for one replica; an implementation over a store
//! that replicas share can stand behind the same methods. Delivering to a session is not
//! its business: the router keeps the sessions that live in this process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a public task id leads, and whose task it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoute {
    pub server: Arc<str>,
    /// The downstream's own task id.
    pub task_id: String,
    /// The session that created it.
    pub owner: String,
}

/// The public id of a downstream's task: its own, namespaced by its server. It is a key
/// in the task table, never split to route.
pub fn public_task_id(server: &str, task_id: &str) -> String {
    format!("{server}/{task_id}")
}

/// The cross-session state (see the module doc).
#[derive(Default)]
pub struct Shared {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (server, uri) → the sessions subscribed. The downstream is subscribed while at
    /// least one session is.
    subscriptions: HashMap<(Arc<str>, String), HashSet<String>>,
    /// The level each session chose (an index into `downstream::LOG_LEVELS`).
    log_levels: HashMap<String, usize>,
    /// The level every downstream now runs at: the most verbose any session wants.
    downstream_log: Option<usize>,
    /// Public task id → its route.
    tasks: HashMap<String, TaskRoute>,
}

impl Shared {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every critical section below leaves the maps consistent (see crate::sync).
        crate::sync::lock(&self.inner)
    }

    /// Subscribes `session` to `uri` of `server`; true when it is the first subscriber
    /// (the downstream must be subscribed now).
    pub async fn subscribe(&self, server: &Arc<str>, uri: &str, session: &str) -> bool {
        let mut inner = self.inner();
        let sessions = inner.subscriptions.entry((server.clone(), uri.to_owned())).or_default();
        let first = sessions.is_empty();
        sessions.insert(session.to_owned());
        first
    }

    /// Unsubscribes `session`; true when it was subscribed and was the last (the
    /// downstream may be unsubscribed now).
    pub async fn unsubscribe(&self, server: &Arc<str>, uri: &str, session: &str) -> bool {
        let mut inner = self.inner();
        let key = (server.clone(), uri.to_owned());
        let Some(sessions) = inner.subscriptions.get_mut(&key) else {
            return false;
        };
        if !sessions.remove(session) {
            return false;
        }
        let last = sessions.is_empty();
        if last {
            inner.subscriptions.remove(&key);
        }
        last
    }

    /// The sessions subscribed to `uri` of `server`.
    pub async fn subscribers(&self, server: &Arc<str>, uri: &str) -> Vec<String> {
        self.inner()
            .subscriptions
            .get(&(server.clone(), uri.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The URIs of `server` some session is subscribed to.
    pub async fn subscribed_uris(&self, server: &str) -> Vec<String> {
        self.inner()
            .subscriptions
            .keys()
            .filter(|(s, _)| &**s == server)
            .map(|(_, uri)| uri.clone())
            .collect()
    }

    /// Records the level `session` chose. Returns the level the downstreams must run at
    /// now when that changed: the most verbose (lowest rank) any session wants.
    pub async fn set_log_level(&self, session: &str, rank: usize) -> Option<usize> {
        let mut inner = self.inner();
        inner.log_levels.insert(session.to_owned(), rank);
        let wanted = inner.log_levels.values().copied().min();
        if wanted == inner.downstream_log {
            return None;
        }
        inner.downstream_log = wanted;
        wanted
    }

    /// The level the downstreams run at, once some session chose one.
    pub async fn downstream_log_level(&self) -> Option<usize> {
        self.inner().downstream_log
    }

    /// Records a task a server created for session `owner`; returns its public id.
    pub async fn add_task(&self, server: &Arc<str>, task_id: &str, owner: &str) -> String {
        let public = public_task_id(server, task_id);
        let route = TaskRoute {
            server: server.clone(),
            task_id: task_id.to_owned(),
            owner: owner.to_owned(),
        };
        self.inner().tasks.insert(public.clone(), route);
        public
    }

    /// The task `public` of session `owner`, if it exists and is that session's.
    pub async fn task(&self, public: &str, owner: &str) -> Option<TaskRoute> {
        self.inner().tasks.get(public).filter(|r| r.owner == owner).cloned()
    }

    /// The route of a downstream's task, by its server and own id.
    pub async fn task_by_origin(&self, server: &str, task_id: &str) -> Option<TaskRoute> {
        self.inner().tasks.get(&public_task_id(server, task_id)).cloned()
    }

    /// A session ended: forgets its subscriptions, level and tasks. Returns the (server,
    /// uri) pairs no session is subscribed to any more (to unsubscribe downstream).
    pub async fn forget_session(&self, session: &str) -> Vec<(Arc<str>, String)> {
        let mut inner = self.inner();
        inner.tasks.retain(|_, r| r.owner != session);
        inner.log_levels.remove(session);
        let mut unneeded = Vec::new();
        inner.subscriptions.retain(|key, sessions| {
            if sessions.remove(session) && sessions.is_empty() {
                unneeded.push(key.clone());
            }
            !sessions.is_empty()
        });
        unneeded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscriptions_are_refcounted_and_forgotten_with_their_session() {
        let s = Shared::default();
        let calc: Arc<str> = "calc".into();
        assert!(s.subscribe(&calc, "a://1", "s1").await);
        assert!(!s.subscribe(&calc, "a://1", "s2").await);
        assert!(!s.unsubscribe(&calc, "a://1", "s3").await, "never subscribed");
        assert!(!s.unsubscribe(&calc, "a://1", "s1").await);
        assert_eq!(s.subscribers(&calc, "a://1").await, vec!["s2".to_owned()]);
        assert!(s.subscribe(&calc, "a://2", "s2").await);
        let mut gone = s.forget_session("s2").await;
        gone.sort();
        assert_eq!(
            gone,
            vec![(calc.clone(), "a://1".into()), (calc.clone(), "a://2".into())]
        );
        assert!(s.subscribed_uris("calc").await.is_empty());
    }

    #[tokio::test]
    async fn the_downstream_level_is_the_most_verbose_and_moves_only_when_it_changes() {
        let s = Shared::default();
        assert_eq!(s.set_log_level("a", 4).await, Some(4));
        assert_eq!(s.set_log_level("b", 6).await, None);
        assert_eq!(s.set_log_level("b", 1).await, Some(1));
        assert_eq!(s.downstream_log_level().await, Some(1));
    }

    #[tokio::test]
    async fn tasks_are_bound_to_their_session() {
        let s = Shared::default();
        let calc: Arc<str> = "calc".into();
        let public = s.add_task(&calc, "t-1", "s1").await;
        assert_eq!(public, "calc/t-1");
        assert!(s.task(&public, "s2").await.is_none());
        assert_eq!(s.task(&public, "s1").await.map(|r| r.task_id), Some("t-1".into()));
        assert_eq!(
            s.task_by_origin("calc", "t-1").await.map(|r| r.owner),
            Some("s1".into())
        );
        s.forget_session("s1").await;
        assert!(s.task_by_origin("calc", "t-1").await.is_none());
    }
}
