//! Speaking 2026-07-28 (the stateless era) to a downstream server: the per-request
//! `_meta` envelope, the `server/discover` probe and what it says, the HTTP request
//! metadata headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`) and the `x-mcp-header`
//! rules a tool must meet to be offered at all.
//!
//! The gateway forwards the calling client's own `protocolVersion` and
//! `clientCapabilities` (never a union of every client's), so a server that needs a
//! capability the caller lacks can refuse with -32021 itself.

use super::{Connection, Params, Sink};
use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::method::Method;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

use crate::message::meta::{META_CAPS, META_INFO, META_LOG, META_VERSION};
pub use crate::message::meta::{META_SUBSCRIPTION, VERSION};

/// The gateway as a client.
pub fn client_info() -> Value {
    json!({ "name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION") })
}

/// Puts the 2026-07-28 envelope into `params._meta`: the version, the caller's
/// capabilities (`{}` for the gateway's own requests), the gateway's `clientInfo`, and
/// the log level the caller asked for (none: the server sends no log messages).
pub fn stamp(params: &mut Map<String, Value>, capabilities: Option<Map<String, Value>>, log_level: Option<&str>) {
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Value::Object(m) = meta {
        m.insert(META_VERSION.into(), Value::String(VERSION.into()));
        m.insert(META_CAPS.into(), Value::Object(capabilities.unwrap_or_default()));
        m.entry(META_INFO).or_insert_with(client_info);
        match log_level {
            Some(l) => {
                m.insert(META_LOG.into(), Value::String(l.into()));
            }
            None => {
                m.remove(META_LOG);
            }
        }
    }
}

/// Params of a background request of the gateway's own (lists, the probe, listen).
pub fn own_params(mut params: Map<String, Value>) -> Map<String, Value> {
    stamp(&mut params, None, None);
    params
}

/// What a `server/discover` result says, when it is one naming [`VERSION`].
pub struct Discovered {
    pub capabilities: Option<Map<String, Value>>,
    pub instructions: Option<String>,
}

/// Reads a `server/discover` result. `None` unless it lists [`VERSION`] among
/// `supportedVersions` (a server advertising only handshake versions is a legacy one).
pub fn discovered(result: &str) -> Option<Discovered> {
    let mut r: Map<String, Value> = serde_json::from_str(result).ok()?;
    let versions = r.get("supportedVersions")?.as_array()?;
    if !versions.iter().any(|v| v.as_str() == Some(VERSION)) {
        return None;
    }
    Some(Discovered {
        capabilities: match r.remove("capabilities") {
            Some(Value::Object(c)) => Some(c),
            _ => None,
        },
        instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
    })
}

/// A header value per the 2026-07-28 value encoding: as is when it is plain visible
/// ASCII (spaces inside allowed, no tabs or other controls) and does not look like the sentinel; otherwise
/// `=?base64?…?=` of its UTF-8 bytes.
pub fn header_value(s: &str) -> String {
    let unsafe_chars = s.bytes().any(|b| !(0x20..=0x7e).contains(&b));
    let padded = s.starts_with(' ') || s.ends_with(' ');
    let sentinel = s.starts_with("=?base64?") && s.ends_with("?=");
    let plain = !(unsafe_chars || padded || sentinel);
    if plain {
        s.to_owned()
    } else {
        format!("=?base64?{}?=", base64(s.as_bytes()))
    }
}

fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `Mcp-Name` for a request: the params field its method names its target by
/// ([`Method::target_field`]: `name` of `tools/call` and `prompts/get`, `uri` of
/// `resources/read`).
pub fn name_header(method: &str, params: &Map<String, Value>) -> Option<String> {
    let field = Method::parse(method).target_field()?;
    params.get(field).and_then(Value::as_str).map(header_value)
}

