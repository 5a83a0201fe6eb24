//! [`Members`]: params opened one level, each member's value left as raw JSON text.

use super::id::Id;
use super::meta::{META_CAPS, META_INFO, META_LOG, META_VERSION};
use super::peek::JsonStr;
use super::write::{empty_object, write_str};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::ops::Range;

/// A JSON object opened one level deep, for the few edits forwarding makes to
/// `tools/call` and `prompts/get` params (rename `name`, drop `task`, move
/// `_meta.progressToken`). Each member's value stays raw JSON text inside the client's own
/// params (no copy, no tree, no hashing); only `_meta`, when something reads or edits it,
/// is opened into a map. Written back, members keep their order and their values every
/// byte (number formatting, escapes, key order inside); the whitespace between top-level
/// members is dropped, and a key spelled with escapes is written decoded. A repeated key
/// keeps its first position and its last value, as a `serde_json::Map`
/// (with `preserve_order`) does.
///
/// While the params are opened, `_meta` is read one level too, for the 2026-07-28
/// envelope's own members ([`Members::peeked`]): one scan of it, not two.
#[derive(Clone)]
pub struct Members {
    /// The client's params, which the spans below index.
    text: Box<str>,
    entries: Vec<(MemberKey, MemberValue)>,
    /// What `_meta` held when the params were opened (edits since do not change it).
    peeked: Peeked,
}

#[derive(Clone)]
enum MemberKey {
    /// The key with its quotes, in `text`; it had no escapes.
    Span(Range<usize>),
    Owned(String),
}

#[derive(Clone)]
enum MemberValue {
    Span(Range<usize>),
    Raw(Box<RawValue>),
    /// JSON text the gateway wrote itself (a serialized string), so valid as it is.
    Written(String),
    Object(Map<String, Value>),
}

/// Where `inner` lies in `outer`, when it is a slice of it.
fn span_in(outer: &str, inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// The `_meta` members of the 2026-07-28 envelope that [`Peeked::Own`] gives, in this
/// order: the version, the capabilities and the log level.
pub const PEEKED_KEYS: [&str; 3] = [META_VERSION, META_CAPS, META_LOG];

/// What opening the params found in `_meta`.
#[derive(Clone, Debug, PartialEq)]
pub enum Peeked {
    /// No `_meta`.
    Absent,
    /// `_meta`, an object of the envelope's own members only ([`PEEKED_KEYS`], and
    /// `clientInfo`, which is not read): the spans of the [`PEEKED_KEYS`] values, where
    /// given ([`Members::text_of`]).
    Own([Option<Range<usize>>; 3]),
    /// Any other `_meta` (read it opened: [`Members::meta`]).
    Other,
}

/// The index of the first byte at or after `at` that is not JSON whitespace.
fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the value of a member starts, its key's closing quote being at `quote`: past the
/// colon and the whitespace around it.
pub(super) fn value_start(text: &[u8], quote: usize) -> Option<usize> {
    let colon = skip_ws(text, quote + 1);
    (text.get(colon) == Some(&b':')).then(|| skip_ws(text, colon + 1))
}

/// Just past the `}` of an object whose last value ends at `from` (with no member: whose
/// `{` is just before `from`).
fn object_end(text: &[u8], from: usize) -> Option<usize> {
    let at = skip_ws(text, from);
    (text.get(at) == Some(&b'}')).then_some(at + 1)
}

/// Where the object value of a member starts, when it is one: its key a slice of `text`
/// (a key read with escapes is a copy: none), the next byte after the colon `{`.
pub(super) fn object_after(text: &str, key: &str) -> Option<usize> {
    let quote = span_in(text, key)?.end;
    value_start(text.as_bytes(), quote).filter(|&s| text.as_bytes().get(s) == Some(&b'{'))
}

/// Spans of values in `text` (the text being read), made relative to `base`, where the
/// object being opened starts.
#[derive(Clone, Copy)]
struct Spans<'a> {
    text: &'a str,
    base: usize,
    /// The text being read is a message whose `_meta` was known and taken out.
    known: Option<&'a Substituted<'a>>,
}

