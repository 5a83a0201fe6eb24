//! Fuzzes what the gateway does with bytes a peer controls: JSON-RPC parsing, the
//! typed view of a request, the rewrites on the way to a downstream and back (ids,
//! progress tokens), the SSE parser, and URI template matching. Every message the
//! gateway writes must parse again, and every line written to a stdio child is one line
//! holding one JSON object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_gateway::fuzzing::{self as message, encode_request, progress_token, restore_progress, Params, Template};
use mcp_gateway::fuzzing::{Id, Incoming, Kind, Members, Outcome, Peeked};
use serde_json::value::RawValue;
use std::collections::HashMap;

/// What a stdio child gets: `line` framed as the child writer frames it. It must be
/// exactly one line (one `\n`, at the end) holding one JSON object whose id is `minted`.
fn check_child_line(mut line: Vec<u8>, minted: u64, how: &str) {
    message::frame_line(&mut line);
    let breaks: Vec<usize> = line
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .map(|(i, _)| i)
        .collect();
    assert_eq!(breaks, [line.len() - 1], "{how}: not exactly one line");
    assert!(!line.contains(&b'\r'), "{how}: a CR in a child's line");
    // One JSON object, its members' values raw: a `Map<String, Value>` would refuse valid
    // JSON the gateway rightly forwards as it came (a number beyond f64, like `1e400`).
    let object: HashMap<String, &RawValue> =
        serde_json::from_slice(&line).unwrap_or_else(|e| panic!("{how}: not one JSON object: {e}"));
    assert_eq!(
        object.get("id").map(|id| id.get()),
        Some(minted.to_string().as_str()),
        "{how}: not the minted id"
    );
    match Kind::parse(&line) {
        Ok(Kind::Request { id, .. }) => assert_eq!(id.as_u64(), Some(minted), "{how}"),
        other => panic!("{how}: does not parse as our request: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    // A client's message read with the memo of 2026-07-28 envelopes (kept from this
    // input read once, and from earlier inputs) reads as it does without it.
    let plain = Kind::parse(data);
    let _ = Kind::parse_from_client(data);
    assert_eq!(
        message::reading(&Kind::parse_from_client(data)),
        message::reading(&plain),
        "the memo of envelopes changed a reading"
    );
    if let Ok(kind) = plain {
        match kind {
            Kind::Request {
                id,
                method,
                params: incoming,
            } => {
                let params = incoming.to_raw().map(std::borrow::Cow::into_owned);
                // Params opened as the message was read (tools/call, prompts/get) are what
                // opening their text on its own gives: the same members, the same `_meta`.
                if let Incoming::Opened(opened) = &incoming {
                    let members: HashMap<String, Box<RawValue>> =
                        serde_json::from_slice(data).expect("a request is an object");
                    let text = members.get("params").cloned();
                    let alone = Members::parse(text).expect("opened params open on their own too");
                    let written = |m: &Members| {
                        let mut out = Vec::new();
                        m.write_to(&mut out);
                        out
                    };
                    assert_eq!(written(opened), written(&alone), "one pass and two disagree");
                    let meta = |m: &Members| match m.peeked() {
                        Peeked::Own(spans) => {
                            Some(spans.clone().map(|s| s.and_then(|s| m.text_of(&s)).map(str::to_owned)))
                        }
                        Peeked::Absent => None,
                        Peeked::Other => Some([Some("other".to_owned()), None, None]),
                    };
                    assert_eq!(meta(opened), meta(&alone), "one pass and two read _meta apart");
                }
                let answer = message::response(&id, &Outcome::Result(message::empty_object().into()));
                match Kind::parse(&answer) {
                    Ok(Kind::Response { id: Some(back), .. }) => {
                        assert_eq!(back.get(), id.get(), "the id must come back byte for byte")
                    }
                    other => panic!("our response must parse: {other:?}"),
                }
                // tools/call and prompts/get: opened one level, the progress token taken.
                if let Ok(mut m) = Members::parse(params.clone()) {
                    let _ = m.get_str("name");
                    m.insert_str("name", "renamed");
                    let progress = m.take_progress();
                    check_child_line(message::request_with_members(5, &method, &m), 5, "request_with_members");
                    let (line, token) = encode_request(
                        6,
                        &method,
                        Params::Members {
                            params: m,
                            progress: progress.clone(),
                        },
                    );
                    assert_eq!(token.map(|t| t.get().to_owned()), progress.map(|t| t.get().to_owned()));
                    check_child_line(line, 6, "Params::Members");
                }
                if let Ok(p) = message::params_object(params.as_deref()) {
                    let (line, token) = encode_request(
                        7,
                        &method,
                        Params::Object {
                            params: p,
                            progress: Some(id.clone()),
                        },
                    );
                    assert_eq!(token.map(|t| t.get().to_owned()), Some(id.get().to_owned()));
                    check_child_line(line.clone(), 7, "Params::Object");
                    let again = Kind::parse(&line).expect("our request must parse");
                    assert_eq!(again.method(), Some(method.as_str()));
                }
                let (line, _) = encode_request(8, &method, Params::Raw(params));
                assert!(Kind::parse(&line).is_ok(), "a raw passthrough request must parse");
                check_child_line(line, 8, "Params::Raw");
            }
            Kind::Notification { method, params } => {
                let _ = progress_token(params.as_deref());
                let _ = message::cancelled_request_id(params.as_deref());
                if let Some(p) = &params {
                    if let Some(out) = restore_progress(p, &Id::string("token")) {
                        assert!(Kind::parse(&out).is_ok(), "a restored progress notification must parse");
                    }
                }
                let line = message::notification(&method, params.as_deref());
                assert!(Kind::parse(&line).is_ok(), "our notification must parse");
            }
            Kind::Response { id, outcome } => {
                let line = message::response(&id.unwrap_or(Id::NULL), &outcome);
                assert!(Kind::parse(&line).is_ok(), "a forwarded response must parse");
            }
        }
    }
    let mut sse = mcp_gateway::fuzzing::Parser::new();
    let _ = sse.feed(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let (template, uri) = s.split_once('\n').unwrap_or((s, s));
        let _ = Template::parse(template).matches(uri);
    }
});
