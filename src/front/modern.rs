//! The 2026-07-28 (stateless) era on the public endpoint, beside the handshake era.
//!
//! A POST without `Mcp-Session-Id` whose `params._meta` carries
//! `io.modelcontextprotocol/protocolVersion` (or, for any method but `initialize`, whose
//! `MCP-Protocol-Version` header is 2026-07-28) is served here: no session, the version
//! and the client's capabilities come with every request. [`prepare`] validates the
//! request the way the revision's Streamable HTTP binding says (400 with -32602 for bad
//! `_meta`, -32020 for headers (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, the
//! `Mcp-Param-*` a tool's schema asks for) that are missing or disagree with the body, -32022 for an
//! unsupported version; 404 with -32601 for removed and unknown methods); [`finish`]
//! decorates every result (`resultType`, `_meta` serverInfo, caching hints).
//!
//! Each request runs as an ephemeral [`Client`](crate::client::Client) named after the
//! caller's identity (with auth) or IP, so rate limits and per-session server processes
//! key on that. `subscriptions/listen` is served by [`super::listen`]: `server/discover`
//! advertises `listChanged` and `subscribe` as `initialize` does. Caching hints: a merged
//! list gets the catalog's hint (smallest `ttlMs` of its servers' parts, a handshake-era
//! part counting as 0; private if any part is), `resources/read` its 2026-07-28 server's
//! own (else `ttlMs` 0, `private`: contents may depend on the caller), `server/discover`
//! `ttlMs` 0; with auth configured everything is `private` (allowlists make lists differ
//! per identity). [`prepare`] also serves the stdio front, which has no headers to check.
//!
//! Servers' questions during `tools/call`, `prompts/get` and `resources/read` become
//! `input_required` results ([`input_required`], driven by [`crate::mrtr`] from the HTTP
//! and stdio fronts). A 2026-07-28 server's own `input_required` result passes through
//! untouched (see [`crate::downstream::stateless`]), and so does a retry's `requestState`
//! that the gateway did not mint.

