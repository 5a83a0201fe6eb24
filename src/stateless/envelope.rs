//! What a 2026-07-28 request carries besides its method and params, and its checks.
//!
//! Every request names the protocol version and the client's capabilities in
//! `params._meta` (`io.modelcontextprotocol/protocolVersion`, `…/clientCapabilities`;
//! `…/clientInfo` and `…/logLevel` optional). A transport with headers repeats some of
//! the body in them: `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` (the tool, prompt or
//! resource acted on) and the `Mcp-Param-*` a tool's schema asks for. [`check`] refuses
//! bad `_meta` (-32602), headers that are missing or disagree with the body (-32020), an
//! unsupported version (-32022), and removed or unknown methods (-32601, 404 over HTTP).
//! A transport without headers (stdio) has nothing to check against the body.

use super::VERSION;
use crate::error::{code, Error};
use crate::message;
use crate::method::Method;
use serde_json::{json, Map, Value};

use crate::message::meta::{META_CAPS, META_INFO, META_LOG, META_VERSION};

/// [`VERSION`] as JSON text.
const QUOTED_VERSION: &str = "\"2026-07-28\"";

const VERSION_HEADER: &str = "mcp-protocol-version";
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";

/// A transport's request headers, as the checks read them (HTTP's, through its adapter).
pub trait Headers {
    /// The value of the header `name` (lowercase), as sent (the first one if repeated):
    /// its text when it is visible ASCII and tabs (what HTTP's `HeaderValue::to_str`
    /// accepts), else [`Invisible`].
    fn header(&self, name: &str) -> Option<Result<&str, Invisible>>;

    /// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name`, as [`Headers::header`] gives
    /// them (a transport may find the three at once).
    fn mcp(&self) -> [Option<Result<&str, Invisible>>; 3] {
        MCP_HEADERS.map(|name| self.header(name))
    }
}

/// A header value with bytes other than visible ASCII and tabs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invisible;

/// The headers every request of the revision carries, in [`Headers::mcp`] order.
pub const MCP_HEADERS: [&str; 3] = [VERSION_HEADER, METHOD_HEADER, NAME_HEADER];

/// True when a request is one of this revision: its `params._meta` names a protocol
/// version, or (for any method but `initialize`) the transport's `MCP-Protocol-Version`
/// header names this revision.
pub fn is_stateless(headers: Option<&dyn Headers>, method: &str, params: &message::Incoming) -> bool {
    (method != "initialize" && headers.is_some_and(names_revision)) || params.meta_has(META_VERSION)
}

/// True when the `MCP-Protocol-Version` header names this revision.
pub fn names_revision(headers: &dyn Headers) -> bool {
    matches!(text(headers, VERSION_HEADER), Ok(Some(v)) if v == VERSION)
}

/// A request that passed [`check`].
pub struct Envelope {
    pub capabilities: Map<String, Value>,
    /// The log level rank its `_meta` asked for; none: no log messages.
    pub log_rank: Option<usize>,
    /// The params for the router: the revision's own `_meta` keys taken out, left opened
    /// (the router does not parse them again).
    pub params: message::Incoming,
    /// `params.uri` of a `resources/read`, for its not-found error.
    pub uri: Option<String>,
    /// What a call that may ask questions is resumed by: its target (`params.name` or
    /// `params.uri`, read only for a call with [`Envelope::rounds`]), `params.requestState`
    /// and `params.inputResponses`.
    pub retry: Retry,
    /// The call runs in rounds: it may ask its client (which declared something a server
    /// may ask for), or it resumes a call that asked.
    pub rounds: bool,
}

/// The members of a request's params that a retry of a call that may ask carries.
#[derive(Default)]
pub struct Retry {
    pub target: String,
    pub state: Option<Value>,
    pub responses: Option<Value>,
}

fn mismatch(m: impl std::fmt::Display) -> Error {
    Error::client(code::HEADER_MISMATCH, format!("Header mismatch: {m}"))
}

