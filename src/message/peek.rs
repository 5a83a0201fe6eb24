//! A field or two read out of raw JSON without opening the rest: progress tokens,
//! cancelled ids, a tool result's `isError`, an error's code and message.

use super::envelope::present;
use super::id::Id;
use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON string, borrowed from the input when it has no escapes.
pub(super) struct JsonStr<'a>(pub(super) std::borrow::Cow<'a, str>);

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

/// A searcher for a needle, built once per process: `memmem::find` builds one for every
/// search, which on a small text costs more than the search.
pub(crate) type Finder = std::sync::LazyLock<memchr::memmem::Finder<'static>>;

static PROGRESS_TOKEN: Finder = Finder::new(|| memchr::memmem::Finder::new(b"progressToken"));
static META: Finder = Finder::new(|| memchr::memmem::Finder::new(b"_meta"));

/// Whether a `_meta` object's JSON text may have a `progressToken` member: the name
/// spelled out, or a backslash (a key spelled with escapes).
pub(super) fn may_name_progress(meta: &str) -> bool {
    PROGRESS_TOKEN.find(meta.as_bytes()).is_some() || memchr::memchr(b'\\', meta.as_bytes()).is_some()
}

/// `progressToken` of a `_meta` object's JSON text, as its own text.
pub(super) fn progress_token_in(meta: &str) -> Option<Id> {
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default, rename = "progressToken", deserialize_with = "present")]
        token: Option<&'a RawValue>,
    }
    // A `_meta` without the key spelled out gives none here (the opened map still finds
    // one written with escapes).
    PROGRESS_TOKEN.find(meta.as_bytes())?;
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
    PROGRESS_TOKEN.find(text.as_bytes())?;
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

/// Whether a tool result says `"isError": true` at its top level (for metrics and traces).
///
/// Most results carry no `isError` at all, so the bytes are searched first (SIMD
/// `memchr` for `E` and `\\`, no parse): without the text `isError` and without any `\u` escape (the only
/// other way to spell a key's letters) the key cannot be there. Otherwise the top-level
/// object is read with every value but `isError` skipped unread ([`member`], no
/// allocation), so an `isError` nested in content, or inside a string, does not count.
/// Anything that is not an object, or whose `isError` is not a boolean, is not an error.
pub fn is_tool_error(result: &str) -> bool {
    let bytes = result.as_bytes();
    let named =
        memchr::memchr_iter(b'E', bytes).any(|i| bytes[..i].ends_with(b"is") && bytes[i..].starts_with(b"Error"));
    let escaped = || memchr::memchr_iter(b'\\', bytes).any(|i| bytes.get(i + 1) == Some(&b'u'));
    if !named && !escaped() {
        return false;
    }
    // A non-boolean isError makes the read fail: not an error.
    member::<bool>(result, "isError").unwrap_or(false)
}

/// The member `key` at the top level of the JSON object `json`, read as a `T`. Every other
/// value is skipped unread (`IgnoredAny`) and keys are borrowed (decoded only when they
/// hold escapes), so nothing is allocated but what `T` holds. When the key repeats the
/// last value counts. `None` when `json` is not an object, has no such key, or some value
/// under it is not a `T`.
pub(super) fn member<'de, T: Deserialize<'de>>(json: &'de str, key: &str) -> Option<T> {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    struct Top<'k, T>(&'k str, std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Top<'_, T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
            let mut found = None;
            while let Some(JsonStr(k)) = map.next_key::<JsonStr<'de>>()? {
                if k == self.0 {
                    found = Some(map.next_value::<T>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_str(json);
    serde::Deserializer::deserialize_map(&mut de, Top(key, std::marker::PhantomData))
        .ok()
        .flatten()
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

/// A `serde::de::Visitor`'s methods for every JSON value but an object: each reads its
/// value past (an array's elements too) and gives `$v`.
macro_rules! non_objects_give {
    ($t:ty, $v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_str<E>(self, _: &str) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<$t, E> {
            Ok($v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<$t, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok($v)
        }
    };
}

/// Whether params (an object) have a `_meta` object with a member named `key`, read
/// without opening anything else: the keys compared decoded, the last `_meta` counting
/// when it is repeated (as in a parsed map). Params that are not an object give false.
pub fn meta_has(params: Option<&RawValue>, key: &str) -> bool {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    struct Top<'k>(&'k str);
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut found = false;
            while let Some(JsonStr(k)) = map.next_key::<JsonStr<'de>>()? {
                if k == "_meta" {
                    found = map.next_value_seed(Has(self.0))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let Some(params) = params else { return false };
    // Most params have no `_meta` at all: no parse for them (a key spelled with escapes
    // is read decoded, so text with a backslash is parsed).
    let text = params.get().as_bytes();
    if META.find(text).is_none() && memchr::memchr(b'\\', text).is_none() {
        return false;
    }
    let mut de = serde_json::Deserializer::from_str(params.get());
    serde::Deserializer::deserialize_map(&mut de, Top(key)).unwrap_or(false)
}

/// Whether `json` (JSON text) is an object with a member named `key` (compared decoded).
pub fn object_has(json: &str, key: &str) -> bool {
    let mut de = serde_json::Deserializer::from_str(json);
    serde::de::DeserializeSeed::deserialize(Has(key), &mut de).unwrap_or(false)
}

/// Reads a value past: whether it is an object with a member named `.0`.
struct Has<'k>(&'k str);

impl<'de> serde::de::Visitor<'de> for Has<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(JsonStr(k)) = map.next_key::<JsonStr<'de>>()? {
            map.next_value::<serde::de::IgnoredAny>()?;
            found |= k == self.0;
        }
        Ok(found)
    }
    // Any other value: not an object, so no member.
    non_objects_give!(bool, false);
}

impl<'de> serde::de::DeserializeSeed<'de> for Has<'_> {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn meta_members_are_found_as_a_parsed_map_finds_them() {
        let has = |s: &str| meta_has(Some(&RawValue::from_string(s.to_owned()).unwrap()), "v");
        // The same answer as opening params into a map and asking it.
        let parsed = |s: &str| {
            let p: serde_json::Map<String, serde_json::Value> = match serde_json::from_str(s) {
                Ok(p) => p,
                Err(_) => return false,
            };
            p.get("_meta")
                .and_then(|m| m.as_object())
                .is_some_and(|m| m.contains_key("v"))
        };
        for s in [
            r#"{"_meta":{"v":1}}"#,
            r#"{"a":[{"_meta":{"v":1}}],"_meta":{"w":{"v":2}}}"#,
            r#"{"_meta":{"v":1},"_meta":{"w":1}}"#,
            r#"{"_meta":{"w":1},"_meta":{"x":[1,{"y":"\""}],"v":null}}"#,
            r#"{"_m\u0065ta":{"\u0076":1}}"#,
            r#"{"_meta":"v"}"#,
            r#"{"_meta":["v"]}"#,
            r#"{"_meta":null,"v":1}"#,
            r#"{"name":"_meta","v":1}"#,
            r#"[{"_meta":{"v":1}}]"#,
            r#"{}"#,
        ] {
            assert_eq!(has(s), parsed(s), "{s}");
        }
        assert!(has(r#"{"_m\u0065ta":{"\u0076":1}}"#));
        assert!(!meta_has(None, "v"));
    }
}
