//! What every 2026-07-28 result carries: `resultType`, the gateway's serverInfo in
//! `_meta`, and for cacheable results (`server/discover`, the lists, `resources/read`)
//! `ttlMs` and `cacheScope`.
//!
//! Caching hints: a merged list gets the catalog's hint (smallest `ttlMs` of its servers'
//! parts, a handshake-era part counting as 0; private if any part is), `resources/read`
//! its 2026-07-28 server's own (else `ttlMs` 0, `private`: contents may depend on the
//! caller), `server/discover` `ttlMs` 0; with auth configured everything is `private`
//! (allowlists make lists differ per identity).

use crate::catalog::Hint;
use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::method::Method;
use serde_json::{json, Map, Value};

use crate::message::meta::META_SERVER_INFO;

/// How one request's outcome is decorated before it is sent.
pub struct Finish {
    pub(super) method: Method,
    /// Every cacheable result is `private` (auth is configured).
    pub(super) private: bool,
    /// `params.uri` of a `resources/read`, for its not-found error.
    pub(super) uri: Option<String>,
    /// A merged list's caching hint (see [`crate::catalog::Catalog::hint`]).
    pub(super) hint: Option<Hint>,
}

impl Finish {
    /// The response as the revision sends it. A result of the usual case is written
    /// once, the revision's members spliced in (a large one goes out in parts, its own
    /// bytes shared, as on the session path): see [`message::Answer::spliced`].
    pub fn answer(&self, id: &Id, out: Outcome) -> message::Answer {
        if let Outcome::Result(r) = &out {
            let usual = self.hint.is_none() && !self.method.is_cacheable();
            if usual {
                if let Some((keep, rest)) = splice_at(r.get(), "", "") {
                    return message::Answer::spliced(id, r, keep, &rest);
                }
            }
        }
        message::Answer::new(id, self.apply(out))
    }

    /// The outcome as the revision sends it.
    pub fn apply(&self, out: Outcome) -> Outcome {
        match out {
            // The usual case (tools/call, prompts/get): the server's bytes, with the
            // revision's members spliced in before the closing brace.
            Outcome::Result(r) if self.hint.is_none() && !self.method.is_cacheable() => match splice(r.get(), "", "") {
                Some(done) => Outcome::Result(message::Raw::written(done)),
                None => self.apply_parsed(&r),
            },
            // A merged list (the catalog's own text, however long): its hint spliced in
            // where the tree would put it, so a large list is scanned, not rebuilt.
            Outcome::Result(r) if self.method.is_list() && self.hint.is_some() => {
                let h = self.hint.unwrap_or_default();
                let head = if h.private {
                    format!(r#""ttlMs":{},"cacheScope":"private","#, h.ttl_ms)
                } else {
                    format!(r#""ttlMs":{},"#, h.ttl_ms)
                };
                let scope = if self.private { "private" } else { "public" };
                let tail = if h.private {
                    String::new()
                } else {
                    format!(r#","cacheScope":"{scope}""#)
                };
                match splice(r.get(), &head, &tail) {
                    Some(done) => Outcome::Result(message::Raw::written(done)),
                    None => self.apply_parsed(&r),
                }
            }
            Outcome::Result(r) => self.apply_parsed(&r),
            // 2026-07-28: an unknown resource is -32602 with data.uri.
            Outcome::Error(e) if self.method == Method::ResourcesRead => {
                let mut v = serde_json::from_str::<Value>(e.get()).unwrap_or(Value::Null);
                if v.get("code").and_then(Value::as_i64) == Some(code::RESOURCE_NOT_FOUND) {
                    v["code"] = json!(code::INVALID_PARAMS);
                    let has_uri = v.get("data").and_then(|d| d.get("uri")).is_some();
                    if !has_uri {
                        v["data"] = json!({ "uri": self.uri });
                    }
                    return Outcome::Error(message::to_raw(&v));
                }
                Outcome::Error(e)
            }
            Outcome::Error(e) => Outcome::Error(e),
        }
    }

    /// A result decorated through a parsed tree (cacheable results, and results whose
    /// members the splice cannot just follow).
    fn apply_parsed(&self, r: &message::Raw) -> Outcome {
        let mut v = serde_json::from_str::<Value>(r.get()).unwrap_or(Value::Null);
        if let (Some(h), Value::Object(o)) = (self.hint, &mut v) {
            o.insert("ttlMs".into(), json!(h.ttl_ms));
            if h.private {
                o.insert("cacheScope".into(), json!("private"));
            }
        }
        complete(self.method, v, &server_info(), self.private)
    }

    /// An `InputRequiredResult`: the servers' open questions and the state to echo back.
    pub fn input_required(&self, requests: Map<String, Value>, state: String) -> Outcome {
        let v = json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": state,
            "_meta": { META_SERVER_INFO: server_info() },
        });
        Outcome::Result(message::to_raw(&v).into())
    }
}

use crate::router::server_info;

/// `server/discover`: the versions, the capabilities this revision has (no tasks;
/// `listChanged` and `subscribe` as in `initialize`, delivered by `subscriptions/listen`),
/// instructions.
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
        "supportedVersions": super::supported_versions(),
        "capabilities": caps,
    });
    if let Some(i) = init.get("instructions") {
        result["instructions"] = i.clone();
    }
    let info = init.get("serverInfo").cloned().unwrap_or(Value::Null);
    complete(Method::ServerDiscover, result, &info, private)
}

