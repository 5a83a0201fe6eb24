//! The two spans of the OpenTelemetry MCP semantic conventions, and W3C trace context
//! in (HTTP headers, `params._meta`) and out (`params._meta`, HTTP headers): see the
//! [parent module](super).

use super::{exporting, RECORD_PAYLOADS, TARGET};
use crate::message::{self, Id, Outcome};
use crate::method::Method;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::atomic::Ordering;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Longest tool argument or result text recorded on a span (with `record_payloads`).
const MAX_PAYLOAD: usize = 16 << 10;

// ---------------------------------------------------------------- propagation

/// Reads a trace context from HTTP headers (`traceparent`, `tracestate`).
pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<Context> {
    if !exporting() || !headers.contains_key("traceparent") {
        return None;
    }
    struct H<'a>(&'a axum::http::HeaderMap);
    impl Extractor for H<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            let v = self.0.get(key).and_then(|v| v.to_str().ok());
            match key {
                "tracestate" => v.filter(|s| within_bound(s)),
                _ => v,
            }
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    valid(TraceContextPropagator::new().extract(&H(headers)))
}

/// The most list-members a `tracestate` has (W3C Trace Context, "tracestate Limits").
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// Whether a client's `tracestate` is within the W3C bound. Past it the spec lets a
/// parser discard it whole, and the gateway does: kept, it would ride on every span of
/// the trace (a batch of spans that large is refused by the collector, other requests'
/// spans with it) and on every downstream call. Each member's key and value are bounded
/// (256 bytes) by the parser itself.
fn within_bound(state: &str) -> bool {
    state
        .split(',')
        .filter(|m| !m.trim().is_empty())
        .nth(MAX_TRACESTATE_MEMBERS)
        .is_none()
}

fn valid(cx: Context) -> Option<Context> {
    cx.span().span_context().is_valid().then_some(cx)
}

/// The `traceparent`/`tracestate` pair of a context, as the W3C headers carry them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TraceHeaders {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl Injector for TraceHeaders {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = value,
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

fn headers_of(span: &Span) -> Option<TraceHeaders> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut h = TraceHeaders::default();
    TraceContextPropagator::new().inject_context(&cx, &mut h);
    (!h.traceparent.is_empty()).then_some(h)
}

/// Params that carry a trace context in `_meta`: a full map, or one opened one level
/// ([`message::Members`]), where `_meta`'s other members keep their bytes. The
/// downstream's `OpenParams` builds on it.
pub trait Carrier {
    /// Sets `_meta.traceparent` and `tracestate` (removed when `None`), adding `_meta` if
    /// absent; nothing when `_meta` is not an object.
    fn set_trace(&mut self, h: TraceHeaders);
    /// The trace context in `_meta` (read by the HTTP downstream to send it as headers
    /// too).
    fn trace(&self) -> Option<TraceHeaders>;
}

impl Carrier for Map<String, Value> {
    fn set_trace(&mut self, h: TraceHeaders) {
        if let Value::Object(m) = self.entry("_meta").or_insert_with(|| Value::Object(Map::new())) {
            m.insert("traceparent".into(), Value::String(h.traceparent));
            match h.tracestate {
                Some(s) => m.insert("tracestate".into(), Value::String(s)),
                None => m.remove("tracestate"),
            };
        }
    }

    fn trace(&self) -> Option<TraceHeaders> {
        let meta = self.get("_meta")?.as_object()?;
        Some(TraceHeaders {
            traceparent: meta.get("traceparent")?.as_str()?.to_owned(),
            tracestate: meta.get("tracestate").and_then(Value::as_str).map(str::to_owned),
        })
    }
}

impl Carrier for message::Members {
    fn set_trace(&mut self, h: TraceHeaders) {
        self.edit_meta(true, |m| {
            m.insert_str("traceparent", &h.traceparent);
            match &h.tracestate {
                Some(s) => m.insert_str("tracestate", s),
                None => {
                    m.remove("tracestate");
                }
            }
            true
        });
    }

    fn trace(&self) -> Option<TraceHeaders> {
        let meta = message::Members::parse_text(self.get_raw("_meta")?).ok()?;
        Some(TraceHeaders {
            traceparent: meta.get_str("traceparent")?.into_owned(),
            tracestate: meta.get_str("tracestate").map(std::borrow::Cow::into_owned),
        })
    }
}

// ---------------------------------------------------------------- client requests