/// The `Mcp-Param-{h}` headers of a call: for each property of `schema` reached through
/// `properties` keys only that carries `x-mcp-header: h`, the argument at that path
/// (omitted when absent or null).
pub fn param_headers(schema: &Value, arguments: Option<&Value>, out: &mut Vec<(String, String)>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, prop) in props {
        let value = arguments.and_then(|a| a.get(key)).filter(|v| !v.is_null());
        if let Some(Value::String(h)) = prop.get("x-mcp-header") {
            let text = match value {
                Some(Value::String(s)) => header_value(s),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => continue,
            };
            out.push((format!("Mcp-Param-{h}"), text));
        } else if prop.get("properties").is_some() {
            param_headers(prop, value, out);
        }
    }
}

/// Checks a tool's `x-mcp-header` annotations against the 2026-07-28 rules; a tool that
/// breaks them must not be offered. The error says why.
pub fn check_x_mcp_headers(input_schema: Option<&Value>) -> Result<(), String> {
    let Some(schema) = input_schema else { return Ok(()) };
    let mut seen = Vec::new();
    walk(schema, true, &mut seen)
}

fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// `reachable`: this schema is reached from the root through `properties` keys only.
fn walk(schema: &Value, reachable: bool, seen: &mut Vec<String>) -> Result<(), String> {
    let Some(obj) = schema.as_object() else { return Ok(()) };
    if let Some(h) = obj.get("x-mcp-header") {
        if !reachable {
            return Err("x-mcp-header on a property not reachable through `properties` keys alone".into());
        }
        let Some(h) = h.as_str() else {
            return Err("x-mcp-header is not a string".into());
        };
        // The server's value, as the reason repeats it: by its start when long.
        let said = crate::error::echo(h);
        if h.is_empty() || !h.chars().all(is_tchar) {
            return Err(format!("x-mcp-header {said:?} is not an HTTP field-name token"));
        }
        if seen.iter().any(|s| s.eq_ignore_ascii_case(h)) {
            return Err(format!("x-mcp-header {said:?} appears twice (case-insensitively)"));
        }
        let types: Vec<&str> = match obj.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if types.is_empty() || !types.iter().all(|t| matches!(*t, "string" | "integer" | "boolean")) {
            return Err(format!(
                "x-mcp-header {said:?} is on a property whose type is not string, integer or boolean"
            ));
        }
        seen.push(h.to_owned());
    }
    for (k, v) in obj {
        match k.as_str() {
            "properties" => {
                if let Some(props) = v.as_object() {
                    for p in props.values() {
                        walk(p, reachable, seen)?;
                    }
                }
            }
            "x-mcp-header" | "type" | "description" | "title" | "enum" | "const" | "default" | "examples"
            | "required" => {}
            _ => match v {
                Value::Object(_) => walk(v, false, seen)?,
                Value::Array(items) => {
                    for i in items {
                        walk(i, false, seen)?;
                    }
                }
                _ => {}
            },
        }
    }
    Ok(())
}

/// The most rounds of questions one call may take through the bridge.
const MAX_ROUNDS: usize = 16;

/// The first pause before a call is sent again after an `input_required` that carried only
/// `requestState`; each such round in a row doubles it, up to [`STATE_ONLY_PAUSE_MAX`]
/// (the Python SDK's driver: 50 ms doubling to 250 ms).
const STATE_ONLY_PAUSE: Duration = Duration::from_millis(50);
const STATE_ONLY_PAUSE_MAX: Duration = Duration::from_millis(250);

/// The most questions one round may ask through the bridge: as many as a connection's
/// own requests may wait at once ([`super::questions::MAX_QUESTIONS`]). Each is a request
/// on the client's stream and an answer carried in the retry; a server is not to make
/// the gateway ask a client thousands of them.
const MAX_ROUND_QUESTIONS: usize = super::questions::MAX_QUESTIONS;

