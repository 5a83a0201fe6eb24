//! The JSON-RPC envelope and typed views of the few fields the gateway rewrites.
//!
//! A message is parsed into a [`Kind`]: `id` and `method` are read, while
//! `params`, `result` and `error` stay as raw JSON text ([`RawValue`]) until some
//! code needs to look inside. A large tool result is never re-serialized nor copied
//! here: it stays a slice of the message it came in ([`Raw`], [`Kind::parse_shared`])
//! and goes out from that buffer ([`Answer`]). Fields the gateway does not know pass
//! through untouched. Pure: no I/O.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// JSON-RPC error codes: defined once, in [`crate::error::code`].
pub use crate::error::code;

/// The longest id accepted, in bytes of its JSON text (quotes and escapes included).
/// A longer one makes the message an invalid request (-32600).
pub const MAX_ID_LEN: usize = 256;

/// The longest method name accepted, in bytes. A longer one makes the message an invalid
/// request (-32600).
pub const MAX_METHOD_LEN: usize = 256;

/// The longest tool or prompt name accepted in `tools/call` and `prompts/get`, in bytes
/// (decoded). Public names are at most [`crate::catalog::MAX_NAME`]; a longer one is
/// refused with -32602 without being echoed back.
pub const MAX_NAME_LEN: usize = 256;

/// The deepest nesting of arrays and objects accepted in a request or notification, the
/// message's own object counting as one level. A deeper one is an invalid request
/// (-32600), refused before any of it is forwarded: deep JSON overflows the stack of
/// many parsers (Python's `json`, serde_json without its recursion limit), and serde_json
/// itself refuses to build a `Value` past 128 levels. Checked once per message by a
/// byte scan ([`nested_deeper_than`]: strings are skipped with SIMD `memchr`, so a large
/// argument string costs little);
/// responses are not scanned (results pass through untouched, however deep).
pub const MAX_DEPTH: usize = 64;

/// An id of up to this many bytes of JSON text is kept inline: every integer id, and
/// most string ones, without an allocation.
const INLINE_ID: usize = 22;

/// A request id (or progress token) exactly as the peer wrote it: its own JSON text, kept
/// byte for byte end to end (`1e2` stays `1e2`, `-0` stays `-0`, `1.50` stays `1.50`, a
/// number beyond 64 bits keeps its digits). `1` and `"1"` are different ids.
///
/// Not `serde_json::Value`: without serde_json's `arbitrary_precision` feature a `Value`
/// rewrites numbers (`1e2` → `100.0`), and that feature is not an option (it changes
/// number buffering crate-wide, breaking `untagged` and `flatten`). The text is always
/// one valid JSON value without surrounding whitespace.
#[derive(Clone)]
pub struct Id(IdText);

#[derive(Clone)]
enum IdText {
    Inline(u8, [u8; INLINE_ID]),
    Shared(std::sync::Arc<str>),
}

impl Id {
    /// `null`, the id of an answer to a message whose id could not be read.
    pub const NULL: Id = Id::inline_const(b"null");

    const fn inline_const(text: &[u8]) -> Id {
        let mut buf = [0u8; INLINE_ID];
        let mut i = 0;
        while i < text.len() {
            buf[i] = text[i];
            i += 1;
        }
        Id(IdText::Inline(text.len() as u8, buf))
    }

    /// From JSON text already known to be one valid JSON value without surrounding
    /// whitespace (a parsed `RawValue`, or text the gateway wrote).
    fn from_json(text: &str) -> Id {
        if text.len() <= INLINE_ID {
            let mut buf = [0u8; INLINE_ID];
            buf[..text.len()].copy_from_slice(text.as_bytes());
            Id(IdText::Inline(text.len() as u8, buf))
        } else {
            Id(IdText::Shared(text.into()))
        }
    }

    /// An id from a raw JSON value (its text, without surrounding whitespace).
    pub fn from_raw(raw: &RawValue) -> Id {
        Id::from_json(raw.get().trim_matches([' ', '\t', '\n', '\r']))
    }

    /// An id from its JSON text, when that is one JSON value.
    pub fn parse(text: &str) -> Option<Id> {
        let raw: &RawValue = serde_json::from_str(text).ok()?;
        Some(Id::from_json(raw.get()))
    }

    /// A string id.
    pub fn string(s: &str) -> Id {
        let mut out = Vec::with_capacity(s.len() + 2);
        write_str(&mut out, s);
        Id::from_json(std::str::from_utf8(&out).unwrap_or("\"\""))
    }

    /// An id from a parsed value (for a token that was only ever seen as one: its
    /// number formatting is serde_json's, no longer the peer's).
    pub fn from_value(v: &Value) -> Id {
        Id::from_json(&v.to_string())
    }

    /// The JSON text, as the peer wrote it.
    pub fn get(&self) -> &str {
        match &self.0 {
            // Made from a &str cut at its end: always UTF-8.
            IdText::Inline(len, buf) => std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or("null"),
            IdText::Shared(s) => s,
        }
    }

    pub fn is_string(&self) -> bool {
        self.get().starts_with('"')
    }

    pub fn is_number(&self) -> bool {
        matches!(self.get().as_bytes().first(), Some(b'-' | b'0'..=b'9'))
    }

    pub fn is_null(&self) -> bool {
        self.get() == "null"
    }

    /// A string id, decoded.
    pub fn as_str(&self) -> Option<std::borrow::Cow<'_, str>> {
        let inner = self.get().strip_prefix('"')?.strip_suffix('"')?;
        if !inner.contains('\\') {
            return Some(std::borrow::Cow::Borrowed(inner));
        }
        serde_json::from_str::<String>(self.get())
            .ok()
            .map(std::borrow::Cow::Owned)
    }

    /// A number id written as a plain non-negative integer that fits 64 bits.
    pub fn as_u64(&self) -> Option<u64> {
        let t = self.get();
        if t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty() {
            t.parse().ok()
        } else {
            None
        }
    }

    /// The key for hash maps of ids: the JSON text, with a string's escapes written
    /// canonically (`"\u0031"` and `"1"` are the same id; `1` and `"1"` are not; numbers
    /// are their text, so `1` and `1.0` differ, as ids echoed back byte for byte must).
    pub fn key(&self) -> std::borrow::Cow<'_, str> {
        let t = self.get();
        if self.is_string() && t.contains('\\') {
            if let Some(s) = self.as_str() {
                let mut out = Vec::with_capacity(t.len());
                write_str(&mut out, &s);
                if let Ok(k) = String::from_utf8(out) {
                    return std::borrow::Cow::Owned(k);
                }
            }
        }
        std::borrow::Cow::Borrowed(t)
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Id {
        let mut buf = [0u8; INLINE_ID];
        let mut digits = [0u8; 20];
        let (mut n, mut len) = (n, 0);
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for (b, d) in buf.iter_mut().zip(digits[..len].iter().rev()) {
            *b = *d;
        }
        Id(IdText::Inline(len as u8, buf))
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Id {}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl std::fmt::Debug for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl serde::Serialize for Id {
    /// As its own text (into a `Value`, serde_json parses it).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<&RawValue>(self.get()) {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_unit(),
        }
    }
}

