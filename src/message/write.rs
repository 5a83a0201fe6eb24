//! The lines the gateway writes (requests, notifications), their framing for a
//! newline-delimited stream, and small builders of raw JSON values.

use super::id::Id;
use super::members::Members;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Makes `message` exactly one line for a newline-delimited stream (a stdio child's
/// stdin, the stdio front's stdout): every raw LF or CR in it becomes a space, and one
/// `\n` ends it. In valid JSON a raw LF or CR can only be whitespace between tokens
/// (inside a string it must be escaped), so the message means the same; and whatever
/// bytes a peer got into it, it cannot become two messages. In place, no copy: the
/// scan is SIMD `memchr2`, and a message without either byte is untouched.
pub fn frame_line(message: &mut Vec<u8>) {
    if message.last() == Some(&b'\n') {
        message.pop();
    }
    blank_line_breaks(message);
    message.push(b'\n');
}

/// Replaces every raw LF and CR in `bytes` with a space.
pub fn blank_line_breaks(bytes: &mut [u8]) {
    let mut from = 0;
    while let Some(i) = memchr::memchr2(b'\n', b'\r', &bytes[from..]) {
        bytes[from + i] = b' ';
        from += i + 1;
    }
}

/// Whether `bytes` holds a raw LF or CR.
pub fn has_line_breaks(bytes: &[u8]) -> bool {
    memchr::memchr2(b'\n', b'\r', bytes).is_some()
}

/// Writes a request line: `{"jsonrpc":"2.0","id":..,"method":..,"params":..}`.
pub fn request(id: &Id, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    call(Some(id), method, params)
}

/// Writes a notification line.
pub fn notification(method: &str, params: Option<&RawValue>) -> Vec<u8> {
    call(None, method, params)
}

fn call(id: Option<&Id>, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    let mut out = call_head(id, method, params.map_or(0, |p| p.get().len()));
    if let Some(p) = params {
        out.extend_from_slice(b",\"params\":");
        out.extend_from_slice(p.get().as_bytes());
    }
    out.push(b'}');
    out
}

/// `{"jsonrpc":"2.0","id":<id>,"method":<method>` (without the id for a notification),
/// with room for `more` bytes after it.
fn call_head(id: Option<&Id>, method: &str, more: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + method.len() + more);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.extend_from_slice(b"\"id\":");
        out.extend_from_slice(id.get().as_bytes());
        out.push(b',');
    }
    out.extend_from_slice(b"\"method\":");
    write_str(&mut out, method);
    out
}

/// Writes a request line with a numeric id and params given as an object map,
/// serialized straight into the line (the same bytes as [`request`] with
/// `to_raw(&Value::Object(params))`, without the intermediate string).
pub fn request_with_object(id: u64, method: &str, params: &Map<String, Value>) -> Vec<u8> {
    let mut out = call_head(Some(&Id::from(id)), method, 32 + 16 * params.len());
    out.extend_from_slice(b",\"params\":");
    // Writing a map of Values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, params);
    out.push(b'}');
    out
}

/// Writes a JSON string.
#[inline]
pub(super) fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A JSON-RPC error object.
pub fn error_object(code: i64, message: &str, data: Option<Value>) -> Box<RawValue> {
    let mut m = Map::new();
    m.insert("code".into(), code.into());
    m.insert("message".into(), message.into());
    if let Some(d) = data {
        m.insert("data".into(), d);
    }
    to_raw(&Value::Object(m))
}

/// Serializes a value into an owned raw JSON value.
pub fn to_raw(v: &Value) -> Box<RawValue> {
    // A serde_json::Value always serializes.
    RawValue::from_string(v.to_string()).unwrap_or_else(|_| empty_object())
}

/// `{}` as a raw value.
pub fn empty_object() -> Box<RawValue> {
    // "{}" is valid JSON.
    RawValue::from_string("{}".to_owned()).expect("{} is JSON")
}

/// Reads params as a JSON object (absent params read as an empty object).
pub fn params_object(params: Option<&RawValue>) -> Result<Map<String, Value>, String> {
    match params {
        None => Ok(Map::new()),
        Some(p) => match serde_json::from_str::<Value>(p.get()) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err("params must be an object".into()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Writes a notification line with opened params ([`Members`]).
pub fn notification_with_members(method: &str, params: &Members) -> Vec<u8> {
    with_members(None, method, params)
}

/// Writes a request line with a numeric id and opened params ([`Members`]).
pub fn request_with_members(id: u64, method: &str, params: &Members) -> Vec<u8> {
    with_members(Some(&Id::from(id)), method, params)
}

fn with_members(id: Option<&Id>, method: &str, params: &Members) -> Vec<u8> {
    let mut out = call_head(id, method, params.len_hint());
    out.extend_from_slice(b",\"params\":");
    params.write_to(&mut out);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    #[test]
    fn request_with_object_matches_request() {
        let params: Map<String, Value> = serde_json::from_str(
            r#"{"name":"e\"cho","arguments":{"text":"hi \u00e9\n","n":[1.5,2e3,-0]},"_meta":{"progressToken":7}}"#,
        )
        .unwrap();
        for (id, method) in [(0u64, "tools/call"), (u64::MAX, "we\"ird/méthod")] {
            let want = request(&Id::from(id), method, Some(&to_raw(&Value::Object(params.clone()))));
            assert_eq!(request_with_object(id, method, &params), want);
        }
        assert_eq!(
            request_with_object(3, "x", &Map::new()),
            br#"{"jsonrpc":"2.0","id":3,"method":"x","params":{}}"#.to_vec()
        );
    }

    #[test]
    fn frame_line_makes_pretty_and_crlf_json_one_line() {
        let pretty = serde_json::to_vec_pretty(&serde_json::json!({
            "jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "e", "arguments": {"text": "a\nb\r\nc", "n": [1, 2]}}
        }))
        .unwrap();
        assert!(pretty.contains(&b'\n'));
        let crlf = String::from_utf8(pretty.clone()).unwrap().replace('\n', "\r\n") + "\r\n";
        for input in [pretty, crlf.into_bytes()] {
            let want: Value = serde_json::from_slice(&input).unwrap();
            let mut line = input;
            frame_line(&mut line);
            assert_eq!(memchr::memchr_iter(b'\n', &line).collect::<Vec<_>>(), [line.len() - 1]);
            assert!(!line.contains(&b'\r'));
            let got: Map<String, Value> = serde_json::from_slice(&line).unwrap();
            // The same message, the escaped line breaks in the string included.
            assert_eq!(Value::Object(got), want);
        }
        let mut one = br#"{"a":1}"#.to_vec();
        frame_line(&mut one);
        assert_eq!(one, b"{\"a\":1}\n");
    }
}