/// A message read with its `_meta` text, one read before ([`super::memo`]), replaced by
/// `{}`: the params are opened from that text, and then made what they would have been
/// from the message as it came (its `_meta` text put back, the spans after it moved).
pub(super) struct Substituted<'a> {
    /// Where `_meta`'s known text was in the message, and `{}` is in the text read.
    pub at: usize,
    /// The message as it came.
    pub original: &'a str,
    pub known: &'a super::memo::Known,
    /// Whether the params' own `_meta` was the one at `at` (if not, the text read is not
    /// the message, and it is read again as it came).
    pub used: std::cell::Cell<bool>,
}

impl Spans<'_> {
    fn of(&self, inner: &str) -> Option<Range<usize>> {
        let r = span_in(self.text, inner)?;
        Some(r.start.checked_sub(self.base)?..r.end.checked_sub(self.base)?)
    }
}

/// Reads a `_meta` object (its spans as [`Spans`] gives them): [`Peeked::Own`] or
/// [`Peeked::Other`], and where its last value ends in the text read (none: it is empty).
struct MetaSeed<'a>(Spans<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for MetaSeed<'de> {
    type Value = (Peeked, Option<usize>);
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for MetaSeed<'de> {
    type Value = (Peeked, Option<usize>);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut own: [Option<Range<usize>>; 3] = Default::default();
        let mut other = false;
        let mut last = None;
        while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            last = span_in(self.0.text, value.get()).map(|r| r.end);
            match PEEKED_KEYS.iter().position(|k| *k == key) {
                // A repeated key: the general path decides.
                Some(i) if own[i].is_some() => other = true,
                Some(i) => match self.0.of(value.get()) {
                    Some(span) => own[i] = Some(span),
                    None => other = true,
                },
                None if key == META_INFO => {}
                None => other = true,
            }
        }
        let peeked = if other { Peeked::Other } else { Peeked::Own(own) };
        Ok((peeked, last))
    }
}

type Entries = Vec<(MemberKey, MemberValue)>;

/// An object opened one level from the text being read ([`Spans`]): its members, what
/// its `_meta` held, and where its last value ends in that text (none: no member).
struct Opened {
    entries: Entries,
    peeked: Peeked,
    last: Option<usize>,
}

/// Opens an object one level ([`Members`]), reading `_meta` in the same pass.
pub(super) struct OpenSeed<'a>(Spans<'a>);