/// The key for hash maps of ids: see [`Id::key`].
pub fn id_key(id: &Id) -> String {
    id.key().into_owned()
}

/// What a parsed message is.
#[derive(Debug)]
pub enum Kind {
    Request {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// A response. `id` is `None` when the peer sent none, `Some(Id::NULL)` for `"id": null`.
    Response { id: Option<Id>, outcome: Outcome },
}

/// The two shapes of a response body.
#[derive(Debug, Clone)]
pub enum Outcome {
    Result(Raw),
    Error(Box<RawValue>),
}

impl From<crate::error::Error> for Outcome {
    fn from(e: crate::error::Error) -> Outcome {
        Outcome::Error(e.object())
    }
}

/// A result's JSON text as the server wrote it: valid JSON, and UTF-8. A large one shares
/// the buffer of the message it came in ([`Kind::parse_shared`]), so it is not copied on
/// its way to the client; a clone costs a reference count.
#[derive(Clone)]
pub struct Raw(bytes::Bytes);

impl Raw {
    pub fn get(&self) -> &str {
        // SAFETY: a Raw is only made from a `Box<RawValue>` (a str) or from a sub-slice of
        // a `&str` view of its buffer (`slice_of`), so its bytes are always UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    /// The bytes, shared.
    pub fn bytes(&self) -> bytes::Bytes {
        self.0.clone()
    }

    /// `part` of `whole`, where `whole` is `buf` read as UTF-8: shared if `part` lies
    /// in it, else copied.
    fn slice_of(buf: &bytes::Bytes, whole: &str, part: &str) -> Raw {
        let start = (part.as_ptr() as usize).wrapping_sub(whole.as_ptr() as usize);
        let inside = whole.as_ptr() == buf.as_ptr()
            && whole.len() == buf.len()
            && start <= whole.len()
            && part.len() <= whole.len() - start;
        if inside {
            Raw(buf.slice(start..start + part.len()))
        } else {
            Raw(bytes::Bytes::copy_from_slice(part.as_bytes()))
        }
    }
}

impl From<Box<RawValue>> for Raw {
    fn from(r: Box<RawValue>) -> Raw {
        let text: Box<str> = r.into();
        Raw(bytes::Bytes::from(String::from(text)))
    }
}

impl From<&RawValue> for Raw {
    fn from(r: &RawValue) -> Raw {
        Raw(bytes::Bytes::copy_from_slice(r.get().as_bytes()))
    }
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

/// Why a message could not be read. The first maps to -32700, the second to -32600.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("parse error: {0}")]
    Json(String),
    #[error("invalid request: {0}")]
    Shape(String),
    /// A request over one of the input limits whose id could be read: an invalid request
    /// (-32600) that can be answered under its own id.
    #[error("invalid request: {why}")]
    Refused { id: Id, why: String },
}

impl ParseError {
    pub fn code(&self) -> i64 {
        match self {
            ParseError::Json(_) => code::PARSE_ERROR,
            ParseError::Shape(_) | ParseError::Refused { .. } => code::INVALID_REQUEST,
        }
    }