/// The bridge from a stateless (2026-07-28) server to a handshake-era client: while the server answers
/// `input_required`, each of its `inputRequests` is asked of the client as a real
/// request on the call's stream (`sampling/createMessage`, `elicitation/create`,
/// `roots/list`, each checked against the client's capabilities), and the call is sent
/// again with the answers as `inputResponses` and the server's `requestState` echoed. The
/// client sees one ordinary call. `params` are the call's params as first sent.
///
/// The server's `timeout` covers the whole call, however many rounds it takes and the
/// time its questions wait for the client included (as it covers a handshake-era
/// server's own questions); a question still unanswered then is withdrawn from the
/// client. Everything refused names the server.
#[allow(clippy::too_many_arguments)]
pub async fn bridge_input_required(
    conn: &Connection,
    server: &Arc<str>,
    method: &str,
    mut out: Outcome,
    params: Map<String, Value>,
    headers: Vec<(String, String)>,
    progress: Option<Id>,
    sink: Option<Sink>,
    timeout: Duration,
) -> Outcome {
    let fail = |msg: String| Outcome::Error(Error::server(server, code::INTERNAL_ERROR, msg).object());
    let timed_out = || {
        Outcome::Error(
            super::DsError::Timeout {
                server: server.clone(),
                method: method.to_owned(),
                after: timeout,
            }
            .to_error_object(),
        )
    };
    // One deadline for the whole call, however many rounds it takes.
    let deadline = tokio::time::Instant::now() + timeout;
    let mut shed_pause = STATE_ONLY_PAUSE;
    for _ in 0..MAX_ROUNDS {
        let Outcome::Result(r) = &out else { return out };
        let Some((requests, state)) = input_required(r.get()) else {
            return out;
        };
        if requests.is_empty() {
            let Some(state) = state.filter(|s| !s.is_null()) else {
                // Neither: the spec's MUST broken, and sending the call again would only loop.
                return fail(format!(
                    "server '{server}' answered {method} with input_required but asked nothing (no inputRequests, no requestState)"
                ));
            };
            // Only `requestState`: the server asks to be called again with it (it sheds
            // load, or works in steps). After a pause, as the SDKs' drivers do.
            if tokio::time::Instant::now() + shed_pause >= deadline {
                return timed_out();
            }
            tokio::time::sleep(shed_pause).await;
            shed_pause = (shed_pause * 2).min(STATE_ONLY_PAUSE_MAX);
            let mut retry = params.clone();
            retry.insert("requestState".into(), state);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            out = match conn
                .call_with_headers(
                    method,
                    Params::Object {
                        params: retry,
                        progress: progress.clone(),
                    },
                    sink.clone(),
                    left,
                    headers.clone(),
                )
                .await
            {
                Ok(o) => o,
                Err(e) => return Outcome::Error(e.to_error_object()),
            };
            continue;
        }
        shed_pause = STATE_ONLY_PAUSE;
        if requests.len() > MAX_ROUND_QUESTIONS {
            return fail(format!(
                "server '{server}' asked {} questions in one input_required round of {method}; mcp-gateway asks a client at most {MAX_ROUND_QUESTIONS} per round",
                requests.len()
            ));
        }
        let Some((sink, peer)) = sink.as_ref().and_then(|s| s.peer().cloned().map(|p| (s, p))) else {
            return fail(format!(
                "server '{server}' needs input from the client for {method}, but this call has no stream to ask it on"
            ));
        };
        // Every question is checked before any is asked: a round that cannot be
        // answered whole is not half asked.
        let mut asks = Vec::with_capacity(requests.len());
        for (key, request) in requests {
            match question(server, method, &key, &request) {
                Ok(q) => asks.push((key, q)),
                Err(msg) => return fail(msg),
            }
        }
        let mut responses = Map::new();
        for (key, (asked, asked_params)) in asks {
            // The question's own sink: withdrawn from the client at the deadline.
            let (qsink, withdraw) = sink.clone().for_question();
            let ask = peer.clone().ask(asked.clone(), asked_params, qsink);
            tokio::pin!(ask);
            let answer = tokio::select! {
                a = &mut ask => a,
                _ = tokio::time::sleep_until(deadline) => {
                    withdraw.cancel();
                    // It sees the withdrawal, tells the client and forgets the question.
                    let _ = ask.await;
                    return timed_out();
                }
            };
            match answer {
                Outcome::Result(answer) => {
                    let answer = serde_json::from_str(answer.get()).unwrap_or(Value::Null);
                    responses.insert(key, answer);
                }
                Outcome::Error(e) => return Outcome::Error(refused(server, method, &asked, &e)),
            }
        }
        let mut retry = params.clone();
        if !responses.is_empty() {
            retry.insert("inputResponses".into(), Value::Object(responses));
        }
        if let Some(state) = state {
            retry.insert("requestState".into(), state);
        }
        let params = Params::Object {
            params: retry,
            progress: progress.clone(),
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return timed_out();
        }
        out = match conn
            .call_with_headers(method, params, Some(sink.clone()), left, headers.clone())
            .await
        {
            Ok(o) => o,
            Err(e) => return Outcome::Error(e.to_error_object()),
        };
    }
    fail(format!(
        "server '{server}' still needed input after {MAX_ROUNDS} rounds of {method}; giving up"
    ))
}

