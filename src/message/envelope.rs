//! The envelope: one message parsed into a [`Kind`] (`id` and `method` read, the rest
//! left raw), and the input limits checked on the way.

use super::answer::{Outcome, Raw, LARGE_RESULT};
use super::code;
use super::id::Id;
use super::members::{self, Incoming, Members, OpenSeed, Substituted};
use super::peek::JsonStr;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The longest id accepted, in bytes of its JSON text (quotes and escapes included).
/// A longer one makes the message an invalid request (-32600).
pub const MAX_ID_LEN: usize = 256;

/// The longest method name accepted, in bytes. A longer one makes the message an invalid
/// request (-32600).
pub const MAX_METHOD_LEN: usize = 256;

/// The longest tool or prompt name accepted in `tools/call` and `prompts/get`, in bytes
/// (decoded). Public names are far shorter (the catalog makes them); a longer one is
/// refused with -32602 without being echoed back.
pub const MAX_NAME_LEN: usize = 256;

/// The deepest nesting of arrays and objects accepted in a request or notification, the
/// message's own object counting as one level. A deeper one is an invalid request
/// (-32600), refused before any of it is forwarded: deep JSON overflows the stack of
/// many parsers (Python's `json`, serde_json without its recursion limit), and serde_json
/// itself refuses to build a `Value` past 128 levels. Checked once per message by a
/// byte scan ([`nested_deeper_than`]: strings are skipped with SIMD `memchr`, so a large
/// argument string costs little); responses are not scanned (results pass through
/// untouched, however deep).
pub const MAX_DEPTH: usize = 64;

/// What a parsed message is.
#[derive(Debug)]
pub enum Kind {
    Request {
        id: Id,
        method: String,
        /// Opened already ([`Incoming::Opened`]) for a `tools/call` or `prompts/get`
        /// whose `method` came before its params.
        params: Incoming,
    },
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// A response. `id` is `None` when the peer sent none, `Some(Id::NULL)` for `"id": null`.
    Response { id: Option<Id>, outcome: Outcome },
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

/// A message's members as read: `params` of a `tools/call` or `prompts/get` opened in
/// the same pass ([`Members`]), when `method` came before them.
struct Wire<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<std::borrow::Cow<'a, str>>,
    params: Option<WireParams<'a>>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
}

enum WireParams<'a> {
    Raw(&'a RawValue),
    Opened(Box<Members>),
}

impl WireParams<'_> {
    fn owned(self) -> Incoming {
        match self {
            WireParams::Raw(r) => Incoming::Raw(Some(r.to_owned())),
            WireParams::Opened(m) => Incoming::Opened(m),
        }
    }
}

/// Reads a message object ([`Wire`]); `text` is the message being read (with a known
/// `_meta` taken out of it: [`Substituted`]).
struct WireSeed<'a>(&'a str, Option<&'a Substituted<'a>>);

impl<'de> serde::de::Visitor<'de> for WireSeed<'de> {
    type Value = Wire<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-RPC message object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Wire<'de>, A::Error> {
        use serde::de::Error;
        let mut w = Wire {
            jsonrpc: None,
            id: None,
            method: None,
            params: None,
            result: None,
            error: None,
        };
        // Which members were read: a repeated one makes the message invalid.
        let mut seen = 0u8;
        while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
            let bit = match &*key {
                "jsonrpc" => 1,
                "id" => 2,
                "method" => 4,
                "params" => 8,
                "result" => 16,
                "error" => 32,
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
            };
            if seen & bit != 0 {
                return Err(A::Error::custom(format_args!("duplicate field `{key}`")));
            }
            seen |= bit;
            match bit {
                1 => w.jsonrpc = map.next_value()?,
                // `"id": null` is an id (null), not an absent one.
                2 => w.id = Some(map.next_value()?),
                4 => w.method = map.next_value::<Option<JsonStr<'de>>>()?.map(|m| m.0),
                8 => {
                    let opens = matches!(w.method.as_deref(), Some("tools/call" | "prompts/get"));
                    if !opens && self.1.is_some() {
                        // A known `_meta` is taken out of a call's params only: this
                        // message is read again as it came.
                        return Err(A::Error::custom("not a call"));
                    }
                    w.params = match opens.then(|| members::object_after(self.0, &key)).flatten() {
                        Some(start) => Some(WireParams::Opened(Box::new(
                            map.next_value_seed(OpenSeed::substituted(self.0, start, self.1))?,
                        ))),
                        None => map.next_value::<Option<&'de RawValue>>()?.map(WireParams::Raw),
                    }
                }
                16 => w.result = map.next_value()?,
                _ => w.error = map.next_value()?,
            }
        }
        Ok(w)
    }
}

