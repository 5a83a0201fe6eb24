//! `[telemetry]`: the log format and OpenTelemetry export, with the `OTEL_*` environment
//! applied (a key in the file wins over its variable).

use super::errors::Ctx;
use super::expand;
use serde::Deserialize;
use std::time::Duration;
use toml::Spanned;

/// `telemetry.service_name` and `OTEL_SERVICE_NAME` unset: the name spans carry.
pub const DEFAULT_SERVICE_NAME: &str = "mcp-gateway";
/// `telemetry.otlp_protocol` and `OTEL_EXPORTER_OTLP_PROTOCOL` unset.
pub const DEFAULT_OTLP_PROTOCOL: OtlpProtocol = OtlpProtocol::HttpProtobuf;
/// `telemetry.log_format` unset.
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;
/// The traces signal's path, appended to an http/protobuf base URL.
const TRACES_PATH: &str = "/v1/traces";

/// The base URL with the signal's path added, as with OTEL_EXPORTER_OTLP_ENDPOINT (unless
/// it is there already): at the end of the path, before a query (`?tenant=…` stays one).
fn with_traces_path(url: &str) -> String {
    let (base, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    if base.ends_with(TRACES_PATH) {
        return url.to_owned();
    }
    format!("{}{TRACES_PATH}{query}", base.trim_end_matches('/'))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    otlp_endpoint: Option<Spanned<String>>,
    otlp_protocol: Option<Spanned<String>>,
    service_name: Option<Spanned<String>>,
    log_format: Option<Spanned<String>>,
    #[serde(default)]
    record_payloads: bool,
}

/// `[telemetry]`, with the `OTEL_*` environment applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Telemetry {
    /// Where spans go: the OTLP URL exactly as the exporter uses it (for http/protobuf
    /// with `/v1/traces` appended). `None`: no export.
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: OtlpProtocol,
    pub service_name: String,
    pub log_format: LogFormat,
    /// Record tool arguments and results on spans (opt-in).
    pub record_payloads: bool,
    /// How long finished spans wait before a batch is sent (`OTEL_BSP_SCHEDULE_DELAY`, ms).
    pub batch_delay: Option<Duration>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            otlp_endpoint: None,
            otlp_protocol: DEFAULT_OTLP_PROTOCOL,
            service_name: DEFAULT_SERVICE_NAME.into(),
            log_format: DEFAULT_LOG_FORMAT,
            record_payloads: false,
            batch_delay: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtlpProtocol {
    HttpProtobuf,
    Grpc,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `[telemetry]`: a key in the file wins over its `OTEL_*` variable. Errors about a
/// variable point at the `[telemetry]` key that would override it, or at line 1.
pub(super) fn parse(cx: &mut Ctx, t: RawTelemetry, env: &dyn Fn(&str) -> Option<String>) -> Telemetry {
    let from_env = |key: &str| env(key).filter(|v| !v.trim().is_empty());
    let protocol = match &t.otlp_protocol {
        Some(p) => Some((p.get_ref().clone(), p.span().start, "telemetry.otlp_protocol")),
        None => from_env("OTEL_EXPORTER_OTLP_PROTOCOL")
            .map(|v| (v, 0, "OTEL_EXPORTER_OTLP_PROTOCOL (from the environment)")),
    };
    let otlp_protocol = match protocol {
        None => DEFAULT_OTLP_PROTOCOL,
        Some((v, at, key)) => match v.trim() {
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            "grpc" => OtlpProtocol::Grpc,
            other => {
                cx.at(
                    at,
                    format!("{key}: {other:?} is not one of \"http/protobuf\", \"grpc\""),
                );
                DEFAULT_OTLP_PROTOCOL
            }
        },
    };
    let endpoint = match &t.otlp_endpoint {
        Some(e) => match expand(e.get_ref(), env) {
            Ok(v) => Some((v, e.span().start, "telemetry.otlp_endpoint".to_owned())),
            Err(var) => {
                cx.at(
                    e.span().start,
                    format!("telemetry.otlp_endpoint: environment variable {var} is not set"),
                );
                None
            }
        },
        None => from_env("OTEL_EXPORTER_OTLP_ENDPOINT")
            .map(|v| (v, 0, "OTEL_EXPORTER_OTLP_ENDPOINT (from the environment)".to_owned())),
    };
    let otlp_endpoint = endpoint.and_then(|(url, at, key)| {
        let url = url.trim().to_owned();
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if !matches!(rest, Some(r) if !r.is_empty() && !r.starts_with('/')) {
            cx.at(
                at,
                format!("{key}: {url:?} is not a URL like \"http://127.0.0.1:4318\""),
            );
            return None;
        }
        Some(match otlp_protocol {
            OtlpProtocol::HttpProtobuf => with_traces_path(&url),
            OtlpProtocol::Grpc => url,
        })
    });
    let service_name = match &t.service_name {
        Some(s) if s.get_ref().trim().is_empty() => {
            cx.at(s.span().start, "telemetry.service_name is empty".into());
            String::new()
        }
        Some(s) => s.get_ref().clone(),
        None => from_env("OTEL_SERVICE_NAME").unwrap_or_else(|| DEFAULT_SERVICE_NAME.into()),
    };
    let log_format = match t.log_format.as_ref().map(|f| (f.get_ref().as_str(), f.span().start)) {
        None => DEFAULT_LOG_FORMAT,
        Some(("text", _)) => LogFormat::Text,
        Some(("json", _)) => LogFormat::Json,
        Some((other, at)) => {
            cx.at(
                at,
                format!("telemetry.log_format: {other:?} is not one of \"text\", \"json\""),
            );
            DEFAULT_LOG_FORMAT
        }
    };
    let batch_delay = from_env("OTEL_BSP_SCHEDULE_DELAY").and_then(|v| match v.trim().parse::<u64>() {
        Ok(ms) => Some(Duration::from_millis(ms.max(1))),
        Err(_) => {
            cx.at(
                0,
                format!("OTEL_BSP_SCHEDULE_DELAY (from the environment): {v:?} is not a number of milliseconds"),
            );
            None
        }
    });
    Telemetry {
        otlp_endpoint,
        otlp_protocol,
        service_name,
        log_format,
        record_payloads: t.record_payloads,
        batch_delay,
    }
}
