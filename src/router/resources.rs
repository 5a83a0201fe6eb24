//! Resources by URI: `resources/read`, and subscriptions, refcounted per server and URI
//! (kept by [`crate::shared::Shared`]), delivered to the sessions subscribed and asked
//! again of a restarted server.

use super::{empty, Call, Gateway, Topology};
use crate::downstream::{stateless, Params, LOG_LEVELS};
use crate::error::{code, Error};
use crate::message::{self, Outcome};
use crate::method::Method;
use crate::shared::{TooManySubscriptions, MAX_SUBSCRIPTIONS, MAX_URI_BYTES};
use crate::supervisor::Status;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::sync::Arc;
use tracing::warn;

/// -32002 naming the URI (it does not exist, or the caller may not see it); a long one
/// by its start ([`crate::error::echo`]).
pub(super) fn unknown(uri: &str) -> Outcome {
    let uri = crate::error::echo(uri);
    Error::client(code::RESOURCE_NOT_FOUND, format!("unknown resource: {uri}"))
        .with_data(json!({ "uri": uri }))
        .into()
}

impl Gateway {
    /// resources/read.
    pub(super) async fn read(&self, cx: &mut Call<'_>, params: Option<Box<RawValue>>) -> Outcome {
        let p = match message::params_object(params.as_deref()) {
            Ok(p) => p,
            Err(e) => return Error::invalid_params(e).into(),
        };
        let Some(uri) = p.get("uri").and_then(Value::as_str) else {
            return Error::invalid_params("resources/read needs params.uri").into();
        };
        match resource_owner(cx, uri).filter(|&s| cx.sees(uri, s, false)) {
            Some(server) => self.forward(cx, server, Method::ResourcesRead, p).await,
            None => unknown(uri),
        }
    }

    /// resources/subscribe and resources/unsubscribe: the downstream is subscribed while
    /// at least one session is.
    pub(super) async fn subscription(
        &self,
        cx: &mut Call<'_>,
        method: Method,
        params: Option<Box<RawValue>>,
    ) -> Outcome {
        let p = match message::params_object(params.as_deref()) {
            Ok(p) => p,
            Err(e) => return Error::invalid_params(e).into(),
        };
        let Some(uri) = p.get("uri").and_then(Value::as_str).map(str::to_owned) else {
            return Error::invalid_params(format!("{method} needs params.uri")).into();
        };
        let subscribe = method == Method::ResourcesSubscribe;
        if subscribe && uri.len() > MAX_URI_BYTES {
            // Kept (twice in cluster mode), told to every replica and to every server.
            return Error::invalid_params(format!(
                "{method}: params.uri is {} bytes, over the limit of {MAX_URI_BYTES}",
                uri.len()
            ))
            .with_data(json!({ "maxUriBytes": MAX_URI_BYTES }))
            .into();
        }
        let Some(server) = resource_owner(cx, &uri).filter(|&s| cx.sees(&uri, s, false)) else {
            return unknown(&uri);
        };
        let s = &cx.topo.servers[server];
        if subscribe && s.per_caller() {
            // A subscription is shared by URI, and made on one connection: here it would
            // be made under one caller's credential (or the catalog's) and heard by
            // every caller, while what a caller's own connection says goes nowhere.
            return Error::invalid_params(format!(
                "server '{}' serves each caller on a connection of its own; subscribing to its resources is not supported (read {uri} again instead)",
                s.name
            ))
            .with_data(json!({ "uri": uri, "server": &*s.name }))
            .into();
        }
        let session = &cx.client.id;
        let first_or_last = if subscribe {
            self.remember(cx.client);
            match self.shared.subscribe(&s.name, &uri, session).await {
                Ok(first) => first,
                Err(TooManySubscriptions) => {
                    return Error::invalid_params(format!(
                        "{method}: this session holds {MAX_SUBSCRIPTIONS} subscriptions, the most one may; unsubscribe from one first"
                    ))
                    .with_data(json!({ "uri": uri, "maxSubscriptions": MAX_SUBSCRIPTIONS }))
                    .into();
                }
            }
        } else {
            self.shared.unsubscribe(&s.name, &uri, session).await
        };
        if !first_or_last {
            // Refcounted: the downstream already is (or still must stay) subscribed.
            return empty();
        }
        let name = s.name.clone();
        // Cluster mode: every replica's downstream follows (their children see changes
        // too), before the answer: a change right after it, wherever it happens, is heard.
        let elsewhere = self.subscription_elsewhere(&name, &uri, subscribe);
        if s.stateless() {
            // 2026-07-28 has no resources/subscribe: the URI joins the server's listen stream.
            s.listen_uri(&uri, subscribe);
            elsewhere.await;
            return empty();
        }
        let (out, ()) = tokio::join!(self.forward(cx, server, method, p), elsewhere);
        if subscribe && matches!(out, Outcome::Error(_)) {
            self.shared.unsubscribe(&name, &uri, session).await;
        }
        out
    }