use crate::message::{self, code, Outcome};
use axum::http::{HeaderMap, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// The one stateless revision served.
pub const VERSION: &str = "2026-07-28";
pub use crate::error::code::{HEADER_MISMATCH, UNSUPPORTED_VERSION};

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
const META_INFO: &str = "io.modelcontextprotocol/clientInfo";
const META_LOG: &str = "io.modelcontextprotocol/logLevel";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

const VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// Methods served statelessly. Everything else (the removed `initialize`, `ping`,
/// `logging/setLevel`, `resources/(un)subscribe`, the tasks methods) is 404 with -32601.
const METHODS: &[&str] = &[
    "server/discover",
    "subscriptions/listen",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "completion/complete",
];

/// Results that carry `ttlMs` and `cacheScope`.
const CACHEABLE: &[&str] = &[
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// Every version the gateway serves: this one statelessly, the rest with `initialize`.
pub fn supported_versions() -> Vec<&'static str> {
    let mut all = vec![VERSION];
    all.extend_from_slice(crate::router::SUPPORTED_VERSIONS);
    all
}

/// True when a sessionless POST is meant for this era.
pub fn is_modern(headers: &HeaderMap, method: &str, params: Option<&RawValue>) -> bool {
    let meta_version = meta(params).is_some_and(|m| m.contains_key(META_VERSION));
    let header = headers.get(VERSION_HEADER).and_then(|v| v.to_str().ok()).map(str::trim);
    meta_version || (method != "initialize" && header == Some(VERSION))
}

/// True when a request's `params._meta` names a protocol version: on stdio, where there
/// are no headers, that alone marks a 2026-07-28 request.
pub fn has_modern_meta(params: Option<&RawValue>) -> bool {
    meta(params).is_some_and(|m| m.contains_key(META_VERSION))
}

fn meta(params: Option<&RawValue>) -> Option<Map<String, Value>> {
    let mut p = message::params_object(params).ok()?;
    match p.remove("_meta") {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// A request refused before it runs: HTTP status, JSON-RPC code, message, data.
pub struct Refusal {
    pub status: StatusCode,
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

fn refuse(status: StatusCode, code: i64, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        code,
        message: message.into(),
        data: None,
    }
}

/// A validated stateless request.
pub struct Prepared {
    pub capabilities: Map<String, Value>,
    /// The log level rank its `_meta` asked for; none: no log messages.
    pub log_rank: Option<usize>,
    /// The params for the router: the era's own `_meta` keys taken out.
    pub params: Option<Box<RawValue>>,
    /// `params.uri` of a `resources/read`, for its not-found error.
    pub uri: Option<String>,
}

/// Validates a sessionless request per the 2026-07-28 Streamable HTTP binding (`headers`)
/// or stdio (`None`: no headers to check). `tool_schema` gives a tool's `inputSchema` by
/// public name, for its `Mcp-Param-*` headers.
pub fn prepare(
    headers: Option<&HeaderMap>,
    method: &str,
    params: Option<&RawValue>,
    tool_schema: impl Fn(&str) -> Option<Value>,
) -> Result<Prepared, Refusal> {
    let bad = |m: &str| refuse(StatusCode::BAD_REQUEST, code::INVALID_PARAMS, m);
    let mut p = match params {
        None => Map::new(),
        Some(_) => message::params_object(params).map_err(|e| bad(&e))?,
    };
    let Some(Value::Object(mut meta)) = p.remove("_meta") else {
        return Err(bad(
            "a 2026-07-28 request needs params._meta with io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities",
        ));
    };
    let Some(Value::String(version)) = meta.remove(META_VERSION) else {
        return Err(bad(&format!("params._meta needs {META_VERSION} (a string)")));
    };
    let Some(Value::Object(capabilities)) = meta.remove(META_CAPS) else {
        return Err(bad(&format!("params._meta needs {META_CAPS} (an object)")));
    };
    let mismatch = |m: String| {
        refuse(
            StatusCode::BAD_REQUEST,
            HEADER_MISMATCH,
            format!("Header mismatch: {m}"),
        )
    };
    let no_headers = HeaderMap::new();
    let (headers, check) = match headers {
        Some(h) => (h, true),
        None => (&no_headers, false),
    };
    match header(headers, VERSION_HEADER)? {
        _ if !check => {}
        None => return Err(mismatch("the MCP-Protocol-Version header is missing".into())),
        Some(h) if h != version => {
            return Err(mismatch(format!(
                "MCP-Protocol-Version header value '{h}' does not match _meta value '{version}'"
            )))
        }
        Some(_) => {}
    }
    if version != VERSION {
        let supported = supported_versions();
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            code: UNSUPPORTED_VERSION,
            message: format!(
                "Unsupported protocol version {version}: without a session mcp-gateway speaks {VERSION}; {} need initialize",
                crate::router::SUPPORTED_VERSIONS.join(", ")
            ),
            data: Some(json!({ "supported": supported, "requested": version })),
        });
    }
    match header(headers, METHOD_HEADER)? {
        _ if !check => {}
        None => return Err(mismatch("the Mcp-Method header is missing".into())),
        Some(h) if h != method => {
            return Err(mismatch(format!(
                "Mcp-Method header value '{h}' does not match body value '{method}'"
            )))
        }
        Some(_) => {}
    }
    if !METHODS.contains(&method) {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            code::METHOD_NOT_FOUND,
            format!("Method not found: {method} (not served in {VERSION})"),
        ));
    }
    let name_field = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    let mut uri = None;
    if let Some(field) = name_field {
        if let Some(Value::String(body)) = p.get(field) {
            match header(headers, NAME_HEADER)?.map(decode).transpose()? {
                _ if !check => {}
                None => return Err(mismatch("the Mcp-Name header is missing".into())),
                Some(h) if h != *body => {
                    return Err(mismatch(format!(
                        "Mcp-Name header value '{h}' does not match body value '{body}'"
                    )))
                }
                Some(_) => {}
            }
            if field == "uri" {
                uri = Some(body.clone());
            }
            if method == "tools/call" && check {
                if let Some(schema) = tool_schema(body) {
                    check_param_headers(headers, &schema, p.get("arguments"))?;
                }
            }
        }
    }
    let log_rank = match meta.remove(META_LOG) {
        None | Some(Value::Null) => None,
        Some(Value::String(l)) => Some(crate::downstream::log_rank(&l).ok_or_else(|| {
            bad(&format!(
                "{META_LOG} must be one of {}",
                crate::downstream::LOG_LEVELS.join(", ")
            ))
        })?),
        Some(_) => return Err(bad(&format!("{META_LOG} must be a string"))),
    };
    meta.remove(META_INFO);
    if method == "tools/call" {
        // Handshake-era tasks are not part of 2026-07-28 (tasks are an extension there).
        p.remove("task");
    }
    if !meta.is_empty() {
        p.insert("_meta".into(), Value::Object(meta));
    }
    let params = (!p.is_empty() || params.is_some()).then(|| message::to_raw(&Value::Object(p)));
    Ok(Prepared {
        capabilities,
        log_rank,
        params,
        uri,
    })
}