impl<'a> OpenSeed<'a> {
    /// Opens the object that starts at `base` in `text`, the text being read.
    pub(super) fn at(text: &'a str, base: usize) -> OpenSeed<'a> {
        OpenSeed(Spans {
            text,
            base,
            known: None,
        })
    }

    /// [`OpenSeed::at`] in a message whose `_meta` was replaced ([`Substituted`]).
    pub(super) fn substituted(text: &'a str, base: usize, known: Option<&'a Substituted<'a>>) -> OpenSeed<'a> {
        OpenSeed(Spans { text, base, known })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for OpenSeed<'de> {
    type Value = Members;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Members, D::Error> {
        use serde::de::Error;
        let spans = self.0;
        let mut opened = d.deserialize_map(Open(spans))?;
        let bytes = spans.text.as_bytes();
        let end = object_end(bytes, opened.last.unwrap_or(spans.base + 1))
            .ok_or_else(|| D::Error::custom("an object opened one level did not close where expected"))?;
        let text = match spans.known.filter(|k| k.used.get()) {
            None => spans.text.get(spans.base..end),
            // The params as they came: `_meta`'s text back in place of `{}`, and what
            // follows it that much further on.
            Some(k) => {
                let grow = k.known.text.len().saturating_sub(2);
                let after = (k.at + 2).saturating_sub(spans.base);
                let shift = |r: &mut Range<usize>| {
                    if r.start >= after {
                        *r = r.start + grow..r.end + grow;
                    }
                };
                for (key, value) in &mut opened.entries {
                    if let MemberKey::Span(r) = key {
                        shift(r);
                    }
                    if let MemberValue::Span(r) = value {
                        shift(r);
                    }
                }
                k.original.get(spans.base..end + grow)
            }
        }
        .unwrap_or("{}");
        Ok(Members::assemble(text.into(), opened))
    }
}

/// [`OpenSeed`]'s visitor.
struct Open<'a>(Spans<'a>);

impl<'de> serde::de::Visitor<'de> for Open<'de> {
    type Value = Opened;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("params must be an object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Opened, A::Error> {
        use serde::de::Error;
        let Spans { text, .. } = self.0;
        let mut entries: Entries = Vec::with_capacity(4);
        let mut peeked = Peeked::Absent;
        let mut last = None;
        while let Some(JsonStr(key)) = map.next_key::<JsonStr<'de>>()? {
            let meta_at = (key == "_meta").then(|| object_after(text, &key));
            let value = match meta_at {
                // The first `_meta`, where a known one was taken out: the `{}` put there.
                Some(Some(start)) if peeked == Peeked::Absent && self.0.known.is_some_and(|k| k.at == start) => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    let k = self.0.known.ok_or_else(|| A::Error::custom("no known _meta"))?;
                    k.used.set(true);
                    let rel = start
                        .checked_sub(self.0.base)
                        .ok_or_else(|| A::Error::custom("_meta before params"))?;
                    peeked = Peeked::Own(k.known.spans.clone().map(|s| s.map(|r| r.start + rel..r.end + rel)));
                    last = Some(start + 2);
                    MemberValue::Span(rel..rel + k.known.text.len())
                }
                // The first `_meta`, an object where it can be found: read one level.
                Some(Some(start)) if peeked == Peeked::Absent => {
                    let (p, inner_last) = map.next_value_seed(MetaSeed(self.0))?;
                    let end = object_end(text.as_bytes(), inner_last.unwrap_or(start + 1))
                        .ok_or_else(|| A::Error::custom("_meta did not close where expected"))?;
                    peeked = p;
                    last = Some(end);
                    let whole = text.get(start..end).unwrap_or("{}");
                    match self.0.of(whole) {
                        Some(r) => MemberValue::Span(r),
                        None => MemberValue::Written(whole.to_owned()),
                    }
                }
                _ => {
                    if meta_at.is_some() {
                        // Not an object, repeated, or spelled with escapes: read opened.
                        peeked = Peeked::Other;
                    }
                    let value: &'de RawValue = map.next_value()?;
                    last = span_in(text, value.get()).map(|r| r.end);
                    match self.0.of(value.get()) {
                        Some(r) => MemberValue::Span(r),
                        None => MemberValue::Raw(value.to_owned()),
                    }
                }
            };
            let key = match &key {
                std::borrow::Cow::Borrowed(k) => self
                    .0
                    .of(k)
                    .filter(|r| r.start > 0)
                    .map(|r| MemberKey::Span(r.start - 1..r.end + 1)),
                std::borrow::Cow::Owned(_) => None,
            }
            .unwrap_or_else(|| MemberKey::Owned(key.into_owned()));
            entries.push((key, value));
        }
        Ok(Opened { entries, peeked, last })
    }
}

impl Members {
    /// Opens params (absent params read as an empty object), reading `_meta` as they are
    /// opened ([`Members::peeked`]).
    pub fn parse(params: Option<Box<RawValue>>) -> Result<Members, String> {
        match params {
            Some(params) => Members::parse_text(params.get()),
            None => Ok(Members::new()),
        }
    }

    /// [`Members::parse`] of JSON text (a copy of it is kept).
    pub(crate) fn parse_text(raw: &str) -> Result<Members, String> {
        let mut de = serde_json::Deserializer::from_str(raw);
        let members = serde::de::DeserializeSeed::deserialize(OpenSeed::at(raw, 0), &mut de).map_err(|e| {
            if raw.trim_start().starts_with('{') {
                e.to_string()
            } else {
                "params must be an object".to_owned()
            }
        })?;
        de.end().map_err(|e| e.to_string())?;
        Ok(members)
    }