/// A header (`got`, named `shown`) must be there and say what `source` (`_meta` or the
/// body) says: `want`.
#[inline]
fn agrees(got: Option<&str>, shown: &str, want: &str, source: &str) -> Result<(), Error> {
    match got {
        None => Err(mismatch(format_args!("the {shown} header is missing"))),
        Some(v) if v != want => Err(mismatch(format_args!(
            "{shown} header value '{v}' does not match {source} value '{want}'"
        ))),
        Some(_) => Ok(()),
    }
}

/// Checks a request of this revision: its `_meta`, and with `headers` the headers against
/// the body. `tool_schema` gives a tool's `inputSchema` by public name, for its
/// `Mcp-Param-*` headers (none: it asks for none). The params are opened one level
/// ([`message::Members`]): only `_meta`, and the arguments of a tool with param headers,
/// are parsed into trees.
pub fn check(
    headers: Option<&dyn Headers>,
    method: &str,
    m: Method,
    params: message::Incoming,
    tool_schema: impl Fn(&str) -> Option<Value>,
) -> Result<Envelope, Error> {
    let bad = |m: &str| Error::invalid_params(m).with_status(400);
    let given = !matches!(params, message::Incoming::Raw(None));
    let mut p = params.into_boxed_members().map_err(|e| bad(&e))?;
    // The version's text, when it is a string.
    let string = |v: Option<Value>| match v {
        Some(Value::String(s)) => Some(std::borrow::Cow::<'static, str>::Owned(s)),
        _ => None,
    };
    let (version, capabilities, log) = match p.peeked().clone() {
        // Only the revision's own members: all of `_meta` is taken out.
        message::Peeked::Own(spans) => {
            p.remove("_meta");
            // The usual values (this revision, a plain string, an empty object) are taken
            // as they are.
            let open = |span: Option<std::ops::Range<usize>>| {
                span.and_then(|s| p.text_of(&s)).and_then(|t| match t {
                    "{}" => Some(Value::Object(Map::new())),
                    t => match t.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
                        Some(plain) if !plain.contains('\\') => Some(Value::String(plain.to_owned())),
                        _ => serde_json::from_str::<Value>(t).ok(),
                    },
                })
            };
            let [v, c, l] = spans;
            // This revision, as written: not copied.
            let version = match v.as_ref().and_then(|s| p.text_of(s)) {
                Some(QUOTED_VERSION) => Some(VERSION.into()),
                _ => string(open(v)),
            };
            (version, open(c), open(l))
        }
        message::Peeked::Absent | message::Peeked::Other => {
            // The envelope's members taken out; the others stay as the client wrote them.
            let mut found = None;
            p.edit_meta(false, |meta| {
                let open = |k| meta.get_raw(k).and_then(|t| serde_json::from_str::<Value>(t).ok());
                found = Some([META_VERSION, META_CAPS, META_LOG].map(open));
                [META_VERSION, META_CAPS, META_LOG, META_INFO]
                    .map(|k| meta.remove(k))
                    .contains(&true)
            });
            let Some([v, c, l]) = found else {
                return Err(bad(
                    "a 2026-07-28 request needs params._meta with io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities",
                ));
            };
            if p.get_raw("_meta") == Some("{}") {
                p.remove("_meta");
            }
            (string(v), c, l)
        }
    };
    let Some(version) = version else {
        return Err(bad(&format!("params._meta needs {META_VERSION} (a string)")));
    };
    let Some(Value::Object(capabilities)) = capabilities else {
        return Err(bad(&format!("params._meta needs {META_CAPS} (an object)")));
    };
    let [sent_version, sent_method, sent_name] = headers.map(Headers::mcp).unwrap_or_default();
    if headers.is_some() {
        agrees(
            visible(VERSION_HEADER, sent_version)?,
            "MCP-Protocol-Version",
            &version,
            "_meta",
        )?;
    }
    if version != VERSION {
        return Err(Error::client(
            code::UNSUPPORTED_VERSION,
            format!(
                "Unsupported protocol version {version}: without a session mcp-gateway speaks {VERSION}; {} need initialize",
                crate::router::SUPPORTED_VERSIONS.join(", ")
            ),
        )
        .with_data(json!({ "supported": super::supported_versions(), "requested": version }))
        .with_status(400));
    }
    if headers.is_some() {
        agrees(visible(METHOD_HEADER, sent_method)?, "Mcp-Method", method, "body")?;
    }
    if !m.is_stateless() {
        return Err(Error::client(
            code::METHOD_NOT_FOUND,
            format!("Method not found: {method} (not served in {VERSION})"),
        )
        .with_status(404));
    }
    let mut uri = None;
    let mut retry = Retry::default();
    let opened = |key| p.get_raw(key).and_then(|r| serde_json::from_str::<Value>(r).ok());
    if m.may_ask() {
        retry.state = opened("requestState");
    }
    // A server can ask a client only what it declared (`Client::ask` refuses the rest
    // before any round would see it): a call whose client declared none of it, and that
    // resumes nothing, runs as any other call, without rounds.
    let can_be_asked = crate::client::ASKED_FOR
        .iter()
        .any(|(_, cap)| capabilities.contains_key(*cap));
    let rounds = m.may_ask() && (can_be_asked || retry.state.is_some());
    if rounds {
        retry.responses = opened("inputResponses");
    }
    if let Some(field) = m.target_field() {
        if let Some(body) = p.get_str(field) {
            if let Some(h) = headers {
                let name = visible(NAME_HEADER, sent_name)?.map(decode).transpose()?;
                agrees(name.as_deref(), "Mcp-Name", &body, "body")?;
                if m == Method::ToolsCall {
                    if let Some(schema) = tool_schema(&body) {
                        let arguments = p.get_raw("arguments").and_then(|a| serde_json::from_str(a).ok());
                        check_param_headers(h, &schema, arguments.as_ref())?;
                    }
                }
            }
            if field == "uri" {
                uri = Some(body.clone().into_owned());
            }
            if rounds {
                retry.target = body.into_owned();
            }
        }
    }
    let log_rank = match log {
        None | Some(Value::Null) => None,
        Some(Value::String(l)) => Some(crate::downstream::log_rank(&l).ok_or_else(|| {
            bad(&format!(
                "{META_LOG} must be one of {}",
                crate::downstream::LOG_LEVELS.join(", ")
            ))
        })?),
        Some(_) => return Err(bad(&format!("{META_LOG} must be a string"))),
    };
    if m == Method::ToolsCall {
        // Handshake-era tasks are not part of 2026-07-28 (tasks are an extension there).
        p.remove("task");
    }
    let params = if p.is_empty() && !given {
        message::Incoming::Raw(None)
    } else {
        message::Incoming::Opened(p)
    };
    Ok(Envelope {
        capabilities,
        log_rank,
        params,
        uri,
        retry,
        rounds,
    })
}