/// A server's answer to a handshake-era client's `method` that may not ask (anything
/// but tools/call, prompts/get and resources/read): an `input_required` is an error naming
/// the server, since the client cannot read one and there is no call to bridge.
pub fn refuse_input_required(server: &Arc<str>, method: &str, out: Outcome) -> Outcome {
    match &out {
        Outcome::Result(r) if input_required(r.get()).is_some() => Outcome::Error(
            Error::server(
                server,
                code::INTERNAL_ERROR,
                format!(
                    "server '{server}' answered {method} with input_required, which a server may answer only to tools/call, prompts/get and resources/read"
                ),
            )
            .object(),
        ),
        _ => out,
    }
}

/// A server's `input_required` answer, on its way to a 2026-07-28 client that asks the
/// questions itself: checked as the bridge checks a round before asking a handshake client
/// (a method a server may answer with it, at most [`MAX_ROUND_QUESTIONS`] questions, each
/// one a server may ask, with object params, of a capability, mode and sampling tools the
/// client declared), and a sampling question's `includeContext` made "none" (through the
/// gateway "this server" is every server behind it). Anything refused fails the call,
/// naming the server; the client is asked nothing. Other answers pass as they are.
pub fn relay_input_required(
    server: &Arc<str>,
    method: Method,
    client: &crate::client::Client,
    out: Outcome,
) -> Outcome {
    let Outcome::Result(r) = &out else { return out };
    let Some((requests, _)) = input_required(r.get()) else {
        return out;
    };
    let fail = |msg: String| Outcome::Error(Error::server(server, code::INTERNAL_ERROR, msg).object());
    let name = method.as_str();
    if !method.may_ask() {
        return refuse_input_required(server, name, out);
    }
    if requests.len() > MAX_ROUND_QUESTIONS {
        return fail(format!(
            "server '{server}' asked {} questions in one input_required round of {name}; mcp-gateway passes a client at most {MAX_ROUND_QUESTIONS} per round",
            requests.len()
        ));
    }
    let mut rewritten = Map::new();
    let mut changed = false;
    for (key, request) in &requests {
        let (asked, params) = match question(server, name, key, request) {
            Ok(q) => q,
            Err(msg) => return fail(msg),
        };
        let cap = crate::client::ASKED_FOR
            .iter()
            .find(|(m, _)| *m == asked)
            .map_or("", |(_, cap)| *cap);
        if let Some((_, why)) = client.refusal(cap, &asked, params.as_deref()) {
            return fail(format!(
                "server '{server}' asked {asked} ({}) for {name}, but {why}",
                shown(key)
            ));
        }
        let mut request = request.clone();
        if asked == "sampling/createMessage" {
            if let Some(p) = crate::client::without_context(params.clone()) {
                if params.as_ref().is_some_and(|o| o.get() != p.get()) {
                    changed = true;
                    if let (Some(obj), Ok(v)) = (request.as_object_mut(), serde_json::from_str::<Value>(p.get())) {
                        obj.insert("params".into(), v);
                    }
                }
            }
        }
        rewritten.insert(key.clone(), request);
    }
    if !changed {
        return out;
    }
    let Ok(mut whole) = serde_json::from_str::<Map<String, Value>>(r.get()) else {
        return out;
    };
    whole.insert("inputRequests".into(), Value::Object(rewritten));
    Outcome::Result(message::to_raw(&Value::Object(whole)).into())
}

