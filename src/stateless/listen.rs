//! `subscriptions/listen` (2026-07-28): one request whose answer is a stream of
//! notifications, on any front (HTTP sends it as an SSE response, stdio as lines).
//!
//! The stream starts with `notifications/subscriptions/acknowledged` (the filter the
//! gateway agreed to honor), then carries the gateway's `notifications/{tools,prompts,
//! resources}/list_changed` (the same broadcast handshake sessions get) and
//! `notifications/resources/updated` for the URIs it subscribed, each only if the filter
//! asked for it. Every frame has `_meta["io.modelcontextprotocol/subscriptionId"]` = the
//! listen request's id, as sent (a number stays a number).
//!
//! Resource URIs are subscribed through the router's refcounted `resources/subscribe`, as
//! the stream's own throwaway client: a URI that is unknown, hidden by the caller's
//! allowlist, or whose server refuses the subscription is left out of the acknowledged
//! filter (and never fires). When the stream ends, whatever way, the client is forgotten,
//! which unsubscribes downstreams nobody else needs. A graceful end (gateway shutdown)
//! sends the listen request's response, `{resultType: "complete"}` with the subscription
//! id in `_meta`; an abrupt one (the client went away, cancelled it, or could not keep
//! up with the broadcast) sends nothing more.

use super::results::Finish;
use super::{Counted, Tracked};
use crate::catalog::view::recv_for;
use crate::client::Client;
use crate::message::{self, Id, Outcome};
use crate::router::Gateway;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::message::meta::META_SUBSCRIPTION;

/// What a listen request asked to hear about.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    pub uris: Vec<String>,
}

/// The most resource URIs one listen stream subscribes to.
pub const MAX_URIS: usize = 1024;

impl Filter {
    /// Reads `params.notifications` (absent: nothing asked). Wrong types are an error.
    pub fn parse(params: &Map<String, Value>) -> Result<Filter, String> {
        let n = match params.get("notifications") {
            None | Some(Value::Null) => return Ok(Filter::default()),
            Some(Value::Object(n)) => n,
            Some(_) => return Err("params.notifications must be an object".into()),
        };
        let flag = |k: &str| match n.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("params.notifications.{k} must be a boolean")),
        };
        let mut uris: Vec<String> = Vec::new();
        match n.get("resourceSubscriptions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                // Each URI is a subscription at its server (and an unsubscribe when the
                // stream ends): a bounded number, and duplicates found in linear time.
                if a.len() > MAX_URIS {
                    return Err(format!(
                        "params.notifications.resourceSubscriptions has {} URIs; one stream takes at most {MAX_URIS}",
                        a.len()
                    ));
                }
                let mut seen = std::collections::HashSet::with_capacity(a.len());
                for u in a {
                    let Value::String(u) = u else {
                        return Err("params.notifications.resourceSubscriptions must be an array of strings".into());
                    };
                    if seen.insert(u.as_str()) {
                        uris.push(u.clone());
                    }
                }
            }
            Some(_) => {
                return Err("params.notifications.resourceSubscriptions must be an array of strings".into());
            }
        }
        Ok(Filter {
            tools: flag("toolsListChanged")?,
            prompts: flag("promptsListChanged")?,
            resources: flag("resourcesListChanged")?,
            uris,
        })
    }
}

/// One open listen stream.
pub struct Listen {
    pub gw: Arc<Gateway>,
    /// The stream's own client (a unique id, the caller's identity): its resource
    /// subscriptions are the stream's.
    pub client: Arc<Client>,
    /// The listen request's id: the subscription id.
    pub id: Id,
    pub filter: Filter,
    /// Cancelled when the gateway shuts down: the stream ends gracefully.
    pub closing: CancellationToken,
    /// Cancelled when the client cancels the stream: it ends without a response.
    pub cancel: CancellationToken,
    /// Decorates the final (graceful) result.
    pub finish: Finish,
    /// Held while the stream is open (its place among the open streams, or in a table
    /// of requests in flight).
    pub(super) _held: (Counted, Option<Tracked>),
}

/// Forgets the stream's client when the stream ends, whatever way.
struct Forget(Arc<Gateway>, Arc<Client>);

impl Drop for Forget {
    fn drop(&mut self) {
        let (gw, client) = (self.0.clone(), self.1.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            crate::background::spawn_on(async move { gw.forget_client(&client).await }, &rt);
        }
    }
}

