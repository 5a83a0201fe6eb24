//! Sending one call to its server: the server's rate limit, its connection (shared, or
//! the session's own process), the trace context, and for a 2026-07-28 server the
//! per-request envelope and the bridge that answers `input_required` for a handshake-era
//! client.

use super::{Call, Gateway};
use crate::client::Client;
use crate::config::Transport;
use crate::downstream::{stateless, Connection, DsError, OpenParams, Sink, LOG_LEVELS};
use crate::message::{Id, Outcome};
use crate::method::Method;
use crate::supervisor::{Caller, Server};
use crate::telemetry::{self, DownstreamSpan};
use serde_json::{Map, Value};
use tracing::{warn, Instrument};

impl Gateway {
    /// Sends `method` with `params` to server number `server` of the call's topology.
    pub(super) async fn forward(
        &self,
        cx: &mut Call<'_>,
        server: usize,
        method: Method,
        mut params: impl OpenParams + Clone,
    ) -> Outcome {
        let topo = cx.topo;
        let s = &topo.servers[server];
        cx.info.server = Some(s.name.clone());
        cx.info.index = Some(server);
        if !cx.route_spent {
            // tools/call and prompts/get were checked with their names already (and a
            // call forwarded here from another replica was checked there).
            if let Err(out) = self.spend_route(cx, method, server, None).await {
                return out;
            }
        }
        if s.oauth().is_some() {
            // Each user's own token, on a connection of their own (router/consent.rs);
            // never another replica's session process.
            return Box::pin(self.forward_for_user(cx, server, method, params)).await;
        }
        // Cluster mode: a session's own process may run on another replica.
        if let Some(session) = cx.info.session.clone() {
            if let Some(holder) = self.holder(s, &session).await {
                let params = params.into_map();
                return match Box::pin(self.forward_to(holder, cx, server, method, params.clone())).await {
                    Some(out) => out,
                    // The holder lost it: this replica claimed it, and runs it.
                    None => Box::pin(self.forward(cx, server, method, params)).await,
                };
            }
        }
        let conn = if let Some(te) = s.token_exchange() {
            // The caller's own session, with its exchanged token (src/upstream/).
            Box::pin(self.connection_as(s, te, cx.client)).await
        } else if s.pooled() {
            let caller = Caller {
                session: cx.info.session.as_deref(),
                client: cx.identity.map(|i| (i.name.as_str(), i.secrets())),
                principal: cx.identity.map(|i| i.process_key()),
            };
            // Boxed: starting a caller's own process (probe, handshake, lists) is a large
            // future, and inline it would make every request's future that large.
            Box::pin(s.connection_for(&caller)).await
        } else {
            s.connection()
        };
        let conn = match conn {
            Ok(c) => c.for_caller(|| crate::downstream::Who {
                identity: cx.identity.map(|i| i.name.as_str()),
                session: cx.client.id.as_str(),
                share: cx.client.share.as_deref(),
            }),
            Err(e) => return Outcome::Error(e.to_error_object()),
        };
        let _busy = crate::console::Busy::new(&s.in_flight);
        let progress = params.take_progress().map(|t| cx.info.progress.take().unwrap_or(t));
        let sink = cx.sink.take();
        let stateless = s.state().info.as_ref().is_some_and(|i| i.stateless);
        if !stateless {
            // Handshake era: no envelope, no bridge; the params go on as opened (for
            // tools/call and prompts/get, Members: untouched values stay raw).
            return forward_plain(s, &conn, method, params, progress, sink)
                .await
                .unwrap_or_else(|e| failed(s, method, e));
        }
        // The 2026-07-28 envelope and the input_required retry work on the whole map.
        let mut params = params.into_map();
        let mut headers = Vec::new();
        stamp(s, cx.client, method, &mut params, &mut headers);
        // Boxed: the bridge's rounds are a large future, and inline they would make every
        // call's future (a handshake-era server's too) that large.
        Box::pin(forward_bridged(
            s, &conn, cx.client, method, params, headers, progress, sink,
        ))
        .await
        .unwrap_or_else(|e| failed(s, method, e))
    }
}

/// [`forward_stamped`], and for a handshake-era client of a call that may ask, the bridge:
/// such a client cannot take an `input_required` result, so the gateway asks it the
/// server's questions itself and retries (the first bridge). Of any other call, such a
/// client gets an `input_required` as the server's error.
#[allow(clippy::too_many_arguments)]
pub(super) async fn forward_bridged(
    s: &Server,
    conn: &Connection,
    client: &Client,
    method: Method,
    params: Map<String, Value>,
    headers: Vec<(String, String)>,
    progress: Option<Id>,
    sink: Option<Sink>,
) -> Result<Outcome, DsError> {
    let bridge = !client.stateless && method.may_ask();
    let retry = bridge.then(|| (params.clone(), headers.clone(), progress.clone(), sink.clone()));
    let timeout = s.settings().timeout;
    let out = forward_stamped(s, conn, method, params, headers, progress, sink).await?;
    Ok(match retry {
        Some((params, headers, progress, sink)) => {
            stateless::bridge_input_required(
                conn,
                &s.name,
                method.as_str(),
                out,
                params,
                headers,
                progress,
                sink,
                timeout,
            )
            .await
        }
        // Such a client cannot take an `input_required`, and this method may not ask.
        None if !client.stateless => stateless::refuse_input_required(&s.name, method.as_str(), out),
        // A 2026-07-28 client asks the questions itself: checked against what it declared.
        None => stateless::relay_input_required(&s.name, method, client, out),
    })
}

