//! [`Id`]: a request id (or progress token) kept as the peer's own JSON text, inline
//! when short.

use super::write::write_str;
use serde_json::value::RawValue;
use serde_json::Value;

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
    #[inline]
    pub(super) fn from_json(text: &str) -> Id {
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
    #[inline]
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