/// What a request span needs to know about its session.
pub struct Origin<'a> {
    pub session: &'a str,
    pub protocol_version: &'a str,
    /// `network.transport`: `tcp` (HTTP) or `pipe` (stdio).
    pub transport: &'static str,
    /// The client's context from HTTP headers, if any (else `params._meta` is read).
    pub parent: Option<Context>,
}

/// The few params fields a span is named and parented by, read without building a tree.
#[derive(Deserialize, Default)]
struct Peek<'a> {
    #[serde(default, borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(default, rename = "_meta")]
    meta: Option<PeekMeta>,
}

#[derive(Deserialize, Default)]
struct PeekMeta {
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    tracestate: Option<String>,
}

impl Extractor for PeekMeta {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref().filter(|s| within_bound(s)),
            _ => None,
        }
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The span of one client request (disabled, at no cost, when nothing exports).
pub fn request_span(origin: Origin<'_>, id: &Id, method: &str, params: Option<&RawValue>) -> Span {
    if !exporting() {
        return Span::none();
    }
    let span = tracing::debug_span!(
        target: TARGET,
        parent: None,
        "mcp.request",
        "otel.name" = Empty,
        "otel.kind" = "server",
        "otel.status_code" = Empty,
        "mcp.method.name" = method,
        "mcp.session.id" = crate::client::session_tag(origin.session),
        "mcp.protocol.version" = Empty,
        "jsonrpc.request.id" = Empty,
        "network.transport" = origin.transport,
        "gen_ai.operation.name" = Empty,
        "gen_ai.tool.name" = Empty,
        "gen_ai.prompt.name" = Empty,
        "mcp.resource.uri" = Empty,
        "gen_ai.tool.call.arguments" = Empty,
        "gen_ai.tool.call.result" = Empty,
        "error.type" = Empty,
        "mcp.gateway.outcome" = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if !origin.protocol_version.is_empty() {
        span.record("mcp.protocol.version", origin.protocol_version);
    }
    record_id(&span, id);
    let peek: Peek = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default();
    let m = Method::parse(method);
    // The client's own values, not yet checked: a long one by its start only (an OTLP
    // batch over the collector's limit is dropped whole, other requests' spans with it).
    let name = peek.name.as_deref().map(crate::error::echo);
    let target = match m {
        Method::ToolsCall => name.as_deref().inspect(|n| {
            span.record("gen_ai.tool.name", *n);
            span.record("gen_ai.operation.name", "execute_tool");
        }),
        Method::PromptsGet => name.as_deref().inspect(|n| {
            span.record("gen_ai.prompt.name", *n);
        }),
        Method::ResourcesRead => {
            if let Some(u) = peek.uri.as_deref() {
                span.record("mcp.resource.uri", &*crate::error::echo(u));
            }
            None
        }
        _ => None,
    };
    span.record("otel.name", span_name(method, target).as_str());
    if m == Method::ToolsCall && RECORD_PAYLOADS.load(Ordering::Relaxed) {
        if let Some(a) = peek.arguments {
            span.record("gen_ai.tool.call.arguments", clip(a.get()));
        }
    }
    let parent = origin
        .parent
        .or_else(|| peek.meta.and_then(|m| valid(TraceContextPropagator::new().extract(&m))));
    if let Some(cx) = parent {
        let _ = span.set_parent(cx);
    }
    span
}

fn span_name(method: &str, target: Option<&str>) -> String {
    match target {
        Some(t) => format!("{method} {t}"),
        None => method.to_owned(),
    }
}

fn record_id(span: &Span, id: &Id) {
    match id.as_str() {
        Some(s) => span.record("jsonrpc.request.id", &*s),
        None => span.record("jsonrpc.request.id", id.get()),
    };
}

fn clip(s: &str) -> &str {
    if s.len() <= MAX_PAYLOAD {
        return s;
    }
    let mut end = MAX_PAYLOAD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// How a request or call ended, as `mcp.gateway.outcome`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Ok,
    Error,
    ToolError,
    RateLimited,
    Cancelled,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Error => "error",
            Kind::ToolError => "tool_error",
            Kind::RateLimited => "rate_limited",
            Kind::Cancelled => "cancelled",
        }
    }
}