/// One of a server's `inputRequests` (`key`), as the bridge asks it: its method, one a
/// server may ask a client ([`crate::client::ASKED_FOR`]), and its params, an object if
/// any. Else why not, naming the server (its own values cut and escaped).
fn question(
    server: &str,
    method: &str,
    key: &str,
    request: &Value,
) -> Result<(String, Option<Box<serde_json::value::RawValue>>), String> {
    let key = shown(key);
    let Some(asked) = request.get("method").and_then(Value::as_str) else {
        return Err(format!(
            "server '{server}' sent an input request with no method ({key}) in its input_required for {method}"
        ));
    };
    if !crate::client::ASKED_FOR.iter().any(|(m, _)| *m == asked) {
        return Err(format!(
            "server '{server}' asked the client {} ({key}) in its input_required for {method}; a server may ask only sampling/createMessage, elicitation/create and roots/list",
            shown(asked)
        ));
    }
    let params = match request.get("params") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(message::to_raw(p)),
        Some(_) => {
            return Err(format!(
                "server '{server}' asked the client {asked} ({key}) in its input_required for {method} with params that are not an object"
            ))
        }
    };
    Ok((asked.to_owned(), params))
}

/// A server's value as an error repeats it: cut ([`crate::error::echo`]) and with every
/// control character escaped, as its log lines are.
fn shown(value: &str) -> String {
    super::shown_line(crate::error::echo(value).as_bytes(), usize::MAX, &[]).0
}

/// The client's refusal of question `asked` (no capability for it; its own error), as the
/// call's error: its code and data, its message saying which server asked what.
fn refused(
    server: &Arc<str>,
    method: &str,
    asked: &str,
    e: &serde_json::value::RawValue,
) -> Box<serde_json::value::RawValue> {
    let mut obj: Map<String, Value> = serde_json::from_str(e.get()).unwrap_or_default();
    let why = obj
        .get("message")
        .and_then(Value::as_str)
        .map(shown)
        .unwrap_or_default();
    let code = obj.get("code").and_then(Value::as_i64).unwrap_or(code::INTERNAL_ERROR);
    let mut err = Error::server(
        server,
        code,
        format!("server '{server}' asked the client {asked} during {method}, which failed: {why}"),
    );
    if let Some(data) = obj.remove("data") {
        err = err.with_data(data);
    }
    err.object()
}

/// The `inputRequests` and `requestState` of an `input_required` result.
fn input_required(result: &str) -> Option<(Map<String, Value>, Option<Value>)> {
    if !result.contains("input_required") {
        return None;
    }
    let mut r: Map<String, Value> = serde_json::from_str(result).ok()?;
    if r.get("resultType").and_then(Value::as_str) != Some("input_required") {
        return None;
    }
    let requests = match r.remove("inputRequests") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    Some((requests, r.remove("requestState")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_follow_the_encoding_rules() {
        assert_eq!(header_value("us-west1"), "us-west1");
        assert_eq!(header_value("Hello, 世界"), "=?base64?SGVsbG8sIOS4lueVjA==?=");
        assert_eq!(header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(header_value("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
        assert_eq!(
            header_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
    }

    #[test]
    fn x_mcp_header_rules() {
        let ok = json!({"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"},
            "nested":{"type":"object","properties":{"n":{"type":"integer","x-mcp-header":"N"}}}}});
        assert!(check_x_mcp_headers(Some(&ok)).is_ok());
        let mut out = Vec::new();
        param_headers(&ok, Some(&json!({"region":"eu","nested":{"n":7}})), &mut out);
        assert_eq!(
            out,
            vec![
                ("Mcp-Param-Region".into(), "eu".into()),
                ("Mcp-Param-N".into(), "7".into())
            ]
        );
        for bad in [
            json!({"properties":{"a":{"type":"number","x-mcp-header":"A"}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":""}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":"A B"}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":"A"},"b":{"type":"string","x-mcp-header":"a"}}}),
            json!({"properties":{"a":{"type":"array","items":{"type":"string","x-mcp-header":"A"}}}}),
            json!({"anyOf":[{"properties":{"a":{"type":"string","x-mcp-header":"A"}}}]}),
        ] {
            assert!(check_x_mcp_headers(Some(&bad)).is_err(), "{bad}");
        }
    }
}