/// Runs a listen stream: every message goes to `out` through `frame` (SSE framing on
/// HTTP, nothing on stdio); `keepalive` (after that long without a message) too. Ends
/// when `out` closes, the stream is cancelled, or the gateway closes it.
pub async fn run(l: Listen, out: mpsc::Sender<Bytes>, frame: fn(&[u8]) -> Bytes, keepalive: Option<(Duration, Bytes)>) {
    // Subscribed before anything is asked of servers, so nothing that happens meanwhile
    // is lost; it is sent after the acknowledgment.
    let mut changes = l.gw.subscribe();
    let mut own = l.client.subscribe_own();
    let mut reloads = l.gw.reloads.subscribe();
    let _forget = Forget(l.gw.clone(), l.client.clone());
    let mut honored = Vec::new();
    for (i, uri) in l.filter.uris.iter().enumerate() {
        let params = message::to_raw(&json!({ "uri": uri }));
        let id = Id::string(&format!("listen-subscribe-{i}"));
        let sub = l.gw.request(
            &l.client,
            crate::router::Request::of(&id, crate::method::Method::ResourcesSubscribe, Some(params)),
            None,
            None,
        );
        let res = tokio::select! {
            r = sub => r,
            _ = l.cancel.cancelled() => return,
            _ = out.closed() => return,
        };
        match res {
            Some(Outcome::Result(_)) => honored.push(uri.clone()),
            other => {
                let why = match other {
                    Some(Outcome::Error(e)) => e.get().to_owned(),
                    _ => "cancelled".into(),
                };
                debug!(%uri, error = %why, "listen: resource subscription not honored");
            }
        }
    }
    let mut ack = Map::new();
    for (flag, key) in [
        (l.filter.tools, "toolsListChanged"),
        (l.filter.prompts, "promptsListChanged"),
        (l.filter.resources, "resourcesListChanged"),
    ] {
        if flag {
            ack.insert(key.into(), Value::Bool(true));
        }
    }
    if !honored.is_empty() {
        ack.insert("resourceSubscriptions".into(), json!(honored));
    }
    // The subscription id as the client wrote it (a Value would reformat a number).
    let mut meta = message::Members::new();
    meta.insert_id(META_SUBSCRIPTION, &l.id);
    let mut params = message::Members::new();
    params.insert_members("_meta", &meta);
    params.insert_value("notifications", &Value::Object(ack));
    let ack = message::notification_with_members("notifications/subscriptions/acknowledged", &params);
    if out.send(frame(&ack)).await.is_err() {
        return;
    }
    // A stream opened with a JWT ends when the JWT does, as a GET stream does: gracefully,
    // so the client listens again with the token it has now (which is checked).
    let expires = l
        .client
        .identity()
        .and_then(|i| i.bearer.as_ref().and_then(|b| crate::auth::valid_until(b.expose())));
    let expiry = async move {
        match expires {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    loop {
        let idle = async {
            match &keepalive {
                Some((d, _)) => tokio::time::sleep(*d).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            biased;
            _ = l.cancel.cancelled() => return,
            _ = out.closed() => return,
            _ = l.closing.cancelled() => {
                let _ = out.send(frame(&ended(&l))).await;
                return;
            }
            () = &mut expiry => {
                debug!(subscription = %l.id, "listen stream ended: the JWT it was opened with expired");
                let _ = out.send(frame(&ended(&l))).await;
                return;
            }
            Ok(()) = reloads.changed() => {
                // As a session's streams do: a revoked caller's stream ends, the others
                // take the new allowlist.
                if !follow_reload(&l) {
                    debug!(subscription = %l.id, "listen stream ended: its client or its token is no longer in gateway.toml");
                    return;
                }
                continue;
            }
            m = recv_for(&mut changes, l.client.view()) => m,
            m = own.recv() => m,
            () = idle => {
                if let Some((_, comment)) = &keepalive {
                    if out.send(comment.clone()).await.is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let m = match next {
            Ok(m) => m,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                // No replay in this era: the client re-listens and lists again.
                tracing::warn!(subscription = %l.id, missed = n, "listen stream cannot keep up; ending it");
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        // (A reload is seen before any message: its branch comes first.)
        let identity = l.client.identity();
        let visible = |uri: &str| identity.as_ref().is_none_or(|i| i.permits(uri));
        if let Some(tagged) = tag(&m, &l.filter, &honored, &l.id, &visible) {
            if out.send(frame(&tagged)).await.is_err() {
                return;
            }
        }
    }
}

/// The listen request's response that ends its stream gracefully.
fn ended(l: &Listen) -> Vec<u8> {
    // The subscription id as the client wrote it (a Value would reformat a number).
    let mut meta = message::Members::new();
    meta.insert_id(META_SUBSCRIPTION, &l.id);
    let mut result = message::Members::new();
    result.insert_members("_meta", &meta);
    let done = l.finish.apply(Outcome::Result(result.into_raw().into()));
    message::response(&l.id, &done)
}

/// Rereads the stream's caller under the configuration now in force; `false` when its
/// credential is gone (see [`crate::auth::Authenticator::reread`]).
fn follow_reload(l: &Listen) -> bool {
    let Some(was) = l.client.identity() else { return true };
    match l.gw.topology().auth.reread(&was) {
        Some(now) => {
            l.client.set_identity(Some(now));
            true
        }
        None => false,
    }
}

/// The notification with the subscription id in `params._meta`, if the filter wants it
/// (and, for a resource, the client may still see it).
fn tag(m: &[u8], filter: &Filter, honored: &[String], id: &Id, visible: &dyn Fn(&str) -> bool) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(m).ok()?;
    let wanted = match v.get("method").and_then(Value::as_str)? {
        "notifications/tools/list_changed" => filter.tools,
        "notifications/prompts/list_changed" => filter.prompts,
        "notifications/resources/list_changed" => filter.resources,
        "notifications/resources/updated" => v
            .get("params")
            .and_then(|p| p.get("uri"))
            .and_then(Value::as_str)
            .is_some_and(|u| honored.iter().any(|h| h == u) && visible(u)),
        _ => false,
    };
    if !wanted {
        return None;
    }
    // Written from the raw message, so the id goes in as the client wrote it.
    let message::Kind::Notification { method, params } = message::Kind::parse(m).ok()? else {
        return None;
    };
    let mut params = message::Members::parse(params).ok()?;
    let meta = params.get_raw("_meta").unwrap_or("{}");
    let mut meta = message::Members::parse(Some(RawValue::from_string(meta.to_owned()).ok()?)).ok()?;
    meta.insert_id(META_SUBSCRIPTION, id);
    params.insert_members("_meta", &meta);
    Some(message::notification_with_members(&method, &params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_and_tagging() {
        let p =
            json!({"notifications": {"toolsListChanged": true, "resourceSubscriptions": ["a://1", "a://1", "b://2"]}});
        let f = Filter::parse(p.as_object().unwrap()).unwrap();
        assert!(f.tools && !f.prompts && !f.resources);
        assert_eq!(f.uris, vec!["a://1", "b://2"]);
        for bad in [
            json!({"notifications": 1}),
            json!({"notifications": {"toolsListChanged": "yes"}}),
            json!({"notifications": {"resourceSubscriptions": [1]}}),
            json!({"notifications": {"resourceSubscriptions": (0..=MAX_URIS).map(|i| format!("a://{i}")).collect::<Vec<_>>()}}),
        ] {
            assert!(Filter::parse(bad.as_object().unwrap()).is_err(), "{bad}");
        }
        let honored = vec!["a://1".to_owned()];
        let all = |_: &str| true;
        let tools = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
        let t: Value = serde_json::from_slice(&tag(tools, &f, &honored, &Id::from(7), &all).unwrap()).unwrap();
        assert_eq!(t["params"]["_meta"][META_SUBSCRIPTION], json!(7));
        let prompts = br#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#;
        assert!(tag(prompts, &f, &honored, &Id::from(7), &all).is_none());
        let upd = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"a://1"}}"#;
        let u: Value = serde_json::from_slice(&tag(upd, &f, &honored, &Id::string("s"), &all).unwrap()).unwrap();
        assert_eq!(u["params"]["_meta"][META_SUBSCRIPTION], json!("s"));
        assert_eq!(u["params"]["uri"], "a://1");
        let other = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"b://2"}}"#;
        assert!(tag(other, &f, &honored, &Id::from(7), &all).is_none());
        assert!(
            tag(upd, &f, &honored, &Id::from(7), &|_: &str| false).is_none(),
            "hidden since"
        );
    }
}