/// Checks the `Mcp-Param-{h}` headers a tool's `inputSchema` asks for (`x-mcp-header: h` on a
/// property reached through `properties` keys only) against the call's arguments: a value
/// in the body needs its header, equal after Base64 decoding (numbers compared as numbers).
/// A header whose value is absent (or null) in the body is not expected.
pub fn check_param_headers(headers: &dyn Headers, schema: &Value, arguments: Option<&Value>) -> Result<(), Error> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(());
    };
    for (key, prop) in props {
        let value = arguments.and_then(|a| a.get(key)).filter(|v| !v.is_null());
        if let Some(Value::String(h)) = prop.get("x-mcp-header") {
            let Some(value) = value else { continue };
            let name = format!("mcp-param-{}", h.to_ascii_lowercase());
            let Some(got) = text(headers, &name)?.map(decode).transpose()? else {
                return Err(mismatch(format_args!(
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
                return Err(mismatch(format_args!(
                    "Mcp-Param-{h} header value '{got}' does not match arguments.{key} {value}"
                )));
            }
        } else if prop.get("properties").is_some() {
            check_param_headers(headers, prop, value)?;
        }
    }
    Ok(())
}

/// A header's value, trimmed; -32020 when it is not visible ASCII (or tabs).
fn text<'h>(headers: &'h dyn Headers, name: &str) -> Result<Option<&'h str>, Error> {
    visible(name, headers.header(name))
}