    /// Delivers a server's `notifications/resources/updated` to the sessions subscribed
    /// to that URI, and to no one else.
    pub(super) async fn resource_updated(&self, server: &Arc<str>, method: &str, params: Option<&RawValue>) {
        let Ok(mut p) = message::params_object(params) else {
            return;
        };
        let Some(uri) = p.get("uri").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        // From a 2026-07-28 server's listen stream: its subscription id is the gateway's own.
        let tagged = match p.get_mut("_meta") {
            Some(Value::Object(m)) => {
                let had = m.remove(stateless::META_SUBSCRIPTION).is_some();
                if m.is_empty() {
                    p.remove("_meta");
                }
                had
            }
            _ => false,
        };
        let stripped = tagged.then(|| message::to_raw(&Value::Object(p)));
        let params = stripped.as_deref().or(params);
        let sessions = self.shared.subscribers(server, &uri).await;
        if sessions.is_empty() {
            return;
        }
        let line = Bytes::from(message::notification(method, params));
        for id in sessions {
            // A session whose allowlist hides the URI now (a reload narrowed it) hears
            // nothing of it, as of a URI that does not exist.
            if self
                .live(&id)
                .and_then(|c| c.identity())
                .is_some_and(|i| !i.permits(&uri))
            {
                continue;
            }
            self.deliver(&id, line.clone());
        }
    }

    /// Unsubscribes downstreams from what no session needs any more.
    pub(super) async fn unsubscribe_unneeded(&self, topo: &Topology, unneeded: Vec<(Arc<str>, String)>) {
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
                let method = Method::ResourcesUnsubscribe.as_str();
                let _ = conn
                    .call(method, Params::Raw(Some(params)), None, s.settings().timeout)
                    .await;
            }
        }
    }

    /// Asks a restarted server again for what sessions had asked of its old process:
    /// the resource subscriptions that still have subscribers, and the log level.
    pub(super) async fn restore(&self, server: Arc<str>) {
        let topo = self.topology();
        let Some(s) = topo.servers.iter().find(|s| s.name == server).cloned() else {
            return;
        };
        if s.stateless() {
            // Its listen stream carries the URIs across restarts; log levels go per request.
            return;
        }
        let uris = self.shared.subscribed_uris(&server).await;
        let level = self.shared.downstream_log_level().await.map(|r| LOG_LEVELS[r]);
        let Ok(conn) = s.connection() else { return };
        crate::background::spawn(async move {
            let timeout = s.settings().timeout;
            for uri in uris {
                let params = message::to_raw(&json!({ "uri": uri }));
                if let Err(e) = conn
                    .call(
                        Method::ResourcesSubscribe.as_str(),
                        Params::Raw(Some(params)),
                        None,
                        timeout,
                    )
                    .await
                {
                    warn!(server = %s.name, %uri, error = %e, "re-subscribing after a restart failed");
                }
            }
            let logs = s.state().info.as_ref().is_some_and(|i| i.has("logging"));
            if let (Some(level), true) = (level, logs) {
                let params = message::to_raw(&json!({ "level": level }));
                let method = Method::LoggingSetLevel.as_str();
                let _ = conn.call(method, Params::Raw(Some(params)), None, timeout).await;
            }
        });
    }
}

/// A URI's server: listed URIs, then templates; failing both, the only server of the
/// caller's view that offers resources at all (servers may serve URIs they do not list).
pub(super) fn resource_owner(cx: &Call<'_>, uri: &str) -> Option<usize> {
    let topo = cx.topo;
    // A URI of a server outside the caller's view is looked up as one no server has, so
    // the answer never tells the two apart.
    topo.catalog.resource_owner_among(uri, |s| cx.in_view(s)).or_else(|| {
        let mut offering = topo.servers.iter().enumerate().filter(|&(i, s)| {
            if !cx.in_view(i) {
                return false;
            }
            let st = s.state();
            st.status == Status::Ready && st.info.as_ref().is_some_and(|i| i.has("resources"))
        });
        match (offering.next(), offering.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    })
}

/// Whether `line` is a `notifications/resources/updated` whose URI `c`'s allowlist hides
/// now (a reload narrowed it since the session subscribed): it hears nothing of it, as of
/// a URI that does not exist.
pub(super) fn hidden_update(c: &crate::client::Client, line: &str) -> bool {
    if !line.contains("resources/updated") {
        return false;
    }
    let Some(identity) = c.identity().filter(|i| i.policy.is_some()) else {
        return false;
    };
    let Ok(m) = serde_json::from_str::<Value>(line) else {
        return false;
    };
    m.get("method").and_then(Value::as_str) == Some("notifications/resources/updated")
        && m.pointer("/params/uri")
            .and_then(Value::as_str)
            .is_some_and(|uri| !identity.permits(uri))
}
