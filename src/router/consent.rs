//! A call to a server with `auth.oauth`: it goes on the caller's own connection, with
//! the caller's own token (`upstream::consent`); without one, the caller is asked to
//! consent: -32042 for a 2025-11-25 client that declared `elicitation.url`, else a tool
//! error (or, for other methods, an error) carrying the link.

use super::forward::{failed, forward_bridged, forward_plain, stamp};
use super::Call;
use super::Gateway;
use crate::downstream::{DsError, OpenParams};
use crate::error::Error;
use crate::message::Outcome;
use crate::method::Method;
use crate::upstream::consent::{self, Need};
use serde_json::Value;

impl Gateway {
    pub(super) async fn forward_for_user(
        &self,
        cx: &mut Call<'_>,
        server: usize,
        method: Method,
        mut params: impl OpenParams + Clone,
    ) -> Outcome {
        let s = cx.topo.servers[server].clone();
        let Some(consent) = consent::get() else {
            return Outcome::from(Error::gateway(format!(
                "server '{}' needs each user's consent, which this mode of the gateway cannot ask for",
                s.name
            )));
        };
        // The principal, not the name: a caller of the same name from another issuer has
        // consents of its own.
        let identity = crate::sync::read(&cx.client.identity)
            .as_ref()
            .map(|i| i.principal.clone());
        let session = (!cx.client.stateless).then(|| cx.client.id.clone());
        let asks_url = !cx.client.stateless
            && crate::sync::read(&cx.client.capabilities)
                .as_ref()
                .and_then(|c| c.get("elicitation"))
                .and_then(Value::as_object)
                .is_some_and(|e| e.contains_key("url"));
        let client = cx.client;
        let needs = |need: Need| -> Outcome {
            // notifications/elicitation/complete finds the session by this.
            if session.is_some() {
                self.remember(client);
            }
            if asks_url {
                Outcome::from(need.error())
            } else if method == Method::ToolsCall {
                Outcome::Result(crate::message::to_raw(&need.tool_result()).into())
            } else {
                Outcome::from(Error::invalid_request(format!("{} Open: {}", need.message, need.url)))
            }
        };
        let progress = params.take_progress().map(|t| cx.info.progress.take().unwrap_or(t));
        let sink = cx.sink.take();
        let placeholder = method == Method::ToolsCall
            && params.name().as_deref() == Some(consent::PLACEHOLDER)
            && s.awaiting_consent();
        // A 2026-07-28 server gets the envelope on the whole map; a handshake-era one the
        // params as opened, as `forward` sends them (values nobody touched stay the
        // client's own text).
        let stamped = s.stateless().then(|| {
            let mut map = params.clone().into_map();
            let mut headers = Vec::new();
            stamp(&s, cx.client, method, &mut map, &mut headers);
            (map, headers)
        });
        let _busy = crate::console::Busy::new(&s.in_flight);
        for attempt in 0..2 {
            let conn = match consent.connection(&s, identity.as_deref(), session.as_deref()).await {
                Ok(c) => c,
                Err(Ok(need)) => return needs(need),
                Err(Err(e)) => return Outcome::from(e),
            };
            if placeholder {
                s.wake();
                return Outcome::Result(crate::message::to_raw(&serde_json::json!({
                    "content": [{ "type": "text", "text": format!("You have authorized the gateway for server '{}'; its tools appear in a moment.", s.name) }],
                }))
                .into());
            }
            let res = match &stamped {
                Some((map, headers)) => {
                    let (map, headers, progress) = (map.clone(), headers.clone(), progress.clone());
                    forward_bridged(&s, &conn, client, method, map, headers, progress, sink.clone()).await
                }
                None => forward_plain(&s, &conn, method, params.clone(), progress.clone(), sink.clone()).await,
            };
            match res {
                Ok(out) => return out,
                Err(DsError::Status { status: 401 | 403, .. }) => {
                    // The server refused the token: a refreshed one once, else consent again.
                    let Some(id) = identity.as_deref() else { break };
                    if attempt == 0 && consent.refused(&s, id).await {
                        continue;
                    }
                    break;
                }
                Err(e) => return failed(&s, method, e),
            }
        }
        match consent.connection(&s, identity.as_deref(), session.as_deref()).await {
            Err(Ok(need)) => needs(need),
            Err(Err(e)) => Outcome::from(e),
            Ok(_) => Outcome::from(Error::server(
                &s.name,
                crate::error::code::INTERNAL_ERROR,
                format!(
                    "server '{}' refused the user's token again after it was refreshed",
                    s.name
                ),
            )),
        }
    }
}
