//! Logs and OpenTelemetry traces: the one place that builds the `tracing` subscriber.
//!
//! Log lines go to stderr as text or JSON (`[telemetry] log_format`). With an OTLP
//! endpoint, spans are also exported (http/protobuf or gRPC, batched on the runtime).
//!
//! Two spans follow the OpenTelemetry MCP semantic conventions (made in `spans.rs`):
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

mod spans;

pub use spans::{
    finish_request, from_headers, record_wire_id, request_span, Carrier, DownstreamSpan, Failure, Origin, TraceHeaders,
};

use crate::config::{self, LogFormat, OtlpProtocol};
use crate::sync;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The target of the spans that are exported.
const TARGET: &str = "mcp_gateway::telemetry";
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

/// A text log line as one line: the formatter writes each event whole, ending in `\n`;
/// any other line break or control character in it (a server's error message, a tool
/// name, a protocol version: peers' words reach log fields) is written escaped (`\n`,
/// `\u{1b}`), as is a character that disguises the line ([`disguises`]), so no peer can
/// forge a log line, reorder what it shows or drive the operator's terminal. Tabs stay.
/// The JSON format escapes controls on its own, and the rest through [`JsonSafe`].
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(&one_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A JSON log line with the characters that disguise a line ([`disguises`]) written as
/// `\uXXXX` escapes: serde_json escapes control characters but writes these as they are,
/// so `jq` or a log viewer would show a server's `\u{202e}eteled_lla` as `all_delete`, and
/// U+2028 breaks the line for some viewers. The escapes decode to the same text, and only
/// JSON strings can hold such characters, so the line stays the same JSON value.
struct JsonSafe<W>(W);

impl<W: std::io::Write> std::io::Write for JsonSafe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(&json_safe(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `buf` (a JSON text) with every [`disguises`] character as a `\uXXXX` escape; borrowed
/// when there is none (the usual line).
fn json_safe(buf: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // serde_json escapes every control character: what is left is the line's own end.
    if !needs_escapes(buf.strip_suffix(b"\n").unwrap_or(buf)) {
        return std::borrow::Cow::Borrowed(buf);
    }
    let text = String::from_utf8_lossy(buf);
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if disguises(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out.into_bytes())
}

/// Characters that are not control characters but change what a line shows: bidi
/// controls (U+061C, U+200E/F, U+202A–E, U+2066–9: `\u{202e}eteled_lla` shows as
/// `all_delete`), the line and paragraph separators (U+2028/9, a line break to some
/// viewers) and zero-width ones (U+200B–D, U+FEFF). Escaped in a log line as controls are.
fn disguises(c: char) -> bool {
    matches!(c, '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// Whether `body` (UTF-8) holds a byte or character [`one_line`] escapes: C0 but tab, DEL,
/// C1 (U+0080–U+009F: 0xC2 0x80–0x9F), and the [`disguises`] (0xD8 0x9C, 0xE2 0x80/0x81 …,
/// 0xEF 0xBB 0xBF). One pass, no decoding: the usual line has none.
fn needs_escapes(body: &[u8]) -> bool {
    let at = |i: usize| body.get(i).copied().unwrap_or(0);
    body.iter().enumerate().any(|(i, &b)| match b {
        b'\t' => false,
        0..=0x1f | 0x7f => true,
        0xc2 => (0x80..0xa0).contains(&at(i + 1)),
        0xd8 => at(i + 1) == 0x9c,
        0xe2 => matches!((at(i + 1), at(i + 2)), (0x80, 0x8b..=0x8f | 0xa8..=0xae) | (0x81, 0xa6..=0xa9)),
        0xef => (at(i + 1), at(i + 2)) == (0xbb, 0xbf),
        _ => false,
    })
}

/// `buf` with control characters but tab and a last `\n` escaped, and the characters that
/// disguise a line ([`disguises`]); borrowed when there are none (the usual line).
fn one_line(buf: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let (body, end) = match buf.strip_suffix(b"\n") {
        Some(b) => (b, &b"\n"[..]),
        None => (buf, &b""[..]),
    };
    if !needs_escapes(body) {
        return std::borrow::Cow::Borrowed(buf);
    }
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c.is_control() && c != '\t') || disguises(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    let mut out = out.into_bytes();
    out.extend_from_slice(end);
    std::borrow::Cow::Owned(out)
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
        .with_writer(|| OneLine(std::io::stderr()))
        .with_ansi(false)
        .with_filter(level().and(tracing_subscriber::filter::filter_fn(|_| {
            !LOG_JSON.load(Ordering::Relaxed)
        })));
    let json = tracing_subscriber::fmt::layer()
        .with_writer(|| JsonSafe(std::io::stderr()))
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
    *sync::lock(&CURRENT) = Some(cfg.clone());
    if exporting {
        RECORD_PAYLOADS.store(cfg.record_payloads, Ordering::Relaxed);
        EXPORTING.store(true, Ordering::Relaxed);
        tracing::info!(
            endpoint = config::shown_url(cfg.otlp_endpoint.as_deref().unwrap_or_default()),
            protocol = ?cfg.otlp_protocol,
            "exporting traces"
        );
    }
    Telemetry { provider }
}

/// Crates (log targets) whose debug and trace events come once per filesystem event in
/// the watched config folder (the config reloader watches it). With the log file in
/// that folder each such line is itself an event: the log would feed itself, without
/// end, while idle. Their info and above still pass.
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
            let (endpoint, basic) = without_userinfo(endpoint);
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(http)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT);
            if let Some(basic) = basic {
                b = b.with_headers([("authorization".to_owned(), basic)].into());
            }
            b.build()
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

/// An http(s) endpoint without its user info, and that user info as the value of a Basic
/// `Authorization` header. The OTLP exporter sends the URL as it is (no Basic auth made
/// of it), and the HTTP client logs the address it connects to, user info included, at
/// debug: the credential goes in the header only, as the downstream client sends it.
fn without_userinfo(endpoint: &str) -> (String, Option<String>) {
    let Ok(mut url) = reqwest::Url::parse(endpoint) else {
        return (endpoint.to_owned(), None);
    };
    if url.username().is_empty() && url.password().is_none() {
        return (endpoint.to_owned(), None);
    }
    let pair = format!(
        "{}:{}",
        percent_decoded(url.username()),
        percent_decoded(url.password().unwrap_or_default())
    );
    let basic = format!("Basic {}", crate::upstream::exchange::base64(pair.as_bytes()));
    // Cannot fail on an http(s) URL, which has a host.
    let _ = (url.set_username(""), url.set_password(None));
    (url.to_string(), Some(basic))
}

/// `s` with its `%XX` escapes decoded (a URL's user info: `+` is itself).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let (mut out, mut i) = (Vec::with_capacity(b.len()), 0);
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        sync::lock(&self.1).clone()
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
        *sync::lock(&self.1) = Some(r.clone());
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
        *sync::lock(&self.1) = Some(resource.clone());
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
        let mut current = sync::lock(&CURRENT);
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
        endpoint = config::shown_url(cfg.otlp_endpoint.as_deref().unwrap_or("none")),
        "telemetry reconfigured"
    );
}

#[cfg(test)]
mod tests {
    use super::{disguises, json_safe, one_line, without_userinfo};

    #[test]
    fn an_endpoints_user_info_becomes_a_basic_header() {
        let (url, basic) = without_userinfo("https://team%40x:p%3As+w@otlp.example/v1/traces?k=v");
        assert_eq!(url, "https://otlp.example/v1/traces?k=v");
        // base64("team@x:p:s+w")
        assert_eq!(basic.as_deref(), Some("Basic dGVhbUB4OnA6cyt3"));
        let plain = "http://127.0.0.1:4318/v1/traces";
        assert_eq!(without_userinfo(plain), (plain.to_owned(), None));
    }

    #[test]
    fn a_log_line_stays_one_line() {
        let plain = b"2026-12-05T00:00:00Z  INFO mcp_gateway: ready\ttabs stay\n";
        assert!(matches!(one_line(plain), std::borrow::Cow::Borrowed(_)));
        let forged = "x INFO a: error=boom\n2099-01-01T00:00:00Z  WARN forged\r\u{1b}[2J\u{85}\u{7f}é\n";
        let got = String::from_utf8(one_line(forged.as_bytes()).into_owned()).unwrap();
        assert_eq!(
            got,
            "x INFO a: error=boom\\n2099-01-01T00:00:00Z  WARN forged\\r\\u{1b}[2J\\u{85}\\u{7f}é\n"
        );
        assert_eq!(got.matches('\n').count(), 1);
        // Without a final line break, nothing is added.
        assert_eq!(&*one_line(b"a\nb"), b"a\\nb");
    }

    #[test]
    fn a_json_line_escapes_what_disguises_it_and_stays_the_same_value() {
        let value = serde_json::json!({"fields": {"tool": "\u{202e}eteled_lla \u{2028}\u{2029}\u{200b}\u{2066}\u{61c}\u{feff} é 日本\n"}});
        let line = format!("{value}\n");
        let got = String::from_utf8(json_safe(line.as_bytes()).into_owned()).unwrap();
        assert!(
            got.contains(r"\u202eeteled_lla \u2028\u2029\u200b\u2066\u061c\ufeff é 日本\n"),
            "{got}"
        );
        assert!(!got.chars().any(disguises), "{got}");
        assert!(got.ends_with("}\n") && got.matches('\n').count() == 1, "{got}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&got).unwrap(), value);
        let plain = b"{\"a\":\"\xe2\x80\x94 \xc3\xa9\"}\n";
        assert!(matches!(json_safe(plain), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn characters_that_disguise_a_line_are_escaped_and_other_text_is_not() {
        let disguised = "tool \u{202e}eteled_lla \u{2028}\u{2029}\u{200b}\u{200f}\u{2066}\u{2069}\u{61c}\u{feff}\n";
        let got = String::from_utf8(one_line(disguised.as_bytes()).into_owned()).unwrap();
        assert_eq!(
            got,
            "tool \\u{202e}eteled_lla \\u{2028}\\u{2029}\\u{200b}\\u{200f}\\u{2066}\\u{2069}\\u{61c}\\u{feff}\n"
        );
        // Their neighbours in UTF-8 are ordinary text: borrowed as they are.
        for plain in [
            "\u{2027}\u{202f}\u{2010}\u{2065}\u{206a}\u{61b}\u{fefe}€ — «ünï» 日本\n",
            "a\u{200a}b\n",
        ] {
            assert!(
                matches!(one_line(plain.as_bytes()), std::borrow::Cow::Borrowed(_)),
                "{plain:?}"
            );
        }
    }
}
