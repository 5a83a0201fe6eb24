//! The `subscriptions/listen` stream a 2026-07-28 server tells of changes on: every
//! list_changed it offers, and `resources/updated` for the URIs clients subscribed to.

use super::{Server, RETRY_MAX, RETRY_MIN, STABLE};
use crate::downstream::{stateless, Params};
use crate::message::{self, Outcome};
use crate::method::Method;
use crate::sync;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// A listen stream has no answer to wait for; this only bounds the wait.
const LISTEN_FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The resource URIs a server's listen stream asks for (the clients' refcounted
/// `resources/subscribe`s); kept across restarts.
#[derive(Default)]
pub(super) struct Subscriptions {
    uris: Mutex<BTreeSet<String>>,
    /// Wakes the listen loop to open a new stream with the current URIs.
    changed: Notify,
}

impl Server {
    /// Adds (or removes) a resource URI to the server's listen stream, which is opened
    /// again with the new set.
    pub fn listen_uri(&self, uri: &str, add: bool) {
        let changed = {
            let mut uris = sync::lock(&self.subscriptions.uris);
            if add {
                uris.insert(uri.to_owned())
            } else {
                uris.remove(uri)
            }
        };
        if changed {
            self.subscriptions.changed.notify_one();
        }
    }

    /// Keeps one `subscriptions/listen` open to a 2026-07-28 server for as long as its
    /// connection lives. Its notifications arrive like any server notification (the
    /// supervisor re-lists; the router fans `resources/updated` out). A stream that ends
    /// is opened again after a pause; a change of URIs replaces it.
    pub(super) async fn listen(self: Arc<Self>) {
        let mut pause = RETRY_MIN;
        loop {
            let (conn, caps) = {
                let s = self.state();
                match (&s.conn, &s.info) {
                    (Some(c), Some(i)) => (c.clone(), i.capabilities.clone().unwrap_or_default()),
                    _ => return,
                }
            };
            let filter = self.filter(&caps);
            let changed = self.subscriptions.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if filter.is_empty() {
                changed.await;
                continue;
            }
            let mut p = Map::new();
            p.insert("notifications".into(), Value::Object(filter));
            let params = Params::Object {
                params: stateless::own_params(p),
                progress: None,
            };
            let began = Instant::now();
            tokio::select! {
                out = conn.call(Method::SubscriptionsListen.as_str(), params, None, LISTEN_FOREVER) => {
                    if conn.is_closed() {
                        return;
                    }
                    match out {
                        Ok(Outcome::Error(e)) => {
                            warn!(server = %self.name, error = %message::error_summary(&e).1, "subscriptions/listen refused")
                        }
                        Err(e) => debug!(server = %self.name, error = %e, "subscriptions/listen ended"),
                        Ok(Outcome::Result(_)) => debug!(server = %self.name, "subscriptions/listen closed by the server"),
                    }
                    if began.elapsed() >= STABLE {
                        pause = RETRY_MIN;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = &mut changed => {}
                    }
                    pause = (pause * 2).min(RETRY_MAX);
                }
                _ = &mut changed => debug!(server = %self.name, "resource subscriptions changed; listening again"),
            }
        }
    }

    /// The stream's `notifications` filter: the list_changed kinds the server offers
    /// (`caps`), and the subscribed URIs.
    fn filter(&self, caps: &Map<String, Value>) -> Map<String, Value> {
        let mut filter = Map::new();
        for (cap, key) in [
            ("tools", "toolsListChanged"),
            ("prompts", "promptsListChanged"),
            ("resources", "resourcesListChanged"),
        ] {
            if caps
                .get(cap)
                .and_then(|c| c.get("listChanged"))
                .and_then(Value::as_bool)
                == Some(true)
            {
                filter.insert(key.into(), Value::Bool(true));
            }
        }
        let uris: Vec<Value> = sync::lock(&self.subscriptions.uris)
            .iter()
            .map(|u| Value::String(u.clone()))
            .collect();
        if !uris.is_empty() {
            filter.insert("resourceSubscriptions".into(), Value::Array(uris));
        }
        filter
    }
}