/// Records how a request ended. `None` is a cancelled request; `rate_limited` marks an
/// answer the gateway's own limits produced.
pub fn finish_request(span: &Span, method: &str, out: Option<&Outcome>, rate_limited: bool) {
    if span.is_disabled() {
        return;
    }
    let method = Method::parse(method);
    match out {
        None => finish(span, Kind::Cancelled, "cancelled"),
        Some(o) => {
            let kind = classify(method, o);
            let kind = if rate_limited && kind != Kind::Ok {
                Kind::RateLimited
            } else {
                kind
            };
            match (kind, o) {
                (Kind::Ok, _) => finish(span, Kind::Ok, ""),
                (_, Outcome::Error(e)) => finish(span, kind, &error_code(e)),
                (Kind::RateLimited, _) => finish(span, kind, "rate_limited"),
                _ => finish(span, kind, "tool_error"),
            }
            if method == Method::ToolsCall && RECORD_PAYLOADS.load(Ordering::Relaxed) {
                if let Outcome::Result(r) = o {
                    span.record("gen_ai.tool.call.result", clip(r.get()));
                }
            }
        }
    }
}

fn finish(span: &Span, kind: Kind, error_type: &str) {
    span.record("mcp.gateway.outcome", kind.as_str());
    if kind != Kind::Ok {
        span.record("error.type", error_type);
        span.record("otel.status_code", "ERROR");
    }
}

fn classify(method: Method, o: &Outcome) -> Kind {
    match o {
        Outcome::Error(_) => Kind::Error,
        Outcome::Result(r) if method == Method::ToolsCall => {
            if message::is_tool_error(r.get()) {
                Kind::ToolError
            } else {
                Kind::Ok
            }
        }
        Outcome::Result(_) => Kind::Ok,
    }
}

/// A JSON-RPC error's code as text (`"-32602"`), for `error.type`.
fn error_code(e: &RawValue) -> String {
    #[derive(Deserialize)]
    struct E {
        #[serde(default)]
        code: i64,
    }
    serde_json::from_str::<E>(e.get()).map_or_else(|_| "error".to_owned(), |e| e.code.to_string())
}

// ---------------------------------------------------------------- downstream calls

/// A downstream call that failed, as `error.type` names it (`timeout`, `busy` …).
pub trait Failure {
    fn error_type(&self) -> &'static str;
}

/// The span of one call to a downstream server. Dropped unfinished (the client
/// cancelled, so the call was abandoned), it records `cancelled`.
pub struct DownstreamSpan {
    pub span: Span,
    method: Method,
    done: bool,
}

impl DownstreamSpan {
    /// A CLIENT span under `parent` for `method` on `server`; `target` is the name the
    /// server knows the tool or prompt by.
    pub fn new(
        parent: &Span,
        server: &str,
        transport: &'static str,
        protocol_version: Option<&str>,
        method: &str,
        target: Option<&str>,
    ) -> DownstreamSpan {
        if parent.is_disabled() || !exporting() {
            return DownstreamSpan {
                span: Span::none(),
                method: Method::Other,
                done: true,
            };
        }
        let span = tracing::debug_span!(
            target: TARGET,
            parent: parent,
            "mcp.downstream",
            "otel.name" = span_name(method, target).as_str(),
            "otel.kind" = "client",
            "otel.status_code" = Empty,
            "mcp.method.name" = method,
            "mcp.gateway.server" = server,
            "mcp.protocol.version" = protocol_version,
            "jsonrpc.request.id" = Empty,
            "network.transport" = transport,
            "gen_ai.operation.name" = Empty,
            "gen_ai.tool.name" = Empty,
            "gen_ai.prompt.name" = Empty,
            "error.type" = Empty,
            "mcp.gateway.outcome" = Empty,
        );
        let method = Method::parse(method);
        match (method, target) {
            (Method::ToolsCall, Some(t)) => {
                span.record("gen_ai.tool.name", t);
                span.record("gen_ai.operation.name", "execute_tool");
            }
            (Method::PromptsGet, Some(t)) => {
                span.record("gen_ai.prompt.name", t);
            }
            _ => {}
        }
        DownstreamSpan {
            span,
            method,
            done: false,
        }
    }

    /// Puts this span's context into `params._meta.traceparent` (and `tracestate`),
    /// replacing whatever the client sent there.
    pub fn inject(&self, params: &mut impl Carrier) {
        if self.done {
            return;
        }
        let Some(h) = headers_of(&self.span) else { return };
        params.set_trace(h);
    }

