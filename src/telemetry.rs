//! Logs and OpenTelemetry traces: the one place that builds the `tracing` subscriber.
//!
//! Log lines go to stderr as text or JSON (`[telemetry] log_format`). With an OTLP
//! endpoint, spans are also exported (http/protobuf or gRPC, batched on the runtime).
//!
//! Two spans follow the OpenTelemetry MCP semantic conventions:
//! - [`request_span`]: one client request, kind SERVER, named `{method} {target}`
//!   (`tools/call calc__add`). A client's W3C `traceparent` (HTTP header, or
//!   `params._meta.traceparent`) makes it a child of the client's span.
//! - [`DownstreamSpan`]: one call to a downstream server, kind CLIENT, a child of the
//!   request span, named with the downstream's own name (`tools/call add`). Its context
//!   travels to the server in `params._meta.traceparent` (and as HTTP headers).
//!
//! Both are DEBUG spans with this module as their target: the OpenTelemetry layer
//! always takes them, while the log layer only formats them when asked to log at debug,
//! so at the default level a request costs no log formatting. Without an exporter the
//! spans are disabled and the helpers here return at once.
//!
//! Tool arguments and results are recorded only with `record_payloads = true`;
//! configured secrets (env values, headers, URLs) never reach a span.

use crate::config::{self, LogFormat, OtlpProtocol};
use crate::downstream::DsError;
use crate::message::{Id, Outcome};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The target of the spans that are exported.
const TARGET: &str = "mcp_gateway::telemetry";
/// Longest tool argument or result text recorded on a span (with `record_payloads`).
const MAX_PAYLOAD: usize = 16 << 10;
/// How long the exporter waits for the collector.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static EXPORTING: AtomicBool = AtomicBool::new(false);
/// `log_format = "json"` is in force (else text).
static LOG_JSON: AtomicBool = AtomicBool::new(false);

/// Switches the log lines' format, at once.
fn set_log_format(format: LogFormat) {
    LOG_JSON.store(format == LogFormat::Json, Ordering::Relaxed);
}
static RECORD_PAYLOADS: AtomicBool = AtomicBool::new(false);

/// True when spans are exported; everything that costs more than a branch is skipped
/// otherwise.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The installed exporter; [`Telemetry::shutdown`] sends the spans still queued.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the exporter. Call from outside the runtime's worker threads
    /// while the runtime is still alive (the batch task runs on it).
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            EXPORTING.store(false, Ordering::Relaxed);
            if let Err(e) = p.shutdown() {
                eprintln!("mcp-gateway: flushing traces failed: {e}");
            }
        }
    }
}

/// Installs the global subscriber: log lines on stderr filtered by `log_filter` (an
/// `EnvFilter` directive such as `info`) and, when an OTLP endpoint is configured, the
/// OpenTelemetry layer. Must run inside a Tokio runtime context (the exporter's batch
/// task and gRPC channel live on it).
pub fn init(cfg: &config::Telemetry, log_filter: &str) -> Telemetry {
    // Both formats are installed, each behind the level filter and a switch a reload can
    // flip (`log_format`). A level the filter excludes stays excluded per callsite, so the
    // switch costs nothing there; an event that is logged reads one atomic.
    use tracing_subscriber::filter::FilterExt;
    set_log_format(cfg.log_format);
    let level =
        || tracing_subscriber::EnvFilter::new(log_filter).and(tracing_subscriber::filter::filter_fn(not_per_fs_event));
    let text = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_filter(level().and(tracing_subscriber::filter::filter_fn(|_| {
            !LOG_JSON.load(Ordering::Relaxed)
        })));
    let json = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .json()
        .with_filter(level().and(tracing_subscriber::filter::filter_fn(|_| {
            LOG_JSON.load(Ordering::Relaxed)
        })));
    let fmt = text.and_then(json);
    // The provider is always installed, around an exporter a reload can point elsewhere
    // (or nowhere); spans are only made while `exporting()`.
    let (inner, error) = match cfg.otlp_endpoint.as_deref() {
        None => (None, None),
        Some(endpoint) => match exporter(cfg, endpoint) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e)),
        },
    };
    let exporting = inner.is_some();
    let switch = Switch::default();
    if let Ok(mut slot) = switch.0.try_write() {
        *slot = inner;
    }
    let _ = SWITCH.set(switch.clone());
    let provider = Some(provider(cfg, switch));
    let otel = provider.as_ref().map(|p| {
        let tracer = p.tracer("mcp-gateway");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() == TARGET
                    || (meta.is_event()
                        && *meta.level() <= tracing::Level::WARN
                        && meta.target().starts_with("mcp_gateway"))
            }))
    });
    tracing_subscriber::registry().with(fmt).with(otel).init();
    if let Some(e) = error {
        tracing::warn!(error = %e, "cannot export traces; continuing without");
    }
    if let Ok(mut current) = CURRENT.lock() {
        *current = Some(cfg.clone());
    }
    if exporting {
        RECORD_PAYLOADS.store(cfg.record_payloads, Ordering::Relaxed);
        EXPORTING.store(true, Ordering::Relaxed);
        tracing::info!(
            endpoint = cfg.otlp_endpoint.as_deref().unwrap_or_default(),
            protocol = ?cfg.otlp_protocol,
            "exporting traces"
        );
    }
    Telemetry { provider }
}