    /// The id of the request refused, when it could be read.
    pub fn id(&self) -> Option<&Id> {
        match self {
            ParseError::Refused { id, .. } => Some(id),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<String>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Distinguishes `"id": null` (Some(null)) from an absent id (None).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Whether `json` (valid JSON text) nests arrays and objects more than `max` levels deep.
/// One pass, no allocation: brackets are counted outside strings, and each string is
/// skipped with SIMD `memchr` to its closing quote (a quote is escaped when an odd run of
/// backslashes precedes it), so a large string costs about a memory read.
pub fn nested_deeper_than(json: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = json.get(i) {
        match b {
            b'"' => {
                // To the closing quote: the next quote not escaped.
                let start = i + 1;
                let mut from = start;
                loop {
                    let Some(q) = json.get(from..).and_then(|rest| memchr::memchr(b'"', rest)) else {
                        return false;
                    };
                    let q = from + q;
                    let backslashes = json[start..q].iter().rev().take_while(|&&c| c == b'\\').count();
                    from = q + 1;
                    if backslashes % 2 == 0 {
                        break;
                    }
                }
                i = from;
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

impl Kind {
    /// Parses one JSON-RPC message (not a batch).
    pub fn parse(bytes: &[u8]) -> Result<Kind, ParseError> {
        Kind::parse_with(bytes, None)
    }

    /// [`Kind::parse`] of a message in a shared buffer: a large result is a slice of it,
    /// not a copy. (A small one is copied, so it does not keep the buffer alive.)
    pub fn parse_shared(buf: &bytes::Bytes) -> Result<Kind, ParseError> {
        Kind::parse_with(buf, Some(buf))
    }

    fn parse_with(bytes: &[u8], shared: Option<&bytes::Bytes>) -> Result<Kind, ParseError> {
        // UTF-8 checked once over the whole message: parsing from a `&str` then borrows
        // each string and raw value without checking its bytes again (from a `&[u8]`,
        // serde_json re-validates every one of them).
        let text =
            std::str::from_utf8(bytes).map_err(|e| ParseError::Json(format!("the message is not UTF-8: {e}")))?;
        let wire: Wire = match serde_json::from_str(text) {
            Ok(w) => w,
            Err(e) => {
                // Valid JSON of the wrong shape (an array, a number, a field of the wrong
                // type) is an invalid request, not a parse error.
                return Err(match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    Ok(_) => ParseError::Shape(e.to_string()),
                    Err(_) => ParseError::Json(e.to_string()),
                });
            }
        };
        match wire.jsonrpc.map(RawValue::get) {
            Some("\"2.0\"") => {}
            _ => return Err(ParseError::Shape("\"jsonrpc\" must be \"2.0\"".into())),
        }
        let owned = |r: Option<&RawValue>| r.map(RawValue::to_owned);
        if let Some(method) = wire.method {
            if wire.result.is_some() || wire.error.is_some() {
                return Err(ParseError::Shape("a request cannot carry a result or error".into()));
            }
            if let Some(p) = wire.params {
                if !matches!(p.get().as_bytes().first(), Some(b'{') | Some(b'[')) {
                    return Err(ParseError::Shape("\"params\" must be an object".into()));
                }
            }
            let id = match wire.id {
                None => None,
                Some(id) if matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9')) => {
                    Some(checked_id(id)?)
                }
                Some(_) => return Err(ParseError::Shape("\"id\" must be a string or a number".into())),
            };
            // Over a limit, a request with a readable id is refused under it.
            let refuse = |why: String| match &id {
                Some(id) => ParseError::Refused { id: id.clone(), why },
                None => ParseError::Shape(why),
            };
            if method.len() > MAX_METHOD_LEN {
                return Err(refuse(format!(
                    "\"method\" is {} bytes, longer than the {MAX_METHOD_LEN} allowed",
                    method.len()
                )));
            }
            if nested_deeper_than(bytes, MAX_DEPTH) {
                return Err(refuse(format!(
                    "the message nests arrays and objects more than {MAX_DEPTH} levels deep"
                )));
            }
            return Ok(match id {
                None => Kind::Notification {
                    method,
                    params: owned(wire.params),
                },
                Some(id) => Kind::Request {
                    id,
                    method,
                    params: owned(wire.params),
                },
            });
        }
        let outcome = match (wire.result, wire.error) {
            (Some(r), None) => Outcome::Result(match shared {
                Some(buf) if r.get().len() >= LARGE_RESULT => Raw::slice_of(buf, text, r.get()),
                _ => Raw::from(r),
            }),
            (None, Some(e)) => Outcome::Error(e.to_owned()),
            _ => {
                return Err(ParseError::Shape(
                    "a message needs a \"method\", or exactly one of \"result\" and \"error\"".into(),
                ))
            }
        };
        let id = wire.id.map(checked_id).transpose()?;
        Ok(Kind::Response { id, outcome })
    }

    pub fn method(&self) -> Option<&str> {
        match self {
            Kind::Request { method, .. } | Kind::Notification { method, .. } => Some(method),
            Kind::Response { .. } => None,
        }
    }
}

/// An id as the peer wrote it, if it is not longer than [`MAX_ID_LEN`].
fn checked_id(id: &RawValue) -> Result<Id, ParseError> {
    let text = id.get();
    if text.len() > MAX_ID_LEN {
        return Err(ParseError::Shape(format!(
            "\"id\" is {} bytes of JSON, longer than the {MAX_ID_LEN} allowed",
            text.len()
        )));
    }
    Ok(Id::from_json(text))
}

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
    let mut out = Vec::with_capacity(64 + method.len() + params.map_or(0, |p| p.get().len()));
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.extend_from_slice(b"\"id\":");
        out.extend_from_slice(id.get().as_bytes());
        out.push(b',');
    }
    out.extend_from_slice(b"\"method\":");
    write_str(&mut out, method);
    if let Some(p) = params {
        out.extend_from_slice(b",\"params\":");
        out.extend_from_slice(p.get().as_bytes());
    }
    out.push(b'}');
    out
}

/// Writes a request line with a numeric id and params given as an object map,
/// serialized straight into the line (the same bytes as [`request`] with
/// `to_raw(&Value::Object(params))`, without the intermediate string).
pub fn request_with_object(id: u64, method: &str, params: &Map<String, Value>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + method.len() + 16 * params.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    let _ = write!(VecWriter(&mut out), "{id}");
    out.extend_from_slice(b",\"method\":");
    write_str(&mut out, method);
    out.extend_from_slice(b",\"params\":");
    // Writing a map of Values into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, params);
    out.push(b'}');
    out
}

/// `fmt::Write` over a byte buffer, for integers.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Writes a JSON string.
fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes a response with the given id (which may be `null`) and outcome.
pub fn response(id: &Id, outcome: &Outcome) -> Vec<u8> {
    let (key, body) = match outcome {
        Outcome::Result(r) => ("result", r.get()),
        Outcome::Error(e) => ("error", e.get()),
    };
    let mut out = response_head(id, key, body.len() + 1);
    out.extend_from_slice(body.as_bytes());
    out.push(b'}');
    out
}

/// `{"jsonrpc":"2.0","id":<id>,"<key>":`, with room for `more` bytes after it.
fn response_head(id: &Id, key: &str, more: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + more);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    out
}

/// From this size on, a result is not copied into its response: [`Answer::Parts`].
pub const LARGE_RESULT: usize = 64 * 1024;

/// A response ready to send. A large result goes out in parts: the head
/// (`{"jsonrpc":"2.0","id":…,"result":`), the result's own bytes (moved, not copied),
/// then `}`.
pub enum Answer {
    Whole(Vec<u8>),
    /// The head and the result; `}` follows.
    Parts(Vec<u8>, bytes::Bytes),
}

impl Answer {
    pub fn new(id: &Id, outcome: Outcome) -> Answer {
        match outcome {
            Outcome::Result(r) if r.get().len() >= LARGE_RESULT => {
                Answer::Parts(response_head(id, "result", 0), r.bytes())
            }
            o => Answer::Whole(response(id, &o)),
        }
    }

    /// The whole response in one buffer (a copy, for a large result).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Answer::Whole(v) => v,
            Answer::Parts(mut head, body) => {
                head.reserve_exact(body.len() + 1);
                head.extend_from_slice(&body);
                head.push(b'}');
                head
            }
        }
    }
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

/// A JSON object opened one level deep, for the few edits forwarding makes to
/// `tools/call` and `prompts/get` params (rename `name`, drop `task`, move
/// `_meta.progressToken`). Each member's value stays raw JSON text inside the client's own
/// params (no copy, no tree, no hashing); only `_meta`, when something reads or edits it,
/// is opened into a map. Written back, members keep their order and their values every
/// byte (number formatting, escapes, key order inside); the whitespace between top-level
/// members is dropped, and a key spelled with escapes is written decoded. A repeated key
/// keeps its first position and its last value, as a `serde_json::Map` did.
pub struct Members {
    /// The client's params, which the spans below index.
    text: Box<RawValue>,
    entries: Vec<(MemberKey, MemberValue)>,
}

enum MemberKey {
    /// The key with its quotes, in `text`; it had no escapes.
    Span(std::ops::Range<usize>),
    Owned(String),
}

enum MemberValue {
    Span(std::ops::Range<usize>),
    Raw(Box<RawValue>),
    /// JSON text the gateway wrote itself (a serialized string), so valid as it is.
    Written(String),
    Object(Map<String, Value>),
}

/// A JSON string, borrowed from the input when it has no escapes.
struct JsonStr<'a>(std::borrow::Cow<'a, str>);

impl<'de> Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(JsonStr(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Where `inner` lies in `outer`, when it is a slice of it.
fn span_in(outer: &str, inner: &str) -> Option<std::ops::Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

impl Members {
    /// Opens params (absent params read as an empty object).
    pub fn parse(params: Option<Box<RawValue>>) -> Result<Members, String> {
        use serde::de::{MapAccess, Visitor};
        let text = params.unwrap_or_else(empty_object);
        type Entries = Vec<(MemberKey, MemberValue)>;
        struct Top<'a>(&'a str);
        impl<'de> Visitor<'de> for Top<'de> {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("params must be an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out: Entries = Vec::with_capacity(4);
                while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    let value = match span_in(self.0, value.get()) {
                        Some(r) => MemberValue::Span(r),
                        None => MemberValue::Raw(value.to_owned()),
                    };
                    let key = match &key {
                        std::borrow::Cow::Borrowed(k) => span_in(self.0, k)
                            .filter(|r| r.start > 0 && r.end < self.0.len())
                            .map(|r| MemberKey::Span(r.start - 1..r.end + 1)),
                        std::borrow::Cow::Owned(_) => None,
                    }
                    .unwrap_or_else(|| MemberKey::Owned(key.into_owned()));
                    out.push((key, value));
                }
                Ok(out)
            }
        }
        let raw = text.get();
        let mut de = serde_json::Deserializer::from_str(raw);
        let mut entries = serde::Deserializer::deserialize_map(&mut de, Top(raw)).map_err(|e| {
            if raw.trim_start().starts_with('{') {
                e.to_string()
            } else {
                "params must be an object".to_owned()
            }
        })?;
        de.end().map_err(|e| e.to_string())?;
        let mut members = Members {
            text,
            entries: Vec::new(),
        };
        if has_repeats(&members, &entries) {
            // First position, last value.
            for (k, v) in entries.drain(..) {
                match members.position(members.key_of(&k)) {
                    Some(i) => members.entries[i].1 = v,
                    None => members.entries.push((k, v)),
                }
            }
        } else {
            members.entries = entries;
        }
        Ok(members)
    }

    fn key_of<'a>(&'a self, k: &'a MemberKey) -> &'a str {
        match k {
            MemberKey::Span(r) => self.text.get().get(r.start + 1..r.end - 1).unwrap_or(""),
            MemberKey::Owned(s) => s,
        }
    }

    fn position(&self, key: &str) -> Option<usize> {
        self.entries.iter().position(|(k, _)| self.key_of(k) == key)
    }

    /// A member's raw JSON text (an opened `_meta` is not raw: `None`).
    pub fn get_raw(&self, key: &str) -> Option<&str> {
        let (_, v) = &self.entries[self.position(key)?];
        match v {
            MemberValue::Span(r) => self.text.get().get(r.clone()),
            MemberValue::Raw(b) => Some(b.get()),
            MemberValue::Written(t) => Some(t),
            MemberValue::Object(_) => None,
        }
    }

    /// A member that is a string.
    pub fn get_str(&self, key: &str) -> Option<std::borrow::Cow<'_, str>> {
        let raw = self.get_raw(key)?;
        // The usual case, a string without escapes, is its own text between the quotes
        // (the text is parsed JSON, so a quote inside would have been escaped).
        if let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            if !inner.contains(['\\', '"']) {
                return Some(std::borrow::Cow::Borrowed(inner));
            }
        }
        serde_json::from_str::<JsonStr>(raw).ok().map(|s| s.0)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Sets a member to a string, in place if it exists, else at the end.
    pub fn insert_str(&mut self, key: &str, value: &str) {
        let mut out = Vec::with_capacity(value.len() + 2);
        write_str(&mut out, value);
        // A serialized str is valid JSON, and UTF-8; no need to parse it again.
        let text = String::from_utf8(out).unwrap_or_else(|_| "\"\"".to_owned());
        self.set(key, MemberValue::Written(text));
    }

    fn set(&mut self, key: &str, value: MemberValue) {
        match self.position(key) {
            Some(i) => self.entries[i].1 = value,
            None => self.entries.push((MemberKey::Owned(key.to_owned()), value)),
        }
    }

    /// Removes a member; whether it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        match self.position(key) {
            Some(i) => {
                self.entries.remove(i);
                true
            }
            None => false,
        }
    }

    /// `_meta` as an object, opened on first use; `None` if absent or not an object.
    pub fn meta(&mut self) -> Option<&mut Map<String, Value>> {
        let i = self.position("_meta")?;
        if !matches!(self.entries[i].1, MemberValue::Object(_)) {
            let opened = match serde_json::from_str::<Value>(self.get_raw("_meta")?) {
                Ok(Value::Object(m)) => m,
                _ => return None,
            };
            self.entries[i].1 = MemberValue::Object(opened);
        }
        match &mut self.entries[i].1 {
            MemberValue::Object(m) => Some(m),
            _ => None,
        }
    }

    /// Removes `_meta.progressToken` and returns it as the client wrote it (its own
    /// text, read from `_meta` before `_meta` is opened into a map).
    pub fn take_progress(&mut self) -> Option<Id> {
        let raw = self.get_raw("_meta").and_then(progress_token_in);
        let value = self.meta()?.remove("progressToken")?;
        Some(raw.unwrap_or_else(|| Id::from_value(&value)))
    }

    /// Sets a member to an object ([`Members`] written out).
    pub fn insert_members(&mut self, key: &str, value: &Members) {
        let mut out = Vec::with_capacity(value.len_hint());
        value.write_to(&mut out);
        // Members write JSON, and UTF-8 (their text came from str).
        let text = String::from_utf8(out).unwrap_or_else(|_| "{}".to_owned());
        self.set(key, MemberValue::Written(text));
    }

    /// Sets a member to a value.
    pub fn insert_value(&mut self, key: &str, value: &Value) {
        self.set(key, MemberValue::Written(value.to_string()));
    }

    /// Sets a member to an id's (or token's) own JSON text.
    pub fn insert_id(&mut self, key: &str, id: &Id) {
        self.set(key, MemberValue::Written(id.get().to_owned()));
    }

    /// `_meta`, added empty at the end if absent; `None` if present but not an object.
    pub fn meta_or_insert(&mut self) -> Option<&mut Map<String, Value>> {
        if !self.contains_key("_meta") {
            self.entries
                .push((MemberKey::Owned("_meta".to_owned()), MemberValue::Object(Map::new())));
        }
        self.meta()
    }

    /// Writes the object.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let text = self.text.get();
        out.push(b'{');
        for (i, (k, v)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match k {
                MemberKey::Span(r) => out.extend_from_slice(text.get(r.clone()).unwrap_or("\"\"").as_bytes()),
                MemberKey::Owned(s) => write_str(out, s),
            }
            out.push(b':');
            match v {
                MemberValue::Span(r) => out.extend_from_slice(text.get(r.clone()).unwrap_or("null").as_bytes()),
                MemberValue::Raw(b) => out.extend_from_slice(b.get().as_bytes()),
                MemberValue::Written(t) => out.extend_from_slice(t.as_bytes()),
                // Writing a map of Values into a Vec cannot fail.
                MemberValue::Object(m) => {
                    let _ = serde_json::to_writer(&mut *out, m);
                }
            }
        }
        out.push(b'}');
    }

    /// The whole object as a `serde_json` map (every value parsed), for code that needs
    /// to read or edit more than `name`, `task` and `_meta`. A member whose text does not
    /// parse (it always does: it came from parsed JSON) is left out.
    pub fn into_map(self) -> Map<String, Value> {
        let mut out = Map::with_capacity(self.entries.len());
        for (k, v) in &self.entries {
            let value = match v {
                MemberValue::Span(r) => self
                    .text
                    .get()
                    .get(r.clone())
                    .and_then(|t| serde_json::from_str(t).ok()),
                MemberValue::Raw(b) => serde_json::from_str(b.get()).ok(),
                MemberValue::Written(t) => serde_json::from_str(t).ok(),
                MemberValue::Object(m) => Some(Value::Object(m.clone())),
            };
            if let Some(value) = value {
                out.insert(self.key_of(k).to_owned(), value);
            }
        }
        out
    }

    /// An empty object, to fill.
    pub fn new() -> Members {
        Members {
            text: empty_object(),
            entries: Vec::new(),
        }
    }

    /// The object as one raw JSON value.
    pub fn into_raw(self) -> Box<RawValue> {
        let mut out = Vec::with_capacity(self.len_hint());
        self.write_to(&mut out);
        String::from_utf8(out)
            .ok()
            .and_then(|t| RawValue::from_string(t).ok())
            .unwrap_or_else(empty_object)
    }

    /// About how many bytes [`Members::write_to`] writes.
    pub fn len_hint(&self) -> usize {
        self.text.get().len() + 16
    }
}