    /// Records the result of the call.
    pub fn finish(mut self, res: &Result<Outcome, impl Failure>) {
        if self.done {
            return;
        }
        self.done = true;
        match res {
            Ok(o) => match classify(self.method, o) {
                Kind::Ok => finish(&self.span, Kind::Ok, ""),
                Kind::Error => {
                    let code = match o {
                        Outcome::Error(e) => error_code(e),
                        Outcome::Result(_) => String::new(),
                    };
                    finish(&self.span, Kind::Error, &code)
                }
                k => finish(&self.span, k, "tool_error"),
            },
            Err(e) => finish(&self.span, Kind::Error, e.error_type()),
        }
    }
}

impl Drop for DownstreamSpan {
    fn drop(&mut self) {
        if !self.done {
            finish(&self.span, Kind::Cancelled, "cancelled");
        }
    }
}

/// Records the id a downstream call went out with on the current (downstream) span.
pub fn record_wire_id(id: u64) {
    if exporting() {
        let span = Span::current();
        if !span.is_disabled() {
            span.record("jsonrpc.request.id", id.to_string().as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_on_char_boundaries() {
        let s = "é".repeat(MAX_PAYLOAD);
        let c = clip(&s);
        assert!(c.len() <= MAX_PAYLOAD && s.starts_with(c));
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn classifies_outcomes() {
        let r = |s: &str| Outcome::Result(RawValue::from_string(s.into()).unwrap().into());
        assert_eq!(
            classify(Method::ToolsCall, &r(r#"{"content":[],"isError":true}"#)),
            Kind::ToolError
        );
        assert_eq!(classify(Method::ToolsCall, &r(r#"{"content":[]}"#)), Kind::Ok);
        assert_eq!(classify(Method::PromptsGet, &r(r#"{"isError":true}"#)), Kind::Ok);
        let e = RawValue::from_string(r#"{"code":-32602,"message":"x"}"#.into()).unwrap();
        assert_eq!(error_code(&e), "-32602");
    }

    #[test]
    fn the_trace_context_reads_back() {
        let text = r#"{"_meta":{"traceparent":"00-a-b-01","tracestate":"k=v"}}"#;
        let p: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
        let h = p.trace().unwrap();
        assert_eq!(h.traceparent, "00-a-b-01");
        assert_eq!(h.tracestate.as_deref(), Some("k=v"));
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        let m = message::Members::parse(Some(raw)).unwrap();
        let h = m.trace().unwrap();
        assert_eq!(h.traceparent, "00-a-b-01");
        assert_eq!(h.tracestate.as_deref(), Some("k=v"));
    }

    #[test]
    fn the_trace_context_goes_in_without_rewriting_metas_other_bytes() {
        let written = |m: &message::Members| {
            let mut out = Vec::new();
            m.write_to(&mut out);
            String::from_utf8(out).unwrap()
        };
        let h = |ts: Option<&str>| TraceHeaders {
            traceparent: "00-t-s-01".into(),
            tracestate: ts.map(str::to_owned),
        };
        let text =
            r#"{"name":"x","_meta":{"n":1.50,"big":123456789012345678901234567890,"tracestate":"old","k":"\u00e9"}}"#;
        let mut m = message::Members::parse(Some(RawValue::from_string(text.to_owned()).unwrap())).unwrap();
        m.set_trace(h(None));
        assert_eq!(
            written(&m),
            r#"{"name":"x","_meta":{"n":1.50,"big":123456789012345678901234567890,"k":"\u00e9","traceparent":"00-t-s-01"}}"#
        );
        let back = m.trace().unwrap();
        assert_eq!((back.traceparent.as_str(), back.tracestate), ("00-t-s-01", None));
        // Set again (a retry), with a state: in place.
        m.set_trace(h(Some("a=b")));
        assert_eq!(
            written(&m),
            r#"{"name":"x","_meta":{"n":1.50,"big":123456789012345678901234567890,"k":"\u00e9","traceparent":"00-t-s-01","tracestate":"a=b"}}"#
        );
        // No `_meta`: added; `_meta` not an object: left alone.
        let mut m = message::Members::parse(Some(RawValue::from_string(r#"{"name":"x"}"#.into()).unwrap())).unwrap();
        m.set_trace(h(None));
        assert_eq!(written(&m), r#"{"name":"x","_meta":{"traceparent":"00-t-s-01"}}"#);
        let mut m =
            message::Members::parse(Some(RawValue::from_string(r#"{"_meta":[1.50]}"#.into()).unwrap())).unwrap();
        m.set_trace(h(None));
        assert_eq!(written(&m), r#"{"_meta":[1.50]}"#);
        assert!(m.trace().is_none());
    }
}