/// `result` (a JSON object's text) with `head`, then `"resultType":"complete"` and the
/// serverInfo `_meta`, then `tail` added as its last members: what [`complete`] writes
/// through a tree, without building one. The text is scanned once (no allocation) to see
/// that it is an object with none of the members added here. `None`: it is not, so
/// [`complete`] must decide. Other members stay as written, as on the session path (a
/// member repeated included, where the tree would keep the last value only).
fn splice(result: &str, head: &str, tail: &str) -> Option<String> {
    let (keep, rest) = splice_at(result, head, tail)?;
    let mut out = String::with_capacity(keep + rest.len());
    out.push_str(&result[..keep]);
    out.push_str(&rest);
    Some(out)
}

/// [`splice`] without the copy: how many bytes of `result` to keep (up to, not including,
/// its closing brace; all of `{` when it is empty) and what follows them (the members
/// added, then `}`).
fn splice_at(result: &str, head: &str, tail: &str) -> Option<(usize, std::borrow::Cow<'static, str>)> {
    /// Whether a member is there, whatever its value (`null` included).
    #[derive(Default)]
    struct Seen(bool);
    impl<'de> serde::Deserialize<'de> for Seen {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Seen, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Seen(true))
        }
    }
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(rename = "resultType", default)]
        result_type: Seen,
        #[serde(rename = "_meta", default)]
        meta: Seen,
        #[serde(rename = "ttlMs", default)]
        ttl: Seen,
        #[serde(rename = "cacheScope", default)]
        scope: Seen,
    }
    static MIDDLE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // JSON's whitespace is ASCII: trimmed without decoding chars.
    let text = result.trim_ascii();
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    // A result whose text has none of those names as a quoted string (nor any `\u`
    // escape, which could spell one) has none of them: it is valid JSON, so an object,
    // and is not parsed to look.
    if may_name(text.as_bytes()) {
        let top: Top = serde_json::from_str(text).ok()?;
        if top.result_type.0 || top.meta.0 || top.ttl.0 || top.scope.0 {
            return None;
        }
    }
    let middle = MIDDLE.get_or_init(|| {
        let meta = json!({ META_SERVER_INFO: server_info() });
        format!(r#""resultType":"complete","_meta":{meta}"#)
    });
    // Offsets in `result` itself (its leading whitespace stays, its trailing goes).
    let open = result.len() - result.trim_ascii_start().len();
    let close = open + text.len() - 1;
    let (keep, comma) = if inner.trim_ascii().is_empty() {
        (open + 1, "")
    } else {
        (close, ",")
    };
    if head.is_empty() && tail.is_empty() {
        // The usual case (a tools/call result): the same members every time, written once.
        static ALONE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        static AFTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let cell = if comma.is_empty() { &ALONE } else { &AFTER };
        let rest = cell.get_or_init(|| format!("{comma}{middle}}}"));
        return Some((keep, std::borrow::Cow::Borrowed(rest.as_str())));
    }
    let mut rest = String::with_capacity(head.len() + middle.len() + tail.len() + 2);
    rest.push_str(comma);
    rest.push_str(head);
    rest.push_str(middle);
    rest.push_str(tail);
    rest.push('}');
    Some((keep, std::borrow::Cow::Owned(rest)))
}