/// Whether some key occurs twice (linear for the usual handful, hashed beyond).
fn has_repeats(m: &Members, entries: &[(MemberKey, MemberValue)]) -> bool {
    if entries.len() <= 16 {
        return entries
            .iter()
            .enumerate()
            .any(|(i, (k, _))| entries[..i].iter().any(|(j, _)| m.key_of(j) == m.key_of(k)));
    }
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    !entries.iter().all(|(k, _)| seen.insert(m.key_of(k)))
}

impl Default for Members {
    fn default() -> Members {
        Members::new()
    }
}

/// `progressToken` of a `_meta` object's JSON text, as its own text.
fn progress_token_in(meta: &str) -> Option<Id> {
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default, rename = "progressToken", deserialize_with = "present")]
        token: Option<&'a RawValue>,
    }
    // A `_meta` without the key spelled out gives none here (the opened map still finds
    // one written with escapes).
    memchr::memmem::find(meta.as_bytes(), b"progressToken")?;
    let m: Meta = serde_json::from_str(meta).ok()?;
    m.token.map(|t| Id::from_json(t.get()))
}

/// `_meta.progressToken` of params, as the client wrote it, for code that then opens the
/// params into a map (where a number would take serde_json's formatting). Params that do
/// not spell the key out (no `progressToken` in the text, so none, or a key written with
/// escapes) give `None`.
pub fn progress_token_of(params: Option<&RawValue>) -> Option<Id> {
    #[derive(Deserialize)]
    struct P<'a> {
        #[serde(borrow, default, rename = "_meta")]
        meta: Option<&'a RawValue>,
    }
    let text = params?.get();
    // Most params carry no token: no parse for them.
    memchr::memmem::find(text.as_bytes(), b"progressToken")?;
    let p: P = serde_json::from_str(text).ok()?;
    progress_token_in(p.meta?.get())
}