/// Checks the `Mcp-Param-{h}` headers a tool's `inputSchema` asks for (`x-mcp-header: h` on a
/// property reached through `properties` keys only) against the call's arguments: a value
/// in the body needs its header, equal after Base64 decoding (numbers compared as numbers).
/// A header whose value is absent (or null) in the body is not expected.
pub fn check_param_headers(headers: &HeaderMap, schema: &Value, arguments: Option<&Value>) -> Result<(), Refusal> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (key, prop) in props {
        let value = arguments.and_then(|a| a.get(key)).filter(|v| !v.is_null());
        if let Some(Value::String(h)) = prop.get("x-mcp-header") {
            let Some(value) = value else { continue };
            let mismatch = |m: String| {
                refuse(
                    StatusCode::BAD_REQUEST,
                    HEADER_MISMATCH,
                    format!("Header mismatch: {m}"),
                )
            };
            let name = format!("mcp-param-{}", h.to_ascii_lowercase());
            let Some(got) = header(headers, &name)?.map(decode).transpose()? else {
                return Err(mismatch(format!(
                    "the Mcp-Param-{h} header is missing (arguments.{key} is set)"
                )));
            };
            let same = match value {
                Value::String(s) => got == *s,
                Value::Bool(b) => got == b.to_string(),
                Value::Number(n) => got.parse::<f64>().ok().zip(n.as_f64()).is_some_and(|(a, b)| a == b),
                _ => false,
            };
            if !same {
                return Err(mismatch(format!(
                    "Mcp-Param-{h} header value '{got}' does not match arguments.{key} {value}"
                )));
            }
        } else if prop.get("properties").is_some() {
            check_param_headers(headers, prop, value)?;
        }
    }
    Ok(())
}

/// A header's value, trimmed; -32020 when it is not visible ASCII.
fn header(headers: &HeaderMap, name: &str) -> Result<Option<String>, Refusal> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) => Ok(Some(s.trim().to_owned())),
            Err(_) => Err(refuse(
                StatusCode::BAD_REQUEST,
                HEADER_MISMATCH,
                format!("Header mismatch: the {name} header has invalid characters"),
            )),
        },
    }
}

/// Decodes the `=?base64?…?=` sentinel form; other values are literal.
fn decode(value: String) -> Result<String, Refusal> {
    let Some(inner) = value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) else {
        return Ok(value);
    };
    base64(inner).and_then(|b| String::from_utf8(b).ok()).ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            HEADER_MISMATCH,
            format!("Header mismatch: '{value}' is not valid Base64 UTF-8"),
        )
    })
}

/// Standard Base64 with padding, strictly.
fn base64(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, chunk) in b.chunks(4).enumerate() {
        let last = i + 1 == b.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// The gateway's `serverInfo`, as in its `initialize` result.
fn server_info(init: &Value) -> Value {
    init.get("serverInfo").cloned().unwrap_or(Value::Null)
}

/// `server/discover`: the versions, the capabilities this era has (no tasks; `listChanged`
/// and `subscribe` as in `initialize`, delivered by `subscriptions/listen`), instructions.
pub fn discover(init: &Outcome, private: bool) -> Outcome {
    let init = match init {
        Outcome::Result(r) => serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null),
        Outcome::Error(e) => return Outcome::Error(e.clone()),
    };
    let mut caps = init
        .get("capabilities")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    caps.remove("tasks");
    let mut result = json!({
        "supportedVersions": supported_versions(),
        "capabilities": caps,
    });
    if let Some(i) = init.get("instructions") {
        result["instructions"] = i.clone();
    }
    finish_value("server/discover", result, &server_info(&init), private)
}

/// Decorates what the router answered a stateless request.
pub fn finish(method: &str, out: Outcome, init: &Outcome, private: bool, uri: Option<&str>) -> Outcome {
    finish_cached(method, out, init, private, uri, None)
}

/// [`finish`], for a merged list with its caching hint (the smallest `ttlMs` of the
/// servers' parts, private if any part is; see [`crate::catalog::Catalog::hint`]).
pub fn finish_cached(
    method: &str,
    out: Outcome,
    init: &Outcome,
    private: bool,
    uri: Option<&str>,
    hint: Option<crate::catalog::Hint>,
) -> Outcome {
    match out {
        Outcome::Result(r) => {
            let info = match init {
                Outcome::Result(i) => serde_json::from_str::<Value>(i.get())
                    .map(|v| server_info(&v))
                    .unwrap_or(Value::Null),
                Outcome::Error(_) => Value::Null,
            };
            let mut v = serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null);
            if let (Some(h), Value::Object(o)) = (hint, &mut v) {
                o.insert("ttlMs".into(), json!(h.ttl_ms));
                if h.private {
                    o.insert("cacheScope".into(), json!("private"));
                }
            }
            finish_value(method, v, &info, private)
        }
        Outcome::Error(e) => {
            // 2026-07-28: an unknown resource is -32602 with data.uri (was -32002).
            let mut v = serde_json::from_str::<Value>(e.get()).unwrap_or(Value::Null);
            if method == "resources/read" && v.get("code").and_then(Value::as_i64) == Some(code::RESOURCE_NOT_FOUND) {
                v["code"] = json!(code::INVALID_PARAMS);
                let has_uri = v.get("data").and_then(|d| d.get("uri")).is_some();
                if !has_uri {
                    v["data"] = json!({ "uri": uri });
                }
                return Outcome::Error(message::to_raw(&v));
            }
            Outcome::Error(e)
        }
    }
}