impl Gateway {
    /// The connection of the calling identity to a `token_exchange` server, with a fresh
    /// exchanged token.
    async fn connection_as(
        &self,
        s: &Server,
        te: &crate::config::TokenExchange,
        client: &Client,
    ) -> Result<Connection, crate::downstream::DsError> {
        let identity = client.identity();
        // Keyed by the principal, not the name: a name another issuer gives is another caller.
        let (principal, subject) = match &identity {
            Some(i) => (i.principal.as_str(), i.bearer.as_ref()),
            None => ("", None),
        };
        let bearer = self
            .exchanger
            .bearer(&s.name, te, principal, subject, self.cluster())
            .await
            .map_err(|e| crate::downstream::DsError::Unavailable {
                server: s.name.clone(),
                reason: e.to_string(),
            })?;
        s.connection_as(principal, bearer).await
    }
}

/// A call to a handshake-era server: trace context in, params out as they are.
pub(super) async fn forward_plain(
    s: &Server,
    conn: &Connection,
    method: Method,
    params: impl OpenParams,
    progress: Option<Id>,
    sink: Option<Sink>,
) -> Result<Outcome, DsError> {
    traced(s, conn, method, params, Vec::new(), progress, sink).await
}

/// A call to a 2026-07-28 server, its params stamped with the envelope ([`stamp`]) and
/// `headers` the `Mcp-Param-*` ones: trace context in, the map out.
pub(super) async fn forward_stamped(
    s: &Server,
    conn: &Connection,
    method: Method,
    params: Map<String, Value>,
    headers: Vec<(String, String)>,
    progress: Option<Id>,
    sink: Option<Sink>,
) -> Result<Outcome, DsError> {
    traced(s, conn, method, params, headers, progress, sink).await
}

/// One downstream call in its span: the trace context injected into the params, which go
/// out with `headers` (ignored by stdio servers).
async fn traced(
    s: &Server,
    conn: &Connection,
    method: Method,
    mut params: impl OpenParams,
    headers: Vec<(String, String)>,
    progress: Option<Id>,
    sink: Option<Sink>,
) -> Result<Outcome, DsError> {
    let ds = downstream_span(s, method, params.name().as_deref());
    ds.inject(&mut params);
    // Pinned where it is, not moved into the span's wrapper (a copy of all of it).
    let call = std::pin::pin!(conn.call_with_headers(
        method.as_str(),
        params.into_params(progress),
        sink,
        s.settings().timeout,
        headers,
    ));
    let res = call.instrument(ds.span.clone()).await;
    ds.finish(&res);
    res
}

/// A downstream call that failed, logged and answered.
pub(super) fn failed(s: &Server, method: Method, e: DsError) -> Outcome {
    warn!(server = %s.name, %method, error = %e, "downstream call failed");
    Outcome::Error(e.to_error_object())
}

/// The 2026-07-28 envelope for a call to a stateless server: the calling client's own
/// capabilities and log level (a handshake-era client's from its `initialize` and
/// `logging/setLevel`), and for a Streamable HTTP server the `Mcp-Param-*` headers the
/// tool's schema asks for.
pub(super) fn stamp(
    s: &Server,
    client: &Client,
    method: Method,
    params: &mut Map<String, Value>,
    headers: &mut Vec<(String, String)>,
) {
    let caps = crate::sync::read(&client.capabilities).clone();
    let level = crate::sync::read(&client.log_level)
        .and_then(|r| LOG_LEVELS.get(r).copied())
        .filter(|_| !client.silent);
    stateless::stamp(params, caps, level);
    if method == Method::ToolsCall && matches!(s.cfg.transport, Transport::Http(_)) {
        let name = params.get("name").and_then(Value::as_str);
        let state = s.state();
        let schema = state
            .lists
            .tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == name)
            .and_then(|t| t.get("inputSchema"));
        if let Some(schema) = schema {
            stateless::param_headers(schema, params.get("arguments"), headers);
        }
    }
}

/// The span of one call to server `s`, a child of the current (request) span.
pub(super) fn downstream_span(s: &Server, method: Method, name: Option<&str>) -> DownstreamSpan {
    let version = telemetry::exporting()
        .then(|| s.state().info.as_ref().map(|i| i.protocol_version.clone()))
        .flatten();
    let transport = match s.cfg.transport {
        Transport::Stdio(_) => "pipe",
        Transport::Http(_) => "tcp",
    };
    DownstreamSpan::new(
        &tracing::Span::current(),
        &s.name,
        transport,
        version.as_deref(),
        method.as_str(),
        name,
    )
}