/// The `requestId` of `notifications/cancelled` params, as the peer wrote it.
pub fn cancelled_request_id(params: Option<&RawValue>) -> Option<Id> {
    #[derive(Deserialize)]
    struct Cancelled<'a> {
        #[serde(borrow, default, rename = "requestId", deserialize_with = "present")]
        id: Option<&'a RawValue>,
    }
    let c: Cancelled = serde_json::from_str(params?.get()).ok()?;
    c.id.map(|t| Id::from_json(t.get()))
}

/// Writes a notification line with opened params ([`Members`]).
pub fn notification_with_members(method: &str, params: &Members) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + method.len() + params.len_hint());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    write_str(&mut out, method);
    out.extend_from_slice(b",\"params\":");
    params.write_to(&mut out);
    out.push(b'}');
    out
}

/// Writes a request line with a numeric id and opened params ([`Members`]).
pub fn request_with_members(id: u64, method: &str, params: &Members) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + method.len() + params.len_hint());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    let _ = write!(VecWriter(&mut out), "{id}");
    out.extend_from_slice(b",\"method\":");
    write_str(&mut out, method);
    out.extend_from_slice(b",\"params\":");
    params.write_to(&mut out);
    out.push(b'}');
    out
}

/// Whether a tool result says `"isError": true` at its top level (for metrics and traces).
///
/// Most results carry no `isError` at all, so the bytes are searched first (SIMD
/// `memchr` for `E` and `\\`, no parse): without the text `isError` and without any `\u` escape (the only
/// other way to spell a key's letters) the key cannot be there. Otherwise the top-level
/// object is parsed with every value but `isError` skipped unread (`IgnoredAny`, no
/// allocation), so an `isError` nested in content, or inside a string, does not count.
/// Anything that is not an object, or whose `isError` is not a boolean, is not an error.
pub fn is_tool_error(result: &str) -> bool {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    let bytes = result.as_bytes();
    let named =
        memchr::memchr_iter(b'E', bytes).any(|i| bytes[..i].ends_with(b"is") && bytes[i..].starts_with(b"Error"));
    let escaped = || memchr::memchr_iter(b'\\', bytes).any(|i| bytes.get(i + 1) == Some(&b'u'));
    if !named && !escaped() {
        return false;
    }
    struct Top;
    impl<'de> Visitor<'de> for Top {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a tool result object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut is_error = false;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "isError" {
                    // A non-boolean isError makes the whole parse fail: not an error.
                    is_error = map.next_value::<bool>()?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(is_error)
        }
    }
    let mut de = serde_json::Deserializer::from_str(result);
    serde::Deserializer::deserialize_map(&mut de, Top).unwrap_or(false)
}

