//! What a response carries ([`Outcome`]: a result kept as the server's own bytes, or an
//! error object) and the response line made from it ([`Answer`]), a large result in parts.

use super::id::Id;
use serde_json::value::RawValue;

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
/// the buffer of the message it came in ([`Kind::parse_shared`](super::Kind::parse_shared)), so it is not copied on
/// its way to the client; a clone costs a reference count.
#[derive(Clone)]
pub struct Raw(bytes::Bytes);

impl Raw {
    #[inline]
    pub fn get(&self) -> &str {
        // SAFETY: a Raw is only made from a `Box<RawValue>` (a str) or from a sub-slice of
        // a `&str` view of its buffer (`slice_of`), so its bytes are always UTF-8.
        #[allow(unsafe_code)]
        unsafe {
            std::str::from_utf8_unchecked(&self.0)
        }
    }

    /// The bytes, shared.
    pub fn bytes(&self) -> bytes::Bytes {
        self.0.clone()
    }

    /// `part` of `whole`, where `whole` is `buf` read as UTF-8: shared if `part` lies
    /// in it, else copied.
    pub(super) fn slice_of(buf: &bytes::Bytes, whole: &str, part: &str) -> Raw {
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

impl Raw {
    /// A result the gateway wrote itself as valid JSON text (a String is UTF-8).
    pub fn written(json: String) -> Raw {
        Raw(bytes::Bytes::from(json))
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
/// then the tail: `}`, or members spliced into the result before its closing brace and
/// then `}}` (see [`Answer::spliced`]).
pub enum Answer {
    Whole(Vec<u8>),
    /// The head, the result (or all of it but its closing brace) and the tail.
    Parts(Vec<u8>, bytes::Bytes, bytes::Bytes),
}

impl Answer {
    pub fn new(id: &Id, outcome: Outcome) -> Answer {
        match outcome {
            Outcome::Result(r) if r.get().len() >= LARGE_RESULT => Answer::Parts(
                response_head(id, "result", 0),
                r.bytes(),
                bytes::Bytes::from_static(b"}"),
            ),
            o => Answer::Whole(response(id, &o)),
        }
    }

    /// A result with members added: its first `keep` bytes (all of it up to its closing
    /// brace), then `rest` (the members and the result's closing brace), then the
    /// response's `}`. A large result's bytes are shared, not copied; a small one is
    /// written with the rest into one line (the one copy [`Answer::new`] makes too).
    pub fn spliced(id: &Id, result: &Raw, keep: usize, rest: &str) -> Answer {
        let text = result.get().as_bytes();
        if text.len() < LARGE_RESULT {
            let kept = text.get(..keep).unwrap_or(text);
            let mut out = response_head(id, "result", kept.len() + rest.len() + 1);
            out.extend_from_slice(kept);
            out.extend_from_slice(rest.as_bytes());
            out.push(b'}');
            return Answer::Whole(out);
        }
        let mut tail = Vec::with_capacity(rest.len() + 1);
        tail.extend_from_slice(rest.as_bytes());
        tail.push(b'}');
        let bytes = result.bytes();
        Answer::Parts(
            response_head(id, "result", 0),
            bytes.slice(..keep.min(bytes.len())),
            bytes::Bytes::from(tail),
        )
    }

    /// The whole response in one buffer (a copy, for a large result).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Answer::Whole(v) => v,
            Answer::Parts(mut head, body, tail) => {
                head.reserve_exact(body.len() + tail.len());
                head.extend_from_slice(&body);
                head.extend_from_slice(&tail);
                head
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::*;
    use serde_json::Value;

    #[test]
    fn a_large_result_goes_from_the_servers_line_to_the_answer_uncopied() {
        let text = "y".repeat(LARGE_RESULT);
        let line = bytes::Bytes::from(format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"text":"{text}"}}}}"#));
        let Kind::Response { outcome, .. } = Kind::parse_shared(&line).unwrap() else {
            panic!("not a response")
        };
        let Answer::Parts(head, body, tail) = Answer::new(&Id::string("c"), outcome) else {
            panic!("a large result was framed whole")
        };
        let inside = line.as_ptr() as usize..line.as_ptr() as usize + line.len();
        assert!(inside.contains(&(body.as_ptr() as usize)), "the result was copied");
        let v: Value = serde_json::from_slice(&Answer::Parts(head, body, tail).into_vec()).unwrap();
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
            Answer::Parts(head, body, tail) => {
                assert_eq!(head, br#"{"jsonrpc":"2.0","id":7,"result":"#);
                assert_eq!(body.as_ptr(), at, "the result's bytes were copied");
                let whole = Answer::Parts(head, body, tail).into_vec();
                let v: Value = serde_json::from_slice(&whole).unwrap();
                assert_eq!(v["result"]["text"].as_str().map(str::len), Some(LARGE_RESULT));
            }
            Answer::Whole(_) => panic!("a large result was framed whole"),
        }
        let small = Answer::new(&Id::string("a"), Outcome::Result(empty_object().into())).into_vec();
        assert_eq!(small, br#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
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
