//! [`Members`]: params opened one level, each member's value left as raw JSON text.

use super::id::Id;
use super::peek::{progress_token_in, JsonStr};
use super::write::{empty_object, write_str};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A JSON object opened one level deep, for the few edits forwarding makes to
/// `tools/call` and `prompts/get` params (rename `name`, drop `task`, move
/// `_meta.progressToken`). Each member's value stays raw JSON text inside the client's own
/// params (no copy, no tree, no hashing); only `_meta`, when something reads or edits it,
/// is opened into a map. Written back, members keep their order and their values every
/// byte (number formatting, escapes, key order inside); the whitespace between top-level
/// members is dropped, and a key spelled with escapes is written decoded. A repeated key
/// keeps its first position and its last value, as a `serde_json::Map`
/// (with `preserve_order`) does.
#[derive(Clone)]
pub struct Members {
    /// The client's params, which the spans below index.
    text: Box<RawValue>,
    entries: Vec<(MemberKey, MemberValue)>,
}

#[derive(Clone)]
enum MemberKey {
    /// The key with its quotes, in `text`; it had no escapes.
    Span(std::ops::Range<usize>),
    Owned(String),
}

#[derive(Clone)]
enum MemberValue {
    Span(std::ops::Range<usize>),
    Raw(Box<RawValue>),
    /// JSON text the gateway wrote itself (a serialized string), so valid as it is.
    Written(String),
    Object(Map<String, Value>),
}

/// Where `inner` lies in `outer`, when it is a slice of it.
fn span_in(outer: &str, inner: &str) -> Option<std::ops::Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// The `_meta` keys [`Members::parse_meta`] reads: their values are given, in this order.
/// `skipped` keys may be there too; any other key makes `_meta` [`Peeked::Other`].
pub struct MetaKeys {
    pub own: [&'static str; 3],
    pub skipped: &'static str,
}

/// What [`Members::parse_meta`] found in `_meta`.
#[derive(Debug, PartialEq)]
pub enum Peeked {
    /// No `_meta`.
    Absent,
    /// `_meta` with the known keys only, taken out: the spans of `own`'s values, where given.
    Own([Option<std::ops::Range<usize>>; 3]),
    /// Anything else (kept in the members).
    Other,
}

/// Reads `_meta` for [`Members::parse_meta`]: an object of known keys gives their
/// values' spans in `text`; anything else is read past and is [`Peeked::Other`].
struct MetaSeed<'a, 'k> {
    text: &'a str,
    keys: &'k MetaKeys,
}

impl<'de> serde::de::DeserializeSeed<'de> for MetaSeed<'de, '_> {
    type Value = Peeked;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Peeked, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for MetaSeed<'de, '_> {
    type Value = Peeked;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Peeked, A::Error> {
        let mut own: [Option<std::ops::Range<usize>>; 3] = Default::default();
        let mut other = false;
        while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            match self.keys.own.iter().position(|k| *k == key) {
                // A repeated key: the general path decides.
                Some(i) if own[i].is_some() => other = true,
                Some(i) => match span_in(self.text, value.get()) {
                    Some(span) => own[i] = Some(span),
                    None => other = true,
                },
                None if key == self.keys.skipped => {}
                None => other = true,
            }
        }
        Ok(if other { Peeked::Other } else { Peeked::Own(own) })
    }
    super::peek::non_objects_give!(Peeked, Peeked::Other);
}

impl Members {
    /// Opens params (absent params read as an empty object).
    pub fn parse(params: Option<Box<RawValue>>) -> Result<Members, String> {
        Members::parse_peeking(params, None).map(|(m, _)| m)
    }

    /// [`Members::parse`], with `_meta` read as it is passed (one scan of it, not two):
    /// when it is an object whose keys are all among `peek.own` and `peek.skipped`, it
    /// is taken out of the members and the values of `own`'s keys are given as
    /// [`Peeked::Own`] (spans of the text: [`Members::text_of`]). Any other `_meta`
    /// gives [`Peeked::Other`], and the members are parsed again as [`Members::parse`]
    /// opens them (`_meta` kept).
    pub fn parse_meta(params: Option<Box<RawValue>>, peek: &MetaKeys) -> Result<(Members, Peeked), String> {
        let (members, peeked) = Members::parse_peeking(params, Some(peek))?;
        match peeked {
            Peeked::Other => Members::parse(Some(members.text)).map(|m| (m, Peeked::Other)),
            p => Ok((members, p)),
        }
    }