/// Crates (log targets) whose debug and trace events come once per filesystem event in
/// the watched config folder ([`crate::reload`]). With the log file in that folder each
/// such line is itself an event: the log would feed itself (tens of MB a second while
/// idle). Their info and above still pass.
const PER_FS_EVENT: &[&str] = &["notify", "inotify"];

/// False for a debug or trace event of a [`PER_FS_EVENT`] crate, whatever the filter says.
fn not_per_fs_event(meta: &tracing::Metadata<'_>) -> bool {
    if *meta.level() <= tracing::Level::INFO {
        return true;
    }
    let target = meta.target();
    !PER_FS_EVENT.iter().any(|c| {
        target
            .strip_prefix(c)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The exporter for `[telemetry]`'s endpoint and protocol.
fn exporter(cfg: &config::Telemetry, endpoint: &str) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
    let exporter = match cfg.otlp_protocol {
        OtlpProtocol::HttpProtobuf => {
            let http = reqwest::Client::builder()
                .use_rustls_tls()
                .timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| e.to_string())?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(http)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
        }
        OtlpProtocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT);
            if endpoint.starts_with("https://") {
                b = b.with_tls_config(
                    opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots(),
                );
            }
            b.build()
        }
    }
    .map_err(|e| e.to_string())?;
    Ok(exporter)
}

fn provider(cfg: &config::Telemetry, exporter: Switch) -> SdkTracerProvider {
    let mut batch = opentelemetry_sdk::trace::BatchConfigBuilder::default();
    if let Some(d) = cfg.batch_delay {
        batch = batch.with_scheduled_delay(d);
    }
    let processor = opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
        exporter,
        opentelemetry_sdk::runtime::Tokio,
    )
    .with_batch_config(batch.build())
    .build();
    SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource(&cfg.service_name))
        .build()
}

/// An exporter a reload can point at another endpoint (or at none). It keeps the
/// resource (`service.name`, `service.version`) the provider gives it and hands it to
/// every exporter it wraps, the ones a reload installs included: an OTLP exporter sends
/// only the resource it was given, so without this spans arrive as `unknown_service`.
#[derive(Debug, Clone, Default)]
struct Switch(
    std::sync::Arc<tokio::sync::RwLock<Option<opentelemetry_otlp::SpanExporter>>>,
    std::sync::Arc<std::sync::Mutex<Option<opentelemetry_sdk::Resource>>>,
);