/// Distinguishes `"id": null` (Some(null)) from an absent id (None).
pub(super) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Whether `json` (valid JSON text) nests arrays and objects more than `max` levels deep.
/// One pass, no allocation: brackets are counted outside strings, and each string is
/// skipped with SIMD `memchr` to its closing quote (a quote is escaped when an odd run of
/// backslashes precedes it), so a large string costs about a memory read.
pub fn nested_deeper_than(json: &[u8], max: usize) -> bool {
    // The usual message opens fewer brackets than `max` in all: counting them costs about
    // an instruction a byte, where the walk below costs a `memchr` call per string. A
    // message with more walks, from its start.
    if !opens_more_than(json, max) {
        return false;
    }
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

/// 0x80 in each byte (lane) of `word` that is `byte`, 0 in the others: exactly, as no
/// borrow crosses lanes.
pub fn lanes_of(word: u64, byte: u8) -> u64 {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    let v = word ^ (u64::from(byte) * 0x0101_0101_0101_0101);
    !(((v & LOW7) + LOW7) | v | LOW7)
}

/// Whether `json` has more than `max` bytes `[` or `{` (in strings too), counted eight
/// bytes at a time: `b | 0x20` is `{` for those two bytes only ([`lanes_of`] finds them).
/// Lanes sum to at most 31 × 8 in a block, so the block's total fits the top byte of one
/// multiplication.
fn opens_more_than(json: &[u8], max: usize) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    let mut total = 0usize;
    for block in json.chunks(8 * 31) {
        let mut lanes = 0u64;
        let mut words = block.chunks_exact(8);
        for w in &mut words {
            let v = u64::from_le_bytes(<[u8; 8]>::try_from(w).unwrap_or_default()) | CASE;
            lanes += lanes_of(v, b'{') >> 7;
        }
        total += (lanes.wrapping_mul(0x0101_0101_0101_0101) >> 56) as usize;
        total += words.remainder().iter().filter(|&&b| b | 0x20 == b'{').count();
        if total > max {
            return true;
        }
    }
    false
}

impl Kind {
    /// Parses one JSON-RPC message (not a batch).
    pub fn parse(bytes: &[u8]) -> Result<Kind, ParseError> {
        Kind::parse_with(bytes, None, false)
    }

    /// [`Kind::parse`] of a message a client sent to a front: a 2026-07-28 envelope read
    /// lately is not read again ([`super::memo`]).
    pub fn parse_from_client(bytes: &[u8]) -> Result<Kind, ParseError> {
        Kind::parse_with(bytes, None, true)
    }

    /// [`Kind::parse`] of a message in a shared buffer: a large result is a slice of it,
    /// not a copy. (A small one is copied, so it does not keep the buffer alive.)
    pub fn parse_shared(buf: &bytes::Bytes) -> Result<Kind, ParseError> {
        Kind::parse_with(buf, Some(buf), false)
    }