    /// `_meta`'s text as the client wrote it, and the spans of [`Peeked::Own`] in that
    /// text, when it holds the envelope's own members only.
    pub(super) fn own_meta(&self) -> Option<(&str, [Option<Range<usize>>; 3])> {
        let Peeked::Own(spans) = &self.peeked else {
            return None;
        };
        let (_, MemberValue::Span(r)) = &self.entries[self.position("_meta")?] else {
            return None;
        };
        let text = self.text.get(r.clone())?;
        let mut inner: [Option<Range<usize>>; 3] = Default::default();
        for (to, from) in inner.iter_mut().zip(spans) {
            if let Some(s) = from {
                *to = Some(s.start.checked_sub(r.start)?..s.end.checked_sub(r.start)?);
            }
        }
        Some((text, inner))
    }

    /// What `_meta` held when the params were opened.
    pub fn peeked(&self) -> &Peeked {
        &self.peeked
    }

    /// The JSON text a span of [`Peeked::Own`] names.
    pub fn text_of(&self, span: &Range<usize>) -> Option<&str> {
        self.text.get(span.clone())
    }

    /// The members of an object opened from `text`; a repeated key keeps its first
    /// position and its last value.
    #[inline]
    fn assemble(text: Box<str>, opened: Opened) -> Members {
        let Opened {
            mut entries, peeked, ..
        } = opened;
        let mut members = Members {
            text,
            entries: Vec::new(),
            peeked,
        };
        if has_repeats(&members, &entries) {
            for (k, v) in entries.drain(..) {
                match members.position(members.key_of(&k)) {
                    Some(i) => members.entries[i].1 = v,
                    None => members.entries.push((k, v)),
                }
            }
        } else {
            members.entries = entries;
        }
        members
    }

    fn key_of<'a>(&'a self, k: &'a MemberKey) -> &'a str {
        match k {
            MemberKey::Span(r) => self.text.get(r.start + 1..r.end - 1).unwrap_or(""),
            MemberKey::Owned(s) => s,
        }
    }

    /// Whether entry key `k` is `key`: its length compared first, as a span's is known
    /// without slicing the text.
    #[inline]
    fn is_key(&self, k: &MemberKey, key: &str) -> bool {
        match k {
            MemberKey::Span(r) => {
                r.len() == key.len() + 2 && self.text.as_bytes().get(r.start + 1..r.end - 1) == Some(key.as_bytes())
            }
            MemberKey::Owned(s) => s == key,
        }
    }

    #[inline]
    fn position(&self, key: &str) -> Option<usize> {
        self.entries.iter().position(|(k, _)| self.is_key(k, key))
    }