/// [`text`] of a value looked up already.
#[inline]
fn visible<'h>(name: &str, value: Option<Result<&'h str, Invisible>>) -> Result<Option<&'h str>, Error> {
    match value {
        None => Ok(None),
        // Visible ASCII: its only whitespace is spaces and tabs, which `trim_ascii` trims as
        // `trim` would, without decoding chars.
        Some(Ok(s)) => Ok(Some(s.trim_ascii())),
        Some(Err(Invisible)) => Err(mismatch(format_args!("the {name} header has invalid characters"))),
    }
}

/// Decodes the `=?base64?…?=` sentinel form; other values are literal (not copied).
fn decode(value: &str) -> Result<std::borrow::Cow<'_, str>, Error> {
    let Some(inner) = value.strip_prefix("=?base64?").and_then(|v| v.strip_suffix("?=")) else {
        return Ok(std::borrow::Cow::Borrowed(value));
    };
    base64(inner)
        .and_then(|b| String::from_utf8(b).ok())
        .map(std::borrow::Cow::Owned)
        .ok_or_else(|| mismatch(format_args!("'{value}' is not valid Base64 UTF-8")))
}

/// Standard Base64 with padding, strictly.
fn base64(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    /// Headers as a list of (lowercase name, value).
    struct List(Vec<(String, String)>);

    impl Headers for List {
        fn header(&self, name: &str) -> Option<Result<&str, Invisible>> {
            let visible = |v: &str| v.bytes().all(|b| (32..127).contains(&b) || b == b'\t');
            let found = self.0.iter().find(|(k, _)| k == name);
            found.map(|(_, v)| if visible(v) { Ok(v.as_str()) } else { Err(Invisible) })
        }
    }

    #[test]
    fn param_headers() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "deep": {"type": "object", "properties": {"flag": {"type": "boolean", "x-mcp-header": "Flag"}}},
            "plain": {"type": "string"},
        }});
        let h = |pairs: &[(&str, &str)]| {
            List(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                    .collect(),
            )
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
        assert!(!ok(&[("Mcp-Param-Region", "us\u{1}")], json!({"region": "us\u{1}"})));
        let e = check_param_headers(&h(&[]), &schema, Some(&json!({"region": "x"})))
            .err()
            .unwrap();
        assert_eq!((e.status(), e.code), (400, code::HEADER_MISMATCH));
    }

    #[test]
    fn meta_is_read_for_the_revisions_own_members() {
        // The own members' texts, when `_meta` holds only those; `_meta` stays a member,
        // as it was written, either way.
        let parse = |meta: &str| {
            let params = RawValue::from_string(format!(r#"{{"name":"t","_meta":{meta}}}"#)).unwrap();
            let m = message::Members::parse(Some(params)).unwrap();
            let texts = match m.peeked() {
                message::Peeked::Own(spans) => {
                    Some(spans.clone().map(|s| s.and_then(|s| m.text_of(&s)).map(str::to_owned)))
                }
                message::Peeked::Absent | message::Peeked::Other => None,
            };
            assert_eq!(m.get_str("name").as_deref(), Some("t"));
            assert_eq!(m.get_raw("_meta"), Some(meta));
            texts
        };
        let own =
            format!(r#"{{"{META_VERSION}":"v","{META_CAPS}":{{}},"{META_INFO}":{{"name":"x"}},"{META_LOG}":"info"}}"#);
        let some = |t: &str| Some(t.to_owned());
        assert_eq!(parse(&own), Some([some(r#""v""#), some("{}"), some(r#""info""#)]));
        // Any other member, a repeated one, or not an object: kept, for the general path.
        assert_eq!(parse(&format!(r#"{{"{META_VERSION}":"v","progressToken":1}}"#)), None);
        assert_eq!(
            parse(&format!(r#"{{"{META_VERSION}":"v","{META_VERSION}":"w"}}"#)),
            None
        );
        for other in ["null", "[]", "[1,{}]", "1", "\"x\"", "true"] {
            assert_eq!(parse(other), None, "{other}");
        }
        // A key written with escapes is read decoded.
        let escaped = r#"{"io.modelcontextprotocol\/protocolVersion":"v"}"#;
        assert_eq!(parse(escaped), Some([some(r#""v""#), None, None]));
        assert_eq!(parse("{}"), Some([None, None, None]));
        assert_eq!(parse("{ \n}"), Some([None, None, None]));
        // Two `_meta` members: the general path decides (the last one's value, as a map keeps).
        let params = RawValue::from_string(format!(r#"{{"_meta":{own},"_meta":{{"k":1}}}}"#)).unwrap();
        let mut m = message::Members::parse(Some(params)).unwrap();
        assert_eq!(m.peeked(), &message::Peeked::Other);
        assert_eq!(m.meta().map(|m| Value::Object(m.clone())), Some(json!({"k": 1})));
    }

    /// The params the router gets opened are the ones it would get written out and parsed
    /// again (as before they were handed over opened): the same bytes go downstream.
    #[test]
    fn opened_params_go_downstream_as_written_ones_would() {
        let meta = format!(r#""{META_VERSION}":"{VERSION}","{META_CAPS}":{{}}"#);
        for text in [
            format!(r#"{{"name":"s__e","arguments":{{"t":"x"}},"_meta":{{{meta}}}}}"#),
            format!(
                r#"{{ "name" : "s__e", "arguments":{{"z":1.50, "a" : [2e3]}},"_meta":{{{meta},"progressToken":1.50,"k":"caf\u00e9"}},"task":{{}}}}"#
            ),
            format!(
                r#"{{"n\u0061me":"s__e","name":"s__f","_meta":{{{meta},"io.modelcontextprotocol/clientInfo":{{"name":"c"}}}},"x":null}}"#
            ),
            format!(r#"{{"_meta":{{{meta},"progress\u0054oken":"t"}},"name":"s__e"}}"#),
        ] {
            let envelope = || {
                let raw = RawValue::from_string(text.clone()).unwrap();
                check(None, "tools/call", Method::ToolsCall, Some(raw).into(), |_| None)
                    .ok()
                    .unwrap()
                    .params
            };
            // What call_named and forward do to them.
            let downstream = |mut m: message::Members| {
                m.insert_str("name", "e");
                let token = m.take_progress().map(|t| t.get().to_owned());
                let mut out = Vec::new();
                m.write_to(&mut out);
                (String::from_utf8(out).unwrap(), token)
            };
            let opened = downstream(envelope().into_members().unwrap());
            let again = message::Incoming::Raw(envelope().into_raw());
            assert!(matches!(envelope(), message::Incoming::Opened(_)));
            assert_eq!(opened, downstream(again.into_members().unwrap()), "{text}");
        }
    }

    #[test]
    fn meta_values_read_as_they_are_or_parsed_agree() {
        let run = |version: &str, caps: &str| {
            let text = format!(r#"{{"name":"t","_meta":{{"{META_VERSION}":{version},"{META_CAPS}":{caps}}}}}"#);
            let raw = RawValue::from_string(text).unwrap();
            check(None, "tools/call", Method::ToolsCall, Some(raw).into(), |_| None)
                .map(|e| Value::Object(e.capabilities))
        };
        assert_eq!(run(r#""2026-07-28""#, "{}").ok(), Some(json!({})));
        assert_eq!(run(r#""2026\u002d07-28""#, "{ }").ok(), Some(json!({})));
        assert_eq!(
            run(r#""2026-07-28""#, r#"{"roots":{}}"#).ok(),
            Some(json!({"roots": {}}))
        );
        assert_eq!(
            run(r#""2025-11-25""#, "{}").err().map(|e| e.code),
            Some(code::UNSUPPORTED_VERSION)
        );
        for (v, c) in [("7", "{}"), (r#""2026-07-28""#, r#""{}""#), (r#""2026-07-28""#, "[]")] {
            let e = run(v, c).expect_err("refused");
            assert_eq!(e.code, code::INVALID_PARAMS, "{v} {c}");
        }
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
