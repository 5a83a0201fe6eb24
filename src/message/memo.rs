//! The 2026-07-28 envelopes read lately, so that the next request with the same one is
//! read without it.
//!
//! A client of that revision sends the same `_meta` with every request: its protocol
//! version, capabilities and info, about 200 bytes, three times a small call's own params.
//! Reading them member by member is most of what such a request costs to parse. Each
//! thread keeps the last few such `_meta` texts (only ones that hold the envelope's own
//! members, read from the params of a `tools/call` or `prompts/get`). When a message has
//! one of them, byte for byte, as the value of a `"_meta"` key, it is read with `{}` in its
//! place, and its params are then made what they would have been
//! ([`super::members::Substituted`]).
//!
//! Why this reads the message exactly as it came: the text kept is valid JSON (it was
//! read), and it is put back where the params' own `_meta` was read as `{}`. The message
//! with the text is then valid JSON exactly when the message with `{}` is, and means the
//! same but for that value; its nesting is no deeper (the text kept nests at most
//! [`super::envelope::MAX_DEPTH`]` - 2` levels, and sits two levels down). If the `{}`
//! was not read as the params' own `_meta` (the key was elsewhere, or the method is
//! not `tools/call` or `prompts/get`, named before the params: then the reading stops
//! there), or if anything fails, the message is read again as it came, so errors and
//! everything else are as without the memo.
//!
//! Bounded: [`ENTRIES`] texts a thread, each at most [`MAX_TEXT`] bytes; messages over
//! [`MAX_MESSAGE`] bytes are not searched. What one client sent can make another client's
//! request cheaper to read, and nothing else: the text is only compared, never sent.

use super::peek::Finder;
use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

/// The longest `_meta` text kept.
const MAX_TEXT: usize = 1024;
/// How many texts a thread keeps.
const ENTRIES: usize = 4;
/// The longest message searched for one.
const MAX_MESSAGE: usize = 16 * 1024;

/// A `_meta` text read before.
pub(super) struct Known {
    /// Its JSON text, an object.
    pub text: Box<str>,
    /// The spans of the envelope's members in it, as [`super::Peeked::Own`] gives them.
    pub spans: [Option<Range<usize>>; 3],
}