    /// A member's raw JSON text (an opened `_meta` is not raw: `None`).
    pub fn get_raw(&self, key: &str) -> Option<&str> {
        let (_, v) = &self.entries[self.position(key)?];
        match v {
            MemberValue::Span(r) => self.text.get(r.clone()),
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
            if !inner.bytes().any(|b| b == b'\\' || b == b'"') {
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
        // From the end: keys are unique, and what is taken out (`_meta`) is usually last.
        match self.entries.iter().rposition(|(k, _)| self.is_key(k, key)) {
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
    /// text). `_meta`'s other members keep their bytes ([`Members::edit_meta`]).
    pub fn take_progress(&mut self) -> Option<Id> {
        // Most `_meta`s name no token: not opened to look (a key spelled with escapes
        // could, so text with a backslash is).
        if self
            .get_raw("_meta")
            .is_some_and(|t| !super::peek::may_name_progress(t))
        {
            return None;
        }
        let mut taken = None;
        self.edit_meta(false, |meta| {
            taken = meta.get_raw("progressToken").map(Id::from_json);
            meta.remove("progressToken")
        });
        taken
    }

    /// Edits `_meta` one level down, as [`Members`] too, so that its members the edit does
    /// not touch keep their bytes; `_meta` is added empty first with `add`. `edit` says
    /// whether it changed anything (if not, `_meta` stays as it was). Does nothing when
    /// `_meta` is not an object. (A `_meta` opened into a map, [`Members::meta`], is read
    /// from the map's text.)
    pub fn edit_meta(&mut self, add: bool, edit: impl FnOnce(&mut Members) -> bool) {
        let i = match self.position("_meta") {
            Some(i) => i,
            None if add => {
                let mut meta = Members::new();
                if edit(&mut meta) {
                    self.insert_members("_meta", &meta);
                }
                return;
            }
            None => return,
        };
        let text = match &self.entries[i].1 {
            // Opened into a map already (trace context was put in): its text.
            MemberValue::Object(m) => std::borrow::Cow::Owned(Value::Object(m.clone()).to_string()),
            _ => match self.get_raw("_meta") {
                Some(t) => std::borrow::Cow::Borrowed(t),
                None => return,
            },
        };
        let Ok(mut meta) = Members::parse_text(&text) else {
            // Not an object.
            return;
        };
        if edit(&mut meta) {
            self.insert_members("_meta", &meta);
        }
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

    /// Writes the object.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let text = &*self.text;
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
                MemberValue::Span(r) => self.text.get(r.clone()).and_then(|t| serde_json::from_str(t).ok()),
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
            text: "{}".into(),
            entries: Vec::new(),
            peeked: Peeked::Absent,
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
        self.text.len() + 16
    }
}

/// A request's params on their way to the router: as the client wrote them, or already
/// opened one level by a front that had to look inside (the 2026-07-28 envelope's checks),
/// so that the router does not parse them again nor the front write them back.
pub enum Incoming {
    /// The client's own text (none: the request had no params).
    Raw(Option<Box<RawValue>>),
    /// Opened, with the front's edits made (the envelope's `_meta` members taken out).
    /// Boxed: a message carries it through many futures, which would all grow.
    Opened(Box<Members>),
}

impl Incoming {
    /// The params as one raw value (opened ones written out).
    pub fn into_raw(self) -> Option<Box<RawValue>> {
        match self {
            Incoming::Raw(r) => r,
            Incoming::Opened(m) => Some(m.into_raw()),
        }
    }

    /// Whether the params have a `_meta` object with a member named `key`.
    pub fn meta_has(&self, key: &str) -> bool {
        match self {
            Incoming::Raw(r) => super::peek::meta_has(r.as_deref(), key),
            Incoming::Opened(m) => match (m.peeked(), PEEKED_KEYS.iter().position(|k| *k == key)) {
                (Peeked::Own(spans), Some(i)) if m.contains_key("_meta") => spans[i].is_some(),
                _ => match m.position("_meta").map(|i| &m.entries[i].1) {
                    Some(MemberValue::Object(o)) => o.contains_key(key),
                    Some(_) => m.get_raw("_meta").is_some_and(|raw| super::peek::object_has(raw, key)),
                    None => false,
                },
            },
        }
    }

    /// The params opened one level (absent params read as an empty object).
    pub fn into_members(self) -> Result<Members, String> {
        match self {
            Incoming::Raw(r) => Members::parse(r),
            Incoming::Opened(m) => Ok(*m),
        }
    }

    /// [`Incoming::into_members`], boxed (to be [`Incoming::Opened`] again).
    pub fn into_boxed_members(self) -> Result<Box<Members>, String> {
        match self {
            Incoming::Raw(r) => Members::parse(r).map(Box::new),
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

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_raw() {
            Some(raw) => write!(f, "{}", raw.get()),
            None => f.write_str("(none)"),
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
            .any(|(i, (k, _))| entries[..i].iter().any(|(j, _)| m.is_key(j, m.key_of(k))));
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
        m.edit_meta(true, |meta| {
            meta.insert_raw("progressToken", "4");
            true
        });
        assert_eq!(written(&m), r#"{"name":"n","_meta":{"progressToken":4}}"#);
        let mut m = members(r#"{"_meta":5}"#);
        m.edit_meta(true, |meta| {
            meta.insert_raw("progressToken", "4");
            true
        });
        assert!(m.meta().is_none());
        assert_eq!(written(&m), r#"{"_meta":5}"#);
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