    fn parse_with(bytes: &[u8], shared: Option<&bytes::Bytes>, client: bool) -> Result<Kind, ParseError> {
        // UTF-8 checked once over the whole message: parsing from a `&str` then borrows
        // each string and raw value without checking its bytes again (from a `&[u8]`,
        // serde_json re-validates every one of them).
        let text =
            std::str::from_utf8(bytes).map_err(|e| ParseError::Json(format!("the message is not UTF-8: {e}")))?;
        if !client {
            return Kind::parse_text(text, shared, None);
        }
        if let Some((at, known)) = super::memo::find(bytes) {
            if let Some(kind) = Kind::parse_known(text, at, &known) {
                return Ok(kind);
            }
        }
        let kind = Kind::parse_text(text, shared, None)?;
        if let Kind::Request {
            params: Incoming::Opened(m),
            ..
        } = &kind
        {
            if let Some((meta, spans)) = m.own_meta() {
                super::memo::remember(meta, spans);
            }
        }
        Ok(kind)
    }

    /// The message `text` read with the known `_meta` text at `at` replaced by `{}`
    /// ([`super::memo`]); none when that `{}` is not the params' own `_meta`, or anything
    /// fails (the message is then read as it came).
    #[inline(never)]
    pub(super) fn parse_known(text: &str, at: usize, known: &super::memo::Known) -> Option<Kind> {
        let (before, after) = (text.get(..at)?, text.get(at + known.text.len()..)?);
        let mut read = super::memo::scratch();
        read.reserve(before.len() + 2 + after.len());
        read.push_str(before);
        read.push_str("{}");
        read.push_str(after);
        let sub = Substituted {
            at,
            original: text,
            known,
            used: std::cell::Cell::new(false),
        };
        let kind = Kind::parse_text(&read, None, Some(&sub));
        super::memo::give_back(read);
        kind.ok().filter(|_| sub.used.get())
    }