impl Switch {
    /// The resource in force, if the provider gave one yet.
    fn resource(&self) -> Option<opentelemetry_sdk::Resource> {
        self.1.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `exporter` in place, with the resource in force.
    async fn install(&self, mut exporter: Option<opentelemetry_otlp::SpanExporter>) {
        use opentelemetry_sdk::trace::SpanExporter as _;
        if let (Some(e), Some(r)) = (exporter.as_mut(), self.resource()) {
            e.set_resource(&r);
        }
        *self.0.write().await = exporter;
    }

    /// A reload's `service_name`: the resource changes for the exporter in force and
    /// every later one.
    async fn rename(&self, service_name: &str) {
        use opentelemetry_sdk::trace::SpanExporter as _;
        let r = resource(service_name);
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(r.clone());
        if let Some(e) = self.0.write().await.as_mut() {
            e.set_resource(&r);
        }
    }
}

/// `service.name` and `service.version`.
fn resource(service_name: &str) -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(service_name.to_owned())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

impl opentelemetry_sdk::trace::SpanExporter for Switch {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let inner = self.0.clone();
        async move {
            match &*inner.read().await {
                Some(e) => e.export(batch).await,
                None => Ok(()),
            }
        }
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(resource.clone());
        // Called by the batch task before any export; the exporter is not in use then.
        if let Ok(mut inner) = self.0.try_write() {
            if let Some(e) = inner.as_mut() {
                e.set_resource(resource);
            }
        }
    }
}

static SWITCH: std::sync::OnceLock<Switch> = std::sync::OnceLock::new();
/// The `[telemetry]` in force, to tell what a reload changes.
static CURRENT: std::sync::Mutex<Option<config::Telemetry>> = std::sync::Mutex::new(None);

/// Applies a reloaded `[telemetry]`: the OTLP endpoint and protocol, `record_payloads`,
/// `service_name` and `log_format` change at once; the batch delay needs a restart.
pub async fn reconfigure(cfg: &config::Telemetry) {
    let previous = {
        let Ok(mut current) = CURRENT.lock() else { return };
        if current.as_ref() == Some(cfg) {
            return;
        }
        current.replace(cfg.clone())
    };
    let Some(switch) = SWITCH.get() else { return };
    if let Some(p) = &previous {
        if p.batch_delay != cfg.batch_delay {
            tracing::warn!("the telemetry batch delay takes effect after a restart");
        }
        if p.log_format != cfg.log_format {
            set_log_format(cfg.log_format);
        }
    }
    if previous.as_ref().is_none_or(|p| p.service_name != cfg.service_name) {
        switch.rename(&cfg.service_name).await;
    }
    let inner = match cfg.otlp_endpoint.as_deref() {
        None => None,
        Some(endpoint) => match exporter(cfg, endpoint) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot export traces to the new endpoint; export is off");
                None
            }
        },
    };
    let on = inner.is_some();
    switch.install(inner).await;
    RECORD_PAYLOADS.store(cfg.record_payloads, Ordering::Relaxed);
    EXPORTING.store(on, Ordering::Relaxed);
    tracing::info!(
        endpoint = cfg.otlp_endpoint.as_deref().unwrap_or("none"),
        "telemetry reconfigured"
    );
}

// ---------------------------------------------------------------- propagation

/// Reads a trace context from HTTP headers (`traceparent`, `tracestate`).
pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<Context> {
    if !exporting() || !headers.contains_key("traceparent") {
        return None;
    }
    struct H<'a>(&'a axum::http::HeaderMap);
    impl Extractor for H<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    valid(TraceContextPropagator::new().extract(&H(headers)))
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