    /// The JSON text a span of [`Peeked::Own`] names.
    pub fn text_of(&self, span: &std::ops::Range<usize>) -> Option<&str> {
        self.text.get().get(span.clone())
    }

    fn parse_peeking(params: Option<Box<RawValue>>, peek: Option<&MetaKeys>) -> Result<(Members, Peeked), String> {
        use serde::de::{MapAccess, Visitor};
        let text = params.unwrap_or_else(empty_object);
        type Entries = Vec<(MemberKey, MemberValue)>;
        struct Top<'a, 'k> {
            text: &'a str,
            peek: Option<&'k MetaKeys>,
        }
        impl<'de> Visitor<'de> for Top<'de, '_> {
            type Value = (Entries, Peeked);
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("params must be an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Entries = Vec::with_capacity(4);
                let mut peeked = Peeked::Absent;
                while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
                    if let Some(keys) = self.peek.filter(|_| key == "_meta") {
                        peeked = match peeked {
                            // A repeated `_meta`: the general path decides.
                            Peeked::Absent => map.next_value_seed(MetaSeed { text: self.text, keys })?,
                            _ => {
                                map.next_value::<serde::de::IgnoredAny>()?;
                                Peeked::Other
                            }
                        };
                        continue;
                    }
                    let value: &'de RawValue = map.next_value()?;
                    let text = self.text;
                    let value = match span_in(text, value.get()) {
                        Some(r) => MemberValue::Span(r),
                        None => MemberValue::Raw(value.to_owned()),
                    };
                    let key = match &key {
                        std::borrow::Cow::Borrowed(k) => span_in(text, k)
                            .filter(|r| r.start > 0 && r.end < text.len())
                            .map(|r| MemberKey::Span(r.start - 1..r.end + 1)),
                        std::borrow::Cow::Owned(_) => None,
                    }
                    .unwrap_or_else(|| MemberKey::Owned(key.into_owned()));
                    out.push((key, value));
                }
                Ok((out, peeked))
            }
        }
        let raw = text.get();
        let mut de = serde_json::Deserializer::from_str(raw);
        let top = Top { text: raw, peek };
        let (mut entries, peeked) = serde::Deserializer::deserialize_map(&mut de, top).map_err(|e| {
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
        Ok((members, peeked))
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

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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

    /// Sets a member to JSON text read from parsed JSON (another member's value).
    pub fn insert_raw(&mut self, key: &str, json: &str) {
        self.set(key, MemberValue::Written(json.to_owned()));
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

/// A request's params on their way to the router: as the client wrote them, or already
/// opened one level by a front that had to look inside (the 2026-07-28 envelope's checks),
/// so that the router does not parse them again nor the front write them back.
pub enum Incoming {
    /// The client's own text (none: the request had no params).
    Raw(Option<Box<RawValue>>),
    /// Opened, with the front's edits made (the envelope's `_meta` members taken out).
    Opened(Members),
}

impl Incoming {
    /// The params as one raw value (opened ones written out).
    pub fn into_raw(self) -> Option<Box<RawValue>> {
        match self {
            Incoming::Raw(r) => r,
            Incoming::Opened(m) => Some(m.into_raw()),
        }
    }

    /// The params opened one level (absent params read as an empty object).
    pub fn into_members(self) -> Result<Members, String> {
        match self {
            Incoming::Raw(r) => Members::parse(r),
            Incoming::Opened(m) => Ok(m),
        }
    }

    /// The params' text, written out if they were opened (for a span's attributes).
    pub fn to_raw(&self) -> Option<std::borrow::Cow<'_, RawValue>> {
        match self {
            Incoming::Raw(r) => r.as_deref().map(std::borrow::Cow::Borrowed),
            Incoming::Opened(m) => {
                let mut out = Vec::with_capacity(m.len_hint());
                m.write_to(&mut out);
                let raw = String::from_utf8(out).ok().and_then(|t| RawValue::from_string(t).ok());
                Some(std::borrow::Cow::Owned(raw.unwrap_or_else(empty_object)))
            }
        }
    }
}

impl From<Option<Box<RawValue>>> for Incoming {
    fn from(r: Option<Box<RawValue>>) -> Incoming {
        Incoming::Raw(r)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::*;
    use serde_json::{Map, Value};

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
        // A notification: the same bytes as with the params raw.
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        assert_eq!(
            notification_with_members("notifications/progress", &m),
            notification("notifications/progress", Some(&raw))
        );
        assert_eq!(
            request_with_members(u64::MAX, "m", &m),
            request(&Id::from(u64::MAX), "m", Some(&raw))
        );
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