    /// [`Kind::parse_with`] of UTF-8 text.
    #[inline(always)]
    fn parse_text(text: &str, shared: Option<&bytes::Bytes>, sub: Option<&Substituted>) -> Result<Kind, ParseError> {
        let bytes = text.as_bytes();
        let mut de = serde_json::Deserializer::from_str(text);
        let read =
            serde::Deserializer::deserialize_map(&mut de, WireSeed(text, sub)).and_then(|w| de.end().map(|()| w));
        let wire = match read {
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
        if let Some(method) = wire.method {
            if wire.result.is_some() || wire.error.is_some() {
                return Err(ParseError::Shape("a request cannot carry a result or error".into()));
            }
            if let Some(WireParams::Raw(p)) = wire.params {
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
            let method = method.into_owned();
            let params = wire.params.map(WireParams::owned);
            return Ok(match id {
                None => Kind::Notification {
                    method,
                    params: params.and_then(Incoming::into_raw),
                },
                Some(id) => Kind::Request {
                    id,
                    method,
                    params: params.unwrap_or(Incoming::Raw(None)),
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

    /// The method's name as sent; `None` for a response.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::*;

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
        // The count of brackets, against a plain count, on every byte value and length.
        let bytes: Vec<u8> = (0..=255u8).cycle().take(2000).chain(*b"[{[{{[").collect();
        for len in [0, 1, 7, 8, 9, 247, 248, 249, 255, 256, 1000, 2006] {
            let b = &bytes[bytes.len() - len..];
            let plain = b.iter().filter(|&&c| c == b'[' || c == b'{').count();
            for max in [plain.saturating_sub(1), plain, plain + 1] {
                assert_eq!(opens_more_than(b, max), plain > max, "len {len} max {max}");
            }
        }
        // More brackets than the limit, but not that deep: the walk decides.
        assert!(!nested_deeper_than(br#"[[],[],[],[]]"#, 3));
        assert!(nested_deeper_than(br#"[[],[],[[[]]]]"#, 3));
        // A response is not scanned: a deep result goes through as the server wrote it.
        let result = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"a":{}{}}}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        assert!(Kind::parse(result.as_bytes()).is_ok());
    }

    #[test]
    fn call_params_are_opened_as_the_message_is_read() {
        let written = |m: &Members| {
            let mut out = Vec::new();
            m.write_to(&mut out);
            String::from_utf8(out).unwrap()
        };
        let meta = r#"{ "io.modelcontextprotocol/protocolVersion" : "2026-07-28","io.modelcontextprotocol/clientCapabilities":{ },
            "io.modelcontextprotocol/clientInfo":{"name":"x"} }"#;
        let params = format!(
            r#"{{ "name":"s__e", "arguments" : {{"t":1.50, "u" : [1e400]}}, "_meta" :{meta}
        }}"#
        );
        let lines = [
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#),
            format!(r#"{{ "method" : "prompts/get" , "params" : {params} , "jsonrpc":"2.0","id":"1"}}"#),
        ];
        for line in lines {
            let Kind::Request {
                params: Incoming::Opened(m),
                ..
            } = Kind::parse(line.as_bytes()).unwrap()
            else {
                panic!("not opened: {line}")
            };
            assert_eq!(m.get_raw("_meta"), Some(meta));
            assert_eq!(m.get_raw("arguments"), Some(r#"{"t":1.50, "u" : [1e400]}"#));
            let Peeked::Own(spans) = m.peeked() else {
                panic!("{:?}", m.peeked())
            };
            let texts = spans.clone().map(|s| s.and_then(|s| m.text_of(&s)));
            assert_eq!(texts, [Some(r#""2026-07-28""#), Some("{ }"), None]);
            // The same members as the params read on their own.
            let alone = Members::parse(Some(RawValue::from_string(params.clone()).unwrap())).unwrap();
            assert_eq!(written(&m), written(&alone));
            assert_eq!(alone.peeked(), m.peeked());
        }
        // Params before the method, another method, null or no params: as sent.
        let raw = |line: &str| match Kind::parse(line.as_bytes()).unwrap() {
            Kind::Request {
                params: Incoming::Raw(r),
                ..
            } => r.map(|r| r.get().to_owned()),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            raw(r#"{"jsonrpc":"2.0","id":1,"params":{"name":"x"},"method":"tools/call"}"#).as_deref(),
            Some(r#"{"name":"x"}"#)
        );
        assert_eq!(
            raw(r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"a"}}"#).as_deref(),
            Some(r#"{"uri":"a"}"#)
        );
        assert_eq!(
            raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#),
            None
        );
        assert_eq!(raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#), None);
        // Empty params, a `_meta` spelled with escapes, one that is not an object.
        for (params, meta, peeked) in [
            ("{ }", None, Peeked::Absent),
            (r#"{"\u005fmeta":{"k":1}}"#, Some(r#"{"k":1}"#), Peeked::Other),
            (r#"{"_meta":[{}]}"#, Some("[{}]"), Peeked::Other),
            (r#"{"_meta":{},"_meta":{"k":2}}"#, Some(r#"{"k":2}"#), Peeked::Other),
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
            let Kind::Request {
                params: Incoming::Opened(m),
                ..
            } = Kind::parse(line.as_bytes()).unwrap()
            else {
                panic!("not opened: {line}")
            };
            assert_eq!((m.get_raw("_meta"), m.peeked()), (meta, &peeked), "{params}");
        }
        // A notification's params stay raw; a repeated member or an array of params still
        // make an invalid request; bad JSON inside opened params is still a parse error.
        match Kind::parse(br#"{"jsonrpc":"2.0","method":"tools/call","params":{ "name":"x" }}"#).unwrap() {
            Kind::Notification { params, .. } => assert_eq!(params.unwrap().get(), r#"{"name":"x"}"#),
            other => panic!("{other:?}"),
        }
        for bad in [
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{},"params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"a":1},"name":5}"#,
        ] {
            let e = Kind::parse(bad.as_bytes()).unwrap_err();
            let want = if bad.ends_with("5}") {
                code::PARSE_ERROR
            } else {
                code::INVALID_REQUEST
            };
            assert_eq!(e.code(), want, "{bad}: {e}");
        }
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
            let Kind::Request { params, .. } = Kind::parse(line.as_bytes()).unwrap() else {
                panic!("not a request")
            };
            let parse = t.elapsed();
            let p = params.to_raw().unwrap();
            assert_eq!(
                p.get().len(),
                line.len() - r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":}"#.len()
            );
            eprintln!("20 MB request: depth scan {scan:?}, whole parse (scan included) {parse:?}");
        }
    }
}