thread_local! {
    static MEMO: RefCell<Vec<Rc<Known>>> = const { RefCell::new(Vec::new()) };
    /// The buffer a message is read from with `{}` in place of its `_meta`, kept for the
    /// thread's next one.
    static SCRATCH: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// An empty buffer, the thread's own when it has one ([`give_back`]).
pub(super) fn scratch() -> String {
    SCRATCH.try_with(std::cell::Cell::take).unwrap_or_default()
}

/// Keeps a buffer from [`scratch`] for the next message.
pub(super) fn give_back(mut buf: String) {
    if buf.capacity() <= MAX_MESSAGE {
        buf.clear();
        let _ = SCRATCH.try_with(|s| s.set(buf));
    }
}

static KEY: Finder = Finder::new(|| memchr::memmem::Finder::new(b"\"_meta\""));

/// Where in `message` a known `_meta` text starts, as the value of a `"_meta"` key.
pub(super) fn find(message: &[u8]) -> Option<(usize, Rc<Known>)> {
    if message.len() > MAX_MESSAGE {
        return None;
    }
    MEMO.try_with(|memo| {
        let memo = memo.try_borrow().ok()?;
        if memo.is_empty() {
            return None;
        }
        // The usual place, the params' last member (`…,"_meta":{…}}}`), is looked at first.
        if let Some(found) = at_end(message, &memo) {
            return Some(found);
        }
        for key in KEY.find_iter(message) {
            let Some(at) = super::members::value_start(message, key + 6) else {
                continue;
            };
            let rest = message.get(at..)?;
            if let Some(known) = memo.iter().find(|k| rest.starts_with(k.text.as_bytes())) {
                return Some((at, known.clone()));
            }
        }
        None
    })
    .ok()
    .flatten()
}

/// A known text that is the value of a `"_meta"` key just before the message's last two
/// closing braces.
fn at_end(message: &[u8], memo: &[Rc<Known>]) -> Option<(usize, Rc<Known>)> {
    let body = trim_end(message).strip_suffix(b"}")?;
    let body = trim_end(body).strip_suffix(b"}")?;
    let body = trim_end(body);
    let known = memo.iter().find(|k| body.ends_with(k.text.as_bytes()))?;
    let at = body.len() - known.text.len();
    let key = trim_end(message.get(..at)?).strip_suffix(b":")?;
    trim_end(key).ends_with(b"\"_meta\"").then(|| (at, known.clone()))
}

/// `text` without its trailing JSON whitespace.
fn trim_end(text: &[u8]) -> &[u8] {
    let n = text
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .map_or(0, |i| i + 1);
    &text[..n]
}

/// Keeps a `_meta` text read from a request's params (and the spans in it), if it is not
/// kept already; the oldest goes.
pub(super) fn remember(text: &str, spans: [Option<Range<usize>>; 3]) {
    if text.len() > MAX_TEXT
        || !text.starts_with('{')
        || super::envelope::nested_deeper_than(text.as_bytes(), super::envelope::MAX_DEPTH - 2)
    {
        return;
    }
    let _ = MEMO.try_with(|memo| {
        let Ok(mut memo) = memo.try_borrow_mut() else {
            return;
        };
        if memo.iter().any(|k| *k.text == *text) {
            return;
        }
        if memo.len() >= ENTRIES {
            memo.pop();
        }
        memo.insert(
            0,
            Rc::new(Known {
                text: text.into(),
                spans,
            }),
        );
    });
}

/// What a reading of a message says, as text: its Debug form, its opened params written
/// out, and the text of each span of the envelope read from their `_meta`. The memo's
/// tests and the fuzz target compare a reading with the memo against one without.
#[doc(hidden)]
pub fn reading<E: std::fmt::Debug>(r: &Result<super::Kind, E>) -> String {
    use super::{Incoming, Kind, Peeked};
    let mut out = format!("{r:?}");
    if let Ok(Kind::Request {
        params: Incoming::Opened(m),
        ..
    }) = r
    {
        let mut w = Vec::new();
        m.write_to(&mut w);
        out.push_str(&String::from_utf8_lossy(&w));
        match m.peeked() {
            Peeked::Own(spans) => {
                for s in spans {
                    out.push_str(&format!(" [{:?}]", s.as_ref().and_then(|s| m.text_of(s))));
                }
            }
            p => out.push_str(&format!(" {p:?}")),
        }
    }
    out
}

#[cfg(test)]
pub(super) fn forget() {
    let _ = MEMO.try_with(|m| m.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::super::Kind;

    const ENVELOPE: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}}"#;

    /// Reads `message` with the memo primed by a call that carried `ENVELOPE`, and
    /// without it; both must read the same. Returns whether the memo was used.
    fn same(message: &str) -> bool {
        super::forget();
        let prime =
            format!(r#"{{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{{"name":"p","_meta":{ENVELOPE}}}}}"#);
        Kind::parse_from_client(prime.as_bytes()).unwrap();
        let found = super::find(message.as_bytes()).is_some_and(|(at, k)| Kind::parse_known(message, at, &k).is_some());
        let with = Kind::parse_from_client(message.as_bytes());
        super::forget();
        let without = Kind::parse(message.as_bytes());
        assert_eq!(super::reading(&with), super::reading(&without), "{message}");
        found
    }

    #[test]
    fn a_known_envelope_reads_as_the_message_came() {
        let e = ENVELOPE;
        // Used: the params' own `_meta`, last or first, with whitespace anywhere.
        for m in [
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hi"}},"_meta":{e}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{{"_meta":{e},"name":"echo","arguments":{{"a":[1.50,2]}}}}}}"#),
            format!("{{ \"jsonrpc\" : \"2.0\" , \"id\" : 2 , \"method\" : \"prompts/get\" , \"params\" : {{ \"name\" : \"p\" , \"_meta\" \n:\t{e} \r\n}} \n}}\n"),
            format!(r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"echo","_meta":{e},"task":{{"ttl":1}}}}}}"#),
        ] {
            assert!(same(&m), "not used: {m}");
        }
        // Not used, and read the same: another method, params before the method, the
        // text inside the arguments or a string, a second `_meta`, a longer `_meta`.
        for m in [
            format!(r#"{{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{{"_meta":{e}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":5,"params":{{"name":"echo","_meta":{e}}},"method":"tools/call"}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"name":"echo","arguments":{{"_meta":{e}}}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"echo","arguments":{{"t":"\"_meta\":{}"}}}}}}"#,
                e.replace('"', "\\\"")
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"name":"echo","_meta":{{"k":1}},"_meta":{e}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"echo","_meta":{}}}}}"#,
                e[..e.len() - 1].to_owned() + r#","k":2}"#
            ),
            format!(r#"{{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{{"name":"echo","_\u006deta":{e}}}}}"#),
        ] {
            assert!(!same(&m), "used: {m}");
        }
        // A repeated `_meta` after the known one: read as the message came (the general path).
        same(&format!(
            r#"{{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{{"_meta":{e},"name":"echo","_meta":{{"k":1}}}}}}"#
        ));
    }

    #[test]
    fn a_bad_message_with_a_known_envelope_fails_as_without_it() {
        let e = ENVELOPE;
        for m in [
            // Invalid JSON after the text, a bad id, a result beside the method, too deep.
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","_meta":{e}}},}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","_meta":{e}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":{{}},"method":"tools/call","params":{{"name":"echo","_meta":{e}}}}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","result":{{}},"params":{{"name":"echo","_meta":{e}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{}{},"_meta":{e}}}}}"#,
                "[".repeat(70),
                "]".repeat(70)
            ),
            format!(r#"{{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{{"name":"echo","_meta":{e}}}}}"#),
        ] {
            same(&m);
        }
    }

    #[test]
    fn the_memo_is_bounded() {
        super::forget();
        for n in 0..20 {
            let m = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"io.modelcontextprotocol/clientInfo":{{"name":"c{n}"}}}}}}}}"#
            );
            Kind::parse_from_client(m.as_bytes()).unwrap();
        }
        assert_eq!(super::MEMO.with(|m| m.borrow().len()), super::ENTRIES);
        // Too long to keep.
        super::forget();
        let long = "x".repeat(super::MAX_TEXT);
        let m = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"{long}"}}}}}}"#
        );
        Kind::parse_from_client(m.as_bytes()).unwrap();
        assert_eq!(super::MEMO.with(|m| m.borrow().len()), 0);
    }
}