/// Whether `text` has `"resultType"`, `"_meta"`, `"ttlMs"` or `"cacheScope"`, or a `\u`
/// escape, anywhere: one pass over its quotes and backslashes (a `memmem` searcher per
/// name costs more to build than a small result costs to scan). A small result is read
/// eight bytes at a time: `memchr` per quote costs more than the bytes between them.
fn may_name(text: &[u8]) -> bool {
    /// Whether the quote or backslash at `i` starts one of the names or a `\u` escape.
    #[inline(always)]
    fn at(text: &[u8], i: usize) -> bool {
        let rest = text.get(i + 1..).unwrap_or_default();
        match (text.get(i), rest.first()) {
            (Some(b'\\'), next) => next == Some(&b'u'),
            (_, Some(b'r')) => rest.starts_with(b"resultType\""),
            (_, Some(b'_')) => rest.starts_with(b"_meta\""),
            (_, Some(b't')) => rest.starts_with(b"ttlMs\""),
            (_, Some(b'c')) => rest.starts_with(b"cacheScope\""),
            _ => false,
        }
    }
    let names = |i: usize| at(text, i);
    if text.len() <= 256 {
        let mut words = text.chunks_exact(8);
        for (n, w) in (&mut words).enumerate() {
            let w = u64::from_le_bytes(<[u8; 8]>::try_from(w).unwrap_or_default());
            let mut hits = message::lanes_of(w, b'"') | message::lanes_of(w, b'\\');
            while hits != 0 {
                if names(n * 8 + hits.trailing_zeros() as usize / 8) {
                    return true;
                }
                hits &= hits - 1;
            }
        }
        let tail = text.len() - words.remainder().len();
        return (tail..text.len()).any(|i| matches!(text[i], b'"' | b'\\') && names(i));
    }
    memchr::memchr2_iter(b'"', b'\\', text).any(names)
}

/// The error for a `requestState` that does not verify (the reason goes to the log only).
pub fn invalid_state() -> Error {
    Error::invalid_params("Invalid or expired requestState").with_data(json!({ "reason": "invalid_request_state" }))
}