/// The trace context a call carries in `params._meta` (read by the HTTP downstream to
/// send it as headers too).
pub fn meta_headers(params: &mut impl crate::downstream::OpenParams) -> Option<TraceHeaders> {
    let meta = params.meta()?;
    Some(TraceHeaders {
        traceparent: meta.get("traceparent")?.as_str()?.to_owned(),
        tracestate: meta.get("tracestate").and_then(Value::as_str).map(str::to_owned),
    })
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
            "tracestate" => self.tracestate.as_deref(),
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
        "mcp.session.id" = origin.session,
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
    let target = match method {
        "tools/call" => peek.name.as_deref().inspect(|n| {
            span.record("gen_ai.tool.name", *n);
            span.record("gen_ai.operation.name", "execute_tool");
        }),
        "prompts/get" => peek.name.as_deref().inspect(|n| {
            span.record("gen_ai.prompt.name", *n);
        }),
        "resources/read" => {
            if let Some(u) = peek.uri.as_deref() {
                span.record("mcp.resource.uri", u);
            }
            None
        }
        _ => None,
    };
    span.record("otel.name", span_name(method, target).as_str());
    if method == "tools/call" && RECORD_PAYLOADS.load(Ordering::Relaxed) {
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
pub enum Kind {
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
            if method == "tools/call" && RECORD_PAYLOADS.load(Ordering::Relaxed) {
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

fn classify(method: &str, o: &Outcome) -> Kind {
    match o {
        Outcome::Error(_) => Kind::Error,
        Outcome::Result(r) if method == "tools/call" => {
            if crate::message::is_tool_error(r.get()) {
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

/// The span of one call to a downstream server. Dropped unfinished (the client
/// cancelled, so the call was abandoned), it records `cancelled`.
pub struct DownstreamSpan {
    pub span: Span,
    method_is_tool: bool,
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
        let method_is_tool = method == "tools/call";
        if parent.is_disabled() || !exporting() {
            return DownstreamSpan {
                span: Span::none(),
                method_is_tool,
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
        match (method, target) {
            ("tools/call", Some(t)) => {
                span.record("gen_ai.tool.name", t);
                span.record("gen_ai.operation.name", "execute_tool");
            }
            ("prompts/get", Some(t)) => {
                span.record("gen_ai.prompt.name", t);
            }
            _ => {}
        }
        DownstreamSpan {
            span,
            method_is_tool,
            done: false,
        }
    }

    /// Puts this span's context into `params._meta.traceparent` (and `tracestate`),
    /// replacing whatever the client sent there.
    pub fn inject(&self, params: &mut impl crate::downstream::OpenParams) {
        if self.done {
            return;
        }
        let Some(h) = headers_of(&self.span) else { return };
        if let Some(m) = params.meta_or_insert() {
            m.insert("traceparent".into(), Value::String(h.traceparent));
            match h.tracestate {
                Some(s) => m.insert("tracestate".into(), Value::String(s)),
                None => m.remove("tracestate"),
            };
        }
    }

    /// Records the result of the call.
    pub fn finish(mut self, res: &Result<Outcome, DsError>) {
        if self.done {
            return;
        }
        self.done = true;
        let method = if self.method_is_tool { "tools/call" } else { "" };
        match res {
            Ok(o) => match classify(method, o) {
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
            Err(e) => finish(
                &self.span,
                Kind::Error,
                match e {
                    DsError::Timeout { .. } => "timeout",
                    DsError::Exited { .. } => "server_exited",
                    DsError::Unavailable { .. } => "unavailable",
                    DsError::Busy { .. } => "busy",
                    DsError::Status { .. } => "http_status",
                },
            ),
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
            classify("tools/call", &r(r#"{"content":[],"isError":true}"#)),
            Kind::ToolError
        );
        assert_eq!(classify("tools/call", &r(r#"{"content":[]}"#)), Kind::Ok);
        assert_eq!(classify("prompts/get", &r(r#"{"isError":true}"#)), Kind::Ok);
        let e = RawValue::from_string(r#"{"code":-32602,"message":"x"}"#.into()).unwrap();
        assert_eq!(error_code(&e), "-32602");
    }

    #[test]
    fn meta_headers_read_back() {
        let text = r#"{"_meta":{"traceparent":"00-a-b-01","tracestate":"k=v"}}"#;
        let mut p: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
        let h = meta_headers(&mut p).unwrap();
        assert_eq!(h.traceparent, "00-a-b-01");
        assert_eq!(h.tracestate.as_deref(), Some("k=v"));
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        let mut m = crate::message::Members::parse(Some(raw)).unwrap();
        let h = meta_headers(&mut m).unwrap();
        assert_eq!(h.traceparent, "00-a-b-01");
        assert_eq!(h.tracestate.as_deref(), Some("k=v"));
    }
}