/// The `code` and `message` of an error object, for logs and metrics.
pub fn error_summary(err: &RawValue) -> (i64, String) {
    #[derive(Deserialize)]
    struct E {
        #[serde(default)]
        code: i64,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<E>(err.get()) {
        Ok(e) => (e.code, e.message),
        Err(_) => (0, String::new()),
    }
}

/// A short, stable hex hash (FNV-1a, 64 bit), used to shorten names deterministically.
pub fn short_hash(parts: &[&str], hex_len: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A separator byte that never occurs in UTF-8, so ("ab","c") != ("a","bc").
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut s = String::with_capacity(16);
    let _ = write!(s, "{h:016x}");
    s.truncate(hex_len);
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_large_result_goes_from_the_servers_line_to_the_answer_uncopied() {
        let text = "y".repeat(LARGE_RESULT);
        let line = bytes::Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"text":"{text}"}}}}"#));
        let Kind::Response { outcome, .. } = Kind::parse_shared(&line).unwrap() else {
            panic!("not a response")
        };
        let Answer::Parts(head, body) = Answer::new(&Id::string("c"), outcome) else {
            panic!("a large result was framed whole")
        };
        let inside = line.as_ptr() as usize..line.as_ptr() as usize + line.len();
        assert!(inside.contains(&(body.as_ptr() as usize)), "the result was copied");
        let v: Value = serde_json::from_slice(&Answer::Parts(head, body).into_vec()).unwrap();
        assert_eq!(v["id"], "c");
        assert_eq!(v["result"]["text"].as_str(), Some(text.as_str()));
        // A small result is copied, so it does not keep a large buffer alive.
        let small = bytes::Bytes::from_static(br#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#);
        let Ok(Kind::Response {
            outcome: Outcome::Result(r),
            ..
        }) = Kind::parse_shared(&small)
        else {
            panic!("not a result")
        };
        assert_eq!(r.get(), r#"{"a":1}"#);
        assert!(
            !(small.as_ptr() as usize..small.as_ptr() as usize + small.len()).contains(&(r.get().as_ptr() as usize))
        );
    }

    #[test]
    fn a_large_result_is_answered_without_a_copy() {
        let big = format!("{{\"text\":\"{}\"}}", "x".repeat(LARGE_RESULT));
        let raw = RawValue::from_string(big.clone()).unwrap();
        let at = raw.get().as_ptr();
        match Answer::new(&Id::from(7), Outcome::Result(raw.into())) {
            Answer::Parts(head, body) => {
                assert_eq!(head, br#"{"jsonrpc":"2.0","id":7,"result":"#);
                assert_eq!(body.as_ptr(), at, "the result's bytes were copied");
                let whole = Answer::Parts(head, body).into_vec();
                let v: Value = serde_json::from_slice(&whole).unwrap();
                assert_eq!(v["result"]["text"].as_str().map(str::len), Some(LARGE_RESULT));
            }
            Answer::Whole(_) => panic!("a large result was framed whole"),
        }
        let small = Answer::new(&Id::string("a"), Outcome::Result(empty_object().into())).into_vec();
        assert_eq!(small, br#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
    }

    use super::*;

    #[test]
    fn ids_keep_their_type() {
        let Kind::Request { id, .. } = Kind::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#).unwrap() else {
            panic!()
        };
        let Kind::Request { id: sid, .. } = Kind::parse(br#"{"jsonrpc":"2.0","id":"1","method":"x"}"#).unwrap() else {
            panic!()
        };
        assert_ne!(id_key(&id), id_key(&sid));
        assert_eq!(
            String::from_utf8(response(&sid, &Outcome::Result(empty_object().into()))).unwrap(),
            r#"{"jsonrpc":"2.0","id":"1","result":{}}"#
        );
    }

    #[test]
    fn errors_classify() {
        assert_eq!(Kind::parse(b"{nope").unwrap_err().code(), code::PARSE_ERROR);
        assert_eq!(Kind::parse(b"[1,2]").unwrap_err().code(), code::INVALID_REQUEST);
        assert_eq!(
            Kind::parse(br#"{"id":1,"method":"x"}"#).unwrap_err().code(),
            code::INVALID_REQUEST
        );
        assert_eq!(
            Kind::parse(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#)
                .unwrap_err()
                .code(),
            code::INVALID_REQUEST
        );
        assert_eq!(
            Kind::parse(br#"{"jsonrpc":"2.0","method":5}"#).unwrap_err().code(),
            code::INVALID_REQUEST
        );
    }

    #[test]
    fn responses_without_or_with_null_id() {
        match Kind::parse(br#"{"jsonrpc":"2.0","result":{}}"#).unwrap() {
            Kind::Response { id: None, .. } => {}
            other => panic!("{other:?}"),
        }
        match Kind::parse(br#"{"jsonrpc":"2.0","id":null,"error":{"code":1,"message":"m"}}"#).unwrap() {
            Kind::Response { id: Some(id), .. } if id.is_null() => {}
            other => panic!("{other:?}"),
        }
    }

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
    fn tool_errors_are_top_level_booleans() {
        let yes = |s: &str| is_tool_error(s);
        assert!(yes(r#"{"content":[],"isError":true}"#));
        assert!(yes(r#"{"isError":true,"content":[{"type":"text","text":"x"}]}"#));
        assert!(yes(r#"{"content":[], "\u0069sError" : true}"#));
        assert!(!yes(r#"{"content":[],"isError":false}"#));
        assert!(!yes(r#"{"content":[]}"#));
        assert!(!yes(r#"{"content":[{"type":"text","text":"\"isError\":true"}]}"#));
        assert!(!yes(
            r#"{"content":[{"isError":true}],"structuredContent":{"isError":true}}"#
        ));
        assert!(!yes(r#"{"content":[],"isError":"true"}"#));
        assert!(!yes(r#"{"content":[],"isError":1}"#));
        assert!(!yes(r#"[{"isError":true}]"#));
        assert!(!yes(r#""isError""#));
        assert!(!yes(r#"{"text":"caf\u00e9"}"#));
    }

    fn members(s: &str) -> Members {
        Members::parse(Some(RawValue::from_string(s.to_owned()).unwrap())).unwrap()
    }

    fn written(m: &Members) -> String {
        let mut out = Vec::new();
        m.write_to(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn members_keep_values_byte_for_byte() {
        let text = r#"{ "name" : "s__e\"cho", "arguments":{"z":1.50,"a":[2e3,-0,1e400],"t":"caf\u00e9"},
            "x\u0079":true, "_meta":{"progressToken":7,"k":"v"} }"#;
        let mut m = members(text);
        assert_eq!(m.get_str("name").as_deref(), Some("s__e\"cho"));
        assert!(m.contains_key("xy"));
        assert!(!m.contains_key("task"));
        m.insert_str("name", "e\"cho");
        let token = m.meta().and_then(|meta| meta.remove("progressToken"));
        assert_eq!(token, Some(Value::from(7)));
        assert_eq!(
            written(&m),
            r#"{"name":"e\"cho","arguments":{"z":1.50,"a":[2e3,-0,1e400],"t":"caf\u00e9"},"xy":true,"_meta":{"k":"v"}}"#
        );
        // Untouched, it is the same object, minus top-level whitespace.
        assert_eq!(
            written(&members(r#"{"b":1,"a":{"c" : 2}}"#)),
            r#"{"b":1,"a":{"c" : 2}}"#
        );
        // A repeated key: first position, last value (as serde_json's Map).
        assert_eq!(written(&members(r#"{"a":1,"b":2,"a":3}"#)), r#"{"a":3,"b":2}"#);
        // _meta is added when asked for, and a non-object _meta is left alone.
        let mut m = members(r#"{"name":"n"}"#);
        m.meta_or_insert()
            .unwrap()
            .insert("progressToken".into(), Value::from(4));
        assert_eq!(written(&m), r#"{"name":"n","_meta":{"progressToken":4}}"#);
        let mut m = members(r#"{"_meta":5}"#);
        assert!(m.meta().is_none() && m.meta_or_insert().is_none());
        assert!(m.remove("_meta") && !m.remove("_meta"));
        assert_eq!(written(&m), "{}");
        assert_eq!(written(&Members::parse(None).unwrap()), "{}");
        // Not an object, or not JSON: an error, as params_object gives.
        for bad in ["[1]", "3", r#""s""#, "null", "true"] {
            let err = Members::parse(Some(RawValue::from_string(bad.to_owned()).unwrap())).err();
            assert_eq!(err.as_deref(), Some("params must be an object"), "{bad}");
        }
        // A name that is not a string is no name.
        assert_eq!(members(r#"{"name":5}"#).get_str("name"), None);
        // As a map: the same object, edits included, in order.
        let mut m = members(r#"{"name":"a","arguments":{"x":[1,2]},"_meta":{"progressToken":1,"k":2}}"#);
        m.insert_str("name", "b");
        m.meta().map(|meta| meta.remove("progressToken"));
        let map = m.into_map();
        assert_eq!(
            Value::Object(map.clone()),
            serde_json::json!({"name":"b","arguments":{"x":[1,2]},"_meta":{"k":2}})
        );
        assert_eq!(map.keys().collect::<Vec<_>>(), ["name", "arguments", "_meta"]);
    }

    #[test]
    fn request_with_members_matches_request_with_object() {
        let text = r#"{"name":"e\"cho","arguments":{"text":"hi \u00e9\n","n":[1.5,2e3]},"_meta":{"progressToken":7}}"#;
        let m = members(text);
        let map: Map<String, Value> = serde_json::from_str(text).unwrap();
        assert_eq!(
            String::from_utf8(request_with_members(9, "tools/call", &m)).unwrap(),
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":"#.to_owned() + text + "}"
        );
        // The same bytes as the map route where the map keeps them (no number reformatting here).
        let via_map = request_with_object(9, "tools/call", &map);
        let via_members = request_with_members(9, "tools/call", &m);
        assert_eq!(
            serde_json::from_slice::<Value>(&via_map).unwrap(),
            serde_json::from_slice::<Value>(&via_members).unwrap()
        );
    }

    #[test]
    fn raw_passthrough_keeps_bytes() {
        let line = br#"{"jsonrpc":"2.0","id":3,"result":{"z":1,"a":[1.50,2e3],"unknown":{"k":"v"}}}"#;
        let Kind::Response { outcome, .. } = Kind::parse(line).unwrap() else {
            panic!()
        };
        assert_eq!(response(&Id::from(3), &outcome), line.to_vec());
    }
}

#[cfg(test)]
mod hostile {
    use super::*;

    fn request_id(line: &str) -> Result<Id, ParseError> {
        match Kind::parse(line.as_bytes())? {
            Kind::Request { id, .. } => Ok(id),
            other => panic!("not a request: {other:?}"),
        }
    }

    #[test]
    fn ids_come_back_byte_for_byte() {
        for text in [
            "1e2",
            "-0",
            "1.50",
            "-9223372036854775809",
            "18446744073709551616",
            "123456789012345678901234567890.000",
            "0",
            r#""a\u0062""#,
            r#""mcp-gateway-a-long-string-id-of-more-than-22-bytes""#,
            r#""""#,
        ] {
            let id = request_id(&format!(r#"{{"jsonrpc":"2.0","id": {text} ,"method":"x"}}"#)).unwrap();
            assert_eq!(id.get(), text);
            assert_eq!(
                String::from_utf8(response(&id, &Outcome::Result(empty_object().into()))).unwrap(),
                format!(r#"{{"jsonrpc":"2.0","id":{text},"result":{{}}}}"#)
            );
            let Answer::Whole(line) = Answer::new(&id, Outcome::Error(error_object(1, "m", None))) else {
                panic!("a small answer in parts")
            };
            assert!(line.starts_with(format!(r#"{{"jsonrpc":"2.0","id":{text},"#).as_bytes()));
            assert_eq!(
                request(&id, "m", None),
                format!(r#"{{"jsonrpc":"2.0","id":{text},"method":"m"}}"#).as_bytes()
            );
            // A response from the client keeps it too.
            let Kind::Response { id: Some(back), .. } =
                Kind::parse(format!(r#"{{"jsonrpc":"2.0","id":{text},"result":{{}}}}"#).as_bytes()).unwrap()
            else {
                panic!("not a response")
            };
            assert_eq!(back.get(), text);
            assert_eq!(id_key(&back), id_key(&id));
        }
        // 1 and "1" stay different ids; a string's escapes do not make a different one.
        let (one, s_one) = (
            request_id(r#"{"jsonrpc":"2.0","id":1,"method":"x"}"#).unwrap(),
            Id::string("1"),
        );
        assert_ne!(id_key(&one), id_key(&s_one));
        assert_ne!(one, s_one);
        assert!(one.is_number() && !one.is_string() && s_one.is_string());
        assert_eq!(id_key(&Id::parse(r#""\u0031""#).unwrap()), id_key(&s_one));
        assert_eq!(Id::parse(r#""\u0031""#).unwrap().get(), r#""\u0031""#);
        assert_eq!(Id::parse(r#""a\"b""#).unwrap().as_str().as_deref(), Some("a\"b"));
        assert_eq!(Id::from(u64::MAX).get(), "18446744073709551615");
        assert_eq!(Id::from(0).get(), "0");
        assert_eq!(Id::from(42).as_u64(), Some(42));
        assert_eq!(Id::parse("1e2").unwrap().as_u64(), None);
        assert_eq!(Id::parse("-1").unwrap().as_u64(), None);
        assert!(Id::NULL.is_null() && Id::NULL.get() == "null");
        assert_eq!(Id::from_raw(&RawValue::from_string(" 7 ".into()).unwrap()).get(), "7");
        // Into a Value (json!), as what it says.
        assert_eq!(
            serde_json::json!({ "requestId": s_one }),
            serde_json::json!({"requestId": "1"})
        );
        assert_eq!(serde_json::to_string(&Id::parse("1.50").unwrap()).unwrap(), "1.50");
    }

    #[test]
    fn ids_of_the_wrong_type_or_too_long_are_refused() {
        for bad in ["null", "true", "{}", "[1]"] {
            let e = request_id(&format!(r#"{{"jsonrpc":"2.0","id":{bad},"method":"x"}}"#)).unwrap_err();
            assert_eq!(e.code(), code::INVALID_REQUEST, "{bad}");
        }
        let long = format!("\"{}\"", "i".repeat(MAX_ID_LEN - 2));
        assert_eq!(
            request_id(&format!(r#"{{"jsonrpc":"2.0","id":{long},"method":"x"}}"#))
                .unwrap()
                .get(),
            long
        );
        let longer = format!("\"{}\"", "i".repeat(MAX_ID_LEN - 1));
        let e = request_id(&format!(r#"{{"jsonrpc":"2.0","id":{longer},"method":"x"}}"#)).unwrap_err();
        assert_eq!(e.code(), code::INVALID_REQUEST);
        assert!(e.to_string().contains("\"id\" is 257 bytes"), "{e}");
        let digits = "9".repeat(MAX_ID_LEN + 1);
        assert!(Kind::parse(format!(r#"{{"jsonrpc":"2.0","id":{digits},"result":{{}}}}"#).as_bytes()).is_err());
    }

    #[test]
    fn method_names_are_bounded() {
        let ok = "m".repeat(MAX_METHOD_LEN);
        assert!(Kind::parse(format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{ok}"}}"#).as_bytes()).is_ok());
        for line in [
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{ok}m"}}"#),
            format!(r#"{{"jsonrpc":"2.0","method":"{ok}m"}}"#),
        ] {
            let e = Kind::parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.code(), code::INVALID_REQUEST);
            assert!(e.to_string().contains("\"method\" is 257 bytes"), "{e}");
            assert_eq!(e.id().is_some(), line.contains("\"id\":1"));
        }
    }

    fn nested(levels: usize) -> String {
        // The envelope and params are two levels; arrays inside params the others.
        let arrays = levels - 2;
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{}{}}}}}"#,
            "[".repeat(arrays),
            "]".repeat(arrays)
        )
    }

    #[test]
    fn nesting_is_bounded_once_per_message() {
        assert!(Kind::parse(nested(MAX_DEPTH).as_bytes()).is_ok());
        let e = Kind::parse(nested(MAX_DEPTH + 1).as_bytes()).unwrap_err();
        assert_eq!(e.code(), code::INVALID_REQUEST);
        assert_eq!(e.id().map(Id::get), Some("1"), "refused under its id");
        assert!(e.to_string().contains("64 levels"), "{e}");
        // Far deeper: refused, not a stack overflow.
        let deep = format!(
            r#"{{"jsonrpc":"2.0","method":"x","params":{{"a":{}{}}}}}"#,
            "[".repeat(1_000_000),
            "]".repeat(1_000_000)
        );
        assert_eq!(Kind::parse(deep.as_bytes()).unwrap_err().code(), code::INVALID_REQUEST);
        // Brackets in strings do not count, escaped quotes do not end them.
        let strings = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"s":"{}\"{}\\","t":"\\\"[["}}}}"#,
            "[{".repeat(1000),
            "{".repeat(1000)
        );
        assert!(Kind::parse(strings.as_bytes()).is_ok());
        assert!(!nested_deeper_than(br#"{"a":"[[[[","b":[[]]}"#, 3));
        assert!(nested_deeper_than(br#"{"a":"\\","b":[[[]]]}"#, 3));
        assert!(!nested_deeper_than(br#""unterminated \"#, 0));
        // A response is not scanned: a deep result goes through as the server wrote it.
        let result = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"a":{}{}}}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert!(Kind::parse(result.as_bytes()).is_ok());
    }

    #[test]
    fn a_20_mb_argument_string_passes_and_the_scan_costs_little() {
        // Plain text, and (the scan's worst case) an escaped quote every 5 bytes.
        for text in ["xxx[{".repeat(4 * 1024 * 1024), "x\\\"[{".repeat(4 * 1024 * 1024)] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"e","arguments":{{"text":"{text}"}}}}}}"#
            );
            assert!(line.len() > 20_000_000);
            let t = std::time::Instant::now();
            assert!(!nested_deeper_than(line.as_bytes(), MAX_DEPTH));
            let scan = t.elapsed();
            let t = std::time::Instant::now();
            let Kind::Request { params: Some(p), .. } = Kind::parse(line.as_bytes()).unwrap() else {
                panic!("not a request with params")
            };
            let parse = t.elapsed();
            assert_eq!(
                p.get().len(),
                line.len() - r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":}"#.len()
            );
            eprintln!("20 MB request: depth scan {scan:?}, whole parse (scan included) {parse:?}");
        }
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

    #[test]
    fn progress_tokens_and_cancelled_ids_keep_their_text() {
        let mut m = Members::parse(Some(
            RawValue::from_string(r#"{"name":"n","_meta":{"progressToken":1e2,"k":1}}"#.to_owned()).unwrap(),
        ))
        .unwrap();
        assert_eq!(m.take_progress().map(|t| t.get().to_owned()).as_deref(), Some("1e2"));
        assert_eq!(m.take_progress(), None);
        let mut out = Vec::new();
        m.write_to(&mut out);
        assert_eq!(out, br#"{"name":"n","_meta":{"k":1}}"#);
        // A token written with escapes in its key is still found (from the opened map).
        let mut m = Members::parse(Some(
            RawValue::from_string(r#"{"_meta":{"progress\u0054oken":"t"}}"#.to_owned()).unwrap(),
        ))
        .unwrap();
        assert_eq!(m.take_progress().map(|t| t.get().to_owned()).as_deref(), Some(r#""t""#));
        let raw = RawValue::from_string(r#"{"requestId": -0 ,"reason":"r"}"#.to_owned()).unwrap();
        assert_eq!(cancelled_request_id(Some(&raw)).unwrap().get(), "-0");
        assert!(cancelled_request_id(Some(&RawValue::from_string("{}".into()).unwrap())).is_none());
        assert!(cancelled_request_id(None).is_none());
        let params = RawValue::from_string(r#"{"uri":"a://b","_meta":{"k":[1],"progressToken":1.50}}"#.into()).unwrap();
        assert_eq!(progress_token_of(Some(&params)).unwrap().get(), "1.50");
        let params = RawValue::from_string(r#"{"uri":"progressToken","_meta":{}}"#.into()).unwrap();
        assert!(progress_token_of(Some(&params)).is_none());
        assert!(progress_token_of(None).is_none());
        let mut meta = Members::new();
        meta.insert_id("sub", &Id::parse("1e2").unwrap());
        let mut top = Members::default();
        top.insert_members("_meta", &meta);
        assert_eq!(top.into_raw().get(), r#"{"_meta":{"sub":1e2}}"#);
    }
}