/// A result with `resultType` (`complete` unless it says otherwise), serverInfo, and
/// for a cacheable method its caching hint.
fn complete(method: Method, mut v: Value, info: &Value, private: bool) -> Outcome {
    if let Value::Object(o) = &mut v {
        o.entry("resultType").or_insert_with(|| json!("complete"));
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            if !info.is_null() {
                m.insert(META_SERVER_INFO.into(), info.clone());
            }
        }
        if method.is_cacheable() {
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
                None if method == Method::ResourcesRead => "private",
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
    fn a_large_result_is_answered_from_its_own_bytes_with_the_revisions_members_after() {
        let finish = Finish {
            method: Method::ToolsCall,
            private: false,
            uri: None,
            hint: None,
        };
        for big in [
            format!(
                "{{\"content\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}",
                "x".repeat(message::LARGE_RESULT)
            ),
            format!("  {{\"text\":\"{}\"}}\n", "y".repeat(message::LARGE_RESULT)),
        ] {
            let raw = message::Raw::written(big.clone());
            let at = raw.get().as_ptr();
            let answer = finish.answer(&Id::from(5), Outcome::Result(raw));
            let message::Answer::Parts(head, body, tail) = answer else {
                panic!("a large result was copied into one buffer")
            };
            assert_eq!(body.as_ptr(), at, "the result's bytes were copied");
            let whole = message::Answer::Parts(head, body, tail).into_vec();
            let want = message::response(&Id::from(5), &finish.apply(Outcome::Result(message::Raw::written(big))));
            assert_eq!(String::from_utf8(whole).unwrap(), String::from_utf8(want).unwrap());
        }
    }

    /// What `complete` makes of a tools/call result.
    fn through_tree(result: &str) -> String {
        let v = serde_json::from_str::<Value>(result).unwrap();
        match complete(Method::ToolsCall, v, &server_info(), false) {
            Outcome::Result(r) => r.get().to_owned(),
            Outcome::Error(_) => unreachable!(),
        }
    }

    #[test]
    fn a_small_result_is_written_once_as_its_decorated_outcome_would_be() {
        let f = Finish {
            method: Method::ToolsCall,
            private: false,
            uri: None,
            hint: None,
        };
        let id = Id::string("c");
        for r in [
            r#"{"content":[{"type":"text","text":"hi"}]}"#,
            r#" { "content" : [ ] , "isError" : true } "#,
            "{}",
            r#"{"content":[],"_meta":{"k":1}}"#,
            "[1]",
        ] {
            let out = || Outcome::Result(message::Raw::written(r.to_owned()));
            let message::Answer::Whole(line) = f.answer(&id, out()) else {
                panic!("a small answer in parts")
            };
            assert_eq!(line, message::response(&id, &f.apply(out())), "{r}");
        }
    }

    #[test]
    fn a_merged_list_is_spliced_as_the_tree_writes_it() {
        let list = r#"{"tools":[{"name":"a__x","inputSchema":{"type":"object"}}],"nextCursor":"ab"}"#;
        for (hint_private, auth) in [(false, false), (true, false), (false, true), (true, true)] {
            let f = Finish {
                method: Method::ToolsList,
                private: auth,
                uri: None,
                hint: Some(Hint {
                    ttl_ms: 5000,
                    private: hint_private,
                }),
            };
            let raw = message::Raw::written(list.to_owned());
            let Outcome::Result(spliced) = f.apply(Outcome::Result(raw.clone())) else {
                panic!()
            };
            let Outcome::Result(tree) = f.apply_parsed(&raw) else {
                panic!()
            };
            assert_eq!(spliced.get(), tree.get(), "hint private {hint_private}, auth {auth}");
        }
    }

    #[test]
    fn only_results_that_may_have_the_members_are_parsed_to_look() {
        for (text, may) in [
            (r#"{"content":[{"type":"text","text":"hi"}],"isError":false}"#, false),
            // In a string a name is escaped quotes away; deeper down it is a member: then
            // the parse decides.
            (r#"{"content":[{"type":"text","text":"a \"_meta\" b"}]}"#, false),
            (r#"{"structuredContent":{"_meta":1}}"#, true),
            (r#"{"x":"resultType"}"#, true),
            (r#"{"x":"resultTypes"}"#, false),
            (r#"{"resultType":1}"#, true),
            (r#"{"_meta":{}}"#, true),
            (r#"{"ttlMs":1}"#, true),
            (r#"{"cacheScope":"x"}"#, true),
            (r#"{"text":"caf\u00e9"}"#, true),
            (r#"{"text":"line\nbreak \\ \""}"#, false),
            ("{}", false),
        ] {
            assert_eq!(may_name(text.as_bytes()), may, "{text}");
            // Past 256 bytes the quotes are found by memchr: the same answers.
            let long = format!(r#"{{"pad":"{}",{}"#, "p".repeat(300), &text[1..]);
            let long = if text == "{}" {
                format!(r#"{{"pad":"{}"}}"#, "p".repeat(300))
            } else {
                long
            };
            assert_eq!(may_name(long.as_bytes()), may, "{long}");
        }
    }

    #[test]
    fn splicing_writes_what_the_tree_writes() {
        // Compact results come out byte for byte as through the tree.
        for r in [
            r#"{"content":[{"type":"text","text":"hi"}],"isError":false}"#,
            r#"{}"#,
            r#"{"structuredContent":{"a":[1,2.5,"x\"y"]},"content":[]}"#,
            // The names inside, not as members: parsed to see, then spliced.
            r#"{"content":[{"type":"text","text":"_meta resultType"}],"x":{"ttlMs":1}}"#,
        ] {
            assert_eq!(splice(r, "", "").unwrap(), through_tree(r), "{r}");
        }
        // Whitespace: the same JSON.
        let r = " {\n \"content\" : [ ] \n} ";
        let spliced: Value = serde_json::from_str(&splice(r, "", "").unwrap()).unwrap();
        let tree: Value = serde_json::from_str(&through_tree(r)).unwrap();
        assert_eq!(spliced, tree);
        assert_eq!(splice("{ }", "", "").unwrap(), through_tree("{}"));
        // An escape stays as the server wrote it: the same JSON.
        let r = r#"{"content":[{"type":"text","text":"caf\u00e9"}]}"#;
        let spliced: Value = serde_json::from_str(&splice(r, "", "").unwrap()).unwrap();
        assert_eq!(spliced, serde_json::from_str::<Value>(&through_tree(r)).unwrap());
        // Members the splice would repeat (or a repeated one), non-objects: the tree decides.
        for r in [
            r#"{"resultType":"input_required"}"#,
            r#"{"_meta":{"x":1},"content":[]}"#,
            r#"{"_meta":null}"#,
            r#"{"resultType":"complete","resultType":"complete"}"#,
            r#"{"content":[],"_m\u0065ta":{}}"#,
            r#"{"\u0074tlMs":1}"#,
            r#"[1]"#,
            r#""text""#,
        ] {
            assert!(splice(r, "", "").is_none(), "{r}");
        }
    }
}