/// An `InputRequiredResult`: the servers' open questions and the state to echo back.
pub fn input_required(requests: Map<String, Value>, state: String, init: &Outcome) -> Outcome {
    let info = match init {
        Outcome::Result(i) => serde_json::from_str::<Value>(i.get())
            .map(|v| server_info(&v))
            .unwrap_or(Value::Null),
        Outcome::Error(_) => Value::Null,
    };
    let mut v = json!({
        "resultType": "input_required",
        "inputRequests": requests,
        "requestState": state,
    });
    if !info.is_null() {
        v["_meta"] = json!({ META_SERVER_INFO: info });
    }
    Outcome::Result(message::to_raw(&v).into())
}

/// The error for a `requestState` that does not verify (the reason goes to the log only).
pub fn invalid_state() -> Outcome {
    Outcome::Error(message::error_object(
        code::INVALID_PARAMS,
        "Invalid or expired requestState",
        Some(json!({ "reason": "invalid_request_state" })),
    ))
}

fn finish_value(method: &str, mut v: Value, info: &Value, private: bool) -> Outcome {
    if let Value::Object(o) = &mut v {
        o.entry("resultType").or_insert_with(|| json!("complete"));
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            if !info.is_null() {
                m.insert(META_SERVER_INFO.into(), info.clone());
            }
        }
        if CACHEABLE.contains(&method) {
            // A hint already here came from the server (a 2026-07-28 server's resources/read)
            // or from the merged list's parts; without one, nothing may be cached as fresh.
            let ttl = o.get("ttlMs").and_then(Value::as_u64).unwrap_or(0);
            let given = o.get("cacheScope").and_then(Value::as_str).map(str::to_owned);
            o.insert("ttlMs".into(), json!(ttl));
            let scope = match given.as_deref() {
                _ if private => "private",
                Some("private") => "private",
                Some(_) => "public",
                // Contents of a handshake-era server may depend on the caller.
                None if method == "resources/read" => "private",
                None => "public",
            };
            o.insert("cacheScope".into(), json!(scope));
        }
    }
    Outcome::Result(message::to_raw(&v).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_headers() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "deep": {"type": "object", "properties": {"flag": {"type": "boolean", "x-mcp-header": "Flag"}}},
            "plain": {"type": "string"},
        }});
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(
                    axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            m
        };
        let ok = |hs: &[(&str, &str)], args: Value| check_param_headers(&h(hs), &schema, Some(&args)).is_ok();
        assert!(ok(&[], json!({"plain": "x"})));
        assert!(ok(&[("Mcp-Param-Region", "us-west1")], json!({"region": "us-west1"})));
        assert!(ok(
            &[("mcp-param-region", "=?base64?SGVsbG8=?=")],
            json!({"region": "Hello"})
        ));
        assert!(!ok(
            &[("mcp-param-region", "=?base64?SGVsbG8?=")],
            json!({"region": "Hello"})
        ));
        assert!(ok(
            &[("mcp-param-region", "=?base64?SGVsbG8")],
            json!({"region": "=?base64?SGVsbG8"})
        ));
        assert!(!ok(&[], json!({"region": "us-west1"})));
        assert!(ok(&[], json!({"region": null})));
        assert!(!ok(&[("Mcp-Param-Region", "eu")], json!({"region": "us"})));
        assert!(ok(&[("Mcp-Param-N", "42.0")], json!({"n": 42})));
        assert!(!ok(&[("Mcp-Param-N", "41")], json!({"n": 42})));
        assert!(ok(&[("Mcp-Param-Flag", "true")], json!({"deep": {"flag": true}})));
        assert!(!ok(&[], json!({"deep": {"flag": false}})));
        let e = check_param_headers(&h(&[]), &schema, Some(&json!({"region": "x"})))
            .err()
            .unwrap();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, HEADER_MISMATCH));
    }

    #[test]
    fn base64_strict() {
        assert_eq!(base64("SGVsbG8sIOS4lueVjA==").unwrap(), "Hello, 世界".as_bytes());
        assert_eq!(base64("IHBhZGRlZCA=").unwrap(), b" padded ");
        assert_eq!(base64("").unwrap(), b"");
        assert!(base64("SGVsbG8").is_none());
        assert!(base64("SGV*bG8=").is_none());
        assert!(base64("S===").is_none());
        assert!(base64("SG==SGVs").is_none());
    }
}
